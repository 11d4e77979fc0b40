//! The openraft type configuration shared by every Idemraft node.
//!
//! A log entry's payload is a batch of commands and its response a batch of outcomes, so the
//! node can group many client calls into one entry: openraft 0.9 fsyncs once per
//! `client_write`, which makes batching the main throughput lever.

use serde::{Deserialize, Serialize};

use crate::types::{Command, Outcome};

/// Payload of one log entry: commands applied in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CommandBatch(pub Vec<Command>);

/// Response to one log entry: one outcome per command, empty for Blank and Membership entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OutcomeBatch(pub Vec<Outcome>);

openraft::declare_raft_types!(
    /// Idemraft's openraft types: u64 node ids, snapshots as files.
    pub TypeConfig:
        D = CommandBatch,
        R = OutcomeBatch,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>
);

/// A log entry of Idemraft's log.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id (term, leader, index).
pub type LogId = openraft::LogId<u64>;
/// Membership as stored with the state.
pub type StoredMembership = openraft::StoredMembership<u64, openraft::BasicNode>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<u64, openraft::BasicNode>;
