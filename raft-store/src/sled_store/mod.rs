//! Durable openraft storage on one sled database, plus snapshot files.
//!
//! ```text
//! <data-dir>/FORMAT        "idemraft-data-format <n>": refuses foreign or newer directories
//! <data-dir>/db/           sled: trees `log`, `raft`, `sm`, `snap`
//! <data-dir>/snapshots/    <snapshot-id>.snap files (see `snapshot`)
//! ```
//!
//! | tree   | keys                                                   | written by |
//! |--------|--------------------------------------------------------|------------|
//! | `log`  | big-endian log index -> bincode `Entry`                | append, truncate, purge |
//! | `raft` | `vote`, `committed`, `purged`                          | save_vote, save_committed, purge |
//! | `sm`   | `r`+record key -> record; `m`+name -> applied, membership, clock | apply, install_snapshot |
//! | `snap` | `current`, `pending` -> snapshot metadata              | build_snapshot, install_snapshot |
//!
//! All trees share one page cache, so one flush makes every earlier write of any tree durable.
//! The expiry and lease indexes are not stored: they are rebuilt in memory from the records
//! (see `sm`).

mod log;
mod sm;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use self::log::{LogObserver, LogStore};
pub use self::sm::{RecordCounts, StateMachineStore};

use crate::error::StoreError;

/// Version of the on-disk layout this build reads and writes.
pub const DATA_FORMAT_VERSION: u32 = 1;
const FORMAT_FILE: &str = "FORMAT";
const FORMAT_PREFIX: &str = "idemraft-data-format ";
/// How long to wait for a directory lock that a closing instance still holds.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens (or creates) a data directory and returns the log store and state machine store that
/// share it. Refuses, with an error naming the directory, a directory that holds something
/// other than Idemraft data of this format, instead of ever starting empty over it.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    let db = open_db(dir)?;
    let damaged = |e: StoreError| match e {
        StoreError::Corrupt { .. } | StoreError::Sled(_) => data_dir_error(
            dir,
            format!("its stored state is damaged ({e})"),
            "restore the directory from a backup or a snapshot; refusing to start over it",
        ),
        other => other,
    };
    let log = LogStore::new(&db).map_err(damaged)?;
    let sm = StateMachineStore::open(&db, dir).map_err(damaged)?;
    Ok((log, sm))
}

fn data_dir_error(dir: &Path, problem: impl Into<String>, fix: impl Into<String>) -> StoreError {
    StoreError::DataDir { dir: dir.to_path_buf(), problem: problem.into(), fix: fix.into() }
}

/// sled reports a held directory lock as a plain `Other` IO error whose text is the only
/// distinguishing mark (sled 0.34, `Config::try_lock`).
fn is_lock_busy(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock || e.to_string().contains("could not acquire lock")
}

fn open_db(dir: &Path) -> Result<sled::Db, StoreError> {
    let format_path = dir.join(FORMAT_FILE);
    let db_path = dir.join("db");
    let fresh = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(StoreError::io(format!("reading data directory {}", dir.display()), e)),
    };
    if fresh {
        std::fs::create_dir_all(dir.join("snapshots"))
            .map_err(|e| StoreError::io(format!("creating data directory {}", dir.display()), e))?;
        write_durably(&format_path, format!("{FORMAT_PREFIX}{DATA_FORMAT_VERSION}\n").as_bytes())?;
    } else {
        let text = match std::fs::read_to_string(&format_path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(data_dir_error(
                    dir,
                    "it is not empty but has no FORMAT file, so it was not written by Idemraft or is damaged",
                    "refusing to start over existing data: point the node at an empty or Idemraft data directory",
                ))
            }
            Err(e) => return Err(StoreError::io(format!("reading {}", format_path.display()), e)),
        };
        let version = text.trim().strip_prefix(FORMAT_PREFIX).and_then(|v| v.parse::<u32>().ok()).ok_or_else(|| {
            data_dir_error(
                dir,
                format!("its FORMAT file is damaged (it reads {:?})", text.chars().take(64).collect::<String>()),
                "restore the directory from a backup or a snapshot; Idemraft will not guess",
            )
        })?;
        if version != DATA_FORMAT_VERSION {
            return Err(data_dir_error(
                dir,
                format!("it holds data format {version}, and this build reads format {DATA_FORMAT_VERSION}"),
                "run the Idemraft release that wrote it, or migrate the data with that release",
            ));
        }
        if !db_path.exists() {
            return Err(data_dir_error(
                dir,
                "its FORMAT file is present but the db/ directory is missing",
                "restore the directory from a backup or a snapshot; refusing to start empty over it",
            ));
        }
        std::fs::create_dir_all(dir.join("snapshots"))
            .map_err(|e| StoreError::io(format!("creating {}", dir.join("snapshots").display()), e))?;
    }
    // A previous instance in this process (a restart in place) may still be releasing the
    // directory lock from sled's background thread for a moment: retry that case briefly.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // `open` may panic deep inside sled on some kinds of damage; turn that into an error too.
        let opened = std::panic::catch_unwind(|| sled::Config::new().path(&db_path).open());
        return match opened {
            Ok(Ok(db)) => Ok(db),
            Ok(Err(sled::Error::Io(e))) if is_lock_busy(&e) => {
                if std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
                Err(data_dir_error(
                    dir,
                    "another process holds its lock",
                    "stop the other idemraft node using this directory, or give this node its own directory",
                ))
            }
            Ok(Err(e)) => Err(data_dir_error(
                dir,
                format!("the sled database in db/ cannot be opened: {e}"),
                "restore the directory from a backup or a snapshot, or check the disk and permissions",
            )),
            Err(_) => Err(data_dir_error(
                dir,
                "the sled database in db/ is damaged (sled panicked while opening it)",
                "restore the directory from a backup or a snapshot",
            )),
        };
    }
}

/// Writes a file so that after return it survives a crash: temp file, fsync, rename, fsync dir.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| StoreError::io(format!("creating {}", tmp.display()), e))?;
    f.write_all(bytes).map_err(|e| StoreError::io(format!("writing {}", tmp.display()), e))?;
    f.sync_all().map_err(|e| StoreError::io(format!("syncing {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| StoreError::io(format!("renaming to {}", path.display()), e))?;
    sync_dir(path)
}

/// Makes a rename or create in `path`'s directory durable.
pub(crate) fn sync_dir(path: &Path) -> Result<(), StoreError> {
    let parent: PathBuf = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::File::open(&parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("syncing directory {}", parent.display()), e))
}
