//! Backup at the node: the Admin `Snapshot` stream, what `idemctl snapshot save` reads.
//!
//! Only the leader serves `Snapshot`, after a linearizable check: it has applied every write
//! acknowledged before the call, so the backup holds all of them. It then asks openraft for a
//! snapshot (`trigger().snapshot()`), waits until one covers that index, opens it
//! (`get_snapshot`), reads it completely to check it and to count, hash and size it, and
//! streams the file in 256 KiB chunks, the first one carrying that summary. An open file
//! stays readable even if a newer snapshot replaces it meanwhile.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use idemraft_proto::v1 as pb;
use idemraft_store::backup::{self, SnapshotSummary};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use tonic::Status;

use crate::cluster::node::Node;
use crate::error::NodeError;

/// Bytes per streamed chunk.
const CHUNK: usize = 256 * 1024;

/// The stream of a backup's chunks.
pub type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotChunk, Status>> + Send>>;

fn info_of(s: &SnapshotSummary, node_id: u64) -> pb::SnapshotInfo {
    pb::SnapshotInfo {
        snapshot_id: s.snapshot_id.clone(),
        last_index: s.last_index,
        last_term: s.last_term,
        records: s.records,
        size_bytes: s.size_bytes,
        sha256: s.sha256.to_vec(),
        node_id,
    }
}

/// Serves Admin `Snapshot`: on the leader only, a snapshot covering everything acknowledged
/// before the call, checked and then streamed.
pub async fn serve(node: &Node, deadline: Instant) -> Result<ChunkStream, NodeError> {
    let me = node.config().id;
    let status = node.status();
    if status.leader_id != Some(me) {
        return Err(NodeError::NoLeader {
            why: "a backup snapshot is taken on the leader, and this node does not lead".into(),
            leader_id: status.leader_id,
            leader_addr: status.leader_client_addr,
        });
    }
    let raft = node.raft();
    let until = deadline.checked_sub(Duration::from_millis(20)).unwrap_or(deadline);
    // After this, every write acknowledged before the call is applied here.
    match tokio::time::timeout_at(until, raft.ensure_linearizable()).await {
        Err(_) => return Err(NodeError::NoQuorum("a majority did not confirm this leader before the deadline".into())),
        Ok(Err(e)) => return Err(NodeError::NoLeader { why: e.to_string(), leader_id: None, leader_addr: None }),
        Ok(Ok(_)) => {}
    }
    let applied = raft.metrics().borrow().last_applied.map_or(0, |l| l.index);
    // openraft ignores a trigger while a build runs, and that build may cover less than
    // `applied`: trigger again each second until a snapshot covers it (bounded by the deadline).
    loop {
        raft.trigger().snapshot().await.map_err(|e| NodeError::Internal(format!("cannot start a snapshot: {e}")))?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NodeError::Deadline("while the snapshot was being built".into()));
        }
        let covered = raft
            .wait(Some(left.min(Duration::from_secs(1))))
            .metrics(|m| m.snapshot.is_some_and(|s| s.index >= applied), "a snapshot covering the applied index")
            .await;
        if covered.is_ok() {
            break;
        }
    }
    let snapshot = raft
        .get_snapshot()
        .await
        .map_err(|e| NodeError::Internal(format!("cannot open the snapshot: {e}")))?
        .ok_or_else(|| NodeError::Internal("the snapshot just built is gone".into()))?;
    let what = format!("snapshot {}", snapshot.meta.snapshot_id);
    // Check the whole snapshot first (count, hash and size it), then stream it from its start.
    type Check = Box<dyn FnOnce() -> Result<SnapshotSummary, String> + Send>;
    type Source = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
    let checked = what.clone();
    let (check, send): (Check, Source) = match *snapshot.snapshot {
        idemraft_store::SnapshotData::File(f) => {
            let file = f.into_std().await;
            let mut reading = file.try_clone().map_err(|e| NodeError::Internal(format!("reopening {what}: {e}")))?;
            let check = move || {
                let summary = backup::inspect(&mut reading, &checked).map_err(|e| e.to_string())?;
                // The clone shares the file offset with the file streamed below.
                use std::io::Seek;
                reading.seek(std::io::SeekFrom::Start(0)).map_err(|e| format!("rewinding {checked}: {e}"))?;
                Ok(summary)
            };
            (Box::new(check), Box::new(tokio::fs::File::from_std(file)))
        }
        idemraft_store::SnapshotData::Blobs(stream) => {
            let reading = stream.reopen();
            (Box::new(move || backup::inspect(reading, &checked).map_err(|e| e.to_string())), Box::new(stream))
        }
        idemraft_store::SnapshotData::Memory(_) => {
            return Err(NodeError::Internal("this node keeps its snapshots in memory; nothing to save".into()))
        }
    };
    let summary = tokio::task::spawn_blocking(check)
        .await
        .map_err(|e| NodeError::Internal(format!("snapshot check task: {e}")))?
        .map_err(|e| NodeError::Internal(format!("the snapshot failed its check: {e}")))?;
    tracing::info!(
        snapshot = %summary.snapshot_id,
        index = summary.last_index,
        records = summary.records,
        bytes = summary.size_bytes,
        "streaming a backup snapshot"
    );
    let first = info_of(&summary, me);
    let stream = futures::stream::unfold((send, Some(first), false), |(mut file, info, done)| async move {
        if done {
            return None;
        }
        let mut buf = vec![0u8; CHUNK];
        let mut filled = 0;
        // Fill whole chunks: a short read is not the end of the file.
        while filled < CHUNK {
            match file.read(&mut buf[filled..]).await {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => {
                    return Some((Err(Status::internal(format!("reading the snapshot: {e}"))), (file, None, true)))
                }
            }
        }
        buf.truncate(filled);
        let last = filled < CHUNK;
        if filled == 0 && info.is_none() {
            return None;
        }
        Some((Ok(pb::SnapshotChunk { info, data: buf }), (file, None, last)))
    });
    Ok(Box::pin(stream))
}
