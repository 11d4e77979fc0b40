//! The peer port's accept loop: a connection that opens with the peer link's preface is
//! served here (`cluster::link` has the protocol and why), every other one (HTTP/2, TLS) is
//! handed to the gRPC server unread.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::peer::PeerApi;
use crate::cluster::link::{self, FrameError, LinkRequest, PREFACE, PREFACE_V1};
use crate::cluster::transport::PeerCall;

/// How long a new connection may take to send its first byte before it is dropped.
const FIRST_BYTE: Duration = Duration::from_secs(10);

/// Accepts on `listener` until `stop` resolves. Returns the connections for the gRPC server,
/// as a stream for `serve_with_incoming_shutdown`, and the accept loop to run. After `stop` it
/// accepts nothing more but keeps serving the link connections it has, as the peer port must
/// during a drain (in-flight writes still need their quorum); dropping or aborting the loop's
/// future ends them. Without `link` (a port with peer
/// TLS, where only a TLS handshake may open a connection) every connection goes to gRPC, so a
/// plaintext link cannot get around the certificate check.
pub fn accept(
    listener: TcpListener,
    link: bool,
    api: Arc<PeerApi>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> (impl Stream<Item = Result<TcpStream, std::io::Error>>, impl std::future::Future<Output = ()> + Send) {
    let (to_grpc, grpc_rx) = mpsc::channel::<TcpStream>(64);
    let incoming = futures::stream::unfold(grpc_rx, |mut rx| async move { rx.recv().await.map(|s| (Ok(s), rx)) });
    let run = async move {
        let mut conns = JoinSet::new();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        if link {
                            conns.spawn(sort(stream, api.clone(), to_grpc.clone()));
                        } else if to_grpc.send(stream).await.is_err() {
                            return;
                        }
                    }
                    // Out of descriptors and the like: a pause, not the end of the port.
                    Err(e) => {
                        tracing::warn!(error = %e, "peer port: cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        drop(listener);
        while conns.join_next().await.is_some() {}
    };
    (incoming, run)
}

/// Serves a connection that speaks the link, or passes it to gRPC.
async fn sort(mut stream: TcpStream, api: Arc<PeerApi>, to_grpc: mpsc::Sender<TcpStream>) {
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(FIRST_BYTE, stream.peek(&mut first)).await;
    if !matches!(peeked, Ok(Ok(1))) || first[0] != PREFACE[0] {
        let _ = to_grpc.send(stream).await;
        return;
    }
    let mut preface = [0u8; 16];
    let read = tokio::time::timeout(FIRST_BYTE, stream.read_exact(&mut preface)).await;
    // The previous release's preface is echoed as it came: its sender expects exactly that.
    if !matches!(read, Ok(Ok(_))) || (&preface != PREFACE && &preface != PREFACE_V1) {
        tracing::debug!("peer port: a connection that is neither HTTP/2 nor the peer link; closed");
        return;
    }
    if stream.write_all(&preface).await.is_err() {
        return;
    }
    serve(stream, api).await;
}

/// Answers one link connection's requests until it closes. AppendEntries are answered in
/// order by this task (one sender per follower sends them one at a time anyway, and this
/// saves a wake-up per message); the other calls, a forwarded write above all, may take long
/// and run on tasks of their own.
async fn serve(stream: TcpStream, api: Arc<PeerApi>) {
    let (rd, wr) = stream.into_split();
    let writer = Arc::new(tokio::sync::Mutex::new(wr));
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let mut others = JoinSet::new();
    loop {
        let request = match link::read_request(&mut rd).await {
            Ok(r) => r,
            Err(FrameError::Closed) => return,
            Err(FrameError::Broken(why)) => {
                tracing::warn!(why, "peer port: closing a peer-link connection");
                return;
            }
        };
        while others.try_join_next().is_some() {}
        if request.kind == PeerCall::AppendEntries {
            if answer(&api, request, &writer).await.is_err() {
                return;
            }
        } else {
            let (api, writer) = (api.clone(), writer.clone());
            others.spawn(async move {
                let _ = answer(&api, request, &writer).await;
            });
        }
    }
}

async fn answer(
    api: &PeerApi,
    request: LinkRequest,
    writer: &tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>,
) -> std::io::Result<()> {
    let deadline = tokio::time::Instant::now() + request.ttl.min(Duration::from_secs(600));
    let reply = api.handle(request.kind, request.cluster.as_deref(), &request.msg, deadline).await;
    let mut wr = writer.lock().await;
    link::write_answer(&mut *wr, request.id, &reply).await
}
