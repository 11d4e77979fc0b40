//! Backups: checking a snapshot file from end to end, and founding a new cluster's state
//! from one.
//!
//! A backup is an ordinary snapshot file (`snapshot.rs` format) streamed out of a running
//! node. [`inspect`] reads one completely (magic, version, header, every record, the count
//! and the SHA-256) and reports what it holds, so a damaged backup is found when it is taken
//! and again before it is used, never half-way through a restore.
//!
//! [`restore`] installs a backup as the initial state of an empty data directory, through the
//! store's own snapshot-install path (verify while copying, durable `pending` marker, load,
//! make current). The snapshot's metadata is rewritten first, identically on every founder:
//! - the last log id keeps the backup's **index** `N`, so the new cluster's log continues at
//!   `N + 1` and every fencing token it grants (`index * 2^16 + position`) is larger than
//!   every token in the restored records;
//! - the term and leader become 0, so the new cluster's first leader (term 1) appends after
//!   it with log ids that still increase;
//! - the membership becomes the new cluster's `--initial-cluster`.
//!
//! Every founder restoring the same file therefore holds the same state at the same log id
//! with the same membership: exactly the position of a cluster whose log was compacted up to
//! `N`. openraft sees an applied state ahead of an empty log, purges the log up to `N`, and
//! elects a leader as usual; `initialize` is not needed (and answers NotAllowed).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{BasicNode, CommittedLeaderId, Membership};
use sha2::{Digest, Sha256};

use crate::error::StoreError;
use crate::file_log::LogStore;
use crate::raft::{LogId, SnapshotData, SnapshotMeta, StoredMembership};
use crate::sled_store::StateMachineStore;
use crate::snapshot::{Reader, Wanted, Writer};

/// What a snapshot file holds, found by reading all of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// The snapshot id in its header.
    pub snapshot_id: String,
    /// Index of the last entry it covers (0 if none).
    pub last_index: u64,
    /// Term of that entry.
    pub last_term: u64,
    /// Number of records.
    pub records: u64,
    /// The state machine's clock.
    pub clock_ms: u64,
    /// Size of the file in bytes.
    pub size_bytes: u64,
    /// SHA-256 of the whole file.
    pub sha256: [u8; 32],
    /// The membership it carries, as `id -> peer address`.
    pub members: BTreeMap<u64, String>,
}

/// Counts and hashes every byte read through it.
struct Tap<R> {
    inner: R,
    hash: Sha256,
    bytes: u64,
}

impl<R: Read> Read for Tap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Reads a whole snapshot stream, checking everything `snapshot.rs` checks on install, and
/// refuses trailing bytes. `what` names the input in errors.
pub fn inspect(input: impl Read, what: &str) -> Result<SnapshotSummary, StoreError> {
    let mut tap = Tap { inner: input, hash: Sha256::new(), bytes: 0 };
    let (meta, clock, records) = {
        let (mut reader, meta, clock) = Reader::new(&mut tap, what.to_string())?;
        let mut records = 0u64;
        let mut wanted = Wanted::default();
        while let Some(r) = reader.next_record()? {
            records += 1;
            if let Some(b) = r.blob {
                wanted.add(b, ());
            }
        }
        reader.blobs(|index, n, len, body| wanted.take(index, n, len, body, what).map(drop))?;
        wanted.finish(what)?;
        (meta, clock, records)
    };
    // `Reader` buffers, so it may have read past the checksum: drain the rest so the size
    // and hash cover the whole input (bytes after the checksum are ignored, as on install).
    std::io::copy(&mut tap, &mut std::io::sink()).map_err(|e| StoreError::io(format!("reading {what}"), e))?;
    Ok(SnapshotSummary {
        snapshot_id: meta.snapshot_id.clone(),
        last_index: meta.last_log_id.map_or(0, |l| l.index),
        last_term: meta.last_log_id.map_or(0, |l| l.leader_id.term),
        records,
        clock_ms: clock,
        size_bytes: tap.bytes,
        sha256: tap.hash.finalize().into(),
        members: meta.last_membership.membership().nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
    })
}

/// [`inspect`] on a file.
pub fn inspect_file(path: &Path) -> Result<SnapshotSummary, StoreError> {
    let file = std::fs::File::open(path).map_err(|e| StoreError::io(format!("opening {}", path.display()), e))?;
    let what = format!("snapshot file {}", path.display());
    let summary = inspect(file, &what)?;
    let len = std::fs::metadata(path).map_err(|e| StoreError::io(format!("reading {}", path.display()), e))?.len();
    if len != summary.size_bytes {
        return Err(StoreError::Corrupt { what, detail: format!("{len} bytes on disk, {} read", summary.size_bytes) });
    }
    Ok(summary)
}

/// The metadata every founder gives the restored state: the backup's index, term and leader
/// 0, the new membership. A pure function of the file's header and `members`, so every
/// founder computes the same one.
pub fn restored_meta(original: &SnapshotMeta, members: &BTreeMap<u64, BasicNode>) -> Result<SnapshotMeta, StoreError> {
    let Some(last) = original.last_log_id else {
        return Err(StoreError::Corrupt {
            what: format!("snapshot {}", original.snapshot_id),
            detail: "it covers no log entry (a snapshot of a cluster that never formed); nothing to restore".into(),
        });
    };
    let log_id = LogId::new(CommittedLeaderId::new(0, 0), last.index);
    let voters: BTreeSet<u64> = members.keys().copied().collect();
    let membership = Membership::new(vec![voters], members.clone());
    Ok(SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: restored_snapshot_id(&original.snapshot_id, last.index),
    })
}

/// The snapshot id a restore of the backup `original_id` (covering `index`) installs: a plain
/// name, the same on every founder.
pub fn restored_snapshot_id(original_id: &str, index: u64) -> String {
    let plain: String = original_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .take(120)
        .collect();
    format!("restored-{index}-{plain}")
}

/// Reads only the header of a snapshot file (magic, version, metadata): cheap, for deciding
/// what to do before the whole file is checked.
pub fn read_header(path: &Path) -> Result<SnapshotMeta, StoreError> {
    let file = std::fs::File::open(path).map_err(|e| StoreError::io(format!("opening {}", path.display()), e))?;
    let (_, meta, _) = Reader::new(file, format!("snapshot file {}", path.display()))?;
    Ok(meta)
}

/// Installs the snapshot file at `path` as the first state of an empty store, with the
/// membership `members` (see the module doc). Refuses a store that holds anything.
pub async fn restore(
    log: &mut LogStore,
    sm: &mut StateMachineStore,
    path: &Path,
    members: &BTreeMap<u64, BasicNode>,
) -> Result<SnapshotSummary, StoreError> {
    let state = log
        .get_log_state()
        .await
        .map_err(|e| StoreError::io("reading the log state", std::io::Error::other(e.to_string())))?;
    let vote =
        log.read_vote().await.map_err(|e| StoreError::io("reading the vote", std::io::Error::other(e.to_string())))?;
    let applied = sm.last_applied().await;
    if state.last_log_id.is_some() || vote.is_some() || applied.is_some() || sm.record_count() > 0 {
        return Err(StoreError::DataDir {
            dir: sm.snapshot_dir().parent().map_or_else(|| sm.snapshot_dir().to_path_buf(), Path::to_path_buf),
            problem: "--restore-from needs an empty data directory, and this one already holds Raft state".into(),
            fix: "give each node of the new cluster an empty --data-dir, or drop --restore-from to start from the state it holds".into(),
        });
    }
    let summary = {
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || inspect_file(&path))
            .await
            .map_err(|e| StoreError::io("snapshot check task", std::io::Error::other(e.to_string())))??
    };

    // Rewrite the header (the records stay byte for byte) into a file the install reads.
    let tmp = sm.snapshot_dir().join(format!("restore-{}.tmp", std::process::id()));
    let meta = {
        let (path, tmp) = (path.to_path_buf(), tmp.clone());
        let members = members.clone();
        tokio::task::spawn_blocking(move || rewrite(&path, &tmp, &members))
            .await
            .map_err(|e| StoreError::io("snapshot rewrite task", std::io::Error::other(e.to_string())))??
    };
    let file =
        tokio::fs::File::open(&tmp).await.map_err(|e| StoreError::io(format!("opening {}", tmp.display()), e))?;
    let installed = sm.install_snapshot(&meta, Box::new(SnapshotData::File(file))).await;
    let _ = std::fs::remove_file(&tmp);
    installed.map_err(|e| StoreError::io("installing the restored snapshot", std::io::Error::other(e.to_string())))?;
    tracing::info!(
        file = %path.display(),
        index = summary.last_index,
        records = summary.records,
        "restored the state from a snapshot file"
    );
    Ok(summary)
}

fn rewrite(path: &Path, tmp: &Path, members: &BTreeMap<u64, BasicNode>) -> Result<SnapshotMeta, StoreError> {
    let what = format!("snapshot file {}", path.display());
    let file = std::fs::File::open(path).map_err(|e| StoreError::io(format!("opening {}", path.display()), e))?;
    let (mut reader, original, clock) = Reader::new(file, what)?;
    let meta = restored_meta(&original, members)?;
    let out = std::fs::File::create(tmp).map_err(|e| StoreError::io(format!("creating {}", tmp.display()), e))?;
    let quotas = reader.quotas().clone();
    let mut writer = Writer::new(
        std::io::BufWriter::with_capacity(256 * 1024, out),
        format!("{}", tmp.display()),
        &meta,
        clock,
        &quotas,
        reader.stubs(),
    )?;
    while let Some(r) = reader.next_record()? {
        writer.record(&r.key, &r.value)?;
    }
    let mut out = writer
        .finish()?
        .into_inner()
        .map_err(|e| StoreError::io(format!("writing {}", tmp.display()), e.into_error()))?;
    // The blob section (format 3) follows unchanged: it names no log id. The install checks it.
    std::io::copy(&mut reader.into_rest(), &mut out)
        .map_err(|e| StoreError::io(format!("copying blobs into {}", tmp.display()), e))?;
    // Not fsynced: the install copies it into its own fsynced file and deletes it.
    drop(out);
    Ok(meta)
}
