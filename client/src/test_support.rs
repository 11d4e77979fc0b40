//! Fake nodes for the SDK's and the HTTP layer's unit tests: misbehaviours a real node shows
//! only under faults (a connection that breaks mid-call, an overloaded leader).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An empty HTTP/2 SETTINGS frame: the server's half of the handshake, enough for the
/// client to take the connection as up and send its call on it.
const SERVER_PREFACE: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// A node whose connections break mid-call: it accepts, answers the HTTP/2 handshake, reads
/// the call and closes the socket without an answer, as a node killed mid-call does. Returns
/// its address and a count of the calls it took.
pub(crate) async fn breaks_connections() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let taken = calls.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let taken = taken.clone();
            tokio::spawn(async move {
                if socket.write_all(&SERVER_PREFACE).await.is_err() || !read_a_call(&mut socket).await {
                    return;
                }
                taken.fetch_add(1, Ordering::SeqCst);
                // Dropped: the connection closes with the call in flight.
            });
        }
    });
    (addr, calls)
}

/// Reads the client preface and frames until a call's message (a DATA frame on a stream)
/// has arrived; false if the connection ended first.
async fn read_a_call(socket: &mut tokio::net::TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut at = 24;
    loop {
        while buf.len() >= at + 9 {
            let len = (usize::from(buf[at]) << 16) | (usize::from(buf[at + 1]) << 8) | usize::from(buf[at + 2]);
            if buf[at + 3] == 0 {
                return true;
            }
            at += 9 + len;
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A leader that sheds every call before proposing it, as an overloaded one does: the node's
/// RESOURCE_EXHAUSTED with the `idemraft-not-proposed` marker. Returns its address.
pub(crate) async fn sheds_every_call() -> String {
    use idemraft_proto::v1 as pb;
    use tonic::{Request, Response, Status};

    struct Shedding;

    fn shed<T>() -> Result<Response<T>, Status> {
        let mut s = Status::resource_exhausted("overloaded: 4096 writes are already queued (--max-pending-writes)");
        s.metadata_mut().insert(idemraft_proto::NOT_PROPOSED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
        Err(s)
    }

    #[tonic::async_trait]
    impl pb::idempotency_server::Idempotency for Shedding {
        async fn claim(&self, _: Request<pb::ClaimRequest>) -> Result<Response<pb::Outcome>, Status> {
            shed()
        }
        async fn complete(&self, _: Request<pb::CompleteRequest>) -> Result<Response<pb::Outcome>, Status> {
            shed()
        }
        async fn fail(&self, _: Request<pb::FailRequest>) -> Result<Response<pb::Outcome>, Status> {
            shed()
        }
        async fn extend_lease(&self, _: Request<pb::ExtendLeaseRequest>) -> Result<Response<pb::Outcome>, Status> {
            shed()
        }
        async fn checkpoint(&self, _: Request<pb::CheckpointRequest>) -> Result<Response<pb::Outcome>, Status> {
            shed()
        }
        async fn takeover(&self, _: Request<pb::TakeoverRequest>) -> Result<Response<pb::Outcome>, Status> {
            shed()
        }
        async fn get(&self, _: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
            shed()
        }
        async fn wait(&self, _: Request<pb::WaitRequest>) -> Result<Response<pb::WaitResponse>, Status> {
            shed()
        }
        async fn list(&self, _: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
            shed()
        }
    }

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::idempotency_server::IdempotencyServer::new(Shedding))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    addr
}

/// A node that stopped (SIGSTOP, a partition that drops packets): it takes the connection and
/// the call, then never answers. Returns its address and a count of the calls it took.
pub(crate) async fn never_answers() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let taken = calls.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let taken = taken.clone();
            tokio::spawn(async move {
                if socket.write_all(&SERVER_PREFACE).await.is_err() {
                    return;
                }
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16 * 1024];
                // Counts each call it reads (a HEADERS frame opening a stream), answers none.
                let mut at = 24;
                loop {
                    while buf.len() >= at + 9 {
                        let len =
                            (usize::from(buf[at]) << 16) | (usize::from(buf[at + 1]) << 8) | usize::from(buf[at + 2]);
                        if buf[at + 3] == 1 {
                            taken.fetch_add(1, Ordering::SeqCst);
                        }
                        at += 9 + len;
                    }
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    (addr, calls)
}

/// A follower that still names `leader` as the leader and refuses reads (UNAVAILABLE with the
/// leader hint) until `serving` is set, then answers them (an empty record). Returns its address.
pub(crate) async fn follower_naming(leader: String, serving: Arc<std::sync::atomic::AtomicBool>) -> String {
    use idemraft_proto::v1 as pb;
    use tonic::{Request, Response, Status};

    struct Follower {
        leader: String,
        serving: Arc<std::sync::atomic::AtomicBool>,
    }

    fn unimplemented<T>() -> Result<Response<T>, Status> {
        Err(Status::unimplemented("this fake follower serves reads only"))
    }

    #[tonic::async_trait]
    impl pb::idempotency_server::Idempotency for Follower {
        async fn claim(&self, _: Request<pb::ClaimRequest>) -> Result<Response<pb::Outcome>, Status> {
            unimplemented()
        }
        async fn complete(&self, _: Request<pb::CompleteRequest>) -> Result<Response<pb::Outcome>, Status> {
            unimplemented()
        }
        async fn fail(&self, _: Request<pb::FailRequest>) -> Result<Response<pb::Outcome>, Status> {
            unimplemented()
        }
        async fn extend_lease(&self, _: Request<pb::ExtendLeaseRequest>) -> Result<Response<pb::Outcome>, Status> {
            unimplemented()
        }
        async fn checkpoint(&self, _: Request<pb::CheckpointRequest>) -> Result<Response<pb::Outcome>, Status> {
            unimplemented()
        }
        async fn takeover(&self, _: Request<pb::TakeoverRequest>) -> Result<Response<pb::Outcome>, Status> {
            unimplemented()
        }
        async fn get(&self, _: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
            if self.serving.load(Ordering::SeqCst) {
                return Ok(Response::new(pb::GetResponse { record: None }));
            }
            let mut s = Status::unavailable("no leader: leader 2 at the hinted address did not take the call");
            let hint = tonic::metadata::MetadataValue::try_from(self.leader.as_str()).unwrap();
            s.metadata_mut().insert(idemraft_proto::LEADER_ADDR_HEADER, hint);
            Err(s)
        }
        async fn wait(&self, _: Request<pb::WaitRequest>) -> Result<Response<pb::WaitResponse>, Status> {
            unimplemented()
        }
        async fn list(&self, _: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
            unimplemented()
        }
    }

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::idempotency_server::IdempotencyServer::new(Follower { leader, serving }))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    addr
}
