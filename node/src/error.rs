//! Why a call reached no decision, and how each reason looks at the gRPC edge. Conflicts
//! (IN_PROGRESS, MISMATCH, STALE_TOKEN, ...) are never errors: they are outcomes.

use idemraft_proto::{
    LEADER_ADDR_HEADER, LEADER_ID_HEADER, NOT_PROPOSED_HEADER, QUOTA_LIMIT_HEADER, QUOTA_RECORDS_HEADER,
    QUOTA_TENANT_HEADER,
};
use idemraft_store::ValidationError;
use serde::{Deserialize, Serialize};

/// A configuration problem, phrased for the operator. Here, below the configuration, because
/// the TLS and token loaders that configuration calls report it too.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {option}: {problem}; {fix}")]
pub struct ConfigError {
    /// The option as a flag name, e.g. `--initial-cluster`.
    pub option: String,
    /// What is wrong.
    pub problem: String,
    /// What to do about it.
    pub fix: String,
}

/// A call that did not reach a decision. Travels between nodes when a follower forwards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum NodeError {
    /// The request broke a rule.
    #[error("{0}")]
    Invalid(ValidationError),
    /// A request that is malformed before any rule can be checked (missing id, bad enum).
    #[error("{0}")]
    BadRequest(String),
    /// This node cannot serve the call and no leader is known, or the leader could not be
    /// reached.
    #[error("no leader is available ({why}); retry with backoff")]
    NoLeader {
        /// What was seen.
        why: String,
        /// Leader id, when one is known.
        leader_id: Option<u64>,
        /// Leader's client address, when known.
        leader_addr: Option<String>,
    },
    /// The leader could not reach a quorum before the deadline.
    #[error("no quorum: {0}; the outcome of a write is unknown, retrying the same call is safe")]
    NoQuorum(String),
    /// The deadline passed while the command was in flight.
    #[error("deadline exceeded {0}; the outcome is unknown, retrying the same call is safe")]
    Deadline(String),
    /// An admin change the cluster cannot make now.
    #[error("{0}")]
    Precondition(String),
    /// The node is stopping.
    #[error("the node is shutting down; retry on another node")]
    ShuttingDown,
    /// A storage failure or a bug.
    #[error("internal error: {0}")]
    Internal(String),
    /// The leader's write queue is full: the command was not proposed (so it certainly had no
    /// effect). Shedding at once keeps memory and latency bounded under overload.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// The state machine refused a claim that would add a record past the tenant's quota.
    /// Unlike [`NodeError::Overloaded`] this was decided in the log: repeating the claim gets
    /// the same answer until the quota is raised or records expire.
    #[error(
        "record quota exceeded: tenant '{tenant}' holds {records} records and its quota is {limit}, so a claim on a \
         new key is refused (claims on existing keys still work); raise the quota with \
         `idemctl quota set {tenant} N`, or let retention expire records (the sweeper deletes them)"
    )]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Its quota.
        limit: u64,
        /// The records it holds.
        records: u64,
    },
}

impl NodeError {
    /// The gRPC status for this error, with the leader hint in metadata when known.
    pub fn to_status(&self) -> tonic::Status {
        use tonic::Code;
        let code = match self {
            NodeError::Invalid(_) | NodeError::BadRequest(_) => Code::InvalidArgument,
            NodeError::NoLeader { .. } | NodeError::NoQuorum(_) | NodeError::ShuttingDown => Code::Unavailable,
            NodeError::Deadline(_) => Code::DeadlineExceeded,
            NodeError::Precondition(_) => Code::FailedPrecondition,
            NodeError::Internal(_) => Code::Internal,
            NodeError::Overloaded(_) => Code::ResourceExhausted,
            // Not RESOURCE_EXHAUSTED: clients retry that with backoff as never proposed, while
            // this refusal stands until an operator or retention changes the state.
            NodeError::QuotaExceeded { .. } => Code::FailedPrecondition,
        };
        let mut status = tonic::Status::new(code, self.to_string());
        if let NodeError::Overloaded(_) = self {
            status.metadata_mut().insert(NOT_PROPOSED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
        }
        if let NodeError::NoLeader { leader_id, leader_addr, .. } = self {
            let md = status.metadata_mut();
            if let Some(id) = leader_id {
                if let Ok(v) = id.to_string().parse() {
                    md.insert(LEADER_ID_HEADER, v);
                }
            }
            if let Some(addr) = leader_addr {
                if let Ok(v) = addr.parse() {
                    md.insert(LEADER_ADDR_HEADER, v);
                }
            }
        }
        if let NodeError::QuotaExceeded { tenant, limit, records } = self {
            let md = status.metadata_mut();
            for (key, value) in [
                (QUOTA_TENANT_HEADER, tenant.clone()),
                (QUOTA_LIMIT_HEADER, limit.to_string()),
                (QUOTA_RECORDS_HEADER, records.to_string()),
            ] {
                if let Ok(v) = value.parse() {
                    md.insert(key, v);
                }
            }
        }
        status
    }
}
