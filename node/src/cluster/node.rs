//! One Idemraft node: the Raft instance over the sled stores, the proposer, the sweeper, and
//! the routing of every client call. A call is executed where the leader is: here when this
//! node leads, otherwise forwarded over the peer port, so a caller may talk to any node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_store::TypeConfig;
use openraft::error::{InitializeError, RaftError};
use openraft::{BasicNode, Raft, ServerState, SnapshotPolicy, Vote};

use crate::cluster::election::Election;
use crate::cluster::fast_read::FastRead;
use crate::cluster::identity::IdentityHandle;
use crate::cluster::network::{Channels, Network};
use crate::cluster::observer::ClusterObserver;
use crate::cluster::proposer::{system_clock, Proposer, ProposerConfig, WallClock};
use crate::cluster::storage::{LogView, NodeLog, NodeStateMachine, StateView, Stores};
use crate::cluster::tasks::Tasks;
use crate::cluster::transport::Transport;
use crate::config::Config;
use crate::error::NodeError;
use crate::wire::MemberInfo;

/// Time kept back from a caller's deadline so an answer (even "deadline exceeded") gets back
/// to the caller before it gives up.
pub(super) const REPLY_MARGIN: Duration = Duration::from_millis(20);

/// A failure to start, phrased for the operator.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory cannot be used.
    #[error("{0}")]
    Store(#[from] idemraft_store::StoreError),
    /// The data directory cannot be created.
    #[error("cannot create data directory {dir}: {source}; check the path and its permissions (--data-dir)")]
    DataDir {
        /// The directory.
        dir: String,
        /// The cause.
        source: std::io::Error,
    },
    /// openraft refused the configuration or failed to start.
    #[error("raft: {0}")]
    Raft(String),
    /// The data directory belongs to another node or cluster.
    #[error("{0}")]
    Identity(#[from] crate::cluster::identity::IdentityError),
    /// `--restore-from` cannot be carried out.
    #[error("{0}")]
    Restore(#[from] crate::cluster::restore::RestoreError),
}

/// What `Status` reports about a node.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StatusInfo {
    /// Node id.
    pub id: u64,
    /// Role name: follower, candidate, leader, learner, shutdown.
    pub role: &'static str,
    /// The same role as openraft's state, for the admin API.
    #[serde(skip)]
    pub state: ServerState,
    /// Current term.
    pub term: u64,
    /// Leader id, if known.
    pub leader_id: Option<u64>,
    /// Leader's client address, if known.
    pub leader_client_addr: Option<String>,
    /// Last log index.
    pub last_log_index: u64,
    /// Last applied index.
    pub applied_index: u64,
    /// Members.
    pub members: Vec<MemberInfo>,
    /// This node's advertised client address.
    pub client_addr: String,
    /// State machine clock.
    pub clock_ms: u64,
    /// Stored records.
    pub records: u64,
    /// Ready to serve: a leader is known and this node is not far behind its own log.
    pub ready: bool,
    /// Each condition of `ready`, met or not.
    pub readiness: Vec<Readiness>,
}

/// One condition of readiness and what the node saw, for the status page and `/status`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// What is checked.
    pub check: &'static str,
    /// Met.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

impl Readiness {
    fn new(check: &'static str, ok: bool, detail: String) -> Readiness {
        Readiness { check, ok, detail }
    }
}

pub(super) struct Inner {
    pub(super) config: Config,
    pub(super) raft: Raft<TypeConfig>,
    pub(super) sm: Arc<dyn StateView>,
    pub(super) proposer: Proposer,
    /// Settled claims answered by read index; `None` with --replay-fast-path false.
    pub(super) fast_read: Option<FastRead>,
    /// How messages reach the other nodes.
    pub(super) transport: Arc<dyn Transport>,
    /// The leader's client address as last reported by the leader itself.
    pub(super) leader_client_addr: Mutex<Option<(u64, String)>>,
    pub(super) stopping: Arc<AtomicBool>,
    /// Contact with the leader, for pre-votes (see `election`).
    pub(super) election: Arc<Election>,
    /// The Raft log, read for pre-votes and compaction (openraft owns the writes).
    pub(super) log: Arc<dyn LogView>,
    pub(super) identity: IdentityHandle,
    /// Where the node reports what it does (the metrics, in a running server).
    pub(super) observer: Arc<dyn ClusterObserver>,
    /// Its background tasks, stopped by [`Node::shutdown`].
    pub(super) tasks: Tasks,
}

/// What a node runs on besides its configuration.
pub struct Parts<L, S> {
    /// Its Raft log and state machine.
    pub stores: Stores<L, S>,
    /// How it reaches the other nodes.
    pub transport: Arc<dyn Transport>,
    /// Its wall clock, stamped on the batches it proposes as leader.
    pub wall_clock: WallClock,
    /// Seeds its random choices (the election jitter): random in a server, fixed where a
    /// run must replay exactly.
    pub seed: u64,
}

/// A running node. Cloning shares it.
#[derive(Clone)]
pub struct Node {
    pub(super) inner: Arc<Inner>,
}

impl Node {
    /// Opens the data directory, starts Raft, forms the cluster when this node is a founding
    /// member (idempotent), and starts the sweeper.
    pub async fn start(config: Config, observer: Arc<dyn ClusterObserver>) -> Result<Node, StartError> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|source| StartError::DataDir { dir: config.data_dir.display().to_string(), source })?;
        // Refuse another node's or another cluster's directory before opening it.
        let stored = crate::cluster::identity::preflight(&config)?;
        let options = idemraft_store::OpenOptions {
            cache_bytes: config.db_cache_bytes,
            ..idemraft_store::OpenOptions::default()
        };
        let (log, mut sm) = idemraft_store::open_with_options(&config.data_dir, &options)?;
        let mut log = log.with_observer(observer.clone());
        let restored = crate::cluster::restore::restore_at_start(&config, stored.as_ref(), &mut log, &mut sm).await?;
        let identity = IdentityHandle::establish(&config, restored)?;
        let channels = Channels::with_routes(config.peer_routes.clone())
            .with_identity(identity.clone())
            .with_tls(config.peer_tls.clone());
        let parts = Parts {
            stores: Stores { log, sm },
            transport: Arc::new(crate::cluster::link::Links::new(channels)),
            wall_clock: system_clock(),
            seed: crate::cluster::election::random_seed(),
        };
        Node::start_on(config, identity, parts, observer).await
    }

    /// Starts a node on the storage, transport and clock in `parts`: the durable stores,
    /// gRPC and the system clock in a server; in-memory stores, an in-process transport and a
    /// simulated clock when a test runs several nodes in one process. `identity` is the data
    /// directory's (see `identity`).
    pub async fn start_on<L: NodeLog, S: NodeStateMachine>(
        config: Config,
        identity: IdentityHandle,
        parts: Parts<L, S>,
        observer: Arc<dyn ClusterObserver>,
    ) -> Result<Node, StartError> {
        let Parts { stores: Stores { log, sm }, transport, wall_clock, seed } = parts;
        let tasks = Tasks::new();
        let raft_config = openraft::Config {
            cluster_name: "idemraft".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            max_payload_entries: 256,
            // Elections are started by `election` after a pre-vote, never by openraft's timer.
            enable_elect: false,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            replication_lag_threshold: config.snapshot_every * 2,
            max_in_snapshot_log_to_keep: 1000,
            purge_batch_size: 256,
            // Used only towards a peer of an older release, which takes snapshots in chunks
            // (`snapshot_stream` falls back to them): 1 MiB each within a generous deadline,
            // since a chunk is written to disk on arrival.
            snapshot_max_chunk_size: 1024 * 1024,
            install_snapshot_timeout: 5000,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let network = Network {
            id: config.id,
            transport: transport.clone(),
            replication_max_bytes: config.replication_max_bytes,
            snapshot_rate: config.snapshot_rate,
            observer: observer.clone(),
        };
        let log_reader: Arc<dyn LogView> = Arc::new(log.clone());
        let sm_view: Arc<dyn StateView> = Arc::new(sm.clone());
        let raft = Raft::new(config.id, Arc::new(raft_config), network, log, sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        if !config.initial_cluster.is_empty() {
            let members: BTreeMap<u64, BasicNode> =
                config.initial_cluster.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
            match raft.initialize(members).await {
                Ok(()) => tracing::info!(members = ?config.initial_cluster, "formed the cluster"),
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {
                    tracing::info!("already part of a cluster; rejoining from the data directory")
                }
                Err(e) => return Err(StartError::Raft(format!("cannot form the cluster: {e}"))),
            }
        }

        let proposer = Proposer::start(
            raft.clone(),
            ProposerConfig {
                batch_max: config.batch_max,
                entry_max_bytes: config.entry_max_bytes,
                batch_wait: config.batch_wait,
                max_inflight: config.max_inflight_batches,
                sweep_interval: config.sweep_interval,
                max_resume_stretch: config.max_resume_stretch,
                max_pending: config.max_pending_writes,
                wall_clock: wall_clock.clone(),
                compress: config.compress_commands,
            },
            observer.clone(),
            {
                let sm = sm_view.clone();
                Arc::new(move || sm.clock())
            },
            transport.clone(),
            &tasks,
        );
        let fast_read = config.replay_fast_path.then(|| {
            FastRead::start(
                raft.clone(),
                sm_view.clone(),
                wall_clock.clone(),
                config.heartbeat * 5,
                config.election_timeout.0 / 2,
                observer.clone(),
                &tasks,
            )
        });
        let stopping = Arc::new(AtomicBool::new(false));
        let election = Election::new(config.election_timeout, seed);
        tasks.spawn(crate::cluster::election::run(
            config.id,
            raft.clone(),
            log_reader.clone(),
            election.clone(),
            transport.clone(),
            config.heartbeat,
            stopping.clone(),
        ));
        let node = Node {
            inner: Arc::new(Inner {
                config,
                raft,
                sm: sm_view,
                proposer,
                fast_read,
                transport,
                leader_client_addr: Mutex::new(None),
                stopping,
                election,
                log: log_reader,
                identity,
                observer,
                tasks: tasks.clone(),
            }),
        };
        tasks.spawn(super::sweeper::run(node.clone()));
        tasks.spawn(super::compaction::run(node.clone()));
        Ok(node)
    }

    /// Background tasks still running (none once [`Node::shutdown`] returned).
    pub fn background_tasks(&self) -> usize {
        self.inner.tasks.running()
    }

    /// The configuration the node runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The data directory's identity, for the peer service.
    pub fn identity(&self) -> &IdentityHandle {
        &self.inner.identity
    }

    /// The Raft handle, for the peer service.
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.inner.raft
    }

    /// An AppendEntries or InstallSnapshot carrying `vote` arrived: contact with a live
    /// leader when the vote is a leader's (committed) and not older than this node's.
    pub fn leader_message(&self, vote: &Vote<u64>) {
        let current = self.inner.raft.metrics().borrow().vote;
        if vote.is_committed() && *vote >= current {
            self.inner.election.heard_from_leader();
        }
    }

    /// This node's answer to a candidate's pre-vote.
    pub async fn pre_vote(&self, req: &crate::wire::PreVote) -> crate::wire::PreVoteReply {
        self.inner.election.answer(&self.inner.raft, &*self.inner.log, req).await
    }

    /// Stored records by state, as of the last apply.
    pub fn record_counts(&self) -> idemraft_store::RecordCounts {
        self.inner.sm.record_counts()
    }

    /// Bytes of response bodies the state machine keeps in blob files.
    pub fn blob_bytes(&self) -> u64 {
        self.inner.sm.blob_bytes()
    }

    /// Resolves, with the reason, once Raft has stopped on a fatal error: a storage failure
    /// (disk full, an IO error) or a bug. openraft then refuses every call for good, so the
    /// server exits and lets its supervisor restart it from what is on disk, which holds
    /// everything acknowledged (an answer is sent only after its entry is fsynced).
    ///
    /// It waits on the server metrics (vote, role, leader, membership), not on the full
    /// metrics: openraft sends those after every turn of its core loop, about ten times per
    /// cycle on a leader, and each send woke this waiter on another thread (docs/benchmarks.md,
    /// "A lone cycle"). The core sets its fatal state and then ends, dropping the senders, so
    /// the end of the server metrics is when to read the reason.
    pub async fn fatal(&self) -> String {
        let mut changes = self.inner.raft.server_metrics();
        loop {
            if let Err(e) = &self.inner.raft.metrics().borrow().running_state {
                return e.to_string();
            }
            if changes.changed().await.is_err() {
                return match &self.inner.raft.metrics().borrow().running_state {
                    Err(e) => e.to_string(),
                    Ok(()) => "the raft core ended".into(),
                };
            }
        }
    }

    /// Stops Raft and the node's background tasks, and makes applied state durable.
    /// In-flight calls are finished by the servers before this runs.
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft did not stop cleanly");
        }
        self.inner.tasks.stop().await;
        if let Err(e) = self.inner.sm.flush().await {
            tracing::error!(error = %e, "final flush of the state machine failed");
        }
    }

    pub(super) fn leader(&self) -> (Option<u64>, Option<String>) {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader;
        let peer = leader.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
        (leader, peer)
    }

    pub(super) fn cached_leader_addr(&self, leader: Option<u64>) -> Option<String> {
        if leader == Some(self.inner.config.id) {
            return Some(self.inner.config.advertise_client_addr.clone());
        }
        let cache = self.inner.leader_client_addr.lock().ok()?;
        cache.as_ref().filter(|(id, _)| Some(*id) == leader).map(|(_, a)| a.clone())
    }

    /// The leader's client address when another node leads and its address is known: the
    /// edge hands it to callers so their next call goes straight to the leader.
    pub fn leader_hint(&self) -> Option<String> {
        let (leader, _) = self.leader();
        if leader == Some(self.inner.config.id) {
            return None;
        }
        self.cached_leader_addr(leader)
    }

    /// The applied index and the state digest at that index (a full scan).
    pub async fn state_digest(&self) -> Result<(u64, [u8; 32]), NodeError> {
        self.inner.sm.digest_at().await.map_err(internal)
    }

    /// This node's status.
    pub fn status(&self) -> StatusInfo {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        let role = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        let last_log_index = m.last_log_index.unwrap_or(0);
        let applied_index = m.last_applied.map(|l| l.index).unwrap_or(0);
        let (members, _) = member_list(&m);
        // A leader cut off from its majority only looks like one (the bound of `lost_quorum`).
        let quorum_bound = 2 * self.inner.config.election_timeout.1.as_millis() as u64;
        let readiness = vec![
            Readiness::new(
                "leader known",
                m.current_leader.is_some(),
                m.current_leader.map_or("no leader known".to_string(), |l| format!("leader is node {l}")),
            ),
            Readiness::new(
                "raft running",
                m.running_state.is_ok(),
                match &m.running_state {
                    Ok(()) => "running".to_string(),
                    Err(e) => format!("raft stopped: {e}"),
                },
            ),
            Readiness::new(
                "caught up",
                applied_index + 1000 >= last_log_index,
                format!("applied {applied_index} of {last_log_index} (ready within 1000 entries)"),
            ),
            Readiness::new(
                "quorum heard",
                m.millis_since_quorum_ack.is_none_or(|ms| ms <= quorum_bound),
                match m.millis_since_quorum_ack {
                    None => "not leading: the leader's quorum is its own concern".to_string(),
                    Some(ms) => format!("a majority acknowledged {ms} ms ago (bound {quorum_bound} ms)"),
                },
            ),
            Readiness::new(
                "not stopping",
                !self.inner.stopping.load(Ordering::Acquire),
                if self.inner.stopping.load(Ordering::Acquire) { "draining for shutdown" } else { "serving" }
                    .to_string(),
            ),
        ];
        let ready = readiness.iter().all(|r| r.ok);
        StatusInfo {
            id: self.inner.config.id,
            role,
            state: m.state,
            term: m.current_term,
            leader_id: m.current_leader,
            leader_client_addr: self.cached_leader_addr(m.current_leader),
            last_log_index,
            applied_index,
            members,
            client_addr: self.inner.config.advertise_client_addr.clone(),
            clock_ms: self.inner.sm.clock(),
            records: self.inner.sm.record_count() as u64,
            ready,
            readiness,
        }
    }
}

pub(super) fn member_list(m: &openraft::RaftMetrics<u64, BasicNode>) -> (Vec<MemberInfo>, u64) {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let list = membership
        .nodes()
        .map(|(id, n)| MemberInfo { id: *id, peer_addr: n.addr.clone(), voter: voters.contains(id) })
        .collect();
    (list, m.membership_config.log_id().map(|l| l.index).unwrap_or(0))
}

pub(super) fn internal(e: idemraft_store::StoreError) -> NodeError {
    NodeError::Internal(e.to_string())
}
