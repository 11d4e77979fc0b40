//! The vocabulary of the state machine: record identity, records, commands and outcomes.
//!
//! Everything here is plain data with serde derives, because it travels inside Raft log
//! entries (bincode) and, later, over the wire.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// Identity of a record: `(tenant, scope, key)`, validated on construction.
///
/// Ordering is tenant, then scope, then key, which matches the byte order of
/// [`RecordKey::encode`] (the separator `0x00` sorts before every allowed character), so
/// in-memory and on-disk scans visit records in the same order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RecordKey {
    tenant: String,
    scope: String,
    key: String,
}

impl RecordKey {
    /// Builds an identity, refusing any part that breaks its rule (contract §1.1).
    pub fn new(
        tenant: impl Into<String>,
        scope: impl Into<String>,
        key: impl Into<String>,
    ) -> Result<Self, ValidationError> {
        let id = RecordKey { tenant: tenant.into(), scope: scope.into(), key: key.into() };
        id.validate()?;
        Ok(id)
    }

    /// An identity built without the checks, for values fixed in the source (the golden
    /// samples) whose parts are valid by inspection; never for anything that comes in.
    pub(crate) fn fixed(tenant: &str, scope: &str, key: &str) -> Self {
        RecordKey { tenant: tenant.to_string(), scope: scope.to_string(), key: key.to_string() }
    }

    /// Checks all three parts again. Used by apply, because a key that arrives through the
    /// log was validated by a node whose code we do not control.
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate::tenant(&self.tenant)?;
        validate::scope(&self.scope)?;
        validate::key(&self.key)
    }

    /// The tenant that owns the record.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The endpoint family, e.g. `payments.create`.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The client's idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Byte form used as the storage key: `tenant 0x00 scope 0x00 key`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.tenant.len() + self.scope.len() + self.key.len() + 2);
        out.extend_from_slice(self.tenant.as_bytes());
        out.push(0);
        out.extend_from_slice(self.scope.as_bytes());
        out.push(0);
        out.extend_from_slice(self.key.as_bytes());
        out
    }

    /// Inverse of [`RecordKey::encode`]; `None` for bytes that no valid key encodes to.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut parts = bytes.splitn(3, |b| *b == 0);
        let tenant = std::str::from_utf8(parts.next()?).ok()?;
        let scope = std::str::from_utf8(parts.next()?).ok()?;
        let key = std::str::from_utf8(parts.next()?).ok()?;
        RecordKey::new(tenant, scope, key).ok()
    }

    /// Storage prefix that selects every record of a tenant, or of one scope of a tenant.
    pub fn prefix(tenant: &str, scope: Option<&str>) -> Vec<u8> {
        let mut out = Vec::with_capacity(tenant.len() + scope.map_or(0, str::len) + 2);
        out.extend_from_slice(tenant.as_bytes());
        out.push(0);
        if let Some(scope) = scope {
            out.extend_from_slice(scope.as_bytes());
            out.push(0);
        }
        out
    }
}

impl std::fmt::Display for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.tenant, self.scope, self.key)
    }
}

/// A fencing token: unique across the cluster, strictly increasing across the grants of one
/// key, and across leader changes and restarts.
///
/// Contract §3.1: the token was first drafted as the log index of the granting entry. Idemraft groups many
/// client commands into one entry, and two grants in one entry must still get distinct,
/// ordered tokens, so the project refines the rule: the token is
/// `log_index * 2^16 + position of the command in the entry's batch`. Ordering by token is
/// ordering by (log index, position), which is apply order; `token >> 16` is the log index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct Token(pub u64);

impl Token {
    /// How many commands one log entry may carry: the slot has 16 bits.
    pub const MAX_BATCH: usize = 1 << 16;

    /// The token granted by the command at `slot` of the entry at `log_index`.
    pub fn new(log_index: u64, slot: usize) -> Token {
        Token((log_index << 16) | (slot as u64 & 0xFFFF))
    }

    /// Log index of the entry that granted this token.
    pub fn log_index(self) -> u64 {
        self.0 >> 16
    }

    /// Position of the granting command inside its entry.
    pub fn slot(self) -> u64 {
        self.0 & 0xFFFF
    }
}

impl std::fmt::Display for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a record is in its life (contract §1.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RecordState {
    /// Owned by a worker holding the current token under a lease.
    InProgress,
    /// Settled: the stored response is replayed for the rest of the record's life. A terminal
    /// failure is stored here too, with its error response.
    Completed,
    /// A retryable failure: the next claim re-acquires the key with a new token.
    Failed,
}

impl std::fmt::Display for RecordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RecordState::InProgress => "IN_PROGRESS",
            RecordState::Completed => "COMPLETED",
            RecordState::Failed => "FAILED",
        })
    }
}

/// A stored response, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Response {
    /// Status code as the caller defines it (HTTP status for the HTTP layer).
    pub status: u32,
    /// Headers to replay, in the order given.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// 32-byte request fingerprint (SHA-256, contract §6).
pub type Fingerprint = [u8; 32];

/// Everything kept per record (contract §1.2). Times are Unix milliseconds of the log's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Binds the key to one payload for its whole life; `None` when the first claim gave none.
    pub fingerprint: Option<Fingerprint>,
    /// Current state.
    pub state: RecordState,
    /// Token of the latest grant; the only one accepted from an owner.
    pub token: Token,
    /// Owner id of the latest grant.
    pub owner: String,
    /// 1 for the first grant, +1 for each re-acquire or takeover.
    pub attempt: u32,
    /// The latest grant replaced an owner whose lease expired (so a retried claim or
    /// takeover is answered exactly as the first time).
    pub taken_over: bool,
    /// Absolute lease deadline while `InProgress`; 0 otherwise.
    pub lease_expires_ms: u64,
    /// When the record was first granted.
    pub created_ms: u64,
    /// When a command addressed to this record last changed it. Resume's lease stretch and
    /// Sweep do not count: they act on all records at once, not on behalf of a caller.
    pub updated_ms: u64,
    /// When the record became `Completed`.
    pub completed_ms: Option<u64>,
    /// When the record stops existing (TTL or retention). Never earlier than a live lease.
    pub expires_ms: u64,
    /// How long the record is kept once settled, from the claim that granted it.
    pub retention_ms: u64,
    /// Short progress marker of a multi-step flow, handed to whoever takes over.
    pub recovery_point: String,
    /// Progress data of a multi-step flow, handed to whoever takes over.
    #[serde(with = "serde_bytes")]
    pub checkpoint: Vec<u8>,
    /// The stored response once `Completed`.
    pub response: Option<Response>,
}

impl Record {
    /// A record whose expiry has passed is treated as absent at once (contract §2.3).
    pub fn is_expired(&self, clock_ms: u64) -> bool {
        self.expires_ms <= clock_ms
    }

    /// The lease is alive strictly before its deadline.
    pub fn lease_alive(&self, clock_ms: u64) -> bool {
        self.state == RecordState::InProgress && self.lease_expires_ms > clock_ms
    }
}

/// One client (or leader) command, stamped with the proposer's clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// Wall-clock milliseconds of the leader when it proposed the command. The state machine
    /// only ever moves its clock forward to this value.
    pub now_ms: u64,
    /// What to do.
    pub op: Op,
}

/// The mutating operations of contract §4.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Take ownership of a key, or learn why not.
    Claim {
        /// Record identity.
        id: RecordKey,
        /// Request fingerprint, if the caller computes one.
        fingerprint: Option<Fingerprint>,
        /// Caller's owner id; the same on every retry of this claim.
        owner: String,
        /// Lease length granted to the owner.
        lease_ms: u64,
        /// Record lifetime, and retention once settled.
        ttl_ms: u64,
        /// Whether an expired lease may be taken over by this claim.
        allow_takeover: bool,
    },
    /// Settle the record with a response.
    Complete {
        /// Record identity.
        id: RecordKey,
        /// The owner's token.
        token: Token,
        /// Response to store and replay.
        response: Response,
    },
    /// Give the record up: retryable (the next claim re-acquires) or terminal (stored as a
    /// completed error response).
    Fail {
        /// Record identity.
        id: RecordKey,
        /// The owner's token.
        token: Token,
        /// `true`: FAILED, re-acquirable; `false`: COMPLETED with `response`.
        retryable: bool,
        /// Error response; required when not retryable.
        response: Option<Response>,
    },
    /// Keep a long job's lease alive.
    ExtendLease {
        /// Record identity.
        id: RecordKey,
        /// The owner's token.
        token: Token,
        /// New lease length from now.
        lease_ms: u64,
    },
    /// Record progress of a multi-step flow and extend the lease.
    Checkpoint {
        /// Record identity.
        id: RecordKey,
        /// The owner's token.
        token: Token,
        /// Short progress marker.
        recovery_point: String,
        /// Progress data.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// New lease length from now.
        lease_ms: u64,
    },
    /// Explicitly take over an in-progress record whose lease expired (or any, with `force`).
    Takeover {
        /// Record identity.
        id: RecordKey,
        /// The new owner.
        owner: String,
        /// Operator override: take over even while the lease is alive.
        force: bool,
        /// Lease length granted to the new owner.
        lease_ms: u64,
    },
    /// Delete at most `limit` expired records, oldest expiry first.
    Sweep {
        /// Upper bound on deletions in this command.
        limit: u32,
    },
    /// First command of a new leader's term: stretch live leases by the outage gap (§2).
    Resume {
        /// How often the leader proposes sweeps; the part of the gap that is normal.
        sweep_interval_ms: u64,
        /// Upper bound of the stretch.
        max_stretch_ms: u64,
    },
    /// An operator sets or clears a record quota. Appended last: the log is bincode with
    /// variant indexes, so entries written before this variant existed still decode.
    SetQuota {
        /// The tenant whose own quota this is; `None` sets the default quota, which applies to
        /// every tenant without one of its own.
        tenant: Option<String>,
        /// Most records the tenant may hold; `None` removes the quota (a tenant then falls
        /// back to the default, the default to no limit).
        max_records: Option<u64>,
    },
    /// Another command, compressed by the leader because its payload is large (decision
    /// 0030). The state machine unpacks it first and decides the command inside. Appended
    /// last, like `SetQuota`.
    Compressed(crate::compressed::Compressed),
}

/// The record quotas: replicated state, changed only by [`Op::SetQuota`], so every replica
/// refuses exactly the same claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Quotas {
    /// Applies to every tenant without a quota of its own; `None`: no limit.
    pub default: Option<u64>,
    /// Per-tenant quotas, which take precedence over the default.
    pub tenants: BTreeMap<String, u64>,
}

impl Quotas {
    /// The limit that applies to `tenant`: its own quota, else the default, else none.
    pub fn limit_for(&self, tenant: &str) -> Option<u64> {
        self.tenants.get(tenant).copied().or(self.default)
    }

    /// Whether no quota at all is set (the state of every cluster before its first SetQuota).
    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.tenants.is_empty()
    }

    /// Applies one SetQuota.
    pub fn set(&mut self, tenant: Option<&str>, max_records: Option<u64>) {
        match (tenant, max_records) {
            (None, max) => self.default = max,
            (Some(t), Some(max)) => {
                self.tenants.insert(t.to_string(), max);
            }
            (Some(t), None) => {
                self.tenants.remove(t);
            }
        }
    }
}

impl Op {
    /// The record a command addresses, if it addresses one.
    pub fn record_key(&self) -> Option<&RecordKey> {
        match self {
            Op::Claim { id, .. }
            | Op::Complete { id, .. }
            | Op::Fail { id, .. }
            | Op::ExtendLease { id, .. }
            | Op::Checkpoint { id, .. }
            | Op::Takeover { id, .. } => Some(id),
            Op::Sweep { .. } | Op::Resume { .. } | Op::SetQuota { .. } | Op::Compressed(_) => None,
        }
    }
}

/// An ownership grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The fencing token to carry on every later command and downstream.
    pub token: Token,
    /// 1 for a first grant, higher after failures and takeovers.
    pub attempt: u32,
    /// The previous owner's lease expired and this grant replaced it.
    pub takeover: bool,
    /// Absolute lease deadline.
    pub lease_expires_ms: u64,
    /// Absolute record expiry.
    pub expires_ms: u64,
    /// Progress marker left by a previous owner.
    pub recovery_point: String,
    /// Progress data left by a previous owner.
    #[serde(with = "serde_bytes")]
    pub checkpoint: Vec<u8>,
}

/// The answer to one command, decided at apply time and identical on every replica.
///
/// Conflicts are values, never errors: an error from apply stops a Raft node for good.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The caller owns the key under this grant.
    Acquired(Grant),
    /// The key was completed before: here is the stored response, as stored.
    Replay {
        /// Token of the grant that completed the record.
        token: Token,
        /// When it was completed.
        completed_ms: u64,
        /// The stored response.
        response: Response,
    },
    /// Someone else holds the key.
    InProgress {
        /// The holder's lease deadline (may be in the past when takeover was not allowed).
        lease_expires_ms: u64,
        /// Suggested wait before retrying.
        retry_after_ms: u64,
    },
    /// The key is bound to a different request fingerprint.
    Mismatch,
    /// The token is not the record's current one.
    StaleToken {
        /// The current token, so the caller can see how far behind it is.
        current: Token,
    },
    /// No live record with that identity.
    NotFound,
    /// The command does not apply to the record in its current state (for example a
    /// Complete on a record that was failed under the same token).
    WrongState {
        /// The record's state.
        state: RecordState,
    },
    /// Complete accepted (or retried after it was accepted).
    Completed {
        /// The completing token.
        token: Token,
    },
    /// Fail accepted (or retried after it was accepted).
    Failed {
        /// The failing token.
        token: Token,
        /// Whether the record is now FAILED (true) or COMPLETED with an error (false).
        retryable: bool,
    },
    /// ExtendLease or Checkpoint accepted.
    LeaseExtended {
        /// The owner's token.
        token: Token,
        /// New lease deadline.
        lease_expires_ms: u64,
    },
    /// Sweep result.
    Swept {
        /// Records deleted by this command.
        deleted: u32,
    },
    /// Resume result.
    Resumed {
        /// Leases pushed back.
        stretched: u32,
        /// By how much each was pushed back.
        stretch_ms: u64,
    },
    /// The command broke a rule; nothing changed.
    Invalid(ValidationError),
    /// A Claim that would have created a new record for a tenant that already holds as many
    /// records as its quota allows; nothing changed. Claims on existing records (replays,
    /// retries, re-acquires, takeovers) never get this. Appended after the older variants.
    QuotaExceeded {
        /// The claiming tenant.
        tenant: String,
        /// The quota in force for it.
        limit: u64,
        /// Records it holds (expired ones included until swept).
        records: u64,
    },
    /// SetQuota accepted.
    QuotaSet {
        /// The limit now in force for the tenant named (for the default: the default).
        limit: Option<u64>,
        /// Records the tenant holds (0 for the default).
        records: u64,
    },
}

/// One tenant's use of its quota, for operators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaUsage {
    /// The tenant.
    pub tenant: String,
    /// Records it holds (expired ones included until swept).
    pub records: u64,
    /// The quota in force for it: its own, else the default; `None`: no limit.
    pub limit: Option<u64>,
    /// Whether the limit is the tenant's own (otherwise the default applies).
    pub own: bool,
}

/// The quotas and their use, for operators (`idemctl quota get`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct QuotaReport {
    /// The default quota.
    pub default: Option<u64>,
    /// Tenants in name order.
    pub tenants: Vec<QuotaUsage>,
}

impl QuotaReport {
    /// The report of `quotas` and the per-tenant record `counts`: every tenant that holds
    /// records or has a quota of its own, or only `tenant` when given.
    pub fn of(quotas: &Quotas, counts: &std::collections::BTreeMap<String, u64>, tenant: Option<&str>) -> QuotaReport {
        let usage = |t: &str| QuotaUsage {
            tenant: t.to_string(),
            records: counts.get(t).copied().unwrap_or(0),
            limit: quotas.limit_for(t),
            own: quotas.tenants.contains_key(t),
        };
        let tenants = match tenant {
            Some(t) => vec![usage(t)],
            None => {
                let names: std::collections::BTreeSet<&String> = counts.keys().chain(quotas.tenants.keys()).collect();
                names.into_iter().map(|t| usage(t)).collect()
            }
        };
        QuotaReport { default: quotas.default, tenants }
    }
}

/// The public view of a record returned by Get and List.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordView {
    /// Identity.
    pub id: RecordKey,
    /// Everything stored.
    pub record: Record,
}

impl RecordView {
    /// An upper bound on the record's size as a List answer carries it: its variable-length
    /// parts plus a generous allowance for the framing of each field, in Protocol Buffers (a
    /// `Record` in a `ListResponse`) and in the peer port's bincode alike. Pages are bounded
    /// in bytes by this (see [`LIST_PAGE_BYTES`]).
    pub fn encoded_len_bound(&self) -> usize {
        /// Tags, lengths and fixed-width numbers of every field, the nested ones included.
        const FIXED: usize = 256;
        /// A header's tags and lengths.
        const PER_HEADER: usize = 24;
        let r = &self.record;
        let response = r.response.as_ref().map_or(0, |resp| {
            resp.body.len() + resp.headers.iter().map(|(n, v)| PER_HEADER + n.len() + v.len()).sum::<usize>()
        });
        FIXED
            + self.id.tenant.len()
            + self.id.scope.len()
            + self.id.key.len()
            + r.owner.len()
            + r.recovery_point.len()
            + r.checkpoint.len()
            + r.fingerprint.map_or(0, |f| f.len())
            + response
    }
}

/// Most bytes of records one List page holds, by [`RecordView::encoded_len_bound`]: half of
/// the client port's 8 MiB message limit, so a full page always fits. A page stops before a
/// record that would take it past this; its first record is taken whatever its size (the
/// largest record [`crate::Limits::CEILING`] allows, about 5.1 MiB, still fits in a message).
pub const LIST_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// One page of a List: the records, and where the next page starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListPage {
    /// Matching records in key order.
    pub records: Vec<RecordView>,
    /// Set when the page stopped at its record limit or byte bound: more records may follow,
    /// after this key (the last record of the page). `None`: the listing is complete.
    pub next_after: Option<RecordKey>,
}

/// Filter for List (an operator's reconciliation query).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ListQuery {
    /// Tenant whose records are listed (List never crosses tenants).
    pub tenant: String,
    /// Only this scope, when given.
    pub scope: Option<String>,
    /// Only records in this state, when given.
    pub state: Option<RecordState>,
    /// Only IN_PROGRESS records whose lease has expired (abandoned work).
    pub abandoned_only: bool,
    /// Resume after this key (pagination); the last key of the previous page.
    pub start_after: Option<RecordKey>,
    /// Page size.
    pub limit: usize,
}
