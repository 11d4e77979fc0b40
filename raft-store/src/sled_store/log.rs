//! The Raft log on sled: entries in tree `log`, vote / committed / purged in tree `raft`.
//!
//! Durability rules (openraft 0.9 v2 storage contract): an append is one atomic batch followed
//! by an fsync, and only then is openraft told the entries are durable; the vote is fsynced
//! before `save_vote` returns; `purge` makes the purged id durable before deleting anything;
//! truncation is fsynced so deleted uncommitted entries cannot come back after a crash.
//!
//! The node watches appends (their fsync time) and commits through a [`LogObserver`].

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader, StorageError, Vote};

use crate::codec;
use crate::error::{sto_logs_read, sto_logs_write, sto_read, sto_vote, sto_write, StoreError};
use crate::raft::{Entry, LogId, TypeConfig};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

/// What the log store reports while it works, for the node's metrics. Plain callbacks keep
/// this crate free of any metrics library: the node decides what to record and how. Both
/// run on the storage path, so an implementation must be cheap and must not block.
pub trait LogObserver: Send + Sync {
    /// The fsync that made an append durable took `elapsed` (not called when it failed).
    fn append_fsynced(&self, elapsed: Duration) {
        let _ = elapsed;
    }

    /// openraft saved `index` as the committed index.
    fn committed(&self, index: u64) {
        let _ = index;
    }
}

/// openraft log storage on sled. Cloning shares the same trees (that is how the log reader is
/// handed out).
#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    observer: Option<Arc<dyn LogObserver>>,
}

impl LogStore {
    pub(crate) fn new(db: &sled::Db) -> Result<Self, StoreError> {
        let store = LogStore { db: db.clone(), log: db.open_tree("log")?, meta: db.open_tree("raft")?, observer: None };
        // Finish a purge that a crash interrupted after its purge point became durable.
        if let Some(purged) = store.last_purged()? {
            store.remove_through(purged.index)?;
        }
        Ok(store)
    }

    /// Reports appends and commits to `observer` from now on (see [`LogObserver`]).
    pub fn with_observer(mut self, observer: Arc<dyn LogObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Deletes the entries with index `<= index` as one batch.
    fn remove_through(&self, index: u64) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for k in self.log.range(..=index.to_be_bytes()).keys() {
            batch.remove(k?);
        }
        self.log.apply_batch(batch)?;
        Ok(())
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.meta.get(key)? {
            Some(v) => Ok(Some(codec::decode(std::str::from_utf8(key).unwrap_or("raft meta"), &v)?)),
            None => Ok(None),
        }
    }

    fn last_purged(&self) -> Result<Option<LogId>, StoreError> {
        Ok(self.read_meta::<Option<LogId>>(PURGED)?.flatten())
    }

    /// Entries with index in `range`, in order.
    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StoreError> {
        let start = match range.start_bound() {
            Bound::Included(i) => Bound::Included(i.to_be_bytes()),
            Bound::Excluded(i) => Bound::Excluded(i.to_be_bytes()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Bound::Included(i.to_be_bytes()),
            Bound::Excluded(i) => Bound::Excluded(i.to_be_bytes()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for kv in self.log.range::<[u8; 8], _>((start, end)) {
            let (_, v) = kv?;
            out.push(codec::decode::<Entry>("log entry", &v)?);
        }
        Ok(out)
    }

    fn last_log_id(&self) -> Result<Option<LogId>, StoreError> {
        match self.log.last()? {
            Some((_, v)) => Ok(Some(codec::decode::<Entry>("log entry", &v)?.log_id)),
            None => Ok(None),
        }
    }

    /// Appends entries as one atomic batch and returns once they are fsynced. openraft's
    /// `append` is this plus the durability callback; tools and tests that drive the log
    /// without openraft call it directly.
    pub async fn append_durably(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for entry in entries {
            batch.insert(&entry.log_id.index.to_be_bytes(), codec::encode(&entry)?);
        }
        self.log.apply_batch(batch)?;
        // Entries are readable now; they are durable only once this flush returns.
        let started = Instant::now();
        self.flush().await?;
        if let Some(o) = &self.observer {
            o.append_fsynced(started.elapsed());
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.db.flush_async().await?;
        Ok(())
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
        let last_purged_log_id = self.last_purged().map_err(sto_logs_read)?;
        // An empty log after a purge still has a last log id: the purged one.
        let last_log_id = self.last_log_id().map_err(sto_logs_read)?.or(last_purged_log_id);
        Ok(LogState { last_purged_log_id, last_log_id })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        self.meta.insert(VOTE, codec::encode(vote).map_err(sto_vote)?).map_err(sto_vote)?;
        self.flush().await.map_err(sto_vote)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.read_meta(VOTE).map_err(sto_read)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError<u64>> {
        // Not flushed on its own: the next append's flush covers it, and a committed index
        // that is a little behind after a crash only means openraft re-applies less at start.
        self.meta.insert(COMMITTED, codec::encode(&committed).map_err(sto_write)?).map_err(sto_write)?;
        if let (Some(o), Some(c)) = (&self.observer, committed) {
            o.committed(c.index);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError<u64>> {
        Ok(self.read_meta::<Option<LogId>>(COMMITTED).map_err(sto_read)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        match self.append_durably(entries).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(sto_logs_write(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        let mut batch = sled::Batch::default();
        for k in self.log.range(log_id.index.to_be_bytes()..).keys() {
            batch.remove(k.map_err(sto_logs_write)?);
        }
        self.log.apply_batch(batch).map_err(sto_logs_write)?;
        self.flush().await.map_err(sto_logs_write)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError<u64>> {
        // Record the purge point durably first: a crash between the two steps then leaves
        // extra entries behind, never a hole below a log that claims to start later.
        self.meta.insert(PURGED, codec::encode(&Some(log_id)).map_err(sto_logs_write)?).map_err(sto_logs_write)?;
        self.flush().await.map_err(sto_logs_write)?;
        self.remove_through(log_id.index).map_err(sto_logs_write)
    }
}
