//! The recorded history of a run: what each client asked, of which key, when, and what it
//! learned. This module owns the operation format, its JSON-lines encoding and the
//! [`Recorder`] that concurrent clients share while a run is going.
//!
//! Times are nanoseconds on one monotonic clock ([`Clock`]) whose origin is fixed when the
//! recorder is created, so call and return times of different clients are comparable. An
//! operation whose outcome is not known (a timeout, a lost reply, UNAVAILABLE) keeps
//! `return_ns: None` and `Output::Unknown`; the checkers treat it as returning at +infinity.

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Identifier of an operation, unique in a history.
pub type OpId = u64;

/// A whole run's operations, in invocation order.
pub type History = Vec<Op>;

/// One client operation against one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique in a history.
    pub id: OpId,
    /// Logical client; a client has at most one operation in flight.
    pub client: u32,
    /// Node the call was sent to or answered by, if known.
    pub node: Option<u64>,
    /// Record key (one scope per run).
    pub key: String,
    /// Invocation time on the harness clock.
    pub call_ns: u64,
    /// Return time on the harness clock; `None` when the outcome is unknown.
    pub return_ns: Option<u64>,
    /// What was asked.
    pub input: Input,
    /// What was answered.
    pub output: Output,
}

impl Op {
    /// Whether the outcome is unknown: the operation may or may not have taken effect.
    pub fn is_unknown(&self) -> bool {
        matches!(self.output, Output::Unknown)
    }

    /// Whether the operation was definitely not applied.
    pub fn is_refused(&self) -> bool {
        matches!(self.output, Output::Refused { .. })
    }
}

/// One line for people: `#id c<client> key [call..return ns] input -> output`.
impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ret = match self.return_ns {
            Some(r) => r.to_string(),
            None => "inf".to_string(),
        };
        write!(
            f,
            "#{} c{} {} [{}..{} ns] {:?} -> {:?}",
            self.id, self.client, self.key, self.call_ns, ret, self.input, self.output
        )
    }
}

/// The request of an operation. Fingerprints are small integers standing for 32-byte digests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Input {
    /// Take ownership of the key, or learn why not.
    Claim {
        /// Caller's owner id, the same on every retry of this claim.
        owner: String,
        /// Request fingerprint.
        fingerprint: u8,
        /// Whether an expired lease may be taken over.
        allow_takeover: bool,
        /// Lease length asked for.
        lease_ms: u64,
    },
    /// Settle the record with a response body.
    Complete {
        /// The owner's token.
        token: u64,
        /// Response body to store.
        value: String,
    },
    /// Give the record up, retryable or terminal.
    Fail {
        /// The owner's token.
        token: u64,
        /// `true`: FAILED; `false`: COMPLETED with `value`.
        retryable: bool,
        /// Stored error body when terminal.
        value: Option<String>,
    },
    /// Keep the lease alive.
    Extend {
        /// The owner's token.
        token: u64,
        /// New lease length from now.
        lease_ms: u64,
    },
    /// Explicit takeover of an IN_PROGRESS record.
    Takeover {
        /// The new owner.
        owner: String,
        /// Take over even while the lease is alive.
        force: bool,
    },
    /// Linearizable read of the record.
    Get,
    /// Read that returns once the record leaves IN_PROGRESS, or at its timeout.
    Wait,
}

/// The answer of an operation, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Output {
    /// May or may not have taken effect (timeouts, lost replies, UNAVAILABLE).
    Unknown,
    /// Definitely not applied (e.g. INVALID_ARGUMENT); no effect on state.
    Refused {
        /// Why, for people reading the history.
        reason: String,
    },
    /// The caller owns the key under this grant.
    Acquired {
        /// Fencing token of the grant.
        token: u64,
        /// 1 for the first grant, +1 for each re-acquire or takeover.
        attempt: u32,
        /// The grant replaced an owner whose lease expired.
        takeover: bool,
    },
    /// The key was completed before; here is the stored body.
    Replay {
        /// Token of the grant that completed the record.
        token: u64,
        /// The stored body.
        value: String,
    },
    /// Someone else holds the key.
    InProgress,
    /// The key is bound to a different fingerprint.
    Mismatch,
    /// The token is not the record's current one.
    StaleToken {
        /// The current token.
        current: u64,
    },
    /// No live record.
    NotFound,
    /// The command does not apply to the record's state.
    WrongState {
        /// The record's state.
        state: State,
    },
    /// Complete accepted (or retried after it was accepted).
    Completed {
        /// The completing token.
        token: u64,
    },
    /// Fail accepted (or retried after it was accepted).
    Failed {
        /// The failing token.
        token: u64,
        /// FAILED (true) or COMPLETED with an error body (false).
        retryable: bool,
    },
    /// Extend accepted.
    LeaseExtended {
        /// The owner's token.
        token: u64,
    },
    /// Get or Wait answer; `None` = no live record.
    Record {
        /// The record's public view.
        view: Option<View>,
    },
}

/// Where a record is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Owned under a lease.
    InProgress,
    /// Settled; the stored body is replayed.
    Completed,
    /// Retryable failure; the next claim re-acquires.
    Failed,
}

/// The public view of a record, as Get and Wait answer it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// Current state.
    pub state: State,
    /// Token of the latest grant.
    pub token: u64,
    /// Owner of the latest grant.
    pub owner: String,
    /// Stored response body (UTF-8) once COMPLETED.
    pub value: Option<String>,
}

/// Writes one JSON object per line.
pub fn write_jsonl(ops: &[Op], mut out: impl Write) -> std::io::Result<()> {
    for op in ops {
        serde_json::to_writer(&mut out, op)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Reads what [`write_jsonl`] wrote. Blank lines are skipped; an error names its line (from 1).
pub fn read_jsonl(input: impl BufRead) -> Result<Vec<Op>, String> {
    let mut ops = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        ops.push(serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", n + 1))?);
    }
    Ok(ops)
}

/// A monotonic clock in nanoseconds from a fixed origin. Copies share the origin, so the
/// recorder and the ledger stamp events on one time line.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose zero is now.
    pub fn new() -> Clock {
        Clock { origin: Instant::now() }
    }

    /// Nanoseconds since the origin.
    pub fn now_ns(&self) -> u64 {
        // u64 nanoseconds last 584 years; saturate rather than wrap.
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Collects operations from concurrent clients. Cheap to clone; all clones share one history.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    clock: Clock,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Recorder {
    /// An empty history whose clock starts now.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// The clock the recorder stamps with, to share with the ledger.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op>> {
        // A client that panicked mid-record cannot leave an op half-written: every update is
        // a single assignment, so the data behind a poisoned lock is still whole.
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an invocation and returns its id. Until [`Recorder::ok`] is called the outcome
    /// is unknown.
    pub fn invoke(&self, client: u32, node: Option<u64>, key: impl Into<String>, input: Input) -> OpId {
        let key = key.into();
        let mut ops = self.lock();
        // Stamp under the lock so ids and call times increase together.
        let call_ns = self.clock.now_ns();
        let id = ops.len() as OpId;
        ops.push(Op { id, client, node, key, call_ns, return_ns: None, input, output: Output::Unknown });
        id
    }

    /// Records a definite answer (including [`Output::Refused`]).
    pub fn ok(&self, id: OpId, output: Output) {
        let mut ops = self.lock();
        let return_ns = self.clock.now_ns();
        if let Some(op) = usize::try_from(id).ok().and_then(|i| ops.get_mut(i)) {
            op.return_ns = Some(return_ns);
            op.output = output;
        }
    }

    /// Like [`Recorder::ok`], also naming the node that answered (a redirect may land the
    /// call elsewhere than where it was sent).
    pub fn ok_from(&self, id: OpId, node: Option<u64>, output: Output) {
        let mut ops = self.lock();
        let return_ns = self.clock.now_ns();
        if let Some(op) = usize::try_from(id).ok().and_then(|i| ops.get_mut(i)) {
            op.return_ns = Some(return_ns);
            op.output = output;
            op.node = node;
        }
    }

    /// Records that the outcome is unknown (the default for an op never answered).
    pub fn unknown(&self, id: OpId) {
        let mut ops = self.lock();
        if let Some(op) = usize::try_from(id).ok().and_then(|i| ops.get_mut(i)) {
            op.return_ns = None;
            op.output = Output::Unknown;
        }
    }

    /// Operations recorded so far, in flight included.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The history so far, in invocation order. Ops still in flight appear as unknown.
    pub fn finish(&self) -> Vec<Op> {
        self.lock().clone()
    }
}
