//! One Idemraft node: the Raft instance over the sled stores, the proposer, the sweeper, and
//! the routing of every client call. A call is executed where the leader is: here when this
//! node leads, otherwise forwarded over the peer port, so a caller may talk to any node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_proto::v1::raft_client::RaftClient;
use idemraft_proto::v1::RaftMessage;
use idemraft_store::planted::{self, Bug};
use idemraft_store::{LogStore, Op, Outcome, RecordState, StateMachineStore, TypeConfig};
use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ChangeMembers, Raft, ServerState, SnapshotPolicy, Vote};
use tokio::time::Instant;

use crate::cluster::election::Election;
use crate::cluster::fast_read::FastRead;
use crate::cluster::identity::IdentityHandle;
use crate::cluster::network::{Channels, Network};
use crate::cluster::observer::ClusterObserver;
use crate::cluster::proposer::{Proposer, ProposerConfig};
use crate::config::Config;
use crate::error::NodeError;
use crate::wire::{self, Forwarded, MemberInfo, Reply, Request};

/// Time kept back from a caller's deadline so an answer (even "deadline exceeded") gets back
/// to the caller before it gives up.
const REPLY_MARGIN: Duration = Duration::from_millis(20);

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
}

struct Inner {
    config: Config,
    raft: Raft<TypeConfig>,
    sm: StateMachineStore,
    proposer: Proposer,
    /// Settled claims answered by read index; `None` with --replay-fast-path false.
    fast_read: Option<FastRead>,
    channels: Channels,
    /// The leader's client address as last reported by the leader itself.
    leader_client_addr: Mutex<Option<(u64, String)>>,
    stopping: Arc<AtomicBool>,
    /// Contact with the leader, for pre-votes (see `election`).
    election: Arc<Election>,
    /// The Raft log, read for pre-votes (openraft owns the writes).
    log: LogStore,
    identity: IdentityHandle,
    /// Where the node reports what it does (the metrics, in a running server).
    observer: Arc<dyn ClusterObserver>,
}

/// A running node. Cloning shares it.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl Node {
    /// Opens the data directory, starts Raft, forms the cluster when this node is a founding
    /// member (idempotent), and starts the sweeper.
    pub async fn start(config: Config, observer: Arc<dyn ClusterObserver>) -> Result<Node, StartError> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|source| StartError::DataDir { dir: config.data_dir.display().to_string(), source })?;
        // Refuse another node's or another cluster's directory before opening it.
        let stored = crate::cluster::identity::preflight(&config)?;
        let (log, mut sm) = idemraft_store::open(&config.data_dir)?;
        let mut log = log.with_observer(observer.clone());
        let restored = crate::cluster::restore::restore_at_start(&config, stored.as_ref(), &mut log, &mut sm).await?;
        let identity = IdentityHandle::establish(&config, restored)?;
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
            // Chunks of 1 MiB within a generous deadline: a snapshot chunk is written to disk
            // on arrival, which the 200 ms default does not always allow.
            snapshot_max_chunk_size: 1024 * 1024,
            install_snapshot_timeout: 5000,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let channels = Channels::with_routes(config.peer_routes.clone())
            .with_identity(identity.clone())
            .with_tls(config.peer_tls.clone());
        let network =
            Network { id: config.id, channels: channels.clone(), replication_max_bytes: config.replication_max_bytes };
        let log_reader = log.clone();
        let raft = Raft::new(config.id, Arc::new(raft_config), network, log, sm.clone())
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
            },
            observer.clone(),
            {
                let sm = sm.clone();
                Arc::new(move || sm.clock())
            },
        );
        let fast_read = config.replay_fast_path.then(|| {
            FastRead::start(
                raft.clone(),
                sm.clone(),
                config.heartbeat * 5,
                config.election_timeout.0 / 2,
                observer.clone(),
            )
        });
        let stopping = Arc::new(AtomicBool::new(false));
        let election = Election::new(config.election_timeout);
        tokio::spawn(crate::cluster::election::run(
            config.id,
            raft.clone(),
            log_reader.clone(),
            election.clone(),
            channels.clone(),
            config.heartbeat,
            stopping.clone(),
        ));
        let node = Node {
            inner: Arc::new(Inner {
                config,
                raft,
                sm,
                proposer,
                fast_read,
                channels,
                leader_client_addr: Mutex::new(None),
                stopping,
                election,
                log: log_reader,
                identity,
                observer,
            }),
        };
        tokio::spawn(sweeper(node.clone()));
        Ok(node)
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
        self.inner.election.answer(&self.inner.raft, &self.inner.log, req).await
    }

    /// Stored records by state, as of the last apply.
    pub fn record_counts(&self) -> idemraft_store::RecordCounts {
        self.inner.sm.record_counts()
    }

    /// Resolves, with the reason, once Raft has stopped on a fatal error: a storage failure
    /// (disk full, an IO error) or a bug. openraft then refuses every call for good, so the
    /// server exits and lets its supervisor restart it from what is on disk, which holds
    /// everything acknowledged (an answer is sent only after its entry is fsynced).
    pub async fn fatal(&self) -> String {
        let mut metrics = self.inner.raft.metrics();
        loop {
            if let Err(e) = &metrics.borrow_and_update().running_state {
                return e.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the raft core ended".into();
            }
        }
    }

    /// Stops Raft and makes applied state durable. In-flight calls are finished by the
    /// servers before this runs.
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::Release);
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "raft did not stop cleanly");
        }
        if let Err(e) = self.inner.sm.flush().await {
            tracing::error!(error = %e, "final flush of the state machine failed");
        }
    }

    fn leader(&self) -> (Option<u64>, Option<String>) {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        let leader = m.current_leader;
        let peer = leader.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.addr.clone()));
        (leader, peer)
    }

    fn cached_leader_addr(&self, leader: Option<u64>) -> Option<String> {
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

    /// Executes a call wherever the leader is, within `deadline`.
    pub async fn call(&self, req: Request, deadline: Instant) -> Result<Reply, NodeError> {
        if self.inner.stopping.load(Ordering::Acquire) {
            return Err(NodeError::ShuttingDown);
        }
        if planted::active(Bug::StaleLocalReads)
            && matches!(req, Request::Get(_) | Request::List(_) | Request::Wait { .. })
        {
            return self.local(req, deadline).await;
        }
        // Bounded: one look for a leader, one retry after leadership moved under the call.
        for _ in 0..3 {
            let (leader, peer_addr) = self.leader();
            match leader {
                Some(l) if l == self.inner.config.id => match self.local(req.clone(), deadline).await {
                    Err(NodeError::NoLeader { .. }) if Instant::now() + REPLY_MARGIN < deadline => continue,
                    other => return other,
                },
                Some(l) => {
                    let Some(addr) = peer_addr else {
                        return Err(self.no_leader(format!("leader {l} is not in this node's membership")));
                    };
                    return self.forward(l, &addr, req, deadline).await;
                }
                None => {
                    let wait = deadline.saturating_duration_since(Instant::now()).saturating_sub(REPLY_MARGIN);
                    let wait = wait.min(self.inner.config.election_timeout.1 * 3);
                    let found = self
                        .inner
                        .raft
                        .wait(Some(wait))
                        .metrics(|m| m.current_leader.is_some(), "a leader to be known")
                        .await;
                    if found.is_err() {
                        return Err(self.no_leader("no leader is elected (is a majority of nodes up?)".into()));
                    }
                }
            }
        }
        Err(self.no_leader("leadership kept moving while the call was routed".into()))
    }

    fn no_leader(&self, why: String) -> NodeError {
        let (leader_id, _) = self.leader();
        NodeError::NoLeader { why, leader_id, leader_addr: self.cached_leader_addr(leader_id) }
    }

    async fn forward(&self, leader: u64, addr: &str, req: Request, deadline: Instant) -> Result<Reply, NodeError> {
        let payload = wire::encode(&req).map_err(NodeError::Internal)?;
        let mut client: RaftClient<_> = self.inner.channels.client(leader, addr).map_err(NodeError::Internal)?;
        let ttl = deadline.saturating_duration_since(Instant::now()).saturating_sub(REPLY_MARGIN);
        if ttl.is_zero() {
            return Err(NodeError::Deadline("before the call could be forwarded to the leader".into()));
        }
        let mut request = tonic::Request::new(RaftMessage { target: leader, payload });
        request.set_timeout(ttl);
        self.inner.identity.stamp(request.metadata_mut());
        let reply = match tokio::time::timeout(ttl, client.forward(request)).await {
            Err(_) => return Err(NodeError::Deadline(format!("while forwarded to leader {leader}"))),
            Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => {
                return Err(NodeError::Deadline(format!("while forwarded to leader {leader}")))
            }
            Ok(Err(status)) => {
                return Err(NodeError::NoLeader {
                    why: format!("leader {leader} at {addr} did not take the call: {}", status.message()),
                    leader_id: Some(leader),
                    leader_addr: self.cached_leader_addr(Some(leader)),
                })
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        let forwarded: Forwarded = wire::decode("forwarded reply", &reply.payload).map_err(NodeError::Internal)?;
        if let Ok(mut cache) = self.inner.leader_client_addr.lock() {
            *cache = Some((leader, forwarded.leader_client_addr.clone()));
        }
        match forwarded.result {
            Err(NodeError::NoLeader { why, leader_id, .. }) => {
                Err(NodeError::NoLeader { why, leader_id, leader_addr: self.cached_leader_addr(leader_id) })
            }
            other => other,
        }
    }

    /// Serves a call that a follower forwarded: here only, never forwarded again (so a call
    /// cannot loop between two nodes that disagree about the leader).
    pub async fn serve_forwarded(&self, req: Request, deadline: Instant) -> Forwarded {
        let result = if self.leader().0 == Some(self.inner.config.id) {
            self.local(req, deadline).await
        } else {
            Err(self.no_leader("the node a call was forwarded to is no longer the leader".into()))
        };
        Forwarded { result, leader_client_addr: self.inner.config.advertise_client_addr.clone() }
    }

    async fn local(&self, req: Request, deadline: Instant) -> Result<Reply, NodeError> {
        let until = deadline.checked_sub(REPLY_MARGIN).unwrap_or(deadline);
        // A leader cut off from its majority says so at once instead of holding the call
        // until its deadline: the caller can try elsewhere (a new leader may exist already).
        if let Some(e) = self.lost_quorum() {
            return Err(e);
        }
        match req {
            Request::Write(op) => {
                if let Some(o) = self.fast_answer(&op, until).await {
                    return Ok(Reply::Outcome(o));
                }
                match tokio::time::timeout_at(until, self.inner.proposer.submit(op)).await {
                    Err(_) => Err(self.write_deadline()),
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(Outcome::Invalid(e))) => Err(NodeError::Invalid(e)),
                    Ok(Ok(o)) => Ok(Reply::Outcome(o)),
                }
            }
            Request::Get(id) => {
                self.linearize(until).await?;
                Ok(Reply::Record(self.inner.sm.get(&id).await.map_err(internal)?))
            }
            Request::List(q) => {
                self.linearize(until).await?;
                Ok(Reply::Page(self.inner.sm.list(&q).await.map_err(internal)?))
            }
            Request::Wait { id, timeout_ms } => {
                let end = until.min(Instant::now() + Duration::from_millis(timeout_ms));
                self.linearize(until).await?;
                // After the read index, local reads only see newer states: a record seen
                // settled here has settled in the committed log.
                let mut changes = self.inner.raft.metrics();
                loop {
                    let record = self.inner.sm.get(&id).await.map_err(internal)?;
                    let pending = record.as_ref().is_some_and(|r| r.record.state == RecordState::InProgress);
                    if !pending || Instant::now() >= end {
                        return Ok(Reply::Waited { record, timed_out: pending });
                    }
                    let tick = (Instant::now() + Duration::from_millis(50)).min(end);
                    tokio::select! {
                        _ = changes.changed() => {}
                        _ = tokio::time::sleep_until(tick) => {}
                    }
                }
            }
            Request::Quota(tenant) => {
                self.linearize(until).await?;
                Ok(Reply::Quota(self.inner.sm.quota_report(tenant.as_deref()).await))
            }
            Request::Members => Ok(self.members()),
            Request::AddLearner { id, peer_addr, wait } => {
                let r =
                    tokio::time::timeout_at(until, self.inner.raft.add_learner(id, BasicNode::new(peer_addr), wait))
                        .await
                        .map_err(|_| NodeError::Deadline("while adding the learner".into()))?;
                r.map_err(|e| self.membership_error(e))?;
                Ok(self.members())
            }
            Request::Promote(ids) => {
                let change = ChangeMembers::AddVoterIds(ids.into_iter().collect());
                self.change_membership(change, until).await
            }
            Request::Remove(ids) => {
                let (voters, learners) = {
                    let m = self.inner.raft.metrics();
                    let m = m.borrow();
                    let voter_ids: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
                    let (v, l): (BTreeSet<u64>, BTreeSet<u64>) = ids.into_iter().partition(|i| voter_ids.contains(i));
                    (v, l)
                };
                if voters.contains(&self.inner.config.id) {
                    tracing::info!("removing the leader itself; a new leader will be elected");
                }
                let mut reply = self.members();
                if !voters.is_empty() {
                    reply = self.change_membership(ChangeMembers::RemoveVoters(voters), until).await?;
                }
                if !learners.is_empty() {
                    reply = self.change_membership(ChangeMembers::RemoveNodes(learners), until).await?;
                }
                Ok(reply)
            }
        }
    }

    /// A settled claim's answer by read index, when the fast path is on and may answer.
    async fn fast_answer(&self, op: &Op, until: Instant) -> Option<Outcome> {
        self.inner.fast_read.as_ref()?.answer(op, until).await
    }

    async fn change_membership(
        &self,
        change: ChangeMembers<u64, BasicNode>,
        until: Instant,
    ) -> Result<Reply, NodeError> {
        let r = tokio::time::timeout_at(until, self.inner.raft.change_membership(change, false))
            .await
            .map_err(|_| NodeError::Deadline("while changing the membership".into()))?;
        r.map_err(|e| self.membership_error(e))?;
        Ok(self.members())
    }

    fn membership_error(&self, e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> NodeError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => NodeError::NoLeader {
                why: "leadership moved during the membership change".into(),
                leader_id: f.leader_id,
                leader_addr: self.cached_leader_addr(f.leader_id),
            },
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => NodeError::Precondition(c.to_string()),
            RaftError::Fatal(f) => NodeError::Internal(f.to_string()),
        }
    }

    fn members(&self) -> Reply {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        let (list, index) = member_list(&m);
        Reply::Members(list, index)
    }

    /// A write whose deadline passed: without a recent quorum it is the cluster that is
    /// unavailable; with one, the write was merely slow.
    fn write_deadline(&self) -> NodeError {
        let m = self.inner.raft.metrics();
        let quorum_ms = m.borrow().millis_since_quorum_ack;
        let bound = self.inner.config.election_timeout.1.as_millis() as u64;
        match quorum_ms {
            Some(ms) if ms <= bound => NodeError::Deadline("while the write was being committed".into()),
            Some(ms) => NodeError::NoQuorum(format!("the leader has not heard from a majority for {ms} ms")),
            None => NodeError::NoQuorum("the leader has not heard from a majority in this term".into()),
        }
    }

    fn lost_quorum(&self) -> Option<NodeError> {
        let m = self.inner.raft.metrics();
        let quorum_ms = m.borrow().millis_since_quorum_ack?;
        let bound = 2 * self.inner.config.election_timeout.1.as_millis() as u64;
        (quorum_ms > bound)
            .then(|| NodeError::NoQuorum(format!("this leader has not heard from a majority for {quorum_ms} ms")))
    }

    async fn linearize(&self, until: Instant) -> Result<(), NodeError> {
        if planted::active(Bug::StaleLocalReads) {
            return Ok(());
        }
        match tokio::time::timeout_at(until, self.inner.raft.ensure_linearizable()).await {
            Err(_) => Err(NodeError::NoQuorum("a majority did not confirm this leader before the deadline".into())),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => Err(NodeError::NoLeader {
                why: "this node is no longer the leader".into(),
                leader_id: f.leader_id,
                leader_addr: self.cached_leader_addr(f.leader_id),
            }),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)))) => {
                Err(NodeError::NoQuorum(q.to_string()))
            }
            Ok(Err(RaftError::Fatal(f))) => Err(NodeError::Internal(f.to_string())),
        }
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
        let ready = m.current_leader.is_some()
            && m.running_state.is_ok()
            && applied_index + 1000 >= last_log_index
            && m.millis_since_quorum_ack.is_none_or(|ms| ms <= quorum_bound)
            && !self.inner.stopping.load(Ordering::Acquire);
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
        }
    }
}

fn member_list(m: &openraft::RaftMetrics<u64, BasicNode>) -> (Vec<MemberInfo>, u64) {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let list = membership
        .nodes()
        .map(|(id, n)| MemberInfo { id: *id, peer_addr: n.addr.clone(), voter: voters.contains(id) })
        .collect();
    (list, m.membership_config.log_id().map(|l| l.index).unwrap_or(0))
}

fn internal(e: idemraft_store::StoreError) -> NodeError {
    NodeError::Internal(e.to_string())
}

/// While this node leads, proposes a bounded Sweep every interval (which also keeps the log's
/// clock close to real time), and sweeps again at once while a sweep comes back full.
async fn sweeper(node: Node) {
    let interval = node.inner.config.sweep_interval;
    let limit = node.inner.config.sweep_limit;
    loop {
        tokio::time::sleep(interval).await;
        if node.inner.stopping.load(Ordering::Acquire) {
            return;
        }
        if node.leader().0 != Some(node.inner.config.id) {
            continue;
        }
        // At most 10 full sweeps back to back, so a backlog never crowds out client writes.
        for _ in 0..10 {
            let swept = tokio::time::timeout(interval * 5, node.inner.proposer.submit(Op::Sweep { limit })).await;
            if let Ok(Ok(Outcome::Swept { deleted })) = &swept {
                node.inner.observer.swept(*deleted);
            }
            match swept {
                Ok(Ok(Outcome::Swept { deleted })) if deleted >= limit => continue,
                Ok(Ok(Outcome::Swept { deleted })) => {
                    if deleted > 0 {
                        tracing::debug!(deleted, "swept expired records");
                    }
                    break;
                }
                Ok(Ok(other)) => {
                    tracing::warn!(outcome = ?other, "unexpected sweep outcome");
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "sweep not proposed");
                    break;
                }
                Err(_) => break,
            }
        }
    }
}
