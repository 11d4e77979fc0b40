//! The blob directory: one file per large response body (see [`crate::stored`]).
//!
//! ```text
//! <data-dir>/blobs/<xx>/<index>-<n>     xx = the low byte of index, in hex
//! ```
//!
//! Durability follows the state machine's: apply writes a blob (to a temporary name, then
//! renamed) before the stub that names it, without an fsync, and notes it as unsynced. A
//! snapshot build fsyncs the blobs it links; a clean shutdown fsyncs every unsynced blob and
//! the directories before it writes the clean mark. After a crash the directory is not
//! trusted, like sled's tree: it is reconciled with the newest snapshot's blobs (names the
//! snapshot lacks are deleted, names it has are linked back) and the log re-applies the rest.
//!
//! A blob whose record is replaced or deleted is unlinked at once, except while a snapshot
//! build runs: the build's copy-on-write view may still name it, so the unlink waits until
//! the build ends.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::stored::BlobRef;

/// Files of one directory level under `blobs/`: enough to keep each directory small at
/// millions of blobs.
const FANOUT: u64 = 256;

pub(crate) struct BlobDir {
    root: PathBuf,
    /// Blobs written since they were last fsynced. Locked around the write and rename of a
    /// blob, so a snapshot build that links a name sees whether it still needs a sync.
    unsynced: std::sync::Mutex<BTreeSet<(u64, u32)>>,
    /// Blobs released while a snapshot build ran: unlinked once it ends.
    deferred: std::sync::Mutex<Vec<BlobRef>>,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The sets stay consistent at every step; a panic elsewhere must not stop every apply.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn io(what: impl Into<String>, e: std::io::Error) -> StoreError {
    StoreError::io(what, e)
}

fn fsync_path(path: &Path) -> Result<(), StoreError> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(|e| io(format!("syncing {}", path.display()), e))
}

impl BlobDir {
    /// Opens (creating) `root` and its subdirectories.
    pub(crate) fn open(root: PathBuf) -> Result<Self, StoreError> {
        for d in 0..FANOUT {
            let sub = root.join(format!("{d:02x}"));
            std::fs::create_dir_all(&sub).map_err(|e| io(format!("creating {}", sub.display()), e))?;
        }
        Ok(BlobDir { root, unsynced: Default::default(), deferred: Default::default() })
    }

    fn sub(&self, index: u64) -> PathBuf {
        self.root.join(format!("{:02x}", index % FANOUT))
    }

    /// Where blob `b` lives.
    pub(crate) fn path(&self, b: &BlobRef) -> PathBuf {
        self.sub(b.index).join(b.file_name())
    }

    fn path_of(&self, index: u64, n: u32) -> PathBuf {
        self.sub(index).join(BlobRef { index, n, len: 0, crc: 0 }.file_name())
    }

    /// Writes `body` as blob `(index, n)` and returns its reference. Not synced (see the
    /// module doc).
    pub(crate) fn write(&self, index: u64, n: u32, body: &[u8]) -> Result<BlobRef, StoreError> {
        let b = BlobRef { index, n, len: body.len() as u64, crc: crc32fast::hash(body) };
        let path = self.path(&b);
        let tmp = path.with_extension("tmp");
        let mut unsynced = lock(&self.unsynced);
        std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(body))
            .map_err(|e| io(format!("writing blob {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io(format!("renaming blob to {}", path.display()), e))?;
        unsynced.insert((index, n));
        Ok(b)
    }

    /// Reads blob `b` back, checked against its length and CRC.
    pub(crate) fn read(&self, b: &BlobRef) -> Result<Vec<u8>, StoreError> {
        let path = self.path(b);
        let what = format!("blob file {}", path.display());
        let mut body = Vec::with_capacity(usize::try_from(b.len).unwrap_or(0));
        std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut body)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                StoreError::Corrupt { what: what.clone(), detail: "it is missing, but a stored record names it".into() }
            } else {
                io(format!("reading {what}"), e)
            }
        })?;
        b.check(&body, &what)?;
        Ok(body)
    }

    /// A record no longer names `b`: unlinks it, or keeps it until [`BlobDir::drain`] while a
    /// snapshot build may still read it.
    pub(crate) fn release(&self, b: BlobRef, building: bool) {
        if building {
            lock(&self.deferred).push(b);
        } else {
            self.unlink(&b);
        }
    }

    fn unlink(&self, b: &BlobRef) {
        lock(&self.unsynced).remove(&(b.index, b.n));
        let path = self.path(b);
        if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                // Only space is lost: the next open's sweep of unnamed blobs removes it.
                tracing::warn!(file = %path.display(), error = %e, "could not delete a released blob");
            }
        }
    }

    /// Unlinks the blobs released during a snapshot build; call when no build runs.
    pub(crate) fn drain(&self) {
        let released = std::mem::take(&mut *lock(&self.deferred));
        for b in &released {
            self.unlink(b);
        }
    }

    /// Links blob `b` into snapshot blob directory `dir` and makes its data durable.
    pub(crate) fn link_into(&self, b: &BlobRef, dir: &Path) -> Result<(), StoreError> {
        let from = self.path(b);
        let to = dir.join(b.file_name());
        let needs_sync = {
            let unsynced = lock(&self.unsynced);
            match std::fs::hard_link(&from, &to) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(io(format!("linking blob {} into {}", from.display(), dir.display()), e));
                }
            }
            unsynced.contains(&(b.index, b.n))
        };
        if needs_sync {
            // Through the new link: it names the very inode linked, whatever apply does next.
            fsync_path(&to)?;
            lock(&self.unsynced).remove(&(b.index, b.n));
        }
        Ok(())
    }

    /// Makes every blob written so far durable, with the directory entries: before a clean
    /// shutdown's mark.
    pub(crate) fn sync_all(&self) -> Result<(), StoreError> {
        let pending: Vec<(u64, u32)> = lock(&self.unsynced).iter().copied().collect();
        for (index, n) in &pending {
            match std::fs::File::open(self.path_of(*index, *n)) {
                Ok(f) => {
                    f.sync_all().map_err(|e| io(format!("syncing blob {}", self.path_of(*index, *n).display()), e))?
                }
                // Released meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(format!("opening blob {}", self.path_of(*index, *n).display()), e)),
            }
        }
        for d in 0..FANOUT {
            fsync_path(&self.root.join(format!("{d:02x}")))?;
        }
        fsync_path(&self.root)?;
        let mut unsynced = lock(&self.unsynced);
        for p in &pending {
            unsynced.remove(p);
        }
        Ok(())
    }

    /// Every blob name in the directory (leftover temporary files are deleted).
    pub(crate) fn names(&self) -> Result<BTreeSet<(u64, u32)>, StoreError> {
        let mut out = BTreeSet::new();
        for d in 0..FANOUT {
            let sub = self.root.join(format!("{d:02x}"));
            for entry in std::fs::read_dir(&sub).map_err(|e| io(format!("listing {}", sub.display()), e))? {
                let entry = entry.map_err(|e| io(format!("listing {}", sub.display()), e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                match BlobRef::parse_name(&name) {
                    Some(id) => {
                        out.insert(id);
                    }
                    None => {
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
            }
        }
        Ok(out)
    }

    /// Deletes every blob not in `keep` (after a clean open: blobs no record names).
    pub(crate) fn retain(&self, keep: &BTreeSet<(u64, u32)>) -> Result<usize, StoreError> {
        let mut removed = 0;
        for (index, n) in self.names()? {
            if !keep.contains(&(index, n)) {
                let path = self.path_of(index, n);
                std::fs::remove_file(&path).map_err(|e| io(format!("deleting unnamed blob {}", path.display()), e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Makes the directory hold exactly the blobs of snapshot blob directory `from` (`None`:
    /// no blobs), linking missing ones and deleting the rest. Not synced: the state it
    /// belongs to is trusted only after a sync.
    pub(crate) fn reconcile(&self, from: Option<&Path>) -> Result<(), StoreError> {
        let mut wanted = BTreeSet::new();
        if let Some(from) = from {
            for entry in std::fs::read_dir(from).map_err(|e| io(format!("listing {}", from.display()), e))? {
                let entry = entry.map_err(|e| io(format!("listing {}", from.display()), e))?;
                if let Some(id) = BlobRef::parse_name(&entry.file_name().to_string_lossy()) {
                    wanted.insert(id);
                }
            }
        }
        let have = self.names()?;
        for (index, n) in have.difference(&wanted) {
            let path = self.path_of(*index, *n);
            std::fs::remove_file(&path).map_err(|e| io(format!("deleting blob {}", path.display()), e))?;
        }
        if let Some(from) = from {
            use std::os::unix::fs::MetadataExt;
            for (index, n) in &wanted {
                let name = BlobRef { index: *index, n: *n, len: 0, crc: 0 }.file_name();
                let (src, dst) = (from.join(&name), self.path_of(*index, *n));
                if have.contains(&(*index, *n)) {
                    // Names are local to a node: a snapshot from the leader may use a name this
                    // node gave another body. Keep ours only when it is the snapshot's file.
                    let same = match (std::fs::metadata(&src), std::fs::metadata(&dst)) {
                        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                        _ => false,
                    };
                    if same {
                        continue;
                    }
                    std::fs::remove_file(&dst).map_err(|e| io(format!("deleting blob {}", dst.display()), e))?;
                }
                std::fs::hard_link(&src, &dst)
                    .map_err(|e| io(format!("linking {} to {}", src.display(), dst.display()), e))?;
            }
        }
        let mut unsynced = lock(&self.unsynced);
        unsynced.clear();
        lock(&self.deferred).clear();
        Ok(())
    }
}
