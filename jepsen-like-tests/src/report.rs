//! From a finished run to a verdict and files: the checkers' judgement of the history, plus
//! what only the harness knows (the run's validity, the faults that fired, replica
//! convergence, recovery time, nodes that died on their own), as one summary and a run
//! directory holding the history, the fault log, the verdict and `report.html` ([`crate::html`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::availability::{availability, Availability};
use crate::history::{write_jsonl, Input, Op, Output};
use crate::html;
use crate::invariants::{check_all, CheckOptions, Validity, Verdict};
use crate::nemesis::Outcome as FaultOutcome;
use crate::payload::digest_len;
use crate::run::{RunResult, RunSpec, FINAL_CLIENT};
use crate::ttl_probe::PROBE_TTL;

/// The overall answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    /// A valid run and no anomaly.
    Valid,
    /// At least one anomaly.
    Anomalies,
    /// The run does not count (too little load, a requested fault never fired, ...).
    Invalid,
    /// The checker ran out of budget on some key and found nothing else.
    Unknown,
    /// Safe, but writes stopped for longer than the bound during a single-node fault.
    Unavailable,
}

/// A judged run.
pub struct Judged {
    /// The answer.
    pub kind: Judgement,
    /// Human-readable summary.
    pub summary: String,
    /// The checkers' verdict.
    pub verdict: Verdict,
    /// Harness-level anomalies (divergence, crashes).
    pub harness_anomalies: Vec<String>,
    /// Windows without a successful write, per fault kind.
    pub availability: Availability,
}

/// What a single-node fault may cost: the election timeout as the nodes apply it, plus 1 s
/// for a client to time out its call to the lost node and find the new leader. A node
/// campaigns (after its pre-vote) `election_timeout_max + random(min..max)` after it last heard
/// the leader: openraft's leader lease, then the randomized timeout, at most twice
/// `--election-timeout-max`.
pub fn availability_bound(election_max: Duration) -> Duration {
    election_max * 2 + Duration::from_secs(1)
}

/// Judges a run. Clock faults make a skewed leader's early lease expiry legal (contract §5.4:
/// lease expiry assumes bounded drift), so the takeover-timing tolerance grows by the largest
/// skew a run can inject.
pub fn judge(spec: &RunSpec, r: &RunResult, key_budget: Duration, reproduce: &str) -> Judged {
    let clock = spec.faults.contains(&crate::nemesis::Fault::Clock);
    let tolerance = if clock { Duration::from_secs(61) } else { Duration::from_millis(250) };
    let opts = CheckOptions { budget_per_key: key_budget, takeover_tolerance_ns: tolerance.as_nanos() as u64 };
    let finals: std::collections::BTreeSet<u64> = r.final_read_ids.iter().copied().collect();
    let (final_reads, history): (Vec<Op>, Vec<Op>) = r.history.iter().cloned().partition(|o| finals.contains(&o.id));
    let verdict = check_all(&history, &final_reads, &r.ledger.snapshot(), &opts);
    // The workload's own ops: the final replays come after it stopped and would only add a
    // window of idleness at the end.
    let workload: Vec<Op> = history.iter().filter(|o| o.client < FINAL_CLIENT).cloned().collect();
    let availability = availability(&workload, &r.events, availability_bound(r.election_max));

    let mut harness_anomalies = Vec::new();
    if !r.convergence.converged {
        harness_anomalies.push(format!("replicas did not converge: {}", r.convergence.detail));
    }
    for (id, st) in &r.crashes {
        harness_anomalies.push(format!("node {id} exited on its own: {st}"));
    }
    harness_anomalies.extend(r.anomalies.iter().cloned());
    harness_anomalies.extend(r.probe.anomalies.iter().cloned());
    let kind = if verdict.validity == Validity::Invalid || !harness_anomalies.is_empty() {
        Judgement::Anomalies
    } else if !r.invalid.is_empty() {
        Judgement::Invalid
    } else if !availability.breaches.is_empty() {
        Judgement::Unavailable
    } else if verdict.validity == Validity::Unknown {
        Judgement::Unknown
    } else {
        Judgement::Valid
    };

    let mut s = String::new();
    let _ = writeln!(s, "== idemraft-jepsen run, seed {}", spec.seed);
    let _ = writeln!(
        s,
        "nodes {}, fault phase {:?}, clients {}, keys {} live, planted bugs: {}",
        spec.nodes,
        spec.time,
        spec.clients,
        spec.keys,
        if spec.bugs.is_empty() { "none".to_string() } else { spec.bugs.join(",") }
    );
    let mut by_outcome: BTreeMap<&str, usize> = BTreeMap::new();
    for op in &history {
        let k = match (&op.return_ns, &op.output) {
            (None, _) | (_, Output::Unknown) => "unknown",
            (_, Output::Refused { .. }) => "refused",
            _ => "ok",
        };
        *by_outcome.entry(k).or_default() += 1;
    }
    let _ = writeln!(
        s,
        "ops {} ({}), {:.0} answered ops/s before the first fault",
        history.len(),
        by_outcome.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "),
        r.rate_before_faults
    );
    let sent: Vec<usize> = history
        .iter()
        .filter_map(|op| match &op.input {
            Input::Complete { value, .. } | Input::Fail { value: Some(value), .. } => digest_len(value),
            _ => None,
        })
        .collect();
    let _ = writeln!(
        s,
        "payloads {}: {} bodies sent, {:.1} MiB in all, largest {} KiB",
        spec.payloads,
        sent.len(),
        sent.iter().sum::<usize>() as f64 / (1024.0 * 1024.0),
        sent.iter().max().copied().unwrap_or(0) / 1024
    );
    let mut faults: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for e in &r.events {
        let slot = faults.entry(e.fault.name().to_string()).or_default();
        match e.outcome {
            FaultOutcome::Installed => slot.0 += 1,
            FaultOutcome::Skipped(_) => slot.1 += 1,
            FaultOutcome::Indeterminate(_) => slot.2 += 1,
        }
    }
    let _ = writeln!(s, "faults (installed/skipped/indeterminate):");
    for (name, (i, sk, ind)) in &faults {
        let _ = writeln!(s, "  {name:<20} {i}/{sk}/{ind}");
    }
    let _ = writeln!(
        s,
        "recovery after the final heal: {}",
        r.recovery.map(|d| format!("{} ms", d.as_millis())).unwrap_or_else(|| "none".into())
    );
    let _ = writeln!(
        s,
        "convergence: {} ({} replicas{})",
        if r.convergence.converged { "same applied index and digest" } else { "FAILED" },
        r.convergence.replicas.len(),
        replica_indexes(&r.convergence.replicas)
    );
    let _ = writeln!(
        s,
        "expiry probe: {} keys completed with a {} ms TTL, {} seen granted afresh after expiry, {} replays while alive",
        r.probe.keys,
        PROBE_TTL.as_millis(),
        r.probe.expired_seen,
        r.probe.replays_alive
    );
    let _ = write!(s, "{availability}");
    let _ = write!(s, "{verdict}");
    for a in &harness_anomalies {
        let _ = writeln!(s, "anomaly: {a}");
    }
    for why in &r.invalid {
        let _ = writeln!(s, "invalid run: {why}");
    }
    let _ = writeln!(s, "result: {kind:?}");
    let _ = writeln!(s, "reproduce: {reproduce}");
    Judged { kind, summary: s, verdict, harness_anomalies, availability }
}

/// " at index N" when the replicas agree on it, else each replica's own index, so a failed
/// convergence shows which node lagged or ran ahead.
fn replica_indexes(replicas: &[(u64, u64, String)]) -> String {
    match replicas.first() {
        None => String::new(),
        Some((_, i, _)) if replicas.iter().all(|r| r.1 == *i) => format!(" at index {i}"),
        Some(_) => {
            let each: Vec<String> = replicas.iter().map(|(id, i, _)| format!("node {id} at {i}")).collect();
            format!(": {}", each.join(", "))
        }
    }
}

/// Writes the run directory: `history.jsonl`, `nemesis.json`, `verdict.json`, `summary.txt`,
/// `report.html`.
/// Node data dirs are removed after a valid run and kept after any other (with the logs).
pub fn write(spec: &RunSpec, r: &RunResult, j: &Judged) -> std::io::Result<()> {
    std::fs::create_dir_all(&spec.dir)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(spec.dir.join("history.jsonl"))?);
    write_jsonl(&r.history, &mut f)?;
    drop(f);
    std::fs::write(
        spec.dir.join("nemesis.json"),
        serde_json::to_vec_pretty(&r.events).map_err(std::io::Error::other)?,
    )?;
    #[derive(Serialize)]
    struct Out<'a> {
        seed: u64,
        result: Judgement,
        verdict: &'a Verdict,
        harness_anomalies: &'a [String],
        invalid: &'a [String],
        convergence: &'a crate::run::Convergence,
        recovery_ms: Option<u128>,
        rate_before_faults: f64,
        availability: &'a Availability,
    }
    let out = Out {
        seed: spec.seed,
        result: j.kind,
        verdict: &j.verdict,
        harness_anomalies: &j.harness_anomalies,
        invalid: &r.invalid,
        convergence: &r.convergence,
        recovery_ms: r.recovery.map(|d| d.as_millis()),
        rate_before_faults: r.rate_before_faults,
        availability: &j.availability,
    };
    std::fs::write(spec.dir.join("verdict.json"), serde_json::to_vec_pretty(&out).map_err(std::io::Error::other)?)?;
    std::fs::write(spec.dir.join("summary.txt"), &j.summary)?;
    let page = html::Page {
        seed: spec.seed,
        result: j.kind,
        summary: &j.summary,
        history: &r.history,
        events: &r.events,
        availability: &j.availability,
        problems: j.harness_anomalies.iter().chain(&r.invalid).cloned().collect(),
        anomalies: j.verdict.anomalies.len() + j.verdict.summary.keys_illegal,
        flagged: html::flagged_keys(&j.verdict, &r.history),
    };
    std::fs::write(spec.dir.join("report.html"), html::render(&page))?;
    if j.kind == Judgement::Valid {
        for entry in std::fs::read_dir(&spec.dir)?.flatten() {
            // `disk` is the backing directory of a lazy mount on `data`.
            for name in ["data", "disk"] {
                let dir = entry.path().join(name);
                if dir.is_dir() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
    }
    Ok(())
}
