//! The state machine on sled: records in tree `sm`, their indexes in memory, snapshots in files.
//!
//! One `apply` call (one or many log entries) writes its records, the last applied log id,
//! the clock (and the membership when it changed) as plain sled writes, with readers held off
//! so none sees half an apply. Not as one `sled::Batch`: sled 0.34 seals and writes out its
//! IO buffer twice for every batch (`pin_log`, with a `sync_file_range` each and a wake-up of
//! all its IO threads), which was a fifth of a 3-node cluster's time per log entry
//! (docs/benchmarks.md). Apply does not fsync either, so after a crash sled's tree may hold
//! any mix of the last applies: it is trusted only after a clean shutdown, which flushes and
//! then records the applied log id under `clean` in tree `snap`. On open, a tree without that
//! mark (or with another id) is replaced by the newest snapshot, or emptied when there is
//! none, and openraft re-applies the rest from the log. That holds because the log drops
//! nothing the state might still need: openraft purges only entries covered by a snapshot,
//! and building or installing a snapshot flushes sled first. The first apply after an open
//! that trusted the mark removes it, durably, before it writes anything.
//!
//! Response bodies of [`crate::stored::PACK_MIN`] bytes and more are not in the tree: apply
//! appends each to the open pack (a data directory of an earlier release may hold large ones
//! in blob files of their own) and stores a stub that names it (see `blobs` for their
//! durability, which follows the tree's). A snapshot build seals the open pack and hard-links the files its records name into
//! `<id>.blobs/` beside the snapshot file, so a snapshot costs no second copy of the bodies,
//! and streams them after its records (format 3, or 4 with packs); replacing or sweeping a
//! record releases its body once no build can still need it; the end of a later build
//! punches its whole blocks out of the pack once no snapshot on disk names it, and apply
//! compacts packs that are less than half live on disk, a bounded step per call, while no
//! build runs.
//!
//! Quotas (set by SetQuota) are replicated state like the records: keys `q` (the default) and
//! `q` + tenant in tree `sm`, written with the apply that set them, kept in
//! memory beside the applied metadata, and carried by snapshots.
//!
//! The expiry and lease indexes and the per-tenant record counts are derived data, kept only in memory and rebuilt from the
//! records when the store opens or installs a snapshot, and so is the key filter that spares
//! a lookup of a fresh key the walk through sled (`key_filter`). Writing them to sled halved apply
//! throughput (`benches/store.rs`, run side by side: 30–35k commands/s with sled indexes,
//! 59–73k in memory); in memory they cost roughly 120 bytes per record (a B-tree entry and
//! the encoded key), twice that while the record is IN_PROGRESS. Apply mutates them directly; if a write to sled then fails, the store is poisoned
//! (every later apply fails) because memory and disk no longer agree, and a restart rebuilds
//! them from disk.
//!
//! Snapshots: sled has no MVCC snapshot, so the builder makes its own consistent view. It
//! takes the apply lock only for an instant, to note the applied id and start a [`Capture`];
//! from then on, apply saves the old value of every record it is about to change that the
//! builder's in-order scan has not reached yet, and the builder writes those saved values in
//! place of what it finds. Apply keeps running during the build; the extra memory is the old
//! values of records changed while it runs. Installing first persists the received file and a `pending` marker, then
//! clears and reloads the tree; a crash in between redoes the load on open.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageError};
use tokio::sync::{Mutex, RwLock};

use super::blobs::{self, BlobDir, Named};
use super::key_filter::KeyFilter;
use super::sync_dir;
use crate::blob_stream::BlobStream;
use crate::codec;
use crate::error::{sto_apply, sto_read, sto_snapshot, StoreError};
use crate::machine::{self, StateStore};
use crate::raft::{Entry, LogId, OutcomeBatch, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use crate::snapshot::{Reader, Stubs, Wanted, Writer};
use crate::stored::{self, BlobRef};
use crate::types::{
    ListPage, ListQuery, QuotaReport, Quotas, Record, RecordKey, RecordState, RecordView, LIST_PAGE_BYTES,
};
use crate::StateDigest;

const P_RECORD: u8 = b'r';
/// Quotas: `q` alone holds the default, `q` + tenant a tenant's own (u64 big-endian each).
const P_QUOTA: u8 = b'q';
// Metadata keys start with `m`, outside the record prefix.
const K_APPLIED: &[u8] = b"mapplied";
const K_MEMBERSHIP: &[u8] = b"mmembership";
const K_CLOCK: &[u8] = b"mclock";
const K_CURRENT: &[u8] = b"current";
const K_PENDING: &[u8] = b"pending";
/// In tree `snap`: the applied log id of a state flushed by a clean shutdown (see the module doc).
const K_CLEAN: &[u8] = b"clean";
/// Bytes of a sparse pack one apply call compacts: about a millisecond of reads and sled
/// writes, so a compaction spreads over many applies instead of stalling one.
const COMPACT_STEP: u64 = 256 * 1024;
/// Records per sled batch while loading a snapshot: bounds memory during install.
const LOAD_BATCH: usize = 4096;
/// Stored records one List chunk scans under the read gate: enough to amortise taking the
/// gate and opening a sled range, few enough that an apply waits for one chunk's decoding,
/// not for the whole scan.
const LIST_SCAN_CHUNK: usize = 256;

/// What the apply lock protects besides the tree: the metadata written with every batch.
#[derive(Clone, Debug, Default)]
struct AppliedMeta {
    applied: Option<LogId>,
    membership: StoredMembership,
    clock: u64,
    /// Shared, because the metadata is copied for every apply call and quotas rarely change.
    quotas: Arc<Quotas>,
}

/// The apply lock's contents: the metadata and the in-memory indexes.
#[derive(Default)]
struct Applied {
    meta: AppliedMeta,
    indexes: Indexes,
}

/// Stored records by state (expired ones included until swept), for the node's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// IN_PROGRESS records.
    pub in_progress: u64,
    /// COMPLETED records.
    pub completed: u64,
    /// FAILED (retryable) records.
    pub failed: u64,
}

impl RecordCounts {
    pub(crate) fn of(&mut self, state: RecordState) -> &mut u64 {
        match state {
            RecordState::InProgress => &mut self.in_progress,
            RecordState::Completed => &mut self.completed,
            RecordState::Failed => &mut self.failed,
        }
    }
}

/// Records ordered by expiry (all of them) and by lease deadline (IN_PROGRESS ones), keyed by
/// the encoded record key, and counted by state and by tenant. Derived from the records; never
/// written to disk. The counts live here because every change of a record passes through
/// `insert` and `remove`, so they stay exact without a scan; a replaced record is a `remove`
/// and an `insert`, which leaves its tenant's count as it was.
#[derive(Default)]
struct Indexes {
    by_expiry: BTreeSet<(u64, Box<[u8]>)>,
    by_lease: BTreeSet<(u64, Box<[u8]>)>,
    counts: RecordCounts,
    /// Stored records per tenant; tenants with none have no entry.
    per_tenant: BTreeMap<String, u64>,
    /// Records stored as blob stubs: a snapshot of a state with none is written without a
    /// blob section, exactly as before blobs existed.
    blobs: u64,
    /// Bytes of the bodies those stubs name.
    blob_bytes: u64,
    /// Of those stubs, the ones naming a range of a pack: a snapshot of a state with none is
    /// written in format 3, as before packs existed.
    packed: u64,
}

/// The tenant part of an encoded record key (`tenant 0x00 scope 0x00 key`).
fn tenant_of(enc: &[u8]) -> &str {
    let end = enc.iter().position(|b| *b == 0).unwrap_or(enc.len());
    // Keys are validated before they are stored or indexed, so the tenant is ASCII.
    std::str::from_utf8(&enc[..end]).unwrap_or("")
}

impl Indexes {
    /// Every stored record's encoded key.
    fn keys(&self) -> impl ExactSizeIterator<Item = &[u8]> {
        self.by_expiry.iter().map(|(_, k)| &k[..])
    }

    fn insert(&mut self, enc: &[u8], rec: &Record) {
        *self.counts.of(rec.state) += 1;
        let tenant = tenant_of(enc);
        match self.per_tenant.get_mut(tenant) {
            Some(n) => *n += 1,
            None => {
                self.per_tenant.insert(tenant.to_string(), 1);
            }
        }
        self.by_expiry.insert((rec.expires_ms, enc.into()));
        if rec.state == RecordState::InProgress {
            self.by_lease.insert((rec.lease_expires_ms, enc.into()));
        }
    }

    fn remove(&mut self, enc: &[u8], rec: &Record) {
        let count = self.counts.of(rec.state);
        *count = count.saturating_sub(1);
        let tenant = tenant_of(enc);
        if let Some(n) = self.per_tenant.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_tenant.remove(tenant);
            }
        }
        let enc: Box<[u8]> = enc.into();
        if rec.state == RecordState::InProgress {
            self.by_lease.remove(&(rec.lease_expires_ms, enc.clone()));
        }
        self.by_expiry.remove(&(rec.expires_ms, enc));
    }

    /// Counts a stub's blob.
    fn add_blob(&mut self, b: &BlobRef, named: &mut Named) {
        self.blobs += 1;
        self.blob_bytes += b.len;
        self.packed += u64::from(b.at.is_some());
        blobs::name(named, b);
    }

    /// Rebuilds the indexes from every record in the tree (blob bodies are not read), and
    /// returns what the records name of each file.
    fn rebuild(tree: &sled::Tree) -> Result<(Self, Named), StoreError> {
        let mut ix = Indexes::default();
        let mut named = Named::new();
        for kv in tree.scan_prefix([P_RECORD]) {
            let (k, v) = kv?;
            let (rec, blob) = stored::decode("record", &v)?;
            ix.insert(&k[1..], &rec);
            if let Some(b) = blob {
                ix.add_blob(&b, &mut named);
            }
        }
        Ok((ix, named))
    }

    /// Which stubs a snapshot of this state holds.
    fn stubs(&self) -> Stubs {
        if self.packed > 0 {
            Stubs::Packs
        } else if self.blobs > 0 {
            Stubs::Blobs
        } else {
            Stubs::None
        }
    }
}

struct Inner {
    db: sled::Db,
    /// sled's one data file, fsynced by [`Inner::flush_durably`].
    db_file: PathBuf,
    sm: sled::Tree,
    snap: sled::Tree,
    snapshot_dir: PathBuf,
    /// Large response bodies, one file each (see [`crate::stored`]).
    blobs: BlobDir,
    /// Which record keys the tree may hold, so a lookup of a fresh key skips sled.
    keys: KeyFilter,
    /// Snapshots that open streams still read: kept by `remove_stale_files` until closed.
    pins: crate::blob_stream::Pins,
    /// The apply lock. Held by apply, by the snapshot builder while it reads, and by install.
    state: Arc<Mutex<Applied>>,
    /// Set when memory and disk may disagree (a failed apply); every later apply fails.
    poisoned: AtomicBool,
    /// Serializes snapshot persistence so a slow build never overwrites a newer install.
    snapshot_lock: Mutex<()>,
    /// Set while a snapshot build runs (see [`Capture`]).
    capture: std::sync::Mutex<Option<Capture>>,
    /// Readers share it; a snapshot load takes it alone, so no read ever sees the tree half
    /// cleared or half loaded.
    read_gate: Arc<RwLock<()>>,
    /// The clean-shutdown mark is on disk and still true: the next apply removes it first.
    clean: AtomicBool,
    /// The clock, readable without the apply lock.
    clock: AtomicU64,
    /// Stored records, readable without the apply lock (a status page must not scan the
    /// state or wait behind an apply).
    records: AtomicU64,
    /// The same by state: IN_PROGRESS, COMPLETED, FAILED.
    by_state: [AtomicU64; 3],
    /// Bytes of response bodies kept in blob files and packs.
    blob_bytes: AtomicU64,
    seq: AtomicU64,
}

/// openraft state machine storage on sled. Cloning shares the same state (that is how the
/// snapshot builder is handed out).
#[derive(Clone)]
pub struct StateMachineStore {
    inner: Arc<Inner>,
}

fn record_key(enc: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(enc.len() + 1);
    k.push(P_RECORD);
    k.extend_from_slice(enc);
    k
}

/// Copy-on-write support for a snapshot build in progress.
///
/// `cursor` is the last record key the builder has written; keys at or below it are done.
/// `saved` holds, for keys above it that apply changed since the build started, the value
/// they had when it started (`None`: the record did not exist then).
#[derive(Default)]
struct Capture {
    cursor: Vec<u8>,
    saved: BTreeMap<Vec<u8>, Option<sled::IVec>>,
}

impl Capture {
    /// Called by apply before it overwrites or deletes record key `k` in `tree`.
    fn preserve(&mut self, tree: &sled::Tree, k: &[u8]) -> Result<(), StoreError> {
        if k > self.cursor.as_slice() && !self.saved.contains_key(k) {
            self.saved.insert(k.to_vec(), tree.get(k)?);
        }
        Ok(())
    }

    /// Called by the builder for each `(k, v)` its scan yields, in key order: appends to `out`
    /// the records to write, as they were when the build started, and advances the cursor.
    fn pass(&mut self, k: &[u8], v: sled::IVec, out: &mut Vec<(sled::IVec, sled::IVec)>) {
        if !self.saved.is_empty() {
            self.drain_below(k, out);
        }
        match self.saved.remove(k) {
            Some(Some(old)) => out.push((k.into(), old)),
            Some(None) => {} // created after the build started
            None => out.push((k.into(), v)),
        }
        self.cursor.clear();
        self.cursor.extend_from_slice(k);
    }

    /// Appends the saved records below `k`, which the scan will not meet any more (they were
    /// deleted since the start).
    fn drain_below(&mut self, k: &[u8], out: &mut Vec<(sled::IVec, sled::IVec)>) {
        while let Some(entry) = self.saved.first_entry() {
            if entry.key().as_slice() >= k {
                break;
            }
            if let (key, Some(old)) = entry.remove_entry() {
                out.push((key.into(), old));
            }
        }
    }
}

fn lock_capture(m: &std::sync::Mutex<Option<Capture>>) -> std::sync::MutexGuard<'_, Option<Capture>> {
    // A panic while holding it cannot leave it half-updated in a way that matters more than
    // the panic itself; keep going rather than poison every later apply.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn id_from_index(enc: &[u8]) -> Result<RecordKey, StoreError> {
    RecordKey::decode(enc).ok_or_else(|| StoreError::Corrupt {
        what: "state machine index".into(),
        detail: format!("{enc:?} does not name a valid record"),
    })
}

/// Smallest key greater than every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Bound<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Bound::Excluded(end);
        }
    }
    Bound::Unbounded
}

/// The state as seen by one apply call: the tree plus this call's not yet written changes.
/// Reads see the changes; `write` stores them.
struct Overlay<'a> {
    tree: &'a sled::Tree,
    blobs: &'a BlobDir,
    keys: &'a KeyFilter,
    /// Names this call's blobs: the index of the last entry applied through it.
    name_index: u64,
    clock: u64,
    records: BTreeMap<Vec<u8>, Option<Record>>,
    quotas: Arc<Quotas>,
    /// Set by SetQuota: `write` then rewrites the stored quotas.
    quotas_changed: bool,
    /// Present for apply (which holds the lock); absent for the lock-free read views, which
    /// only get and scan.
    indexes: Option<&'a mut Indexes>,
}

enum Found<'a, V> {
    Changed(&'a V),
    Stored(sled::IVec),
}

/// Called for each key by [`merged`]; returns `false` to stop.
type Visitor<'v, V> = dyn FnMut(&[u8], Found<'_, V>) -> Result<bool, StoreError> + 'v;

/// Visits keys in `[lo, hi)` order over the tree with `overlay` laid on top: an overlay entry
/// hides the stored one, and `None` in the overlay is a deletion.
fn merged<V>(
    tree: &sled::Tree,
    overlay: &BTreeMap<Vec<u8>, Option<V>>,
    lo: Bound<Vec<u8>>,
    hi: Bound<Vec<u8>>,
    visit: &mut Visitor<'_, V>,
) -> Result<(), StoreError> {
    let mut disk = tree.range((lo.clone(), hi.clone()));
    let mut over = overlay.range((lo, hi));
    let mut d = disk.next().transpose()?;
    let mut o = over.next();
    loop {
        let take_disk = match (&d, &o) {
            (None, None) => return Ok(()),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((dk, _)), Some((ok, _))) => {
                if dk.as_ref() == ok.as_slice() {
                    // Shadowed by the overlay: drop the stored one and let the overlay speak.
                    d = disk.next().transpose()?;
                    continue;
                }
                dk.as_ref() < ok.as_slice()
            }
        };
        let go_on = if take_disk {
            let Some((k, v)) = d.take() else { return Ok(()) };
            d = disk.next().transpose()?;
            visit(&k, Found::Stored(v))?
        } else {
            let Some((k, v)) = o.take() else { return Ok(()) };
            o = over.next();
            match v {
                Some(v) => visit(k, Found::Changed(v))?,
                None => true,
            }
        };
        if !go_on {
            return Ok(());
        }
    }
}

impl<'a> Overlay<'a> {
    fn new(
        tree: &'a sled::Tree,
        blobs: &'a BlobDir,
        keys: &'a KeyFilter,
        clock: u64,
        quotas: Arc<Quotas>,
        indexes: Option<&'a mut Indexes>,
    ) -> Self {
        Overlay {
            tree,
            blobs,
            keys,
            name_index: 0,
            clock,
            records: BTreeMap::new(),
            quotas,
            quotas_changed: false,
            indexes,
        }
    }

    /// A record as this call sees it: its change (`None` inside: removed), its stored
    /// value, or `None` when the tree does not hold it.
    fn stored(&self, id: &RecordKey) -> Result<Option<Found<'_, Option<Record>>>, StoreError> {
        let enc = id.encode();
        let k = record_key(&enc);
        if let Some(v) = self.records.get(&k) {
            return Ok(Some(Found::Changed(v)));
        }
        if !self.keys.may_contain(&enc) {
            return Ok(None);
        }
        Ok(self.tree.get(&k)?.map(Found::Stored))
    }

    /// A stored value as a whole record, its blob's body read back and checked.
    fn load(&self, what: &str, value: &[u8]) -> Result<Record, StoreError> {
        let (mut rec, blob) = stored::decode(what, value)?;
        if let (Some(b), Some(resp)) = (blob, rec.response.as_mut()) {
            resp.body = self.blobs.read(&b)?;
        }
        Ok(rec)
    }

    /// Writes the call's changes to the tree (the caller holds readers off): a large body
    /// goes to a blob first, a mid-sized one to the open pack, and a replaced or deleted
    /// record's blob is released. `building`: a snapshot build runs, so released blobs must
    /// outlive it. Returns the next free file position of this call (see [`BlobDir::append`]).
    fn write(mut self, building: bool) -> Result<u32, StoreError> {
        let mut n = 0u32;
        let (mut added, mut added_bytes, mut added_packed) = (0u64, 0u64, 0u64);
        let (mut released, mut released_bytes, mut released_packed) = (0u64, 0u64, 0u64);
        for (k, v) in std::mem::take(&mut self.records) {
            let old = match v {
                Some(mut rec) => match self.blobs.placement(&rec) {
                    Some(place) => {
                        let body = rec.response.as_mut().map(|r| std::mem::take(&mut r.body)).unwrap_or_default();
                        let blob = match place {
                            stored::Placement::File => {
                                n += 1;
                                self.blobs.write(self.name_index, n - 1, &body)?
                            }
                            stored::Placement::Pack => self.blobs.append(self.name_index, &mut n, &k, &body)?,
                        };
                        added += 1;
                        added_bytes += blob.len;
                        added_packed += u64::from(blob.at.is_some());
                        self.tree.insert(k, stored::encode_stub(&rec, &blob)?)?
                    }
                    None => self.tree.insert(k, codec::encode(&rec)?)?,
                },
                None => self.tree.remove(k)?,
            };
            if let Some(b) = old.as_deref().and_then(stored::blob_of) {
                self.blobs.release(b, building);
                released += 1;
                released_bytes += b.len;
                released_packed += u64::from(b.at.is_some());
            }
        }
        if let Some(ix) = self.indexes.as_deref_mut() {
            ix.blobs = (ix.blobs + added).saturating_sub(released);
            ix.blob_bytes = (ix.blob_bytes + added_bytes).saturating_sub(released_bytes);
            ix.packed = (ix.packed + added_packed).saturating_sub(released_packed);
        }
        if self.quotas_changed {
            // Quotas are few and change rarely: drop every stored one and write the new set.
            let stored: Vec<sled::IVec> = self.tree.scan_prefix([P_QUOTA]).keys().collect::<Result<_, _>>()?;
            for k in stored {
                self.tree.remove(k)?;
            }
            for (k, v) in quota_entries(&self.quotas) {
                self.tree.insert(k, v)?;
            }
        }
        Ok(n)
    }

    fn indexes(&mut self) -> Result<&mut Indexes, StoreError> {
        self.indexes.as_deref_mut().ok_or_else(|| StoreError::Corrupt {
            what: "state machine read view".into(),
            detail: "the indexes belong to apply; a read view cannot use them".into(),
        })
    }
}

impl StateStore for Overlay<'_> {
    type Error = StoreError;

    fn clock(&self) -> u64 {
        self.clock
    }

    fn set_clock(&mut self, ms: u64) {
        self.clock = ms;
    }

    fn get(&mut self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self.stored(id)? {
            Some(Found::Changed(rec)) => Ok(rec.clone()),
            Some(Found::Stored(v)) => Ok(Some(self.load("record", &v)?)),
            None => Ok(None),
        }
    }

    fn get_without_body(&mut self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self.stored(id)? {
            Some(Found::Changed(rec)) => Ok(rec.clone()),
            Some(Found::Stored(v)) => Ok(Some(stored::decode("record", &v)?.0)),
            None => Ok(None),
        }
    }

    fn put(&mut self, id: &RecordKey, old: Option<&Record>, new: Record) -> Result<(), StoreError> {
        let enc = id.encode();
        if old.is_none() {
            // Before `write` puts it in the tree: see `key_filter`.
            self.keys.insert(&enc);
        }
        let ix = self.indexes()?;
        if let Some(old) = old {
            ix.remove(&enc, old);
        }
        ix.insert(&enc, &new);
        self.records.insert(record_key(&enc), Some(new));
        Ok(())
    }

    fn remove(&mut self, id: &RecordKey, old: &Record) -> Result<(), StoreError> {
        let enc = id.encode();
        self.indexes()?.remove(&enc, old);
        self.records.insert(record_key(&enc), None);
        Ok(())
    }

    fn expired(&mut self, clock_ms: u64, limit: usize) -> Result<Vec<RecordKey>, StoreError> {
        let ix = self.indexes()?;
        ix.by_expiry
            .iter()
            .take_while(|(at, _)| *at <= clock_ms)
            .take(limit)
            .map(|(_, enc)| id_from_index(enc))
            .collect()
    }

    fn tenant_records(&mut self, tenant: &str) -> Result<u64, StoreError> {
        Ok(self.indexes()?.per_tenant.get(tenant).copied().unwrap_or(0))
    }

    fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    fn set_quotas(&mut self, quotas: Quotas) {
        self.quotas = Arc::new(quotas);
        self.quotas_changed = true;
    }

    fn leases_after(&mut self, after_ms: u64) -> Result<Vec<RecordKey>, StoreError> {
        let Some(from) = after_ms.checked_add(1) else { return Ok(Vec::new()) };
        let ix = self.indexes()?;
        ix.by_lease.range((from, Box::<[u8]>::default())..).map(|(_, enc)| id_from_index(enc)).collect()
    }

    fn scan(
        &mut self,
        prefix: &[u8],
        start_after: Option<&RecordKey>,
        visit: &mut dyn FnMut(RecordKey, Record) -> bool,
    ) -> Result<(), StoreError> {
        let full_prefix = record_key(prefix);
        let lo = match start_after.map(|k| record_key(&k.encode())) {
            Some(after) if after >= full_prefix => Bound::Excluded(after),
            _ => Bound::Included(full_prefix.clone()),
        };
        merged(self.tree, &self.records, lo, prefix_end(&full_prefix), &mut |k, found| {
            let id = RecordKey::decode(&k[1..]).ok_or_else(|| StoreError::Corrupt {
                what: "record key".into(),
                detail: format!("{k:?} does not name a valid record"),
            })?;
            let rec = match found {
                Found::Changed(rec) => rec.clone(),
                Found::Stored(v) => self.load("record", &v)?,
            };
            Ok(visit(id, rec))
        })
    }
}

impl StateMachineStore {
    /// `files_from`: see [`BlobDir`].
    pub(crate) fn open(db: &sled::Db, dir: &Path, files_from: Option<usize>) -> Result<Self, StoreError> {
        let sm = db.open_tree("sm")?;
        let snap = db.open_tree("snap")?;
        let meta = read_applied_meta(&sm)?;
        let inner = Arc::new(Inner {
            db: db.clone(),
            db_file: dir.join("db").join("db"),
            sm,
            snap,
            snapshot_dir: dir.join("snapshots"),
            blobs: BlobDir::open(dir.join("blobs"), files_from)?,
            pins: Default::default(),
            clock: AtomicU64::new(meta.clock),
            records: AtomicU64::new(0),
            by_state: Default::default(),
            blob_bytes: AtomicU64::new(0),
            // Built with the indexes, by `recover`.
            keys: KeyFilter::from_keys(std::iter::empty()),
            // The indexes are built by `recover`, from the records or from a snapshot.
            state: Arc::new(Mutex::new(Applied { meta, indexes: Indexes::default() })),
            poisoned: AtomicBool::new(false),
            snapshot_lock: Mutex::new(()),
            read_gate: Arc::new(RwLock::new(())),
            clean: AtomicBool::new(false),
            capture: std::sync::Mutex::new(None),
            seq: AtomicU64::new(0),
        });
        let store = StateMachineStore { inner };
        store.recover()?;
        Ok(store)
    }

    /// Finishes an install that a crash interrupted, and catches the state up with the
    /// current snapshot when the state is behind it; otherwise builds the indexes from the
    /// records. A half-loaded tree is never decoded: it is replaced.
    fn recover(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        let pending: Option<SnapshotMeta> = read_opt(&inner.snap, K_PENDING, "pending snapshot metadata")?;
        let current: Option<SnapshotMeta> = read_opt(&inner.snap, K_CURRENT, "current snapshot metadata")?;
        let applied = read_applied_meta(&inner.sm)?.applied;
        let clean: Option<Option<LogId>> = read_opt(&inner.snap, K_CLEAN, "clean-shutdown mark")?;
        let trusted = clean == Some(applied);
        let reload = match (pending, &current) {
            (Some(p), _) => Some(p),
            (None, Some(c)) if c.last_log_id > applied || !trusted => Some(c.clone()),
            _ => None,
        };
        let mut guard = inner.state.try_lock().map_err(|_| StoreError::Corrupt {
            what: "state machine".into(),
            detail: "apply lock busy while opening".into(),
        })?;
        if let Some(meta) = reload {
            if trusted {
                tracing::warn!(snapshot = %meta.snapshot_id, "state machine is behind its snapshot; reloading it");
            } else {
                tracing::info!(snapshot = %meta.snapshot_id, "no clean shutdown recorded; reloading the state from the newest snapshot, the log replays the rest");
            }
            inner.load_snapshot(&meta, &mut guard)?;
            inner.snap.remove(K_PENDING)?;
            inner.snap.remove(K_CLEAN)?;
            inner.snap.insert(K_CURRENT, codec::encode(&meta)?)?;
            inner.flush_durably()?;
        } else if !trusted && current.is_none() {
            // No snapshot yet, so the log was never purged: it replays everything from the start.
            tracing::info!("no clean shutdown recorded and no snapshot; the log replays the state from the start");
            inner.sm.clear()?;
            inner.blobs.reconcile(None)?;
            inner.snap.remove(K_CLEAN)?;
            inner.flush_durably()?;
            guard.meta = AppliedMeta::default();
            guard.indexes = Indexes::default();
            inner.keys.rebuild(std::iter::empty());
            inner.clock.store(0, Ordering::Release);
        } else {
            // A clean start trusts the tree and would not read the snapshot until a follower
            // or a backup needs it, when a damaged byte would surface mid-transfer (and a read
            // error there stops the leader). Reading it once now refuses the directory at
            // start, naming the file, instead.
            if let Some(meta) = &current {
                inner.verify_snapshot(meta)?;
            }
            let (indexes, named) = Indexes::rebuild(&inner.sm)?;
            inner.keys.rebuild(indexes.keys());
            guard.indexes = indexes;
            let unnamed = inner.blobs.retain(&named)?;
            if unnamed > 0 {
                tracing::info!(
                    blobs = unnamed,
                    "deleted blob files no record names (released before the last shutdown)"
                );
            }
            inner.clean.store(true, Ordering::Release);
        }
        inner.count_records(&guard);
        drop(guard);
        inner.remove_stale_files(None)
    }

    /// Linearizable-read helper for the node: the record's view by the log's clock.
    pub async fn get(&self, id: &RecordKey) -> Result<Option<RecordView>, StoreError> {
        let _reading = self.inner.read_gate.read().await;
        let mut view =
            Overlay::new(&self.inner.sm, &self.inner.blobs, &self.inner.keys, self.clock(), Arc::default(), None);
        machine::get(&mut view, id)
    }

    /// Operator listing: one page of at most `query.limit` records and [`LIST_PAGE_BYTES`].
    ///
    /// A filtered listing may scan far more records than it returns, and apply waits for the
    /// read gate, so the scan holds the gate for 256 stored records at a time and
    /// lets a waiting apply run between chunks, resuming after the last key it scanned.
    /// Each record is read whole and consistent, as of the moment its chunk ran: at or after
    /// the read point, but the records of one page may come from different applied states
    /// (a record changed between chunks shows its newer state).
    pub async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.list_in_chunks(query, LIST_SCAN_CHUNK, LIST_PAGE_BYTES, || async {}).await
    }

    /// [`StateMachineStore::list`] with chunks of `chunk` records, pages of `max_bytes`, and
    /// `between` awaited after each chunk, with the read gate released.
    async fn list_in_chunks<F, Fut>(
        &self,
        query: &ListQuery,
        chunk: usize,
        max_bytes: usize,
        mut between: F,
    ) -> Result<ListPage, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let mut page = machine::PageBuilder::new(query.limit, max_bytes);
        let mut after = query.start_after.clone();
        loop {
            let next = {
                // tokio's RwLock is fair: an apply already waiting for the write side gets the
                // gate before this task's next chunk does.
                let _reading = self.inner.read_gate.read().await;
                let mut view = Overlay::new(
                    &self.inner.sm,
                    &self.inner.blobs,
                    &self.inner.keys,
                    self.clock(),
                    Arc::default(),
                    None,
                );
                machine::list_step(&mut view, query, after.as_ref(), chunk, &mut page)?
            };
            match next {
                Some(key) => after = Some(key),
                None => return Ok(page.finish()),
            }
            between().await;
        }
    }

    /// The state machine's clock (largest applied `now_ms`).
    pub fn clock(&self) -> u64 {
        self.inner.clock.load(Ordering::Acquire)
    }

    /// Last applied log id.
    pub async fn last_applied(&self) -> Option<LogId> {
        self.inner.state.lock().await.meta.applied
    }

    /// Digest of the clock and all records; equal for equal states (see [`StateDigest`]).
    pub async fn digest(&self) -> Result<[u8; 32], StoreError> {
        Ok(self.digest_at().await?.1)
    }

    /// The last applied log index together with the digest of the state it produced, taken
    /// under one lock so a replica comparison never pairs an index with another index's state.
    pub async fn digest_at(&self) -> Result<(u64, [u8; 32]), StoreError> {
        let guard = self.inner.state.lock().await;
        let applied = guard.meta.applied.map(|l| l.index).unwrap_or(0);
        let mut d = StateDigest::new(guard.meta.clock);
        let view = Overlay::new(&self.inner.sm, &self.inner.blobs, &self.inner.keys, 0, Arc::default(), None);
        for kv in self.inner.sm.scan_prefix([P_RECORD]) {
            let (k, v) = kv?;
            if stored::blob_of(&v).is_some() {
                // Blob names differ between replicas: digest the whole record, as stored inline.
                d.add_raw(&k[1..], &codec::encode(&view.load("record", &v)?)?);
            } else {
                d.add_raw(&k[1..], &v);
            }
        }
        d.add_quotas(&guard.meta.quotas);
        Ok((applied, d.finish()))
    }

    /// The quotas in force and the records each tenant holds, as of the last apply: every
    /// tenant that holds records or has a quota of its own, or only `tenant` when given.
    /// Takes the apply lock for the copy (no scan: the counts are kept by apply).
    pub async fn quota_report(&self, tenant: Option<&str>) -> QuotaReport {
        let guard = self.inner.state.lock().await;
        QuotaReport::of(&guard.meta.quotas, &guard.indexes.per_tenant, tenant)
    }

    /// Number of stored records (expired ones included until swept), as of the last apply.
    pub fn record_count(&self) -> usize {
        self.inner.records.load(Ordering::Acquire) as usize
    }

    /// The directory holding this store's snapshot files.
    pub fn snapshot_dir(&self) -> &Path {
        &self.inner.snapshot_dir
    }

    /// Bytes of response bodies kept in blob files and packs (`blobs/`), as of the last
    /// apply; a pack's entry heads and the bodies compaction has not yet dropped are not
    /// counted.
    pub fn blob_bytes(&self) -> u64 {
        self.inner.blob_bytes.load(Ordering::Acquire)
    }

    /// Stored records by state, as of the last apply (no scan, no lock).
    pub fn record_counts(&self) -> RecordCounts {
        let [in_progress, completed, failed] = &self.inner.by_state;
        RecordCounts {
            in_progress: in_progress.load(Ordering::Acquire),
            completed: completed.load(Ordering::Acquire),
            failed: failed.load(Ordering::Acquire),
        }
    }

    /// Makes everything applied so far durable now (sled would within its flush interval).
    /// Also records the state as cleanly shut down (see the module doc): the next open trusts
    /// it, unless an apply comes first.
    pub async fn flush(&self) -> Result<(), StoreError> {
        let guard = self.inner.state.lock().await;
        if lock_capture(&self.inner.capture).is_none() {
            self.inner.blobs.drain();
        }
        let blobs = self.inner.clone();
        tokio::task::spawn_blocking(move || blobs.blobs.sync_all())
            .await
            .map_err(|e| StoreError::io("blob sync task", std::io::Error::other(e.to_string())))??;
        self.inner.flush_durably_async().await?;
        self.inner.snap.insert(K_CLEAN, codec::encode(&guard.meta.applied)?)?;
        self.inner.flush_durably_async().await?;
        self.inner.clean.store(true, Ordering::Release);
        Ok(())
    }

    fn apply_entries(
        &self,
        state: &mut Applied,
        entries: impl IntoIterator<Item = Entry>,
    ) -> Result<Vec<OutcomeBatch>, StoreError> {
        let inner = &self.inner;
        if inner.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::Corrupt {
                what: "state machine".into(),
                detail: "an earlier apply failed half-way, so memory and disk may disagree; restart the node".into(),
            });
        }
        if inner.clean.load(Ordering::Acquire) {
            // Before the first write: a crash from here on must not find the mark.
            inner.snap.remove(K_CLEAN)?;
            inner.flush_durably()?;
            inner.clean.store(false, Ordering::Release);
        }
        let mut next = state.meta.clone();
        let mut replies = Vec::new();
        if let Err(e) = apply_to_tree(inner, &mut state.indexes, &mut next, entries, &mut replies) {
            inner.poisoned.store(true, Ordering::Release);
            return Err(e);
        }
        state.meta = next;
        inner.clock.store(state.meta.clock, Ordering::Release);
        Ok(replies)
    }

    fn new_snapshot_id(&self, applied: Option<LogId>) -> String {
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        match applied {
            Some(l) => format!("{}-{}-{nanos}-{seq}", l.leader_id.term, l.index),
            None => format!("0-0-{nanos}-{seq}"),
        }
    }

    async fn open_snapshot(&self, meta: SnapshotMeta) -> Result<Snapshot<TypeConfig>, StoreError> {
        let path = self.inner.snapshot_path(&meta.snapshot_id);
        let links = self.inner.snapshot_blobs(&meta.snapshot_id);
        if tokio::fs::metadata(&links).await.is_ok_and(|m| m.is_dir()) {
            let stream = BlobStream::pinned(path, links, meta.snapshot_id.clone(), self.inner.pins.clone());
            return Ok(Snapshot { meta, snapshot: Box::new(SnapshotData::Blobs(stream)) });
        }
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| StoreError::io(format!("opening snapshot {}", path.display()), e))?;
        Ok(Snapshot { meta, snapshot: Box::new(SnapshotData::File(file)) })
    }
}

/// Applies entries through an overlay and writes the result, with `next`'s metadata, as one
/// sled batch. On error the indexes may already have changed: the caller poisons the store.
fn apply_to_tree(
    inner: &Inner,
    indexes: &mut Indexes,
    next: &mut AppliedMeta,
    entries: impl IntoIterator<Item = Entry>,
    replies: &mut Vec<OutcomeBatch>,
) -> Result<(), StoreError> {
    let (tree, blobs, keys, capture) = (&inner.sm, &inner.blobs, &inner.keys, &inner.capture);
    let mut view = Overlay::new(tree, blobs, keys, next.clock, next.quotas.clone(), Some(indexes));
    let mut membership_changed = false;
    for entry in entries {
        next.applied = Some(entry.log_id);
        view.name_index = entry.log_id.index;
        match entry.payload {
            EntryPayload::Blank => replies.push(OutcomeBatch::default()),
            EntryPayload::Normal(batch) => {
                replies.push(OutcomeBatch(machine::apply_batch(&mut view, entry.log_id.index, &batch.0)?))
            }
            EntryPayload::Membership(m) => {
                next.membership = StoredMembership::new(Some(entry.log_id), m);
                membership_changed = true;
                replies.push(OutcomeBatch::default());
            }
        }
    }
    next.clock = view.clock;
    next.quotas = view.quotas.clone();
    let building = {
        let mut capture = lock_capture(capture);
        if let Some(capture) = capture.as_mut() {
            for k in view.records.keys() {
                capture.preserve(tree, k)?;
            }
        }
        capture.is_some()
    };
    if !building {
        // A build can only start under the apply lock, which this call holds.
        blobs.drain();
    }
    let name_index = view.name_index;
    let mut n = view.write(building)?;
    if !building {
        // A compaction moves stubs, which a build's copy-on-write view does not follow.
        blobs.compact(tree, name_index, &mut n, COMPACT_STEP)?;
    }
    if keys.is_full() {
        // The tree now holds exactly the indexed keys.
        keys.rebuild(indexes.keys());
    }
    tree.insert(K_APPLIED, codec::encode(&next.applied)?)?;
    // Membership changes rarely; rewriting it with every apply was a sled page update each.
    if membership_changed {
        tree.insert(K_MEMBERSHIP, codec::encode(&next.membership)?)?;
    }
    tree.insert(K_CLOCK, &next.clock.to_be_bytes())?;
    Ok(())
}

/// What a received snapshot is read through, whichever kind it is.
trait ReadSeek: std::io::Read + std::io::Seek {}
impl<T: std::io::Read + std::io::Seek> ReadSeek for T {}

type SnapshotFileWriter = Writer<std::io::BufWriter<std::fs::File>>;

fn create_snapshot_file(
    path: &Path,
    meta: &SnapshotMeta,
    clock: u64,
    quotas: &Quotas,
    stubs: Stubs,
) -> Result<SnapshotFileWriter, StoreError> {
    let file =
        std::fs::File::create(path).map_err(|e| StoreError::io(format!("creating snapshot {}", path.display()), e))?;
    Writer::new(
        std::io::BufWriter::with_capacity(256 * 1024, file),
        format!("snapshot {}", path.display()),
        meta,
        clock,
        quotas,
        stubs,
    )
}

/// The stored form of the quotas: key and value of each.
fn quota_entries(quotas: &Quotas) -> Vec<(sled::IVec, sled::IVec)> {
    let mut out = Vec::new();
    if let Some(max) = quotas.default {
        out.push(((&[P_QUOTA][..]).into(), max.to_be_bytes().as_slice().into()));
    }
    for (tenant, max) in &quotas.tenants {
        let mut k = Vec::with_capacity(tenant.len() + 1);
        k.push(P_QUOTA);
        k.extend_from_slice(tenant.as_bytes());
        out.push((k.into(), max.to_be_bytes().as_slice().into()));
    }
    out
}

fn read_quotas(sm: &sled::Tree) -> Result<Quotas, StoreError> {
    let mut quotas = Quotas::default();
    for kv in sm.scan_prefix([P_QUOTA]) {
        let (k, v) = kv?;
        let max = u64::from_be_bytes(v.as_ref().try_into().map_err(|_| StoreError::Corrupt {
            what: "stored quota".into(),
            detail: format!("{} bytes, expected 8", v.len()),
        })?);
        let tenant = std::str::from_utf8(&k[1..])
            .ok()
            .filter(|t| t.is_empty() || crate::validate::tenant(t).is_ok())
            .ok_or_else(|| StoreError::Corrupt {
            what: "stored quota".into(),
            detail: format!("{k:?} does not name a valid tenant"),
        })?;
        quotas.set((!tenant.is_empty()).then_some(tenant), Some(max));
    }
    Ok(quotas)
}

/// Completes the stream and fsyncs the file (the caller renames it into place).
fn finish_snapshot_file(w: SnapshotFileWriter, path: &Path) -> Result<(), StoreError> {
    let file = w
        .finish()?
        .into_inner()
        .map_err(|e| StoreError::io(format!("writing snapshot {}", path.display()), e.into_error()))?;
    if crate::planted::active(crate::planted::Bug::UnsyncedSnapshot) {
        return Ok(());
    }
    file.sync_all().map_err(|e| StoreError::io(format!("syncing snapshot {}", path.display()), e))
}

fn read_opt<T: serde::de::DeserializeOwned>(
    tree: &sled::Tree,
    key: &[u8],
    what: &str,
) -> Result<Option<T>, StoreError> {
    match tree.get(key)? {
        Some(v) => Ok(Some(codec::decode(what, &v)?)),
        None => Ok(None),
    }
}

fn read_applied_meta(sm: &sled::Tree) -> Result<AppliedMeta, StoreError> {
    let clock = match sm.get(K_CLOCK)? {
        Some(v) => u64::from_be_bytes(v.as_ref().try_into().map_err(|_| StoreError::Corrupt {
            what: "state machine clock".into(),
            detail: format!("{} bytes, expected 8", v.len()),
        })?),
        None => 0,
    };
    Ok(AppliedMeta {
        applied: read_opt::<Option<LogId>>(sm, K_APPLIED, "last applied log id")?.flatten(),
        membership: read_opt(sm, K_MEMBERSHIP, "last membership")?.unwrap_or_default(),
        clock,
        quotas: Arc::new(read_quotas(sm)?),
    })
}

impl Inner {
    fn snapshot_path(&self, id: &str) -> PathBuf {
        self.snapshot_dir.join(format!("{id}.snap"))
    }

    /// The directory of hard links to the blobs a snapshot's records name (format 3 only).
    fn snapshot_blobs(&self, id: &str) -> PathBuf {
        self.snapshot_dir.join(format!("{id}.blobs"))
    }

    /// Streams the state as of the start of the build to a new snapshot file, while apply
    /// goes on, and links the blobs its records name beside it. The caller started the
    /// [`Capture`] under the apply lock; `stubs`: the stubs the state held then.
    fn write_snapshot(&self, meta: &SnapshotMeta, clock: u64, quotas: &Quotas, stubs: Stubs) -> Result<(), StoreError> {
        let path = self.snapshot_path(&meta.snapshot_id);
        let tmp = path.with_extension("snap.tmp");
        let links = self.snapshot_blobs(&meta.snapshot_id).with_extension("blobs.tmp");
        let blobs = stubs != Stubs::None;
        if blobs {
            std::fs::create_dir_all(&links).map_err(|e| StoreError::io(format!("creating {}", links.display()), e))?;
        }
        let started = std::time::Instant::now();
        let mut w = create_snapshot_file(&tmp, meta, clock, quotas, stubs)?;
        // A pack is named by many records: link it once.
        let mut linked = BTreeSet::new();
        let mut synced = 0usize;
        let mut put = |w: &mut SnapshotFileWriter, k: &[u8], v: &[u8]| -> Result<(), StoreError> {
            if let Some(b) = stored::blob_of(v) {
                let kind = if b.at.is_some() { Stubs::Packs } else { Stubs::Blobs };
                if kind > stubs {
                    return Err(StoreError::Corrupt {
                        what: "snapshot build".into(),
                        detail: "a stub appeared of a kind the state held none of when the build started".into(),
                    });
                }
                if linked.insert((b.index, b.n)) && self.blobs.link_into(&b, &links)? {
                    synced += 1;
                }
            }
            w.record(k, v)
        };
        let no_capture = || StoreError::Corrupt {
            what: "snapshot build".into(),
            detail: "the copy-on-write capture was stopped while the build ran".into(),
        };
        let mut out = Vec::new();
        for kv in self.sm.scan_prefix([P_RECORD]) {
            let (k, v) = kv?;
            lock_capture(&self.capture).as_mut().ok_or_else(no_capture)?.pass(&k, v, &mut out);
            for (k, v) in out.drain(..) {
                put(&mut w, &k[1..], &v)?;
            }
        }
        lock_capture(&self.capture).as_mut().ok_or_else(no_capture)?.drain_below(&[0xFF; 2], &mut out);
        for (k, v) in out.drain(..) {
            put(&mut w, &k[1..], &v)?;
        }
        let records = w.records();
        finish_snapshot_file(w, &tmp)?;
        if blobs {
            self.commit_links(&links, &self.snapshot_blobs(&meta.snapshot_id))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| StoreError::io(format!("renaming to {}", path.display()), e))?;
        sync_dir(&path)?;
        // What a build cost: with large bodies its time goes to the fsyncs of the blobs
        // written since the last one.
        tracing::info!(
            snapshot = %meta.snapshot_id,
            records,
            blobs_linked = linked.len(),
            blobs_synced = synced,
            ms = started.elapsed().as_millis() as u64,
            "built a snapshot"
        );
        Ok(())
    }

    /// Makes a filled snapshot blob directory durable under its final name (before the
    /// snapshot file that needs it is renamed into place).
    fn commit_links(&self, links: &Path, to: &Path) -> Result<(), StoreError> {
        std::fs::File::open(links)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::io(format!("syncing {}", links.display()), e))?;
        if to.exists() {
            std::fs::remove_dir_all(to).map_err(|e| StoreError::io(format!("replacing {}", to.display()), e))?;
        }
        std::fs::rename(links, to).map_err(|e| StoreError::io(format!("renaming to {}", to.display()), e))?;
        sync_dir(to)
    }

    /// Replaces the whole state with the snapshot file's. The caller holds the apply lock.
    /// Makes every sled write so far durable. sled's own flush writes its buffers with
    /// `sync_file_range`, which neither flushes the device's write cache nor makes a grown
    /// file's new size durable, and fsyncs only from its background thread, every half second:
    /// a power loss can take back a flush that returned. Whatever the store does on the
    /// strength of a flush (delete an older snapshot, let the log be purged, trust a
    /// clean-shutdown mark) waits for this instead: sled's flush, then an fsync of its file.
    fn flush_durably(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        std::fs::File::open(&self.db_file)
            .and_then(|f| f.sync_all())
            .map_err(|e| StoreError::io(format!("fsync of {}", self.db_file.display()), e))
    }

    /// [`Inner::flush_durably`] off the async threads.
    async fn flush_durably_async(self: &Arc<Self>) -> Result<(), StoreError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.flush_durably())
            .await
            .map_err(|e| StoreError::io("flush task", std::io::Error::other(e.to_string())))?
    }

    /// Reads the snapshot's records to the end, which checks its structure and its SHA-256;
    /// the blob section is checked where each body is read.
    fn verify_snapshot(&self, meta: &SnapshotMeta) -> Result<(), StoreError> {
        let path = self.snapshot_path(&meta.snapshot_id);
        let file = std::fs::File::open(&path)
            .map_err(|e| StoreError::io(format!("opening snapshot {}", path.display()), e))?;
        let (mut reader, _, _) = Reader::new(file, format!("snapshot {}", path.display()))?;
        while reader.next_record()?.is_some() {}
        Ok(())
    }

    fn load_snapshot(&self, meta: &SnapshotMeta, state: &mut Applied) -> Result<(), StoreError> {
        // From the first deletion on, memory and disk disagree until the load completes.
        self.poisoned.store(true, Ordering::Release);
        let path = self.snapshot_path(&meta.snapshot_id);
        let file = std::fs::File::open(&path)
            .map_err(|e| StoreError::io(format!("opening snapshot {}", path.display()), e))?;
        let (mut reader, _, clock) = Reader::new(file, format!("snapshot {}", path.display()))?;
        self.sm.clear()?;
        let mut indexes = Indexes::default();
        let mut batch = sled::Batch::default();
        let mut in_batch = 0;
        let links = self.snapshot_blobs(&meta.snapshot_id);
        self.blobs.reconcile(links.is_dir().then_some(links.as_path()))?;
        let mut named = Named::new();
        while let Some(r) = reader.next_record()? {
            indexes.insert(&r.key, &r.record);
            if let Some(b) = r.blob {
                indexes.add_blob(&b, &mut named);
            }
            batch.insert(record_key(&r.key), r.value);
            in_batch += 1;
            if in_batch == LOAD_BATCH {
                self.sm.apply_batch(std::mem::take(&mut batch))?;
                in_batch = 0;
            }
        }
        let next = AppliedMeta {
            applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            clock,
            quotas: Arc::new(reader.quotas().clone()),
        };
        for (k, v) in quota_entries(&next.quotas) {
            batch.insert(k, v);
        }
        batch.insert(K_APPLIED, codec::encode(&next.applied)?);
        batch.insert(K_MEMBERSHIP, codec::encode(&next.membership)?);
        batch.insert(K_CLOCK, &next.clock.to_be_bytes());
        self.sm.apply_batch(batch)?;
        self.blobs.adopt(&named)?;
        self.keys.rebuild(indexes.keys());
        *state = Applied { meta: next, indexes };
        self.clock.store(clock, Ordering::Release);
        self.poisoned.store(false, Ordering::Release);
        Ok(())
    }

    /// Frees the blocks of bodies released before capture `captured` (see
    /// [`BlobDir::punch`]) when snapshot `id`, that capture's, is the only one left: no
    /// older snapshot is still being sent or read, and no install is pending. Otherwise the
    /// ranges wait for a later build. The caller holds the snapshot lock.
    async fn punch_released(self: &Arc<Self>, id: &str, captured: u64) {
        let others = crate::blob_stream::lock_pins(&self.pins).keys().any(|p| p != id);
        let pending = !matches!(self.snap.contains_key(K_PENDING), Ok(false));
        if others || pending {
            return;
        }
        let me = self.clone();
        let started = std::time::Instant::now();
        if let Ok((holes, bytes)) = tokio::task::spawn_blocking(move || me.blobs.punch(captured)).await {
            // Beside the build's own line: the disk a build gave back, which `du` shows and
            // a pack's length does not.
            if holes > 0 {
                tracing::info!(
                    holes,
                    bytes,
                    ms = started.elapsed().as_millis() as u64,
                    "freed released bodies in packs"
                );
            }
        }
    }

    /// Deletes snapshot files other than `keep`, and leftovers of interrupted writes.
    fn remove_stale_files(&self, keep: Option<&str>) -> Result<(), StoreError> {
        let current: Option<SnapshotMeta> = read_opt(&self.snap, K_CURRENT, "current snapshot metadata")?;
        let pending: Option<SnapshotMeta> = read_opt(&self.snap, K_PENDING, "pending snapshot metadata")?;
        let wanted: Vec<String> =
            [keep.map(str::to_string), current.map(|m| m.snapshot_id), pending.map(|m| m.snapshot_id)]
                .into_iter()
                .flatten()
                .chain(crate::blob_stream::lock_pins(&self.pins).keys().cloned())
                .flat_map(|id| [format!("{id}.snap"), format!("{id}.blobs")])
                .collect();
        let entries = std::fs::read_dir(&self.snapshot_dir)
            .map_err(|e| StoreError::io(format!("listing {}", self.snapshot_dir.display()), e))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = name.ends_with(".tmp")
                || ((name.ends_with(".snap") || name.ends_with(".blobs")) && !wanted.contains(&name));
            if stale {
                let path = entry.path();
                let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
                if let Err(e) = removed {
                    tracing::warn!(file = %entry.path().display(), error = %e, "could not delete an old snapshot file");
                }
            }
        }
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let inner = self.inner.clone();
        let _persisting = inner.snapshot_lock.lock().await;
        // The only moment apply waits: note where the state is and start capturing.
        let (meta, clock, quotas, stubs, captured) = {
            let guard = inner.state.lock().await;
            *lock_capture(&inner.capture) = Some(Capture::default());
            let captured = inner.blobs.seal();
            let meta = SnapshotMeta {
                last_log_id: guard.meta.applied,
                last_membership: guard.meta.membership.clone(),
                snapshot_id: self.new_snapshot_id(guard.meta.applied),
            };
            (meta, guard.meta.clock, guard.meta.quotas.clone(), guard.indexes.stubs(), captured)
        };
        let writer = inner.clone();
        let written = meta.clone();
        tokio::task::spawn_blocking(move || {
            /// Stops the capture however the build ends, panics included.
            struct StopCapture<'a>(&'a Inner);
            impl Drop for StopCapture<'_> {
                fn drop(&mut self) {
                    *lock_capture(&self.0.capture) = None;
                }
            }
            let _stop = StopCapture(&writer);
            writer.write_snapshot(&written, clock, &quotas, stubs)
        })
        .await
        .map_err(|e| sto_snapshot(StoreError::io("snapshot task", std::io::Error::other(e.to_string()))))?
        .map_err(sto_snapshot)?;

        let current: Option<SnapshotMeta> =
            read_opt(&inner.snap, K_CURRENT, "current snapshot metadata").map_err(sto_snapshot)?;
        if let Some(current) = current.filter(|c| c.last_log_id > meta.last_log_id) {
            // A newer snapshot was installed meanwhile: keep it, drop ours.
            inner.remove_stale_files(None).map_err(sto_snapshot)?;
            return self.open_snapshot(current).await.map_err(sto_snapshot);
        }
        inner.snap.insert(K_CURRENT, codec::encode(&meta).map_err(sto_snapshot)?).map_err(sto_snapshot)?;
        inner.flush_durably_async().await.map_err(sto_snapshot)?;
        inner.remove_stale_files(Some(&meta.snapshot_id)).map_err(sto_snapshot)?;
        inner.punch_released(&meta.snapshot_id, captured).await;
        self.open_snapshot(meta).await.map_err(sto_snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError<u64>> {
        let guard = self.inner.state.lock().await;
        Ok((guard.meta.applied, guard.meta.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<OutcomeBatch>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut guard = self.inner.state.lock().await;
        // The writes of one apply are not one sled batch (see the module doc): readers wait,
        // so none sees half of it. Same order as an install: apply lock, then the gate.
        let no_readers = self.inner.read_gate.write().await;
        let outcomes = self.apply_entries(&mut guard, entries).map_err(sto_apply);
        drop(no_readers);
        self.inner.count_records(&guard);
        outcomes
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError<u64>> {
        let seq = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        let path = self.inner.snapshot_dir.join(format!("incoming-{seq}-{}.tmp", std::process::id()));
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await
            .map_err(|e| sto_snapshot(StoreError::io(format!("creating {}", path.display()), e)))?;
        Ok(Box::new(SnapshotData::File(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError<u64>> {
        let inner = self.inner.clone();
        let _persisting = inner.snapshot_lock.lock().await;
        let received: Box<dyn ReadSeek + Send> = match *snapshot {
            SnapshotData::File(mut file) => {
                tokio::io::AsyncWriteExt::flush(&mut file)
                    .await
                    .map_err(|e| sto_snapshot(StoreError::io("flushing received snapshot", e)))?;
                Box::new(file.into_std().await)
            }
            SnapshotData::Memory(bytes) => Box::new(bytes),
            SnapshotData::Blobs(stream) => Box::new(stream),
        };

        // 1. Verify the received bytes while copying them into our own durable file.
        let copier = inner.clone();
        let meta_copy = meta.clone();
        tokio::task::spawn_blocking(move || copier.persist_received(received, &meta_copy))
            .await
            .map_err(|e| sto_snapshot(StoreError::io("snapshot task", std::io::Error::other(e.to_string()))))?
            .map_err(sto_snapshot)?;

        // 2. Mark the install as pending, durably, before touching the state.
        inner.snap.insert(K_PENDING, codec::encode(meta).map_err(sto_snapshot)?).map_err(sto_snapshot)?;
        inner.flush_durably_async().await.map_err(sto_snapshot)?;

        // 3. Replace the state under the apply lock, with readers held off.
        let mut guard = inner.state.clone().lock_owned().await;
        let no_readers = inner.read_gate.clone().write_owned().await;
        let loader = inner.clone();
        let meta_load = meta.clone();
        tokio::task::spawn_blocking(move || {
            let loaded = loader.load_snapshot(&meta_load, &mut guard);
            loader.count_records(&guard);
            drop(no_readers);
            loaded
        })
        .await
        .map_err(|e| sto_snapshot(StoreError::io("snapshot task", std::io::Error::other(e.to_string()))))?
        .map_err(sto_snapshot)?;

        // 4. Make it current and durable, then forget older snapshots.
        let mut batch = sled::Batch::default();
        batch.insert(K_CURRENT, codec::encode(meta).map_err(sto_snapshot)?);
        batch.remove(K_PENDING);
        inner.snap.apply_batch(batch).map_err(sto_snapshot)?;
        inner.flush_durably_async().await.map_err(sto_snapshot)?;
        // Worth an operator's attention: a node only installs a snapshot when it fell far behind.
        tracing::info!(snapshot = %meta.snapshot_id, last_log_id = ?meta.last_log_id, "installed a snapshot from the leader");
        inner.remove_stale_files(Some(&meta.snapshot_id)).map_err(sto_snapshot)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let current: Option<SnapshotMeta> =
            read_opt(&self.inner.snap, K_CURRENT, "current snapshot metadata").map_err(sto_read)?;
        match current {
            Some(meta) => Ok(Some(self.open_snapshot(meta).await.map_err(sto_read)?)),
            None => Ok(None),
        }
    }
}

impl Inner {
    /// Every record has exactly one entry in the expiry index.
    fn count_records(&self, state: &Applied) {
        self.records.store(state.indexes.by_expiry.len() as u64, Ordering::Release);
        self.blob_bytes.store(state.indexes.blob_bytes, Ordering::Release);
        let c = state.indexes.counts;
        for (slot, n) in self.by_state.iter().zip([c.in_progress, c.completed, c.failed]) {
            slot.store(n, Ordering::Release);
        }
    }

    /// Reads a received snapshot from its start, checks it, and writes it as our own file
    /// named by `meta`, fsynced.
    fn persist_received(&self, mut received: Box<dyn ReadSeek + Send>, meta: &SnapshotMeta) -> Result<(), StoreError> {
        received.seek(std::io::SeekFrom::Start(0)).map_err(|e| StoreError::io("rewinding received snapshot", e))?;
        let (mut reader, clock) = Reader::received(received, meta)?;
        let path = self.snapshot_path(&meta.snapshot_id);
        let tmp = path.with_extension("snap.tmp");
        let quotas = reader.quotas().clone();
        let blobs = reader.has_blobs();
        let links = self.snapshot_blobs(&meta.snapshot_id).with_extension("blobs.tmp");
        let mut writer = create_snapshot_file(&tmp, meta, clock, &quotas, reader.stubs())?;
        // Reading checks every record (see `Reader::next_record`) and every blob before the
        // old state is touched; only a snapshot that will load completely gets as far as
        // `pending`.
        let copied = (|| {
            let mut wanted = Wanted::default();
            while let Some(r) = reader.next_record()? {
                if let Some(b) = r.blob {
                    wanted.add(b, ());
                }
                writer.record(&r.key, &r.value)?;
            }
            finish_snapshot_file(writer, &tmp)?;
            if blobs {
                receive_blobs(&mut reader, wanted, &links)?;
                self.commit_links(&links, &self.snapshot_blobs(&meta.snapshot_id))?;
            } else {
                reader.blobs(|_, _, _, _| Ok(()))?;
            }
            Ok::<(), StoreError>(())
        })();
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_dir_all(&links);
            return Err(e);
        }
        std::fs::rename(&tmp, &path).map_err(|e| StoreError::io(format!("renaming to {}", path.display()), e))?;
        sync_dir(&path)
    }
}

/// Reads a received snapshot's blob section into `dir`: each file must be one the records
/// name, holding every body they expect in it with the length and CRC their stubs give, and
/// every named file must arrive. Each file is fsynced; the caller syncs the directory.
fn receive_blobs<R: std::io::Read>(reader: &mut Reader<R>, mut wanted: Wanted, dir: &Path) -> Result<(), StoreError> {
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io(format!("creating {}", dir.display()), e))?;
    let what = format!("received snapshot blobs in {}", dir.display());
    reader.blobs(|index, n, len, body| {
        let (bytes, _) = wanted.take(index, n, len, body, &what)?;
        let path = dir.join(BlobRef::name(index, n).file_name());
        std::fs::File::create(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes).and_then(|()| f.sync_all()))
            .map_err(|e| StoreError::io(format!("writing {}", path.display()), e))
    })?;
    wanted.finish(&what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_lays_the_overlay_over_the_tree_in_key_order() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("t").unwrap();
        for k in ["a", "c", "e", "g"] {
            tree.insert(k, k.to_uppercase().as_bytes()).unwrap();
        }
        let mut overlay: BTreeMap<Vec<u8>, Option<&str>> = BTreeMap::new();
        overlay.insert(b"b".to_vec(), Some("b*")); // new
        overlay.insert(b"c".to_vec(), Some("c*")); // changed
        overlay.insert(b"e".to_vec(), None); // deleted
        overlay.insert(b"h".to_vec(), Some("h*")); // new, after the tree's last key
        let mut seen = Vec::new();
        merged(&tree, &overlay, Bound::Unbounded, Bound::Unbounded, &mut |k, found| {
            let v = match found {
                Found::Changed(v) => v.to_string(),
                Found::Stored(v) => String::from_utf8(v.to_vec()).unwrap(),
            };
            seen.push(format!("{}={v}", String::from_utf8_lossy(k)));
            Ok(true)
        })
        .unwrap();
        assert_eq!(seen, ["a=A", "b=b*", "c=c*", "g=G", "h=h*"]);

        let mut first_two = Vec::new();
        merged(&tree, &overlay, Bound::Excluded(b"a".to_vec()), Bound::Unbounded, &mut |k, _| {
            first_two.push(k.to_vec());
            Ok(first_two.len() < 2)
        })
        .unwrap();
        assert_eq!(first_two, [b"b".to_vec(), b"c".to_vec()]);
    }

    #[test]
    fn prefix_end_is_the_first_key_past_the_prefix() {
        assert_eq!(prefix_end(b"ab\x00"), Bound::Excluded(b"ab\x01".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Bound::Excluded(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), Bound::Unbounded);
    }

    fn claims(index: u64, keys: impl IntoIterator<Item = u64>) -> Entry {
        use crate::types::{Command, Op};
        let cmds = keys
            .into_iter()
            .map(|k| Command {
                now_ms: 1_700_000_000_000,
                op: Op::Claim {
                    id: RecordKey::new("default", "bulk", format!("key-{k:016}")).unwrap(),
                    fingerprint: None,
                    owner: "w".into(),
                    lease_ms: 60_000,
                    ttl_ms: 86_400_000,
                    allow_takeover: false,
                },
            })
            .collect();
        Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(crate::raft::CommandBatch(cmds)),
        }
    }

    /// The key filter fills several times over (its test capacity is 256 keys) and apply
    /// rebuilds it each time: every stored record is still found, by apply (a second claim
    /// on each key meets the first) and by a read, and a key never stored is not.
    #[tokio::test]
    async fn records_stay_found_across_rebuilds_of_the_key_filter() {
        let dir = tempfile::TempDir::new().unwrap();
        let (_log, mut sm) = crate::open(&dir.path().join("d")).unwrap();
        let keys: Vec<u64> = (0..2_000).collect();
        let mut index = 0;
        let mut first = Vec::new();
        for batch in keys.chunks(100) {
            index += 1;
            let replies = sm.apply(vec![claims(index, batch.iter().copied())]).await.unwrap();
            first.extend(replies[0].0.iter().cloned());
        }
        assert!(sm.inner.keys.capacity() >= 2_000, "the filter was never rebuilt larger");
        let mut again = Vec::new();
        for batch in keys.chunks(500) {
            index += 1;
            let replies = sm.apply(vec![claims(index, batch.iter().copied())]).await.unwrap();
            again.extend(replies[0].0.iter().cloned());
        }
        // The same owner claiming again gets its grant back; a lost key would be a new grant.
        assert_eq!(again, first);
        for k in [0, 999, 1_999] {
            let id = RecordKey::new("default", "bulk", format!("key-{k:016}")).unwrap();
            assert!(sm.get(&id).await.unwrap().is_some(), "key {k} not found");
        }
        let never = RecordKey::new("default", "bulk", format!("key-{:016}", 5_000)).unwrap();
        assert!(sm.get(&never).await.unwrap().is_none());
    }

    /// A long List holds the read gate one chunk at a time: with the scan paused between two
    /// chunks, an apply (which needs the gate alone) runs to completion, and the rest of the
    /// scan sees what it wrote.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_apply_runs_between_the_chunks_of_a_long_list() {
        let dir = tempfile::TempDir::new().unwrap();
        let (_log, mut sm) = crate::open(&dir.path().join("d")).unwrap();
        // Even keys 0..2000: the scan has 1000 records to go through, in 10 chunks of 100.
        let evens: Vec<u64> = (0..2_000).step_by(2).collect();
        for (i, batch) in evens.chunks(250).enumerate() {
            sm.apply(vec![claims(i as u64 + 1, batch.iter().copied())]).await.unwrap();
        }

        let (paused_tx, paused_rx) = tokio::sync::oneshot::channel::<()>();
        let (resume_tx, resume_rx) = tokio::sync::oneshot::channel::<()>();
        let mut hook = Some((paused_tx, resume_rx));
        let lister = sm.clone();
        let query = ListQuery { tenant: "default".into(), limit: 5_000, ..Default::default() };
        let listing = tokio::spawn(async move {
            lister
                .list_in_chunks(&query, 100, LIST_PAGE_BYTES, move || {
                    let pause = hook.take();
                    async move {
                        if let Some((paused, resume)) = pause {
                            let _ = paused.send(());
                            let _ = resume.await;
                        }
                    }
                })
                .await
        });
        paused_rx.await.unwrap();
        // The scan has read its first chunk (keys 0..200) and waits. An apply that needed the
        // gate for the whole scan would wait for ever: the timeout only turns that into a
        // failure instead of a hang.
        let odd_late = claims(100, [1_501]);
        let odd_early = claims(101, [101]);
        tokio::time::timeout(std::time::Duration::from_secs(10), sm.apply(vec![odd_late, odd_early]))
            .await
            .expect("apply waited for the whole List scan")
            .unwrap();
        resume_tx.send(()).unwrap();
        let page = listing.await.unwrap().unwrap();
        let keys: Vec<String> = page.records.iter().map(|v| v.id.key().to_string()).collect();
        // After the pause the scan resumed after its last key: it sees the new record ahead of
        // it, not the one behind it, and no record twice.
        assert_eq!(keys.len(), 1_001, "{:?}", &keys[..5]);
        assert!(keys.contains(&format!("key-{:016}", 1_501)));
        assert!(!keys.contains(&format!("key-{:016}", 101)));
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "not in key order, or a record twice");
        assert_eq!(page.next_after, None, "the whole listing fits one page");
    }
}
