//! The data directory: opening (and creating, and upgrading) it, the state machine on sled,
//! and snapshot files. The Raft log is not in sled; it is [`crate::file_log`].
//!
//! ```text
//! <data-dir>/FORMAT        "idemraft-data-format <n>": refuses foreign or newer directories
//! <data-dir>/log/          the Raft log: segment files and meta (see `file_log`)
//! <data-dir>/db/           sled: trees `sm`, `snap`
//! <data-dir>/blobs/        packs of response bodies of 512 B and more (and, from earlier
//!                          releases, bodies of 64 KiB and more in files of their own; see `blobs`)
//! <data-dir>/snapshots/    <snapshot-id>.snap files (see `snapshot`), and beside each one
//!                          whose records name blobs <snapshot-id>.blobs/: hard links to them
//! ```
//!
//! | tree   | keys                                                   | written by |
//! |--------|--------------------------------------------------------|------------|
//! | `sm`   | `r`+record key -> record; `m`+name -> applied, membership, clock | apply, install_snapshot |
//! | `snap` | `current`, `pending` -> snapshot metadata; `clean` -> applied id at a clean shutdown | build_snapshot, install_snapshot, flush, apply |
//!
//! Format 1 kept the log in sled trees `log` and `raft`; opening such a directory moves the
//! log into `log/` once (see `migrate`). The expiry and lease indexes are not stored: they are
//! rebuilt in memory from the records (see `sm`).

mod blobs;
mod key_filter;
mod migrate;
mod sm;

use std::io::Write;
use std::path::{Path, PathBuf};

pub use self::sm::{RecordCounts, StateMachineStore};

use crate::error::StoreError;
use crate::file_log::{self, LogStore, SEGMENT_BYTES};

/// Version of the on-disk layout this build reads and writes. 2: the Raft log in `log/`
/// segment files (1 kept it in sled, and is upgraded on open).
pub const DATA_FORMAT_VERSION: u32 = 2;
/// The older format this build upgrades in place.
const MIGRATES_FROM: u32 = 1;
const FORMAT_FILE: &str = "FORMAT";
const FORMAT_PREFIX: &str = "idemraft-data-format ";
/// How long to wait for a directory lock that a closing instance still holds.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// sled's page cache bound when none is asked for. sled 0.34's own default is 1 GiB, a
/// bound its cache grows toward as records come and go (RSS then follows the churn rather
/// than the live data); response bodies of 512 B and more live outside sled (see `blobs`),
/// so the tree that remains is small and the OS page cache serves its reads as well. A
/// full cache churns its variably sized pages through the allocator, which holds memory in
/// proportion (docs/deployment.md, "Sizing"), so the bound is kept small.
pub const DB_CACHE_BYTES: u64 = 4 * 1024 * 1024;

/// How [`open_with_options`] opens a data directory.
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    /// Size of one Raft log segment file.
    pub segment_bytes: u64,
    /// Bound of sled's page cache.
    pub cache_bytes: u64,
    /// Bodies from this size are written to files of their own, as releases before packs
    /// took every size wrote them (`None`, the default: every body from
    /// [`crate::stored::PACK_MIN`] goes to a pack). Tests use it to make such data.
    #[doc(hidden)]
    pub files_from: Option<usize>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { segment_bytes: SEGMENT_BYTES, cache_bytes: DB_CACHE_BYTES, files_from: None }
    }
}

/// Opens (or creates) a data directory and returns the log store and state machine store that
/// share it. Refuses, with an error naming the directory, a directory that holds something
/// other than Idemraft data of this format, instead of ever starting empty over it.
pub fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with_options(dir, &OpenOptions::default())
}

/// [`open`] with another log segment size: tests use small ones to exercise segment
/// rotation and purging.
#[doc(hidden)]
pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with_options(dir, &OpenOptions { segment_bytes, ..OpenOptions::default() })
}

/// [`open`] with the given [`OpenOptions`].
pub fn open_with_options(dir: &Path, options: &OpenOptions) -> Result<(LogStore, StateMachineStore), StoreError> {
    let segment_bytes = options.segment_bytes;
    let (db, found) = open_db(dir, options.cache_bytes)?;
    let log_dir = dir.join("log");
    let damaged = |e: StoreError| match e {
        StoreError::Corrupt { .. } | StoreError::Sled(_) => data_dir_error(
            dir,
            format!("its stored state is damaged ({e})"),
            "restore the directory from a backup or a snapshot; refusing to start over it",
        ),
        other => other,
    };
    match found {
        Found::Fresh => {}
        Found::Current => {
            if !log_dir.is_dir() {
                return Err(data_dir_error(
                    dir,
                    "its FORMAT file is present but the log/ directory is missing",
                    "restore the directory from a backup or a snapshot; refusing to start without the Raft log",
                ));
            }
            // Left behind when an upgrade stopped between its last two steps.
            migrate::drop_old_trees(&db).map_err(damaged)?;
        }
        Found::Previous => {
            let copied = migrate::copy_log(&db, dir).map_err(damaged)?;
            write_format(dir)?;
            migrate::drop_old_trees(&db).map_err(damaged)?;
            tracing::info!(
                dir = %dir.display(),
                entries = copied,
                from = MIGRATES_FROM,
                to = DATA_FORMAT_VERSION,
                "upgraded the data directory: the Raft log moved from sled to log/"
            );
        }
    }
    let sm = StateMachineStore::open(&db, dir, options.files_from).map_err(damaged)?;
    // The log keeps a handle on the sled database only for its directory lock: while either
    // store lives, no other instance can open this directory.
    let log = LogStore::open(&log_dir, segment_bytes, Some(Box::new(db))).map_err(damaged)?;
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

/// What `open_db` found.
#[derive(Clone, Copy)]
enum Found {
    /// An empty or missing directory, now initialised (log included).
    Fresh,
    /// A directory of this build's format.
    Current,
    /// A directory of format [`MIGRATES_FROM`], still to be upgraded.
    Previous,
}

fn write_format(dir: &Path) -> Result<(), StoreError> {
    write_durably(&dir.join(FORMAT_FILE), format!("{FORMAT_PREFIX}{DATA_FORMAT_VERSION}\n").as_bytes())
}

fn open_db(dir: &Path, cache_bytes: u64) -> Result<(sled::Db, Found), StoreError> {
    let format_path = dir.join(FORMAT_FILE);
    let db_path = dir.join("db");
    let mut found = Found::Fresh;
    let fresh = match std::fs::read_dir(dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(StoreError::io(format!("reading data directory {}", dir.display()), e)),
    };
    if fresh {
        std::fs::create_dir_all(dir.join("snapshots"))
            .map_err(|e| StoreError::io(format!("creating data directory {}", dir.display()), e))?;
        file_log::create(&dir.join("log"))?;
        // Last: a directory with a FORMAT file is a complete one.
        write_format(dir)?;
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
        if version != DATA_FORMAT_VERSION && version != MIGRATES_FROM {
            return Err(data_dir_error(
                dir,
                format!(
                    "it holds data format {version}, and this build reads format {DATA_FORMAT_VERSION} (and upgrades {MIGRATES_FROM})"
                ),
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
        found = if version == DATA_FORMAT_VERSION { Found::Current } else { Found::Previous };
    }
    // A previous instance in this process (a restart in place) may still be releasing the
    // directory lock from sled's background thread for a moment: retry that case briefly.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // `open` may panic deep inside sled on some kinds of damage; turn that into an error too.
        let opened = std::panic::catch_unwind(|| sled::Config::new().path(&db_path).cache_capacity(cache_bytes).open());
        return match opened {
            Ok(Ok(db)) => {
                // sled never fsyncs a directory: make its files' names (and db/ itself, when
                // just created) durable, or a power loss could take the whole database away.
                sync_dir(&db_path.join("db"))?;
                sync_dir(&db_path)?;
                Ok((db, found))
            }
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
    if crate::planted::active(crate::planted::Bug::SkipDirFsync) {
        return Ok(());
    }
    let parent: PathBuf = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    std::fs::File::open(&parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("syncing directory {}", parent.display()), e))
}
