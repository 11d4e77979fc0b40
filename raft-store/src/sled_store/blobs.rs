//! The blob directory: packs of response bodies, and the files of one body each that earlier
//! releases wrote for large ones (see [`crate::stored`]).
//!
//! ```text
//! <data-dir>/blobs/<xx>/<index>-<n>     xx = the low byte of index, in hex
//! pack entry: key_len u32 LE | body_len u32 LE | record key | body
//! ```
//!
//! A pack is appended to until it reaches [`PACK_MAX`] or a snapshot build starts (the build
//! seals it, so every byte a snapshot links is as it was at the capture), then never appended
//! to again. Each entry carries its record's key, so a pack can be compacted without an index
//! from packs to records: the live bodies and bytes of every pack are counted in memory
//! (rebuilt from the records on open and install), a pack whose last body is released is
//! unlinked (the open one when it is sealed), and one less than half live on disk is
//! compacted a step at a time by apply (its live bodies appended to the open pack and their
//! stubs repointed) until it holds none.
//!
//! A released body's whole blocks are punched out of its pack instead (decision 0029), once no
//! snapshot on disk can name it: a snapshot hard-links the pack, so a hole in the pack is a
//! hole in the snapshot. Releases are stamped with the snapshot captures started so far, and
//! the end of a build punches those released before its capture when its snapshot is the only
//! one left ([`BlobDir::punch`]). Holes do not count as what a pack holds on disk, so a pack
//! of large bodies is compacted only once little of it is left.
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

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::stored::{self, BlobRef};

/// Files of one directory level under `blobs/`: enough to keep each directory small at
/// millions of blobs.
const FANOUT: u64 = 256;

/// A pack is sealed once it holds this many bytes: compacting one reads at most this much.
pub(crate) const PACK_MAX: u64 = 4 * 1024 * 1024;
/// Bytes of a pack entry's head.
const ENTRY_HEAD: u64 = 8;

/// What the records name in one file, counted by a scan of the records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Live {
    /// Bodies the records name in it.
    pub(crate) bodies: u64,
    /// Their bytes.
    pub(crate) bytes: u64,
    /// It is a pack.
    pub(crate) packed: bool,
}

/// The files the records name: `(index, n)` → what they hold of it.
pub(crate) type Named = BTreeMap<(u64, u32), Live>;

/// Counts `b` into `named`.
pub(crate) fn name(named: &mut Named, b: &BlobRef) {
    let live = named.entry((b.index, b.n)).or_default();
    live.bodies += 1;
    live.bytes += b.len;
    live.packed = b.at.is_some();
}

struct OpenPack {
    name: (u64, u32),
    file: std::fs::File,
    len: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct PackLive {
    bodies: u64,
    bytes: u64,
    /// The file's length.
    size: u64,
    /// Bytes of it freed by punched holes, or due to be once no snapshot names them.
    freed: u64,
}

impl PackLive {
    /// Less than half of what the pack holds on disk is live: compaction's cue. Holes do
    /// not count, so a pack of large bodies, whose released ranges are punched, is copied
    /// only once what is left is mostly the blocks a hole could not take.
    fn sparse(&self) -> bool {
        self.bytes.saturating_mul(2) < self.size.saturating_sub(self.freed)
    }
}

/// The file system's block: a hole frees only whole blocks inside a released body.
const BLOCK: u64 = 4096;

/// The whole blocks inside the `len` bytes at `at`, as `(offset, len)`.
fn interior(at: u64, len: u64) -> Option<(u64, u64)> {
    let start = at.div_ceil(BLOCK).saturating_mul(BLOCK);
    let end = at.saturating_add(len) / BLOCK * BLOCK;
    (end > start).then(|| (start, end - start))
}

/// A released range of a pack, due to be punched.
#[derive(Clone, Copy, Debug)]
struct Released {
    /// [`Packs::captures`] when it was released: snapshots captured later do not name it.
    stamp: u64,
    name: (u64, u32),
    at: u64,
    len: u64,
}

#[derive(Default)]
struct Packs {
    open: Option<OpenPack>,
    /// Every pack some record names, the open one included.
    live: BTreeMap<(u64, u32), PackLive>,
    /// Sealed packs less than half live, waiting for compaction.
    sparse: BTreeSet<(u64, u32)>,
    /// The pack being compacted and the offset of its next entry.
    compacting: Option<((u64, u32), u64)>,
    /// Snapshot captures started (counted by [`BlobDir::seal`]).
    captures: u64,
    /// Released ranges not yet punched, oldest first.
    unpunched: Vec<Released>,
}

impl Packs {
    /// No pack known, as before an open's or an install's [`BlobDir::adopt`]; the count of
    /// captures goes on, so that stamps stay ordered.
    fn forgotten(&self) -> Packs {
        Packs { captures: self.captures, ..Packs::default() }
    }

    /// Seals the open pack. Returns its name when no record names a body in it any more: its
    /// last body was released while it was open, when a release leaves the file alone (it is
    /// still appended to), so the caller must delete it now or nothing ever would.
    #[must_use]
    fn seal(&mut self) -> Option<(u64, u32)> {
        let open = self.open.take()?;
        let live = self.live.get(&open.name).copied().unwrap_or_default();
        if live.bodies == 0 {
            self.live.remove(&open.name);
            return Some(open.name);
        }
        if live.sparse() {
            self.sparse.insert(open.name);
        }
        None
    }
}

pub(crate) struct BlobDir {
    root: PathBuf,
    /// The file system frees the blocks of a punched hole (probed at open).
    punch: bool,
    /// Bodies from this size go to files of their own, as releases before packs took every
    /// size wrote them (`None`: none do). Tests use it to make such data.
    files_from: Option<usize>,
    /// Blobs written since they were last fsynced. Locked around the write and rename of a
    /// blob, so a snapshot build that links a name sees whether it still needs a sync.
    unsynced: std::sync::Mutex<BTreeSet<(u64, u32)>>,
    /// Blobs released while a snapshot build ran: unlinked once it ends.
    deferred: std::sync::Mutex<Vec<BlobRef>>,
    /// Locked before `unsynced` wherever both are.
    packs: std::sync::Mutex<Packs>,
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

/// Frees the `len` bytes at `at` of `file`, keeping its length.
fn punch_hole(file: &std::fs::File, at: u64, len: u64) -> std::io::Result<()> {
    let (at, len) = (i64::try_from(at), i64::try_from(len));
    let (Ok(at), Ok(len)) = (at, len) else { return Err(std::io::Error::other("range past the largest offset")) };
    let flags = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(file, flags, at, len).map_err(std::io::Error::from)
}

/// Whether the file system under `root` frees the blocks of a punched hole. Where it does not
/// (FUSE, some network file systems), released bodies are freed by compaction alone.
fn probe_punch(root: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let path = root.join("punch-probe.tmp");
    let punched = (|| -> std::io::Result<bool> {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
        f.write_all_at(&[1u8; 4 * BLOCK as usize], 0)?;
        f.sync_data()?;
        let before = f.metadata()?.blocks();
        punch_hole(&f, BLOCK, 2 * BLOCK)?;
        Ok(f.metadata()?.blocks() < before)
    })()
    .unwrap_or(false);
    let _ = std::fs::remove_file(&path);
    punched
}

impl BlobDir {
    /// Opens (creating) `root` and its subdirectories. `files_from`: see [`BlobDir`].
    pub(crate) fn open(root: PathBuf, files_from: Option<usize>) -> Result<Self, StoreError> {
        for d in 0..FANOUT {
            let sub = root.join(format!("{d:02x}"));
            std::fs::create_dir_all(&sub).map_err(|e| io(format!("creating {}", sub.display()), e))?;
        }
        let punch = probe_punch(&root);
        Ok(BlobDir {
            root,
            punch,
            files_from,
            unsynced: Default::default(),
            deferred: Default::default(),
            packs: Default::default(),
        })
    }

    /// Where `rec`'s body goes when it is not kept inline.
    pub(crate) fn placement(&self, rec: &crate::types::Record) -> Option<stored::Placement> {
        let len = rec.response.as_ref().map_or(0, |r| r.body.len());
        match stored::placement(rec)? {
            stored::Placement::Pack if self.files_from.is_some_and(|n| len >= n) => Some(stored::Placement::File),
            place => Some(place),
        }
    }

    fn sub(&self, index: u64) -> PathBuf {
        self.root.join(format!("{:02x}", index % FANOUT))
    }

    /// Where blob `b` lives.
    pub(crate) fn path(&self, b: &BlobRef) -> PathBuf {
        self.sub(b.index).join(b.file_name())
    }

    fn path_of(&self, index: u64, n: u32) -> PathBuf {
        self.sub(index).join(BlobRef::name(index, n).file_name())
    }

    /// Writes `body` as blob `(index, n)` and returns its reference. Not synced (see the
    /// module doc).
    pub(crate) fn write(&self, index: u64, n: u32, body: &[u8]) -> Result<BlobRef, StoreError> {
        let b = BlobRef { index, n, len: body.len() as u64, crc: crc32fast::hash(body), at: None };
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

    /// Appends `body`, the body of record `key` (its tree key), to the open pack, opening
    /// one named `(index, *n)` (and advancing `*n`) when none is. Not synced (see the module
    /// doc).
    pub(crate) fn append(&self, index: u64, n: &mut u32, key: &[u8], body: &[u8]) -> Result<BlobRef, StoreError> {
        let mut packs = lock(&self.packs);
        if packs.open.as_ref().is_some_and(|p| p.len >= PACK_MAX) {
            if let Some(empty) = packs.seal() {
                self.delete(empty);
            }
        }
        if packs.open.is_none() {
            let name = (index, *n);
            let path = self.path_of(index, *n);
            let file = std::fs::OpenOptions::new()
                .append(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| io(format!("creating pack {}", path.display()), e))?;
            *n += 1;
            packs.open = Some(OpenPack { name, file, len: 0 });
            packs.live.insert(name, PackLive::default());
        }
        let mut entry = Vec::with_capacity(ENTRY_HEAD as usize + key.len() + body.len());
        entry.extend_from_slice(&(key.len() as u32).to_le_bytes());
        entry.extend_from_slice(&(body.len() as u32).to_le_bytes());
        entry.extend_from_slice(key);
        entry.extend_from_slice(body);
        let Some(open) = packs.open.as_mut() else {
            return Err(StoreError::Corrupt { what: "pack directory".into(), detail: "no open pack".into() });
        };
        let name = open.name;
        if let Err(e) = open.file.write_all(&entry) {
            // Where a partial write ended is unknown: never append after it.
            packs.open = None;
            return Err(io(format!("appending to pack {}", self.path_of(name.0, name.1).display()), e));
        }
        let at = open.len + ENTRY_HEAD + key.len() as u64;
        open.len += entry.len() as u64;
        let size = open.len;
        let live = packs.live.entry(name).or_default();
        live.bodies += 1;
        live.bytes += body.len() as u64;
        live.size = size;
        lock(&self.unsynced).insert(name);
        Ok(BlobRef { index: name.0, n: name.1, len: body.len() as u64, crc: crc32fast::hash(body), at: Some(at) })
    }

    /// Seals the open pack: called when a snapshot build starts its capture, so that every
    /// file it links stays as it is. Returns the capture's number, for [`BlobDir::punch`].
    pub(crate) fn seal(&self) -> u64 {
        let mut packs = lock(&self.packs);
        if let Some(empty) = packs.seal() {
            self.delete(empty);
        }
        packs.captures += 1;
        packs.captures
    }

    /// Punches the ranges released before capture `captured` began, once the snapshot of
    /// that capture is the only one on disk: a sealed pack is hard-linked into every snapshot
    /// that names one of its bodies, so a hole in it is a hole in each of them, and only
    /// snapshots captured after a release are sure not to name the range. The caller holds
    /// off snapshot installs, which replace files under the same names. A failed punch only
    /// leaves the blocks allocated. Returns the holes punched and their bytes.
    pub(crate) fn punch(&self, captured: u64) -> (u64, u64) {
        let mut due = {
            let mut packs = lock(&self.packs);
            let (due, keep) = std::mem::take(&mut packs.unpunched).into_iter().partition(|r| r.stamp < captured);
            packs.unpunched = keep;
            due
        };
        due.sort_by_key(|r: &Released| (r.name, r.at));
        let (mut holes, mut bytes) = (0, 0);
        let mut file: Option<((u64, u32), std::fs::File)> = None;
        for r in due {
            if file.as_ref().is_none_or(|(name, _)| *name != r.name) {
                let path = self.path_of(r.name.0, r.name.1);
                file = match std::fs::OpenOptions::new().write(true).open(&path) {
                    Ok(f) => Some((r.name, f)),
                    Err(e) => {
                        // Deleted since: its last body was released, or compaction emptied it.
                        if e.kind() != std::io::ErrorKind::NotFound {
                            tracing::warn!(file = %path.display(), error = %e, "could not open a pack to free released bodies");
                        }
                        None
                    }
                };
            }
            let Some((_, f)) = &file else { continue };
            match punch_hole(f, r.at, r.len) {
                Ok(()) => {
                    holes += 1;
                    bytes += r.len;
                }
                Err(e) => tracing::warn!(
                    file = %self.path_of(r.name.0, r.name.1).display(),
                    error = %e,
                    "could not punch a released body out of a pack; its blocks stay allocated"
                ),
            }
        }
        (holes, bytes)
    }

    /// Reads blob `b` back, checked against its length and CRC.
    pub(crate) fn read(&self, b: &BlobRef) -> Result<Vec<u8>, StoreError> {
        let path = self.path(b);
        let len = usize::try_from(b.len).unwrap_or(0);
        let (what, read) = match b.at {
            Some(at) => {
                let mut body = vec![0u8; len];
                let read = std::fs::File::open(&path).and_then(|f| f.read_exact_at(&mut body, at)).map(|()| body);
                (format!("pack {}", path.display()), read)
            }
            None => {
                let mut body = Vec::with_capacity(len);
                let read = std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut body)).map(|_| body);
                (format!("blob file {}", path.display()), read)
            }
        };
        let body = read.map_err(|e| match (e.kind(), b.at) {
            (std::io::ErrorKind::NotFound, _) => {
                StoreError::Corrupt { what: what.clone(), detail: "it is missing, but a stored record names it".into() }
            }
            (std::io::ErrorKind::UnexpectedEof, Some(at)) => StoreError::Corrupt {
                what: what.clone(),
                detail: format!("it ends before the {} bytes a record expects at byte {at} (truncated)", b.len),
            },
            _ => io(format!("reading {what}"), e),
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
        if b.at.is_some() {
            let mut packs = lock(&self.packs);
            let name = (b.index, b.n);
            let is_open = packs.open.as_ref().is_some_and(|p| p.name == name);
            let Some(live) = packs.live.get_mut(&name) else { return };
            live.bodies = live.bodies.saturating_sub(1);
            live.bytes = live.bytes.saturating_sub(b.len);
            let hole = b.at.filter(|_| self.punch).and_then(|at| interior(at, b.len));
            if let Some((_, len)) = hole {
                live.freed += len;
            }
            let (empty, sparse) = (live.bodies == 0, live.sparse());
            if let Some((at, len)) = hole.filter(|_| !empty) {
                let stamp = packs.captures;
                packs.unpunched.push(Released { stamp, name, at, len });
            }
            if is_open {
                return;
            }
            if !empty {
                if sparse {
                    packs.sparse.insert(name);
                }
                return;
            }
            packs.live.remove(&name);
            packs.sparse.remove(&name);
            if packs.compacting.is_some_and(|(c, _)| c == name) {
                packs.compacting = None;
            }
        }
        self.delete((b.index, b.n));
    }

    /// Deletes file `(index, n)`, which no record names. Called with `packs` locked or not
    /// (`unsynced` is locked after it).
    fn delete(&self, (index, n): (u64, u32)) {
        lock(&self.unsynced).remove(&(index, n));
        let path = self.path_of(index, n);
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

    /// Links blob `b` into snapshot blob directory `dir` and makes its data durable. True
    /// when that took an fsync (the blob was written since the last build).
    pub(crate) fn link_into(&self, b: &BlobRef, dir: &Path) -> Result<bool, StoreError> {
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
        Ok(needs_sync)
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

    /// Deletes every file not in `keep` (after a clean open: files no record names), and
    /// takes the packs' counts from it.
    pub(crate) fn retain(&self, keep: &Named) -> Result<usize, StoreError> {
        self.adopt(keep)?;
        let mut removed = 0;
        for (index, n) in self.names()? {
            if !keep.contains_key(&(index, n)) {
                let path = self.path_of(index, n);
                std::fs::remove_file(&path).map_err(|e| io(format!("deleting unnamed blob {}", path.display()), e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Takes the live bodies of every pack from `named` (the records' view of the files),
    /// after an open or an install; no pack is open afterwards.
    pub(crate) fn adopt(&self, named: &Named) -> Result<(), StoreError> {
        use std::os::unix::fs::MetadataExt;
        // Ranges released before this point are not punched any more (compaction takes
        // them); holes punched before are read off the blocks the file still holds.
        let mut packs = lock(&self.packs).forgotten();
        for (name, l) in named.iter().filter(|(_, l)| l.packed) {
            let path = self.path_of(name.0, name.1);
            let meta = std::fs::metadata(&path).map_err(|e| io(format!("reading pack {}", path.display()), e))?;
            let size = meta.len();
            // Only where holes are punched: elsewhere the blocks may say little (a FUSE file
            // system may report none), and compaction must see the pack's whole length.
            let freed = if self.punch { size.saturating_sub(meta.blocks().saturating_mul(512)) } else { 0 };
            let live = PackLive { bodies: l.bodies, bytes: l.bytes, size, freed };
            if live.sparse() {
                packs.sparse.insert(*name);
            }
            packs.live.insert(*name, live);
        }
        *lock(&self.packs) = packs;
        Ok(())
    }

    /// One step of compaction, called by apply with no snapshot build running: moves the live
    /// bodies of the next `budget` bytes of a sparse pack to the open pack, repointing their
    /// stubs in `tree`. New packs are named `(index, *n)`, as [`BlobDir::append`] names them.
    /// Returns the bytes scanned.
    pub(crate) fn compact(&self, tree: &sled::Tree, index: u64, n: &mut u32, budget: u64) -> Result<u64, StoreError> {
        let (name, mut at) = {
            let mut packs = lock(&self.packs);
            match packs.compacting {
                Some(c) => c,
                None => {
                    let Some(name) = packs.sparse.pop_first() else { return Ok(0) };
                    packs.compacting = Some((name, 0));
                    (name, 0)
                }
            }
        };
        let path = self.path_of(name.0, name.1);
        let what = format!("pack {}", path.display());
        let file = std::fs::File::open(&path).map_err(|e| io(format!("opening {what} to compact it"), e))?;
        let size = file.metadata().map_err(|e| io(format!("reading {what}"), e))?.len();
        let mut scanned = 0;
        while at < size && scanned < budget {
            let mut head = [0u8; ENTRY_HEAD as usize];
            file.read_exact_at(&mut head, at).map_err(|e| io(format!("reading {what} at byte {at}"), e))?;
            let key_len = u64::from(u32::from_le_bytes([head[0], head[1], head[2], head[3]]));
            let body_len = u64::from(u32::from_le_bytes([head[4], head[5], head[6], head[7]]));
            let entry = ENTRY_HEAD + key_len + body_len;
            if at + entry > size {
                return Err(StoreError::Corrupt {
                    what,
                    detail: format!("its entry at byte {at} runs past its end (truncated)"),
                });
            }
            let mut kb = vec![0u8; usize::try_from(key_len + body_len).unwrap_or(0)];
            file.read_exact_at(&mut kb, at + ENTRY_HEAD).map_err(|e| io(format!("reading {what}"), e))?;
            let (key, body) = kb.split_at(usize::try_from(key_len).unwrap_or(0));
            let body_at = at + ENTRY_HEAD + key_len;
            if let Some(value) = tree.get(key)? {
                if let Some(old) = stored::blob_of(&value).filter(|b| (b.index, b.n) == name && b.at == Some(body_at)) {
                    old.check(body, &what)?;
                    let new = self.append(index, n, key, body)?;
                    let repointed = stored::moved(&value, &new).ok_or_else(|| StoreError::Corrupt {
                        what: what.clone(),
                        detail: "a record's stub changed form while its pack was compacted".into(),
                    })?;
                    tree.insert(key, repointed)?;
                    self.unlink(&old);
                }
            }
            at += entry;
            scanned += entry;
        }
        let mut packs = lock(&self.packs);
        if packs.compacting.is_some_and(|(c, _)| c == name) {
            packs.compacting = (at < size).then_some((name, at));
        }
        Ok(scanned)
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
                let name = BlobRef::name(*index, *n).file_name();
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
        // The packs' counts come from the records loaded next (`adopt`).
        let mut packs = lock(&self.packs);
        *packs = packs.forgotten();
        drop(packs);
        let mut unsynced = lock(&self.unsynced);
        unsynced.clear();
        lock(&self.deferred).clear();
        Ok(())
    }
}
