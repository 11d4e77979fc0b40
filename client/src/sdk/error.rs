//! Why a call failed ([`Error`]), as the node's status and metadata say.

use idemraft_proto::{QUOTA_LIMIT_HEADER, QUOTA_RECORDS_HEADER, QUOTA_TENANT_HEADER};
use tonic::{Code, Status};

use super::*;

/// Why a call failed. Conflicts that a caller handles in the normal course (IN_PROGRESS,
/// MISMATCH, ...) are [`Outcome`]s, not errors.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The request broke a rule; the message names it. Retrying will not help.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// No node could serve the call before the deadline (no leader, no quorum, nodes down).
    /// For a write the outcome is unknown; repeating the same call is safe.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// The deadline passed; for a write the outcome is unknown, repeating it is safe.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// The outcome of the call is unknown; repeating the same call is safe. Either the
    /// connection broke before the answer arrived (or HTTP/2 closed it under load) and no
    /// other attempt got an answer before the deadline, or a retried write got an answer
    /// that an earlier attempt, whose outcome is unknown, may itself have caused. The message
    /// says which.
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// The cluster cannot make this admin change now.
    #[error("refused: {0}")]
    FailedPrecondition(String),
    /// The client was configured wrongly (no endpoints, a malformed address).
    #[error("client configuration: {0}")]
    Config(String),
    /// Any other gRPC failure.
    #[error("{code:?}: {message}")]
    Rpc {
        /// gRPC code.
        code: Code,
        /// Its message.
        message: String,
    },
    /// The server answered with something this SDK does not understand (a newer server?).
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// A local file could not be written (e.g. `save_snapshot`'s target).
    #[error("local file: {0}")]
    Io(String),
    /// The claim would have created a record past the tenant's record quota, and the cluster
    /// refused it; nothing was stored. Not retried: the same claim gets the same answer until
    /// an operator raises the quota (`idemctl quota set`) or records expire. Claims on keys
    /// that already have a record are never refused this way.
    #[error("{message}")]
    QuotaExceeded {
        /// The tenant whose quota is used up.
        tenant: String,
        /// Its quota, in records.
        limit: u64,
        /// The records it holds.
        records: u64,
        /// The server's explanation, naming the fix.
        message: String,
    },
}

impl Error {
    pub(crate) fn from_status(s: &Status) -> Error {
        if let Some(why) = lost_reply(s) {
            return Error::Indeterminate(format!(
                "{why} ({:?}: {}); the call may or may not have taken effect: repeat it with the same arguments",
                s.code(),
                s.message()
            ));
        }
        let message = s.message().to_string();
        match s.code() {
            Code::InvalidArgument => Error::InvalidArgument(message),
            Code::Unavailable => Error::Unavailable(message),
            // A cancelled call is one whose time ran out: its outcome is just as unknown.
            Code::DeadlineExceeded | Code::Cancelled => Error::DeadlineExceeded(message),
            Code::FailedPrecondition => match quota_refusal(s) {
                Some((tenant, limit, records)) => Error::QuotaExceeded { tenant, limit, records, message },
                None => Error::FailedPrecondition(message),
            },
            code => Error::Rpc { code, message },
        }
    }

    /// Whether the outcome of the call is unknown (it may or may not have been applied).
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::DeadlineExceeded(_) | Error::Indeterminate(_))
    }
}

/// The tenant, quota and record count of a quota refusal, which the node marks with metadata
/// (the message is for people; the metadata is what code relies on).
pub(super) fn quota_refusal(s: &Status) -> Option<(String, u64, u64)> {
    let md = s.metadata();
    let text = |k: &str| md.get(k).and_then(|v| v.to_str().ok());
    let limit = text(QUOTA_LIMIT_HEADER)?.parse().ok()?;
    let records = text(QUOTA_RECORDS_HEADER).and_then(|v| v.parse().ok()).unwrap_or(limit);
    Some((text(QUOTA_TENANT_HEADER).unwrap_or_default().to_string(), limit, records))
}
