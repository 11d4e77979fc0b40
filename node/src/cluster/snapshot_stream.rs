//! Snapshots sent whole, in one gRPC stream (`Raft/StreamSnapshot`) on a connection of their
//! own, instead of openraft 0.9's chunk-per-RPC transport.
//!
//! The chunked transport sends a snapshot as 1 MiB RPCs, each within a fixed deadline, and
//! gives the whole transfer up when one chunk misses it: the next attempt starts again from
//! byte 0 with a fresh snapshot. A follower whose disk is busy taking a multi-gigabyte state
//! misses one deadline among thousands and never finishes. Here the bytes flow under HTTP/2's
//! flow control, so a slow receiver slows the stream instead of failing it; the transfer
//! fails only when it stops moving for [`STALL`]. The sender is paced to `--snapshot-rate` so
//! catching one follower up leaves disk and network for live traffic, and its connection is
//! not the one that carries heartbeats and AppendEntries, so those never queue behind it.
//!
//! The receiver writes the bytes to a file of the state machine's and hands the complete
//! snapshot to openraft (`install_full_snapshot`), which checks the leader's vote and
//! installs it; every frame counts as contact with the leader, so a long transfer does not
//! start an election.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, Stream, StreamExt};
use idemraft_proto::v1::{RaftMessage, SnapshotFrame};
use idemraft_store::TypeConfig;
use openraft::error::{Fatal, NetworkError, RemoteError, ReplicationClosed, StreamingError, Timeout, Unreachable};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork};
use openraft::raft::SnapshotResponse;
use openraft::{Raft, Snapshot, Vote};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::cluster::transport::{StrError, Transport};
use crate::wire::{self, SnapshotHeader, SnapshotReply};

/// Bytes of snapshot in one frame.
pub const FRAME_BYTES: usize = 1024 * 1024;

/// Frames read ahead of what the connection has taken; with HTTP/2's windows this bounds the
/// sender's memory to a few MiB per transfer.
const FRAMES_AHEAD: usize = 4;

/// Longest time a transfer may make no progress (no frame taken by the connection, or, after
/// the last one, no answer beyond what installing takes) before the sender gives it up.
pub const STALL: Duration = Duration::from_secs(30);

/// The install after the last byte: the follower re-reads and checks the snapshot while
/// copying it into place, then loads it. Allowed this much time per byte on top of [`STALL`]
/// (16 MiB/s, far below a disk's sequential speed).
const INSTALL_BYTES_PER_SEC: u64 = 16 * 1024 * 1024;

type SendError = StreamingError<TypeConfig, Fatal<u64>>;

/// The sending node's link to one peer.
pub struct Link {
    /// The sending node.
    pub id: u64,
    /// The peer.
    pub target: u64,
    /// The peer's advertised peer address.
    pub addr: String,
    /// Bytes per second of the stream; 0: unbounded.
    pub rate: u64,
    /// The transport that gives the stream its connection and stamps its requests.
    pub transport: Arc<dyn Transport>,
}

/// Sends `snapshot` to `net`'s target as one stream, paced to `rate` bytes per second (0: no
/// bound). Falls back to openraft's chunked transport when the target predates the stream
/// (UNIMPLEMENTED), so a rolling upgrade can still catch an old node up.
pub async fn send<N: RaftNetwork<TypeConfig>>(
    net: &mut N,
    link: Link,
    vote: Vote<u64>,
    mut snapshot: Snapshot<TypeConfig>,
    cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
    option: RPCOption,
) -> Result<SnapshotResponse<u64>, SendError> {
    let cancel = cancel.shared();
    let Some(client) = link.transport.bulk(link.target, &link.addr) else {
        use openraft::network::snapshot_transport::{Chunked, SnapshotTransport};
        return Chunked::send_snapshot(net, vote, snapshot, cancel, option).await;
    };
    let client = client.map_err(|e| Unreachable::new(&StrError(e)))?;
    let started = Instant::now();
    let len = snapshot.snapshot.seek(std::io::SeekFrom::End(0)).await.map_err(|e| unreadable(&link, &e))?;
    let reply = stream(&link, client, vote, &mut snapshot, len, cancel.clone()).await?;
    match reply {
        Ok(reply) => {
            let reply: SnapshotReply = wire::decode("snapshot stream reply", &reply.into_inner().payload)
                .map_err(|e| NetworkError::new(&StrError(e)))?;
            let response = reply.map_err(|fatal| RemoteError::new(link.target, fatal))?;
            let secs = started.elapsed().as_secs_f64();
            tracing::info!(
                target = link.target,
                snapshot = %snapshot.meta.snapshot_id,
                bytes = len,
                secs = format!("{secs:.1}"),
                mib_per_sec = format!("{:.1}", len as f64 / (1024.0 * 1024.0) / secs.max(1e-3)),
                "sent a snapshot"
            );
            Ok(response)
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            tracing::info!(target = link.target, "peer predates streamed snapshots; sending chunks");
            use openraft::network::snapshot_transport::{Chunked, SnapshotTransport};
            Chunked::send_snapshot(net, vote, snapshot, cancel, option).await
        }
        Err(status) => {
            let err = StrError(format!("snapshot stream to node {}: {}", link.target, status.message()));
            Err(match status.code() {
                tonic::Code::Unavailable | tonic::Code::Unknown => Unreachable::new(&err).into(),
                _ => NetworkError::new(&err).into(),
            })
        }
    }
}

/// Runs one stream of `snapshot` to the end: its reply, or why the sender gave it up.
async fn stream(
    net: &Link,
    mut client: idemraft_proto::v1::raft_client::RaftClient<tonic::transport::Channel>,
    vote: Vote<u64>,
    snapshot: &mut Snapshot<TypeConfig>,
    len: u64,
    cancel: impl Future<Output = ReplicationClosed>,
) -> Result<Result<tonic::Response<RaftMessage>, tonic::Status>, SendError> {
    let data = &mut snapshot.snapshot;
    data.seek(std::io::SeekFrom::Start(0)).await.map_err(|e| unreadable(net, &e))?;
    let header = SnapshotHeader { vote, meta: snapshot.meta.clone(), len };
    let header = wire::encode(&header).map_err(|e| NetworkError::new(&StrError(e)))?;

    let (tx, rx) = tokio::sync::mpsc::channel::<SnapshotFrame>(FRAMES_AHEAD);
    let frames = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    let mut request = tonic::Request::new(frames);
    net.transport.stamp(request.metadata_mut());
    let call = client.stream_snapshot(request);
    let feed = feed(data, tx, net.target, header, len, net.rate);
    tokio::pin!(call, feed, cancel);

    let waiting_for_install = STALL + Duration::from_secs(len / INSTALL_BYTES_PER_SEC);
    let mut fed = false;
    loop {
        tokio::select! {
            closed = &mut cancel => return Err(StreamingError::Closed(closed)),
            done = &mut feed, if !fed => match done {
                Ok(()) => fed = true,
                Err(FeedError::Stalled) => return Err(timed_out(net, STALL)),
                Err(FeedError::Read(e)) => return Err(unreadable(net, &e)),
                // The connection stopped taking frames: its call has ended, with the reason.
                Err(FeedError::Closed) => fed = true,
            },
            reply = &mut call => return Ok(reply),
            _ = tokio::time::sleep(waiting_for_install), if fed => return Err(timed_out(net, waiting_for_install)),
        }
    }
}

enum FeedError {
    Stalled,
    Read(std::io::Error),
    Closed,
}

/// Reads the snapshot from its start and hands it to the stream frame by frame, the header on
/// the first, no faster than `rate` bytes per second.
async fn feed(
    data: &mut idemraft_store::SnapshotData,
    tx: tokio::sync::mpsc::Sender<SnapshotFrame>,
    target: u64,
    header: Vec<u8>,
    len: u64,
    rate: u64,
) -> Result<(), FeedError> {
    let started = Instant::now();
    let mut sent = 0u64;
    let mut first = Some(header);
    loop {
        let mut buf = Vec::with_capacity(FRAME_BYTES);
        while buf.len() < FRAME_BYTES {
            if data.read_buf(&mut buf).await.map_err(FeedError::Read)? == 0 {
                break;
            }
        }
        let last = buf.is_empty();
        sent += buf.len() as u64;
        if last && sent != len {
            let why = format!("the snapshot ended after {sent} of its {len} bytes");
            return Err(FeedError::Read(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why)));
        }
        if !last || first.is_some() {
            let frame = SnapshotFrame { target, header: first.take().unwrap_or_default(), data: buf };
            match tokio::time::timeout(STALL, tx.send(frame)).await {
                Err(_) => return Err(FeedError::Stalled),
                Ok(Err(_)) => return Err(FeedError::Closed),
                Ok(Ok(())) => {}
            }
        }
        if last {
            return Ok(());
        }
        if rate > 0 {
            let due = Duration::from_secs_f64(sent as f64 / rate as f64);
            if let Some(ahead) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(ahead).await;
            }
        }
    }
}

fn unreadable(net: &Link, e: &std::io::Error) -> SendError {
    // Not openraft's StorageError: that one is fatal and would stop a leader that can still
    // serve every write because one transfer could not read its file. The transfer fails, is
    // logged, and is tried again after a back-off with the then newest snapshot.
    tracing::error!(target = net.target, error = %e, "cannot read the snapshot to send; will retry");
    Unreachable::new(&StrError(format!("cannot read the snapshot to send: {e}"))).into()
}

fn timed_out(net: &Link, timeout: Duration) -> SendError {
    Timeout { action: RPCTypes::InstallSnapshot, id: net.id, target: net.target, timeout }.into()
}

/// Takes a streamed snapshot whose first frame is `first` (already checked for its addressee)
/// and installs it into `raft`; answers with the encoded [`SnapshotReply`]. `heard` is told of
/// the sender's vote at every frame (contact with the leader, for the pre-vote).
pub async fn receive(
    raft: &Raft<TypeConfig>,
    heard: impl Fn(&Vote<u64>),
    first: SnapshotFrame,
    mut rest: impl Stream<Item = Result<SnapshotFrame, tonic::Status>> + Unpin,
) -> Result<RaftMessage, tonic::Status> {
    let header: SnapshotHeader =
        wire::decode("snapshot stream header", &first.header).map_err(tonic::Status::invalid_argument)?;
    heard(&header.vote);
    let current = raft.metrics().borrow().vote;
    if header.vote < current {
        // A deposed leader: say so before it sends the whole state.
        return seal(&Ok(SnapshotResponse::new(current)));
    }
    let mut data = raft
        .begin_receiving_snapshot()
        .await
        .map_err(|e| tonic::Status::internal(format!("cannot receive a snapshot: {e}")))?;
    let mut got = 0u64;
    let mut frame = Some(first);
    loop {
        if let Some(f) = frame.take() {
            got += f.data.len() as u64;
            if got > header.len {
                return Err(tonic::Status::invalid_argument(format!(
                    "snapshot stream carries more than the {} bytes its header announced",
                    header.len
                )));
            }
            data.write_all(&f.data)
                .await
                .map_err(|e| tonic::Status::internal(format!("cannot write the received snapshot: {e}")))?;
            heard(&header.vote);
        }
        match rest.next().await {
            Some(next) => frame = Some(next?),
            None => break,
        }
    }
    if got != header.len {
        return Err(tonic::Status::data_loss(format!(
            "snapshot stream ended after {got} of its {} bytes; the leader sends it again",
            header.len
        )));
    }
    data.flush().await.map_err(|e| tonic::Status::internal(format!("cannot write the received snapshot: {e}")))?;
    let started = Instant::now();
    let reply = raft.install_full_snapshot(header.vote, Snapshot { meta: header.meta, snapshot: data }).await;
    tracing::info!(
        bytes = got,
        install_secs = format!("{:.1}", started.elapsed().as_secs_f64()),
        ok = reply.is_ok(),
        "received a streamed snapshot"
    );
    seal(&reply)
}

fn seal(reply: &SnapshotReply) -> Result<RaftMessage, tonic::Status> {
    Ok(RaftMessage { target: 0, payload: wire::encode(reply).map_err(tonic::Status::internal)? })
}
