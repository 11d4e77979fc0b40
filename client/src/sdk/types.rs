//! The typed values of the API: stored responses, grants, outcomes, records, claim options.

use std::time::Duration;

use idemraft_proto::v1 as pb;

use crate::fingerprint::Fingerprint;

use super::*;

/// A stored response: status, headers and body, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// Status code (the HTTP status for HTTP work).
    pub status: u32,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A response with a status and body and no headers.
    pub fn new(status: u32, body: impl Into<Vec<u8>>) -> StoredResponse {
        StoredResponse { status, headers: Vec::new(), body: body.into() }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> StoredResponse {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub(super) fn to_pb(&self) -> pb::StoredResponse {
        pb::StoredResponse {
            status: self.status,
            headers: self.headers.iter().map(|(n, v)| pb::Header { name: n.clone(), value: v.clone() }).collect(),
            body: self.body.clone(),
        }
    }

    pub(super) fn from_pb(r: pb::StoredResponse) -> StoredResponse {
        StoredResponse {
            status: r.status,
            headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            body: r.body,
        }
    }
}

/// An ownership grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token: pass it to downstream systems, which refuse lower tokens.
    pub token: u64,
    /// 1 for a first grant.
    pub attempt: u32,
    /// This grant took the key over from an owner whose lease expired.
    pub takeover: bool,
    /// Lease deadline, Unix ms of the cluster's clock.
    pub lease_expires_ms: u64,
    /// Record expiry, Unix ms.
    pub expires_ms: u64,
    /// Progress marker left by a previous owner.
    pub recovery_point: String,
    /// Progress data left by a previous owner.
    pub checkpoint: Vec<u8>,
}

/// A record's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Owned under a lease.
    InProgress,
    /// Settled with a stored response.
    Completed,
    /// Failed retryably.
    Failed,
    /// A state this SDK does not know.
    Unknown,
}

impl RecordState {
    /// The state of a wire value (`Record::state`, `WrongState::state`).
    pub fn from_proto(v: i32) -> RecordState {
        match pb::RecordState::try_from(v) {
            Ok(pb::RecordState::InProgress) => RecordState::InProgress,
            Ok(pb::RecordState::Completed) => RecordState::Completed,
            Ok(pb::RecordState::Failed) => RecordState::Failed,
            _ => RecordState::Unknown,
        }
    }

    /// The state's name as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InProgress => "IN_PROGRESS",
            RecordState::Completed => "COMPLETED",
            RecordState::Failed => "FAILED",
            RecordState::Unknown => "UNKNOWN",
        }
    }
}

/// The decision on a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The caller owns the key.
    Acquired(Grant),
    /// The key was completed before; this is its stored response.
    Replay {
        /// Token of the completing grant.
        token: u64,
        /// When it completed, Unix ms.
        completed_ms: u64,
        /// The stored response.
        response: StoredResponse,
    },
    /// Someone else holds the key.
    InProgress {
        /// The holder's lease deadline, Unix ms.
        lease_expires_ms: u64,
        /// Suggested wait before retrying, ms.
        retry_after_ms: u64,
    },
    /// The key is bound to another request fingerprint.
    Mismatch,
    /// The token is not the record's current one.
    StaleToken {
        /// The current token.
        current: u64,
    },
    /// No live record with that id.
    NotFound,
    /// The record's state does not allow the call.
    WrongState(RecordState),
    /// Complete accepted.
    Completed {
        /// The completing token.
        token: u64,
    },
    /// Fail accepted.
    Failed {
        /// The failing token.
        token: u64,
        /// FAILED (true) or COMPLETED with the error response (false).
        retryable: bool,
    },
    /// Lease extended.
    LeaseExtended {
        /// The owner's token.
        token: u64,
        /// New deadline, Unix ms.
        lease_expires_ms: u64,
    },
}

impl Outcome {
    pub(super) fn from_pb(o: pb::Outcome) -> Result<Outcome, Error> {
        use pb::outcome::Result as R;
        Ok(match o.result.ok_or_else(|| Error::Protocol("an outcome with no result".into()))? {
            R::Acquired(a) => Outcome::Acquired(Grant {
                token: a.token,
                attempt: a.attempt,
                takeover: a.takeover,
                lease_expires_ms: a.lease_expires_ms,
                expires_ms: a.expires_ms,
                recovery_point: a.recovery_point,
                checkpoint: a.checkpoint,
            }),
            R::Replay(r) => Outcome::Replay {
                token: r.token,
                completed_ms: r.completed_ms,
                response: StoredResponse::from_pb(r.response.unwrap_or_default()),
            },
            R::InProgress(p) => {
                Outcome::InProgress { lease_expires_ms: p.lease_expires_ms, retry_after_ms: p.retry_after_ms }
            }
            R::Mismatch(_) => Outcome::Mismatch,
            R::StaleToken(s) => Outcome::StaleToken { current: s.current },
            R::NotFound(_) => Outcome::NotFound,
            R::WrongState(w) => Outcome::WrongState(RecordState::from_proto(w.state)),
            R::Completed(c) => Outcome::Completed { token: c.token },
            R::Failed(f) => Outcome::Failed { token: f.token, retryable: f.retryable },
            R::LeaseExtended(l) => Outcome::LeaseExtended { token: l.token, lease_expires_ms: l.lease_expires_ms },
        })
    }

    /// The outcome's name as the API spells it (e.g. `ACQUIRED`).
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Acquired(_) => "ACQUIRED",
            Outcome::Replay { .. } => "REPLAY",
            Outcome::InProgress { .. } => "IN_PROGRESS",
            Outcome::Mismatch => "MISMATCH",
            Outcome::StaleToken { .. } => "STALE_TOKEN",
            Outcome::NotFound => "NOT_FOUND",
            Outcome::WrongState(_) => "WRONG_STATE",
            Outcome::Completed { .. } => "COMPLETED",
            Outcome::Failed { .. } => "FAILED",
            Outcome::LeaseExtended { .. } => "LEASE_EXTENDED",
        }
    }
}

/// A record as `Get`, `Wait` and `List` return it.
pub type Record = pb::Record;

/// A record after `Wait`.
#[derive(Clone, Debug)]
pub struct Waited {
    /// The record, if it exists.
    pub record: Option<Record>,
    /// Still IN_PROGRESS when the wait ended.
    pub timed_out: bool,
}

/// Options for a claim.
#[derive(Clone, Debug, Default)]
pub struct ClaimOptions {
    /// Request fingerprint, binding the key to one payload.
    pub fingerprint: Option<Fingerprint>,
    /// Lease; `None` takes the server's default.
    pub lease: Option<Duration>,
    /// Record TTL/retention; `None` takes the scope's default.
    pub ttl: Option<Duration>,
    /// Take over an expired lease.
    pub allow_takeover: bool,
}
