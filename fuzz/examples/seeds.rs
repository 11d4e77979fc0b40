//! Writes the seed corpus of the decoder targets: real values, encoded exactly as the store
//! (`codec::encode`) and the peer port (`wire::encode`) encode them, so the fuzzer starts from
//! well-formed bytes and mutates inward instead of searching for a valid prefix.
//!
//! Run from `fuzz/`: `cargo run --example seeds`. It rewrites `corpus/decode_command/seed-*`
//! and `corpus/decode_peer/seed-*`; the apply_sequence corpus is not structured bytes and
//! comes from fuzzing runs instead.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use idemraft_node::error::NodeError;
use idemraft_node::wire::{self, Forwarded, Reply, Request};
use idemraft_store::codec;
use idemraft_store::raft::{Entry, LogId, SnapshotMeta, StoredMembership};
use idemraft_store::{
    Command, CommandBatch, Grant, Op, Outcome, OutcomeBatch, Record, RecordKey, RecordState, Response, Token,
    TypeConfig,
};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{BasicNode, CommittedLeaderId, EntryPayload, Membership, Vote};

type Failure = Box<dyn std::error::Error>;

const NOW: u64 = 1_700_000_000_000;

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn id() -> Result<RecordKey, Failure> {
    Ok(RecordKey::new("tenant-a", "payments.create", "order-0000000000000001")?)
}

fn response() -> Response {
    Response {
        status: 201,
        headers: vec![("location".into(), "/v1/charges/ch_1".into())],
        body: b"{\"id\":1}".to_vec(),
    }
}

fn batch() -> Result<CommandBatch, Failure> {
    let claim = Op::Claim {
        id: id()?,
        fingerprint: Some([7; 32]),
        owner: "worker-a".into(),
        lease_ms: 30_000,
        ttl_ms: 86_400_000,
        allow_takeover: true,
    };
    let complete = Op::Complete { id: id()?, token: Token::new(5, 0), response: response() };
    Ok(CommandBatch(vec![Command { now_ms: NOW, op: claim }, Command { now_ms: NOW + 20, op: complete }]))
}

fn membership() -> StoredMembership {
    let voters = BTreeSet::from([1, 2, 3]);
    let nodes: BTreeMap<u64, BasicNode> = (1..=3).map(|n| (n, BasicNode::new(format!("127.0.0.1:720{n}")))).collect();
    StoredMembership::new(Some(log_id(1, 1)), Membership::new(vec![voters], nodes))
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(format!("seed-{name}")), bytes)?;
    println!("{}/seed-{name}: {} bytes", dir.display(), bytes.len());
    Ok(())
}

fn main() -> Result<(), Failure> {
    let batch = batch()?;
    let record = Record {
        fingerprint: Some([7; 32]),
        state: RecordState::Completed,
        token: Token::new(5, 0),
        owner: "worker-a".into(),
        attempt: 1,
        taken_over: false,
        lease_expires_ms: 0,
        created_ms: NOW,
        updated_ms: NOW + 20,
        completed_ms: Some(NOW + 20),
        expires_ms: NOW + 86_400_000,
        retention_ms: 86_400_000,
        recovery_point: String::new(),
        checkpoint: Vec::new(),
        response: Some(response()),
    };
    let grant = Grant {
        token: Token::new(5, 0),
        attempt: 1,
        takeover: false,
        lease_expires_ms: NOW + 30_000,
        expires_ms: NOW + 86_400_000,
        recovery_point: String::new(),
        checkpoint: Vec::new(),
    };
    let outcomes = OutcomeBatch(vec![Outcome::Acquired(grant), Outcome::Completed { token: Token::new(5, 0) }]);
    let entry = Entry { log_id: log_id(2, 5), payload: EntryPayload::Normal(batch.clone()) };
    let members_entry =
        Entry { log_id: log_id(1, 1), payload: EntryPayload::Membership(membership().membership().clone()) };
    let meta =
        SnapshotMeta { last_log_id: Some(log_id(2, 5)), last_membership: membership(), snapshot_id: "2-5-1".into() };

    let store = Path::new("corpus/decode_command");
    write(store, "command-batch", &codec::encode(&batch)?)?;
    write(store, "outcome-batch", &codec::encode(&outcomes)?)?;
    write(store, "record", &codec::encode(&record)?)?;
    write(store, "log-entry", &codec::encode(&entry)?)?;
    write(store, "membership-entry", &codec::encode(&members_entry)?)?;
    write(store, "snapshot-meta", &codec::encode(&meta)?)?;

    let peer = Path::new("corpus/decode_peer");
    let forward = Request::Write(batch.0[0].op.clone());
    write(peer, "forwarded-claim", &wire::encode(&forward)?)?;
    let answer =
        Forwarded { result: Ok(Reply::Outcome(Outcome::Mismatch)), leader_client_addr: "127.0.0.1:7101".into() };
    write(peer, "forwarded-reply", &wire::encode(&answer)?)?;
    let refused: Forwarded =
        Forwarded { result: Err(NodeError::Internal("no leader".into())), leader_client_addr: String::new() };
    write(peer, "forwarded-error", &wire::encode(&refused)?)?;
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(2, 1),
        prev_log_id: Some(log_id(2, 4)),
        entries: vec![entry],
        leader_commit: Some(log_id(2, 4)),
    };
    write(peer, "append-entries", &wire::encode(&append)?)?;
    let vote = VoteRequest { vote: Vote::new(3, 2), last_log_id: Some(log_id(2, 5)) };
    write(peer, "vote", &wire::encode(&vote)?)?;
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(2, 1),
        meta,
        offset: 0,
        data: vec![1, 2, 3],
        done: true,
    };
    write(peer, "install-snapshot", &wire::encode(&snapshot)?)?;
    Ok(())
}
