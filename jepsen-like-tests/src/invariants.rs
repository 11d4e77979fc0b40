//! Invariants of Idemraft that a linearizability check alone does not state, and the one
//! entry point, [`check_all`], that runs every check and gives the run its verdict.
//!
//! The invariants look at answers and real time directly, without a model:
//!
//! 1. [`token_uniqueness`]: a token names one grant in the whole cluster, and grants of one
//!    key that are ordered in real time carry increasing tokens.
//! 2. [`stale_token_refusal`]: once a higher grant or a completion by another token was
//!    answered, a command carrying the old token is never acknowledged.
//! 3. [`durable_completions`] and [`replay_consistency`]: every acknowledged completion is
//!    in the final reads, and every replay shows the completion it replays.
//! 4. [`takeover_plausibility`]: a takeover does not happen before the replaced lease could
//!    have run out in real time (less a tolerance for injected clock skew).
//! 5. The ledger check ([`crate::ledger::check_ledger`]): no work ran again for a key whose
//!    completion was acknowledged.
//!
//! Each returns typed [`Anomaly`] values naming the operations involved.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::history::{Input, Op, OpId, Output, State, View};
use crate::ledger::{acked_completion, check_ledger, LedgerSnapshot};
use crate::linearizability::{self, KeyVerdict, Report};

/// A broken invariant, with the operations that show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Anomaly {
    /// One token granted to different keys or different owners.
    DuplicateToken {
        /// The token.
        token: u64,
        /// Every grant that returned it.
        ops: Vec<OpId>,
    },
    /// A grant returned before another was invoked on the same key, with a token not lower.
    TokenWentDown {
        /// The key.
        key: String,
        /// The grant that returned first.
        earlier: OpId,
        /// Its token.
        earlier_token: u64,
        /// The grant invoked after it.
        later: OpId,
        /// Its token.
        later_token: u64,
    },
    /// A Complete/Fail/Extend acknowledged with a token already fenced off.
    StaleTokenAccepted {
        /// The key.
        key: String,
        /// The acknowledged command.
        op: OpId,
        /// Its token.
        token: u64,
        /// The answer, returned before `op` was invoked, that fenced the token.
        fenced_by: OpId,
    },
    /// An acknowledged completion that the final reads do not show.
    LostCompletion {
        /// The key.
        key: String,
        /// The acknowledged Complete or terminal Fail.
        op: OpId,
        /// Its token.
        token: u64,
        /// The final read that disagrees.
        final_read: OpId,
        /// What that read saw.
        found: Option<View>,
    },
    /// An acknowledged completion on a key with no final read: durability is unverified.
    FinalReadMissing {
        /// The key.
        key: String,
        /// The acknowledged Complete or terminal Fail.
        op: OpId,
    },
    /// A replay (or a final read of a completed record) that is not the completion it replays.
    ReplayMismatch {
        /// The key.
        key: String,
        /// The Replay answer or final read.
        op: OpId,
        /// The token shown.
        token: u64,
        /// The body shown.
        value: Option<String>,
        /// What it should have been.
        detail: String,
    },
    /// A takeover earlier in real time than the replaced lease allows.
    EarlyTakeover {
        /// The key.
        key: String,
        /// The takeover grant.
        op: OpId,
        /// The grant or extend whose lease bounds it.
        lease_from: OpId,
        /// Earliest plausible return time of the takeover, tolerance subtracted.
        earliest_ns: u64,
        /// When it returned.
        returned_ns: u64,
    },
    /// Work charged again for a key after its completion was acknowledged.
    DoubleCharge {
        /// The key.
        key: String,
        /// The charge under the completed token.
        first_charge: u64,
        /// The charge made after the completion was acknowledged.
        second_charge: u64,
        /// The token of the second charge.
        second_token: u64,
        /// The acknowledged completion.
        completion: OpId,
    },
    /// A key acknowledged Completed by two different tokens.
    DoubleCompletion {
        /// The key.
        key: String,
        /// The distinct tokens.
        tokens: Vec<u64>,
        /// The acknowledging operations.
        ops: Vec<OpId>,
    },
}

impl Anomaly {
    /// Short name of the kind, as in the JSON `kind` field.
    pub fn kind(&self) -> &'static str {
        match self {
            Anomaly::DuplicateToken { .. } => "duplicate_token",
            Anomaly::TokenWentDown { .. } => "token_went_down",
            Anomaly::StaleTokenAccepted { .. } => "stale_token_accepted",
            Anomaly::LostCompletion { .. } => "lost_completion",
            Anomaly::FinalReadMissing { .. } => "final_read_missing",
            Anomaly::ReplayMismatch { .. } => "replay_mismatch",
            Anomaly::EarlyTakeover { .. } => "early_takeover",
            Anomaly::DoubleCharge { .. } => "double_charge",
            Anomaly::DoubleCompletion { .. } => "double_completion",
        }
    }

    /// True for findings that leave the run unproven rather than broken.
    pub fn is_inconclusive(&self) -> bool {
        matches!(self, Anomaly::FinalReadMissing { .. })
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Anomaly::DuplicateToken { token, ops } => write!(f, "token {token} granted by several grants: ops {ops:?}"),
            Anomaly::TokenWentDown { key, earlier, earlier_token, later, later_token } => write!(
                f,
                "key {key}: grant #{earlier} (token {earlier_token}) returned before grant #{later} \
                 (token {later_token}) was invoked"
            ),
            Anomaly::StaleTokenAccepted { key, op, token, fenced_by } => {
                write!(f, "key {key}: #{op} acknowledged with token {token}, fenced off by #{fenced_by}")
            }
            Anomaly::LostCompletion { key, op, token, final_read, found } => {
                write!(f, "key {key}: completion #{op} (token {token}) lost; final read #{final_read} saw {found:?}")
            }
            Anomaly::FinalReadMissing { key, op } => {
                write!(f, "key {key}: completion #{op} acknowledged but the key has no final read")
            }
            Anomaly::ReplayMismatch { key, op, token, value, detail } => {
                write!(f, "key {key}: #{op} shows token {token} value {value:?}: {detail}")
            }
            Anomaly::EarlyTakeover { key, op, lease_from, earliest_ns, returned_ns } => write!(
                f,
                "key {key}: takeover #{op} returned at {returned_ns} ns, before the lease of #{lease_from} \
                 could expire ({earliest_ns} ns with tolerance)"
            ),
            Anomaly::DoubleCharge { key, first_charge, second_charge, second_token, completion } => write!(
                f,
                "key {key}: charge {second_charge} (token {second_token}) after charge {first_charge}'s \
                 completion #{completion} was acknowledged"
            ),
            Anomaly::DoubleCompletion { key, tokens, ops } => {
                write!(f, "key {key}: acknowledged Completed by tokens {tokens:?} (ops {ops:?})")
            }
        }
    }
}

/// The owner a grant was asked for.
fn owner_of(input: &Input) -> Option<&str> {
    match input {
        Input::Claim { owner, .. } | Input::Takeover { owner, .. } => Some(owner),
        _ => None,
    }
}

/// A definite grant: (token, return_ns).
fn grant(op: &Op) -> Option<(u64, u64)> {
    match (&op.output, op.return_ns) {
        (Output::Acquired { token, .. }, Some(ret)) => Some((*token, ret)),
        _ => None,
    }
}

fn by_key(history: &[Op]) -> BTreeMap<&str, Vec<&Op>> {
    let mut map: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history {
        map.entry(op.key.as_str()).or_default().push(op);
    }
    map
}

/// Invariant 1: a token names one grant (one key, one owner; a same-owner re-claim repeats
/// it), and per key, a grant that returned before another was invoked has a lower token.
pub fn token_uniqueness(history: &[Op]) -> Vec<Anomaly> {
    let mut out = Vec::new();
    let mut holders: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in history {
        if let Some((token, _)) = grant(op) {
            holders.entry(token).or_default().push(op);
        }
    }
    for (token, ops) in &holders {
        let first = ops[0];
        if ops.iter().any(|o| o.key != first.key || owner_of(&o.input) != owner_of(&first.input)) {
            out.push(Anomaly::DuplicateToken { token: *token, ops: ops.iter().map(|o| o.id).collect() });
        }
    }
    for (key, ops) in by_key(history) {
        let mut grants: Vec<(u64, u64, &Op)> = ops.iter().filter_map(|o| grant(o).map(|(t, r)| (r, t, *o))).collect();
        grants.sort_by_key(|g| (g.0, g.1));
        // Running maximum of tokens by return time: (token, op).
        let mut best: Vec<(u64, &Op)> = Vec::with_capacity(grants.len());
        for (_, token, op) in &grants {
            let prev = best.last().copied();
            best.push(match prev {
                Some((t, o)) if t >= *token => (t, o),
                _ => (*token, op),
            });
        }
        for (_, token, later) in &grants {
            let n = grants.partition_point(|g| g.0 < later.call_ns);
            let Some(&(top, earlier)) = n.checked_sub(1).and_then(|i| best.get(i)) else { continue };
            // Equal tokens are a re-claim, or a duplicate the check above reports.
            if top > *token {
                out.push(Anomaly::TokenWentDown {
                    key: key.to_string(),
                    earlier: earlier.id,
                    earlier_token: top,
                    later: later.id,
                    later_token: *token,
                });
            }
        }
    }
    out
}

/// Invariant 2: no Complete, Fail or Extend is acknowledged with a token that, before it was
/// invoked, a higher grant or a completion by another token had fenced off.
pub fn stale_token_refusal(history: &[Op]) -> Vec<Anomaly> {
    let mut out = Vec::new();
    for (key, ops) in by_key(history) {
        // (return_ns, higher-than token or None, completed-by token or None, op)
        let fences: Vec<(u64, Option<u64>, Option<u64>, OpId)> = ops
            .iter()
            .filter_map(|o| {
                if let Some((t, r)) = grant(o) {
                    Some((r, Some(t), None, o.id))
                } else {
                    acked_completion(o).map(|(t, r)| (r, None, Some(t), o.id))
                }
            })
            .collect();
        for op in &ops {
            let token = match (&op.input, &op.output) {
                (Input::Complete { token, .. }, Output::Completed { .. })
                | (Input::Fail { token, .. }, Output::Failed { .. })
                | (Input::Extend { token, .. }, Output::LeaseExtended { .. }) => *token,
                _ => continue,
            };
            let fenced = fences.iter().find(|(ret, granted, completed, _)| {
                *ret < op.call_ns && (granted.is_some_and(|g| g > token) || completed.is_some_and(|c| c != token))
            });
            if let Some(f) = fenced {
                out.push(Anomaly::StaleTokenAccepted { key: key.to_string(), op: op.id, token, fenced_by: f.3 });
            }
        }
    }
    out
}

/// The body a completion stores: Complete's value, or a terminal Fail's.
fn completion_value(input: &Input) -> Option<(u64, &str)> {
    match input {
        Input::Complete { token, value } => Some((*token, value)),
        Input::Fail { token, retryable: false, value: Some(value) } => Some((*token, value)),
        _ => None,
    }
}

/// The final views per key: (read op, view).
fn final_views(final_reads: &[Op]) -> BTreeMap<&str, Vec<(OpId, Option<&View>)>> {
    let mut map: BTreeMap<&str, Vec<(OpId, Option<&View>)>> = BTreeMap::new();
    for op in final_reads {
        if let Output::Record { view } = &op.output {
            map.entry(op.key.as_str()).or_default().push((op.id, view.as_ref()));
        }
    }
    map
}

/// Invariant 3a: every acknowledged completion is what every final read of its key shows.
pub fn durable_completions(history: &[Op], final_reads: &[Op]) -> Vec<Anomaly> {
    let finals = final_views(final_reads);
    let mut out = Vec::new();
    for op in history {
        let (Some((token, _)), Some((_, value))) = (acked_completion(op), completion_value(&op.input)) else {
            continue;
        };
        let Some(reads) = finals.get(op.key.as_str()) else {
            out.push(Anomaly::FinalReadMissing { key: op.key.clone(), op: op.id });
            continue;
        };
        let bad = reads.iter().find(|(_, view)| {
            !view.is_some_and(|v| v.state == State::Completed && v.token == token && v.value.as_deref() == Some(value))
        });
        if let Some((read, view)) = bad {
            out.push(Anomaly::LostCompletion {
                key: op.key.clone(),
                op: op.id,
                token,
                final_read: *read,
                found: view.cloned(),
            });
        }
    }
    out
}

/// Invariant 3b: every Replay in the history, and every final read of a completed record,
/// shows the completion it replays: the acknowledged one if any, else one that was sent.
pub fn replay_consistency(history: &[Op], final_reads: &[Op]) -> Vec<Anomaly> {
    let mut acked: HashMap<&str, (u64, &str, OpId)> = HashMap::new();
    let mut sent: HashMap<&str, Vec<(u64, &str)>> = HashMap::new();
    for op in history {
        let Some((token, value)) = completion_value(&op.input) else { continue };
        if op.is_refused() {
            continue;
        }
        sent.entry(op.key.as_str()).or_default().push((token, value));
        if acked_completion(op).is_some() {
            acked.entry(op.key.as_str()).or_insert((token, value, op.id));
        }
    }
    let mut shown: Vec<(&Op, u64, Option<&str>)> = Vec::new();
    for op in history {
        if let Output::Replay { token, value } = &op.output {
            shown.push((op, *token, Some(value)));
        }
    }
    for op in final_reads {
        if let Output::Record { view: Some(v) } = &op.output {
            if v.state == State::Completed {
                shown.push((op, v.token, v.value.as_deref()));
            }
        }
    }
    let mut out = Vec::new();
    for (op, token, value) in shown {
        let key = op.key.as_str();
        let detail = match acked.get(key) {
            Some(&(t, v, by)) if t != token || Some(v) != value => {
                Some(format!("completion #{by} was acknowledged with token {t} value {v:?}"))
            }
            Some(_) => None,
            None => {
                let ok = sent.get(key).is_some_and(|list| list.iter().any(|&(t, v)| t == token && Some(v) == value));
                (!ok).then(|| "no Complete or terminal Fail with that token and value was sent".to_string())
            }
        };
        if let Some(detail) = detail {
            out.push(Anomaly::ReplayMismatch {
                key: key.to_string(),
                op: op.id,
                token,
                value: value.map(str::to_string),
                detail,
            });
        }
    }
    out
}

/// Invariant 4: a takeover grant T returns no earlier than `L.call_ns + L.lease_ms - tolerance`
/// for the lease L it replaced: the grant of the replaced token (the highest token below T's
/// seen in any answer) and every Extend of that token acknowledged before T was invoked.
///
/// The replaced grant's lease started when its entry applied, at or after the call of one of
/// its owner's claims (an owner id is reused only by retries of one claim), so the bound uses
/// the earliest such claim. Forced takeovers are exempt, and so is a grant by an owner that
/// sent a forced Takeover before it returned. A lease granted by a Takeover has no length in
/// the history and bounds nothing.
pub fn takeover_plausibility(history: &[Op], tolerance_ns: u64) -> Vec<Anomaly> {
    let mut out = Vec::new();
    for (key, ops) in by_key(history) {
        let mut seen: Vec<u64> = Vec::new();
        for op in &ops {
            match &op.output {
                Output::Acquired { token, .. }
                | Output::Replay { token, .. }
                | Output::StaleToken { current: token }
                | Output::Completed { token }
                | Output::Failed { token, .. }
                | Output::LeaseExtended { token } => seen.push(*token),
                Output::Record { view: Some(v) } => seen.push(v.token),
                _ => {}
            }
        }
        // The first-returning op of each takeover grant: later ones are its retries.
        let mut takeovers: BTreeMap<u64, &Op> = BTreeMap::new();
        for op in &ops {
            if let (Output::Acquired { token, takeover: true, .. }, Some(ret)) = (&op.output, op.return_ns) {
                let entry = takeovers.entry(*token).or_insert(op);
                if entry.return_ns.is_some_and(|r| ret < r) {
                    *entry = op;
                }
            }
        }
        for (&tt, t_op) in &takeovers {
            let Some(t_ret) = t_op.return_ns else { continue };
            let forced = ops.iter().any(|o| {
                matches!(&o.input, Input::Takeover { force: true, .. })
                    && owner_of(&o.input) == owner_of(&t_op.input)
                    && o.call_ns <= t_ret
            });
            if forced {
                continue;
            }
            let Some(&replaced) = seen.iter().filter(|&&t| t < tt).max() else { continue };
            let mut bounds: Vec<(u64, OpId)> = Vec::new();
            // The replaced grant: its owner's claims invoked before the grant first returned.
            let first_grant = ops
                .iter()
                .filter(|o| matches!(o.output, Output::Acquired { token, .. } if token == replaced))
                .filter_map(|o| o.return_ns.map(|r| (r, *o)))
                .min_by_key(|(r, _)| *r);
            if let Some((g_ret, g)) = first_grant {
                let owner = owner_of(&g.input);
                let earliest = ops
                    .iter()
                    .filter(|o| owner_of(&o.input) == owner && o.call_ns <= g_ret)
                    .map(|o| match &o.input {
                        Input::Claim { lease_ms, .. } => {
                            (o.call_ns.saturating_add(lease_ms.saturating_mul(1_000_000)), o.id)
                        }
                        _ => (o.call_ns, o.id),
                    })
                    .min();
                bounds.extend(earliest);
            }
            for o in &ops {
                if let (Input::Extend { token, lease_ms }, Output::LeaseExtended { .. }, Some(r)) =
                    (&o.input, &o.output, o.return_ns)
                {
                    if *token == replaced && r < t_op.call_ns {
                        bounds.push((o.call_ns.saturating_add(lease_ms.saturating_mul(1_000_000)), o.id));
                    }
                }
            }
            if let Some(&(expiry, lease_from)) = bounds.iter().max() {
                let earliest_ns = expiry.saturating_sub(tolerance_ns);
                if t_ret < earliest_ns {
                    out.push(Anomaly::EarlyTakeover {
                        key: key.to_string(),
                        op: t_op.id,
                        lease_from,
                        earliest_ns,
                        returned_ns: t_ret,
                    });
                }
            }
        }
    }
    out
}

/// Settings of a check.
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions {
    /// Linearizability search budget per key; a key that exhausts it is Unknown.
    pub budget_per_key: Duration,
    /// Slack for takeover plausibility; larger when clock skew was injected.
    pub takeover_tolerance_ns: u64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { budget_per_key: Duration::from_secs(10), takeover_tolerance_ns: 100_000_000 }
    }
}

/// The run's overall verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Validity {
    /// Every key linearizable, no anomaly.
    Valid,
    /// A key is not linearizable or an invariant broke.
    Invalid,
    /// Nothing broke, but something could not be decided.
    Unknown,
}

/// Counts for the run's table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Summary {
    /// Operations with a definite answer (refusals excluded).
    pub ops_ok: usize,
    /// Operations with unknown outcome.
    pub ops_unknown: usize,
    /// Operations refused.
    pub ops_refused: usize,
    /// Final reads.
    pub final_reads: usize,
    /// Distinct keys.
    pub keys: usize,
    /// Keys linearizable.
    pub keys_ok: usize,
    /// Keys not linearizable.
    pub keys_illegal: usize,
    /// Keys undecided within the budget.
    pub keys_unknown: usize,
    /// Anomalies by kind.
    pub anomalies: BTreeMap<String, usize>,
    /// Ledger charges accepted.
    pub charges_accepted: usize,
    /// Ledger charges refused as stale.
    pub charges_refused_stale: usize,
    /// Checking time, microseconds.
    pub checker_us: u64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row = |f: &mut fmt::Formatter<'_>, name: &str, value: String| writeln!(f, "  {name:<28} {value:>12}");
        writeln!(f, "  {:<28} {:>12}", "item", "count")?;
        writeln!(f, "  {:-<28} {:->12}", "", "")?;
        row(f, "ops ok", self.ops_ok.to_string())?;
        row(f, "ops unknown", self.ops_unknown.to_string())?;
        row(f, "ops refused", self.ops_refused.to_string())?;
        row(f, "final reads", self.final_reads.to_string())?;
        row(f, "keys", self.keys.to_string())?;
        row(f, "keys linearizable", self.keys_ok.to_string())?;
        row(f, "keys illegal", self.keys_illegal.to_string())?;
        row(f, "keys unknown (budget)", self.keys_unknown.to_string())?;
        row(f, "charges accepted", self.charges_accepted.to_string())?;
        row(f, "charges refused (stale)", self.charges_refused_stale.to_string())?;
        if self.anomalies.is_empty() {
            row(f, "anomalies", "0".to_string())?;
        }
        for (kind, n) in &self.anomalies {
            row(f, &format!("anomaly {kind}"), n.to_string())?;
        }
        row(f, "checker time (s)", format!("{:.3}", self.checker_us as f64 / 1e6))
    }
}

/// Everything [`check_all`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Valid, invalid or unknown.
    pub validity: Validity,
    /// The counts.
    pub summary: Summary,
    /// Per-key linearizability results.
    pub linearizability: Report,
    /// Every anomaly found.
    pub anomalies: Vec<Anomaly>,
}

/// How many anomalies [`Verdict`]'s Display lists.
const SHOWN_ANOMALIES: usize = 50;

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "verdict: {:?}", self.validity)?;
        write!(f, "{}", self.summary)?;
        for (key, illegal) in self.linearizability.illegal_keys() {
            writeln!(f, "key {key} is not linearizable")?;
            write!(f, "{illegal}")?;
        }
        for a in self.anomalies.iter().take(SHOWN_ANOMALIES) {
            writeln!(f, "anomaly {}: {a}", a.kind())?;
        }
        if self.anomalies.len() > SHOWN_ANOMALIES {
            writeln!(f, "... and {} more anomalies", self.anomalies.len() - SHOWN_ANOMALIES)?;
        }
        Ok(())
    }
}

/// Runs the linearizability check and every invariant over a run.
///
/// `final_reads` are Get operations made after healing, kept out of `history`; `ledger` is
/// the downstream ledger's record of the run.
pub fn check_all(history: &[Op], final_reads: &[Op], ledger: &LedgerSnapshot, opts: &CheckOptions) -> Verdict {
    let start = Instant::now();
    let linearizability = linearizability::check(history, opts.budget_per_key);
    let mut anomalies = token_uniqueness(history);
    anomalies.extend(stale_token_refusal(history));
    anomalies.extend(durable_completions(history, final_reads));
    anomalies.extend(replay_consistency(history, final_reads));
    anomalies.extend(takeover_plausibility(history, opts.takeover_tolerance_ns));
    let ledger_report = check_ledger(history, ledger);
    anomalies.extend(ledger_report.anomalies);

    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for a in &anomalies {
        *by_kind.entry(a.kind().to_string()).or_default() += 1;
    }
    let count = |f: fn(&KeyVerdict) -> bool| linearizability.keys.iter().filter(|k| f(&k.verdict)).count();
    let summary = Summary {
        ops_ok: history.iter().filter(|o| !o.is_unknown() && !o.is_refused()).count(),
        ops_unknown: history.iter().filter(|o| o.is_unknown()).count(),
        ops_refused: history.iter().filter(|o| o.is_refused()).count(),
        final_reads: final_reads.len(),
        keys: linearizability.keys.len(),
        keys_ok: count(|v| matches!(v, KeyVerdict::Ok)),
        keys_illegal: count(|v| matches!(v, KeyVerdict::Illegal(_))),
        keys_unknown: count(|v| matches!(v, KeyVerdict::Unknown)),
        anomalies: by_kind,
        charges_accepted: ledger_report.accepted,
        charges_refused_stale: ledger_report.refused_stale,
        checker_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
    };
    let validity = if summary.keys_illegal > 0 || anomalies.iter().any(|a| !a.is_inconclusive()) {
        Validity::Invalid
    } else if summary.keys_unknown > 0 || !anomalies.is_empty() {
        Validity::Unknown
    } else {
        Validity::Valid
    };
    Verdict { validity, summary, linearizability, anomalies }
}
