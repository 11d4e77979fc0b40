//! The Raft log as append-only segment files: entries, the committed index, the vote and the
//! purge point, in `<data-dir>/log/`. It owns everything openraft's `RaftLogStorage` asks of a
//! log; the state machine (sled) and snapshots live elsewhere.
//!
//! ```text
//! <data-dir>/log/meta                  vote and last purged log id (replaced atomically)
//! <data-dir>/log/<seq, 20 digits>.seg  segments, oldest first; the highest seq is the active one
//! ```
//!
//! A segment is an 8-byte magic (`IDEMLOG1`) and then frames:
//!
//! ```text
//! len: u32 LE | crc: u32 LE | kind: u8 | bincode payload (len - 1 bytes)
//! ```
//!
//! `crc` is CRC-32 (IEEE) over the four `len` bytes, the kind and the payload, so a damaged
//! length is caught as surely as a damaged payload. Kind 1 is a log [`Entry`], kind 2 the
//! committed log id (`Option<LogId>`), both encoded by [`crate::codec`].
//!
//! Durability rules (openraft 0.9 v2 storage contract):
//! - `append` writes every entry of the call with one `pwrite` at the end of the active
//!   segment (readable at once), hands the fsync to a sync thread, and fires openraft's
//!   callback and returns once that `fdatasync` is done. Appends that queue up while an fsync
//!   runs share the next one (group commit), and waiters are answered in append order.
//!   Returning before the fsync (callback later, as openraft allows) would let the leader
//!   replicate during its own fsync; it was measured (`docs/benchmarks.md`) and is not what
//!   this code does: `append` keeps the sled log's timing.
//! - The vote and the purge point live in `meta`, written to a temporary file, fsynced,
//!   renamed over the old one, and the directory fsynced, before `save_vote` or `purge`
//!   goes on.
//! - The committed index is a frame written without an fsync: openraft treats it as an
//!   optional hint, and because recovery keeps only the valid prefix of a segment, a committed
//!   frame that survives a crash has every entry written before it surviving too.
//! - `truncate` waits for pending fsyncs, cuts the file at the first removed frame and fsyncs,
//!   so removed uncommitted entries cannot come back. `purge` records the purge point first,
//!   then deletes whole segments that hold nothing above it.
//! - A segment is fsynced before the next one is created, so only the active segment can end
//!   in a partial write.
//! - A new segment reserves its blocks up to the rotation size (`fallocate`; see
//!   `preallocate` for why), so it reads as zeros past its last frame.
//!
//! Recovery (at open): every segment is read frame by frame, up to the zeros of its unwritten
//! room, which end it cleanly. In the *active* segment the first
//! frame that is cut short or fails its CRC is taken for what a crash during a write leaves
//! behind: it and everything after it are cut off, with a warning. (Damage to already-synced
//! bytes of the active segment cannot be told from a torn write and is cut off too, losing
//! entries this node had acknowledged: like any disk that loses writes, see
//! docs/deployment.md.) The same in an earlier segment, a
//! frame whose CRC holds but whose contents do not decode, or entries out of order, refuse
//! the directory with [`StoreError::DataDir`] naming the file, the byte offset and the fix.
//! Nothing read from disk is trusted enough to panic on.
//!
//! Memory: one 24-byte location per live entry (no entry cache: a read is one `pread` of a
//! contiguous span from the page cache), bounded by openraft's purging after each snapshot.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::fs::File;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageError, Vote};
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::error::{sto_logs_read, sto_logs_write, sto_vote, sto_write, StoreError};
use crate::planted::{self, Bug};
use crate::raft::{Entry, LogId, TypeConfig};

pub(crate) const SEGMENT_MAGIC: &[u8; 8] = b"IDEMLOG1";
const META_MAGIC: &[u8; 8] = b"IDEMMETA";
const META_FILE: &str = "meta";
const SEGMENT_EXT: &str = "seg";
/// A new segment is started once the active one reaches this size. Purging frees whole
/// segments, so the active segment's purged entries stay on disk until it fills: at 64 MiB
/// that was half the log's share of disk with small bodies (docs/deployment.md, Sizing).
/// Rotation costs one extra fsync and a directory fsync, a few a minute at full write rate.
pub const SEGMENT_BYTES: u64 = 16 << 20;
pub(crate) const FRAME_HEADER: usize = 8;
const KIND_ENTRY: u8 = 1;
const KIND_COMMITTED: u8 = 2;
/// The fix named in every refusal of a damaged log.
const FIX: &str = "restore the data directory from a backup or a snapshot (or wipe it and add the node back as a new \
                   member); refusing to start over a damaged log";

/// What the log store reports while it works, for the node's metrics. Plain callbacks keep
/// this crate free of any metrics library: the node decides what to record and how. Both
/// run on the storage path, so an implementation must be cheap and must not block.
pub trait LogObserver: Send + Sync {
    /// The fsync that made one or more appends durable took `elapsed` (not called when it
    /// failed). Called once per fsync, so appends that share one are counted once.
    fn append_fsynced(&self, elapsed: Duration) {
        let _ = elapsed;
    }

    /// openraft saved `index` as the committed index.
    fn committed(&self, index: u64) {
        let _ = index;
    }
}

/// The contents of `log/meta`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote<u64>>,
    purged: Option<LogId>,
}

/// Where one entry's frame is.
#[derive(Clone, Copy, Debug)]
struct Loc {
    seq: u64,
    offset: u64,
    len: u32,
}

struct Segment {
    seq: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Bytes in the file (header included); the next frame goes here.
    len: u64,
    /// Highest entry index that is in this segment and above the purge point; `None` when it
    /// holds none, which makes it deletable by `purge` unless it is the active one.
    last_live: Option<u64>,
}

struct State {
    /// Ascending by seq, never empty; the back one is active.
    segments: VecDeque<Segment>,
    /// Index of `locs[0]`.
    first: u64,
    /// Every live entry (index above the purge point), contiguous.
    locs: VecDeque<Loc>,
    /// Log id of the last live entry.
    last: Option<LogId>,
    meta: Meta,
    committed: Option<LogId>,
    next_seq: u64,
}

impl State {
    fn active(&mut self) -> &mut Segment {
        // `segments` is never empty: open creates one and nothing removes the active one.
        let n = self.segments.len();
        &mut self.segments[n - 1]
    }

    fn segment(&self, seq: u64) -> Option<&Segment> {
        self.segments.binary_search_by_key(&seq, |s| s.seq).ok().map(|i| &self.segments[i])
    }
}

/// Who hears that an append is durable.
enum Waiter {
    /// An `append_durably` call waiting for it.
    Oneshot(tokio::sync::oneshot::Sender<Result<(), String>>),
    /// openraft's callback: a leader's append that openraft does not wait for (it replicates
    /// meanwhile), or a follower's, which openraft awaits before it answers the leader.
    Flushed(LogFlushed<TypeConfig>),
}

impl Waiter {
    fn complete(self, result: Result<(), String>) {
        match self {
            // The caller may have gone away; nobody is left to tell.
            Waiter::Oneshot(tx) => {
                let _ = tx.send(result);
            }
            Waiter::Flushed(cb) => cb.log_io_completed(result.map_err(std::io::Error::other)),
        }
    }
}

enum Job {
    /// Make `file` durable (nothing when `None`), then tell `waiter`.
    Sync { file: Option<Arc<File>>, waiter: Waiter, observer: Option<Arc<dyn LogObserver>> },
    /// Answered once every job queued before it is done.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

struct Inner {
    dir: PathBuf,
    segment_bytes: u64,
    state: Mutex<State>,
    jobs: mpsc::Sender<Job>,
    /// Set when an fsync or a write failed: what is on disk is then unknown, so every later
    /// write is refused until a restart re-reads the log.
    poisoned: Arc<AtomicBool>,
    /// Keeps whatever guards the data directory (the sled database lock) alive as long as the
    /// log is, so a second instance cannot open the same log while this one still writes.
    _guard: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// openraft log storage on segment files. Cloning shares the same log (that is how the log
/// reader is handed out).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
    observer: Option<Arc<dyn LogObserver>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave the state half-updated in a way a reader
    // could misuse beyond what the poisoned flag already covers; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An IO error's context, built only when there is an error (reads are on the hot path).
fn io<'a>(verb: &'a str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |e| StoreError::io(format!("{verb} {}", path.display()), e)
}

fn damaged(dir: &Path, file: &Path, offset: u64, problem: impl std::fmt::Display) -> StoreError {
    StoreError::DataDir {
        dir: dir.to_path_buf(),
        problem: format!("log segment {} is damaged at byte offset {offset}: {problem}", file.display()),
        fix: FIX.into(),
    }
}

fn segment_name(seq: u64) -> String {
    format!("{seq:020}.{SEGMENT_EXT}")
}

/// Appends one frame to `buf`.
fn push_frame<T: serde::Serialize>(buf: &mut Vec<u8>, kind: u8, value: &T) -> Result<(), StoreError> {
    // Encoded straight into place after a header that is filled in last: a 256 KiB body is
    // copied once into the write buffer, not once into its own encoding and again here.
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER]);
    buf.push(kind);
    let written = codec::encode_into(buf, value).and_then(|payload| {
        u32::try_from(payload + 1).map_err(|_| StoreError::Corrupt {
            what: "log record to write".into(),
            detail: format!("{payload} bytes is more than a frame can hold"),
        })
    });
    let len = match written {
        Ok(len) => len,
        Err(e) => {
            buf.truncate(start);
            return Err(e);
        }
    };
    let len_bytes = len.to_le_bytes();
    let mut h = crc32fast::Hasher::new();
    h.update(&len_bytes);
    h.update(&buf[start + FRAME_HEADER..]);
    buf[start..start + 4].copy_from_slice(&len_bytes);
    buf[start + 4..start + FRAME_HEADER].copy_from_slice(&h.finalize().to_le_bytes());
    Ok(())
}

/// Why a frame could not be read: it is cut short or fails its CRC, which is what a partial
/// write leaves (and also what damage looks like; where it is decides which).
struct Torn(String);

/// Parses the frame at the start of `bytes`: its kind, payload and total length.
fn parse_frame(bytes: &[u8]) -> Result<(u8, &[u8], usize), Torn> {
    if bytes.len() < FRAME_HEADER {
        return Err(Torn(format!("{} bytes where a record header needs {FRAME_HEADER}", bytes.len())));
    }
    let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len == 0 {
        return Err(Torn("a zero record length".into()));
    }
    let Some(body) = bytes.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return Err(Torn(format!("a record of {len} bytes with only {} left in the file", bytes.len() - FRAME_HEADER)));
    };
    let mut h = crc32fast::Hasher::new();
    h.update(&bytes[0..4]);
    h.update(body);
    if h.finalize() != crc {
        return Err(Torn("a record whose CRC does not match".into()));
    }
    Ok((body[0], &body[1..], FRAME_HEADER + len))
}

fn encode_meta(meta: &Meta) -> Result<Vec<u8>, StoreError> {
    let body = codec::encode(meta)?;
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(META_MAGIC);
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

fn read_meta(dir: &Path) -> Result<Meta, StoreError> {
    let path = dir.join(META_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::DataDir {
                dir: dir.to_path_buf(),
                problem: format!("{} is missing, so the vote and purge point are unknown", path.display()),
                fix: FIX.into(),
            })
        }
        Err(e) => return Err(StoreError::io(format!("reading {}", path.display()), e)),
    };
    let bad = |why: &str| StoreError::DataDir {
        dir: dir.to_path_buf(),
        problem: format!("{} is damaged ({why})", path.display()),
        fix: FIX.into(),
    };
    if bytes.len() < 20 || &bytes[0..8] != META_MAGIC {
        return Err(bad("no meta header"));
    }
    let crc = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[12..20]);
    let body = usize::try_from(u64::from_le_bytes(len)).ok().and_then(|l| bytes.get(20..20usize.checked_add(l)?));
    let Some(body) = body.filter(|b| 20 + b.len() == bytes.len()) else { return Err(bad("wrong length")) };
    if crc32fast::hash(body) != crc {
        return Err(bad("CRC mismatch"));
    }
    codec::decode("log meta", body).map_err(|e| bad(&e.to_string()))
}

fn write_meta(dir: &Path, meta: &Meta) -> Result<(), StoreError> {
    crate::sled_store::write_durably(&dir.join(META_FILE), &encode_meta(meta)?)
}

/// Creates an empty log directory (meta with no vote and no purge point, no segment yet) and
/// makes it durable. Refuses a directory that exists.
pub(crate) fn create(dir: &Path) -> Result<(), StoreError> {
    std::fs::create_dir(dir).map_err(io("creating log directory", dir))?;
    write_meta(dir, &Meta::default())?;
    crate::sled_store::sync_dir(dir)
}

/// Builds a log in the new directory `dir` from the given state and entries (ascending, all
/// above `purged`), every byte fsynced before it returns: the one-time copy of an older data
/// format's log. Returns the number of entries written.
pub(crate) fn import(
    dir: &Path,
    vote: Option<Vote<u64>>,
    purged: Option<LogId>,
    committed: Option<LogId>,
    entries: impl Iterator<Item = Result<Entry, StoreError>>,
) -> Result<u64, StoreError> {
    /// Entries per write while copying: bounds memory for a long log.
    const CHUNK: usize = 1024;
    create(dir)?;
    write_meta(dir, &Meta { vote, purged })?;
    let store = LogStore::open(dir, SEGMENT_BYTES, None)?;
    let inner = &store.inner;
    let mut copied = 0u64;
    let mut chunk = Vec::with_capacity(CHUNK);
    for entry in entries {
        chunk.push(entry?);
        if chunk.len() == CHUNK {
            copied += CHUNK as u64;
            inner.write_entries(std::mem::take(&mut chunk))?;
        }
    }
    copied += chunk.len() as u64;
    inner.write_entries(chunk)?;
    let mut st = lock(&inner.state);
    st.committed = committed;
    inner.write_committed(&mut st)?;
    // Earlier segments were fsynced as each next one was started; this covers the last.
    let active = st.active();
    active.file.sync_data().map_err(io("syncing", &active.path))?;
    Ok(copied)
}

/// Reserves `size` bytes for a new segment (reading as zeros past the frames). An append
/// that grows a file makes its `fdatasync` commit the file system's journal too (the new
/// size and blocks); one that writes into reserved blocks does not, and is faster and cheaper
/// (figures in docs/benchmarks.md, "Levers tried").
/// Best effort: a file system without `fallocate`, or one without the room, gets a segment
/// that grows as before, and a full disk is then reported by the write that needs the room.
fn preallocate(file: &File, path: &Path, size: u64) {
    if size <= SEGMENT_MAGIC.len() as u64 {
        return;
    }
    let Ok(size) = i64::try_from(size) else { return };
    if let Err(e) = nix::fcntl::fallocate(file, nix::fcntl::FallocateFlags::empty(), 0, size) {
        // A failed fallocate may still have reserved some blocks: give them back.
        let _ = file.set_len(SEGMENT_MAGIC.len() as u64);
        tracing::debug!(file = %path.display(), error = %e, "log segment not preallocated");
    }
}

/// Creates segment `seq` with its header, its blocks reserved up to `size` bytes (see
/// [`preallocate`]), durably (file fsynced, then the directory).
fn new_segment(dir: &Path, seq: u64, size: u64) -> Result<Segment, StoreError> {
    let path = dir.join(segment_name(seq));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io("creating", &path))?;
    file.write_all_at(SEGMENT_MAGIC, 0).map_err(io("writing", &path))?;
    preallocate(&file, &path, size);
    file.sync_all().map_err(io("syncing", &path))?;
    crate::sled_store::sync_dir(&path)?;
    Ok(Segment { seq, path, file: Arc::new(file), len: SEGMENT_MAGIC.len() as u64, last_live: None })
}

/// The sync thread: fsyncs queued appends in groups and answers their waiters in order.
fn sync_loop(jobs: mpsc::Receiver<Job>, poisoned: Arc<AtomicBool>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while let Ok(more) = jobs.try_recv() {
            group.push(more);
        }
        let mut files: Vec<Arc<File>> = Vec::new();
        for job in &group {
            if let Job::Sync { file: Some(f), .. } = job {
                if !files.iter().any(|g| Arc::ptr_eq(f, g)) {
                    files.push(f.clone());
                }
            }
        }
        let started = Instant::now();
        let mut result =
            if poisoned.load(Ordering::Acquire) { Err("the log store failed earlier".to_string()) } else { Ok(()) };
        if result.is_ok() && !planted::active(Bug::AckBeforeFsync) {
            for f in &files {
                if let Err(e) = f.sync_data() {
                    poisoned.store(true, Ordering::Release);
                    tracing::error!(error = %e, "log fsync failed; refusing further writes until restart");
                    result = Err(format!("fsync of the log: {e}"));
                    break;
                }
            }
        }
        let elapsed = started.elapsed();
        let mut observed = files.is_empty() || result.is_err();
        for job in group {
            match job {
                Job::Sync { waiter, observer, .. } => {
                    if !observed {
                        if let Some(o) = &observer {
                            o.append_fsynced(elapsed);
                        }
                        observed = true;
                    }
                    waiter.complete(result.clone());
                }
                Job::Barrier(tx) => {
                    let _ = tx.send(());
                }
            }
        }
    }
}

/// Reads the live entries with index in `[lo, hi)`: one `pread` per run of entries in the same
/// segment (they are adjacent but for committed frames between them), each frame checked
/// against its CRC again.
fn read_entries(st: &State, lo: u64, hi: u64) -> Result<Vec<Entry>, StoreError> {
    let lo = lo.max(st.first);
    let hi = hi.min(st.first + st.locs.len() as u64);
    if lo >= hi {
        return Ok(Vec::new());
    }
    let locs: Vec<Loc> = st.locs.range((lo - st.first) as usize..(hi - st.first) as usize).copied().collect();
    let mut out = Vec::with_capacity(locs.len());
    let mut i = 0;
    while i < locs.len() {
        let seq = locs[i].seq;
        let mut j = i;
        while j + 1 < locs.len() && locs[j + 1].seq == seq {
            j += 1;
        }
        let seg = st.segment(seq).ok_or_else(|| StoreError::Corrupt {
            what: "log index".into(),
            detail: format!("entry in segment {seq}, which is gone"),
        })?;
        let start = locs[i].offset;
        let span = (locs[j].offset + u64::from(locs[j].len) - start) as usize;
        let mut buf = vec![0u8; span];
        seg.file.read_exact_at(&mut buf, start).map_err(io("reading", &seg.path))?;
        for loc in &locs[i..=j] {
            let at = (loc.offset - start) as usize;
            let bad = |why: String| StoreError::Corrupt {
                what: format!("log entry in {} at byte offset {}", seg.path.display(), loc.offset),
                detail: why,
            };
            let (kind, payload, _) = parse_frame(&buf[at..]).map_err(|Torn(w)| bad(w))?;
            if kind != KIND_ENTRY {
                return Err(bad(format!("record kind {kind} where an entry was indexed")));
            }
            out.push(codec::decode::<Entry>("log entry", payload)?);
        }
        i = j + 1;
    }
    Ok(out)
}

impl LogStore {
    /// Opens the log in `dir` (made by [`create`]), recovering as the module doc says.
    /// `guard` is kept alive as long as the store.
    pub(crate) fn open(
        dir: &Path,
        segment_bytes: u64,
        guard: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Result<Self, StoreError> {
        let _ = std::fs::remove_file(dir.join(META_FILE).with_extension("tmp"));
        let meta = read_meta(dir)?;
        let purged_index = meta.purged.map(|p| p.index);
        let mut seqs = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io("reading log directory", dir))? {
            let entry = entry.map_err(io("reading log directory", dir))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(seq) = name.strip_suffix(".seg").and_then(|s| s.parse::<u64>().ok()) {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();

        let mut st = State {
            segments: VecDeque::new(),
            first: 0,
            locs: VecDeque::new(),
            last: None,
            meta,
            committed: None,
            next_seq: seqs.last().map_or(1, |s| s + 1),
        };
        let mut prev_index: Option<u64> = None;
        for (i, &seq) in seqs.iter().enumerate() {
            let active = i + 1 == seqs.len();
            let path = dir.join(segment_name(seq));
            let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).map_err(io("opening", &path))?;
            let bytes = std::fs::read(&path).map_err(io("reading", &path))?;
            let mut seg = Segment { seq, path: path.clone(), file: Arc::new(file), len: 0, last_live: None };
            if bytes.len() < SEGMENT_MAGIC.len() || bytes[..SEGMENT_MAGIC.len()] != SEGMENT_MAGIC[..] {
                // A segment being created when the process died: its header never became
                // durable, so nothing after it can have either.
                if active && bytes.iter().all(|&b| b == 0) {
                    tracing::warn!(file = %path.display(), "log segment without a header (a crash while creating it); starting it afresh");
                    seg.file.set_len(0).map_err(io("truncating", &path))?;
                    seg.file.write_all_at(SEGMENT_MAGIC, 0).map_err(io("writing", &path))?;
                    preallocate(&seg.file, &path, segment_bytes);
                    seg.file.sync_all().map_err(io("syncing", &path))?;
                    seg.len = SEGMENT_MAGIC.len() as u64;
                    st.segments.push_back(seg);
                    continue;
                }
                return Err(damaged(dir, &path, 0, "it does not start with the segment header"));
            }
            let mut off = SEGMENT_MAGIC.len();
            while off < bytes.len() {
                let (kind, payload, n) = match parse_frame(&bytes[off..]) {
                    Ok(f) => f,
                    // Reserved room never written (see `preallocate`): the clean end. Zeros
                    // cannot be a frame, and entries lost from a sealed segment this way are
                    // caught by the next segment's first index.
                    Err(Torn(_)) if bytes[off..].iter().all(|&b| b == 0) => break,
                    Err(Torn(why)) if active => {
                        tracing::warn!(
                            file = %path.display(),
                            offset = off,
                            dropped_bytes = bytes.len() - off,
                            reason = %why,
                            "the log ends in a partial write (a crash while appending); cutting it off"
                        );
                        seg.file.set_len(off as u64).map_err(io("truncating", &path))?;
                        seg.file.sync_all().map_err(io("syncing", &path))?;
                        break;
                    }
                    Err(Torn(why)) => {
                        return Err(damaged(dir, &path, off as u64, why));
                    }
                };
                match kind {
                    KIND_ENTRY => {
                        let entry: Entry =
                            codec::decode("log entry", payload).map_err(|e| damaged(dir, &path, off as u64, e))?;
                        let index = entry.log_id.index;
                        if prev_index.is_some_and(|p| index <= p) {
                            return Err(damaged(
                                dir,
                                &path,
                                off as u64,
                                format!("entry {index} follows entry {}", prev_index.unwrap_or_default()),
                            ));
                        }
                        prev_index = Some(index);
                        if purged_index.is_none_or(|p| index > p) {
                            match st.last {
                                Some(l) if index != l.index + 1 => {
                                    return Err(damaged(
                                        dir,
                                        &path,
                                        off as u64,
                                        format!("entry {index} follows entry {}: entries are missing", l.index),
                                    ))
                                }
                                Some(_) => {}
                                None => st.first = index,
                            }
                            st.locs.push_back(Loc { seq, offset: off as u64, len: n as u32 });
                            st.last = Some(entry.log_id);
                            seg.last_live = Some(index);
                        }
                    }
                    KIND_COMMITTED => {
                        st.committed = codec::decode::<Option<LogId>>("committed log id", payload)
                            .map_err(|e| damaged(dir, &path, off as u64, e))?;
                    }
                    other => return Err(damaged(dir, &path, off as u64, format!("unknown record kind {other}"))),
                }
                off += n;
            }
            seg.len = off as u64;
            st.segments.push_back(seg);
        }
        if st.segments.is_empty() {
            let seg = new_segment(dir, st.next_seq, segment_bytes)?;
            st.next_seq += 1;
            st.segments.push_back(seg);
        }
        // A committed index beyond the log cannot come from a valid prefix; never hand it on.
        let top = st.last.or(st.meta.purged).map(|l| l.index);
        if st.committed.is_some_and(|c| top.is_none_or(|t| c.index > t)) {
            tracing::warn!(committed = ?st.committed, last = ?top, "stored committed index is beyond the log; ignoring it");
            st.committed = None;
        }
        let (tx, rx) = mpsc::channel();
        let poisoned = Arc::new(AtomicBool::new(false));
        {
            let poisoned = poisoned.clone();
            std::thread::Builder::new()
                .name("idemraft-log-sync".into())
                .spawn(move || sync_loop(rx, poisoned))
                .map_err(|e| StoreError::io("starting the log sync thread", e))?;
        }
        let inner =
            Inner { dir: dir.to_path_buf(), segment_bytes, state: Mutex::new(st), jobs: tx, poisoned, _guard: guard };
        // Finish a purge that a crash interrupted after its purge point became durable.
        inner.delete_purged_segments()?;
        Ok(LogStore { inner: Arc::new(inner), observer: None })
    }

    /// Reports appends and commits to `observer` from now on (see [`LogObserver`]).
    pub fn with_observer(mut self, observer: Arc<dyn LogObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The id of the last entry written (or the purge point of an empty log), as openraft's
    /// `get_log_state` reports it: what a pre-vote compares against a candidate's log.
    pub fn last_log_id(&self) -> Option<LogId> {
        let st = lock(&self.inner.state);
        st.last.or(st.meta.purged)
    }

    /// Bytes of the live entries above `index` (their frames as stored): how much log a
    /// snapshot at `index` leaves above it.
    pub fn bytes_after(&self, index: u64) -> u64 {
        let st = lock(&self.inner.state);
        let skip = index.saturating_add(1).saturating_sub(st.first);
        st.locs.iter().skip(usize::try_from(skip).unwrap_or(usize::MAX)).map(|l| u64::from(l.len)).sum()
    }

    /// Appends entries and returns once they are fsynced. openraft's `append` is this with
    /// its callback instead of the wait; tools and tests that drive the log without openraft
    /// call it directly.
    pub async fn append_durably(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(entries, Waiter::Oneshot(tx))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::io("appending to the log", std::io::Error::other(e))),
            Err(_) => Err(StoreError::io("appending to the log", std::io::Error::other("the sync thread stopped"))),
        }
    }

    /// Writes the entries (readable once this returns) and queues their fsync.
    fn submit(&self, entries: impl IntoIterator<Item = Entry>, waiter: Waiter) -> Result<(), StoreError> {
        let file = match self.inner.write_entries(entries) {
            Ok(file) => file,
            Err(e) => {
                waiter.complete(Err(e.to_string()));
                return Err(e);
            }
        };
        let job = Job::Sync { file, waiter, observer: self.observer.clone() };
        self.inner.jobs.send(job).map_err(|mpsc::SendError(job)| {
            if let Job::Sync { waiter, .. } = job {
                waiter.complete(Err("the log sync thread stopped".into()));
            }
            StoreError::io("appending to the log", std::io::Error::other("the sync thread stopped"))
        })
    }

    /// Waits until every append queued so far has been fsynced (or has failed).
    async fn barrier(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.inner.jobs.send(Job::Barrier(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Runs `f` on the blocking pool: it does file IO that may wait for the disk.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| StoreError::io("log store task", std::io::Error::other(e.to_string())))?
    }

    /// Entries with index in `range`, in order (only those the log holds).
    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StoreError> {
        let st = lock(&self.inner.state);
        let lo = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let hi = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        };
        // The lock is held through the reads, so truncation cannot cut a file under them.
        read_entries(&st, lo, hi)
    }
}

impl Inner {
    fn check_poisoned(&self) -> Result<(), StoreError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::io(
                "writing to the log",
                std::io::Error::other("an earlier log write or fsync failed; restart the node"),
            ));
        }
        Ok(())
    }

    /// Writes the entries' frames at the end of the active segment in one write, rotating
    /// first if it is full; returns the file to fsync (`None` when there was nothing).
    fn write_entries(&self, entries: impl IntoIterator<Item = Entry>) -> Result<Option<Arc<File>>, StoreError> {
        let purged = lock(&self.state).meta.purged.map(|p| p.index);
        // At or below the purge point an entry is covered by a snapshot already: there is
        // nothing to keep. openraft does not send such entries in operation, but its storage
        // suite appends one after `get_initial_state` purged up to the state machine.
        let entries: Vec<Entry> = entries.into_iter().filter(|e| purged.is_none_or(|p| e.log_id.index > p)).collect();
        // Sized up front (a walk that copies nothing), so the buffer never regrows, which would
        // copy every body framed so far once more.
        let size: usize = entries.iter().map(|e| codec::encoded_len(e).unwrap_or(0) + FRAME_HEADER + 1).sum();
        let mut buf = Vec::with_capacity(size);
        let mut frames: Vec<(LogId, usize, u32)> = Vec::with_capacity(entries.len());
        for entry in &entries {
            let start = buf.len();
            push_frame(&mut buf, KIND_ENTRY, entry)?;
            frames.push((entry.log_id, start, (buf.len() - start) as u32));
        }
        let Some(&(first_id, _, _)) = frames.first() else { return Ok(None) };
        let mut st = lock(&self.state);
        self.check_poisoned()?;
        // Entries must continue the log without a hole or an overlap (openraft truncates
        // before it overwrites); the first entry of an empty log may start anywhere above the
        // purge point (after a snapshot install the log continues past the snapshot).
        let mut expected = st.last.map(|l| l.index + 1);
        for &(id, _, _) in &frames {
            let ok = match expected {
                Some(e) => id.index == e,
                None => st.meta.purged.is_none_or(|p| id.index > p.index),
            };
            if !ok {
                return Err(StoreError::Corrupt {
                    what: "log append".into(),
                    detail: format!(
                        "entry {} does not continue the log (last {:?}, purged {:?})",
                        id.index, st.last, st.meta.purged
                    ),
                });
            }
            expected = Some(id.index + 1);
        }
        if st.active().len >= self.segment_bytes && st.active().len > SEGMENT_MAGIC.len() as u64 {
            self.rotate(&mut st)?;
        }
        let seg = st.active();
        let at = seg.len;
        if let Err(e) = seg.file.write_all_at(&buf, at) {
            // Take back what may have reached the file, so the next write starts clean.
            if seg.file.set_len(at).is_err() {
                self.poisoned.store(true, Ordering::Release);
            }
            return Err(StoreError::io(format!("writing {}", seg.path.display()), e));
        }
        seg.len += buf.len() as u64;
        let seq = seg.seq;
        let file = seg.file.clone();
        let last_id = frames[frames.len() - 1].0;
        seg.last_live = Some(last_id.index);
        if st.locs.is_empty() {
            st.first = first_id.index;
        }
        for (_, start, len) in frames {
            st.locs.push_back(Loc { seq, offset: at + start as u64, len });
        }
        st.last = Some(last_id);
        Ok(Some(file))
    }

    /// Starts a new active segment. The old one is fsynced first, so that only the active
    /// segment can ever end in a partial write.
    fn rotate(&self, st: &mut State) -> Result<(), StoreError> {
        let old = st.active();
        if let Err(e) = old.file.sync_data() {
            self.poisoned.store(true, Ordering::Release);
            return Err(StoreError::io(format!("syncing {}", old.path.display()), e));
        }
        let seg = new_segment(&self.dir, st.next_seq, self.segment_bytes)?;
        st.next_seq += 1;
        st.segments.push_back(seg);
        Ok(())
    }

    /// Writes a committed frame (no fsync, see the module doc).
    fn write_committed(&self, st: &mut State) -> Result<(), StoreError> {
        self.check_poisoned()?;
        let mut buf = Vec::new();
        push_frame(&mut buf, KIND_COMMITTED, &st.committed)?;
        let seg = st.active();
        if let Err(e) = seg.file.write_all_at(&buf, seg.len) {
            if seg.file.set_len(seg.len).is_err() {
                self.poisoned.store(true, Ordering::Release);
            }
            return Err(StoreError::io(format!("writing {}", seg.path.display()), e));
        }
        seg.len += buf.len() as u64;
        Ok(())
    }

    fn save_vote(&self, vote: Vote<u64>) -> Result<(), StoreError> {
        let mut st = lock(&self.state);
        let meta = Meta { vote: Some(vote), ..st.meta.clone() };
        write_meta(&self.dir, &meta)?;
        st.meta = meta;
        Ok(())
    }

    /// Removes the entries with index `>= index`, durably.
    fn truncate(&self, index: u64) -> Result<(), StoreError> {
        let mut st = lock(&self.state);
        self.check_poisoned()?;
        let end = st.first + st.locs.len() as u64;
        if st.locs.is_empty() || index >= end {
            return Ok(());
        }
        let from = index.max(st.first);
        let cut = st.locs[(from - st.first) as usize];
        let mut removed = false;
        while st.segments.len() > 1 && st.active().seq > cut.seq {
            if let Some(seg) = st.segments.pop_back() {
                std::fs::remove_file(&seg.path).map_err(io("removing", &seg.path))?;
                removed = true;
            }
        }
        let seg = st.active();
        seg.file.set_len(cut.offset).map_err(io("truncating", &seg.path))?;
        seg.file.sync_all().map_err(io("syncing", &seg.path))?;
        seg.len = cut.offset;
        if removed {
            crate::sled_store::sync_dir(&seg.path)?;
        }
        let keep = (from - st.first) as usize;
        st.locs.truncate(keep);
        st.last = None;
        if let Some(&prev) = st.locs.back() {
            let prev_index = st.first + st.locs.len() as u64 - 1;
            // The log id of the new last entry is in its frame: read it back.
            let id = read_entries(&st, prev_index, prev_index + 1)?.pop().map(|e| e.log_id).ok_or_else(|| {
                StoreError::Corrupt { what: "log".into(), detail: format!("entry {prev_index} vanished in truncation") }
            })?;
            st.last = Some(id);
            let active = st.active();
            active.last_live = (prev.seq == active.seq).then_some(prev_index);
        } else {
            st.active().last_live = None;
        }
        // The committed frames after the cut went with it; committed entries are never
        // truncated, so the one in memory is still valid: write it again.
        if st.committed.is_some() {
            self.write_committed(&mut st)?;
        }
        Ok(())
    }

    /// Drops the entries with index `<= log_id.index`: the purge point is made durable first,
    /// then whole segments below it are deleted.
    fn purge(&self, log_id: LogId) -> Result<(), StoreError> {
        let mut st = lock(&self.state);
        self.check_poisoned()?;
        if st.meta.purged.is_some_and(|p| p.index >= log_id.index) {
            return Ok(());
        }
        let meta = Meta { purged: Some(log_id), ..st.meta.clone() };
        write_meta(&self.dir, &meta)?;
        st.meta = meta;
        let end = st.first + st.locs.len() as u64;
        if log_id.index >= st.first {
            let n = (log_id.index + 1).min(end) - st.first;
            st.locs.drain(..n as usize);
            st.first += n;
        }
        if st.locs.is_empty() {
            st.first = log_id.index + 1;
            st.last = None;
        }
        for seg in st.segments.iter_mut() {
            if seg.last_live.is_some_and(|l| l <= log_id.index) {
                seg.last_live = None;
            }
        }
        drop(st);
        self.delete_purged_segments()
    }

    /// Deletes the segments, oldest first, that hold no live entry (never the active one).
    fn delete_purged_segments(&self) -> Result<(), StoreError> {
        let mut st = lock(&self.state);
        let mut removed = None;
        while st.segments.len() > 1 && st.segments[0].last_live.is_none() {
            if let Some(seg) = st.segments.pop_front() {
                std::fs::remove_file(&seg.path).map_err(io("removing", &seg.path))?;
                removed = Some(seg.path);
            }
        }
        drop(st);
        match removed {
            Some(path) => crate::sled_store::sync_dir(&path),
            None => Ok(()),
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        self.entries(range).map_err(sto_logs_read)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let st = lock(&self.inner.state);
        // An empty log after a purge still has a last log id: the purged one.
        Ok(LogState { last_purged_log_id: st.meta.purged, last_log_id: st.last.or(st.meta.purged) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let vote = *vote;
        self.blocking(move |inner| inner.save_vote(vote)).await.map_err(sto_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(lock(&self.inner.state).meta.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError<u64>> {
        {
            let mut st = lock(&self.inner.state);
            st.committed = committed;
            self.inner.write_committed(&mut st).map_err(sto_write)?;
        }
        if let (Some(o), Some(c)) = (&self.observer, committed) {
            o.committed(c.index);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<u64>> {
        Ok(lock(&self.inner.state).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Readable once `submit` returns; durable when the sync thread calls back. openraft
        // replicates a leader's entries meanwhile and counts the leader's own copy toward
        // the commit quorum only after the callback.
        self.submit(entries, Waiter::Flushed(callback)).map_err(sto_logs_write)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        self.barrier().await;
        self.blocking(move |inner| inner.truncate(log_id.index)).await.map_err(sto_logs_write)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        self.blocking(move |inner| inner.purge(log_id)).await.map_err(sto_logs_write)
    }
}

#[cfg(test)]
mod tests;
