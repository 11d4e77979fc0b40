//! One harness run from start to verdict inputs: start the cluster, load it, prove the load is
//! high enough before any fault, run the seeded fault schedule, heal everything, prove the
//! cluster serves again within a bound, read every key back, and compare every replica's
//! state digest. What it gathers goes to the checkers; what it saw goes to the run directory.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_client::{ClaimOptions, Outcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::time::Instant;

use crate::cluster::{find_faketime, Cluster, ClusterSpec};
use crate::history::{Input, Op, Output, Recorder, State};
use crate::ledger::Ledger;
use crate::nemesis::{Event, Fault, Nemesis, Outcome as FaultOutcome};
use crate::payload::Payloads;
use crate::progress::Progress;
use crate::ttl_probe::{self, ProbeReport, PROBE_TTL};
use crate::workload::{self, Endpoints, Shared, WorkloadSpec, SCOPE};

/// The client id the final reads are recorded under.
pub const FINAL_CLIENT: u32 = 1_000_000;

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Founding nodes (3 or 5).
    pub nodes: u64,
    /// Length of the fault phase.
    pub time: Duration,
    /// Load before the first fault (also the rate check's window).
    pub warmup: Duration,
    /// The seed of the schedule and of every client.
    pub seed: u64,
    /// Faults to inject.
    pub faults: Vec<Fault>,
    /// Whether rounds may combine two faults.
    pub combine: bool,
    /// Planted bugs to switch on in every node (`--unsafe-planted-bugs`).
    pub bugs: Vec<String>,
    /// The `idemraft` binary.
    pub binary: PathBuf,
    /// The run directory.
    pub dir: PathBuf,
    /// Concurrent clients.
    pub clients: u32,
    /// Live keys at once.
    pub keys: u32,
    /// Answered ops per second required before the first fault.
    pub min_rate: f64,
    /// Lease the workload asks for.
    pub lease: Duration,
    /// Longest time after healing for a claim to succeed.
    pub recovery_bound: Duration,
    /// The bodies completions store.
    pub payloads: Payloads,
}

/// Whether every replica ended in the same state.
#[derive(Clone, Debug, Serialize)]
pub struct Convergence {
    /// All replicas agreed.
    pub converged: bool,
    /// (node, applied index, digest hex) as last seen.
    pub replicas: Vec<(u64, u64, String)>,
    /// What went wrong, if anything.
    pub detail: String,
}

/// What a run gathered.
pub struct RunResult {
    /// Every recorded op, final reads included.
    pub history: Vec<Op>,
    /// Ids of the final reads.
    pub final_read_ids: Vec<u64>,
    /// The faults as they happened.
    pub events: Vec<Event>,
    /// Answered ops per second before the first fault.
    pub rate_before_faults: f64,
    /// Time from the final heal to the first successful claim.
    pub recovery: Option<Duration>,
    /// The replica comparison.
    pub convergence: Convergence,
    /// The fenced downstream.
    pub ledger: Ledger,
    /// Reasons the run itself is invalid (too little load, a requested fault never fired,
    /// a node that died on its own).
    pub invalid: Vec<String>,
    /// Ledger and node crashes seen (a node exiting on its own is an anomaly).
    pub crashes: Vec<(u64, String)>,
    /// The nodes' longest election timeout, as they were started.
    pub election_max: Duration,
    /// What the run itself saw go wrong: a node that kept running on a failed disk or
    /// panicked, a cluster that never served again after every fault was healed.
    pub anomalies: Vec<String>,
    /// What the expiry probe saw.
    pub probe: ProbeReport,
}

/// The longest the final reads and replays may take together.
pub const FINAL_READS_BOUND: Duration = Duration::from_secs(60);

/// `--snapshot-every` for runs on lazy disks.
pub const LAZY_SNAPSHOT_EVERY: u64 = 300;

/// The node's default `--election-timeout-max`.
pub const DEFAULT_ELECTION_MAX: Duration = Duration::from_millis(800);

/// The `--election-timeout-max` in the nodes' flags (`800ms`, `1s`), else the node's default:
/// the harness holds pauses and availability to what the nodes were really given.
pub fn election_max(flags: &[String]) -> Duration {
    let value = flags.iter().enumerate().find_map(|(i, f)| {
        if f == "--election-timeout-max" {
            flags.get(i + 1).cloned()
        } else {
            f.strip_prefix("--election-timeout-max=").map(str::to_string)
        }
    });
    let parse = |v: &str| -> Option<Duration> {
        if let Some(ms) = v.strip_suffix("ms") {
            ms.trim().parse::<u64>().ok().map(Duration::from_millis)
        } else {
            v.strip_suffix('s')?
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
        }
    };
    value.as_deref().and_then(parse).unwrap_or(DEFAULT_ELECTION_MAX)
}

fn ns(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

async fn wait_for_leader(cluster: &Cluster, within: Duration) -> Option<u64> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(l) = cluster.leader().await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// How long the warm-up waits for the cluster to answer a first op before timing the load.
const FIRST_ANSWER_BOUND: Duration = Duration::from_secs(20);
/// What a run takes after its fault phase (heal, recovery probe, drain, final reads,
/// convergence) and for its checkers, as the progress line estimates it.
pub const TAIL_ESTIMATE: Duration = Duration::from_secs(12);

/// The whole run as first estimated: a few seconds to start and elect, the warm-up, the
/// fault phase, then the tail.
pub fn expected_length(spec: &RunSpec) -> Duration {
    Duration::from_secs(4) + spec.warmup + spec.time + TAIL_ESTIMATE
}

/// Runs the whole schedule. `Err` is a harness failure (could not start, could not reach the
/// cluster at all), not a verdict.
pub async fn run(spec: &RunSpec) -> Result<RunResult, String> {
    run_with(spec, &Progress::off()).await
}

/// [`run`], reporting each phase to `progress`.
pub async fn run_with(spec: &RunSpec, progress: &Progress) -> Result<RunResult, String> {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let wants_clock = spec.faults.contains(&Fault::Clock);
    let faketime = if wants_clock {
        Some(find_faketime().ok_or_else(|| {
            "clock faults need libfaketime: install the Debian package `faketime` or leave out --faults clock"
                .to_string()
        })?)
    } else {
        None
    };
    // The expiry probe's keys live for a second.
    let mut flags: Vec<String> = vec!["--min-ttl".to_string(), format!("{}ms", PROBE_TTL.as_millis())];
    if !spec.bugs.is_empty() {
        flags.push("--unsafe-planted-bugs".to_string());
        flags.push(spec.bugs.join(","));
    }
    let lazy_disks = spec.faults.iter().any(|f| f.needs_lazy_disks());
    if lazy_disks {
        // Snapshots and log purges every few hundred entries, so that power losses also
        // land between a snapshot's write, its rename and the purge behind it.
        flags.extend(["--snapshot-every".to_string(), LAZY_SNAPSHOT_EVERY.to_string()]);
    }
    let election_max = election_max(&flags);
    let spare = if spec.faults.contains(&Fault::Membership) { 6 } else { 0 };
    progress.phase("start cluster", expected_length(spec));
    let mut cluster = Cluster::start(ClusterSpec {
        binary: spec.binary.clone(),
        founders: spec.nodes,
        spare,
        dir: spec.dir.clone(),
        flags,
        faketime,
        lazy_disks,
    })
    .await?;
    let founders: Vec<u64> = (1..=spec.nodes).collect();
    if wait_for_leader(&cluster, Duration::from_secs(30)).await.is_none() {
        let tails: Vec<String> = founders.iter().map(|&i| format!("node {i}:\n{}", cluster.log_tail(i, 15))).collect();
        return Err(format!("no leader within 30 s of start\n{}", tails.join("\n")));
    }

    let recorder = Recorder::new();
    let shared = Shared::new(recorder.clone());
    progress.watch(&recorder);
    progress.phase("warm-up", spec.warmup + spec.time + TAIL_ESTIMATE);
    let origin = Instant::now();
    let wl = WorkloadSpec {
        clients: spec.clients,
        keys: spec.keys,
        key_epoch: Duration::from_secs(3),
        lease: spec.lease,
        call_deadline: Duration::from_secs(3),
        seed: spec.seed,
        payloads: spec.payloads,
    };
    // Every loop of the run stops by itself: clients at this instant at the latest.
    let hard_end = origin + FIRST_ANSWER_BOUND + spec.warmup + spec.time + Duration::from_secs(60);
    let mut handles = Vec::new();
    for n in 0..spec.clients {
        let writer = cluster.client(&founders, Duration::from_millis(1000), wl.call_deadline)?;
        let mut readers = Vec::new();
        // Founders only: a slot that is not running would hold each read for its whole
        // deadline and starve the load.
        for &id in &founders {
            readers.push((id, cluster.node_client(id, Duration::from_millis(1000))?));
        }
        let ep = Endpoints { writer, readers };
        handles.push(tokio::spawn(workload::client_loop(n, wl.clone(), shared.clone(), ep, origin, hard_end)));
    }

    let probe_report = Arc::new(Mutex::new(ProbeReport::default()));
    let probe_client = cluster.client(&founders, Duration::from_millis(1000), wl.call_deadline)?;
    let probe_task =
        tokio::spawn(ttl_probe::run(probe_client, spec.seed, shared.stop.clone(), hard_end, probe_report.clone()));

    let mut invalid = Vec::new();
    // The warm-up is timed from the first answered op: a freshly elected leader on a busy
    // machine may take a few seconds over its first writes, and counting those seconds as
    // load made a run invalid for "too little load" that then ran at full rate.
    let first_answer_by = Instant::now() + FIRST_ANSWER_BOUND;
    while shared.answered.load(Ordering::Relaxed) == 0 && Instant::now() < first_answer_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = shared.answered.load(Ordering::Relaxed);
    tokio::time::sleep(spec.warmup).await;
    let rate = (shared.answered.load(Ordering::Relaxed) - before) as f64 / spec.warmup.as_secs_f64();
    if rate < spec.min_rate {
        invalid.push(format!(
            "only {rate:.0} answered ops/s before the first fault, below the minimum {:.0}: too little load proves nothing",
            spec.min_rate
        ));
    }

    let fresh: Vec<u64> = cluster.slot_ids().into_iter().filter(|i| *i > spec.nodes).collect();
    let mut nemesis = Nemesis::new(
        StdRng::seed_from_u64(rng.random()),
        founders.clone(),
        fresh,
        election_max,
        shared.large_bodies.clone(),
    );
    let mut events: Vec<Event> = Vec::new();
    let mut queue = Vec::new();
    let mut crashes = Vec::new();
    let fault_end = Instant::now() + spec.time;
    progress.phase("faults", spec.time + TAIL_ESTIMATE);
    while Instant::now() < fault_end {
        let round = nemesis.pick_round(&mut queue, &spec.faults, spec.combine);
        let names: Vec<&str> = round.iter().map(|f| f.name()).collect();
        progress.detail(&format!("faults: {}", names.join(" + ")));
        let mut installed = Vec::new();
        for &f in &round {
            let (ev, active) = nemesis.install(&mut cluster, f, ns(origin)).await;
            if ev.outcome != FaultOutcome::Installed {
                progress.detail(&format!("faults: {} {}", f.name(), outcome_word(&ev.outcome)));
            } else {
                progress.fault();
            }
            installed.push((events.len(), active));
            events.push(ev);
        }
        let hold = nemesis.hold(&round);
        tokio::time::sleep(hold.min(fault_end.saturating_duration_since(Instant::now()) + Duration::from_secs(1)))
            .await;
        for (i, active) in installed.into_iter().rev() {
            let healed = nemesis.heal(&mut cluster, active).await;
            if let Some(ev) = events.get_mut(i) {
                match healed {
                    Ok(what) if what.is_empty() => {}
                    Ok(what) => ev.detail.push_str(&format!("; healed: {what}")),
                    Err(e) => ev.detail.push_str(&format!("; heal failed: {e}")),
                }
            }
            if let Some(ev) = events.get_mut(i) {
                ev.end_ns = ns(origin);
            }
        }
        crashes.extend(cluster.crashed());
        progress.detail("faults: quiet");
        let quiet = Duration::from_millis(nemesis.rng().random_range(1_000..2_500));
        tokio::time::sleep(quiet).await;
    }

    // Final phase: everything healed, then the cluster must serve again within the bound.
    progress.phase("heal and recover", TAIL_ESTIMATE);
    nemesis.heal_all(&mut cluster)?;
    let healed = Instant::now();
    let probe = cluster.client(&nemesis.members, Duration::from_millis(1000), spec.recovery_bound)?;
    let opts = ClaimOptions { lease: Some(Duration::from_secs(5)), ..ClaimOptions::default() };
    let recovery = match probe.claim(SCOPE, &format!("jk-recovery-probe-{}", spec.seed), "probe", &opts).await {
        Ok(Outcome::Acquired(_)) => Some(healed.elapsed()),
        _ => None,
    };
    // A cluster that cannot serve with every fault healed has lost something it needs (its
    // log, its membership) or is stuck: a finding, not a run that does not count.
    let mut anomalies = std::mem::take(&mut nemesis.disk_anomalies);
    if recovery.is_none() {
        anomalies.push(format!(
            "the cluster did not recover: no claim succeeded within {:?} of healing every fault",
            spec.recovery_bound
        ));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    progress.phase("stop clients", TAIL_ESTIMATE * 3 / 4);
    shared.stop.store(true, Ordering::SeqCst);
    // The clients stop after their current call, whose deadline bounds the wait.
    let joined = Instant::now() + Duration::from_secs(20);
    for h in handles {
        let _ = tokio::time::timeout(joined.saturating_duration_since(Instant::now()), h).await;
    }
    let _ = tokio::time::timeout(joined.saturating_duration_since(Instant::now()), probe_task).await;
    let probe = probe_report.lock().map(|r| r.clone()).unwrap_or_default();

    // Read every key back through the leader, after all writes ended.
    let keys: Vec<String> = shared.keys_used.lock().map(|k| k.iter().cloned().collect()).unwrap_or_default();
    let reader = cluster.client(&nemesis.members, Duration::from_millis(2000), Duration::from_secs(10))?;
    let mut final_read_ids = Vec::new();
    let mut completed = Vec::new();
    progress.phase(&format!("final reads of {} keys", keys.len()), TAIL_ESTIMATE / 2);
    // A cluster that is down would hold every read for its whole deadline: the reads and
    // replays share one bound, and what they leave undone makes the run undecided.
    let reads_end = Instant::now() + FINAL_READS_BOUND;
    let mut unread = 0usize;
    for key in &keys {
        if Instant::now() >= reads_end {
            unread += 1;
            continue;
        }
        for _ in 0..3 {
            let id = recorder.invoke(FINAL_CLIENT, None, key, Input::Get);
            match reader.get(SCOPE, key).await {
                Ok(rec) => {
                    let view = rec.as_ref().and_then(|r| workload::view_of(key, r));
                    if view.as_ref().is_some_and(|v| v.state == State::Completed) {
                        completed.push(key.clone());
                    }
                    recorder.ok(id, Output::Record { view });
                    final_read_ids.push(id);
                    break;
                }
                Err(_) => recorder.unknown(id),
            }
        }
    }

    // Every completed key must replay its stored bytes to a retry: a claim with the payload's
    // fingerprint, as a retrying client sends it. Recorded like any other op, so the checkers
    // hold the replay to the completion it answers for.
    let replay_opts = ClaimOptions {
        fingerprint: Some(workload::fingerprint_of(0)),
        lease: Some(spec.lease),
        ttl: Some(Duration::from_secs(3600)),
        allow_takeover: false,
    };
    progress.phase(&format!("replay {} completed keys", completed.len()), TAIL_ESTIMATE / 3);
    for key in &completed {
        if Instant::now() >= reads_end {
            unread += 1;
            continue;
        }
        let owner = "final-replay".to_string();
        let input = Input::Claim {
            owner: owner.clone(),
            fingerprint: 0,
            allow_takeover: false,
            lease_ms: spec.lease.as_millis() as u64,
        };
        let id = recorder.invoke(FINAL_CLIENT + 1, None, key, input);
        match reader.claim(SCOPE, key, &owner, &replay_opts).await {
            Ok(o) => recorder.ok(id, workload::output_of(key, &o)),
            Err(_) => recorder.unknown(id),
        }
    }

    if unread > 0 {
        invalid.push(format!(
            "{unread} final reads and replays were not tried: they ran past {FINAL_READS_BOUND:?} (is the cluster down?)"
        ));
    }
    progress.phase("convergence", TAIL_ESTIMATE / 4);
    let convergence = converge(&cluster, &nemesis.members).await;
    crashes.extend(cluster.crashed());
    for (id, status) in &crashes {
        invalid.push(format!("node {id} exited on its own ({status}); see its log"));
    }
    for f in &spec.faults {
        let fired = events.iter().any(|e| e.fault == *f && e.outcome == FaultOutcome::Installed);
        if !fired {
            invalid.push(format!("requested fault {f} never fired (raise --time so every fault gets a turn)"));
        }
    }
    cluster.shutdown();
    // A node may exit (a failed disk) or be killed, but never panic, not even on its way out.
    for id in cluster.slot_ids() {
        if let Some(line) = cluster.log_lines(id).into_iter().find(|l| l.contains("panicked at")) {
            anomalies.push(format!("node {id} panicked: {line}"));
        }
    }
    Ok(RunResult {
        history: recorder.finish(),
        final_read_ids,
        events,
        rate_before_faults: rate,
        recovery,
        convergence,
        ledger: shared.ledger.clone(),
        invalid,
        crashes,
        election_max,
        anomalies,
        probe,
    })
}

/// Polls every member until all report the same applied index and digest (the leader's sweep
/// moves the index every second, so a comparison is retried until it catches a still moment).
/// The members are asked at once: one after another, the digests of a few MiB of bodies take
/// long enough on a debug build that a sweep nearly always lands between the first answer and
/// the last.
async fn converge(cluster: &Cluster, members: &[u64]) -> Convergence {
    let end = Instant::now() + Duration::from_secs(20);
    let mut last = Vec::new();
    let mut detail = String::new();
    while Instant::now() < end {
        last.clear();
        let mut asks = tokio::task::JoinSet::new();
        for &id in members {
            let Ok(c) = cluster.node_client(id, Duration::from_secs(2)) else { continue };
            asks.spawn(async move { (id, c.node_digest(0).await) });
        }
        while let Some(done) = asks.join_next().await {
            match done {
                Ok((id, Ok(s))) => last.push((id, s.digest_index, hex(&s.state_digest))),
                Ok((id, Err(e))) => detail = format!("node {id}: {e}"),
                Err(e) => detail = format!("a digest request failed: {e}"),
            }
        }
        last.sort_by_key(|r| r.0);
        let same_index = last.windows(2).all(|w| w[0].1 == w[1].1);
        if last.len() == members.len() && same_index {
            let converged = last.windows(2).all(|w| w[0].2 == w[1].2);
            let detail = if converged { String::new() } else { "replicas differ at the same applied index".into() };
            return Convergence { converged, replicas: last, detail };
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    if detail.is_empty() {
        detail = "replicas never reported the same applied index within 20 s".into();
    }
    Convergence { converged: false, replicas: last, detail }
}

fn outcome_word(o: &FaultOutcome) -> &'static str {
    match o {
        FaultOutcome::Installed => "installed",
        FaultOutcome::Skipped(_) => "skipped",
        FaultOutcome::Indeterminate(_) => "indeterminate",
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn election_timeout_comes_from_the_node_flags_or_the_default() {
        let flags = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        assert_eq!(election_max(&[]), DEFAULT_ELECTION_MAX);
        assert_eq!(election_max(&flags(&["--election-timeout-max", "1200ms"])), Duration::from_millis(1200));
        assert_eq!(election_max(&flags(&["--election-timeout-max=1.5s"])), Duration::from_millis(1500));
        assert_eq!(election_max(&flags(&["--election-timeout-max", "soon"])), DEFAULT_ELECTION_MAX);
    }
}
