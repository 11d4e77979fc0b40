//! openraft's own storage conformance suite, run against the sled log and state machine
//! stores (each test on a fresh data directory) and against the in-memory stores.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use idemraft_store::{LogStore, MemLogStore, MemStateMachine, StateMachineStore, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use tempfile::TempDir;

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = TempDir::new().expect("temp dir");
        let (log, sm) = idemraft_store::open(&dir.path().join("data")).expect("open data dir");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite_passes_on_sled() {
    Suite::test_all(SledBuilder).expect("openraft storage suite");
}

struct MemBuilder;

impl StoreBuilder<TypeConfig, MemLogStore, MemStateMachine> for MemBuilder {
    async fn build(&self) -> Result<((), MemLogStore, MemStateMachine), StorageError<u64>> {
        Ok(((), MemLogStore::new(), MemStateMachine::new()))
    }
}

#[test]
fn openraft_storage_suite_passes_in_memory() {
    Suite::test_all(MemBuilder).expect("openraft storage suite");
}
