//! openraft's own storage conformance suite, run against the sled log and state machine
//! stores, each test on a fresh data directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use idemraft_store::{LogStore, StateMachineStore, TypeConfig};
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
