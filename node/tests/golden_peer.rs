//! Every message that crosses the peer port, byte for byte against `tests/golden/peer.txt`:
//! openraft's RPCs and replies as the peer service seals them, forwarded client calls of
//! every kind and their answers (errors included), the pre-vote, and a streamed snapshot's header and answer. During a rolling
//! upgrade nodes of two releases talk to each other, so a changed encoding must fail here,
//! not as a misread message in production. The stored bytes must also decode to the same
//! values. A deliberate change rewrites the fixture with `IDEMRAFT_BLESS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use idemraft_node::error::NodeError;
use idemraft_node::wire::{
    self, Forwarded, MemberInfo, PreVote, PreVoteReply, Reply, Request, SnapshotHeader, SnapshotReply,
};
use idemraft_store::golden::{self, samples, Golden};
use idemraft_store::raft::{Entry, LogId, SnapshotMeta, StoredMembership};
use idemraft_store::{
    Command, CommandBatch, ListPage, ListQuery, QuotaReport, QuotaUsage, RecordState, RecordView, TypeConfig,
    ValidationError,
};
use openraft::error::{Fatal, InstallSnapshotError, RaftError, SnapshotMismatch};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, SnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, CommittedLeaderId, EntryPayload, Membership, SnapshotSegmentId, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/peer.txt")
}

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(3, 1), index)
}

fn membership() -> Membership<u64, BasicNode> {
    let nodes: BTreeMap<u64, BasicNode> = (1..=3).map(|i| (i, BasicNode::new(format!("127.0.0.1:720{i}")))).collect();
    Membership::new(vec![nodes.keys().copied().collect::<BTreeSet<u64>>()], nodes)
}

fn snapshot_meta() -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(40)),
        last_membership: StoredMembership::new(Some(log_id(1)), membership()),
        snapshot_id: "3-40-1700000000000000000-0".to_string(),
    }
}

fn view(name: &str) -> RecordView {
    let record = samples::records().into_iter().find(|(n, _)| *n == name).map(|(_, r)| r).unwrap();
    RecordView { id: samples::key(), record }
}

/// Decodes stored bytes and compares them with the value the case was built from.
type Check = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// Encodes and keeps a way to decode the stored bytes back and compare.
struct Case {
    name: String,
    bytes: Vec<u8>,
    check: Check,
}

fn case<T: Serialize + DeserializeOwned + Debug + 'static>(name: impl Into<String>, value: T) -> Case {
    let name = name.into();
    let bytes = wire::encode(&value).unwrap();
    let want = format!("{value:?}");
    let what = name.clone();
    let check = Box::new(move |stored: &[u8]| {
        let got: T = wire::decode(&what, stored)?;
        let got = format!("{got:?}");
        if got == want {
            Ok(())
        } else {
            Err(format!("stored {what} decodes to\n    {got}\n  not\n    {want}"))
        }
    });
    Case { name, bytes, check }
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for (name, op) in samples::ops() {
        out.push(case(format!("request.write.{name}"), Request::Write(op)));
    }
    let query = ListQuery {
        tenant: "acme".to_string(),
        scope: Some("payments.create".to_string()),
        state: Some(RecordState::InProgress),
        abandoned_only: true,
        start_after: Some(samples::key()),
        limit: 100,
    };
    out.push(case("request.get", Request::Get(samples::key())));
    out.push(case("request.wait", Request::Wait { id: samples::key(), timeout_ms: 5_000 }));
    out.push(case("request.list", Request::List(query)));
    out.push(case("request.members", Request::Members));
    out.push(case(
        "request.add_learner",
        Request::AddLearner { id: 4, peer_addr: "127.0.0.1:7204".to_string(), wait: true },
    ));
    out.push(case("request.promote", Request::Promote(vec![4, 5])));
    out.push(case("request.remove", Request::Remove(vec![2])));
    out.push(case("request.quota_tenant", Request::Quota(Some("acme".to_string()))));
    out.push(case("request.quota_all", Request::Quota(None)));

    for (name, outcome) in samples::outcomes() {
        out.push(case(format!("reply.outcome.{name}"), Reply::Outcome(outcome)));
    }
    out.push(case("reply.record", Reply::Record(Some(view("completed")))));
    out.push(case("reply.record_none", Reply::Record(None)));
    out.push(case("reply.waited", Reply::Waited { record: Some(view("in_progress")), timed_out: true }));
    out.push(case("reply.records", Reply::Records(vec![view("failed")])));
    let members = vec![
        MemberInfo { id: 1, peer_addr: "127.0.0.1:7201".to_string(), voter: true },
        MemberInfo { id: 4, peer_addr: "127.0.0.1:7204".to_string(), voter: false },
    ];
    out.push(case("reply.members", Reply::Members(members, 17)));
    let report = QuotaReport {
        default: Some(10_000),
        tenants: vec![QuotaUsage { tenant: "acme".to_string(), records: 12, limit: Some(1_000), own: true }],
    };
    out.push(case("reply.quota", Reply::Quota(report)));
    let page = ListPage { records: vec![view("completed"), view("in_progress")], next_after: Some(samples::key()) };
    out.push(case("reply.page", Reply::Page(page)));

    let errors = [
        (
            "invalid",
            NodeError::Invalid(ValidationError::Missing { field: "owner".into(), why: "claims name one".into() }),
        ),
        ("bad_request", NodeError::BadRequest("no record id".into())),
        (
            "no_leader",
            NodeError::NoLeader {
                why: "election in progress".into(),
                leader_id: Some(2),
                leader_addr: Some("127.0.0.1:7102".into()),
            },
        ),
        ("no_quorum", NodeError::NoQuorum("2 of 3 voters unreachable".into())),
        ("deadline", NodeError::Deadline("after 5s".into())),
        ("precondition", NodeError::Precondition("a membership change is in progress".into())),
        ("shutting_down", NodeError::ShuttingDown),
        ("internal", NodeError::Internal("disk full".into())),
        ("overloaded", NodeError::Overloaded("write queue full".into())),
        ("quota_exceeded", NodeError::QuotaExceeded { tenant: "acme".into(), limit: 1_000, records: 1_000 }),
    ];
    let leader = "127.0.0.1:7101".to_string();
    out.push(case(
        "forwarded.ok",
        Forwarded { result: Ok(Reply::Outcome(samples::outcomes()[0].1.clone())), leader_client_addr: leader.clone() },
    ));
    for (name, err) in errors {
        out.push(case(
            format!("forwarded.err.{name}"),
            Forwarded { result: Err(err), leader_client_addr: leader.clone() },
        ));
    }

    out.push(case("prevote", PreVote { candidate: 2, term: 4, last_log: Some(log_id(40)) }));
    out.push(case("prevote.reply", PreVoteReply { granted: false, why: "node 1 heard leader 1 100 ms ago".into() }));

    let entries: Vec<Entry> = vec![
        Entry { log_id: log_id(41), payload: EntryPayload::Blank },
        Entry { log_id: log_id(42), payload: EntryPayload::Membership(membership()) },
        Entry {
            log_id: log_id(43),
            payload: EntryPayload::Normal(CommandBatch(
                // The commands of the release that wrote this fixture; a variant added since has
                // a fixture of its own (request.write.*), so this one keeps its bytes.
                samples::ops()
                    .into_iter()
                    .filter(|(name, _)| *name != "compressed")
                    .map(|(_, op)| Command { now_ms: 1_700_000_000_000, op })
                    .collect(),
            )),
        },
    ];
    out.push(case(
        "raft.append_entries",
        AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(40)),
            entries,
            leader_commit: Some(log_id(39)),
        },
    ));
    type AppendReply = Result<AppendEntriesResponse<u64>, RaftError<u64>>;
    out.push(case("raft.append_entries.success", AppendReply::Ok(AppendEntriesResponse::Success)));
    out.push(case(
        "raft.append_entries.partial",
        AppendReply::Ok(AppendEntriesResponse::PartialSuccess(Some(log_id(41)))),
    ));
    out.push(case("raft.append_entries.conflict", AppendReply::Ok(AppendEntriesResponse::Conflict)));
    out.push(case(
        "raft.append_entries.higher_vote",
        AppendReply::Ok(AppendEntriesResponse::HigherVote(Vote::new(5, 2))),
    ));
    out.push(case("raft.vote", VoteRequest::<u64> { vote: Vote::new(4, 2), last_log_id: Some(log_id(40)) }));
    type VoteReply = Result<VoteResponse<u64>, RaftError<u64>>;
    out.push(case(
        "raft.vote.reply",
        VoteReply::Ok(VoteResponse { vote: Vote::new(4, 2), vote_granted: true, last_log_id: Some(log_id(40)) }),
    ));
    out.push(case(
        "raft.install_snapshot",
        InstallSnapshotRequest::<TypeConfig> {
            vote: Vote::new_committed(3, 1),
            meta: snapshot_meta(),
            offset: 1_048_576,
            data: b"IDEMSNAP\x02\x00\x00\x00".to_vec(),
            done: false,
        },
    ));
    type SnapReply = Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>;
    out.push(case(
        "raft.install_snapshot.reply",
        SnapReply::Ok(InstallSnapshotResponse { vote: Vote::new_committed(3, 1) }),
    ));
    let segment = |offset| SnapshotSegmentId { id: "3-40-1700000000000000000-0".to_string(), offset };
    out.push(case(
        "raft.install_snapshot.mismatch",
        SnapReply::Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(SnapshotMismatch {
            expect: segment(0),
            got: segment(1_048_576),
        }))),
    ));
    out.push(case(
        "raft.stream_snapshot.header",
        SnapshotHeader { vote: Vote::new_committed(3, 1), meta: snapshot_meta(), len: 5_368_709_120 },
    ));
    out.push(case("raft.stream_snapshot.reply", SnapshotReply::Ok(SnapshotResponse::new(Vote::new_committed(3, 1)))));
    out.push(case("raft.stream_snapshot.stopped", SnapshotReply::Err(Fatal::Stopped)));
    out
}

#[test]
fn every_peer_message_matches_the_golden_fixture() {
    let mut g = Golden::new(fixture());
    for c in cases() {
        g.add(&c.name, c.bytes).unwrap();
    }
    if let Err(e) = g.check() {
        panic!("{e}");
    }
}

#[test]
fn the_stored_peer_messages_still_decode_to_the_same_values() {
    let stored = golden::read(&fixture()).unwrap();
    let mut problems = Vec::new();
    for c in cases() {
        match stored.get(&c.name) {
            None => problems.push(format!("{} is missing from the fixture", c.name)),
            Some(bytes) => {
                if let Err(e) = (c.check)(bytes) {
                    problems.push(e);
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
