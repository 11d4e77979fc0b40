//! The openraft type configuration shared by every Idemraft node.
//!
//! A log entry's payload is a batch of commands and its response a batch of outcomes, so the
//! node can group many client calls into one entry: openraft 0.9 fsyncs once per
//! `client_write`, which makes batching the main throughput lever.

use std::pin::Pin;
use std::task::{Context, Poll};

use openraft::impls::OneshotResponder;
use openraft::raft::responder::Responder;
use openraft::raft::ClientWriteResult;
use serde::{Deserialize, Serialize};

use crate::types::{Command, Outcome};

/// Payload of one log entry: commands applied in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CommandBatch(pub Vec<Command>);

/// Response to one log entry: one outcome per command, empty for Blank and Membership entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct OutcomeBatch(pub Vec<Outcome>);

/// A snapshot's bytes in transit or at rest: a file for the sled store (bounded memory
/// whatever the state's size), a buffer for the in-memory store (no file IO, so it can run
/// under a deterministic simulator). Either side accepts either kind when installing.
#[derive(Debug)]
pub enum SnapshotData {
    /// A snapshot file.
    File(tokio::fs::File),
    /// A snapshot held in memory.
    Memory(std::io::Cursor<Vec<u8>>),
    /// A stored snapshot whose records name blobs: its file and its blob files as one stream.
    Blobs(crate::blob_stream::BlobStream),
}

impl tokio::io::AsyncRead for SnapshotData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            SnapshotData::File(f) => Pin::new(f).poll_read(cx, buf),
            SnapshotData::Memory(m) => Pin::new(m).poll_read(cx, buf),
            SnapshotData::Blobs(b) => Pin::new(b).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for SnapshotData {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            SnapshotData::File(f) => Pin::new(f).poll_write(cx, buf),
            SnapshotData::Memory(m) => Pin::new(m).poll_write(cx, buf),
            SnapshotData::Blobs(b) => Pin::new(b).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            SnapshotData::File(f) => Pin::new(f).poll_flush(cx),
            SnapshotData::Memory(m) => Pin::new(m).poll_flush(cx),
            SnapshotData::Blobs(b) => Pin::new(b).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            SnapshotData::File(f) => Pin::new(f).poll_shutdown(cx),
            SnapshotData::Memory(m) => Pin::new(m).poll_shutdown(cx),
            SnapshotData::Blobs(b) => Pin::new(b).poll_shutdown(cx),
        }
    }
}

impl tokio::io::AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: std::io::SeekFrom) -> std::io::Result<()> {
        match self.get_mut() {
            SnapshotData::File(f) => Pin::new(f).start_seek(position),
            SnapshotData::Memory(m) => Pin::new(m).start_seek(position),
            SnapshotData::Blobs(b) => Pin::new(b).start_seek(position),
        }
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        match self.get_mut() {
            SnapshotData::File(f) => Pin::new(f).poll_complete(cx),
            SnapshotData::Memory(m) => Pin::new(m).poll_complete(cx),
            SnapshotData::Blobs(b) => Pin::new(b).poll_complete(cx),
        }
    }
}

openraft::declare_raft_types!(
    /// Idemraft's openraft types: u64 node ids, command batches, snapshots as [`SnapshotData`].
    pub TypeConfig:
        D = CommandBatch,
        R = OutcomeBatch,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = WriteResponder
);

/// Where the result of a client write goes once its entry is applied (or refused).
///
/// `Callback` runs the caller's own code on the task that has the result, the state machine
/// worker in the common case, so a proposer answers its clients from there without a task of
/// its own that only waits for the result. `Oneshot` is openraft's default, for callers that
/// await a receiver (`Raft::client_write`).
pub enum WriteResponder {
    /// Sends the result on a oneshot channel.
    Oneshot(OneshotResponder<TypeConfig>),
    /// Hands the result to a function; dropping it unsent drops the function, which is how a
    /// caller learns that the node stopped.
    Callback(Box<dyn FnOnce(ClientWriteResult<TypeConfig>) + Send>),
}

impl WriteResponder {
    /// A responder that calls `f` with the result.
    pub fn callback(f: impl FnOnce(ClientWriteResult<TypeConfig>) + Send + 'static) -> Self {
        WriteResponder::Callback(Box::new(f))
    }
}

impl From<OneshotResponder<TypeConfig>> for WriteResponder {
    fn from(tx: OneshotResponder<TypeConfig>) -> Self {
        WriteResponder::Oneshot(tx)
    }
}

impl Responder<TypeConfig> for WriteResponder {
    type Receiver = <OneshotResponder<TypeConfig> as Responder<TypeConfig>>::Receiver;

    fn from_app_data(app_data: CommandBatch) -> (CommandBatch, Self, Self::Receiver) {
        let (app_data, tx, rx) = <OneshotResponder<TypeConfig> as Responder<TypeConfig>>::from_app_data(app_data);
        (app_data, WriteResponder::Oneshot(tx), rx)
    }

    fn send(self, result: ClientWriteResult<TypeConfig>) {
        match self {
            WriteResponder::Oneshot(tx) => tx.send(result),
            WriteResponder::Callback(f) => f(result),
        }
    }
}

/// A log entry of Idemraft's log.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log id (term, leader, index).
pub type LogId = openraft::LogId<u64>;
/// Membership as stored with the state.
pub type StoredMembership = openraft::StoredMembership<u64, openraft::BasicNode>;
/// Snapshot metadata.
pub type SnapshotMeta = openraft::SnapshotMeta<u64, openraft::BasicNode>;
