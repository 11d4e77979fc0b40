//! Model-based test of the pure state machine.
//!
//! A reference model, written from the contract (`docs/contract.md` §1–§5, with its
//! refinements: fencing token = `log_index * 2^16 + slot`, monotonic log clock, expired = absent,
//! Resume stretches, bounded Sweep), runs the same random logs as [`machine::apply_batch`] on a
//! [`MemState`]. The two must give the same outcome for every command and hold byte-identical
//! records and the same clock after every command. Independently of the model, safety invariants
//! are checked on the real state after every command: fencing tokens are globally unique and
//! strictly increasing, each grant completes at most once, a live settled record never changes,
//! expired records are invisible to `get`, and Sweep deletes only expired records, at most its
//! limit. Finally `apply_batch` must agree with applying the same commands one by one.
//!
//! Quotas: the model counts a tenant's records by looking at its map, the real state keeps a
//! running count; after every command the two must agree for every tenant, a claim refused
//! by the quota must have changed nothing but the clock, and only a claim on a key with no
//! stored record (not even an expired one) may be refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;

use idemraft_store::machine::{self, StateStore};
use idemraft_store::validate::CheckOp;
use idemraft_store::{
    Command, Fingerprint, Grant, Limits, MemState, Op, Outcome, Record, RecordKey, RecordState, Response, Token,
    ValidationError,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::FileFailurePersistence;

const DAY: u64 = 24 * 60 * 60 * 1_000;
/// Shortest retry hint the contract promises with an IN_PROGRESS answer.
const MIN_RETRY_AFTER_MS: u64 = 100;
/// Leader clocks start well away from 0 so that backwards skews stay realistic.
const T0: u64 = 1_000_000;

// ---------------------------------------------------------------------------------------------
// Fixtures: few identities so commands collide, several owners, a few responses.

/// Number of valid identities; index `VALID_KEYS` is a malformed identity.
const VALID_KEYS: usize = 3;

fn keys() -> Vec<RecordKey> {
    // Same key string in two tenants, and two keys in one scope: only the full triple identifies.
    let mut keys = vec![
        RecordKey::new("acme", "payments.create", "key-0000000000000001").unwrap(),
        RecordKey::new("acme", "payments.create", "key-0000000000000002").unwrap(),
        RecordKey::new("globex", "payments.create", "key-0000000000000001").unwrap(),
    ];
    // A key that a foreign node let through: only reachable by deserialising, as from the log.
    let raw = bincode::serialize(&("acme", "payments.create", "short")).unwrap();
    keys.push(bincode::deserialize::<RecordKey>(&raw).unwrap());
    keys
}

const OWNERS: [&str; 4] = ["worker-a", "worker-b", "worker-c", "worker-d"];

fn owner(i: usize) -> String {
    match i {
        0..=3 => OWNERS[i].to_string(),
        4 => String::new(),
        _ => "o".repeat(129),
    }
}

fn fingerprint(i: usize) -> Option<Fingerprint> {
    match i {
        0 => None,
        1 => Some([1; 32]),
        _ => Some([2; 32]),
    }
}

fn response(i: usize) -> Response {
    match i {
        0 => Response { status: 200, headers: vec![], body: b"ok".to_vec() },
        1 => Response {
            status: 201,
            headers: vec![("Location".into(), "/orders/1".into()), ("Content-Type".into(), "text/plain".into())],
            body: b"created".to_vec(),
        },
        2 => Response { status: 402, headers: vec![], body: b"card declined".to_vec() },
        // Over the ceiling's header count: apply must refuse it.
        _ => Response { status: 200, headers: vec![("x".into(), "y".into()); 65], body: vec![] },
    }
}

fn recovery_point(i: usize) -> String {
    match i {
        0 => String::new(),
        1 => "step-1".into(),
        2 => "step-2".into(),
        _ => "r".repeat(1025),
    }
}

fn checkpoint_data(i: usize) -> Vec<u8> {
    match i {
        0 => vec![],
        1 => vec![1, 2, 3],
        _ => vec![9; 16],
    }
}

// ---------------------------------------------------------------------------------------------
// The reference model.

/// The log clock's rule, restated: forward only, at most one hour per command once running;
/// a fresh state takes its first stamp as it is.
fn model_next_clock(prev: u64, now_ms: u64) -> u64 {
    if now_ms <= prev {
        prev
    } else if prev == 0 {
        now_ms
    } else {
        now_ms.min(prev + 3_600_000)
    }
}

/// Input rules of Limits::CEILING, restated here so that what counts as invalid is decided
/// independently of validate.rs (only the error value is taken from there).
fn model_valid(op: &Op) -> bool {
    let lease_ok = |ms: u64| (1..=DAY).contains(&ms);
    let owner_ok = |o: &str| (1..=128).contains(&o.len());
    let response_ok = |r: &Response| {
        r.body.len() <= 4 * 1024 * 1024
            && r.headers.len() <= 64
            && r.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() <= 64 * 1024
    };
    if let Some(id) = op.record_key() {
        if id.validate().is_err() {
            return false;
        }
    }
    match op {
        Op::Claim { owner, lease_ms, ttl_ms, .. } => {
            owner_ok(owner) && lease_ok(*lease_ms) && (1_000..=365 * DAY).contains(ttl_ms)
        }
        Op::Complete { response, .. } => response_ok(response),
        Op::Fail { retryable, response, .. } => match response {
            Some(r) => response_ok(r),
            None => *retryable,
        },
        Op::ExtendLease { lease_ms, .. } => lease_ok(*lease_ms),
        Op::Checkpoint { recovery_point, data, lease_ms, .. } => {
            lease_ok(*lease_ms) && recovery_point.len() <= 1024 && data.len() <= 1024 * 1024
        }
        Op::Takeover { owner, lease_ms, .. } => owner_ok(owner) && lease_ok(*lease_ms),
        Op::Sweep { limit } => *limit <= 100_000,
        Op::Resume { sweep_interval_ms, max_stretch_ms } => *sweep_interval_ms <= DAY && *max_stretch_ms <= DAY,
        Op::SetQuota { tenant, .. } => tenant.as_ref().is_none_or(|t| {
            (1..=64).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        }),
        Op::Compressed(c) => c.unpack().is_ok_and(|op| model_valid(&op)),
    }
}

#[derive(Clone, Debug, Default)]
struct Model {
    clock: u64,
    records: BTreeMap<RecordKey, Record>,
    /// Quota of tenants without their own.
    default_quota: Option<u64>,
    /// Tenants' own quotas.
    quotas: BTreeMap<String, u64>,
}

fn grant(r: &Record) -> Grant {
    Grant {
        token: r.token,
        attempt: r.attempt,
        takeover: r.taken_over,
        lease_expires_ms: r.lease_expires_ms,
        expires_ms: r.expires_ms,
        recovery_point: r.recovery_point.clone(),
        checkpoint: r.checkpoint.clone(),
    }
}

fn busy(r: &Record, now: u64) -> Outcome {
    Outcome::InProgress {
        lease_expires_ms: r.lease_expires_ms,
        retry_after_ms: r.lease_expires_ms.saturating_sub(now).max(MIN_RETRY_AFTER_MS),
    }
}

/// Settling stores the response and restarts the record's life at the retention period.
fn settle(r: &mut Record, response: &Response, now: u64) {
    r.state = RecordState::Completed;
    r.response = Some(response.clone());
    r.completed_ms = Some(now);
    r.lease_expires_ms = 0;
    r.expires_ms = now + r.retention_ms;
    r.updated_ms = now;
}

impl Model {
    fn live(&self, id: &RecordKey) -> Option<&Record> {
        self.records.get(id).filter(|r| r.expires_ms > self.clock)
    }

    /// The live record when `token` is its current one, else the refusal to answer.
    fn owned(&self, id: &RecordKey, token: Token) -> Result<Record, Outcome> {
        match self.live(id) {
            None => Err(Outcome::NotFound),
            Some(r) if r.token != token => Err(Outcome::StaleToken { current: r.token }),
            Some(r) => Ok(r.clone()),
        }
    }

    fn store(&mut self, id: &RecordKey, r: Record) {
        self.records.insert(id.clone(), r);
    }

    /// Records a tenant holds, counted from scratch.
    fn held(&self, tenant: &str) -> u64 {
        self.records.keys().filter(|k| k.tenant() == tenant).count() as u64
    }

    fn limit(&self, tenant: &str) -> Option<u64> {
        self.quotas.get(tenant).copied().or(self.default_quota)
    }

    fn apply(&mut self, token: Token, cmd: &Command) -> Outcome {
        // A compressed command is decided as the one inside; one that does not unpack is
        // refused and changes nothing.
        if let Op::Compressed(c) = &cmd.op {
            return match c.unpack() {
                Ok(op) => self.apply(token, &Command { now_ms: cmd.now_ms, op }),
                Err(e) => Outcome::Invalid(e),
            };
        }
        let checked = Limits::CEILING.check_op(&cmd.op);
        assert_eq!(model_valid(&cmd.op), checked.is_ok(), "model and validate.rs disagree on {cmd:?}: {checked:?}");
        if let Err(e) = checked {
            // Refused commands change nothing, not even the clock.
            return Outcome::Invalid(e);
        }
        let prev = self.clock;
        self.clock = model_next_clock(prev, cmd.now_ms);
        let now = self.clock;
        match &cmd.op {
            Op::Claim { id, fingerprint, owner, lease_ms, ttl_ms, allow_takeover } => {
                self.claim(id, *fingerprint, owner, *lease_ms, *ttl_ms, *allow_takeover, token)
            }
            Op::Complete { id, token: held, response } => {
                let mut r = match self.owned(id, *held) {
                    Ok(r) => r,
                    Err(o) => return o,
                };
                match r.state {
                    RecordState::InProgress => {
                        settle(&mut r, response, now);
                        self.store(id, r);
                        Outcome::Completed { token: *held }
                    }
                    RecordState::Completed if r.response.as_ref() == Some(response) => {
                        Outcome::Completed { token: *held }
                    }
                    state => Outcome::WrongState { state },
                }
            }
            Op::Fail { id, token: held, retryable, response } => {
                let mut r = match self.owned(id, *held) {
                    Ok(r) => r,
                    Err(o) => return o,
                };
                let done = Outcome::Failed { token: *held, retryable: *retryable };
                match (r.state, *retryable) {
                    (RecordState::InProgress, true) => {
                        r.state = RecordState::Failed;
                        r.lease_expires_ms = 0;
                        r.updated_ms = now;
                        self.store(id, r);
                        done
                    }
                    (RecordState::InProgress, false) => {
                        settle(&mut r, response.as_ref().expect("validated: terminal fail has a response"), now);
                        self.store(id, r);
                        done
                    }
                    (RecordState::Failed, true) => done,
                    (RecordState::Completed, false) if r.response == *response => done,
                    (state, _) => Outcome::WrongState { state },
                }
            }
            Op::ExtendLease { id, token: held, lease_ms } => self.extend(id, *held, None, *lease_ms),
            Op::Checkpoint { id, token: held, recovery_point, data, lease_ms } => {
                self.extend(id, *held, Some((recovery_point, data)), *lease_ms)
            }
            Op::Takeover { id, owner, force, lease_ms } => {
                let Some(r) = self.live(id).cloned() else { return Outcome::NotFound };
                if r.state != RecordState::InProgress {
                    return Outcome::WrongState { state: r.state };
                }
                if r.owner == *owner {
                    return Outcome::Acquired(grant(&r));
                }
                if r.lease_expires_ms > now && !force {
                    return busy(&r, now);
                }
                let lease = now + lease_ms;
                let r = Record {
                    token,
                    owner: owner.clone(),
                    attempt: r.attempt + 1,
                    taken_over: true,
                    lease_expires_ms: lease,
                    expires_ms: r.expires_ms.max(lease),
                    updated_ms: now,
                    ..r
                };
                let g = grant(&r);
                self.store(id, r);
                Outcome::Acquired(g)
            }
            Op::Sweep { limit } => {
                let mut due: Vec<(u64, RecordKey)> = self
                    .records
                    .iter()
                    .filter(|(_, r)| r.expires_ms <= now)
                    .map(|(k, r)| (r.expires_ms, k.clone()))
                    .collect();
                due.sort();
                due.truncate(*limit as usize);
                for (_, k) in &due {
                    self.records.remove(k);
                }
                Outcome::Swept { deleted: due.len() as u32 }
            }
            Op::Resume { sweep_interval_ms, max_stretch_ms } => {
                let gap = now - prev;
                let stretch = gap.saturating_sub(*sweep_interval_ms).min(*max_stretch_ms);
                let mut stretched = 0;
                if stretch > 0 {
                    for r in self.records.values_mut() {
                        if r.state == RecordState::InProgress && r.lease_expires_ms > prev {
                            r.lease_expires_ms += stretch;
                            r.expires_ms = r.expires_ms.max(r.lease_expires_ms);
                            // The contract leaves updated_ms open here; the project keeps it as the
                            // last owner or client action, which a stretch is not.
                            stretched += 1;
                        }
                    }
                }
                Outcome::Resumed { stretched, stretch_ms: stretch }
            }
            Op::SetQuota { tenant: None, max_records } => {
                self.default_quota = *max_records;
                Outcome::QuotaSet { limit: *max_records, records: 0 }
            }
            Op::SetQuota { tenant: Some(t), max_records } => {
                match max_records {
                    Some(max) => self.quotas.insert(t.clone(), *max),
                    None => self.quotas.remove(t),
                };
                Outcome::QuotaSet { limit: self.limit(t), records: self.held(t) }
            }
            Op::Compressed(_) => unreachable!("unpacked at the top"),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn claim(
        &mut self,
        id: &RecordKey,
        fingerprint: Option<Fingerprint>,
        owner: &str,
        lease_ms: u64,
        ttl_ms: u64,
        allow_takeover: bool,
        token: Token,
    ) -> Outcome {
        let now = self.clock;
        let lease = now + lease_ms;
        let expires = (now + ttl_ms).max(lease);
        let Some(cur) = self.live(id).cloned() else {
            // A new key adds a record; an expired one is replaced and adds none.
            if !self.records.contains_key(id) {
                let held = self.held(id.tenant());
                if let Some(limit) = self.limit(id.tenant()).filter(|l| held >= *l) {
                    return Outcome::QuotaExceeded { tenant: id.tenant().to_string(), limit, records: held };
                }
            }
            let r = Record {
                fingerprint,
                state: RecordState::InProgress,
                token,
                owner: owner.to_string(),
                attempt: 1,
                taken_over: false,
                lease_expires_ms: lease,
                created_ms: now,
                updated_ms: now,
                completed_ms: None,
                expires_ms: expires,
                retention_ms: ttl_ms,
                recovery_point: String::new(),
                checkpoint: vec![],
                response: None,
            };
            let g = grant(&r);
            self.store(id, r);
            return Outcome::Acquired(g);
        };
        if let (Some(bound), Some(given)) = (cur.fingerprint, fingerprint) {
            if bound != given {
                return Outcome::Mismatch;
            }
        }
        let takeover = match cur.state {
            RecordState::InProgress if cur.owner == owner => return Outcome::Acquired(grant(&cur)),
            RecordState::InProgress if cur.lease_expires_ms > now || !allow_takeover => return busy(&cur, now),
            RecordState::InProgress => true,
            RecordState::Failed => false,
            RecordState::Completed => {
                return Outcome::Replay {
                    token: cur.token,
                    completed_ms: cur.completed_ms.expect("a completed record has a completion time"),
                    response: cur.response.expect("a completed record has a response"),
                }
            }
        };
        let r = Record {
            state: RecordState::InProgress,
            token,
            owner: owner.to_string(),
            attempt: cur.attempt + 1,
            taken_over: takeover,
            lease_expires_ms: lease,
            updated_ms: now,
            expires_ms: expires,
            retention_ms: ttl_ms,
            ..cur
        };
        let g = grant(&r);
        self.store(id, r);
        Outcome::Acquired(g)
    }

    fn extend(&mut self, id: &RecordKey, held: Token, progress: Option<(&String, &Vec<u8>)>, lease_ms: u64) -> Outcome {
        let now = self.clock;
        let mut r = match self.owned(id, held) {
            Ok(r) => r,
            Err(o) => return o,
        };
        if r.state != RecordState::InProgress {
            return Outcome::WrongState { state: r.state };
        }
        r.lease_expires_ms = r.lease_expires_ms.max(now + lease_ms);
        r.expires_ms = r.expires_ms.max(r.lease_expires_ms);
        r.updated_ms = now;
        if let Some((rp, data)) = progress {
            r.recovery_point = rp.clone();
            r.checkpoint = data.clone();
        }
        let lease_expires_ms = r.lease_expires_ms;
        self.store(id, r);
        Outcome::LeaseExtended { token: held, lease_expires_ms }
    }
}

// ---------------------------------------------------------------------------------------------
// The checker: runs entries on the real machine and the model, and checks invariants.

fn ok<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

fn snapshot(s: &MemState) -> BTreeMap<RecordKey, Record> {
    s.records().map(|(k, r)| (k.clone(), r.clone())).collect()
}

/// Names every differing field; the exhaustive destructuring makes a new Record field a
/// compile error here rather than a silently unchecked one.
fn record_diff(real: &Record, model: &Record) -> Vec<String> {
    let Record {
        fingerprint,
        state,
        token,
        owner,
        attempt,
        taken_over,
        lease_expires_ms,
        created_ms,
        updated_ms,
        completed_ms,
        expires_ms,
        retention_ms,
        recovery_point,
        checkpoint,
        response,
    } = real;
    let mut out = Vec::new();
    macro_rules! field {
        ($($f:ident),*) => {$(
            if *$f != model.$f {
                out.push(format!("{}: real {:?}, model {:?}", stringify!($f), $f, model.$f));
            }
        )*};
    }
    field!(
        fingerprint,
        state,
        token,
        owner,
        attempt,
        taken_over,
        lease_expires_ms,
        created_ms,
        updated_ms,
        completed_ms,
        expires_ms,
        retention_ms,
        recovery_point,
        checkpoint,
        response
    );
    out
}

fn state_diff(real: &BTreeMap<RecordKey, Record>, model: &BTreeMap<RecordKey, Record>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, r) in real {
        match model.get(k) {
            None => out.push(format!("{k}: only in real state: {r:?}")),
            Some(m) => out.extend(record_diff(r, m).into_iter().map(|d| format!("{k}: {d}"))),
        }
    }
    for (k, m) in model {
        if !real.contains_key(k) {
            out.push(format!("{k}: only in model: {m:?}"));
        }
    }
    out
}

struct Checker {
    keys: Vec<RecordKey>,
    real: MemState,
    model: Model,
    last_index: u64,
    /// Every new grant per identity, in grant order.
    grants: Vec<Vec<Token>>,
    /// Highest token ever granted, for global uniqueness and monotonicity.
    max_token: Option<Token>,
    /// Completion time and response per completing token, as first seen.
    settled: HashMap<Token, (u64, Response)>,
    /// Every command applied so far, for failure messages.
    history: Vec<String>,
}

impl Checker {
    fn new() -> Self {
        let keys = keys();
        Checker {
            grants: vec![Vec::new(); keys.len()],
            keys,
            real: MemState::new(),
            model: Model::default(),
            last_index: 0,
            max_token: None,
            settled: HashMap::new(),
            history: Vec::new(),
        }
    }

    fn latest(&self, key: usize) -> Option<Token> {
        self.grants[key].last().copied()
    }

    fn recent(&self) -> String {
        let from = self.history.len().saturating_sub(12);
        self.history[from..].join("\n")
    }

    /// Applies one log entry and checks everything; returns the outcomes.
    fn entry(&mut self, log_index: u64, cmds: &[Command]) -> Vec<Outcome> {
        assert!(log_index > self.last_index, "log indexes must increase");
        self.last_index = log_index;

        // The same commands one at a time on a copy, so invariants can be checked between them.
        let mut shadow = self.real.clone();
        let mut outs = Vec::with_capacity(cmds.len());
        for (slot, cmd) in cmds.iter().enumerate() {
            let token = Token::new(log_index, slot);
            let before = snapshot(&shadow);
            let clock_before = shadow.clock();
            let model_before = self.model.clone();

            let out = ok(machine::apply(&mut shadow, token, cmd));
            let want = self.model.apply(token, cmd);
            let step = format!("step {} (log index {log_index}, slot {slot}): {cmd:?}", self.history.len());
            self.history.push(format!("{step}\n    -> {out:?}"));
            let id = match &cmd.op {
                Op::Compressed(c) => c.unpack().ok().and_then(|op| op.record_key().cloned()),
                op => op.record_key().cloned(),
            };
            let id = id.as_ref();
            assert_eq!(
                out,
                want,
                "outcome differs at {step}\nreal record before: {:?}\nmodel record before: {:?}\n\
                 clock before: {clock_before}\nrecent:\n{}",
                id.and_then(|id| before.get(id)),
                id.and_then(|id| model_before.records.get(id)),
                self.recent()
            );
            let after = snapshot(&shadow);
            let diff = state_diff(&after, &self.model.records);
            assert!(
                diff.is_empty(),
                "state differs after {step} -> {out:?}:\n{}\nrecent:\n{}",
                diff.join("\n"),
                self.recent()
            );
            assert_eq!(after, self.model.records);
            assert_eq!(shadow.clock(), self.model.clock, "clock differs after {step}");
            let mut held: BTreeMap<String, u64> = BTreeMap::new();
            for k in after.keys() {
                *held.entry(k.tenant().to_string()).or_default() += 1;
            }
            assert_eq!(shadow.tenant_counts(), &held, "per-tenant record counts drifted after {step}");
            assert_eq!(shadow.quotas().default, self.model.default_quota, "default quota differs after {step}");
            assert_eq!(shadow.quotas().tenants, self.model.quotas, "quotas differ after {step}");

            // The invariants look at what was decided: the command inside a compressed one.
            let plain = match &cmd.op {
                Op::Compressed(c) => Command { now_ms: cmd.now_ms, op: c.unpack().expect("packed by the generator") },
                _ => cmd.clone(),
            };
            self.check_invariants(&mut shadow, &before, clock_before, token, &plain, &out, &step);
            outs.push(out);
        }

        let batch = ok(machine::apply_batch(&mut self.real, log_index, cmds));
        assert_eq!(batch, outs, "apply_batch differs from per-command apply at log index {log_index}");
        assert_eq!(snapshot(&self.real), snapshot(&shadow), "apply_batch state differs at log index {log_index}");
        assert_eq!(self.real.clock(), shadow.clock());

        // Expired = absent, through the public read path, on the state apply_batch produced.
        let clock = self.real.clock();
        for key in &self.keys[..VALID_KEYS] {
            let want = self.model.live(key).cloned();
            let got = ok(machine::get(&mut self.real, key)).map(|v| v.record);
            assert_eq!(got, want, "get({key}) at clock {clock} after log index {log_index}");
        }
        batch
    }

    /// Invariants checked on the real state alone, without trusting the model.
    #[allow(clippy::too_many_arguments)]
    fn check_invariants(
        &mut self,
        state: &mut MemState,
        before: &BTreeMap<RecordKey, Record>,
        clock_before: u64,
        token: Token,
        cmd: &Command,
        out: &Outcome,
        step: &str,
    ) {
        let after = snapshot(state);
        let clock = state.clock();
        let want_clock =
            if matches!(out, Outcome::Invalid(_)) { clock_before } else { model_next_clock(clock_before, cmd.now_ms) };
        assert_eq!(clock, want_clock, "clock must follow the log clock rule after {step}");

        if matches!(out, Outcome::Invalid(_)) {
            assert_eq!(&after, before, "an invalid command changed the state at {step}");
        }
        if let Outcome::QuotaExceeded { tenant, limit, records } = out {
            assert_eq!(&after, before, "a claim refused by the quota changed the state at {step}");
            let Op::Claim { id, .. } = &cmd.op else { panic!("only a claim may exceed a quota, at {step}") };
            assert!(!before.contains_key(id), "a claim on a stored record was refused by the quota at {step}");
            assert_eq!(tenant, id.tenant(), "{step}");
            assert!(records >= limit, "refused below the quota at {step}");
            let held = before.keys().filter(|k| k.tenant() == tenant).count() as u64;
            assert_eq!(*records, held, "the refusal names a wrong record count at {step}");
        }

        // Records vanish only through Sweep, only once expired, at most `limit` of them.
        let vanished: Vec<&RecordKey> = before.keys().filter(|k| !after.contains_key(*k)).collect();
        match (&cmd.op, out) {
            (Op::Sweep { limit }, Outcome::Swept { deleted }) => {
                assert_eq!(*deleted as usize, vanished.len(), "Swept count is not what was deleted at {step}");
                assert!(vanished.len() <= *limit as usize, "Sweep deleted more than its limit at {step}");
                for k in vanished {
                    assert!(before[k].expires_ms <= clock, "Sweep deleted live record {k} at {step}");
                }
            }
            (Op::Sweep { .. }, Outcome::Invalid(_)) => {
                assert!(vanished.is_empty(), "an invalid Sweep deleted at {step}")
            }
            (Op::Sweep { .. }, other) => panic!("Sweep answered {other:?} at {step}"),
            _ => assert!(vanished.is_empty(), "{vanished:?} vanished outside a Sweep at {step}"),
        }

        for (k, r) in &after {
            match r.state {
                RecordState::InProgress => {
                    assert!(r.expires_ms >= r.lease_expires_ms, "{k} would expire under its lease after {step}: {r:?}");
                }
                _ => assert_eq!(r.lease_expires_ms, 0, "{k} is settled but keeps a lease after {step}: {r:?}"),
            }
            let settled = r.state == RecordState::Completed;
            assert_eq!(r.completed_ms.is_some(), settled, "{k} completion time vs state after {step}: {r:?}");
            assert_eq!(r.response.is_some(), settled, "{k} stored response vs state after {step}: {r:?}");
            // A completion is once per grant, and its response is final.
            if let (Some(ms), Some(resp)) = (r.completed_ms, &r.response) {
                let seen = (ms, resp.clone());
                let first = self.settled.entry(r.token).or_insert_with(|| seen.clone());
                assert_eq!(*first, seen, "token {} settled twice or its response changed at {step}", r.token);
            }
        }
        // A settled record that is still alive never changes at all.
        for (k, r) in before {
            if r.state == RecordState::Completed && r.expires_ms > clock {
                assert_eq!(after.get(k), Some(r), "live completed record {k} changed at {step}");
            }
        }

        let Some(key) = cmd.op.record_key().and_then(|id| self.keys.iter().position(|k| k == id)) else { return };
        let current = self.latest(key);
        match out {
            Outcome::Acquired(g) => {
                if g.token == token {
                    assert!(
                        Some(g.token) > self.max_token,
                        "token {} is not above every earlier grant at {step}",
                        g.token
                    );
                    self.max_token = Some(g.token);
                    self.grants[key].push(g.token);
                } else {
                    assert_eq!(Some(g.token), current, "re-answered grant is not the key's latest at {step}");
                }
                let r = &after[&self.keys[key]];
                assert_eq!(r.state, RecordState::InProgress, "{step}");
                assert_eq!(grant(r), *g, "the grant answered is not the one stored at {step}");
                if let Op::Claim { owner, .. } | Op::Takeover { owner, .. } = &cmd.op {
                    assert_eq!(&r.owner, owner, "{step}");
                }
            }
            Outcome::StaleToken { current: t }
            | Outcome::Completed { token: t }
            | Outcome::Failed { token: t, .. }
            | Outcome::LeaseExtended { token: t, .. } => {
                assert_eq!(Some(*t), current, "answered token is not the key's latest grant at {step}");
            }
            Outcome::Replay { token: t, completed_ms, response } => {
                assert_eq!(Some(*t), current, "replayed token is not the key's latest grant at {step}");
                assert_eq!(
                    self.settled.get(t),
                    Some(&(*completed_ms, response.clone())),
                    "replay differs from the completion at {step}"
                );
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Random logs. Commands are generated abstractly and made concrete while running, so that
// owner commands carry tokens that were really granted.

#[derive(Clone, Debug)]
enum Pick {
    /// The key's latest grant: usually the current token, so the command takes effect.
    Latest,
    /// Any earlier grant of the key: usually stale.
    Earlier(Index),
    /// A token that may never have been granted to this key.
    Arbitrary(u64, usize),
}

#[derive(Clone, Debug)]
enum AOp {
    Claim {
        key: usize,
        fp: usize,
        owner: usize,
        lease: u64,
        ttl: u64,
        allow: bool,
    },
    Complete {
        key: usize,
        pick: Pick,
        resp: usize,
    },
    Fail {
        key: usize,
        pick: Pick,
        retryable: bool,
        resp: Option<usize>,
    },
    Extend {
        key: usize,
        pick: Pick,
        lease: u64,
    },
    Checkpoint {
        key: usize,
        pick: Pick,
        rp: usize,
        data: usize,
        lease: u64,
    },
    Takeover {
        key: usize,
        owner: usize,
        force: bool,
        lease: u64,
    },
    Sweep {
        limit: u32,
    },
    Resume {
        interval: u64,
        max_stretch: u64,
    },
    /// Tenant 0 and 1 are the fixtures' tenants, 2 the default, 3 a malformed tenant.
    SetQuota {
        tenant: usize,
        max: Option<u64>,
    },
}

#[derive(Clone, Debug)]
struct ACmd {
    /// How far behind the leader's clock this command is stamped.
    skew: u64,
    op: AOp,
    /// Carried compressed, as a leader logs a large command (whatever its size here).
    packed: bool,
}

#[derive(Clone, Debug)]
struct AEntry {
    index_gap: u64,
    advance: u64,
    cmds: Vec<ACmd>,
}

fn key_s() -> impl Strategy<Value = usize> {
    prop_oneof![40 => 0..VALID_KEYS, 1 => Just(VALID_KEYS)]
}

fn owner_s() -> impl Strategy<Value = usize> {
    prop_oneof![80 => 0..4usize, 1 => 4..6usize]
}

/// Mostly short leases so that they lapse between entries; a few out of bounds. Round values,
/// shared with the time steps, make deadlines land exactly on the clock, where `<` vs `<=` matters.
fn lease_s() -> impl Strategy<Value = u64> {
    prop_oneof![
        30 => prop::sample::select(vec![1u64, 500, 1_000, 2_000, 3_000]),
        30 => 1..=3_000u64,
        8 => 3_000..=20_000u64,
        1 => Just(0u64),
        1 => Just(DAY + 1),
    ]
}

fn ttl_s() -> impl Strategy<Value = u64> {
    prop_oneof![
        30 => prop::sample::select(vec![1_000u64, 2_000, 5_000]),
        30 => 1_000..=15_000u64,
        1 => 0..1_000u64,
        1 => Just(365 * DAY + 1),
    ]
}

/// Mostly the same fingerprint, so that Mismatch is the exception it is in practice.
fn fingerprint_s() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(0usize), 6 => Just(1usize), 1 => Just(2usize)]
}

fn resp_s() -> impl Strategy<Value = usize> {
    prop_oneof![25 => 0..3usize, 1 => Just(3usize)]
}

fn pick_s() -> impl Strategy<Value = Pick> {
    prop_oneof![
        12 => Just(Pick::Latest),
        4 => any::<Index>().prop_map(Pick::Earlier),
        1 => (0..200u64, 0..4usize).prop_map(|(i, s)| Pick::Arbitrary(i, s)),
    ]
}

fn op_s() -> impl Strategy<Value = AOp> {
    prop_oneof![
        30 => (key_s(), fingerprint_s(), owner_s(), lease_s(), ttl_s(), prop::bool::weighted(0.7))
            .prop_map(|(key, fp, owner, lease, ttl, allow)| AOp::Claim { key, fp, owner, lease, ttl, allow }),
        12 => (key_s(), pick_s(), resp_s()).prop_map(|(key, pick, resp)| AOp::Complete { key, pick, resp }),
        10 => (key_s(), pick_s(), any::<bool>(), prop::option::weighted(0.9, resp_s()))
            .prop_map(|(key, pick, retryable, resp)| AOp::Fail { key, pick, retryable, resp }),
        8 => (key_s(), pick_s(), lease_s()).prop_map(|(key, pick, lease)| AOp::Extend { key, pick, lease }),
        6 => (key_s(), pick_s(), prop_oneof![20 => 0..3usize, 1 => Just(3usize)], 0..3usize, lease_s())
            .prop_map(|(key, pick, rp, data, lease)| AOp::Checkpoint { key, pick, rp, data, lease }),
        8 => (key_s(), owner_s(), prop::bool::weighted(0.3), lease_s())
            .prop_map(|(key, owner, force, lease)| AOp::Takeover { key, owner, force, lease }),
        6 => prop_oneof![30 => 0..=3u32, 1 => Just(200_000u32)].prop_map(|limit| AOp::Sweep { limit }),
        5 => (0..=1_000u64, prop_oneof![5 => Just(0u64), 20 => 1..=30_000u64, 1 => Just(2 * DAY)])
            .prop_map(|(interval, max_stretch)| AOp::Resume { interval, max_stretch }),
        // Small quotas against the fixtures' two keys in acme and one in globex, so claims
        // meet full quotas, lowered quotas and cleared ones.
        4 => (prop_oneof![10 => 0..3usize, 1 => Just(3usize)], prop::option::weighted(0.7, 0..=3u64))
            .prop_map(|(tenant, max)| AOp::SetQuota { tenant, max }),
    ]
}

fn cmd_s() -> impl Strategy<Value = ACmd> {
    (prop_oneof![10 => Just(0u64), 1 => 1..5_000u64], op_s(), prop::bool::weighted(0.25))
        .prop_map(|(skew, op, packed)| ACmd { skew, op, packed })
}

fn entry_s() -> impl Strategy<Value = AEntry> {
    (
        prop_oneof![6 => Just(1u64), 1 => 2..5u64],
        // Mostly small steps, sometimes far past every lease and TTL.
        prop_oneof![
            3 => Just(0u64),
            3 => prop::sample::select(vec![500u64, 1_000, 2_000, 3_000]),
            3 => 1..500u64,
            2 => 500..5_000u64,
            1 => 5_000..60_000u64,
            // Rarely a leader clock jump beyond the log clock's one-hour step limit.
            1 => Just(3 * 3_600_000u64),
        ],
        prop::collection::vec(cmd_s(), 1..=4),
    )
        .prop_map(|(index_gap, advance, cmds)| AEntry { index_gap, advance, cmds })
}

fn concrete(c: &Checker, leader_ms: u64, a: &ACmd) -> Command {
    let token = |key: usize, pick: &Pick| match pick {
        Pick::Latest => c.latest(key).unwrap_or(Token(0)),
        Pick::Earlier(ix) if !c.grants[key].is_empty() => c.grants[key][ix.index(c.grants[key].len())],
        Pick::Earlier(_) => Token(0),
        Pick::Arbitrary(i, s) => Token::new(*i, *s),
    };
    let id = |key: usize| c.keys[key].clone();
    let op = match &a.op {
        AOp::Claim { key, fp, owner: o, lease, ttl, allow } => Op::Claim {
            id: id(*key),
            fingerprint: fingerprint(*fp),
            owner: owner(*o),
            lease_ms: *lease,
            ttl_ms: *ttl,
            allow_takeover: *allow,
        },
        AOp::Complete { key, pick, resp } => {
            Op::Complete { id: id(*key), token: token(*key, pick), response: response(*resp) }
        }
        AOp::Fail { key, pick, retryable, resp } => {
            Op::Fail { id: id(*key), token: token(*key, pick), retryable: *retryable, response: resp.map(response) }
        }
        AOp::Extend { key, pick, lease } => {
            Op::ExtendLease { id: id(*key), token: token(*key, pick), lease_ms: *lease }
        }
        AOp::Checkpoint { key, pick, rp, data, lease } => Op::Checkpoint {
            id: id(*key),
            token: token(*key, pick),
            recovery_point: recovery_point(*rp),
            data: checkpoint_data(*data),
            lease_ms: *lease,
        },
        AOp::Takeover { key, owner: o, force, lease } => {
            Op::Takeover { id: id(*key), owner: owner(*o), force: *force, lease_ms: *lease }
        }
        AOp::Sweep { limit } => Op::Sweep { limit: *limit },
        AOp::Resume { interval, max_stretch } => {
            Op::Resume { sweep_interval_ms: *interval, max_stretch_ms: *max_stretch }
        }
        AOp::SetQuota { tenant, max } => {
            let tenant = match tenant {
                0 => Some("acme".to_string()),
                1 => Some("globex".to_string()),
                2 => None,
                _ => Some("no such tenant!".to_string()),
            };
            Op::SetQuota { tenant, max_records: *max }
        }
    };
    let op = match a.packed {
        true => Op::Compressed(idemraft_store::compressed::pack(&op).expect("every command packs")),
        false => op,
    };
    Command { now_ms: leader_ms.saturating_sub(a.skew), op }
}

fn run(entries: &[AEntry]) {
    let mut c = Checker::new();
    let mut log_index = 0;
    let mut leader_ms = T0;
    for e in entries {
        log_index += e.index_gap;
        leader_ms += e.advance;
        let cmds: Vec<Command> = e.cmds.iter().map(|a| concrete(&c, leader_ms, a)).collect();
        c.entry(log_index, &cmds);
    }
}

/// 1024 logs by default (about 12 s in a debug build); `PROPTEST_CASES` overrides it for a soak.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1024)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn machine_agrees_with_model(entries in prop::collection::vec(entry_s(), 1..=60)) {
        run(&entries);
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-picked sequences: the rules spelled out, still checked against the model.

fn at(now_ms: u64, op: Op) -> Command {
    Command { now_ms, op }
}

fn claim(id: &RecordKey, owner: &str, lease_ms: u64, ttl_ms: u64, allow_takeover: bool) -> Op {
    Op::Claim { id: id.clone(), fingerprint: Some([1; 32]), owner: owner.into(), lease_ms, ttl_ms, allow_takeover }
}

fn acquired(o: &Outcome) -> Grant {
    match o {
        Outcome::Acquired(g) => g.clone(),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[test]
fn grants_in_one_entry_get_distinct_increasing_tokens_and_retries_keep_theirs() {
    let mut c = Checker::new();
    let (k0, k1) = (c.keys[0].clone(), c.keys[1].clone());
    let out = c.entry(
        7,
        &[
            at(T0, claim(&k0, "worker-a", 1_000, 5_000, true)),
            at(T0, claim(&k1, "worker-b", 1_000, 5_000, true)),
            at(T0 + 10, claim(&k0, "worker-a", 2_000, 9_000, true)),
            at(T0 + 10, claim(&k0, "worker-b", 1_000, 5_000, true)),
        ],
    );
    let g0 = acquired(&out[0]);
    assert_eq!(g0.token, Token::new(7, 0));
    assert_eq!(acquired(&out[1]).token, Token::new(7, 1));
    assert_eq!(out[2], Outcome::Acquired(g0.clone()), "a retried claim is answered with the same grant");
    assert_eq!(out[3], Outcome::InProgress { lease_expires_ms: T0 + 1_000, retry_after_ms: 990 });
}

#[test]
fn takeover_fences_the_previous_owner_and_hands_over_progress() {
    let mut c = Checker::new();
    let k = c.keys[0].clone();
    let a = acquired(&c.entry(1, &[at(T0, claim(&k, "worker-a", 1_000, 60_000, true))])[0]);
    let out = c.entry(
        2,
        &[at(
            T0 + 500,
            Op::Checkpoint {
                id: k.clone(),
                token: a.token,
                recovery_point: "step-1".into(),
                data: vec![7],
                lease_ms: 1_000,
            },
        )],
    );
    assert_eq!(out[0], Outcome::LeaseExtended { token: a.token, lease_expires_ms: T0 + 1_500 });

    let out = c.entry(
        3,
        &[
            at(T0 + 2_000, claim(&k, "worker-b", 1_000, 60_000, false)),
            at(T0 + 2_000, claim(&k, "worker-b", 1_000, 60_000, true)),
            at(T0 + 2_000, Op::Complete { id: k.clone(), token: a.token, response: response(0) }),
            at(T0 + 2_000, claim(&k, "worker-a", 1_000, 60_000, true)),
        ],
    );
    assert_eq!(out[0], Outcome::InProgress { lease_expires_ms: T0 + 1_500, retry_after_ms: MIN_RETRY_AFTER_MS });
    let b = acquired(&out[1]);
    assert_eq!((b.token, b.attempt, b.takeover), (Token::new(3, 1), 2, true));
    assert_eq!((b.recovery_point.as_str(), b.checkpoint.as_slice()), ("step-1", &[7u8][..]));
    assert_eq!(out[2], Outcome::StaleToken { current: b.token });
    assert_eq!(out[3], Outcome::InProgress { lease_expires_ms: T0 + 3_000, retry_after_ms: 1_000 });

    let out = c.entry(
        4,
        &[
            at(T0 + 2_500, Op::Complete { id: k.clone(), token: b.token, response: response(1) }),
            at(T0 + 2_600, Op::Complete { id: k.clone(), token: b.token, response: response(1) }),
            at(T0 + 2_700, claim(&k, "worker-c", 1_000, 60_000, true)),
        ],
    );
    assert_eq!(out[0], Outcome::Completed { token: b.token });
    assert_eq!(out[1], Outcome::Completed { token: b.token }, "a retried Complete is answered OK again");
    assert_eq!(out[2], Outcome::Replay { token: b.token, completed_ms: T0 + 2_500, response: response(1) });
}

#[test]
fn resume_stretches_only_leases_alive_at_the_previous_clock_and_time_never_runs_back() {
    let mut c = Checker::new();
    let k = c.keys.clone();
    let out = c.entry(
        1,
        &[
            at(T0, claim(&k[0], "worker-a", 2_000, 60_000, true)),
            // Deadline exactly at the clock before Resume: already lapsed, so not stretched.
            at(T0, claim(&k[1], "worker-b", 1_000, 60_000, true)),
            at(T0, claim(&k[2], "worker-c", 1_001, 60_000, true)),
        ],
    );
    let a = acquired(&out[0]);
    c.entry(2, &[at(T0 + 1_000, Op::Sweep { limit: 10 })]);
    let out = c.entry(
        3,
        &[
            at(T0 + 31_000, Op::Resume { sweep_interval_ms: 1_000, max_stretch_ms: 60_000 }),
            // Stamped by a leader whose clock lags: the log's clock decides.
            at(T0, Op::ExtendLease { id: k[0].clone(), token: a.token, lease_ms: 10 }),
        ],
    );
    assert_eq!(out[0], Outcome::Resumed { stretched: 2, stretch_ms: 29_000 });
    assert_eq!(out[1], Outcome::LeaseExtended { token: a.token, lease_expires_ms: T0 + 31_010 });
    let leases: Vec<u64> = c.real.records().map(|(_, r)| r.lease_expires_ms).collect();
    assert_eq!(leases, vec![T0 + 31_010, T0 + 1_000, T0 + 30_001]);
}

#[test]
fn expired_records_are_absent_before_the_sweep_and_sweeps_are_bounded_oldest_first() {
    let mut c = Checker::new();
    let k = c.keys.clone();
    let out = c.entry(
        1,
        &[
            at(T0, claim(&k[0], "worker-a", 1, 3_000, true)),
            at(T0, claim(&k[1], "worker-a", 1, 1_000, true)),
            at(T0, claim(&k[2], "worker-a", 1, 2_000, true)),
        ],
    );
    let g0 = acquired(&out[0]);
    let out = c.entry(
        2,
        &[
            at(T0 + 5_000, Op::Complete { id: k[0].clone(), token: g0.token, response: response(0) }),
            at(T0 + 5_000, Op::Sweep { limit: 2 }),
        ],
    );
    assert_eq!(out, vec![Outcome::NotFound, Outcome::Swept { deleted: 2 }]);
    let left: Vec<&RecordKey> = c.real.records().map(|(id, _)| id).collect();
    assert_eq!(left, vec![&k[0]], "the two earliest expiries go first");
    let out = c.entry(3, &[at(T0 + 5_000, Op::Sweep { limit: 5 })]);
    assert_eq!(out, vec![Outcome::Swept { deleted: 1 }]);
    assert!(c.real.is_empty());
}

#[test]
fn a_full_entry_numbers_every_slot_and_refuses_the_command_beyond() {
    let k = keys();
    let last = Token::MAX_BATCH - 1;
    let mut cmds = vec![at(T0, Op::Sweep { limit: 0 }); last];
    cmds.push(at(T0, claim(&k[0], "worker-a", 1_000, 5_000, true)));
    // Its slot would wrap to 0 and collide with the first command's token.
    cmds.push(at(T0, claim(&k[1], "worker-a", 1_000, 5_000, true)));
    let mut state = MemState::new();
    let out = ok(machine::apply_batch(&mut state, 3, &cmds));
    assert_eq!(acquired(&out[last]).token, Token::new(3, last));
    assert!(Token::new(3, last) < Token::new(4, 0), "the last slot still sorts below the next entry");
    assert!(
        matches!(out[Token::MAX_BATCH], Outcome::Invalid(ValidationError::BatchTooLarge { .. })),
        "{:?}",
        out.last()
    );
    let ids: Vec<&RecordKey> = state.records().map(|(id, _)| id).collect();
    assert_eq!(ids, vec![&k[0]]);
}
