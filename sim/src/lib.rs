//! Deterministic simulation of a whole Idemraft cluster in one process.
//!
//! Every node is the real node (`Node::start_on`: the proposer with Resume, the sweeper, the
//! fast-read lease, forwarding to the leader, pre-vote elections, openraft itself) on the
//! in-memory stores, connected by the in-process network (`idemraft_node::api::in_process`)
//! and stamped by a simulated wall clock. Everything runs on one current-thread tokio runtime
//! on paused time: the clock moves only when every task waits, so a run of 30 simulated
//! seconds takes a fraction of a second, and the order in which tasks run depends only on
//! what they do. Every random choice (the workload, the faults, each message's delay or loss,
//! the election jitter) comes from generators seeded by the run's seed, so one seed is one
//! exact replay: [`run`] twice with the same settings gives the same history.
//!
//! The faults are seeded partitions (one node cut off, a minority from a majority, one-way
//! links), lost messages and lost answers, delays, crashes and restarts of nodes (a node is
//! stopped and started again on its stores, minus the log entries its disk had not flushed
//! yet: each node's log flushes at its own seeded pace, 0.2 to 20 ms a flush), and
//! clock jumps on a node's wall clock. The history is judged by the same per-key
//! linearizability checker and invariants as the real-process harness (`idemraft-jepsen`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_jepsen::history::{Input, Op as HOp, Output, State, View};
use idemraft_jepsen::invariants::{check_all, CheckOptions, Validity, Verdict};
use idemraft_jepsen::ledger::LedgerSnapshot;
use idemraft_node::api::in_process::{Fate, Network};
use idemraft_node::cluster::identity::IdentityHandle;
use idemraft_node::cluster::node::{Parts, StatusInfo};
use idemraft_node::cluster::observer::Unobserved;
use idemraft_node::cluster::proposer::WallClock;
use idemraft_node::cluster::storage::Stores;
use idemraft_node::cluster::transport::PeerCall;
use idemraft_node::error::NodeError;
use idemraft_node::wire::{Reply, Request};
use idemraft_node::{Node, Options};
use idemraft_store::{
    Fingerprint, MemLogStore, MemStateMachine, Op, Outcome, RecordKey, RecordState, RecordView, Response,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// What one run simulates.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Seeds every random choice of the run.
    pub seed: u64,
    /// Cluster size.
    pub nodes: u64,
    /// Simulated seconds of workload (faults included); the final reads come after.
    pub secs: u64,
    /// Concurrent clients.
    pub clients: u32,
    /// Keys the clients share.
    pub keys: u32,
    /// Whether the nemesis runs.
    pub faults: bool,
    /// Whether the nemesis also jumps nodes' clocks. Leases are judged by the leader's clock,
    /// so a jump of J ms may end one J ms early and the checker must allow it; runs without
    /// jumps hold takeovers to 200 ms, which is what catches a lease judged short.
    pub clock_jumps: bool,
    /// Whether the nemesis also removes voters and adds them back. Off in CI for now: seed
    /// 388 trips a debug assertion inside openraft 0.9.25 during such a change (see
    /// docs/fault-testing.md).
    pub membership: bool,
}

impl Settings {
    /// The settings CI runs every seed with.
    pub fn new(seed: u64) -> Settings {
        Settings {
            seed,
            nodes: 3,
            secs: 20,
            clients: 4,
            keys: 6,
            faults: true,
            clock_jumps: seed % 3 != 0,
            membership: false,
        }
    }
}

/// What a run did and what the checkers made of it.
pub struct Report {
    /// The settings it ran with.
    pub settings: Settings,
    /// Every client operation, in invocation order.
    pub history: Vec<HOp>,
    /// The reads made after the final heal.
    pub final_reads: Vec<HOp>,
    /// The faults, in order, with their simulated time.
    pub faults: Vec<String>,
    /// The checkers' verdict.
    pub verdict: Verdict,
    /// What broke outside the history (none in a correct run): replays of records the expiry
    /// probe proved expired, and replicas that ended in different states.
    pub anomalies: Vec<String>,
}

impl Report {
    /// Whether every key is linearizable and no invariant broke.
    pub fn valid(&self) -> bool {
        self.verdict.validity == Validity::Valid && self.anomalies.is_empty()
    }

    /// A fingerprint of the whole history, equal for equal runs.
    pub fn trace(&self) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for op in self.history.iter().chain(&self.final_reads) {
            for b in format!("{op}").bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }

    /// The command that replays this run.
    pub fn replay_command(&self) -> String {
        format!("cargo run -p idemraft-sim -- --seed {}", self.settings.seed)
    }
}

/// Runs one simulation to the end and checks it.
pub fn run(settings: &Settings) -> Report {
    let rt = runtime(settings.seed);
    let (history, final_reads, faults, anomalies) = rt.block_on(simulate(settings));
    drop(rt);
    // Leases are judged by the log's clock, which leaders stamp from their own clocks, and the
    // nemesis sets each node's clock up to MAX_SKEW_MS either side of true time: a lease
    // granted under a leader running MAX_SKEW_MS behind and taken over under one running
    // MAX_SKEW_MS ahead ends twice that early (contract §5.4).
    let lease_slack_ns = (if settings.clock_jumps { 2 * MAX_SKEW_MS } else { 0 } + 200) * 1_000_000;
    let opts = CheckOptions { budget_per_key: Duration::from_secs(5), takeover_tolerance_ns: lease_slack_ns };
    let verdict = check_all(&history, &final_reads, &LedgerSnapshot::default(), &opts);
    Report { settings: settings.clone(), history, final_reads, faults, verdict, anomalies }
}

/// The one-thread runtime on paused time that a simulation of `seed` runs on.
fn runtime(seed: u64) -> tokio::runtime::Runtime {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // Seeds the choices of every unbiased `select!`: without it two runs of a seed part ways
    // at the first one that finds two branches ready (see .cargo/config.toml).
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    match builder.build() {
        Ok(rt) => rt,
        Err(e) => panic!("cannot build the simulation's runtime: {e}"),
    }
}

/// One crash of a leader and what followed, as [`failovers`] measured it.
#[derive(Clone, Debug)]
pub struct Failover {
    /// The crashed leader.
    pub crashed: u64,
    /// From the crash until a surviving node led at a newer term.
    pub took: Duration,
    /// How many terms the new leader is past the crashed one's: 1 unless an election failed
    /// (a split vote) or was started more than once.
    pub terms: u64,
}

/// Crashes the leader of a healthy cluster `rounds` times, restarting it a few seconds later
/// each time, and measures how long each new leader took. No other fault, no load: what it
/// measures is the election alone, whose randomness comes from `seed`.
pub fn failovers(seed: u64, nodes: u64, rounds: u32) -> Vec<Failover> {
    let rt = runtime(seed);
    let settings =
        Settings { seed, nodes, secs: 0, clients: 0, keys: 0, faults: true, clock_jumps: false, membership: false };
    rt.block_on(async {
        let world = new_world(&settings, Arc::new(std::sync::atomic::AtomicBool::new(false))).await;
        let mut measured = Vec::new();
        for round in 0..rounds {
            let Some((leader, term)) = leader_of(&world, 0, Duration::from_secs(30)).await else {
                panic!("seed {seed}: no leader 30 s before round {round}");
            };
            // Let the followers hear a few heartbeats, as they would from a leader in service.
            tokio::time::sleep(Duration::from_millis(500)).await;
            stop(&world, leader).await;
            let crashed_at = Instant::now();
            let Some((_, new_term)) = leader_of(&world, term, Duration::from_secs(30)).await else {
                panic!(
                    "seed {seed}: no new leader 30 s after crashing node {leader} (term {term}) in round {round}:\n{}",
                    statuses(&world)
                );
            };
            measured.push(Failover { crashed: leader, took: crashed_at.elapsed(), terms: new_term - term });
            start(&world, leader).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let ids: Vec<u64> = world.borrow().running();
        for id in ids {
            stop(&world, id).await;
        }
        measured
    })
}

/// One line per running node: its role, term, leader, last log index and members.
fn statuses(world: &Shared) -> String {
    let lines: Vec<String> = status_of_running(world)
        .iter()
        .map(|s| {
            format!(
                "node {}: {} term {} leader {:?} log {} members {:?}",
                s.id, s.role, s.term, s.leader_id, s.last_log_index, s.members
            )
        })
        .collect();
    lines.join("\n")
}

/// The status of every running node, in id order.
fn status_of_running(world: &Shared) -> Vec<StatusInfo> {
    let ids = world.borrow().running();
    ids.iter().filter_map(|id| world.borrow().node(*id)).map(|n| n.status()).collect()
}

/// The running node that leads at a term of at least `from`, polled every 5 ms, once every
/// running node names it as its leader (at one term, more than one node may have led in
/// turn: openraft orders candidates by node id within a term).
async fn leader_of(world: &Shared, from: u64, within: Duration) -> Option<(u64, u64)> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let statuses = status_of_running(world);
        let leaders: Vec<&StatusInfo> = statuses.iter().filter(|s| s.role == "leader" && s.term >= from).collect();
        if let [leader] = leaders[..] {
            if statuses.iter().all(|s| s.leader_id == Some(leader.id)) {
                return Some((leader.id, leader.term));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// The largest clock jump the nemesis gives a node, ms.
const MAX_SKEW_MS: u64 = 1000;
/// A client call's deadline.
const CALL_DEADLINE: Duration = Duration::from_secs(2);
/// What one flush of a node's log takes, µs: each node draws one. A crash loses the entries
/// whose flush had not ended.
const FLUSH_LAGS_US: [u64; 4] = [200, 1_000, 5_000, 20_000];
/// The lease every claim asks for, ms: short, so takeovers happen within a run, and longer
/// than the largest clock jump plus the checker's slack, so an early takeover shows.
const LEASE_MS: u64 = 3000;

/// One simulated node: its stores outlive its process.
struct SimNode {
    stores: Stores<MemLogStore, MemStateMachine>,
    skew_ms: Arc<AtomicI64>,
    running: Option<Node>,
}

struct World {
    settings: Settings,
    dir: tempfile::TempDir,
    members: String,
    net: Arc<Network>,
    nodes: BTreeMap<u64, SimNode>,
    epoch: Instant,
    restarts: u64,
    /// The last operation id handed out.
    next_op: u64,
}

impl World {
    fn clock_of(&self, skew: Arc<AtomicI64>) -> WallClock {
        let epoch = self.epoch;
        Arc::new(move || {
            let ms = 1_800_000_000_000i64 + epoch.elapsed().as_millis() as i64 + skew.load(Ordering::Relaxed);
            ms.max(0) as u64
        })
    }

    /// What node `id` is started with.
    fn parts_of(&mut self, id: u64) -> (idemraft_node::Config, IdentityHandle, Parts<MemLogStore, MemStateMachine>) {
        let options = Options {
            id: Some(id),
            initial_cluster: Some(self.members.clone()),
            data_dir: Some(self.dir.path().join(format!("node-{id}"))),
            min_ttl: Some("1s".into()),
            ..Options::default()
        };
        let config = match options.resolve() {
            Ok(c) => c,
            Err(e) => panic!("the simulation's node options are refused: {e}"),
        };
        if let Err(e) = std::fs::create_dir_all(&config.data_dir) {
            panic!("cannot create {}: {e}", config.data_dir.display());
        }
        let identity = match IdentityHandle::establish(&config, None) {
            Ok(i) => i,
            Err(e) => panic!("identity: {e}"),
        };
        self.restarts += 1;
        let sim = &self.nodes[&id];
        let parts = Parts {
            stores: Stores { log: sim.stores.log.clone(), sm: sim.stores.sm.clone() },
            transport: self.net.link(id),
            wall_clock: self.clock_of(sim.skew_ms.clone()),
            seed: self.settings.seed.wrapping_mul(31).wrapping_add(id * 1000 + self.restarts),
        };
        (config, identity, parts)
    }

    fn running(&self) -> Vec<u64> {
        self.nodes.iter().filter(|(_, n)| n.running.is_some()).map(|(id, _)| *id).collect()
    }

    fn node(&self, id: u64) -> Option<Node> {
        self.nodes.get(&id).and_then(|n| n.running.clone())
    }
}

type Shared = Rc<RefCell<World>>;

/// A world of `settings.nodes` running nodes on a network whose messages take 0-5 ms, and
/// while `flaky` is set, 2 % are lost, 1 % lose their answer and delays reach 60 ms.
async fn new_world(settings: &Settings, flaky: Arc<std::sync::atomic::AtomicBool>) -> Shared {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("cannot create a temporary directory: {e}"),
    };
    let members: Vec<String> = (1..=settings.nodes).map(|i| format!("{i}=127.0.0.1:{}", 7200 + i)).collect();
    let net = Network::new();
    {
        let rng = Mutex::new(StdRng::seed_from_u64(settings.seed ^ 0x006e_6574_776f_726b));
        net.set_fate(Box::new(move |_from, _to, _kind: PeerCall| {
            let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
            if flaky.load(Ordering::Relaxed) {
                let roll: f64 = rng.random();
                if roll < 0.02 {
                    return Fate::Lost;
                }
                if roll < 0.03 {
                    return Fate::AnswerLost;
                }
                return Fate::Deliver(Duration::from_millis(rng.random_range(0..60)));
            }
            Fate::Deliver(Duration::from_millis(rng.random_range(0..5)))
        }));
    }
    // Each node's disk flushes at its own pace, so a leader may flush later than a follower:
    // a crash then loses entries the follower already holds (see `stop`).
    let mut disks = StdRng::seed_from_u64(settings.seed ^ 0x0064_6973_6b73);
    let nodes = (1..=settings.nodes)
        .map(|id| {
            let lag = FLUSH_LAGS_US[disks.random_range(0..FLUSH_LAGS_US.len())];
            let log = MemLogStore::with_flush_lag(Duration::from_micros(lag));
            let stores = Stores { log, sm: MemStateMachine::new() };
            (id, SimNode { stores, skew_ms: Arc::new(AtomicI64::new(0)), running: None })
        })
        .collect();
    let world: Shared = Rc::new(RefCell::new(World {
        settings: settings.clone(),
        dir,
        members: members.join(","),
        net,
        nodes,
        epoch: Instant::now(),
        restarts: 0,
        next_op: 0,
    }));
    for id in 1..=settings.nodes {
        start(&world, id).await;
    }
    world
}

async fn simulate(settings: &Settings) -> (Vec<HOp>, Vec<HOp>, Vec<String>, Vec<String>) {
    let flaky = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let world = new_world(settings, flaky.clone()).await;

    let history: Rc<RefCell<Vec<HOp>>> = Rc::default();
    let stop_at = Instant::now() + Duration::from_secs(settings.secs);
    let local = tokio::task::LocalSet::new();
    let faults: Rc<RefCell<Vec<String>>> = Rc::default();
    let expired: Rc<RefCell<Vec<String>>> = Rc::default();
    local
        .run_until(async {
            let mut clients = Vec::new();
            for c in 0..settings.clients {
                let rng = StdRng::seed_from_u64(settings.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(c)));
                clients.push(tokio::task::spawn_local(client(world.clone(), history.clone(), c, rng, stop_at)));
            }
            if !settings.clock_jumps {
                clients.push(tokio::task::spawn_local(expiry_probe(world.clone(), expired.clone(), stop_at)));
            }
            if settings.faults {
                let rng = StdRng::seed_from_u64(settings.seed ^ 0x006e_656d_6573_6973);
                nemesis(world.clone(), faults.clone(), flaky.clone(), rng, stop_at).await;
            } else {
                tokio::time::sleep_until(stop_at).await;
            }
            for c in clients {
                let _ = c.await;
            }
        })
        .await;

    // Heal everything, bring every node back, and read every key once a leader serves.
    flaky.store(false, Ordering::Relaxed);
    world.borrow().net.heal();
    for id in 1..=settings.nodes {
        world.borrow().nodes[&id].skew_ms.store(0, Ordering::Relaxed);
        if world.borrow().node(id).is_none() {
            start(&world, id).await;
        }
    }
    // Every node a voter again (a membership change may have been cut short). Asked through
    // each node in turn: one that was removed no longer hears the leader.
    let until = Instant::now() + Duration::from_secs(60);
    let mut turn = 0u64;
    loop {
        turn += 1;
        let node = world.borrow().node(1 + turn % settings.nodes);
        let Some(node) = node else { continue };
        let voters: Vec<u64> = match node.call(Request::Members, Instant::now() + CALL_DEADLINE).await {
            Ok(Reply::Members(list, _)) => list.iter().filter(|m| m.voter).map(|m| m.id).collect(),
            _ => Vec::new(),
        };
        let missing: Vec<u64> = (1..=settings.nodes).filter(|id| !voters.contains(id)).collect();
        if !voters.is_empty() && missing.is_empty() {
            break;
        }
        if !voters.is_empty() {
            for id in missing {
                rejoin(&node, id).await;
            }
        }
        if Instant::now() >= until {
            panic!(
                "seed {}: the voters are {voters:?}, not every node, 60 s after the final heal\n{}\nfaults:\n{}",
                settings.seed,
                statuses(&world),
                faults.borrow().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut final_reads = Vec::new();
    let base = world.borrow().next_op + 1;
    for k in 0..settings.keys {
        let key = key_name(k);
        let id = RecordKey::new("sim", "sim.scope", key.clone()).unwrap_or_else(|e| panic!("{e}"));
        let until = Instant::now() + Duration::from_secs(30);
        let node = world.borrow().node(1 + u64::from(k) % settings.nodes);
        let Some(node) = node else { continue };
        loop {
            let call_ns = now_ns(&world);
            match node.call(Request::Get(id.clone()), Instant::now() + CALL_DEADLINE).await {
                Ok(Reply::Record(view)) => {
                    final_reads.push(HOp {
                        id: base + u64::from(k),
                        client: u32::MAX,
                        node: None,
                        key: key.clone(),
                        call_ns,
                        return_ns: Some(now_ns(&world)),
                        input: Input::Get,
                        output: Output::Record { view: view.as_ref().and_then(view_of) },
                    });
                    break;
                }
                _ if Instant::now() < until => tokio::time::sleep(Duration::from_millis(200)).await,
                other => panic!("seed {}: no final read of {key} within 30 s: {other:?}", settings.seed),
            }
        }
    }
    let diverged = converged(&world, settings).await;
    let ids: Vec<u64> = world.borrow().running();
    for id in ids {
        stop(&world, id).await;
    }
    // Recorded as each call returned; the checkers want invocation order.
    let mut history = history.borrow().clone();
    history.sort_by_key(|op| (op.call_ns, op.id));
    let faults = faults.borrow().clone();
    let mut expired = expired.borrow().clone();
    // Divergence rides with the probe's findings: both are anomalies outside the history.
    expired.extend(diverged);
    (history, final_reads, faults, expired)
}

/// Whether every replica holds the same state at one applied index: digests read from all
/// nodes in one instant (no await between them), retried until their indexes agree.
async fn converged(world: &Shared, settings: &Settings) -> Option<String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes: Vec<(u64, Node)> =
            (1..=settings.nodes).filter_map(|id| world.borrow().node(id).map(|n| (id, n))).collect();
        let mut seen = Vec::new();
        for (id, node) in &nodes {
            if let Ok(d) = node.state_digest().await {
                seen.push((*id, d));
            }
        }
        if seen.len() == nodes.len() && seen.iter().all(|(_, (i, _))| *i == seen[0].1 .0) {
            if seen.iter().any(|(_, (_, d))| *d != seen[0].1 .1) {
                return Some(format!("replicas differ at index {}", seen[0].1 .0));
            }
            return None;
        }
        if Instant::now() >= until {
            return Some(format!(
                "replicas never reached one index within 30 s: {:?}",
                seen.iter().map(|(id, (i, _))| (*id, *i)).collect::<Vec<_>>()
            ));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The TTL a probed record gets, ms (the shortest the simulated nodes accept).
const PROBE_TTL_MS: u64 = 1000;

/// Completes a key of its own with a short TTL, then claims it again just after that TTL has
/// passed on every clock: the claim must not replay the record, which has expired even if the
/// sweeper has not deleted it yet. Runs only without clock jumps, where the leader's stamp of
/// the completion is at most the completion's return time, and the claim's stamp at least its
/// call time. Its operations stay out of the history: the checker's model has no TTL.
async fn expiry_probe(world: Shared, expired: Rc<RefCell<Vec<String>>>, stop_at: Instant) {
    let nodes = world.borrow().settings.nodes;
    let mut round = 0u64;
    while Instant::now() + Duration::from_millis(PROBE_TTL_MS + 500) < stop_at {
        round += 1;
        let key = format!("sim-probe-{round:08}");
        let id = RecordKey::new("sim", "sim.scope", key.clone()).unwrap_or_else(|e| panic!("{e}"));
        let via = world.borrow().node(1 + round % nodes);
        let Some(node) = via else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let claim = |owner: &str| {
            Request::Write(Op::Claim {
                id: id.clone(),
                fingerprint: None,
                owner: owner.into(),
                lease_ms: LEASE_MS,
                ttl_ms: PROBE_TTL_MS,
                allow_takeover: false,
            })
        };
        let Ok(Reply::Outcome(Outcome::Acquired(g))) = node.call(claim("probe"), Instant::now() + CALL_DEADLINE).await
        else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        let response = Response { status: 200, headers: Vec::new(), body: key.clone().into_bytes() };
        let complete = Op::Complete { id: id.clone(), token: g.token, response };
        let done = node.call(Request::Write(complete), Instant::now() + CALL_DEADLINE).await;
        if !matches!(done, Ok(Reply::Outcome(Outcome::Completed { .. }))) {
            continue;
        }
        let completed_at = Instant::now();
        tokio::time::sleep(Duration::from_millis(PROBE_TTL_MS + 20)).await;
        let again = world.borrow().node(1 + (round + 1) % nodes);
        let Some(again) = again else { continue };
        let asked = Instant::now();
        if let Ok(Reply::Outcome(Outcome::Replay { .. })) =
            again.call(claim("probe-after"), asked + CALL_DEADLINE).await
        {
            let at = completed_at.duration_since(world.borrow().epoch).as_millis();
            let after = asked.duration_since(completed_at).as_millis();
            expired.borrow_mut().push(format!(
                "{key}: completed by {at} ms with a TTL of {PROBE_TTL_MS} ms, replayed to a claim {after} ms later"
            ));
        }
    }
}

// The world is never borrowed across an await: the clients and the nemesis share it.
async fn start(world: &Shared, id: u64) {
    let (config, identity, parts) = world.borrow_mut().parts_of(id);
    let node = match Node::start_on(config, identity, parts, Arc::new(Unobserved)).await {
        Ok(n) => n,
        Err(e) => panic!("node {id} did not start: {e}"),
    };
    let mut w = world.borrow_mut();
    w.net.attach(id, node.clone());
    if let Some(sim) = w.nodes.get_mut(&id) {
        sim.running = Some(node);
    }
}

async fn stop(world: &Shared, id: u64) {
    let node = {
        let mut w = world.borrow_mut();
        w.net.detach(id);
        w.nodes.get_mut(&id).and_then(|n| n.running.take())
    };
    if let Some(node) = node {
        node.shutdown().await;
    }
    // The process is gone and so is what its disk had not flushed.
    if let Some(n) = world.borrow().nodes.get(&id) {
        n.stores.log.lose_unflushed();
    }
}

fn now_ns(world: &Shared) -> u64 {
    world.borrow().epoch.elapsed().as_nanos() as u64
}

fn key_name(k: u32) -> String {
    format!("sim-key-{k:08}")
}

fn fingerprint(v: u8) -> Fingerprint {
    let mut fp = [0u8; 32];
    fp[31] = v;
    fp
}

fn state_of(s: RecordState) -> State {
    match s {
        RecordState::InProgress => State::InProgress,
        RecordState::Completed => State::Completed,
        RecordState::Failed => State::Failed,
    }
}

fn view_of(v: &RecordView) -> Option<View> {
    let r = &v.record;
    let value = match r.state {
        RecordState::Completed => r.response.as_ref().map(|resp| String::from_utf8_lossy(&resp.body).into_owned()),
        _ => None,
    };
    Some(View { state: state_of(r.state), token: r.token.0, owner: r.owner.clone(), value })
}

fn output_of(o: &Outcome) -> Output {
    match o {
        Outcome::Acquired(g) => Output::Acquired { token: g.token.0, attempt: g.attempt, takeover: g.takeover },
        Outcome::Replay { token, response, .. } => {
            Output::Replay { token: token.0, value: String::from_utf8_lossy(&response.body).into_owned() }
        }
        Outcome::InProgress { .. } => Output::InProgress,
        Outcome::Mismatch => Output::Mismatch,
        Outcome::StaleToken { current } => Output::StaleToken { current: current.0 },
        Outcome::NotFound => Output::NotFound,
        Outcome::WrongState { state } => Output::WrongState { state: state_of(*state) },
        Outcome::Completed { token } => Output::Completed { token: token.0 },
        Outcome::Failed { token, retryable } => Output::Failed { token: token.0, retryable: *retryable },
        Outcome::LeaseExtended { token, .. } => Output::LeaseExtended { token: token.0 },
        _ => Output::Unknown,
    }
}

/// What a failed call tells the history: refused when the command certainly had no effect,
/// otherwise unknown. A node stopped while the call was in flight answers ShuttingDown for a
/// write it may already have proposed (or applied): unknown, as the SDK takes its UNAVAILABLE.
fn failure(e: &NodeError) -> Output {
    match e {
        NodeError::Invalid(_) | NodeError::BadRequest(_) | NodeError::Overloaded(_) => {
            Output::Refused { reason: e.to_string() }
        }
        _ => Output::Unknown,
    }
}

/// One client: a loop of claims and what an owner does next (complete, fail, extend, or
/// walk away), with reads, against random nodes, until `stop_at`.
async fn client(world: Shared, history: Rc<RefCell<Vec<HOp>>>, c: u32, mut rng: StdRng, stop_at: Instant) {
    let keys = world.borrow().settings.keys;
    let nodes = world.borrow().settings.nodes;
    let mut seq = 0u32;
    while Instant::now() < stop_at {
        seq += 1;
        let k = rng.random_range(0..keys);
        let key = key_name(k);
        let id = RecordKey::new("sim", "sim.scope", key.clone()).unwrap_or_else(|e| panic!("{e}"));
        let owner = format!("c{c}-{seq}");
        let fp = rng.random_range(0..2u8);
        let allow_takeover = rng.random_bool(0.5);
        let claim = Op::Claim {
            id: id.clone(),
            fingerprint: Some(fingerprint(fp)),
            owner: owner.clone(),
            lease_ms: LEASE_MS,
            ttl_ms: 3_600_000,
            allow_takeover,
        };
        let input = Input::Claim { owner: owner.clone(), fingerprint: fp, allow_takeover, lease_ms: LEASE_MS };
        // Like the SDK: a claim whose answer was lost is sent again, same owner, so a grant
        // that was made comes back as the same grant.
        let mut out = None;
        for _attempt in 0..2 {
            let target = 1 + rng.random_range(0..nodes);
            let (output, outcome) =
                call(&world, &history, c, target, &key, input.clone(), Request::Write(claim.clone())).await;
            out = outcome;
            if output != Output::Unknown {
                break;
            }
            // Backs off as the SDK does, so an outage does not fill the history with
            // operations of unknown outcome (each one multiplies the checker's search).
            tokio::time::sleep(Duration::from_millis(rng.random_range(300..1000))).await;
        }
        if let Some(Outcome::Acquired(g)) = out {
            let token = g.token;
            // Now and then the owner asks again: it must get its own grant back.
            if rng.random_bool(0.15) {
                let target = 1 + rng.random_range(0..nodes);
                call(&world, &history, c, target, &key, input.clone(), Request::Write(claim.clone())).await;
            }
            // The owner works for a while, keeping its lease or not, then settles or walks away.
            if rng.random_bool(0.3) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..1200))).await;
                let target = 1 + rng.random_range(0..nodes);
                let extend = Op::ExtendLease { id: id.clone(), token, lease_ms: LEASE_MS };
                let input = Input::Extend { token: token.0, lease_ms: LEASE_MS };
                call(&world, &history, c, target, &key, input, Request::Write(extend)).await;
            }
            // Some owners overrun their lease (a slow worker), and must then be fenced out.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..4500))).await;
            let target = 1 + rng.random_range(0..nodes);
            let roll = rng.random_range(0..10);
            // Every fourth value is 9 KiB of JSON, which leaders log compressed; from
            // the sequence number, not the generator, so seeds keep their schedules.
            let value = match seq % 4 {
                0 => format!("v-{c}-{seq}-{}", "{\"charge\":\"ch_0123456789\",\"amount\":1200},".repeat(230)),
                _ => format!("v-{c}-{seq}"),
            };
            if roll < 6 {
                let response = Response { status: 200, headers: Vec::new(), body: value.clone().into_bytes() };
                let complete = Op::Complete { id: id.clone(), token, response };
                let input = Input::Complete { token: token.0, value };
                call(&world, &history, c, target, &key, input, Request::Write(complete)).await;
            } else if roll < 8 {
                let fail = Op::Fail { id: id.clone(), token, retryable: true, response: None };
                let input = Input::Fail { token: token.0, retryable: true, value: None };
                call(&world, &history, c, target, &key, input, Request::Write(fail)).await;
            }
            // Otherwise the owner walks away and its lease runs out.
        }
        if rng.random_bool(0.3) {
            let target = 1 + rng.random_range(0..nodes);
            call(&world, &history, c, target, &key, Input::Get, Request::Get(id.clone())).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
    }
}

/// Sends `req` through node `target` and records it: what the history says of it, and the
/// outcome of a write when known.
async fn call(
    world: &Shared,
    history: &Rc<RefCell<Vec<HOp>>>,
    c: u32,
    target: u64,
    key: &str,
    input: Input,
    req: Request,
) -> (Output, Option<Outcome>) {
    let node = world.borrow().node(target);
    let id = {
        let mut w = world.borrow_mut();
        w.next_op += 1;
        w.next_op
    };
    let call_ns = now_ns(world);
    let (output, outcome) = match node {
        // A stopped node's port refuses the connection: nothing was sent.
        None => (Output::Refused { reason: format!("node {target} is down") }, None),
        Some(node) => match node.call(req, Instant::now() + CALL_DEADLINE).await {
            Ok(Reply::Outcome(o)) => (output_of(&o), Some(o)),
            Ok(Reply::Record(view)) => (Output::Record { view: view.as_ref().and_then(view_of) }, None),
            Ok(_) => (Output::Unknown, None),
            Err(e) => (failure(&e), None),
        },
    };
    let return_ns = (!matches!(output, Output::Unknown)).then(|| now_ns(world));
    history.borrow_mut().push(HOp {
        id,
        client: c,
        node: Some(target),
        key: key.to_string(),
        call_ns,
        return_ns,
        input,
        output: output.clone(),
    });
    (output, outcome.filter(|_| return_ns.is_some()))
}

/// The faults: every 0.5-2.5 s one of a partition, a heal, a crash and later restart, a
/// clock jump, or a flaky spell of the network.
async fn nemesis(
    world: Shared,
    faults: Rc<RefCell<Vec<String>>>,
    flaky: Arc<std::sync::atomic::AtomicBool>,
    mut rng: StdRng,
    stop_at: Instant,
) {
    let n = world.borrow().settings.nodes;
    let all: Vec<u64> = (1..=n).collect();
    let mut down: Vec<(u64, Instant)> = Vec::new();
    loop {
        let next = Instant::now() + Duration::from_millis(rng.random_range(500..2500));
        if next >= stop_at {
            break;
        }
        tokio::time::sleep_until(next).await;
        // Restart the crashed nodes whose time has come.
        let due: Vec<u64> = down.iter().filter(|(_, at)| *at <= Instant::now()).map(|(id, _)| *id).collect();
        for id in due {
            down.retain(|(d, _)| *d != id);
            log(&world, &faults, format!("restart node {id}"));
            start(&world, id).await;
        }
        let victim = 1 + rng.random_range(0..n);
        let others: Vec<u64> = all.iter().copied().filter(|i| *i != victim).collect();
        match rng.random_range(0..8) {
            0 => {
                world.borrow().net.isolate(victim, &others);
                log(&world, &faults, format!("isolate node {victim}"));
            }
            1 => {
                // A one-way cut: the victim hears the others but cannot answer them.
                for o in &others {
                    world.borrow().net.cut(victim, *o);
                }
                log(&world, &faults, format!("cut node {victim}'s outgoing links"));
            }
            2 => {
                world.borrow().net.heal();
                log(&world, &faults, "heal the network".into());
            }
            3 if world.borrow().node(victim).is_some() => {
                log(&world, &faults, format!("crash node {victim}"));
                stop(&world, victim).await;
                down.push((victim, Instant::now() + Duration::from_millis(rng.random_range(500..4000))));
            }
            4 if world.borrow().settings.clock_jumps => {
                let jump = rng.random_range(0..=2 * MAX_SKEW_MS) as i64 - MAX_SKEW_MS as i64;
                world.borrow().nodes[&victim].skew_ms.store(jump, Ordering::Relaxed);
                log(&world, &faults, format!("clock of node {victim} off by {jump} ms"));
            }
            6 if world.borrow().settings.membership => {
                // A voter is removed, then added back as a learner and promoted, through
                // whichever node the call reaches (forwarded to the leader).
                let via = all.iter().copied().find(|i| *i != victim && world.borrow().node(*i).is_some());
                if let Some(node) = via.and_then(|i| world.borrow().node(i)) {
                    let removed =
                        node.call(Request::Remove(vec![victim]), Instant::now() + Duration::from_secs(5)).await;
                    log(&world, &faults, format!("remove node {victim} from the voters: {}", ok_or_why(&removed)));
                    tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
                    let back = rejoin(&node, victim).await;
                    log(&world, &faults, format!("add node {victim} back as a voter: {back}"));
                }
            }
            5 => {
                let on = !flaky.load(Ordering::Relaxed);
                flaky.store(on, Ordering::Relaxed);
                log(&world, &faults, format!("network {}", if on { "flaky" } else { "steady" }));
            }
            _ => {}
        }
    }
    for (id, _) in down {
        log(&world, &faults, format!("restart node {id}"));
        start(&world, id).await;
    }
}

/// Adds node `id` back as a learner, waiting for it to catch up, and promotes it.
async fn rejoin(via: &Node, id: u64) -> String {
    let add = Request::AddLearner { id, peer_addr: format!("127.0.0.1:{}", 7200 + id), wait: true };
    let added = via.call(add, Instant::now() + Duration::from_secs(10)).await;
    if added.is_err() {
        return ok_or_why(&added);
    }
    ok_or_why(&via.call(Request::Promote(vec![id]), Instant::now() + Duration::from_secs(10)).await)
}

fn ok_or_why(r: &Result<Reply, NodeError>) -> String {
    match r {
        Ok(_) => "done".into(),
        Err(e) => format!("failed ({e})"),
    }
}

fn log(world: &Shared, faults: &Rc<RefCell<Vec<String>>>, what: String) {
    let at = world.borrow().epoch.elapsed().as_millis();
    faults.borrow_mut().push(format!("{at:>6} ms  {what}"));
}
