//! Backups from the SDK: [`Client::save_snapshot`] streams a fresh snapshot from the leader
//! (Admin `Snapshot`) into a local file, atomically: a temporary file beside the target,
//! checked against the size and SHA-256 the node announced, fsynced, renamed into place, and
//! the directory fsynced. A failed or interrupted save leaves no file at the target path
//! (and an existing backup there untouched).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::v1::admin_client::AdminClient;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::sdk::{timed, Client, Error};

/// A backup written by [`Client::save_snapshot`].
#[derive(Clone, Debug)]
pub struct SavedSnapshot {
    /// Where it was written.
    pub path: PathBuf,
    /// The snapshot's id on the node that took it.
    pub snapshot_id: String,
    /// Index of the last log entry it covers.
    pub last_index: u64,
    /// Term of that entry.
    pub last_term: u64,
    /// Records in it.
    pub records: u64,
    /// Bytes written.
    pub size_bytes: u64,
    /// SHA-256 of the file.
    pub sha256: [u8; 32],
    /// The node (the leader) that took it.
    pub node_id: u64,
    /// Time from the request to the renamed file.
    pub elapsed: Duration,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Io(format!("{what} {}: {e}", path.display()))
}

/// Deletes the temporary file unless the save completed.
struct TmpFile {
    path: PathBuf,
    keep: bool,
}

impl Drop for TmpFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Client {
    /// Asks the leader for a fresh snapshot (covering every write acknowledged before the
    /// call) and writes it to `path` atomically. `within` bounds the whole transfer.
    pub async fn save_snapshot(&self, path: &Path, within: Duration) -> Result<SavedSnapshot, Error> {
        self.save_snapshot_with_progress(path, within, |_, _| {}).await
    }

    /// [`Client::save_snapshot`], calling `progress(written, total)` after each chunk written
    /// (`total` is the size the leader announced), for a progress display.
    pub async fn save_snapshot_with_progress(
        &self,
        path: &Path,
        within: Duration,
        progress: impl FnMut(u64, u64),
    ) -> Result<SavedSnapshot, Error> {
        let started = Instant::now();
        let deadline = started + within;
        match tokio::time::timeout_at(deadline, self.save_snapshot_inner(path, deadline, progress)).await {
            Ok(r) => r.map(|mut s| {
                s.elapsed = started.elapsed();
                s
            }),
            Err(_) => Err(Error::DeadlineExceeded(format!(
                "the snapshot was not saved within {within:?}; nothing was written to {} (allow more time)",
                path.display()
            ))),
        }
    }

    async fn save_snapshot_inner(
        &self,
        path: &Path,
        deadline: Instant,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<SavedSnapshot, Error> {
        let name = path
            .file_name()
            .ok_or_else(|| Error::Config(format!("{} names no file", path.display())))?
            .to_string_lossy()
            .into_owned();
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let within = deadline.saturating_duration_since(Instant::now());
        // Each attempt may take the whole time: the node builds the snapshot before answering.
        let mut stream = self
            .call_with(deadline, within, |ch, t| async move {
                AdminClient::new(ch).snapshot(timed(pb::SnapshotRequest {}, t)).await
            })
            .await?;
        let tmp = TmpFile { path: dir.join(format!(".{name}.tmp-{}", std::process::id())), keep: false };
        let mut file = std::fs::File::create(&tmp.path).map_err(|e| io("creating", &tmp.path, e))?;
        let mut hash = Sha256::new();
        let mut written = 0u64;
        let mut info: Option<pb::SnapshotInfo> = None;
        while let Some(chunk) = stream.message().await.map_err(|s| Error::from_status(&s))? {
            if let Some(i) = chunk.info {
                if info.is_some() {
                    return Err(Error::Protocol("a second snapshot header in one stream".into()));
                }
                info = Some(i);
            } else if info.is_none() {
                return Err(Error::Protocol("the snapshot stream did not start with its header".into()));
            }
            hash.update(&chunk.data);
            written += chunk.data.len() as u64;
            file.write_all(&chunk.data).map_err(|e| io("writing", &tmp.path, e))?;
            progress(written, info.as_ref().map_or(0, |i| i.size_bytes));
        }
        let info = info.ok_or_else(|| Error::Protocol("the snapshot stream was empty".into()))?;
        let sha256: [u8; 32] = hash.finalize().into();
        if written != info.size_bytes || sha256[..] != info.sha256[..] {
            return Err(Error::Protocol(format!(
                "the snapshot arrived damaged: {written} bytes (announced {}), checksum {}",
                info.size_bytes,
                if sha256[..] == info.sha256[..] { "matches" } else { "does not match" }
            )));
        }
        file.sync_all().map_err(|e| io("syncing", &tmp.path, e))?;
        drop(file);
        std::fs::rename(&tmp.path, path).map_err(|e| io("renaming the temporary file to", path, e))?;
        let mut tmp = tmp;
        tmp.keep = true;
        std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing directory", &dir, e))?;
        Ok(SavedSnapshot {
            path: path.to_path_buf(),
            snapshot_id: info.snapshot_id,
            last_index: info.last_index,
            last_term: info.last_term,
            records: info.records,
            size_bytes: written,
            sha256,
            node_id: info.node_id,
            elapsed: Duration::ZERO,
        })
    }
}
