//! The proposer over a real one-node openraft instance on the in-memory stores, on paused
//! time: concurrent commands share log entries, an entry is cut at its command count and its
//! byte budget, the first entry of a term starts with Resume (so the first grant takes slot
//! 1), a clock gap brings Resume back within the term, and a full queue refuses at once. No
//! process, no socket, no disk; the runtime's clock only moves when every task is idle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_node::cluster::observer::ClusterObserver;
use idemraft_node::cluster::proposer::{now_ms, system_clock, Proposer, ProposerConfig};
use idemraft_node::cluster::tasks::Tasks;
use idemraft_node::cluster::transport::{PeerCall, Transport};
use idemraft_node::error::NodeError;
use idemraft_proto::v1::RaftMessage;
use idemraft_store::{LogObserver, MemLogStore, MemStateMachine, Op, Outcome, RecordKey, Response, Token, TypeConfig};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, Raft, ServerState};

/// A one-node cluster has no peers: any RPC would be a bug, and fails as unreachable.
struct NoPeers;

fn unreachable<E: std::error::Error>() -> RPCError<u64, BasicNode, RaftError<u64, E>> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other("a one-node cluster has no peers")))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;
    async fn new_client(&mut self, _target: u64, _node: &BasicNode) -> NoPeers {
        NoPeers
    }
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(unreachable())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(unreachable())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>> {
        Err(unreachable())
    }
}

/// Records the size of every proposed entry.
#[derive(Default)]
struct Batches(Mutex<Vec<usize>>, Mutex<Vec<(usize, usize)>>);

impl LogObserver for Batches {}

impl ClusterObserver for Batches {
    fn batch_proposed(&self, commands: usize) {
        self.0.lock().unwrap().push(commands);
    }
    fn swept(&self, _deleted: u32) {}
    fn replay_confirmed(&self, _via: &'static str) {}
    fn append_timed_out(&self) {}
    fn append_cut(&self) {}
    fn command_compressed(&self, raw: usize, stored: usize) {
        self.1.lock().unwrap().push((raw, stored));
    }
}

impl Batches {
    fn sizes(&self) -> Vec<usize> {
        self.0.lock().unwrap().clone()
    }

    fn compressed(&self) -> Vec<(usize, usize)> {
        self.1.lock().unwrap().clone()
    }
}

/// What the proposer asks about other members: whether they decode compressed commands.
#[derive(Default)]
struct Peers {
    decode: AtomicBool,
}

#[tonic::async_trait]
impl Transport for Peers {
    async fn call(
        &self,
        _target: u64,
        _addr: &str,
        _kind: PeerCall,
        _msg: RaftMessage,
        _ttl: Duration,
    ) -> Result<RaftMessage, tonic::Status> {
        Err(tonic::Status::unavailable("the proposer sends nothing itself"))
    }

    fn decodes_compressed(&self, _target: u64, _addr: &str) -> bool {
        self.decode.load(Ordering::Relaxed)
    }
}

fn config() -> ProposerConfig {
    ProposerConfig {
        batch_max: 256,
        entry_max_bytes: 1 << 20,
        batch_wait: Duration::ZERO,
        max_inflight: 1,
        sweep_interval: Duration::from_secs(1),
        max_resume_stretch: Duration::from_secs(60),
        max_pending: 4096,
        wall_clock: system_clock(),
        compress: true,
    }
}

struct Lone {
    proposer: Proposer,
    batches: Arc<Batches>,
    /// What the proposer reads as the log's clock; a test moves it to fake an outage.
    clock: Arc<AtomicU64>,
    raft: Raft<TypeConfig>,
    peers: Arc<Peers>,
}

async fn lone(config: ProposerConfig) -> Lone {
    let raft_config = openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..Default::default()
    }
    .validate()
    .unwrap();
    let raft = Raft::new(1, Arc::new(raft_config), NoPeers, MemLogStore::new(), MemStateMachine::new()).await.unwrap();
    raft.initialize(BTreeMap::from([(1u64, BasicNode::new("in-process"))])).await.unwrap();
    raft.wait(Some(Duration::from_secs(10))).state(ServerState::Leader, "a one-node leader").await.unwrap();
    let batches = Arc::new(Batches::default());
    let clock = Arc::new(AtomicU64::new(now_ms()));
    let read = clock.clone();
    let peers = Arc::new(Peers::default());
    let proposer = Proposer::start(
        raft.clone(),
        config,
        batches.clone(),
        Arc::new(move || read.load(Ordering::Relaxed)),
        peers.clone(),
        &Tasks::new(),
    );
    Lone { proposer, batches, clock, raft, peers }
}

fn claim(n: usize, owner: &str) -> Op {
    Op::Claim {
        id: RecordKey::new("acme", "payments.create", format!("order-{n:016}")).unwrap(),
        fingerprint: None,
        owner: owner.to_string(),
        lease_ms: 30_000,
        ttl_ms: 3_600_000,
        allow_takeover: false,
    }
}

fn token(o: &Outcome) -> Token {
    match o {
        Outcome::Acquired(g) => g.token,
        other => panic!("expected ACQUIRED, got {other:?}"),
    }
}

/// Submits every op before the proposer task can run (one poll of all of them on the test's
/// single thread), so they queue together, then waits for all outcomes.
async fn submit_all(p: &Proposer, ops: Vec<Op>) -> Vec<Result<Outcome, NodeError>> {
    futures::future::join_all(ops.into_iter().map(|op| p.submit(op))).await
}

#[tokio::test(start_paused = true)]
async fn the_first_entry_of_a_term_starts_with_resume_so_the_first_grant_takes_slot_one() {
    let n = lone(config()).await;
    let first = n.proposer.submit(claim(0, "w")).await.unwrap();
    assert_eq!(token(&first).slot(), 1, "slot 0 of the term's first entry is the leader's Resume");
    let second = n.proposer.submit(claim(1, "w")).await.unwrap();
    assert_eq!(token(&second).slot(), 0, "later entries of the term carry no Resume");
    assert!(token(&second) > token(&first));
    assert_eq!(n.batches.sizes(), vec![2, 1]);
    n.raft.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn concurrent_commands_share_entries_and_get_distinct_ordered_tokens() {
    let n = lone(config()).await;
    n.proposer.submit(claim(9999, "warm-up")).await.unwrap();
    let outcomes = submit_all(&n.proposer, (0..200).map(|i| claim(i, "w")).collect()).await;
    let tokens: Vec<Token> = outcomes.iter().map(|o| token(o.as_ref().unwrap())).collect();
    let sizes = n.batches.sizes();
    assert_eq!(sizes.iter().skip(1).sum::<usize>(), 200, "every command proposed once: {sizes:?}");
    assert!(sizes.len() - 1 <= 2, "200 queued commands take one entry (two if the first went alone): {sizes:?}");
    let mut sorted = tokens.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 200, "distinct tokens");
    assert_eq!(sorted, tokens, "tokens follow submission order");
    n.raft.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_entry_is_cut_at_its_command_count_and_at_its_byte_budget() {
    let by_count = lone(ProposerConfig { batch_max: 16, ..config() }).await;
    by_count.proposer.submit(claim(9999, "warm-up")).await.unwrap();
    let outcomes = submit_all(&by_count.proposer, (0..100).map(|i| claim(i, "w")).collect()).await;
    assert!(outcomes.iter().all(|o| o.is_ok()));
    let sizes = by_count.batches.sizes();
    assert!(sizes.iter().all(|&s| s <= 16), "{sizes:?}");
    assert_eq!(sizes.iter().skip(1).sum::<usize>(), 100);
    by_count.raft.shutdown().await.unwrap();

    // A claim with a 120-byte owner encodes to about 230 bytes: three fit in 800, four do not.
    let owner = "o".repeat(120);
    let by_bytes = lone(ProposerConfig { entry_max_bytes: 800, ..config() }).await;
    by_bytes.proposer.submit(claim(9999, "warm-up")).await.unwrap();
    let outcomes = submit_all(&by_bytes.proposer, (0..30).map(|i| claim(i, &owner)).collect()).await;
    assert!(outcomes.iter().all(|o| o.is_ok()));
    let sizes = by_bytes.batches.sizes();
    assert!(sizes.iter().skip(1).all(|&s| (1..=3).contains(&s)), "{sizes:?}");
    assert_eq!(sizes.iter().skip(1).sum::<usize>(), 30);
    assert!(sizes.len() > 10, "30 commands in entries of at most 3: {sizes:?}");
    by_bytes.raft.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_log_clock_far_behind_brings_resume_back_within_the_same_term() {
    let n = lone(config()).await;
    n.proposer.submit(claim(0, "w")).await.unwrap();
    assert_eq!(token(&n.proposer.submit(claim(1, "w")).await.unwrap()).slot(), 0);
    // The log's clock stopped 10 s ago (no entry committed: a quorum was lost and regained
    // under the same leader): more than two sweep intervals, so Resume comes first again.
    n.clock.store(now_ms().saturating_sub(10_000), Ordering::Relaxed);
    assert_eq!(token(&n.proposer.submit(claim(2, "w")).await.unwrap()).slot(), 1);
    n.raft.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once_and_what_was_queued_still_commits() {
    let n = lone(ProposerConfig { max_pending: 8, ..config() }).await;
    let outcomes = submit_all(&n.proposer, (0..20).map(|i| claim(i, "w")).collect()).await;
    let refused = outcomes.iter().filter(|o| matches!(o, Err(NodeError::Overloaded(_)))).count();
    let acquired = outcomes.iter().filter(|o| matches!(o, Ok(Outcome::Acquired(_)))).count();
    assert_eq!(acquired, 8, "the queue holds 8: {outcomes:?}");
    assert_eq!(refused, 12, "the rest are refused, never proposed");
    let Err(NodeError::Overloaded(msg)) = &outcomes[19] else { panic!("{:?}", outcomes[19]) };
    assert!(msg.contains("--max-pending-writes"), "the refusal names the option: {msg}");
    n.raft.shutdown().await.unwrap();
}

/// A JSON-like body of `len` bytes, which compresses as API responses do.
fn json_body(len: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut i = 0u64;
    while s.len() < len {
        s.push_str(&format!(
            "{{\"id\":\"ch_{:016x}\",\"amount\":{},\"currency\":\"eur\"}},",
            i.wrapping_mul(0x9E37_79B9),
            i % 997
        ));
        i += 1;
    }
    s.truncate(len);
    s.into_bytes()
}

#[tokio::test(start_paused = true)]
async fn large_commands_are_compressed_only_while_every_other_member_decodes_them() {
    let n = lone(config()).await;
    // A second member, a learner that cannot be reached: it decodes compressed commands only
    // once the transport says so.
    n.raft.add_learner(2, BasicNode::new("peer-2"), false).await.unwrap();
    let body = json_body(64 * 1024);
    let complete = |k: usize, token: Token| Op::Complete {
        id: RecordKey::new("acme", "payments.create", format!("order-{k:016}")).unwrap(),
        token,
        response: Response { status: 200, headers: vec![], body: body.clone() },
    };

    let g = token(&n.proposer.submit(claim(0, "w")).await.unwrap());
    assert_eq!(n.proposer.submit(complete(0, g)).await.unwrap(), Outcome::Completed { token: g });
    assert!(n.batches.compressed().is_empty(), "the learner is not known to decode them");

    n.peers.decode.store(true, Ordering::Relaxed);
    // The next batch finds every member able to decode; the command after it is compressed.
    let g = token(&n.proposer.submit(claim(1, "w")).await.unwrap());
    assert_eq!(n.proposer.submit(complete(1, g)).await.unwrap(), Outcome::Completed { token: g });
    let small = token(&n.proposer.submit(claim(2, "w")).await.unwrap());
    let tiny = Op::Complete {
        id: RecordKey::new("acme", "payments.create", format!("order-{:016}", 2)).unwrap(),
        token: small,
        response: Response { status: 200, headers: vec![], body: b"{}".to_vec() },
    };
    n.proposer.submit(tiny).await.unwrap();
    let compressed = n.batches.compressed();
    assert_eq!(compressed.len(), 1, "only the large body: {compressed:?}");
    let (raw, stored) = compressed[0];
    assert!(raw > 64 * 1024 && stored < raw / 2, "{raw} -> {stored} bytes");
    // What was stored is the body itself: a retried claim replays it byte for byte.
    match n.proposer.submit(claim(1, "w")).await.unwrap() {
        Outcome::Replay { response, .. } => assert!(response.body == body, "the replayed body differs"),
        other => panic!("expected a replay, got {other:?}"),
    }

    n.peers.decode.store(false, Ordering::Relaxed);
    n.proposer.submit(claim(3, "w")).await.unwrap();
    let g = token(&n.proposer.submit(claim(4, "w")).await.unwrap());
    n.proposer.submit(complete(4, g)).await.unwrap();
    assert_eq!(n.batches.compressed().len(), 1, "off again once a member is not known to decode them");
    n.raft.shutdown().await.unwrap();
}
