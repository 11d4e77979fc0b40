//! The client port seen as raw HTTP/2 frames, where a client library would hide the timing.
//!
//! h2 charges every buffered, not yet read DATA frame smaller than 256 bytes against a
//! per-connection budget, and closes the connection with ENHANCE_YOUR_CALM when it runs out,
//! failing every call on it. A unary gRPC call sends its message in one such frame. When the
//! node is too busy to read request bodies as fast as they arrive (here: stopped with SIGSTOP
//! while a client sends), unbounded streams per connection let an ordinary client exhaust
//! the budget; that is how a flooded leader once cut off its clients. The node advertises a
//! stream bound that keeps the worst case inside the budget.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{signal, Cluster, SERIAL};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::time::Instant;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK "literal header field without indexing, new name", no Huffman coding.
fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.extend([0x00, name.len() as u8]);
    block.extend_from_slice(name.as_bytes());
    block.push(value.len() as u8);
    block.extend_from_slice(value.as_bytes());
}

#[derive(Default, Debug)]
struct Seen {
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS, once its SETTINGS arrived (0: none sent).
    max_streams: Option<u32>,
    /// Streams the server ended.
    ended: usize,
    goaway: Option<(u32, String)>,
}

struct Reader {
    half: OwnedReadHalf,
    buf: Vec<u8>,
}

impl Reader {
    /// Reads frames until `done` holds, a GOAWAY arrives, the connection ends or `until`.
    /// Returns the SETTINGS ACKs owed to the server.
    async fn read(&mut self, seen: &mut Seen, until: Instant, done: impl Fn(&Seen) -> bool) -> usize {
        let mut acks = 0;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            while self.buf.len() >= 9 {
                let len = ((self.buf[0] as usize) << 16) | ((self.buf[1] as usize) << 8) | self.buf[2] as usize;
                if self.buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (self.buf[3], self.buf[4]);
                let payload: Vec<u8> = self.buf[9..9 + len].to_vec();
                self.buf.drain(..9 + len);
                match kind {
                    SETTINGS if flags & ACK == 0 => {
                        acks += 1;
                        let mut max = 0;
                        for s in payload.chunks_exact(6) {
                            if u16::from_be_bytes([s[0], s[1]]) == SETTINGS_MAX_CONCURRENT_STREAMS {
                                max = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                            }
                        }
                        seen.max_streams = Some(max);
                    }
                    HEADERS | DATA if flags & END_STREAM != 0 => seen.ended += 1,
                    GOAWAY => {
                        let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                        seen.goaway = Some((code, String::from_utf8_lossy(&payload[8..]).into_owned()));
                        return acks;
                    }
                    _ => {}
                }
            }
            if done(seen) {
                return acks;
            }
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.half.read(&mut chunk)).await {
                Ok(Ok(0)) | Err(_) => return acks,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => panic!("reading from the node: {e}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_node_keeps_a_connection_that_uses_every_stream_it_offers() {
    let _serial = SERIAL.lock().await;
    burst_while_stopped(&[], 1024).await;
    // The largest bound the node accepts is still inside the budget.
    burst_while_stopped(&["--max-streams-per-connection", "2048"], 2048).await;
}

/// Opens every stream a node started with `flags` offers (it must offer `bound`), sending
/// each call while the node is stopped, and checks that every call is answered.
async fn burst_while_stopped(flags: &[&str], bound: u32) {
    let c = Cluster::start(1, flags).await;
    let addr = c.client_addr(1);
    let pid = c.children[&1].id();
    let tcp = TcpStream::connect(&addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (half, mut out) = tcp.into_split();
    let mut reader = Reader { half, buf: Vec::new() };
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend(frame(SETTINGS, 0, 0, &[]));
    out.write_all(&hello).await.unwrap();
    let mut seen = Seen::default();
    let acks = reader.read(&mut seen, Instant::now() + Duration::from_secs(5), |s| s.max_streams.is_some()).await;
    for _ in 0..acks {
        out.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
    }
    let advertised = seen.max_streams.expect("the node sent no SETTINGS");
    assert_eq!(advertised, bound, "the client port's stream bound (0: unbounded)");

    // Every stream the node offers, each with a complete gRPC message (an empty
    // HealthCheckRequest) in a small DATA frame, all arriving while the node cannot run.
    // Without a bound, 4000 such streams overrun the budget.
    let n = if advertised == 0 { 4000 } else { advertised };
    let mut burst = Vec::new();
    for s in (0..n).map(|i| 2 * i + 1) {
        let mut block = Vec::new();
        literal(&mut block, ":method", "POST");
        literal(&mut block, ":scheme", "http");
        literal(&mut block, ":path", "/grpc.health.v1.Health/Check");
        literal(&mut block, ":authority", &addr);
        literal(&mut block, "content-type", "application/grpc");
        literal(&mut block, "te", "trailers");
        burst.extend(frame(HEADERS, END_HEADERS, s, &block));
        burst.extend(frame(DATA, 0, s, &[0, 0, 0, 0, 0]));
    }
    for s in (0..n).map(|i| 2 * i + 1) {
        burst.extend(frame(DATA, END_STREAM, s, &[]));
    }
    signal(pid, "-STOP");
    let writer = tokio::spawn(async move {
        out.write_all(&burst).await.unwrap();
        out
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(pid, "-CONT");
    let _out = writer.await.unwrap();

    let mut answers = Seen::default();
    let want = n as usize;
    reader.read(&mut answers, Instant::now() + Duration::from_secs(20), |s| s.ended >= want).await;
    println!("{n} streams sent to a stopped node, then: {answers:?}");
    assert_eq!(answers.goaway, None, "the node closed the connection");
    assert_eq!(answers.ended, want, "every call is answered");
}
