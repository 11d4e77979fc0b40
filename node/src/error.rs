//! Why a call reached no decision, and how each reason looks at the gRPC edge. Conflicts
//! (IN_PROGRESS, MISMATCH, STALE_TOKEN, ...) are never errors: they are outcomes.

use idemraft_proto::{LEADER_ADDR_HEADER, LEADER_ID_HEADER, NOT_PROPOSED_HEADER};
use idemraft_store::ValidationError;
use serde::{Deserialize, Serialize};

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
        status
    }
}
