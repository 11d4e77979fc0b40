//! Fake nodes for the SDK's and the HTTP layer's unit tests: misbehaviours a real node shows
//! only under faults (a connection that breaks mid-call, an overloaded leader).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idemraft_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// An empty HTTP/2 SETTINGS frame: the server's half of the handshake, enough for the
/// client to take the connection as up and send its call on it.
const SERVER_PREFACE: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];

/// HTTP/2 frame types the fakes below look for.
const DATA: u8 = 0;
const HEADERS: u8 = 1;

/// A node whose connections break mid-call: it accepts, answers the HTTP/2 handshake, reads
/// the call and closes the socket without an answer, as a node killed mid-call does. Returns
/// its address and a count of the calls it took.
pub(crate) async fn breaks_connections() -> (String, Arc<AtomicUsize>) {
    // A call's message (a DATA frame) has arrived: drop the connection with it in flight.
    raw_node(DATA, true).await
}

/// A node that stopped (SIGSTOP, a partition that drops packets): it takes the connection and
/// the call, then never answers. Returns its address and a count of the calls it took.
pub(crate) async fn never_answers() -> (String, Arc<AtomicUsize>) {
    // Each call opens a stream with a HEADERS frame; none is answered.
    raw_node(HEADERS, false).await
}

/// A node that speaks only enough HTTP/2 to take calls: it answers the handshake and reads
/// frames, counting those of type `counted`; with `close`, the first one ends the connection.
async fn raw_node(counted: u8, close: bool) -> (String, Arc<AtomicUsize>) {
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
                // After the client's 24-byte connection preface.
                let mut at = 24;
                loop {
                    while buf.len() >= at + 9 {
                        let len =
                            (usize::from(buf[at]) << 16) | (usize::from(buf[at + 1]) << 8) | usize::from(buf[at + 2]);
                        if buf[at + 3] == counted {
                            taken.fetch_add(1, Ordering::SeqCst);
                            if close {
                                return;
                            }
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

/// A leader that sheds every call before proposing it, as an overloaded one does: the node's
/// RESOURCE_EXHAUSTED with the `idemraft-not-proposed` marker. Returns its address.
pub(crate) async fn sheds_every_call() -> String {
    fn shed() -> Status {
        let mut s = Status::resource_exhausted("overloaded: 4096 writes are already queued (--max-pending-writes)");
        s.metadata_mut().insert(idemraft_proto::NOT_PROPOSED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
        s
    }
    scripted(Scripted { refuse: Arc::new(shed), get: Arc::new(|| Err(shed())) }).await
}

/// A follower that still names `leader` as the leader and refuses reads (UNAVAILABLE with the
/// leader hint) until `serving` is set, then answers them (an empty record). Returns its address.
pub(crate) async fn follower_naming(leader: String, serving: Arc<std::sync::atomic::AtomicBool>) -> String {
    let get = move || {
        if serving.load(Ordering::SeqCst) {
            return Ok(pb::GetResponse { record: None });
        }
        let mut s = Status::unavailable("no leader: leader 2 at the hinted address did not take the call");
        let hint = tonic::metadata::MetadataValue::try_from(leader.as_str()).unwrap();
        s.metadata_mut().insert(idemraft_proto::LEADER_ADDR_HEADER, hint);
        Err(s)
    };
    let refuse = || Status::unimplemented("this fake follower serves reads only");
    scripted(Scripted { refuse: Arc::new(refuse), get: Arc::new(get) }).await
}

/// A fake node's script: reads are answered by `get`, every other call refused by `refuse`.
struct Scripted {
    refuse: Arc<dyn Fn() -> Status + Send + Sync>,
    get: Arc<dyn Fn() -> Result<pb::GetResponse, Status> + Send + Sync>,
}

impl Scripted {
    fn refused<T>(&self) -> Result<Response<T>, Status> {
        Err((self.refuse)())
    }
}

#[tonic::async_trait]
impl pb::idempotency_server::Idempotency for Scripted {
    async fn claim(&self, _: Request<pb::ClaimRequest>) -> Result<Response<pb::Outcome>, Status> {
        self.refused()
    }
    async fn complete(&self, _: Request<pb::CompleteRequest>) -> Result<Response<pb::Outcome>, Status> {
        self.refused()
    }
    async fn fail(&self, _: Request<pb::FailRequest>) -> Result<Response<pb::Outcome>, Status> {
        self.refused()
    }
    async fn extend_lease(&self, _: Request<pb::ExtendLeaseRequest>) -> Result<Response<pb::Outcome>, Status> {
        self.refused()
    }
    async fn checkpoint(&self, _: Request<pb::CheckpointRequest>) -> Result<Response<pb::Outcome>, Status> {
        self.refused()
    }
    async fn takeover(&self, _: Request<pb::TakeoverRequest>) -> Result<Response<pb::Outcome>, Status> {
        self.refused()
    }
    async fn get(&self, _: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        (self.get)().map(Response::new)
    }
    async fn wait(&self, _: Request<pb::WaitRequest>) -> Result<Response<pb::WaitResponse>, Status> {
        self.refused()
    }
    async fn list(&self, _: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
        self.refused()
    }
}

/// Serves `node` on a free loopback port; returns its address.
async fn scripted(node: Scripted) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::idempotency_server::IdempotencyServer::new(node))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    addr
}
