//! Every persisted encoding of the store, byte for byte against `tests/golden/store.txt`:
//! each command in a log entry, the other entry kinds, records in each state, outcomes, the
//! state machine's metadata, snapshot files of both formats and a whole log directory. The
//! stored bytes must also still decode to the same values, and the stored snapshot and log
//! must still load into a fresh store: that is what keeps data written by an earlier release
//! readable. A deliberate change rewrites the fixture with `IDEMRAFT_BLESS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use idemraft_store::golden::{self, samples, Golden};
use idemraft_store::raft::{Entry, LogId, SnapshotMeta, StoredMembership};
use idemraft_store::{codec, Command, CommandBatch, MemState, MemStateMachine, Op, Quotas, SnapshotData, Token};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftStateMachine};
use openraft::{BasicNode, CommittedLeaderId, EntryPayload, Membership, RaftSnapshotBuilder, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NOW: u64 = 1_700_000_000_000;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/store.txt")
}

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(3, 1), index)
}

fn membership() -> Membership<u64, BasicNode> {
    let nodes: BTreeMap<u64, BasicNode> = (1..=3).map(|i| (i, BasicNode::new(format!("127.0.0.1:720{i}")))).collect();
    Membership::new(vec![nodes.keys().copied().collect::<BTreeSet<u64>>()], nodes)
}

fn normal(index: u64, ops: Vec<Op>) -> Entry {
    let cmds = ops.into_iter().enumerate().map(|(i, op)| Command { now_ms: NOW + index * 1_000 + i as u64, op });
    Entry { log_id: log_id(index), payload: EntryPayload::Normal(CommandBatch(cmds.collect())) }
}

fn op(name: &str) -> Op {
    samples::ops().into_iter().find(|(n, _)| *n == name).map(|(_, op)| op).unwrap()
}

/// A short history that leaves a record of each kind behind: completed, in progress with a
/// checkpoint, failed. With `quota`, a SetQuota too, which makes the snapshot format 2.
fn history(quota: bool) -> Vec<Entry> {
    let key = |n: u64| idemraft_store::RecordKey::new("acme", "payments.create", format!("order-{n:016}")).unwrap();
    let claim = |n: u64| Op::Claim {
        id: key(n),
        fingerprint: Some([n as u8; 32]),
        owner: format!("worker-{n}"),
        lease_ms: 30_000,
        ttl_ms: 86_400_000,
        allow_takeover: true,
    };
    let token = |slot| Token::new(2, slot);
    let Op::Complete { response, .. } = op("complete") else { unreachable!() };
    let mut log = vec![
        Entry { log_id: log_id(1), payload: EntryPayload::Membership(membership()) },
        normal(2, vec![claim(1), claim(2), claim(3)]),
        normal(
            3,
            vec![
                Op::Complete { id: key(1), token: token(0), response },
                Op::Checkpoint {
                    id: key(2),
                    token: token(1),
                    recovery_point: "charged".into(),
                    data: vec![1, 2, 3],
                    lease_ms: 60_000,
                },
                Op::Fail { id: key(3), token: token(2), retryable: true, response: None },
            ],
        ),
    ];
    if quota {
        log.push(normal(4, vec![op("set_quota_tenant")]));
    }
    log
}

/// [`history`] with a quota and one response large enough to be kept in a blob: its snapshot
/// is format 3.
fn blob_history() -> Vec<Entry> {
    let mut log = history(true);
    let id = idemraft_store::RecordKey::new("acme", "payments.create", "order-large-0000001").unwrap();
    let claim = Op::Claim {
        id: id.clone(),
        fingerprint: None,
        owner: "w".into(),
        lease_ms: 30_000,
        ttl_ms: 86_400_000,
        allow_takeover: false,
    };
    log.push(normal(5, vec![claim]));
    // 4196 bytes: a blob body when the fixture was made (the stub's bytes do not depend on it).
    let body: Vec<u8> = (0..4196u32).map(|i| (i % 251) as u8).collect();
    let response = idemraft_store::Response {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body,
    };
    log.push(normal(6, vec![Op::Complete { id, token: Token::new(5, 0), response }]));
    log
}

/// The sample completed record as a blob stub (its body moved out) and the blob it names.
fn blob_stub() -> (idemraft_store::Record, idemraft_store::stored::BlobRef) {
    let mut rec = samples::records().into_iter().find(|(n, _)| *n == "completed").unwrap().1;
    if let Some(r) = rec.response.as_mut() {
        r.body.clear();
    }
    (rec, idemraft_store::stored::BlobRef { index: 7, n: 2, len: 8_192, crc: 0x1234_5678, at: None })
}

/// The same record as a packed stub: its body is a range of a pack.
fn packed_stub() -> (idemraft_store::Record, idemraft_store::stored::BlobRef) {
    let (rec, blob) = blob_stub();
    (rec, idemraft_store::stored::BlobRef { n: 3, len: 1_000, at: Some(48), ..blob })
}

fn format3_of(log: &[Entry]) -> (SnapshotMeta, Vec<u8>) {
    let mut state = MemState::new();
    for e in log {
        if let EntryPayload::Normal(batch) = &e.payload {
            idemraft_store::machine::apply_batch(&mut state, e.log_id.index, &batch.0).unwrap();
        }
    }
    let last = log[log.len() - 1].log_id;
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(log_id(1)), membership()),
        snapshot_id: "golden-format3".into(),
    };
    let bytes = golden::format3_snapshot(&meta, &state).unwrap();
    (meta, bytes)
}

fn expected_digest(log: &[Entry]) -> [u8; 32] {
    let mut state = MemState::new();
    for e in log {
        if let EntryPayload::Normal(batch) = &e.payload {
            idemraft_store::machine::apply_batch(&mut state, e.log_id.index, &batch.0).unwrap();
        }
    }
    state.digest()
}

async fn snapshot_of(log: &[Entry]) -> (SnapshotMeta, Vec<u8>) {
    let mut sm = MemStateMachine::new();
    sm.apply(log.to_vec()).await.unwrap();
    let mut snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let mut bytes = Vec::new();
    snap.snapshot.read_to_end(&mut bytes).await.unwrap();
    (snap.meta, bytes)
}

/// The files of a log directory holding `log`, a vote and a committed id, by file name.
async fn log_files(dir: &Path, log: &[Entry]) -> BTreeMap<String, Vec<u8>> {
    {
        let (mut l, _sm) = idemraft_store::open(dir).unwrap();
        l.save_vote(&Vote::new_committed(3, 1)).await.unwrap();
        l.append_durably(log.to_vec()).await.unwrap();
        l.save_committed(Some(log[log.len() - 1].log_id)).await.unwrap();
    }
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(dir.join("log")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let mut bytes = std::fs::read(e.path()).unwrap();
        if name.ends_with(".seg") {
            bytes.truncate(idemraft_store::golden::segment_frames_end(&bytes));
        }
        files.insert(name, bytes);
    }
    files
}

/// Every case, built from the fixed values: (name, bytes).
async fn cases(scratch: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add = |name: String, bytes: Vec<u8>| out.push((name, bytes));
    for (name, op) in samples::ops() {
        add(format!("entry.{name}"), codec::encode(&normal(42, vec![op])).unwrap());
    }
    add(
        "entry.batch_of_three".into(),
        codec::encode(&normal(43, vec![op("claim"), op("sweep"), op("resume")])).unwrap(),
    );
    add("entry.blank".into(), codec::encode(&Entry { log_id: log_id(44), payload: EntryPayload::Blank }).unwrap());
    add(
        "entry.membership".into(),
        codec::encode(&Entry { log_id: log_id(45), payload: EntryPayload::Membership(membership()) }).unwrap(),
    );
    for (name, rec) in samples::records() {
        add(format!("record.{name}"), codec::encode(&rec).unwrap());
    }
    for (name, outcome) in samples::outcomes() {
        add(format!("outcome.{name}"), codec::encode(&outcome).unwrap());
    }
    add("state.record_key".into(), samples::key().encode());
    add("state.applied".into(), codec::encode(&Some(log_id(45))).unwrap());
    add("state.membership".into(), codec::encode(&StoredMembership::new(Some(log_id(1)), membership())).unwrap());
    let mut quotas = Quotas::default();
    quotas.set(None, Some(10_000));
    quotas.set(Some("acme"), Some(1_000));
    add("state.quotas".into(), codec::encode(&quotas).unwrap());
    add("snapshot.format1".into(), snapshot_of(&history(false)).await.1);
    add("snapshot.format2".into(), snapshot_of(&history(true)).await.1);
    add("snapshot.format3".into(), format3_of(&blob_history()).1);
    let (stub, blob) = blob_stub();
    add("record.blob_stub".into(), idemraft_store::stored::encode_stub(&stub, &blob).unwrap());
    let (stub, packed) = packed_stub();
    add("record.packed_stub".into(), idemraft_store::stored::encode_stub(&stub, &packed).unwrap());
    for (file, bytes) in log_files(&scratch.join("log-case"), &history(true)).await {
        add(format!("log.{file}"), bytes);
    }
    out
}

#[tokio::test]
async fn every_persisted_encoding_matches_the_golden_fixture() {
    let scratch = tempfile::TempDir::new().unwrap();
    let mut g = Golden::new(fixture());
    for (name, bytes) in cases(scratch.path()).await {
        g.add(&name, bytes).unwrap();
    }
    if let Err(e) = g.check() {
        panic!("{e}");
    }
}

fn decodes_to<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    stored: &BTreeMap<String, Vec<u8>>,
    name: &str,
    want: &T,
) {
    let bytes = stored.get(name).unwrap_or_else(|| panic!("{name} is missing from {}", fixture().display()));
    let got: T = codec::decode(name, bytes).unwrap_or_else(|e| panic!("stored {name} no longer decodes: {e}"));
    assert_eq!(&got, want, "stored {name} decodes to something else");
}

#[tokio::test]
async fn the_stored_bytes_still_decode_to_the_same_values() {
    let stored = golden::read(&fixture()).unwrap();
    for (name, op) in samples::ops() {
        decodes_to(&stored, &format!("entry.{name}"), &normal(42, vec![op]));
    }
    decodes_to(&stored, "entry.blank", &Entry { log_id: log_id(44), payload: EntryPayload::Blank });
    for (name, rec) in samples::records() {
        decodes_to(&stored, &format!("record.{name}"), &rec);
    }
    for (name, outcome) in samples::outcomes() {
        decodes_to(&stored, &format!("outcome.{name}"), &outcome);
    }
    let (stub, blob) = blob_stub();
    let bytes = stored.get("record.blob_stub").expect("record.blob_stub is in the fixture");
    let (rec, named) = idemraft_store::stored::decode("record.blob_stub", bytes).unwrap();
    assert_eq!((rec, named), (stub, Some(blob)), "stored record.blob_stub decodes to something else");
    let (stub, packed) = packed_stub();
    let bytes = stored.get("record.packed_stub").expect("record.packed_stub is in the fixture");
    let (rec, named) = idemraft_store::stored::decode("record.packed_stub", bytes).unwrap();
    assert_eq!((rec, named), (stub, Some(packed)), "stored record.packed_stub decodes to something else");
}

#[tokio::test]
async fn stored_snapshots_of_both_formats_still_install_into_the_sled_store() {
    let stored = golden::read(&fixture()).unwrap();
    for (name, quota) in [("snapshot.format1", false), ("snapshot.format2", true)] {
        let log = history(quota);
        let (meta, _) = snapshot_of(&log).await;
        let dir = tempfile::TempDir::new().unwrap();
        let (_l, mut sm) = idemraft_store::open(&dir.path().join("d")).unwrap();
        let mut incoming = sm.begin_receiving_snapshot().await.unwrap();
        incoming.write_all(&stored[name]).await.unwrap();
        sm.install_snapshot(&meta, incoming).await.unwrap_or_else(|e| panic!("stored {name} no longer installs: {e}"));
        assert_eq!(sm.digest().await.unwrap(), expected_digest(&log), "stored {name} loads a different state");
        assert_eq!(sm.applied_state().await.unwrap().0, meta.last_log_id);
        let mut mem = MemStateMachine::new();
        let data = Box::new(SnapshotData::Memory(std::io::Cursor::new(stored[name].clone())));
        mem.install_snapshot(&meta, data).await.unwrap();
        assert_eq!(mem.digest(), expected_digest(&log), "stored {name} loads a different in-memory state");
    }
}

#[tokio::test]
async fn a_stored_format_3_snapshot_with_a_blob_still_installs_into_both_stores() {
    let stored = golden::read(&fixture()).unwrap();
    let log = blob_history();
    let (meta, _) = format3_of(&log);
    let bytes = stored.get("snapshot.format3").expect("snapshot.format3 is in the fixture");
    let dir = tempfile::TempDir::new().unwrap();
    let (_l, mut sm) = idemraft_store::open(&dir.path().join("d")).unwrap();
    let mut incoming = sm.begin_receiving_snapshot().await.unwrap();
    incoming.write_all(bytes).await.unwrap();
    sm.install_snapshot(&meta, incoming)
        .await
        .unwrap_or_else(|e| panic!("stored snapshot.format3 no longer installs: {e}"));
    assert_eq!(sm.digest().await.unwrap(), expected_digest(&log), "stored snapshot.format3 loads a different state");
    assert!(sm.blob_bytes() > 0, "its large body is kept in a blob file");
    let mut mem = MemStateMachine::new();
    let data = Box::new(SnapshotData::Memory(std::io::Cursor::new(bytes.clone())));
    mem.install_snapshot(&meta, data).await.unwrap();
    assert_eq!(mem.digest(), expected_digest(&log));
    // The sled store streams it back exactly as stored (same layout, same bytes).
    let mut again = Vec::new();
    sm.get_current_snapshot().await.unwrap().unwrap().snapshot.read_to_end(&mut again).await.unwrap();
    assert_eq!(&again, bytes, "the sled store's stream of an installed format 3 snapshot");
}

#[tokio::test]
async fn a_stored_log_directory_still_opens_with_its_entries_vote_and_commit() {
    let stored = golden::read(&fixture()).unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let data = dir.path().join("d");
    drop(idemraft_store::open(&data).unwrap());
    let log_dir = data.join("log");
    for e in std::fs::read_dir(&log_dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let files: Vec<_> = stored.iter().filter_map(|(k, v)| Some((k.strip_prefix("log.")?, v))).collect();
    assert!(files.len() >= 2, "the fixture holds a log's meta and at least one segment");
    for (file, bytes) in files {
        std::fs::write(log_dir.join(file), bytes).unwrap();
    }
    let log = history(true);
    let (mut l, _sm) = idemraft_store::open(&data).unwrap();
    assert_eq!(l.read_vote().await.unwrap(), Some(Vote::new_committed(3, 1)));
    assert_eq!(l.read_committed().await.unwrap(), Some(log[log.len() - 1].log_id));
    let read = l.try_get_log_entries(1..=log.len() as u64).await.unwrap();
    assert_eq!(read, log, "the stored log reads back as other entries");
}
