//! One-time upgrade of a format-1 data directory, whose Raft log lived in sled (tree `log`:
//! big-endian index -> bincode `Entry`; tree `raft`: `vote`, `committed`, `purged`), to the
//! segment-file log of [`crate::file_log`].
//!
//! Order, so that a crash at any point leaves a directory the next start finishes:
//! 1. the new log is built in `log.migrating/`, every segment and the meta file fsynced;
//! 2. it is renamed to `log/` and the directory fsynced;
//! 3. `FORMAT` is rewritten with the new version (durably);
//! 4. the sled trees `log` and `raft` are dropped.
//!
//! A crash before 3 leaves format 1 with the sled log intact: the half-built or finished new
//! log is discarded and the migration runs again. A crash after 3 leaves format 2 with stale
//! sled trees, which opening drops ([`drop_old_trees`]).

use std::path::Path;

use openraft::Vote;

use crate::codec;
use crate::error::StoreError;
use crate::file_log;
use crate::raft::{Entry, LogId};

/// The sled trees that held the log in format 1.
pub(super) const OLD_TREES: [&str; 2] = ["log", "raft"];

/// Copies the format-1 log out of `db` into `<dir>/log/` (steps 1 and 2 above). Returns the
/// number of entries copied.
pub(super) fn copy_log(db: &sled::Db, dir: &Path) -> Result<u64, StoreError> {
    let target = dir.join("log");
    let staging = dir.join("log.migrating");
    for stale in [&staging, &target] {
        match std::fs::remove_dir_all(stale) {
            Ok(()) => tracing::warn!(dir = %stale.display(), "discarding an unfinished log migration"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(format!("removing {}", stale.display()), e)),
        }
    }
    let log = db.open_tree("log")?;
    let meta = db.open_tree("raft")?;
    let read = |key: &str| -> Result<Option<sled::IVec>, StoreError> { Ok(meta.get(key)?) };
    let vote: Option<Vote<u64>> = read("vote")?.map(|v| codec::decode("vote", &v)).transpose()?;
    let committed: Option<LogId> =
        read("committed")?.map(|v| codec::decode::<Option<LogId>>("committed", &v)).transpose()?.flatten();
    let purged: Option<LogId> =
        read("purged")?.map(|v| codec::decode::<Option<LogId>>("purged", &v)).transpose()?.flatten();

    let entries = log.iter().map(|kv| -> Result<Option<Entry>, StoreError> {
        let (k, v) = kv?;
        let entry: Entry = codec::decode("log entry", &v)?;
        if k.as_ref() != entry.log_id.index.to_be_bytes() {
            return Err(StoreError::Corrupt {
                what: "log entry".into(),
                detail: format!("stored under key {k:?} but carries index {}", entry.log_id.index),
            });
        }
        // Entries at or below the purge point are what an interrupted purge left behind.
        Ok(Some(entry).filter(|e| purged.is_none_or(|p| e.log_id.index > p.index)))
    });
    let copied = file_log::import(&staging, vote, purged, committed, entries.filter_map(Result::transpose))?;

    std::fs::rename(&staging, &target)
        .map_err(|e| StoreError::io(format!("renaming {} to {}", staging.display(), target.display()), e))?;
    super::sync_dir(&target)?;
    Ok(copied)
}

/// Drops the format-1 log trees if they are still there (step 4, or its redo).
pub(super) fn drop_old_trees(db: &sled::Db) -> Result<(), StoreError> {
    let names = db.tree_names();
    let mut dropped = false;
    for tree in OLD_TREES {
        if names.iter().any(|n| n.as_ref() == tree.as_bytes()) {
            db.drop_tree(tree)?;
            dropped = true;
        }
    }
    if dropped {
        db.flush()?;
    }
    Ok(())
}
