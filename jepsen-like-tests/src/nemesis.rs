//! The nemesis: which faults exist, how each is installed on a [`Cluster`] and healed, and the
//! record of what actually happened, so a run whose requested faults never fired is rejected
//! instead of passed.
//!
//! Partition shapes follow Jepsen's grudges (one node, the leader, a clean majority/minority
//! bisection, the majorities ring, a bridge, a one-way cut); crashes and pauses target one
//! node, the leader, a minority or every node; clock faults shift one node's wall clock;
//! membership faults grow a 3-node cluster to 5 and shrink it back (or the reverse for 5);
//! a catch-up fault keeps a follower down while the workload writes large bodies, so that on
//! restart it has megabytes of log (or a snapshot) to catch up on. Power-loss faults SIGKILL
//! nodes and then drop everything they wrote but did not make durable (their data directories
//! are lazy-filesystem mounts), as a machine that loses power would; disk faults make one
//! node's fsyncs or writes fail with EIO (it must stop, losing nothing it acknowledged) or its
//! fsyncs slow (the others must keep serving).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::cluster::Cluster;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// One random node cut off from all others.
    PartitionOne,
    /// The leader cut off from all others.
    PartitionLeader,
    /// A random minority and majority that cannot talk.
    PartitionMajority,
    /// Every node sees a majority, no two see the same one (5 nodes).
    PartitionRing,
    /// Two halves that share one node.
    PartitionBridge,
    /// The leader can receive but not send.
    PartitionOneway,
    /// SIGKILL one random node, restart it later.
    KillOne,
    /// SIGKILL the leader.
    KillLeader,
    /// SIGKILL a minority at once.
    KillMinority,
    /// SIGKILL every node at once.
    KillAll,
    /// SIGSTOP one random node for longer than the election timeout.
    PauseOne,
    /// SIGSTOP the leader.
    PauseLeader,
    /// Shift one node's wall clock by seconds to a minute.
    Clock,
    /// 3 → 5 → 3 members (or 5 → 3 → 5) under load.
    Membership,
    /// SIGKILL a follower, write 128–256 KiB bodies while it is down, restart it from its
    /// data dir: it must catch up on large entries.
    CatchUp,
    /// One random node loses power: SIGKILL, its unsynced writes dropped, restarted later.
    PowerLossOne,
    /// The leader loses power.
    PowerLossLeader,
    /// Every node loses power at once.
    PowerLossAll,
    /// One node's disk answers EIO to fsync or to write: the node must stop by itself; it is
    /// then power-cycled (what it never synced is gone) and restarted on a healed disk.
    DiskEio,
    /// One node's fsyncs take 50–500 ms longer.
    DiskSlow,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 20] = [
        Fault::PartitionOne,
        Fault::PartitionLeader,
        Fault::PartitionMajority,
        Fault::PartitionRing,
        Fault::PartitionBridge,
        Fault::PartitionOneway,
        Fault::KillOne,
        Fault::KillLeader,
        Fault::KillMinority,
        Fault::KillAll,
        Fault::PauseOne,
        Fault::PauseLeader,
        Fault::Clock,
        Fault::Membership,
        Fault::CatchUp,
        Fault::PowerLossOne,
        Fault::PowerLossLeader,
        Fault::PowerLossAll,
        Fault::DiskEio,
        Fault::DiskSlow,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::PartitionOne => "partition-one",
            Fault::PartitionLeader => "partition-leader",
            Fault::PartitionMajority => "partition-majority",
            Fault::PartitionRing => "partition-ring",
            Fault::PartitionBridge => "partition-bridge",
            Fault::PartitionOneway => "partition-oneway",
            Fault::KillOne => "kill-one",
            Fault::KillLeader => "kill-leader",
            Fault::KillMinority => "kill-minority",
            Fault::KillAll => "kill-all",
            Fault::PauseOne => "pause-one",
            Fault::PauseLeader => "pause-leader",
            Fault::Clock => "clock",
            Fault::Membership => "membership",
            Fault::CatchUp => "catch-up",
            Fault::PowerLossOne => "power-loss-one",
            Fault::PowerLossLeader => "power-loss-leader",
            Fault::PowerLossAll => "power-loss-all",
            Fault::DiskEio => "disk-eio",
            Fault::DiskSlow => "disk-slow",
        }
    }

    /// The family a fault belongs to (`partition`, `kill`, `pause`, `clock`, `membership`,
    /// `catch-up`, `power-loss`, `disk`).
    pub fn family(self) -> &'static str {
        match self {
            Fault::CatchUp => "catch-up",
            Fault::PowerLossOne | Fault::PowerLossLeader | Fault::PowerLossAll => "power-loss",
            _ => self.name().split('-').next().unwrap_or(""),
        }
    }

    /// Whether the fault takes out (or skews) at most one node, so a majority keeps working
    /// and writes must resume within an election (see `availability`). Partitions of several
    /// nodes, a minority or every node killed, and membership changes are not.
    pub fn single_node(self) -> bool {
        matches!(
            self,
            Fault::PartitionOne
                | Fault::PartitionLeader
                | Fault::PartitionOneway
                | Fault::KillOne
                | Fault::KillLeader
                | Fault::PauseOne
                | Fault::PauseLeader
                | Fault::Clock
                | Fault::CatchUp
                | Fault::PowerLossOne
                | Fault::PowerLossLeader
                | Fault::DiskEio
                | Fault::DiskSlow
        )
    }

    /// Whether the fault needs the nodes' data directories on the lazy filesystem.
    pub fn needs_lazy_disks(self) -> bool {
        matches!(self.family(), "power-loss" | "disk")
    }

    /// Parses a comma-separated list of fault names or families (`partition`, `kill`,
    /// `pause`, `all`). `nodes` rules out shapes that need more nodes than the cluster has.
    pub fn parse_list(text: &str, nodes: u64) -> Result<Vec<Fault>, String> {
        let mut out = BTreeSet::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let matched: Vec<Fault> = Fault::ALL
                .into_iter()
                .filter(|f| item == "all" || f.name() == item || f.family() == item)
                .filter(|f| item == f.name() || f.possible(nodes))
                .collect();
            if matched.is_empty() {
                let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                return Err(format!(
                    "unknown fault '{item}': use partition, kill, pause, clock, membership, catch-up, power-loss, disk, all, or one of {}",
                    names.join(", ")
                ));
            }
            for f in matched {
                if !f.possible(nodes) {
                    return Err(format!("fault {} needs 5 nodes; run with --nodes 5", f.name()));
                }
                out.insert(f);
            }
        }
        if out.is_empty() {
            return Err("no faults given".into());
        }
        Ok(out.into_iter().collect())
    }

    /// Whether the shape exists for `nodes` nodes. With 3 nodes every node already sees a
    /// majority, so the majorities ring is the whole cluster and proves nothing.
    pub fn possible(self, nodes: u64) -> bool {
        !matches!(self, Fault::PartitionRing) || nodes >= 5
    }

    /// Whether this fault can run at the same time as `other` in a combined round.
    fn combines_with(self, other: Fault) -> bool {
        let exclusive = |f: Fault| matches!(f, Fault::Membership | Fault::KillAll | Fault::PowerLossAll);
        // A catch-up with a second node killed or paused leaves no majority on 3 nodes: no
        // large body would be written while the follower is down.
        // A failed disk must be seen to stop its node by itself, which a kill, pause or power
        // loss of the same node in the same round would hide.
        let takes_node = |f: Fault| matches!(f.family(), "kill" | "pause" | "power-loss") || f == Fault::DiskEio;
        let behind = |a: Fault, b: Fault| matches!(a, Fault::CatchUp | Fault::DiskEio) && takes_node(b);
        self.family() != other.family()
            && !exclusive(self)
            && !exclusive(other)
            && !behind(self, other)
            && !behind(other, self)
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What became of a requested fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "why", rename_all = "snake_case")]
pub enum Outcome {
    /// It took effect.
    Installed,
    /// It was not attempted (the reason says why).
    Skipped(String),
    /// It was attempted and may or may not have taken effect.
    Indeterminate(String),
}

/// One fault as it happened.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// The fault.
    pub fault: Fault,
    /// Nodes it targeted.
    pub targets: Vec<u64>,
    /// Shape details (cut links, clock offset, new members).
    pub detail: String,
    /// Harness clock when installed, ns.
    pub start_ns: u64,
    /// Harness clock when healed, ns.
    pub end_ns: u64,
    /// Whether it fired.
    pub outcome: Outcome,
}

/// An installed fault and what healing it needs.
pub enum Active {
    /// Links cut.
    Cut,
    /// Killed nodes to restart.
    Killed(Vec<u64>),
    /// Paused nodes to resume.
    Paused(Vec<u64>),
    /// A node whose clock to reset.
    Skewed(u64),
    /// Membership to restore.
    Members {
        /// The members to go back to.
        restore: Vec<u64>,
    },
    /// A follower down while large bodies are written: restart it, back to the usual mix.
    CatchUp(u64),
    /// A node whose disk fails: heal the disk, see that the node stopped, power-cycle it.
    /// With the disk's fault counts when the fault began.
    DiskFailed(u64, lazyfs::FaultStats),
    /// A node whose fsyncs are slow, with the disk's fault counts when the fault began.
    DiskSlowed(u64, lazyfs::FaultStats),
    /// Nothing to heal.
    Nothing,
}

/// The nemesis state across a run.
pub struct Nemesis {
    rng: StdRng,
    /// Current voters, as the harness last set them.
    pub members: Vec<u64>,
    /// Slot ids not yet used (ids are never reused for a wiped node).
    fresh: Vec<u64>,
    /// The longest election timeout of the nodes, so pauses outlast it.
    election_max: Duration,
    /// Nodes added during the run, oldest first (removed first when shrinking).
    joined: Vec<u64>,
    /// Read by the workload: set while a catch-up fault wants large bodies.
    large_bodies: Arc<AtomicBool>,
    /// What nodes did wrong when their disk failed (kept running).
    pub disk_anomalies: Vec<String>,
}

/// The links to cut so that each group only talks within itself (a node may be in two groups).
fn cuts_for(groups: &[Vec<u64>], members: &[u64]) -> Vec<(u64, u64)> {
    let mut cuts = Vec::new();
    for &a in members {
        for &b in members {
            if a != b && !groups.iter().any(|g| g.contains(&a) && g.contains(&b)) {
                cuts.push((a, b));
            }
        }
    }
    cuts
}

impl Nemesis {
    /// A nemesis for a cluster of `members`, with spare slot ids `fresh`; `large_bodies` is
    /// the workload's switch to large bodies.
    pub fn new(
        rng: StdRng,
        members: Vec<u64>,
        fresh: Vec<u64>,
        election_max: Duration,
        large_bodies: Arc<AtomicBool>,
    ) -> Nemesis {
        Nemesis { rng, members, fresh, election_max, joined: Vec::new(), large_bodies, disk_anomalies: Vec::new() }
    }

    /// A seeded random draw for the schedule.
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    /// The faults of the next round: usually one, sometimes two that combine.
    pub fn pick_round(&mut self, queue: &mut Vec<Fault>, all: &[Fault], combine: bool) -> Vec<Fault> {
        if queue.is_empty() {
            // Each requested fault fires once per pass over the list, in a seeded order.
            *queue = all.to_vec();
            queue.shuffle(&mut self.rng);
        }
        let Some(first) = queue.pop() else { return Vec::new() };
        let mut round = vec![first];
        if combine && self.rng.random_bool(0.35) {
            if let Some(pos) = queue.iter().position(|f| f.combines_with(first)) {
                round.push(queue.remove(pos));
            }
        }
        round
    }

    /// How long a round of `round` is held. A catch-up round is held 5 to 7 s: long enough
    /// for the workload to write tens of megabytes the follower will lack.
    pub fn hold(&mut self, round: &[Fault]) -> Duration {
        let base = Duration::from_millis(self.rng.random_range(2_000..=4_500));
        if round.contains(&Fault::CatchUp) {
            base.max(Duration::from_millis(self.rng.random_range(5_000..=7_000)))
        } else {
            base
        }
    }

    /// Installs `fault`, returning the record of it and what healing needs.
    pub async fn install(&mut self, cluster: &mut Cluster, fault: Fault, now_ns: u64) -> (Event, Active) {
        let mut ev = Event {
            fault,
            targets: Vec::new(),
            detail: String::new(),
            start_ns: now_ns,
            end_ns: now_ns,
            outcome: Outcome::Installed,
        };
        let members = self.members.clone();
        let leader = match cluster.leader().await {
            Some(l) if members.contains(&l) => Some(l),
            _ => None,
        };
        let random_member = |rng: &mut StdRng| members.choose(rng).copied();
        let leader_or_random = |rng: &mut StdRng, ev: &mut Event| match leader {
            Some(l) => Some(l),
            None => {
                ev.detail.push_str("no leader known, a random node instead; ");
                random_member(rng)
            }
        };
        let active = match fault {
            Fault::PartitionOne
            | Fault::PartitionLeader
            | Fault::PartitionMajority
            | Fault::PartitionRing
            | Fault::PartitionBridge
            | Fault::PartitionOneway => {
                let mut shuffled = members.clone();
                shuffled.shuffle(&mut self.rng);
                let cuts = match fault {
                    Fault::PartitionOne | Fault::PartitionLeader => {
                        let target = if fault == Fault::PartitionLeader {
                            leader_or_random(&mut self.rng, &mut ev)
                        } else {
                            random_member(&mut self.rng)
                        };
                        let Some(t) = target else { return skipped(ev, "no members") };
                        ev.targets = vec![t];
                        let rest: Vec<u64> = members.iter().copied().filter(|&m| m != t).collect();
                        cuts_for(&[vec![t], rest], &members)
                    }
                    Fault::PartitionMajority => {
                        let minority = shuffled.len() / 2;
                        let (a, b) = shuffled.split_at(minority);
                        ev.targets = a.to_vec();
                        cuts_for(&[a.to_vec(), b.to_vec()], &members)
                    }
                    Fault::PartitionRing => {
                        // Node i talks to its two ring neighbours: each sees 3 of 5.
                        let n = shuffled.len();
                        let groups: Vec<Vec<u64>> = (0..n).map(|i| vec![shuffled[i], shuffled[(i + 1) % n]]).collect();
                        ev.targets = shuffled.clone();
                        cuts_for(&groups, &members)
                    }
                    Fault::PartitionBridge => {
                        let mid = shuffled.len() / 2;
                        let left = shuffled[..=mid].to_vec();
                        let right = shuffled[mid..].to_vec();
                        ev.targets = vec![shuffled[mid]];
                        cuts_for(&[left, right], &members)
                    }
                    _ => {
                        let Some(t) = leader_or_random(&mut self.rng, &mut ev) else {
                            return skipped(ev, "no members");
                        };
                        ev.targets = vec![t];
                        members.iter().copied().filter(|&m| m != t).map(|m| (t, m)).collect()
                    }
                };
                ev.detail.push_str(&format!("cut {cuts:?}"));
                cluster.net.set_cuts(&cuts);
                Active::Cut
            }
            Fault::KillOne | Fault::KillLeader | Fault::KillMinority | Fault::KillAll => {
                let targets: Vec<u64> = match fault {
                    Fault::KillOne => random_member(&mut self.rng).into_iter().collect(),
                    Fault::KillLeader => leader_or_random(&mut self.rng, &mut ev).into_iter().collect(),
                    Fault::KillMinority => {
                        let mut m = members.clone();
                        m.shuffle(&mut self.rng);
                        m.truncate((members.len() - 1) / 2);
                        m
                    }
                    _ => members.clone(),
                };
                let running = cluster.running();
                let targets: Vec<u64> = targets.into_iter().filter(|t| running.contains(t)).collect();
                if targets.is_empty() {
                    return skipped(ev, "no running target");
                }
                for t in &targets {
                    if let Err(e) = cluster.kill(*t) {
                        ev.outcome = Outcome::Indeterminate(e);
                    }
                }
                ev.targets = targets.clone();
                Active::Killed(targets)
            }
            Fault::PauseOne | Fault::PauseLeader => {
                let target = if fault == Fault::PauseLeader {
                    leader_or_random(&mut self.rng, &mut ev)
                } else {
                    random_member(&mut self.rng)
                };
                let Some(t) = target.filter(|t| cluster.running().contains(t) && !cluster.is_paused(*t)) else {
                    return skipped(ev, "no running target");
                };
                if let Err(e) = cluster.pause(t) {
                    return skipped(ev, &e);
                }
                ev.targets = vec![t];
                ev.detail.push_str(&format!("at least {:?}", self.election_max * 2));
                Active::Paused(vec![t])
            }
            Fault::Clock => {
                // Half the time the leader, whose clock stamps the log.
                let target = if self.rng.random_bool(0.5) {
                    leader_or_random(&mut self.rng, &mut ev)
                } else {
                    random_member(&mut self.rng)
                };
                let Some(t) = target else { return skipped(ev, "no members") };
                let magnitude = self.rng.random_range(5..=60i64);
                let offset = if self.rng.random_bool(0.5) { magnitude } else { -magnitude };
                if let Err(e) = cluster.set_clock_offset(t, offset) {
                    return skipped(ev, &e);
                }
                ev.targets = vec![t];
                ev.detail.push_str(&format!("wall clock {offset:+} s"));
                Active::Skewed(t)
            }
            Fault::CatchUp => {
                let running = cluster.running();
                let followers: Vec<u64> = members
                    .iter()
                    .copied()
                    .filter(|m| Some(*m) != leader && running.contains(m) && !cluster.is_paused(*m))
                    .collect();
                // Without a known leader any node may be it; killing the leader would make this
                // a leader kill, which is not what this fault is for.
                if leader.is_none() {
                    return skipped(ev, "no leader known, so no follower either");
                }
                let Some(t) = followers.choose(&mut self.rng).copied() else {
                    return skipped(ev, "no running follower");
                };
                if let Err(e) = cluster.kill(t) {
                    ev.outcome = Outcome::Indeterminate(e);
                }
                self.large_bodies.store(true, Ordering::SeqCst);
                ev.targets = vec![t];
                ev.detail.push_str("follower killed; 128-256 KiB bodies until it restarts");
                Active::CatchUp(t)
            }
            Fault::PowerLossOne | Fault::PowerLossLeader | Fault::PowerLossAll => {
                let targets: Vec<u64> = match fault {
                    Fault::PowerLossOne => random_member(&mut self.rng).into_iter().collect(),
                    Fault::PowerLossLeader => leader_or_random(&mut self.rng, &mut ev).into_iter().collect(),
                    _ => members.clone(),
                };
                let running = cluster.running();
                let targets: Vec<u64> = targets.into_iter().filter(|t| running.contains(t)).collect();
                if targets.is_empty() {
                    return skipped(ev, "no running target");
                }
                if let Some(t) = targets.iter().find(|t| cluster.disk(**t).is_none()) {
                    return skipped(ev, &format!("node {t} has no lazy disk"));
                }
                // All nodes die before any loses its data, as when one power feed fails.
                for t in &targets {
                    if let Err(e) = cluster.kill(*t) {
                        ev.outcome = Outcome::Indeterminate(e);
                    }
                }
                for t in &targets {
                    match cluster.power_loss(*t) {
                        Ok(what) => ev.detail.push_str(&format!("{what}; ")),
                        Err(e) => ev.outcome = Outcome::Indeterminate(e),
                    }
                }
                ev.targets = targets.clone();
                Active::Killed(targets)
            }
            Fault::DiskEio | Fault::DiskSlow => {
                let target = if self.rng.random_bool(0.5) {
                    leader_or_random(&mut self.rng, &mut ev)
                } else {
                    random_member(&mut self.rng)
                };
                let running = cluster.running();
                let Some(t) = target.filter(|t| running.contains(t) && !cluster.is_paused(*t)) else {
                    return skipped(ev, "no running target");
                };
                let Some(disk) = cluster.disk(t) else { return skipped(ev, &format!("node {t} has no lazy disk")) };
                ev.targets = vec![t];
                let before = disk.fault_stats();
                if fault == Fault::DiskEio {
                    if self.rng.random_bool(0.5) {
                        disk.set_fail_fsync(true);
                        ev.detail.push_str("fsync answers EIO");
                    } else {
                        disk.set_fail_write(true);
                        ev.detail.push_str("write answers EIO");
                    }
                    Active::DiskFailed(t, before)
                } else {
                    let delay = Duration::from_millis(self.rng.random_range(50..=500));
                    disk.set_fsync_delay(delay);
                    ev.detail.push_str(&format!("every fsync {} ms slower", delay.as_millis()));
                    Active::DiskSlowed(t, before)
                }
            }
            Fault::Membership => {
                let restore = self.members.clone();
                match self.change_members(cluster, leader, &mut ev).await {
                    Ok(()) => Active::Members { restore },
                    Err(e) => {
                        ev.outcome = Outcome::Indeterminate(e);
                        Active::Members { restore }
                    }
                }
            }
        };
        (ev, active)
    }

    /// 3 → 5 by two fresh joiners, or 5 → 3 by removing two members (the latest joiners
    /// first). Whatever the calls answered, the members are then read back from the cluster
    /// and every running node outside them is stopped: a timed-out change may still have
    /// happened.
    async fn change_members(
        &mut self,
        cluster: &mut Cluster,
        leader: Option<u64>,
        ev: &mut Event,
    ) -> Result<(), String> {
        let admin = cluster.client(&cluster.running(), Duration::from_secs(3), Duration::from_secs(15))?;
        let result = if self.members.len() <= 3 {
            if self.fresh.len() < 2 {
                ev.outcome = Outcome::Skipped("no fresh node ids left".into());
                return Ok(());
            }
            let new: Vec<u64> = self.fresh.drain(..2).collect();
            ev.targets = new.clone();
            ev.detail.push_str(&format!("grow {:?} + {new:?}; ", self.members));
            self.grow(cluster, &admin, &new).await
        } else {
            let mut victims: Vec<u64> =
                self.joined.iter().rev().copied().filter(|m| self.members.contains(m)).collect();
            if victims.len() < 2 {
                let mut others: Vec<u64> =
                    self.members.iter().copied().filter(|&m| Some(m) != leader && !victims.contains(&m)).collect();
                others.shuffle(&mut self.rng);
                victims.extend(others);
            }
            victims.truncate(2);
            ev.targets = victims.clone();
            ev.detail.push_str(&format!("shrink {:?} - {victims:?}; ", self.members));
            admin.remove(&victims).await.map(|_| ()).map_err(|e| format!("remove {victims:?}: {e}"))
        };
        // The cluster's own answer is the truth.
        let mut members = None;
        for _ in 0..10 {
            if let Ok(m) = admin.members().await {
                members = Some(m.members.iter().filter(|m| m.voter).map(|m| m.id).collect::<Vec<u64>>());
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let Some(members) = members else {
            return Err(format!("membership unknown after the change ({result:?})"));
        };
        for id in cluster.running() {
            if !members.contains(&id) {
                let _ = cluster.stop(id);
            }
        }
        ev.detail.push_str(&format!("now {members:?}"));
        self.members = members;
        result
    }

    async fn grow(
        &mut self,
        cluster: &mut Cluster,
        admin: &idemraft_client::Client,
        new: &[u64],
    ) -> Result<(), String> {
        for &id in new {
            cluster.spawn(id)?;
            self.joined.push(id);
        }
        for &id in new {
            let addr = cluster.peer_addr(id).ok_or("no slot")?.to_string();
            admin.add_learner(id, &addr, true).await.map_err(|e| format!("add learner {id}: {e}"))?;
        }
        admin.promote(new).await.map_err(|e| format!("promote {new:?}: {e}"))?;
        Ok(())
    }

    /// Heals what `active` installed; the text says what healing did, when it is worth saying.
    pub async fn heal(&mut self, cluster: &mut Cluster, active: Active) -> Result<String, String> {
        match active {
            Active::Cut => cluster.net.heal(),
            Active::Killed(ids) => {
                for id in ids {
                    if !cluster.running().contains(&id) {
                        cluster.spawn(id)?;
                    }
                }
            }
            Active::Paused(ids) => {
                for id in ids {
                    cluster.resume(id)?;
                }
            }
            Active::Skewed(id) => cluster.reset_clock(id)?,
            Active::CatchUp(id) => {
                self.large_bodies.store(false, Ordering::SeqCst);
                cluster.spawn(id)?;
            }
            Active::DiskSlowed(id, before) => {
                if let Some(d) = cluster.disk(id) {
                    let n = d.fault_stats().delayed_fsyncs.saturating_sub(before.delayed_fsyncs);
                    d.clear_faults();
                    return Ok(format!("{n} fsyncs delayed"));
                }
            }
            Active::DiskFailed(id, before) => return self.heal_failed_disk(cluster, id, before),
            Active::Members { restore } => {
                if self.members.len() != restore.len() {
                    let mut ev = Event {
                        fault: Fault::Membership,
                        targets: Vec::new(),
                        detail: String::new(),
                        start_ns: 0,
                        end_ns: 0,
                        outcome: Outcome::Installed,
                    };
                    let leader = cluster.leader().await;
                    let r = self.change_members(cluster, leader, &mut ev).await;
                    return match r {
                        Ok(()) => Ok(ev.detail),
                        Err(e) => Err(format!("{}: {e}", ev.detail)),
                    };
                }
            }
            Active::Nothing => {}
        }
        Ok(String::new())
    }

    /// A node whose disk failed must have stopped by itself (an error, not a hang). Whatever it did, it is then power-cycled on a healed disk: what it never made
    /// durable is gone, as with a disk that failed for real. What it did goes to
    /// [`Nemesis::disk_anomalies`] when it was wrong.
    fn heal_failed_disk(
        &mut self,
        cluster: &mut Cluster,
        id: u64,
        before: lazyfs::FaultStats,
    ) -> Result<String, String> {
        let now = cluster.disk(id).map(|d| d.fault_stats()).unwrap_or(before);
        let (failed_fsyncs, failed_writes) = (
            now.failed_fsyncs.saturating_sub(before.failed_fsyncs),
            now.failed_writes.saturating_sub(before.failed_writes),
        );
        // A node that hit the error stops within a few seconds; one that never touched its
        // disk during the hold has nothing to report.
        let touched = failed_fsyncs + failed_writes > 0;
        let exit = cluster.reap(id, if touched { Duration::from_secs(5) } else { Duration::ZERO });
        let mut what = format!("{failed_fsyncs} fsyncs and {failed_writes} writes failed; ");
        match &exit {
            // A panic on the way out is caught by the run's end-of-run look at every log.
            Some(status) => what.push_str(&format!("node stopped by itself ({status})")),
            None if touched => {
                what.push_str("node still ran 5 s after its disk failed");
                self.disk_anomalies
                    .push(format!("node {id} kept running 5 s after its disk answered EIO instead of stopping"));
                cluster.kill(id)?;
            }
            None => {
                what.push_str("node never touched its disk; power-cycled anyway");
                cluster.kill(id)?;
            }
        }
        if let Some(d) = cluster.disk(id) {
            d.clear_faults();
        }
        what = format!("{what}; {}", cluster.power_loss(id)?);
        cluster.spawn(id)?;
        Ok(what)
    }

    /// Heals everything regardless of what is recorded: every link, every paused or dead
    /// member, every clock, every disk. The final phase starts from here.
    pub fn heal_all(&mut self, cluster: &mut Cluster) -> Result<(), String> {
        self.large_bodies.store(false, Ordering::SeqCst);
        cluster.net.heal();
        let running = cluster.running();
        for &id in &self.members {
            if let Some(d) = cluster.disk(id) {
                d.clear_faults();
            }
            cluster.reset_clock(id)?;
            if cluster.is_paused(id) {
                cluster.resume(id)?;
            }
            if !running.contains(&id) {
                cluster.spawn(id)?;
            }
        }
        Ok(())
    }
}

fn skipped(mut ev: Event, why: &str) -> (Event, Active) {
    ev.outcome = Outcome::Skipped(why.to_string());
    (ev, Active::Nothing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_by_name_and_family() {
        let f = Fault::parse_list("kill,pause-leader", 3).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(f, vec![Fault::KillOne, Fault::KillLeader, Fault::KillMinority, Fault::KillAll, Fault::PauseLeader]);
        // The ring needs five nodes: the family leaves it out on three, the name is refused.
        assert!(!Fault::parse_list("partition", 3).unwrap_or_default().contains(&Fault::PartitionRing));
        assert!(Fault::parse_list("partition-ring", 3).is_err());
        assert!(Fault::parse_list("partition", 5).unwrap_or_default().contains(&Fault::PartitionRing));
        assert!(Fault::parse_list("bogus", 3).is_err());
        assert_eq!(Fault::parse_list("catch-up", 3).unwrap_or_default(), vec![Fault::CatchUp]);
        assert!(Fault::parse_list("all", 3).unwrap_or_default().contains(&Fault::CatchUp));
        assert!(Fault::parse_list("", 3).is_err());
    }

    #[test]
    fn cuts_keep_groups_together() {
        let members = [1, 2, 3, 4, 5];
        let cuts = cuts_for(&[vec![1, 2, 3], vec![3, 4, 5]], &members);
        assert!(cuts.contains(&(1, 4)) && cuts.contains(&(5, 2)));
        assert!(!cuts.contains(&(1, 3)) && !cuts.contains(&(3, 5)));
        // The ring: each node keeps exactly its two neighbours.
        let ring: Vec<Vec<u64>> = (0..5).map(|i| vec![members[i], members[(i + 1) % 5]]).collect();
        let cuts = cuts_for(&ring, &members);
        for m in members {
            let reachable = members.iter().filter(|&&o| o != m && !cuts.contains(&(m, o))).count();
            assert_eq!(reachable, 2, "node {m}");
        }
    }
}
