//! `idemraft-store` owns Idemraft's replicated state: the command and outcome types, the pure
//! deterministic state machine that decides every rule of the contract (claim, complete, fail,
//! takeover, lease extension, checkpoints, expiry sweeps, resume after an election), and the
//! durable openraft 0.9 storage it runs on: the Raft log in append-only segment files
//! (`file_log`), the state machine on sled and snapshots in files (`sled_store`).
//!
//! How a batch flows:
//! 1. The node wraps client commands, each stamped with the leader's `now_ms`, in one
//!    [`CommandBatch`] and proposes it as one log entry.
//! 2. openraft calls [`LogStore`]'s `append`: the entries are written to the active log
//!    segment in one write and become readable; a sync thread fdatasyncs (one fsync for all
//!    appends waiting meanwhile) and only then fires the callback that tells openraft the
//!    entries are durable.
//! 3. Once committed, openraft calls [`StateMachineStore`]'s `apply` with one or more entries.
//!    Each command goes through [`machine::apply`] with fencing token
//!    `Token::new(entry index, position)`; all changes of the call, with the last applied log
//!    id and clock, are written to sled with readers held off, and sled makes them durable on
//!    its own schedule: after a crash the state restarts from the newest snapshot and openraft
//!    re-applies the rest from the log.
//! 4. The [`OutcomeBatch`] of each entry flows back to the node, which answers each caller
//!    with its own [`Outcome`].
//!
//! Beside the durable stores, [`MemLogStore`] and [`MemStateMachine`] implement the same openraft
//! traits in memory (same rules, same snapshot format), for running the node under a
//! deterministic simulator or in fast tests; they are not durable.
//!
//! Nothing here reads the wall clock (except the planted `local-clock` bug, see [`planted`]), spawns long-lived tasks or knows about gRPC.
//! The log store times its fsyncs on the monotonic clock for the node's metrics
//! ([`LogObserver`]); that reading never decides anything.

pub mod backup;
mod blob_stream;
pub mod codec;
pub mod compressed;
mod digest;
mod error;
mod file_log;
pub mod golden;
pub mod machine;
mod mem;
mod mem_store;
pub mod planted;
pub mod raft;
mod sled_store;
mod snapshot;
pub mod stored;
mod types;
pub mod validate;

pub use blob_stream::BlobStream;
pub use digest::StateDigest;
pub use error::StoreError;
pub use file_log::{LogObserver, LogStore};
pub use mem::MemState;
pub use mem_store::{MemLogStore, MemStateMachine};
pub use raft::{CommandBatch, OutcomeBatch, SnapshotData, TypeConfig, WriteResponder};
pub use sled_store::{
    open, open_with, open_with_options, OpenOptions, RecordCounts, StateMachineStore, DATA_FORMAT_VERSION,
    DB_CACHE_BYTES,
};
pub use types::{
    Command, Fingerprint, Grant, ListPage, ListQuery, Op, Outcome, QuotaReport, QuotaUsage, Quotas, Record, RecordKey,
    RecordState, RecordView, Response, Token, LIST_PAGE_BYTES,
};
pub use validate::{Limits, ValidationError};
