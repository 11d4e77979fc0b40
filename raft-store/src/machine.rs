//! The state machine: every rule of contract §2–§4, written once.
//!
//! `apply` is a pure function of (state, log index, command): no IO of its own, no clock, no
//! randomness. The state is reached through [`StateStore`], which the in-memory state
//! ([`crate::MemState`]) and the sled state machine implement; both give the same answers
//! because the rules live only here.
//!
//! Time: each command carries the proposer's `now_ms`; before a valid command is decided the
//! machine's clock becomes `max(clock, now_ms)`, advanced by at most [`MAX_CLOCK_STEP_MS`] per
//! command (see [`next_clock`]), so time never runs backwards, one badly stamped command cannot
//! expire every record at once, and every replica decides with the same clock. An invalid
//! command changes nothing, the clock included. Reads judge expiry by the same log clock,
//! never by the reading node's own.

use crate::planted::{self, Bug};
use crate::types::{
    Command, Fingerprint, Grant, ListPage, ListQuery, Op, Outcome, Quotas, Record, RecordKey, RecordState, RecordView,
    Response, Token,
};
use crate::validate::{CheckOp, Limits, ValidationError};

/// Shortest retry hint given with an IN_PROGRESS answer.
pub const MIN_RETRY_AFTER_MS: u64 = 100;

/// Most one command may move a running clock forward. A clock held back only lets records and
/// leases live a little longer (the safe direction) and catches up within a few commands (the
/// leader sweeps every second); a clock pushed too far ahead would expire live records and hand
/// completed keys out again.
pub const MAX_CLOCK_STEP_MS: u64 = 60 * 60 * 1000;

/// Stamps after the year 3000 are refused as `Invalid`: no honest clock produces them.
pub const MAX_PLAUSIBLE_NOW_MS: u64 = 32_503_680_000_000;

/// The clock after a valid command stamped `now_ms`, from clock `prev`. A fresh state (clock
/// 0) takes its first stamp as it is.
pub fn next_clock(prev: u64, now_ms: u64) -> u64 {
    if now_ms <= prev {
        prev
    } else if prev == 0 {
        now_ms
    } else {
        now_ms.min(prev.saturating_add(MAX_CLOCK_STEP_MS))
    }
}

/// What the rules need from a state: records by identity, two ordered indexes, the clock, the
/// quotas and the number of records per tenant.
///
/// Implementations keep the expiry index (records by `expires_ms`), the lease index
/// (IN_PROGRESS records by `lease_expires_ms`) and the per-tenant record counts in step with
/// `put` and `remove`; `old` is the record being replaced, which the caller always has at hand
/// (`put` with `old = None` adds a record to its tenant's count, `remove` takes one away).
pub trait StateStore {
    /// Failure of the underlying storage (never a business outcome).
    type Error;

    /// The machine's clock: the largest `now_ms` applied so far.
    fn clock(&self) -> u64;
    /// Moves the clock (the caller only ever moves it forward).
    fn set_clock(&mut self, ms: u64);
    /// The stored record, expired or not.
    fn get(&mut self, id: &RecordKey) -> Result<Option<Record>, Self::Error>;
    /// The stored record, its response body possibly left empty: for a caller that only
    /// deletes it or reads its metadata, so a store that keeps large bodies apart need not
    /// read them.
    fn get_without_body(&mut self, id: &RecordKey) -> Result<Option<Record>, Self::Error> {
        self.get(id)
    }
    /// Stores `new` in place of `old`.
    fn put(&mut self, id: &RecordKey, old: Option<&Record>, new: Record) -> Result<(), Self::Error>;
    /// Deletes a record.
    fn remove(&mut self, id: &RecordKey, old: &Record) -> Result<(), Self::Error>;
    /// Up to `limit` identities with `expires_ms <= clock_ms`, earliest expiry first.
    fn expired(&mut self, clock_ms: u64, limit: usize) -> Result<Vec<RecordKey>, Self::Error>;
    /// Records stored for `tenant`, expired ones included until they are swept or replaced.
    fn tenant_records(&mut self, tenant: &str) -> Result<u64, Self::Error>;
    /// The record quotas in force.
    fn quotas(&self) -> &Quotas;
    /// Replaces the quotas (only SetQuota does).
    fn set_quotas(&mut self, quotas: Quotas);
    /// IN_PROGRESS identities with `lease_expires_ms > after_ms`.
    fn leases_after(&mut self, after_ms: u64) -> Result<Vec<RecordKey>, Self::Error>;
    /// Records whose encoded key starts with `prefix`, in key order, after `start_after` when
    /// given; `visit` returns `false` to stop.
    fn scan(
        &mut self,
        prefix: &[u8],
        start_after: Option<&RecordKey>,
        visit: &mut dyn FnMut(RecordKey, Record) -> bool,
    ) -> Result<(), Self::Error>;
}

/// Applies the commands of one log entry in order; outcome `i` answers command `i`.
///
/// Command `i` is numbered slot `i` for its fencing token (see [`Token`]). Commands beyond
/// [`Token::MAX_BATCH`] are answered `Invalid` without effect.
pub fn apply_batch<S: StateStore>(
    state: &mut S,
    log_index: u64,
    commands: &[Command],
) -> Result<Vec<Outcome>, S::Error> {
    let mut out = Vec::with_capacity(commands.len());
    for (slot, cmd) in commands.iter().enumerate() {
        if slot >= Token::MAX_BATCH {
            out.push(Outcome::Invalid(ValidationError::BatchTooLarge { max: Token::MAX_BATCH as u64 }));
            continue;
        }
        out.push(apply(state, Token::new(log_index, slot), cmd)?);
    }
    Ok(out)
}

/// Applies one command. `token` is what a grant made by this command will carry.
pub fn apply<S: StateStore>(state: &mut S, token: Token, cmd: &Command) -> Result<Outcome, S::Error> {
    // Decided as the command inside, so a compressed command changes exactly what the plain
    // one would (decision 0030); one that does not unpack changes nothing, like any invalid one.
    if let Op::Compressed(packed) = &cmd.op {
        return match packed.unpack() {
            Ok(op) => apply(state, token, &Command { now_ms: cmd.now_ms, op }),
            Err(e) => Ok(Outcome::Invalid(e)),
        };
    }
    // The ceiling, not the node's configured limits: every replica must agree on the answer.
    if let Err(e) = Limits::CEILING.check_op(&cmd.op) {
        return Ok(Outcome::Invalid(e));
    }
    if cmd.now_ms > MAX_PLAUSIBLE_NOW_MS {
        return Ok(Outcome::Invalid(ValidationError::OutOfRange {
            field: "now_ms".into(),
            got: cmd.now_ms,
            min: 0,
            max: MAX_PLAUSIBLE_NOW_MS,
            unit: " ms".into(),
            fix: "the proposing node's clock is wrong; fix its time source".into(),
        }));
    }
    let prev_clock = state.clock();
    let now = if planted::active(Bug::LocalClock) {
        planted_local_clock(prev_clock)
    } else {
        next_clock(prev_clock, cmd.now_ms)
    };
    if now != prev_clock {
        state.set_clock(now);
    }
    match &cmd.op {
        Op::Claim { id, fingerprint, owner, lease_ms, ttl_ms, allow_takeover } => {
            let stored = state.get(id)?;
            let rec = match stored {
                Some(rec) if !rec.is_expired(now) || replays_expired(&rec) => rec,
                gone => {
                    // Only a claim that adds a record can be refused by the quota: an expired
                    // record of the same key is replaced in place, so the count stays.
                    if gone.is_none() {
                        if let Some(limit) = state.quotas().limit_for(id.tenant()) {
                            let records = state.tenant_records(id.tenant())?;
                            if records >= limit {
                                return Ok(Outcome::QuotaExceeded { tenant: id.tenant().to_string(), limit, records });
                            }
                        }
                    }
                    let lease_expires_ms = now.saturating_add(*lease_ms);
                    let rec = Record {
                        fingerprint: *fingerprint,
                        state: RecordState::InProgress,
                        token,
                        owner: owner.clone(),
                        attempt: 1,
                        taken_over: false,
                        lease_expires_ms,
                        created_ms: now,
                        updated_ms: now,
                        completed_ms: None,
                        expires_ms: now.saturating_add(*ttl_ms).max(lease_expires_ms),
                        retention_ms: *ttl_ms,
                        recovery_point: String::new(),
                        checkpoint: Vec::new(),
                        response: None,
                    };
                    let grant = grant_of(&rec);
                    state.put(id, gone.as_ref(), rec)?;
                    return Ok(Outcome::Acquired(grant));
                }
            };
            if let (Some(have), Some(want)) = (&rec.fingerprint, fingerprint) {
                if have != want {
                    return Ok(Outcome::Mismatch);
                }
            }
            match rec.state {
                RecordState::InProgress if rec.owner == *owner && planted::active(Bug::RetryNewToken) => {
                    regrant(state, id, rec, token, owner, *lease_ms, Some(*ttl_ms), now, false)
                }
                RecordState::InProgress if rec.owner == *owner => Ok(Outcome::Acquired(grant_of(&rec))),
                RecordState::InProgress if lease_holds(&rec, now) || !allow_takeover => Ok(in_progress(&rec, now)),
                RecordState::InProgress => regrant(state, id, rec, token, owner, *lease_ms, Some(*ttl_ms), now, true),
                RecordState::Completed => Ok(replay(rec)),
                RecordState::Failed => regrant(state, id, rec, token, owner, *lease_ms, Some(*ttl_ms), now, false),
            }
        }
        Op::Complete { id, token: by, response } => {
            let rec = match owned(state, id, *by, now)? {
                Ok(rec) => rec,
                Err(outcome) => return Ok(outcome),
            };
            match rec.state {
                RecordState::InProgress => {
                    settle(state, id, rec, response.clone(), now)?;
                    Ok(Outcome::Completed { token: *by })
                }
                // The retry of a Complete that already went through.
                RecordState::Completed if rec.response.as_ref() == Some(response) => {
                    Ok(Outcome::Completed { token: *by })
                }
                other => Ok(Outcome::WrongState { state: other }),
            }
        }
        Op::Fail { id, token: by, retryable, response } => {
            let mut rec = match owned(state, id, *by, now)? {
                Ok(rec) => rec,
                Err(outcome) => return Ok(outcome),
            };
            let done = Outcome::Failed { token: *by, retryable: *retryable };
            match (rec.state, retryable, response) {
                (RecordState::InProgress, true, _) => {
                    let old = rec.clone();
                    rec.state = RecordState::Failed;
                    rec.lease_expires_ms = 0;
                    rec.updated_ms = now;
                    state.put(id, Some(&old), rec)?;
                    Ok(done)
                }
                (RecordState::InProgress, false, Some(response)) => {
                    settle(state, id, rec, response.clone(), now)?;
                    Ok(done)
                }
                // Retries of a Fail that already went through.
                (RecordState::Failed, true, _) => Ok(done),
                (RecordState::Completed, false, r) if rec.response.as_ref() == r.as_ref() => Ok(done),
                (other, _, _) => Ok(Outcome::WrongState { state: other }),
            }
        }
        Op::ExtendLease { id, token: by, lease_ms } => extend(state, id, *by, now, *lease_ms, None),
        Op::Checkpoint { id, token: by, recovery_point, data, lease_ms } => {
            extend(state, id, *by, now, *lease_ms, Some((recovery_point, data)))
        }
        Op::Takeover { id, owner, force, lease_ms } => {
            let Some(rec) = live(state, id, now)? else {
                return Ok(Outcome::NotFound);
            };
            match rec.state {
                // A retried takeover must not conflict with itself.
                RecordState::InProgress if rec.owner == *owner => Ok(Outcome::Acquired(grant_of(&rec))),
                RecordState::InProgress if lease_holds(&rec, now) && !force => Ok(in_progress(&rec, now)),
                RecordState::InProgress => regrant(state, id, rec, token, owner, *lease_ms, None, now, true),
                other => Ok(Outcome::WrongState { state: other }),
            }
        }
        Op::Sweep { limit } => {
            let ids = state.expired(now, *limit as usize)?;
            let mut deleted = 0u32;
            for id in ids.iter().take(*limit as usize) {
                if let Some(rec) = state.get_without_body(id)? {
                    // The index said so; the record decides.
                    if rec.is_expired(now) {
                        state.remove(id, &rec)?;
                        deleted += 1;
                    }
                }
            }
            Ok(Outcome::Swept { deleted })
        }
        Op::Resume { sweep_interval_ms, max_stretch_ms } => {
            let gap = now - prev_clock;
            let stretch_ms = gap.saturating_sub(*sweep_interval_ms).min(*max_stretch_ms);
            let mut stretched = 0u32;
            if stretch_ms > 0 {
                for id in state.leases_after(prev_clock)? {
                    let Some(mut rec) = state.get(&id)? else { continue };
                    // Alive at the previous clock: its owner may have been renewing into the void.
                    // Such a record may look expired at the new clock for an instant; Resume
                    // decides at the new clock in one step, so nobody ever saw it absent.
                    if rec.state != RecordState::InProgress || rec.lease_expires_ms <= prev_clock {
                        continue;
                    }
                    let old = rec.clone();
                    rec.lease_expires_ms = rec.lease_expires_ms.saturating_add(stretch_ms);
                    rec.expires_ms = rec.expires_ms.max(rec.lease_expires_ms);
                    state.put(&id, Some(&old), rec)?;
                    stretched += 1;
                }
            }
            Ok(Outcome::Resumed { stretched, stretch_ms })
        }
        Op::SetQuota { tenant, max_records } => {
            let mut quotas = state.quotas().clone();
            quotas.set(tenant.as_deref(), *max_records);
            state.set_quotas(quotas);
            // A lowered quota deletes nothing: the tenant keeps its records, and new ones are
            // refused until enough of them expire.
            Ok(match tenant {
                Some(t) => Outcome::QuotaSet { limit: state.quotas().limit_for(t), records: state.tenant_records(t)? },
                None => Outcome::QuotaSet { limit: state.quotas().default, records: 0 },
            })
        }
        // Not reached: the top of this function unpacks every compressed command.
        Op::Compressed(_) => Ok(Outcome::Invalid(ValidationError::BadCompressedCommand {
            detail: "it holds another compressed command".into(),
        })),
    }
}

/// The record if it exists and has not expired at `now`.
fn live<S: StateStore>(state: &mut S, id: &RecordKey, now: u64) -> Result<Option<Record>, S::Error> {
    Ok(state.get(id)?.filter(|r| !r.is_expired(now)))
}

/// The live record when `token` is its current token; otherwise the outcome to answer.
fn owned<S: StateStore>(
    state: &mut S,
    id: &RecordKey,
    token: Token,
    now: u64,
) -> Result<Result<Record, Outcome>, S::Error> {
    Ok(match live(state, id, now)? {
        None => Err(Outcome::NotFound),
        Some(rec) if rec.token != token && !planted::active(Bug::SkipTokenCheck) => {
            Err(Outcome::StaleToken { current: rec.token })
        }
        Some(rec) => Ok(rec),
    })
}

/// Whether a live lease blocks a takeover (always, unless the `ignore-leases` bug is planted;
/// `early-lease-expiry` judges it 400 ms ahead of the log clock).
fn lease_holds(rec: &Record, now: u64) -> bool {
    let judged = if planted::active(Bug::EarlyLeaseExpiry) { now.saturating_add(400) } else { now };
    rec.lease_alive(judged) && !planted::active(Bug::IgnoreLeases)
}

/// The planted `replay-expired` bug: an expired completed record still counts as stored.
fn replays_expired(rec: &Record) -> bool {
    rec.state == RecordState::Completed && planted::active(Bug::ReplayExpired)
}

/// The planted `local-clock` bug: this replica's own wall clock instead of the log's stamp.
fn planted_local_clock(prev: u64) -> u64 {
    let wall =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    wall.max(prev)
}

fn grant_of(rec: &Record) -> Grant {
    Grant {
        token: rec.token,
        attempt: rec.attempt,
        takeover: rec.taken_over,
        lease_expires_ms: rec.lease_expires_ms,
        expires_ms: rec.expires_ms,
        recovery_point: rec.recovery_point.clone(),
        checkpoint: rec.checkpoint.clone(),
    }
}

fn in_progress(rec: &Record, now: u64) -> Outcome {
    Outcome::InProgress {
        lease_expires_ms: rec.lease_expires_ms,
        retry_after_ms: rec.lease_expires_ms.saturating_sub(now).max(MIN_RETRY_AFTER_MS),
    }
}

fn replay(rec: Record) -> Outcome {
    Outcome::Replay {
        token: rec.token,
        completed_ms: rec.completed_ms.unwrap_or(rec.updated_ms),
        response: rec.response.unwrap_or_default(),
    }
}

/// What a Claim with `fingerprint` answers from `rec`, a live record, when no later command
/// can change that answer while the record lives: MISMATCH against a bound fingerprint (no
/// command ever rewrites a record's fingerprint) or REPLAY of a COMPLETED record (COMPLETED is
/// final). `None` when the answer depends on the moment (IN_PROGRESS, FAILED). The checks run
/// in the order `apply` runs them, and the REPLAY is built by the same function, so the
/// leader's read-only fast path (idemraft-node `fast_read`) answers exactly as the log would.
pub fn settled_claim_answer(rec: &Record, fingerprint: Option<&Fingerprint>) -> Option<Outcome> {
    if let (Some(have), Some(want)) = (&rec.fingerprint, fingerprint) {
        if have != want {
            return Some(Outcome::Mismatch);
        }
    }
    (rec.state == RecordState::Completed).then(|| replay(rec.clone()))
}

/// A new grant on an existing record: re-acquire after a retryable failure, or takeover.
#[allow(clippy::too_many_arguments)]
fn regrant<S: StateStore>(
    state: &mut S,
    id: &RecordKey,
    rec: Record,
    token: Token,
    owner: &str,
    lease_ms: u64,
    ttl_ms: Option<u64>,
    now: u64,
    takeover: bool,
) -> Result<Outcome, S::Error> {
    let mut new = rec.clone();
    new.state = RecordState::InProgress;
    new.token = token;
    new.owner = owner.to_string();
    new.attempt = rec.attempt.saturating_add(1);
    new.taken_over = takeover;
    new.lease_expires_ms = now.saturating_add(lease_ms);
    new.updated_ms = now;
    if let Some(ttl_ms) = ttl_ms {
        new.retention_ms = ttl_ms;
        new.expires_ms = now.saturating_add(ttl_ms);
    }
    new.expires_ms = new.expires_ms.max(new.lease_expires_ms);
    let grant = grant_of(&new);
    state.put(id, Some(&rec), new)?;
    Ok(Outcome::Acquired(grant))
}

fn settle<S: StateStore>(
    state: &mut S,
    id: &RecordKey,
    rec: Record,
    response: Response,
    now: u64,
) -> Result<(), S::Error> {
    let mut new = rec.clone();
    new.state = RecordState::Completed;
    new.lease_expires_ms = 0;
    new.updated_ms = now;
    new.completed_ms = Some(now);
    new.expires_ms = now.saturating_add(rec.retention_ms);
    new.response = Some(response);
    state.put(id, Some(&rec), new)
}

fn extend<S: StateStore>(
    state: &mut S,
    id: &RecordKey,
    token: Token,
    now: u64,
    lease_ms: u64,
    progress: Option<(&String, &Vec<u8>)>,
) -> Result<Outcome, S::Error> {
    let rec = match owned(state, id, token, now)? {
        Ok(rec) => rec,
        Err(outcome) => return Ok(outcome),
    };
    if rec.state != RecordState::InProgress {
        return Ok(Outcome::WrongState { state: rec.state });
    }
    let mut new = rec.clone();
    // Extending never shortens a lease; an owner whose lease lapsed but who still holds the
    // current token (nobody took over) may revive it, because fencing is by token.
    new.lease_expires_ms = rec.lease_expires_ms.max(now.saturating_add(lease_ms));
    new.expires_ms = new.expires_ms.max(new.lease_expires_ms);
    new.updated_ms = now;
    if let Some((rp, data)) = progress {
        new.recovery_point = rp.clone();
        new.checkpoint = data.clone();
    }
    let lease_expires_ms = new.lease_expires_ms;
    state.put(id, Some(&rec), new)?;
    Ok(Outcome::LeaseExtended { token, lease_expires_ms })
}

/// Get: the record's public view, `None` when absent or expired by the log's clock.
pub fn get<S: StateStore>(state: &mut S, id: &RecordKey) -> Result<Option<RecordView>, S::Error> {
    let now = state.clock();
    Ok(live(state, id, now)?.map(|record| RecordView { id: id.clone(), record }))
}

/// A List page being filled, bounded by the query's record limit and by bytes.
#[derive(Debug)]
pub struct PageBuilder {
    limit: usize,
    max_bytes: usize,
    bytes: usize,
    records: Vec<RecordView>,
    full: bool,
}

impl PageBuilder {
    /// An empty page of at most `limit` records and, past its first record, `max_bytes` by
    /// [`RecordView::encoded_len_bound`].
    pub fn new(limit: usize, max_bytes: usize) -> PageBuilder {
        PageBuilder { limit, max_bytes, bytes: 0, records: Vec::new(), full: limit == 0 }
    }

    /// Takes `record` unless the page is full or the record would take it past its byte
    /// bound; false when it was not taken (the page is then full).
    fn offer(&mut self, record: RecordView) -> bool {
        let size = record.encoded_len_bound();
        // The first record goes in whatever its size: a page that could hold none would
        // stall the listing for good.
        if self.full || (!self.records.is_empty() && self.bytes + size > self.max_bytes) {
            self.full = true;
            return false;
        }
        self.bytes += size;
        self.records.push(record);
        self.full = self.records.len() >= self.limit;
        true
    }

    /// Whether the page takes no more records.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// The finished page: a full one says where the next starts.
    pub fn finish(self) -> ListPage {
        let next_after = if self.full { self.records.last().map(|v| v.id.clone()) } else { None };
        ListPage { records: self.records, next_after }
    }
}

/// One step of List: scans at most `max_scan` stored records of the listing `q` after
/// `after` (the query's own `start_after` on the first step), offering the live ones that
/// match to `page`, judged by the log's clock now. Returns the key to resume after when the
/// scan stopped at `max_scan` with room left in the page; `None` when the listing is done
/// (the page is full or the tenant's records ran out). Steps may run against different
/// states: each record is read whole from the state of its step.
pub fn list_step<S: StateStore>(
    state: &mut S,
    q: &ListQuery,
    after: Option<&RecordKey>,
    max_scan: usize,
    page: &mut PageBuilder,
) -> Result<Option<RecordKey>, S::Error> {
    if page.is_full() || max_scan == 0 {
        return Ok(None);
    }
    let now = state.clock();
    let prefix = RecordKey::prefix(&q.tenant, q.scope.as_deref());
    let mut scanned = 0;
    let mut last = None;
    state.scan(&prefix, after, &mut |id, record| {
        scanned += 1;
        let keep = !record.is_expired(now)
            && q.state.is_none_or(|s| s == record.state)
            && (!q.abandoned_only || (record.state == RecordState::InProgress && !record.lease_alive(now)));
        if keep && (!page.offer(RecordView { id: id.clone(), record }) || page.is_full()) {
            return false;
        }
        last = Some(id);
        scanned < max_scan
    })?;
    Ok(if page.is_full() || scanned < max_scan { None } else { last })
}

/// List: live records of one tenant (and scope) matching the query, in key order, judged by
/// the log's clock, in one page of at most `q.limit` records and `max_bytes` (see
/// [`PageBuilder`]), all read from this one state.
pub fn list<S: StateStore>(state: &mut S, q: &ListQuery, max_bytes: usize) -> Result<ListPage, S::Error> {
    let mut page = PageBuilder::new(q.limit, max_bytes);
    list_step(state, q, q.start_after.as_ref(), usize::MAX, &mut page)?;
    Ok(page.finish())
}
