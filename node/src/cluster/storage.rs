//! What the node reads from its storage besides what openraft does with it: the state
//! machine's clock, records, pages, quotas and digest, and the log's last id and size. The
//! node holds these as trait objects, so it runs the same on the durable stores (the log in
//! segment files, the state machine on sled) and on the in-memory twins, which is how tests
//! run whole nodes in one process without a disk.

use idemraft_store::raft::LogId;
use idemraft_store::{
    ListPage, ListQuery, LogStore, MemLogStore, MemStateMachine, QuotaReport, RecordCounts, RecordKey, RecordView,
    StateMachineStore, StoreError,
};
use openraft::storage::RaftLogStorage;

/// The state machine as the node reads it.
#[tonic::async_trait]
pub trait StateView: Send + Sync + 'static {
    /// The state machine's clock (largest applied `now_ms`).
    fn clock(&self) -> u64;
    /// Stored records (expired ones included until swept), as of the last apply.
    fn record_count(&self) -> usize;
    /// Stored records by state, as of the last apply.
    fn record_counts(&self) -> RecordCounts;
    /// Bytes of response bodies kept in blob files and packs.
    fn blob_bytes(&self) -> u64;
    /// One record's view by the log's clock.
    async fn get(&self, id: &RecordKey) -> Result<Option<RecordView>, StoreError>;
    /// One page of a listing.
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError>;
    /// Quotas and their use: one tenant, or all.
    async fn quota_report(&self, tenant: Option<&str>) -> QuotaReport;
    /// The last applied log id.
    async fn last_applied(&self) -> Option<LogId>;
    /// The last applied index and the digest of the state at it, taken together.
    async fn digest_at(&self) -> Result<(u64, [u8; 32]), StoreError>;
    /// Makes everything applied so far durable (a clean shutdown's last step).
    async fn flush(&self) -> Result<(), StoreError>;
}

/// The Raft log as the node reads it (openraft owns its writes).
pub trait LogView: Send + Sync + 'static {
    /// The last log id, or the purge point of an empty log.
    fn last_log_id(&self) -> Option<LogId>;
    /// Bytes of the entries after `index`.
    fn bytes_after(&self, index: u64) -> u64;
}

#[tonic::async_trait]
impl StateView for StateMachineStore {
    fn clock(&self) -> u64 {
        StateMachineStore::clock(self)
    }
    fn record_count(&self) -> usize {
        StateMachineStore::record_count(self)
    }
    fn record_counts(&self) -> RecordCounts {
        StateMachineStore::record_counts(self)
    }
    fn blob_bytes(&self) -> u64 {
        StateMachineStore::blob_bytes(self)
    }
    async fn get(&self, id: &RecordKey) -> Result<Option<RecordView>, StoreError> {
        StateMachineStore::get(self, id).await
    }
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        StateMachineStore::list(self, query).await
    }
    async fn quota_report(&self, tenant: Option<&str>) -> QuotaReport {
        StateMachineStore::quota_report(self, tenant).await
    }
    async fn last_applied(&self) -> Option<LogId> {
        StateMachineStore::last_applied(self).await
    }
    async fn digest_at(&self) -> Result<(u64, [u8; 32]), StoreError> {
        StateMachineStore::digest_at(self).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        StateMachineStore::flush(self).await
    }
}

#[tonic::async_trait]
impl StateView for MemStateMachine {
    fn clock(&self) -> u64 {
        MemStateMachine::clock(self)
    }
    fn record_count(&self) -> usize {
        MemStateMachine::record_count(self)
    }
    fn record_counts(&self) -> RecordCounts {
        MemStateMachine::record_counts(self)
    }
    fn blob_bytes(&self) -> u64 {
        // Bodies stay inside their records in memory.
        0
    }
    async fn get(&self, id: &RecordKey) -> Result<Option<RecordView>, StoreError> {
        Ok(MemStateMachine::get(self, id))
    }
    async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        Ok(MemStateMachine::list(self, query))
    }
    async fn quota_report(&self, tenant: Option<&str>) -> QuotaReport {
        MemStateMachine::quota_report(self, tenant)
    }
    async fn last_applied(&self) -> Option<LogId> {
        MemStateMachine::last_applied(self)
    }
    async fn digest_at(&self) -> Result<(u64, [u8; 32]), StoreError> {
        Ok(MemStateMachine::digest_at(self))
    }
    async fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl LogView for LogStore {
    fn last_log_id(&self) -> Option<LogId> {
        LogStore::last_log_id(self)
    }
    fn bytes_after(&self, index: u64) -> u64 {
        LogStore::bytes_after(self, index)
    }
}

impl LogView for MemLogStore {
    fn last_log_id(&self) -> Option<LogId> {
        MemLogStore::last_log_id(self)
    }
    fn bytes_after(&self, index: u64) -> u64 {
        MemLogStore::bytes_after(self, index)
    }
}

/// A log and a state machine openraft can run on, with the views the node reads.
pub struct Stores<L, S> {
    /// The Raft log.
    pub log: L,
    /// The state machine.
    pub sm: S,
}

/// What [`Stores`] must be for a node to run on them.
pub trait NodeLog: RaftLogStorage<idemraft_store::TypeConfig> + LogView + Clone {}
impl<T: RaftLogStorage<idemraft_store::TypeConfig> + LogView + Clone> NodeLog for T {}

/// What [`Stores`] must be for a node to run on them.
pub trait NodeStateMachine:
    openraft::storage::RaftStateMachine<idemraft_store::TypeConfig> + StateView + Clone
{
}
impl<T: openraft::storage::RaftStateMachine<idemraft_store::TypeConfig> + StateView + Clone> NodeStateMachine for T {}
