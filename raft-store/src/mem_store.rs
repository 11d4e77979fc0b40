//! openraft storage held entirely in memory: the same rules ([`crate::machine`]) and snapshot
//! format as the sled store, with no files, no fsync and no threads of its own.
//!
//! It exists so the node can run where sled cannot: under a deterministic network simulator,
//! whose clock does not see sled's IO threads, and in fast tests of the node. Nothing in it is
//! durable; a node that must survive a restart uses [`crate::open`].
//!
//! For the simulator the log can model a disk that flushes later than it writes
//! ([`MemLogStore::with_flush_lag`]): an append is reported flushed only after a delay, by one
//! flush that covers every append waiting for it, and [`MemLogStore::lose_unflushed`] drops
//! what no flush covered yet,
//! as a power loss would. A leader replicates entries while its own flush of them runs, so
//! this is what a restarted leader may come back without.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{EntryPayload, OptionalSend, RaftLogReader, RaftSnapshotBuilder, StorageError, Vote};
use tokio::io::AsyncReadExt;

use crate::error::{sto_snapshot, StoreError};
use crate::machine::{self, StateStore};
use crate::raft::{Entry, LogId, OutcomeBatch, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use crate::snapshot::{Reader, Stubs, Wanted, Writer};
use crate::types::{ListPage, ListQuery, Record, RecordKey, RecordView, LIST_PAGE_BYTES};
use crate::{codec, MemState};

/// A poisoned lock only means another thread panicked mid-call; the data is plain memory, so
/// carry on rather than turn one panic into many.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Default)]
struct MemLog {
    vote: Option<Vote<u64>>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    entries: BTreeMap<u64, Entry>,
    /// Entries up to this index are flushed (with a flush lag; without, all are).
    flushed: u64,
    /// When the flush under way ends.
    busy_until: Option<tokio::time::Instant>,
    /// The appends waiting for the next flush, which covers them all.
    queued: Option<QueuedFlush>,
    /// The last index the flush under way covers; a truncation lowers it (what the flush
    /// wrote there is gone, and what is there now came later).
    writing: Option<u64>,
    /// Bumped by a power loss: flushes queued or under way before it never finish.
    power_cycles: u64,
}

impl MemLog {
    /// The last log id, or the purge point of an empty log.
    fn last(&self) -> Option<LogId> {
        self.entries.last_key_value().map(|(_, e)| e.log_id).or(self.purged)
    }
}

/// Appends that one flush will cover, and whom to tell when it ends.
struct QueuedFlush {
    upto: u64,
    callbacks: Vec<LogFlushed<TypeConfig>>,
}

/// The Raft log in memory. Clones share the same log.
#[derive(Clone, Default)]
pub struct MemLogStore {
    inner: Arc<Mutex<MemLog>>,
    flush_lag: Option<std::time::Duration>,
}

impl MemLogStore {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty log on a disk whose every flush takes `lag` (on the tokio clock): an append
    /// waits for the flush under way to end, then for one flush that covers every append
    /// waiting with it (a group commit), and is reported to openraft only then.
    pub fn with_flush_lag(lag: std::time::Duration) -> Self {
        MemLogStore { inner: Arc::default(), flush_lag: Some(lag) }
    }

    /// A power loss: drops the entries no flush has covered yet and the flushes still queued,
    /// and clips the saved commit index to what is left.
    pub fn lose_unflushed(&self) {
        let mut log = lock(&self.inner);
        log.power_cycles += 1;
        log.busy_until = None;
        log.queued = None;
        log.writing = None;
        let keep_upto = log.flushed;
        log.entries.split_off(&(keep_upto + 1));
        let last = log.last();
        if log.committed > last {
            log.committed = last;
        }
    }

    /// The last log id, or the purge point of an empty log.
    pub fn last_log_id(&self) -> Option<LogId> {
        lock(&self.inner).last()
    }

    /// Bytes of the entries after `index`, as the log in segment files would frame them.
    pub fn bytes_after(&self, index: u64) -> u64 {
        let log = lock(&self.inner);
        log.entries
            .range(index.saturating_add(1)..)
            .map(|(_, e)| crate::codec::encode(e).map(|b| b.len() as u64 + 9).unwrap_or(0))
            .sum()
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        Ok(lock(&self.inner).entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = MemLogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let log = lock(&self.inner);
        Ok(LogState { last_purged_log_id: log.purged, last_log_id: log.last() })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        lock(&self.inner).vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(lock(&self.inner).vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError<u64>> {
        lock(&self.inner).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<u64>> {
        Ok(lock(&self.inner).committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut log = lock(&self.inner);
        let mut upto = log.flushed;
        for e in entries {
            upto = e.log_id.index;
            log.entries.insert(e.log_id.index, e);
        }
        let Some(lag) = self.flush_lag else {
            log.flushed = upto;
            drop(log);
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        if let Some(q) = log.queued.as_mut() {
            q.upto = upto;
            q.callbacks.push(callback);
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        let starts = log.busy_until.map_or(now, |t| t.max(now));
        log.queued = Some(QueuedFlush { upto, callbacks: vec![callback] });
        let cycle = log.power_cycles;
        drop(log);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(starts).await;
            let (callbacks, ends) = {
                let mut log = lock(&inner);
                if log.power_cycles != cycle {
                    return;
                }
                let Some(batch) = log.queued.take() else { return };
                // It writes what is there now: a truncation since an append removed some.
                log.writing = Some(batch.upto.min(log.entries.last_key_value().map_or(0, |(i, _)| *i)));
                let ends = tokio::time::Instant::now() + lag;
                log.busy_until = Some(ends);
                (batch.callbacks, ends)
            };
            tokio::time::sleep_until(ends).await;
            {
                let mut log = lock(&inner);
                if log.power_cycles != cycle {
                    return;
                }
                if let Some(covered) = log.writing.take() {
                    log.flushed = log.flushed.max(covered);
                }
            }
            for callback in callbacks {
                callback.log_io_completed(Ok(()));
            }
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        let mut log = lock(&self.inner);
        log.entries.split_off(&log_id.index);
        let before = log_id.index.saturating_sub(1);
        log.flushed = log.flushed.min(before);
        if let Some(w) = log.writing.as_mut() {
            *w = (*w).min(before);
        }
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        let mut log = lock(&self.inner);
        log.purged = Some(log_id);
        log.entries = log.entries.split_off(&(log_id.index + 1));
        Ok(())
    }
}

#[derive(Default)]
struct MemSm {
    state: MemState,
    applied: Option<LogId>,
    membership: StoredMembership,
    current: Option<(SnapshotMeta, Arc<Vec<u8>>)>,
    seq: u64,
}

impl MemSm {
    fn snapshot_bytes(&self, meta: &SnapshotMeta) -> Result<Vec<u8>, StoreError> {
        let mut w = Writer::new(
            Vec::new(),
            format!("snapshot {}", meta.snapshot_id),
            meta,
            self.state.clock(),
            self.state.quotas(),
            Stubs::None,
        )?;
        for (id, rec) in self.state.records() {
            w.record(&id.encode(), &codec::encode(rec)?)?;
        }
        w.finish()
    }
}

/// The state machine in memory. Clones share the same state.
#[derive(Clone, Default)]
pub struct MemStateMachine {
    inner: Arc<Mutex<MemSm>>,
}

impl MemStateMachine {
    /// An empty state machine.
    pub fn new() -> Self {
        Self::default()
    }

    /// The record's view by the log's clock (see [`machine::get`]).
    pub fn get(&self, id: &RecordKey) -> Option<RecordView> {
        let Ok(view) = machine::get(&mut lock(&self.inner).state, id);
        view
    }

    /// Operator listing: one page (see [`ListQuery`], [`LIST_PAGE_BYTES`]).
    pub fn list(&self, query: &ListQuery) -> ListPage {
        let Ok(page) = machine::list(&mut lock(&self.inner).state, query, LIST_PAGE_BYTES);
        page
    }

    /// Digest of the clock and all records, comparable with the sled store's.
    pub fn digest(&self) -> [u8; 32] {
        lock(&self.inner).state.digest()
    }

    /// The last applied index with the digest of the state it produced, taken together.
    pub fn digest_at(&self) -> (u64, [u8; 32]) {
        let sm = lock(&self.inner);
        (sm.applied.map(|l| l.index).unwrap_or(0), sm.state.digest())
    }

    /// The last applied log id.
    pub fn last_applied(&self) -> Option<LogId> {
        lock(&self.inner).applied
    }

    /// The state machine's clock (largest applied `now_ms`).
    pub fn clock(&self) -> u64 {
        machine::StateStore::clock(&lock(&self.inner).state)
    }

    /// Stored records (expired ones included until swept).
    pub fn record_count(&self) -> usize {
        lock(&self.inner).state.len()
    }

    /// Stored records by state.
    pub fn record_counts(&self) -> crate::RecordCounts {
        let sm = lock(&self.inner);
        let mut counts = crate::RecordCounts::default();
        for (_, r) in sm.state.records() {
            *counts.of(r.state) += 1;
        }
        counts
    }

    /// The quotas in force and the records each tenant holds (see [`QuotaReport::of`]).
    pub fn quota_report(&self, tenant: Option<&str>) -> crate::QuotaReport {
        let sm = lock(&self.inner);
        crate::QuotaReport::of(machine::StateStore::quotas(&sm.state), sm.state.tenant_counts(), tenant)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for MemStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let mut sm = lock(&self.inner);
        sm.seq += 1;
        let meta = SnapshotMeta {
            last_log_id: sm.applied,
            last_membership: sm.membership.clone(),
            snapshot_id: format!(
                "{}-{}-mem-{}",
                sm.applied.map_or(0, |l| l.leader_id.term),
                sm.applied.map_or(0, |l| l.index),
                sm.seq
            ),
        };
        let bytes = Arc::new(sm.snapshot_bytes(&meta).map_err(sto_snapshot)?);
        sm.current = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot { meta, snapshot: Box::new(SnapshotData::Memory(Cursor::new(bytes.to_vec()))) })
    }
}

impl RaftStateMachine<TypeConfig> for MemStateMachine {
    type SnapshotBuilder = MemStateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError<u64>> {
        let sm = lock(&self.inner);
        Ok((sm.applied, sm.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<OutcomeBatch>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut sm = lock(&self.inner);
        let mut replies = Vec::new();
        for entry in entries {
            sm.applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => replies.push(OutcomeBatch::default()),
                EntryPayload::Normal(batch) => {
                    let Ok(outcomes) = machine::apply_batch(&mut sm.state, entry.log_id.index, &batch.0);
                    replies.push(OutcomeBatch(outcomes));
                }
                EntryPayload::Membership(m) => {
                    sm.membership = StoredMembership::new(Some(entry.log_id), m);
                    replies.push(OutcomeBatch::default());
                }
            }
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError<u64>> {
        Ok(Box::new(SnapshotData::Memory(Cursor::new(Vec::new()))))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError<u64>> {
        let bytes = match *snapshot {
            SnapshotData::Memory(cursor) => cursor.into_inner(),
            SnapshotData::File(mut file) => {
                use tokio::io::AsyncSeekExt;
                let mut bytes = Vec::new();
                file.rewind().await.map_err(|e| sto_snapshot(StoreError::io("rewinding received snapshot", e)))?;
                file.read_to_end(&mut bytes)
                    .await
                    .map_err(|e| sto_snapshot(StoreError::io("reading received snapshot", e)))?;
                bytes
            }
            SnapshotData::Blobs(mut stream) => {
                let mut bytes = Vec::new();
                let read = tokio::task::spawn_blocking(move || {
                    std::io::Read::read_to_end(&mut stream, &mut bytes).map(|_| bytes)
                })
                .await
                .map_err(|e| sto_snapshot(StoreError::io("snapshot task", std::io::Error::other(e.to_string()))))?;
                read.map_err(|e| sto_snapshot(StoreError::io("reading received snapshot", e)))?
            }
        };
        // Decode everything before touching the state, so a damaged snapshot changes nothing.
        let (mut reader, clock) = Reader::received(bytes.as_slice(), meta).map_err(sto_snapshot)?;
        let mut state = MemState::new();
        state.set_clock(clock);
        state.set_quotas(reader.quotas().clone());
        // Bodies kept in blobs (format 3) are put back in their records: this store keeps
        // every body inline.
        let mut waiting: Wanted<(RecordKey, Record)> = Wanted::default();
        while let Some(r) = reader.next_record().map_err(sto_snapshot)? {
            match r.blob {
                Some(b) => waiting.add(b, (r.id, r.record)),
                None => {
                    let Ok(()) = state.put(&r.id, None, r.record);
                }
            }
        }
        let what = format!("received snapshot {}", meta.snapshot_id);
        reader
            .blobs(|index, n, len, body| {
                let (bytes, named) = waiting.take(index, n, len, body, &what)?;
                for (b, (id, mut rec)) in named {
                    if let Some(resp) = rec.response.as_mut() {
                        resp.body = b.body_in(&bytes, &what)?.to_vec();
                    }
                    let Ok(()) = state.put(&id, None, rec);
                }
                Ok(())
            })
            .map_err(sto_snapshot)?;
        waiting.finish(&what).map_err(sto_snapshot)?;
        let mut sm = lock(&self.inner);
        sm.state = state;
        sm.applied = meta.last_log_id;
        sm.membership = meta.last_membership.clone();
        sm.current = Some((meta.clone(), Arc::new(bytes)));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let sm = lock(&self.inner);
        Ok(sm.current.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(SnapshotData::Memory(Cursor::new(bytes.to_vec()))),
        }))
    }
}
