//! The node's Prometheus metrics: one registry per process, served as text on the HTTP port
//! at `/metrics` (Prometheus text format 0.0.4). `docs/operations.md` lists every metric.
//!
//! Where each family is recorded, so that a number always has one source:
//! - per-RPC counts and latency: [`crate::ops::instrument`], around every client and admin call on
//!   the node the caller reached (a forwarded call counts once, at its edge);
//! - claim outcomes, takeovers and stale tokens: [`Metrics::record_outcome`], from the reply of
//!   a write at the same edge;
//! - batch sizes: the proposer, per log entry it proposes (leader only);
//! - sweeper deletions: the sweeper (leader only);
//! - AppendEntries timeouts and cuts to the byte budget: the peer network (leader only);
//! - fsync latency and the commit index: the log store, through [`LogObserver`];
//! - leader changes: the health watcher ([`crate::ops::health`]) as it follows openraft's metrics;
//! - every gauge (role, term, indexes, records, sizes): read fresh at each scrape in
//!   [`render`], so a scrape never shows a stale value.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use idemraft_store::{LogObserver, Op, Outcome, RecordCounts};
use openraft::{RaftMetrics, ServerState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::cluster::node::Node;
use crate::cluster::observer::ClusterObserver;
use crate::ops::status::{LeaderChange, Recent};

/// The `Content-Type` of [`render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Every claim outcome, created at zero so `rate()` works from the first scrape.
const CLAIM_OUTCOMES: [&str; 7] =
    ["acquired", "replay", "in_progress", "mismatch", "wrong_state", "quota_exceeded", "other"];
const ROLES: [&str; 5] = ["leader", "follower", "candidate", "learner", "shutdown"];
/// Directory entries [`dir_size`] looks at before it gives up: a scrape stays cheap whatever
/// is in the data directory.
const DIR_WALK_LIMIT: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabel {
    rpc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcCodeLabel {
    rpc: String,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    rpc: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ViaLabel {
    via: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FormLabel {
    form: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms .. 16 s: a replay is sub-millisecond, a write waits for a quorum fsync, and a
    // call that waits out its deadline lands in the last buckets.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The metric families of one node.
pub struct Metrics {
    registry: Registry,
    claims: Family<OutcomeLabel, Counter>,
    takeovers: Family<RpcLabel, Counter>,
    stale_tokens: Family<RpcLabel, Counter>,
    /// No tenant label: with auth off tenants come from requests, so a label would let any
    /// caller grow the page without bound.
    quota_refusals: Counter,
    requests: Family<RpcCodeLabel, Counter>,
    request_duration: Family<MethodLabel, Histogram, fn() -> Histogram>,
    batch_size: Histogram,
    replay_confirmations: Family<ViaLabel, Counter>,
    records: Family<StateLabel, Gauge>,
    sweeper_deleted: Counter,
    /// No peer label: a node with no peers would then export nothing, and the peer that falls
    /// behind shows on the leader's status page (lag per member).
    replication_timeouts: Counter,
    replication_cuts: Counter,
    compressed_commands: Counter,
    /// Encoded bytes of the commands compressed (`raw`) and what they were logged as
    /// (`stored`): their ratio is what compression saves on every node's log, disk and peer
    /// traffic.
    compressed_bytes: Family<FormLabel, Counter>,
    role: Family<RoleLabel, Gauge>,
    has_leader: Gauge,
    term: Gauge,
    leader_changes: Counter,
    last_log_index: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    apply_lag: Gauge,
    log_entries: Gauge,
    snapshot_index: Gauge,
    snapshot_size: Gauge,
    blob_size: Gauge,
    db_size: Gauge,
    log_size: Gauge,
    fsync: Histogram,
    /// The highest committed index the log store reported.
    committed: AtomicU64,
    /// The (term, leader) last seen, to count changes.
    last_leader: Mutex<Option<(u64, u64)>>,
    /// The last change, for the status page.
    last_change: Mutex<Option<LeaderChange>>,
    /// The last minutes of calls and fsyncs, for the status page.
    recent: Recent,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// A registry with every family registered under the `idemraft_` prefix.
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("idemraft");
        let m = Metrics {
            claims: Family::default(),
            takeovers: Family::default(),
            stale_tokens: Family::default(),
            quota_refusals: Counter::default(),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            // 1 .. 1024 commands: the proposer's batch bound is at most a few thousand.
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            replay_confirmations: Family::default(),
            records: Family::default(),
            sweeper_deleted: Counter::default(),
            replication_timeouts: Counter::default(),
            replication_cuts: Counter::default(),
            compressed_commands: Counter::default(),
            compressed_bytes: Family::default(),
            role: Family::default(),
            has_leader: Gauge::default(),
            term: Gauge::default(),
            leader_changes: Counter::default(),
            last_log_index: Gauge::default(),
            commit_index: Gauge::default(),
            applied_index: Gauge::default(),
            apply_lag: Gauge::default(),
            log_entries: Gauge::default(),
            snapshot_index: Gauge::default(),
            snapshot_size: Gauge::default(),
            blob_size: Gauge::default(),
            db_size: Gauge::default(),
            log_size: Gauge::default(),
            // 0.1 ms .. 3.3 s: a good SSD syncs in well under a millisecond, a sick disk in seconds.
            fsync: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            committed: AtomicU64::new(0),
            last_leader: Mutex::new(None),
            last_change: Mutex::new(None),
            recent: Recent::default(),
            // Replaced below, once every family is registered in `r` (families share their
            // values with the clones registered there).
            registry: Registry::default(),
        };
        let build_info: Family<VersionLabel, Gauge> = Family::default();
        build_info.get_or_create(&VersionLabel { version: env!("CARGO_PKG_VERSION") }).set(1);
        for outcome in CLAIM_OUTCOMES {
            drop(m.claims.get_or_create(&OutcomeLabel { outcome }));
        }
        // The writes that can grant a takeover or meet a stale token, at zero too: an alert
        // on their rate would otherwise see no series until the first one happens.
        for rpc in ["Claim", "Takeover"] {
            drop(m.takeovers.get_or_create(&RpcLabel { rpc }));
        }
        for rpc in ["Complete", "Fail", "ExtendLease", "Checkpoint"] {
            drop(m.stale_tokens.get_or_create(&RpcLabel { rpc }));
        }
        for via in ["lease", "read_index"] {
            drop(m.replay_confirmations.get_or_create(&ViaLabel { via }));
        }
        for form in ["raw", "stored"] {
            drop(m.compressed_bytes.get_or_create(&FormLabel { form }));
        }
        for role in ROLES {
            drop(m.role.get_or_create(&RoleLabel { role }));
        }
        for state in ["in_progress", "completed", "failed"] {
            drop(m.records.get_or_create(&StateLabel { state }));
        }
        r.register("build_info", "Always 1; the version label names the running build", build_info);
        r.register("claims", "Claims answered at this node, by outcome", m.claims.clone());
        r.register(
            "takeovers",
            "Grants that took a record over from an earlier owner (rpc Claim with allow_takeover, or Takeover)",
            m.takeovers.clone(),
        );
        r.register(
            "stale_tokens",
            "Writes refused because their fencing token is no longer the record's current one",
            m.stale_tokens.clone(),
        );
        r.register(
            "quota_refusals",
            "Claims refused because they would add a record past the tenant's record quota",
            m.quota_refusals.clone(),
        );
        r.register(
            "requests",
            "Client and admin calls answered at this node, by rpc and gRPC code",
            m.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from receiving a client or admin call to its answer, by rpc",
            m.request_duration.clone(),
        );
        r.register("batch_size", "Commands per log entry proposed by this node's group commit", m.batch_size.clone());
        r.register(
            "replay_confirmations",
            "Leadership confirmations of the replay fast path, by how: under the leader lease (no round trip) or by a read-index round to a quorum",
            m.replay_confirmations.clone(),
        );
        r.register("records", "Stored records by state, expired ones included until swept", m.records.clone());
        r.register(
            "sweeper_deleted",
            "Expired records deleted by sweeps this node proposed",
            m.sweeper_deleted.clone(),
        );
        r.register(
            "replication_timeouts",
            "AppendEntries this node sent as leader, heartbeats included, that a follower did not answer in time; each that carried entries halves the bytes the next one to that follower may carry",
            m.replication_timeouts.clone(),
        );
        r.register(
            "replication_cuts",
            "AppendEntries this node cut to fewer entries because they were over the follower's byte budget",
            m.replication_cuts.clone(),
        );
        r.register(
            "compressed_commands",
            "Commands with a large payload this node compressed as leader before proposing them",
            m.compressed_commands.clone(),
        );
        r.register(
            "compressed_bytes",
            "Encoded bytes of the commands this node compressed: before compression (raw) and as logged and sent (stored)",
            m.compressed_bytes.clone(),
        );
        r.register("raft_role", "1 for this node's current Raft role, 0 for the others", m.role.clone());
        r.register(
            "raft_has_leader",
            "1 while this node knows a leader it can reach through a quorum (the readiness condition)",
            m.has_leader.clone(),
        );
        r.register("raft_term", "Current Raft term", m.term.clone());
        r.register(
            "raft_leader_changes",
            "Times this node saw a new leader (a new term or leader id)",
            m.leader_changes.clone(),
        );
        r.register("raft_last_log_index", "Index of the last entry in this node's log", m.last_log_index.clone());
        r.register("raft_commit_index", "Highest log index this node knows is committed", m.commit_index.clone());
        r.register(
            "raft_applied_index",
            "Highest log index applied to this node's state machine",
            m.applied_index.clone(),
        );
        r.register(
            "raft_apply_lag",
            "Committed entries not yet applied here (commit index minus applied index)",
            m.apply_lag.clone(),
        );
        r.register("raft_log_entries", "Entries held in the log since the last purge", m.log_entries.clone());
        r.register("raft_snapshot_index", "Last log index covered by the current snapshot", m.snapshot_index.clone());
        r.register(
            "snapshot_size_bytes",
            "Size of the snapshot files in the data directory (blobs they share with blobs/ not counted)",
            m.snapshot_size.clone(),
        );
        r.register(
            "blob_size_bytes",
            "Bytes of response bodies kept in blob files and packs (blobs/ in the data directory)",
            m.blob_size.clone(),
        );
        r.register(
            "db_size_bytes",
            "Size of the sled database (the state machine) in the data directory",
            m.db_size.clone(),
        );
        r.register("log_size_bytes", "Size of the Raft log (segment files) in the data directory", m.log_size.clone());
        r.register(
            "log_fsync_duration_seconds",
            "Time the fsync of one log append took (the durability wait of every write)",
            m.fsync.clone(),
        );
        Metrics { registry: r, ..m }
    }

    /// One client or admin call answered: `rpc` is the method name, `code` the gRPC code.
    pub fn record_rpc(&self, rpc: &str, code: tonic::Code, elapsed: Duration) {
        self.recent.request(code == tonic::Code::Ok, elapsed);
        let rpc = rpc.to_string();
        self.requests.get_or_create(&RpcCodeLabel { rpc: rpc.clone(), code: code_name(code) }).inc();
        self.request_duration.get_or_create(&MethodLabel { rpc }).observe(elapsed.as_secs_f64());
    }

    /// A write's outcome, as answered to the caller of `rpc` (see [`op_rpc`]).
    pub fn record_outcome(&self, rpc: &'static str, outcome: &Outcome) {
        if rpc == "Claim" {
            let outcome = match outcome {
                Outcome::Acquired(_) => "acquired",
                Outcome::Replay { .. } => "replay",
                Outcome::InProgress { .. } => "in_progress",
                Outcome::Mismatch => "mismatch",
                Outcome::WrongState { .. } => "wrong_state",
                Outcome::QuotaExceeded { .. } => "quota_exceeded",
                _ => "other",
            };
            self.claims.get_or_create(&OutcomeLabel { outcome }).inc();
        }
        match outcome {
            Outcome::Acquired(g) if g.takeover => {
                self.takeovers.get_or_create(&RpcLabel { rpc }).inc();
            }
            Outcome::StaleToken { .. } => {
                self.stale_tokens.get_or_create(&RpcLabel { rpc }).inc();
            }
            Outcome::QuotaExceeded { .. } => {
                self.quota_refusals.inc();
            }
            _ => {}
        }
    }

    /// One confirmation of the replay fast path (`lease` or `read_index`), however many
    /// claims waited on it.
    pub fn record_replay_confirmation(&self, via: &'static str) {
        self.replay_confirmations.get_or_create(&ViaLabel { via }).inc();
    }

    /// A log entry of `commands` commands proposed.
    pub fn record_batch(&self, commands: usize) {
        self.batch_size.observe(commands as f64);
    }

    /// A sweep deleted `deleted` records.
    pub fn record_swept(&self, deleted: u32) {
        self.sweeper_deleted.inc_by(u64::from(deleted));
    }

    /// Counts a leader change when `(term, leader)` differs from the last leader seen by
    /// node `me`, and keeps it as the last change.
    pub fn observe_leader(&self, me: u64, term: u64, leader: Option<u64>) {
        let Some(leader) = leader else { return };
        let Ok(mut last) = self.last_leader.lock() else { return };
        if *last != Some((term, leader)) {
            let change = LeaderChange::new(me, *last, term, leader);
            *last = Some((term, leader));
            self.leader_changes.inc();
            if let Ok(mut slot) = self.last_change.lock() {
                *slot = Some(change);
            }
        }
    }

    /// Leader changes seen, and the last one.
    pub fn leader_changes(&self) -> (u64, Option<LeaderChange>) {
        let last = self.last_change.lock().ok().and_then(|c| c.clone());
        (self.leader_changes.get(), last)
    }

    /// The highest committed index the log store reported.
    pub fn committed_index(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// The last minutes of calls and fsyncs.
    pub fn recent(&self) -> &Recent {
        &self.recent
    }

    /// Sizes of the data directory's parts, bytes (each walk bounded, as for the gauges).
    /// `blob_bytes`: the store's own count for `blobs/`, which may hold millions of files.
    pub fn disk_sizes(&self, data_dir: &Path, blob_bytes: u64) -> std::collections::BTreeMap<&'static str, u64> {
        let mut sizes: std::collections::BTreeMap<&'static str, u64> = ["snapshots", "db", "log"]
            .into_iter()
            .map(|part| {
                let mut budget = DIR_WALK_LIMIT;
                (part, dir_size(&data_dir.join(part), 0, &mut budget))
            })
            .collect();
        sizes.insert("blobs", blob_bytes);
        sizes
    }

    /// Sets the Raft gauges from openraft's view; `ready` is the node's readiness.
    pub fn set_raft(&self, m: &RaftMetrics<u64, openraft::BasicNode>, ready: bool) {
        self.observe_leader(m.id, m.current_term, m.current_leader);
        let current = role_name(m.state);
        for role in ROLES {
            self.role.get_or_create(&RoleLabel { role }).set(i64::from(role == current));
        }
        self.has_leader.set(i64::from(ready));
        self.term.set(gauge(m.current_term));
        let last = m.last_log_index.unwrap_or(0);
        let applied = m.last_applied.map_or(0, |l| l.index);
        // After a restart the store reports no commit until the next one, while openraft has
        // already applied what was committed before: the applied index is a lower bound.
        let committed = self.committed.load(Ordering::Acquire).max(applied);
        self.last_log_index.set(gauge(last));
        self.applied_index.set(gauge(applied));
        self.commit_index.set(gauge(committed));
        self.apply_lag.set(gauge(committed - applied));
        let purged = m.purged.map_or(0, |l| l.index);
        self.log_entries.set(gauge(last.saturating_sub(purged)));
        self.snapshot_index.set(gauge(m.snapshot.map_or(0, |l| l.index)));
    }

    /// Sets the records-by-state gauges.
    pub fn set_records(&self, c: RecordCounts) {
        for (state, n) in [("in_progress", c.in_progress), ("completed", c.completed), ("failed", c.failed)] {
            self.records.get_or_create(&StateLabel { state }).set(gauge(n));
        }
    }

    /// Sets the disk gauges from the data directory's `snapshots/`, `db/` and `log/`, and
    /// `blob_bytes` (the store's count for `blobs/`).
    pub fn set_disk(&self, data_dir: &Path, blob_bytes: u64) {
        self.blob_size.set(gauge(blob_bytes));
        let mut budget = DIR_WALK_LIMIT;
        self.snapshot_size.set(gauge(dir_size(&data_dir.join("snapshots"), 0, &mut budget)));
        let mut budget = DIR_WALK_LIMIT;
        self.db_size.set(gauge(dir_size(&data_dir.join("db"), 0, &mut budget)));
        let mut budget = DIR_WALK_LIMIT;
        self.log_size.set(gauge(dir_size(&data_dir.join("log"), 0, &mut budget)));
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail; an encoder error would be a bug in a metric, and
        // a partial page is still more useful than none.
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "metrics encoding stopped early");
        }
        out
    }
}

impl LogObserver for Metrics {
    fn append_fsynced(&self, elapsed: Duration) {
        self.fsync.observe(elapsed.as_secs_f64());
        self.recent.fsync(elapsed);
    }

    fn committed(&self, index: u64) {
        self.committed.fetch_max(index, Ordering::AcqRel);
    }
}

impl ClusterObserver for Metrics {
    fn batch_proposed(&self, commands: usize) {
        self.record_batch(commands);
    }

    fn swept(&self, deleted: u32) {
        self.record_swept(deleted);
    }

    fn replay_confirmed(&self, via: &'static str) {
        self.record_replay_confirmation(via);
    }

    fn append_timed_out(&self) {
        self.replication_timeouts.inc();
    }

    fn append_cut(&self) {
        self.replication_cuts.inc();
    }

    fn command_compressed(&self, raw: usize, stored: usize) {
        self.compressed_commands.inc();
        self.compressed_bytes.get_or_create(&FormLabel { form: "raw" }).inc_by(raw as u64);
        self.compressed_bytes.get_or_create(&FormLabel { form: "stored" }).inc_by(stored as u64);
    }
}

/// Refreshes the gauges from the node and returns the page `/metrics` serves.
pub fn render(node: &Node, metrics: &Metrics) -> String {
    let ready = node.status().ready;
    metrics.set_raft(&node.raft().metrics().borrow(), ready);
    metrics.set_records(node.record_counts());
    metrics.set_disk(&node.config().data_dir, node.blob_bytes());
    metrics.encode()
}

/// The client RPC a write operation comes from, the `rpc` label of its outcome.
pub fn op_rpc(op: &Op) -> &'static str {
    match op {
        Op::Claim { .. } => "Claim",
        Op::Complete { .. } => "Complete",
        Op::Fail { .. } => "Fail",
        Op::ExtendLease { .. } => "ExtendLease",
        Op::Checkpoint { .. } => "Checkpoint",
        Op::Takeover { .. } => "Takeover",
        Op::Sweep { .. } => "Sweep",
        Op::Resume { .. } => "Resume",
        Op::SetQuota { .. } => "SetQuota",
        // Only the leader's proposer compresses, after this label is taken.
        Op::Compressed(_) => "Compressed",
    }
}

fn role_name(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// The canonical name of a gRPC code, as grpc-go and grpcurl print it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Bytes of the regular files under `dir`, looking at most `budget` entries in all and two
/// levels deep (sled keeps one level of subdirectories). A missing directory is 0.
fn dir_size(dir: &Path, depth: u32, budget: &mut usize) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut total = 0u64;
    for entry in entries.flatten() {
        if *budget == 0 {
            break;
        }
        *budget -= 1;
        let Ok(meta) = entry.metadata() else { continue };
        // A snapshot's hard link to a live blob costs no space of its own.
        if meta.is_file() && std::os::unix::fs::MetadataExt::nlink(&meta) == 1 {
            total = total.saturating_add(meta.len());
        } else if meta.is_dir() && depth < 2 {
            total = total.saturating_add(dir_size(&entry.path(), depth + 1, budget));
        }
    }
    total
}

#[cfg(test)]
mod tests;
