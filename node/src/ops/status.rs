//! The status page's data: the cluster as this node sees it, and what it served in the last
//! minutes. `/status.json` serves a [`StatusReport`]; the page at `/` draws the same JSON.
//!
//! Prometheus keeps history for whoever runs it; a node alone keeps only cumulative counters.
//! So the node keeps its own short history, [`Recent`]: five minutes in 5 s slots of request
//! counts, errors and latency buckets, and fsync latency buckets. The slots are reused in a
//! ring, so the memory is fixed whatever the load.
//!
//! Nothing here names a key, a body or a token: the report is counts, indexes, addresses and
//! durations only.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::cluster::node::Readiness;

/// Length of one slot of [`Recent`].
pub const SLOT: Duration = Duration::from_secs(5);
/// Slots kept: five minutes.
pub const SLOTS: usize = 60;
/// Upper bounds of the latency buckets, in seconds: 0.1 and 0.25 ms (a fast disk's fsync),
/// then 0.5 ms doubling to 16 s as the request histograms, plus one for everything slower.
const BOUNDS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096,
    8.192, 16.384,
];
const BUCKETS: usize = BOUNDS.len() + 1;

#[derive(Clone, Copy, Default)]
struct Slot {
    /// Which 5 s interval since the Unix epoch this slot holds; a stale one is reset on use.
    epoch: u64,
    requests: u64,
    errors: u64,
    latency: [u64; BUCKETS],
    fsyncs: u64,
    fsync: [u64; BUCKETS],
}

/// The last five minutes of requests and fsyncs, in 5 s slots.
pub struct Recent {
    ring: Mutex<[Slot; SLOTS]>,
}

impl Default for Recent {
    fn default() -> Self {
        Recent { ring: Mutex::new([Slot::default(); SLOTS]) }
    }
}

/// Wall-clock now, Unix ms.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn bucket(elapsed: Duration) -> usize {
    let s = elapsed.as_secs_f64();
    BOUNDS.iter().position(|b| s <= *b).unwrap_or(BOUNDS.len())
}

impl Recent {
    fn with_slot(&self, f: impl FnOnce(&mut Slot)) {
        let epoch = now_ms() / SLOT.as_millis() as u64;
        // A poisoned lock only means a panic elsewhere mid-update: a slightly wrong count is
        // better than no status page.
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut ring[(epoch % SLOTS as u64) as usize];
        if slot.epoch != epoch {
            *slot = Slot { epoch, ..Slot::default() };
        }
        f(slot);
    }

    /// One client or admin call answered.
    pub fn request(&self, ok: bool, elapsed: Duration) {
        self.with_slot(|s| {
            s.requests += 1;
            s.errors += u64::from(!ok);
            s.latency[bucket(elapsed)] += 1;
        });
    }

    /// One log append made durable.
    pub fn fsync(&self, elapsed: Duration) {
        self.with_slot(|s| {
            s.fsyncs += 1;
            s.fsync[bucket(elapsed)] += 1;
        });
    }

    /// The window as the report shows it, oldest slot first, the current one last (it is
    /// still filling, so its rate is over the part that has passed).
    pub fn window(&self) -> Window {
        let now = now_ms();
        let current = now / SLOT.as_millis() as u64;
        let ring = *self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let mut samples = Vec::with_capacity(SLOTS);
        let (mut latency, mut fsync) = ([0u64; BUCKETS], [0u64; BUCKETS]);
        let (mut requests, mut errors, mut fsyncs) = (0, 0, 0);
        for back in (0..SLOTS as u64).rev() {
            let Some(epoch) = current.checked_sub(back) else { continue };
            let slot = ring[(epoch % SLOTS as u64) as usize];
            let slot = if slot.epoch == epoch { slot } else { Slot::default() };
            let start_ms = epoch * SLOT.as_millis() as u64;
            let secs = if back == 0 { (now - start_ms).max(1) as f64 / 1000.0 } else { SLOT.as_secs_f64() };
            samples.push(Sample {
                start_ms,
                requests_per_sec: slot.requests as f64 / secs,
                errors_per_sec: slot.errors as f64 / secs,
                p99_ms: quantile(&slot.latency, 0.99),
                fsync_p99_ms: quantile(&slot.fsync, 0.99),
            });
            requests += slot.requests;
            errors += slot.errors;
            fsyncs += slot.fsyncs;
            for i in 0..BUCKETS {
                latency[i] += slot.latency[i];
                fsync[i] += slot.fsync[i];
            }
        }
        Window {
            slot_secs: SLOT.as_secs(),
            requests,
            errors,
            latency_ms: Percentiles::of(&latency),
            fsyncs,
            fsync_ms: Percentiles::of(&fsync),
            samples,
        }
    }
}

/// The `q` quantile of bucket counts, as the bucket's upper bound in ms (what Prometheus's
/// `histogram_quantile` would interpolate towards); `None` without samples.
fn quantile(buckets: &[u64; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            let bound = BOUNDS.get(i).copied().unwrap_or(BOUNDS[BOUNDS.len() - 1] * 2.0);
            return Some(bound * 1000.0);
        }
    }
    None
}

/// Latency percentiles over the window, in ms (bucket upper bounds: "at most").
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Percentiles {
    fn of(buckets: &[u64; BUCKETS]) -> Percentiles {
        Percentiles { p50: quantile(buckets, 0.5), p90: quantile(buckets, 0.9), p99: quantile(buckets, 0.99) }
    }
}

/// One 5 s slot of the window.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Start of the slot, Unix ms.
    pub start_ms: u64,
    /// Calls answered per second.
    pub requests_per_sec: f64,
    /// Calls answered with an error code per second.
    pub errors_per_sec: f64,
    /// 99th percentile latency of the slot's calls, ms.
    pub p99_ms: Option<f64>,
    /// 99th percentile of the slot's log fsyncs, ms.
    pub fsync_p99_ms: Option<f64>,
}

/// The last five minutes.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    /// Length of a sample.
    pub slot_secs: u64,
    /// Calls answered in the window.
    pub requests: u64,
    /// Of those, answered with an error code.
    pub errors: u64,
    /// Call latency over the window.
    pub latency_ms: Percentiles,
    /// Log fsyncs in the window.
    pub fsyncs: u64,
    /// Fsync latency over the window.
    pub fsync_ms: Percentiles,
    /// Oldest first.
    pub samples: Vec<Sample>,
}

/// A leader change this node saw.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct LeaderChange {
    /// When this node saw it, Unix ms.
    pub at_ms: u64,
    /// The new leader's term.
    pub term: u64,
    /// The leader before, if this node knew one.
    pub from: Option<u64>,
    /// The new leader.
    pub to: u64,
    /// What this node can say about why, from what it saw.
    pub why: String,
}

impl LeaderChange {
    /// Describes a change from `(old_term, old_leader)` to `leader` in `term`, as node `me`
    /// saw it. Only what the node observed is said; the cause of an election (a crash, a
    /// partition, a pause) is not visible from one node.
    pub fn new(me: u64, before: Option<(u64, u64)>, term: u64, leader: u64) -> LeaderChange {
        let why = match before {
            None if leader == me => format!("this node became leader in term {term} (the first leader it saw)"),
            None => format!("first leader this node saw since it started: node {leader}, term {term}"),
            Some((_, old)) if old == leader => {
                format!("node {leader} was elected again, in term {term}: an election ran, but it kept the lead")
            }
            Some((old_term, old)) if leader == me => format!(
                "this node won the election of term {term}: it stopped hearing from leader {old} (term {old_term}) \
                 for an election timeout, or {old} stepped down"
            ),
            Some((old_term, old)) => format!(
                "node {leader} won the election of term {term}: leader {old} (term {old_term}) stopped being \
                 heard from by a majority, or stepped down"
            ),
        };
        LeaderChange { at_ms: now_ms(), term, from: before.map(|b| b.1), to: leader, why }
    }
}

/// A member as this node sees it.
#[derive(Clone, Debug, Serialize)]
pub struct Member {
    /// Node id.
    pub id: u64,
    /// Peer address.
    pub peer_addr: String,
    /// Voter or learner.
    pub voter: bool,
    /// `leader`, `follower` or `learner` as this node believes; for itself, its own role.
    pub role: String,
    /// Highest log index known to be on that member: exact on the leader (replication
    /// progress), this node's own last index for itself, unknown otherwise.
    pub matched_index: Option<u64>,
    /// Entries the member is behind the leader's last log index (leader's view only).
    pub lag: Option<u64>,
    /// This node.
    pub is_self: bool,
}

/// Records by state.
#[derive(Clone, Debug, Serialize)]
pub struct RecordsByState {
    /// Owned by a worker.
    pub in_progress: u64,
    /// Settled with a stored response.
    pub completed: u64,
    /// Failed retryably.
    pub failed: u64,
}

/// Everything `/status.json` serves.
#[derive(Clone, Debug, Serialize)]
pub struct StatusReport {
    /// When the report was made, Unix ms.
    pub generated_ms: u64,
    /// This node's id.
    pub id: u64,
    /// This node's role.
    pub role: &'static str,
    /// Current term.
    pub term: u64,
    /// The leader this node knows, if any.
    pub leader_id: Option<u64>,
    /// The leader's client address, if known.
    pub leader_client_addr: Option<String>,
    /// This node's client address.
    pub client_addr: String,
    /// This node's last log index.
    pub last_log_index: u64,
    /// The highest index this node knows committed.
    pub commit_index: u64,
    /// This node's applied index.
    pub applied_index: u64,
    /// The state machine's clock, Unix ms.
    pub clock_ms: u64,
    /// Whether `/readyz` answers 200.
    pub ready: bool,
    /// Each condition of readiness, met or not, with what it saw.
    pub readiness: Vec<Readiness>,
    /// The members.
    pub members: Vec<Member>,
    /// Leader changes this node saw since it started.
    pub leader_changes: u64,
    /// The last of them.
    pub last_leader_change: Option<LeaderChange>,
    /// Records by state in this node's state machine.
    pub records: RecordsByState,
    /// The last five minutes on this node.
    pub recent: Window,
    /// Data directory sizes, bytes.
    pub disk: BTreeMap<&'static str, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_bucket_bounds() {
        let mut b = [0u64; BUCKETS];
        assert_eq!(quantile(&b, 0.5), None);
        b[bucket(Duration::from_micros(300))] += 98;
        b[bucket(Duration::from_millis(100))] += 2;
        assert_eq!(quantile(&b, 0.5), Some(0.5));
        assert_eq!(quantile(&b, 0.98), Some(0.5));
        assert_eq!(quantile(&b, 0.99), Some(128.0));
        b[bucket(Duration::from_secs(60))] += 1;
        assert_eq!(quantile(&b, 1.0), Some(BOUNDS[BOUNDS.len() - 1] * 2000.0));
    }

    #[test]
    fn the_window_counts_what_was_recorded_now() {
        let r = Recent::default();
        for _ in 0..10 {
            r.request(true, Duration::from_millis(3));
        }
        r.request(false, Duration::from_millis(3));
        r.fsync(Duration::from_millis(1));
        let w = r.window();
        assert_eq!((w.requests, w.errors, w.fsyncs), (11, 1, 1));
        assert_eq!(w.samples.len(), SLOTS);
        assert_eq!(w.latency_ms.p50, Some(4.0));
        assert_eq!(w.fsync_ms.p99, Some(1.0));
        assert!(w.samples.last().is_some_and(|s| s.requests_per_sec > 0.0));
    }

    #[test]
    fn a_stale_slot_is_not_counted() {
        let r = Recent::default();
        {
            let mut ring = r.ring.lock().unwrap_or_else(|p| p.into_inner());
            // A slot from long ago at every position: none may show up in the window.
            for s in ring.iter_mut() {
                *s = Slot { epoch: 1, requests: 1000, ..Slot::default() };
            }
        }
        assert_eq!(r.window().requests, 0);
    }

    #[test]
    fn leader_change_reasons_say_only_what_was_seen() {
        assert!(LeaderChange::new(1, None, 1, 1).why.contains("this node became leader"));
        assert!(LeaderChange::new(1, Some((1, 2)), 2, 3).why.contains("node 3 won the election of term 2"));
        assert!(LeaderChange::new(3, Some((1, 2)), 2, 3).why.contains("this node won"));
        assert!(LeaderChange::new(1, Some((1, 2)), 2, 2).why.contains("kept the lead"));
        assert_eq!(LeaderChange::new(1, Some((4, 2)), 5, 3).from, Some(2));
    }
}
