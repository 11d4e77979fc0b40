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
