//! Storage errors: what went wrong, where, and what the operator can do about it.

use std::path::PathBuf;

/// A failure of the storage layer. Business outcomes are never errors (see
/// [`crate::Outcome`]); an error here means the disk, the data or the directory is wrong.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data directory cannot be used as it is.
    #[error("data directory {dir}: {problem}; {fix}")]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// An operating-system I/O call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// sled reported an error.
    #[error("sled database: {0}")]
    Sled(#[from] sled::Error),
    /// Stored bytes do not decode: the data is damaged or from an incompatible build.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// Which item.
        what: String,
        /// Decoder message.
        detail: String,
    },
}

impl StoreError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io { what: what.into(), source }
    }
}

/// openraft's error for a failed read or write of the given subject.
pub(crate) fn sto_read(e: impl Into<StoreError>) -> openraft::StorageError<u64> {
    let e: StoreError = e.into();
    openraft::StorageError::IO { source: openraft::StorageIOError::read(&e) }
}

pub(crate) fn sto_write(e: impl Into<StoreError>) -> openraft::StorageError<u64> {
    let e: StoreError = e.into();
    openraft::StorageError::IO { source: openraft::StorageIOError::write(&e) }
}

pub(crate) fn sto_logs_read(e: impl Into<StoreError>) -> openraft::StorageError<u64> {
    let e: StoreError = e.into();
    openraft::StorageError::IO { source: openraft::StorageIOError::read_logs(&e) }
}

pub(crate) fn sto_logs_write(e: impl Into<StoreError>) -> openraft::StorageError<u64> {
    let e: StoreError = e.into();
    openraft::StorageError::IO { source: openraft::StorageIOError::write_logs(&e) }
}

pub(crate) fn sto_vote(e: impl Into<StoreError>) -> openraft::StorageError<u64> {
    let e: StoreError = e.into();
    openraft::StorageError::IO { source: openraft::StorageIOError::write_vote(&e) }
}

pub(crate) fn sto_snapshot(e: impl Into<StoreError>) -> openraft::StorageError<u64> {
    let e: StoreError = e.into();
    openraft::StorageError::IO { source: openraft::StorageIOError::write_snapshot(None, &e) }
}

pub(crate) fn sto_apply(e: impl Into<StoreError>) -> openraft::StorageError<u64> {
    let e: StoreError = e.into();
    openraft::StorageError::IO { source: openraft::StorageIOError::write_state_machine(&e) }
}
