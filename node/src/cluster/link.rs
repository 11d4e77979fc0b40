//! The peer link: openraft's RPCs, forwarded calls and pre-votes as length-prefixed frames
//! on a plain TCP connection to the peer port, instead of gRPC over HTTP/2.
//!
//! Why: on a replicated write, HTTP/2 puts a task between the caller and the socket on both
//! ends (hyper's connection task, then a task per stream on the server). Each is a thread
//! wake-up, and a lone write waits for several of them in a row. Here the caller writes its
//! frame to the socket itself, one reader task per connection hands each answer to its
//! caller, and the peer answers an AppendEntries from the task that read it
//! (docs/decisions/0027-peer-link.md has the measurements).
//!
//! The peer port tells the two apart by the first byte a connection sends: a link starts with
//! [`PREFACE`], HTTP/2 with `PRI`, TLS with a handshake record. The server echoes the preface
//! before any frame, so a node that meets a peer of an older release, which has no link,
//! notices at once and talks gRPC to it ([`Links`] keeps that choice for a while). Peer TLS
//! (`--peer-tls-*`) is not spoken on the link: with it every message goes over gRPC as before.
//! Snapshot streams keep a gRPC connection of their own either way.
//!
//! Frames, all integers big-endian:
//! - request: `len u32` (of the rest), `id u64`, `kind u8`, `target u64`, `ttl_ms u32`,
//!   `cluster_len u8`, the sender's cluster id, then the `RaftMessage` payload;
//! - answer: `len u32`, `id u64`, `code u8` (0, or a gRPC status code), then the payload, or
//!   the status message in UTF-8.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Buf;
use idemraft_proto::v1::raft_client::RaftClient;
use idemraft_proto::v1::RaftMessage;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::cluster::network::Channels;
use crate::cluster::transport::{PeerCall, Transport};
use crate::wire::MAX_PEER_MESSAGE;

/// What a link connection sends first, and what the peer port echoes to accept it. Version 2
/// says the sender also decodes compressed commands (decision 0030): a leader compresses only
/// while it holds a version-2 link to every other member.
pub const PREFACE: &[u8; 16] = b"IDEMRAFT-LINK/2\n";

/// The preface of the release before compressed commands, still accepted (and echoed) from
/// its nodes during a rolling upgrade. A node of that release closes a connection that opens
/// with [`PREFACE`], so the sender talks gRPC to it until it is upgraded.
pub const PREFACE_V1: &[u8; 16] = b"IDEMRAFT-LINK/1\n";

/// The largest frame either side accepts: a peer message and its header.
const MAX_FRAME: usize = MAX_PEER_MESSAGE + 512;

/// The fixed part of a request frame after its length: id, kind, target, ttl, cluster length.
const REQUEST_HEAD: usize = 8 + 1 + 8 + 4 + 1;

/// The fixed part of an answer frame after its length: id, code.
const ANSWER_HEAD: usize = 8 + 1;

/// How long dialling a peer and its echo of the preface may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long a peer that answered the preface with something else (an older release) is
/// reached over gRPC before the link is tried again.
const GRPC_FALLBACK: Duration = Duration::from_secs(60);

/// A connection on which a call timed out and no answer at all came for this long is closed.
/// Not at the first timeout: a follower that is merely slow (a busy disk) still answers, and
/// a new connection would only add work.
const SILENT_FOR: Duration = Duration::from_secs(1);

/// Bytes of a connection's read buffer: most AppendEntries arrive in one or two reads.
const READ_BUFFER: usize = 256 * 1024;

fn kind_byte(kind: PeerCall) -> u8 {
    match kind {
        PeerCall::AppendEntries => 1,
        PeerCall::Vote => 2,
        PeerCall::InstallSnapshot => 3,
        PeerCall::Forward => 4,
        PeerCall::PreVote => 5,
    }
}

fn kind_of(byte: u8) -> Option<PeerCall> {
    Some(match byte {
        1 => PeerCall::AppendEntries,
        2 => PeerCall::Vote,
        3 => PeerCall::InstallSnapshot,
        4 => PeerCall::Forward,
        5 => PeerCall::PreVote,
        _ => return None,
    })
}

/// One request as the peer port reads it.
#[derive(Debug)]
pub struct LinkRequest {
    /// Chosen by the sender; the answer carries it back.
    pub id: u64,
    /// Which peer call.
    pub kind: PeerCall,
    /// How long the sender waits, from when it sent the request.
    pub ttl: Duration,
    /// The sender's cluster id, when it has one.
    pub cluster: Option<String>,
    /// The message (its `target` is the addressee's node id).
    pub msg: RaftMessage,
}

/// Why reading a frame stopped.
#[derive(Debug)]
pub enum FrameError {
    /// The other side closed the connection between two frames.
    Closed,
    /// The connection failed, or the bytes are not a frame of this protocol.
    Broken(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => f.write_str("connection closed"),
            FrameError::Broken(why) => f.write_str(why),
        }
    }
}

/// Reads one frame's length, bounded by [`MAX_FRAME`].
async fn read_len<R: AsyncRead + Unpin>(rd: &mut R, at_least: usize) -> Result<usize, FrameError> {
    let mut len = [0u8; 4];
    match rd.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Broken(format!("reading a frame: {e}"))),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME || len < at_least {
        return Err(FrameError::Broken(format!(
            "a peer-link frame of {len} bytes (a frame has {at_least} to {MAX_FRAME}): not a peer of this protocol"
        )));
    }
    Ok(len)
}

/// Reads exactly `len` bytes into a new buffer. Not `vec![0; len]` and `read_exact`: an
/// AppendEntries of large bodies is megabytes, and zeroing them first costs a pass over
/// every byte for nothing.
async fn read_vec<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> Result<Vec<u8>, FrameError> {
    let mut body = Vec::with_capacity(len);
    while body.len() < len {
        let want = (len - body.len()) as u64;
        match (&mut *rd).take(want).read_buf(&mut body).await {
            Ok(0) => {
                return Err(FrameError::Broken(format!("a {len}-byte frame cut short after {} bytes", body.len())))
            }
            Ok(_) => {}
            Err(e) => return Err(FrameError::Broken(format!("reading a {len}-byte frame: {e}"))),
        }
    }
    Ok(body)
}

/// Reads one frame's body (what follows its length), bounded by [`MAX_FRAME`].
async fn read_frame<R: AsyncRead + Unpin>(rd: &mut R, at_least: usize) -> Result<Vec<u8>, FrameError> {
    let len = read_len(rd, at_least).await?;
    read_vec(rd, len).await
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

/// Reads one request frame: its header and cluster id first, then the payload straight into
/// a buffer of its own, so an AppendEntries is not copied out of the frame after it arrived.
pub async fn read_request<R: AsyncRead + Unpin>(rd: &mut R) -> Result<LinkRequest, FrameError> {
    let len = read_len(rd, REQUEST_HEAD).await?;
    let mut head = [0u8; REQUEST_HEAD];
    rd.read_exact(&mut head).await.map_err(|e| FrameError::Broken(format!("reading a {len}-byte frame: {e}")))?;
    let cluster_len = cluster_len(&head, len - REQUEST_HEAD)?;
    let cluster = read_vec(rd, cluster_len).await?;
    let payload = read_vec(rd, len - REQUEST_HEAD - cluster_len).await?;
    request_of(&head, &cluster, payload)
}

/// Parses a request frame's body (what follows its length).
pub fn parse_request(body: &[u8]) -> Result<LinkRequest, FrameError> {
    let Some((head, rest)) = body.split_first_chunk::<REQUEST_HEAD>() else {
        return Err(FrameError::Broken(format!(
            "a peer-link request of {} bytes, shorter than its header",
            body.len()
        )));
    };
    let (cluster, payload) = rest.split_at(cluster_len(head, rest.len())?);
    request_of(head, cluster, payload.to_vec())
}

/// The length of the cluster id a request header announces, checked against the `after` bytes
/// that follow the header.
fn cluster_len(head: &[u8; REQUEST_HEAD], after: usize) -> Result<usize, FrameError> {
    let len = usize::from(head[REQUEST_HEAD - 1]);
    if after < len {
        return Err(FrameError::Broken("a peer-link request shorter than its cluster id".into()));
    }
    Ok(len)
}

/// A request from its fixed header, its cluster id and its payload.
fn request_of(head: &[u8; REQUEST_HEAD], cluster: &[u8], payload: Vec<u8>) -> Result<LinkRequest, FrameError> {
    let id = be_u64(&head[0..8]);
    let kind = kind_of(head[8]).ok_or_else(|| FrameError::Broken(format!("unknown peer-link call {}", head[8])))?;
    let target = be_u64(&head[9..17]);
    let ttl_ms = u32::from_be_bytes([head[17], head[18], head[19], head[20]]);
    let cluster = match cluster.len() {
        0 => None,
        _ => Some(
            std::str::from_utf8(cluster)
                .map_err(|_| FrameError::Broken("a peer-link cluster id that is not UTF-8".into()))?
                .to_string(),
        ),
    };
    Ok(LinkRequest {
        id,
        kind,
        ttl: Duration::from_millis(u64::from(ttl_ms)),
        cluster,
        msg: RaftMessage { target, payload },
    })
}

/// Writes one answer frame: the message, or the status that refused it.
pub async fn write_answer<W: AsyncWrite + Unpin>(
    wr: &mut W,
    id: u64,
    answer: &Result<RaftMessage, Status>,
) -> std::io::Result<()> {
    let (code, body): (u8, &[u8]) = match answer {
        Ok(msg) => (0, &msg.payload),
        Err(status) => (u8::try_from(status.code() as i32).unwrap_or(2), status.message().as_bytes()),
    };
    let len = u32::try_from(ANSWER_HEAD + body.len()).map_err(|_| std::io::Error::other("answer too large"))?;
    let mut head = Vec::with_capacity(4 + ANSWER_HEAD);
    head.extend_from_slice(&len.to_be_bytes());
    head.extend_from_slice(&id.to_be_bytes());
    head.push(code);
    wr.write_all_buf(&mut Buf::chain(head.as_slice(), body)).await
}

async fn read_answer<R: AsyncRead + Unpin>(rd: &mut R) -> Result<(u64, Result<RaftMessage, Status>), FrameError> {
    let mut body = read_frame(rd, ANSWER_HEAD).await?;
    let id = be_u64(&body[0..8]);
    let code = body[8];
    let rest = body.split_off(ANSWER_HEAD);
    let answer = match code {
        0 => Ok(RaftMessage { target: 0, payload: rest }),
        c => Err(Status::new(Code::from_i32(i32::from(c)), String::from_utf8_lossy(&rest).into_owned())),
    };
    Ok((id, answer))
}

type Waiter = oneshot::Sender<Result<RaftMessage, Status>>;

/// One link connection to a peer.
struct Conn {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    waiting: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    /// When the last answer arrived (or the connection was made), in ms since `born`: a call
    /// that times out after [`SILENT_FOR`] without any answer finds the connection dead (a
    /// peer cut off or paused), not merely slow, and closes it.
    heard_ms: AtomicU64,
    born: Instant,
    closed: AtomicBool,
    /// The AppendEntries sent and not answered yet, if any. A follower answers them in order
    /// and never drops one, so one sent after its predecessor timed out would queue behind
    /// it; the next waits for that answer instead (see `append_slot`).
    append_busy: Mutex<Option<u64>>,
    append_free: tokio::sync::Notify,
    reader: Mutex<Option<tokio::task::AbortHandle>>,
    peer: String,
}

impl Conn {
    /// Dials `addr`: `Ok(None)` when the peer port answered the preface with something else
    /// (an older release, which speaks only gRPC).
    async fn dial(addr: &str) -> Result<Option<Arc<Conn>>, Status> {
        let unreachable = |e: String| Status::unavailable(format!("peer link to {addr}: {e}"));
        let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| unreachable("no connection within 500 ms".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| unreachable(e.to_string()))?;
        stream.write_all(PREFACE).await.map_err(|e| unreachable(e.to_string()))?;
        let mut echo = Vec::with_capacity(PREFACE.len());
        let read_echo = async {
            let mut buf = [0u8; 16];
            while echo.len() < PREFACE.len() {
                let n = stream.read(&mut buf[..PREFACE.len() - echo.len()]).await?;
                if n == 0 {
                    return Ok(false);
                }
                echo.extend_from_slice(&buf[..n]);
                if !PREFACE.starts_with(&echo) {
                    return Ok(false);
                }
            }
            Ok::<bool, std::io::Error>(true)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, read_echo).await {
            Err(_) => return Err(unreachable("no answer to the link preface within 500 ms".into())),
            Ok(Err(e)) => return Err(unreachable(e.to_string())),
            Ok(Ok(false)) => return Ok(None),
            Ok(Ok(true)) => {}
        }
        let (rd, wr) = stream.into_split();
        let conn = Arc::new(Conn {
            writer: tokio::sync::Mutex::new(wr),
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            heard_ms: AtomicU64::new(0),
            born: Instant::now(),
            closed: AtomicBool::new(false),
            append_busy: Mutex::new(None),
            append_free: tokio::sync::Notify::new(),
            reader: Mutex::new(None),
            peer: addr.to_string(),
        });
        let task = tokio::spawn(read_answers(Arc::downgrade(&conn), BufReader::with_capacity(READ_BUFFER, rd)));
        if let Ok(mut r) = conn.reader.lock() {
            *r = Some(task.abort_handle());
        }
        Ok(Some(conn))
    }

    /// Marks the connection dead and fails every call still waiting on it.
    fn close(&self, why: &str) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(peer = %self.peer, why, "peer link closed");
        if let Ok(mut r) = self.reader.lock() {
            if let Some(task) = r.take() {
                task.abort();
            }
        }
        let waiting: Vec<Waiter> = match self.waiting.lock() {
            Ok(mut w) => w.drain().map(|(_, tx)| tx).collect(),
            Err(_) => Vec::new(),
        };
        for tx in waiting {
            let _ = tx.send(Err(Status::unavailable(format!("peer link to {}: {why}", self.peer))));
        }
        self.answered(None);
    }

    /// Frees the AppendEntries slot when `id` holds it (`None`: whoever holds it).
    fn answered(&self, id: Option<u64>) {
        let mut busy = self.append_busy.lock().unwrap_or_else(|p| p.into_inner());
        if busy.is_some() && (id.is_none() || *busy == id) {
            *busy = None;
            drop(busy);
            self.append_free.notify_waiters();
        }
    }

    /// Waits until no AppendEntries is outstanding on this connection, then takes the slot
    /// for `id`. Without it a follower slower than the timeout would take in a new message at
    /// every timeout and answer each later than the one before, so none in time: a backlog
    /// that grows without end (HTTP/2 cancelled a timed-out call's stream instead).
    async fn append_slot(&self, id: u64, deadline: tokio::time::Instant) -> Result<(), ()> {
        loop {
            let freed = self.append_free.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut busy = self.append_busy.lock().unwrap_or_else(|p| p.into_inner());
                if busy.is_none() || self.closed.load(Ordering::Acquire) {
                    *busy = Some(id);
                    return Ok(());
                }
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return Err(());
            }
        }
    }

    /// The status of a call that timed out; closes the connection when nothing at all has
    /// been heard on it for [`SILENT_FOR`].
    fn timed_out(&self, ttl: Duration) -> Status {
        let heard = Duration::from_millis(self.heard_ms.load(Ordering::Acquire));
        if self.born.elapsed().saturating_sub(heard) >= SILENT_FOR {
            self.close("no answer to anything for a second");
        }
        Status::deadline_exceeded(format!("peer link to {}: no answer in {ttl:?}", self.peer))
    }

    async fn call(
        &self,
        kind: PeerCall,
        cluster: Option<&str>,
        msg: &RaftMessage,
        deadline: tokio::time::Instant,
        ttl: Duration,
    ) -> Result<RaftMessage, Status> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().map_err(|_| Status::internal("peer link state poisoned"))?.insert(id, tx);
        let mut call = InFlight { conn: self, id, writing: false };
        if kind == PeerCall::AppendEntries && self.append_slot(id, deadline).await.is_err() {
            return Err(self.timed_out(ttl));
        }
        call.writing = true;
        let cluster = cluster.unwrap_or("").as_bytes();
        let cluster = &cluster[..cluster.len().min(255)];
        let len = REQUEST_HEAD + cluster.len() + msg.payload.len();
        let len = u32::try_from(len).map_err(|_| Status::invalid_argument("peer message too large"))?;
        let mut head = Vec::with_capacity(4 + REQUEST_HEAD + cluster.len());
        head.extend_from_slice(&len.to_be_bytes());
        head.extend_from_slice(&id.to_be_bytes());
        head.push(kind_byte(kind));
        head.extend_from_slice(&msg.target.to_be_bytes());
        head.extend_from_slice(&u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX).to_be_bytes());
        head.push(cluster.len() as u8);
        head.extend_from_slice(cluster);
        let write = async {
            let mut wr = self.writer.lock().await;
            wr.write_all_buf(&mut Buf::chain(head.as_slice(), msg.payload.as_slice())).await
        };
        match tokio::time::timeout_at(deadline, write).await {
            // A frame cut off half-way leaves the stream unreadable: `call`'s drop closes it.
            Err(_) => return Err(self.timed_out(ttl)),
            Ok(Err(e)) => {
                self.close(&format!("writing: {e}"));
                return Err(Status::unavailable(format!("peer link to {}: {e}", self.peer)));
            }
            Ok(Ok(())) => call.writing = false,
        }
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(Status::unavailable(format!("peer link to {}: connection closed", self.peer))),
            Err(_) => Err(self.timed_out(ttl)),
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close("not used any more");
    }
}

/// A call on the wire: forgets its waiter however the call ends, and closes the connection
/// when it ends half-way through writing its frame.
struct InFlight<'a> {
    conn: &'a Conn,
    id: u64,
    writing: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.conn.waiting.lock() {
            w.remove(&self.id);
        }
        if self.writing {
            self.conn.close("a request frame was cut off");
        }
    }
}

async fn read_answers(conn: Weak<Conn>, mut rd: BufReader<OwnedReadHalf>) {
    loop {
        let frame = read_answer(&mut rd).await;
        let Some(conn) = conn.upgrade() else { return };
        match frame {
            Ok((id, answer)) => {
                let now = u64::try_from(conn.born.elapsed().as_millis()).unwrap_or(u64::MAX);
                conn.heard_ms.store(now, Ordering::Release);
                let waiter = conn.waiting.lock().ok().and_then(|mut w| w.remove(&id));
                if let Some(tx) = waiter {
                    let _ = tx.send(answer);
                }
                conn.answered(Some(id));
            }
            Err(e) => {
                conn.close(&e.to_string());
                return;
            }
        }
    }
}

/// What a peer address is reached by.
enum Route {
    /// Not dialled yet, or its last connection died.
    Idle,
    /// A live link connection.
    Link(Arc<Conn>),
    /// An older release: gRPC until then.
    Grpc(Instant),
}

/// The [`Transport`] of a server: the peer link to every peer that has one, gRPC (through
/// [`Channels`]) to older releases, with peer TLS, and for snapshot streams.
pub struct Links {
    grpc: Channels,
    routes: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Route>>>>,
    /// What each peer address said when last dialled: `true` it echoed [`PREFACE`], `false`
    /// it did not (an older release). Kept while the peer is down: a member that restarts or
    /// is cut off for a while does not turn compression off for everyone meanwhile, and the
    /// first dial after it comes back corrects this if it came back as an older release.
    decoders: Mutex<HashMap<String, bool>>,
}

impl Links {
    /// Links to the peers `grpc` dials, falling back on it.
    pub fn new(grpc: Channels) -> Links {
        Links { grpc, routes: Mutex::new(HashMap::new()), decoders: Mutex::new(HashMap::new()) }
    }

    /// The live connection to `addr`, dialled when there is none; `None`: use gRPC.
    async fn conn(&self, addr: &str) -> Result<Option<Arc<Conn>>, Status> {
        let slot = {
            let mut routes = self.routes.lock().map_err(|_| Status::internal("peer link state poisoned"))?;
            routes.entry(addr.to_string()).or_insert_with(|| Arc::new(tokio::sync::Mutex::new(Route::Idle))).clone()
        };
        let mut route = slot.lock().await;
        match &*route {
            Route::Link(c) if !c.closed.load(Ordering::Acquire) => return Ok(Some(c.clone())),
            Route::Grpc(until) if Instant::now() < *until => return Ok(None),
            _ => {}
        }
        *route = Route::Idle;
        let dialled = Conn::dial(addr).await?;
        if let Ok(mut d) = self.decoders.lock() {
            d.insert(addr.to_string(), dialled.is_some());
        }
        match dialled {
            Some(c) => {
                *route = Route::Link(c.clone());
                Ok(Some(c))
            }
            None => {
                tracing::info!(peer = addr, "the peer has no peer link (an older release?): using gRPC for a minute");
                *route = Route::Grpc(Instant::now() + GRPC_FALLBACK);
                Ok(None)
            }
        }
    }
}

#[tonic::async_trait]
impl Transport for Links {
    async fn call(
        &self,
        target: u64,
        addr: &str,
        kind: PeerCall,
        msg: RaftMessage,
        ttl: Duration,
    ) -> Result<RaftMessage, Status> {
        if self.grpc.has_tls() {
            return self.grpc.call(target, addr, kind, msg, ttl).await;
        }
        let deadline = tokio::time::Instant::now() + ttl;
        let dial = self.grpc.dial_addr(target, addr);
        let conn = match tokio::time::timeout_at(deadline, self.conn(&dial)).await {
            Err(_) => return Err(Status::deadline_exceeded(format!("peer link to {dial}: no connection in {ttl:?}"))),
            Ok(r) => r?,
        };
        match conn {
            Some(conn) => conn.call(kind, self.grpc.cluster_id().as_deref(), &msg, deadline, ttl).await,
            None => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                self.grpc.call(target, addr, kind, msg, left).await
            }
        }
    }

    fn bulk(&self, target: u64, addr: &str) -> Option<Result<RaftClient<Channel>, String>> {
        self.grpc.bulk(target, addr)
    }

    fn stamp(&self, metadata: &mut tonic::metadata::MetadataMap) {
        self.grpc.stamp(metadata);
    }

    /// Only a peer whose last dial got [`PREFACE`] echoed says so. One reached over gRPC (an
    /// older release, peer TLS) or never dialled is not known to.
    fn decodes_compressed(&self, target: u64, addr: &str) -> bool {
        let dial = self.grpc.dial_addr(target, addr);
        self.decoders.lock().ok().and_then(|d| d.get(&dial).copied()).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_garbage_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let answer = Ok(RaftMessage { target: 0, payload: vec![7; 1000] });
        write_answer(&mut a, 42, &answer).await.unwrap_or_else(|e| panic!("{e}"));
        write_answer(&mut a, 43, &Err(Status::failed_precondition("wrong cluster")))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (id, got) = read_answer(&mut b).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((id, got.map(|m| m.payload).ok()), (42, Some(vec![7; 1000])));
        let (id, got) = read_answer(&mut b).await.unwrap_or_else(|e| panic!("{e}"));
        let status = got.err().unwrap_or_else(|| panic!("an error answer came back as a success"));
        assert_eq!((id, status.code(), status.message()), (43, Code::FailedPrecondition, "wrong cluster"));

        // A length past the bound is refused before anything is allocated.
        let (mut a, mut b) = tokio::io::duplex(1 << 10);
        a.write_all(&u32::MAX.to_be_bytes()).await.unwrap_or_else(|e| panic!("{e}"));
        let e = read_request(&mut b).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("not a peer of this protocol"), "{e}");
        // An unknown call kind names itself.
        let (mut a, mut b) = tokio::io::duplex(1 << 10);
        let mut frame = (REQUEST_HEAD as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&[0u8; 8]);
        frame.push(99);
        frame.extend_from_slice(&[0u8; REQUEST_HEAD - 9]);
        a.write_all(&frame).await.unwrap_or_else(|e| panic!("{e}"));
        let e = read_request(&mut b).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("unknown peer-link call 99"), "{e}");
        // A clean close between frames is not an error.
        drop(a);
        assert!(matches!(read_request(&mut b).await, Err(FrameError::Closed)));
    }

    /// A request frame as a peer writes one.
    fn request_frame(id: u64, target: u64, cluster: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut frame = ((REQUEST_HEAD + cluster.len() + payload.len()) as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&id.to_be_bytes());
        frame.push(kind_byte(PeerCall::AppendEntries));
        frame.extend_from_slice(&target.to_be_bytes());
        frame.extend_from_slice(&1500u32.to_be_bytes());
        frame.push(cluster.len() as u8);
        frame.extend_from_slice(cluster);
        frame.extend_from_slice(payload);
        frame
    }

    #[tokio::test]
    async fn a_request_read_in_pieces_is_the_request_parsed_whole() {
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let frame = request_frame(9, 3, b"prod-1", &payload);
        // A pipe far smaller than the frame: the payload arrives in many reads.
        let (mut a, mut b) = tokio::io::duplex(4096);
        let writer = {
            let frame = frame.clone();
            tokio::spawn(async move { a.write_all(&frame).await })
        };
        let read = read_request(&mut b).await.unwrap_or_else(|e| panic!("{e}"));
        writer.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("{e}"));
        let parsed = parse_request(&frame[4..]).unwrap_or_else(|e| panic!("{e}"));
        for r in [&read, &parsed] {
            assert_eq!(
                (r.id, r.kind, r.msg.target, r.ttl),
                (9, PeerCall::AppendEntries, 3, Duration::from_millis(1500))
            );
            assert_eq!(r.cluster.as_deref(), Some("prod-1"));
            assert!(r.msg.payload == payload, "the payload came back changed");
        }

        // A connection that ends inside the payload is a broken frame, not a short message.
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        a.write_all(&frame[..frame.len() - 10]).await.unwrap_or_else(|e| panic!("{e}"));
        drop(a);
        let e = read_request(&mut b).await.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("cut short"), "{e}");
    }

    /// A peer port that takes connections and, after what `greet` writes, reads and ignores
    /// everything; counts connections.
    async fn fake_peer(greet: &'static [u8]) -> (String, Arc<AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let _ = s.write_all(greet).await;
                    let mut sink = [0u8; 4096];
                    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                });
            }
        });
        (addr, accepted)
    }

    fn message() -> RaftMessage {
        RaftMessage { target: 2, payload: vec![1; 100] }
    }

    #[tokio::test]
    async fn a_peer_without_the_link_is_reached_over_grpc() {
        // What an HTTP/2 server sends first: its SETTINGS frame.
        let (addr, _) = fake_peer(b"\0\0\x12\x04\0\0\0\0\0\0\x03\0\0\0\x64\0\x04\0\x10\0\0").await;
        let links = Links::new(Channels::default());
        assert!(links.conn(&addr).await.unwrap_or_else(|e| panic!("{e}")).is_none(), "no link to an HTTP/2 server");
        let routes = links.routes.lock().unwrap_or_else(|p| p.into_inner());
        let route =
            routes.get(&addr).map(|r| matches!(&*r.try_lock().unwrap_or_else(|e| panic!("{e}")), Route::Grpc(_)));
        assert_eq!(route, Some(true), "the choice is kept");
    }

    #[tokio::test]
    async fn only_a_peer_that_echoed_this_preface_is_known_to_decode_compressed_commands() {
        let links = Links::new(Channels::default());
        let (current, _) = fake_peer(PREFACE).await;
        assert!(!links.decodes_compressed(2, &current), "not dialled yet: unknown");
        assert!(links.conn(&current).await.unwrap_or_else(|e| panic!("{e}")).is_some());
        assert!(links.decodes_compressed(2, &current));

        // A node of the release before: it echoes only its own preface, and closes a
        // connection that opens with this one, so it is reached over gRPC.
        let (older, _) = fake_peer(PREFACE_V1).await;
        assert!(links.conn(&older).await.unwrap_or_else(|e| panic!("{e}")).is_none());
        assert!(!links.decodes_compressed(3, &older));

        // A peer that goes away keeps what it said until a dial finds otherwise.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let gone = listener.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
        drop(listener);
        links.decoders.lock().unwrap_or_else(|p| p.into_inner()).insert(gone.clone(), true);
        assert!(links.conn(&gone).await.is_err(), "nothing listens there");
        assert!(links.decodes_compressed(4, &gone), "an unreachable peer is not taken for an older release");
    }

    #[tokio::test]
    async fn a_connection_that_answers_nothing_is_closed_and_dialled_again() {
        let (addr, accepted) = fake_peer(PREFACE).await;
        let links = Links::new(Channels::default());
        let ttl = SILENT_FOR + Duration::from_millis(100);
        for round in 1..=2u64 {
            let e = links.call(2, &addr, PeerCall::Vote, message(), ttl).await.err();
            assert_eq!(e.map(|s| s.code()), Some(Code::DeadlineExceeded), "round {round}");
            assert_eq!(accepted.load(Ordering::SeqCst), round, "a silent connection is not used again");
        }
    }

    /// A peer that answers each request, in order, 100 ms after reading it; counts
    /// connections and requests.
    async fn slow_peer() -> (String, Arc<AtomicU64>, Arc<AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
        let (accepted, requests) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (conns, reqs) = (accepted.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::SeqCst);
                let reqs = reqs.clone();
                tokio::spawn(async move {
                    let mut preface = [0u8; 16];
                    let _ = s.read_exact(&mut preface).await;
                    let _ = s.write_all(PREFACE).await;
                    while let Ok(req) = read_request(&mut s).await {
                        reqs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let _ = write_answer(&mut s, req.id, &Ok(req.msg)).await;
                    }
                });
            }
        });
        (addr, accepted, requests)
    }

    #[tokio::test]
    async fn appends_to_a_slow_peer_do_not_pile_up() {
        let (addr, accepted, requests) = slow_peer().await;
        let links = Links::new(Channels::default());
        let started = Instant::now();
        for _ in 0..20 {
            let _ = links.call(2, &addr, PeerCall::AppendEntries, message(), Duration::from_millis(20)).await;
        }
        // 20 timeouts of 20 ms: about 400 ms, in which the peer answers about four messages.
        // Then time for it to read whatever else was sent.
        let bound = started.elapsed().as_millis() as u64 / 100 + 2;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let sent = requests.load(Ordering::SeqCst);
        assert!(sent <= bound, "{sent} AppendEntries reached a peer that answers one per 100 ms (at most {bound})");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_slow_peer_keeps_its_connection() {
        let (addr, accepted, _) = slow_peer().await;
        let links = Links::new(Channels::default());
        let late = links.call(2, &addr, PeerCall::Vote, message(), Duration::from_millis(50)).await;
        assert_eq!(late.err().map(|s| s.code()), Some(Code::DeadlineExceeded));
        let answer = links.call(2, &addr, PeerCall::Vote, message(), Duration::from_secs(2)).await;
        assert_eq!(answer.map(|m| m.payload).ok(), Some(message().payload));
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one late answer does not cost the connection");
    }

    #[tokio::test]
    async fn an_unreachable_peer_is_unavailable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}")).to_string();
        drop(listener);
        let links = Links::new(Channels::default());
        let e = links.call(2, &addr, PeerCall::Vote, message(), Duration::from_secs(1)).await.err();
        assert_eq!(e.map(|s| s.code()), Some(Code::Unavailable));
    }
}
