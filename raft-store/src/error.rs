//! Storage errors: what went wrong, where, and what the operator can do about it.

use std::path::PathBuf;

use openraft::{StorageError, StorageIOError};

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

/// Wraps a store error as openraft's storage error, with the subject and verb `io` names.
fn wrap(e: impl Into<StoreError>, io: fn(&StoreError) -> StorageIOError<u64>) -> StorageError<u64> {
    StorageError::IO { source: io(&e.into()) }
}

pub(crate) fn sto_read(e: impl Into<StoreError>) -> StorageError<u64> {
    wrap(e, |e| StorageIOError::read(e))
}

pub(crate) fn sto_write(e: impl Into<StoreError>) -> StorageError<u64> {
    wrap(e, |e| StorageIOError::write(e))
}

pub(crate) fn sto_logs_read(e: impl Into<StoreError>) -> StorageError<u64> {
    wrap(e, |e| StorageIOError::read_logs(e))
}

pub(crate) fn sto_logs_write(e: impl Into<StoreError>) -> StorageError<u64> {
    wrap(e, |e| StorageIOError::write_logs(e))
}

pub(crate) fn sto_vote(e: impl Into<StoreError>) -> StorageError<u64> {
    wrap(e, |e| StorageIOError::write_vote(e))
}

pub(crate) fn sto_snapshot(e: impl Into<StoreError>) -> StorageError<u64> {
    wrap(e, |e| StorageIOError::write_snapshot(None, e))
}

pub(crate) fn sto_apply(e: impl Into<StoreError>) -> StorageError<u64> {
    wrap(e, |e| StorageIOError::write_state_machine(e))
}
