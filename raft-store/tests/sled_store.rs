//! The sled stores as a whole: the same log gives byte-identical state however it is applied
//! (entry by entry, in large groups, in memory, or after a snapshot taken midway), state
//! survives reopening, snapshots replace the whole state, and a data directory that is not
//! ours, or is damaged, is refused with an error naming the directory and the problem.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

use std::path::Path;

use idemraft_store::machine::apply_batch;
use idemraft_store::raft::Entry;
use idemraft_store::{
    Command, CommandBatch, MemState, Op, Outcome, RecordKey, Response, StateMachineStore, StoreError, Token,
};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, RaftSnapshotBuilder};

use tempfile::TempDir;

/// Opens a data directory's sled database directly, to simulate damage. A store dropped just
/// before may still hold the directory lock for a moment from sled's flusher thread.
fn raw_db(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match sled::open(dir.join("db")) {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => return other.unwrap(),
        }
    }
}

fn key(i: u64) -> RecordKey {
    RecordKey::new(if i % 5 == 0 { "acme" } else { "default" }, "payments.create", format!("order-{i:016}")).unwrap()
}

/// A seeded log: entry 1 is a membership entry, then batches of mixed commands whose tokens
/// come from grants seen so far, so completes and fails really land; quotas come and go.
fn make_log(seed: u64, entries: u64) -> Vec<Entry> {
    let mut rng = Rng(seed);
    let mut model = MemState::new();
    let mut granted: Vec<(RecordKey, Token)> = Vec::new();
    let mut now = 1_700_000_000_000u64;
    let mut log = vec![Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
        payload: EntryPayload::Membership(Membership::new(vec![[1u64, 2, 3].into_iter().collect()], None)),
    }];
    for index in 2..=entries {
        let mut cmds = Vec::new();
        for _ in 0..1 + rng.below(16) {
            // Mostly small steps, sometimes an outage long enough for leases and TTLs to lapse.
            now += if rng.below(50) == 0 { rng.below(200_000) } else { rng.below(2_000) };
            let op = match rng.below(10) {
                0..=3 => Op::Claim {
                    id: key(rng.below(200)),
                    fingerprint: Some([rng.below(2) as u8; 32]),
                    owner: format!("w{}", rng.below(4)),
                    lease_ms: 1_000 + rng.below(10_000),
                    ttl_ms: 60_000 + rng.below(120_000),
                    allow_takeover: rng.below(2) == 0,
                },
                4..=6 if !granted.is_empty() => {
                    let (id, token) = granted[rng.below(granted.len() as u64) as usize].clone();
                    // A quarter of the bodies span whole blocks of their pack (a released one
                    // is punched out), a quarter are smaller packed ones, the rest stay inline.
                    let len = match rng.below(4) {
                        0 => 4_096 + rng.below(40_000),
                        1 => 512 + rng.below(3_584),
                        _ => rng.below(300),
                    };
                    let salt = rng.below(256);
                    let body: Vec<u8> = (0..len).map(|i| (i + salt) as u8).collect();
                    Op::Complete { id, token, response: Response { status: 200, headers: vec![], body } }
                }
                7 if !granted.is_empty() => {
                    let (id, token) = granted[rng.below(granted.len() as u64) as usize].clone();
                    Op::Checkpoint { id, token, recovery_point: "step-2".into(), data: vec![7; 40], lease_ms: 5_000 }
                }
                8 if !granted.is_empty() => {
                    let (id, token) = granted[rng.below(granted.len() as u64) as usize].clone();
                    Op::Fail { id, token, retryable: true, response: None }
                }
                9 if rng.below(4) == 0 => Op::Resume { sweep_interval_ms: 1_000, max_stretch_ms: rng.below(20_000) },
                // Quotas a little above and below what acme (every fifth key) and the rest
                // hold, so some claims are refused and replays are not.
                9 if rng.below(5) == 0 => Op::SetQuota {
                    tenant: if rng.below(3) == 0 { None } else { Some("acme".into()) },
                    max_records: (rng.below(4) != 0).then(|| 10 + rng.below(40)),
                },
                9 if rng.below(3) == 0 && !granted.is_empty() => {
                    let (id, _) = granted[rng.below(granted.len() as u64) as usize].clone();
                    Op::Takeover { id, owner: format!("w{}", rng.below(4)), force: rng.below(2) == 0, lease_ms: 3_000 }
                }
                _ => Op::Sweep { limit: 1 + rng.below(8) as u32 },
            };
            cmds.push(Command { now_ms: now, op });
        }
        for (cmd, out) in cmds.iter().zip(apply_batch(&mut model, index, &cmds).unwrap()) {
            if let (Outcome::Acquired(g), Some(id)) = (out, cmd.op.record_key()) {
                granted.push((id.clone(), g.token));
            }
        }
        log.push(Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(CommandBatch(cmds)),
        });
    }
    log
}

fn mem_state(log: &[Entry]) -> MemState {
    let mut state = MemState::new();
    for e in log {
        if let EntryPayload::Normal(b) = &e.payload {
            apply_batch(&mut state, e.log_id.index, &b.0).unwrap();
        }
    }
    state
}

fn mem_digest(log: &[Entry]) -> [u8; 32] {
    mem_state(log).digest()
}

async fn apply_in_groups(sm: &mut StateMachineStore, log: &[Entry], group: usize) {
    for chunk in log.chunks(group) {
        let replies = sm.apply(chunk.to_vec()).await.unwrap();
        assert_eq!(replies.len(), chunk.len(), "one reply per entry");
    }
}

#[tokio::test]
async fn same_log_gives_byte_identical_state_on_every_store_and_after_a_midway_snapshot() {
    let seed = 0x1DE7_0001;
    let log = make_log(seed, 400);
    let expected = mem_digest(&log);
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();

    // A: one entry per apply call. B: 37 entries per call.
    let (_la, mut a) = idemraft_store::open(&dirs[0].path().join("d")).unwrap();
    let (_lb, mut b) = idemraft_store::open(&dirs[1].path().join("d")).unwrap();
    apply_in_groups(&mut a, &log[..200], 1).await;
    apply_in_groups(&mut b, &log, 37).await;

    // C starts with junk of its own that the snapshot must wipe out.
    let (_lc, mut c) = idemraft_store::open(&dirs[2].path().join("d")).unwrap();
    apply_in_groups(&mut c, &make_log(seed + 1, 50), 10).await;

    let snap = a.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(snap.meta.last_log_id.map(|l| l.index), Some(200));
    let mut source = snap.snapshot;
    let mut incoming = c.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *source, &mut *incoming).await.unwrap();
    c.install_snapshot(&snap.meta, incoming).await.unwrap();
    assert_eq!(c.applied_state().await.unwrap().0, snap.meta.last_log_id);

    apply_in_groups(&mut a, &log[200..], 1).await;
    apply_in_groups(&mut c, &log[200..], 50).await;

    let (da, db, dc) = (a.digest().await.unwrap(), b.digest().await.unwrap(), c.digest().await.unwrap());
    assert_eq!(da, expected, "sled store A differs from the in-memory state (seed {seed:#x})");
    assert_eq!(db, expected, "sled store B differs from the in-memory state (seed {seed:#x})");
    assert_eq!(dc, expected, "snapshot-restored store C differs (seed {seed:#x})");
    assert!(a.record_count() > 0);
    // The counter kept by apply (and by a snapshot install) matches the reference state.
    let records = mem_state(&log).len();
    for (name, sm) in [("A", &a), ("B", &b), ("C", &c)] {
        assert_eq!(sm.record_count(), records, "record count of store {name} (seed {seed:#x})");
    }
}

#[tokio::test]
async fn state_and_snapshot_survive_reopening() {
    let log = make_log(7, 120);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    let (digest, applied, snap_id) = {
        let (mut l, mut sm) = idemraft_store::open(&path).unwrap();
        l.append_durably(log.clone()).await.unwrap();
        l.save_committed(Some(log[119].log_id)).await.unwrap();
        apply_in_groups(&mut sm, &log, 8).await;
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        sm.flush().await.unwrap();
        (sm.digest().await.unwrap(), sm.applied_state().await.unwrap(), snap.meta.snapshot_id)
    };
    let (mut l, mut sm) = idemraft_store::open(&path).unwrap();
    assert_eq!(sm.digest().await.unwrap(), digest);
    assert_eq!(sm.applied_state().await.unwrap(), applied);
    assert_eq!(sm.get_current_snapshot().await.unwrap().unwrap().meta.snapshot_id, snap_id);
    assert_eq!(l.read_committed().await.unwrap(), Some(log[119].log_id));
    assert_eq!(l.get_log_state().await.unwrap().last_log_id, Some(log[119].log_id));
}

#[tokio::test]
async fn a_damaged_snapshot_is_refused_and_the_state_is_untouched() {
    let log = make_log(9, 60);
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    let (_la, mut a) = idemraft_store::open(&dirs[0].path().join("d")).unwrap();
    let (_lb, mut b) = idemraft_store::open(&dirs[1].path().join("d")).unwrap();
    apply_in_groups(&mut a, &log, 60).await;
    apply_in_groups(&mut b, &log[..10], 10).await;
    let before = b.digest().await.unwrap();

    let snap = a.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut *{ snap.snapshot }, &mut bytes).await.unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    let mut incoming = b.begin_receiving_snapshot().await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut *incoming, &bytes).await.unwrap();
    let err = b.install_snapshot(&snap.meta, incoming).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("snapshot"), "{msg}");
    assert_eq!(b.digest().await.unwrap(), before);
    assert_eq!(b.applied_state().await.unwrap().0.map(|l| l.index), Some(10));
}

#[tokio::test]
async fn sled_state_machine_answers_exactly_like_the_in_memory_one() {
    for seed in 100..112u64 {
        let log = make_log(seed, 300);
        let dir = TempDir::new().unwrap();
        let (_l, mut sm) = idemraft_store::open(&dir.path().join("d")).unwrap();
        let mut mem = MemState::new();
        let mut at = 0;
        // Uneven groups, so one apply call sometimes touches a record several times.
        while at < log.len() {
            let n = 1 + (seed as usize + at) % 7;
            let group = &log[at..(at + n).min(log.len())];
            let replies = sm.apply(group.to_vec()).await.unwrap();
            for (entry, reply) in group.iter().zip(replies) {
                let want = match &entry.payload {
                    EntryPayload::Normal(b) => apply_batch(&mut mem, entry.log_id.index, &b.0).unwrap(),
                    _ => Vec::new(),
                };
                assert_eq!(reply.0, want, "seed {seed}: entry {} answered differently on sled", entry.log_id.index);
            }
            at += n;
        }
        assert_eq!(sm.digest().await.unwrap(), mem.digest(), "seed {seed}");
        assert!(!mem.is_empty(), "seed {seed}: the log should leave records behind");
        for tenant in ["default", "acme"] {
            for abandoned_only in [false, true] {
                let q = idemraft_store::ListQuery {
                    tenant: tenant.into(),
                    abandoned_only,
                    limit: 1_000,
                    ..Default::default()
                };
                assert_eq!(
                    sm.list(&q).await.unwrap(),
                    idemraft_store::machine::list(&mut mem, &q, idemraft_store::LIST_PAGE_BYTES).unwrap(),
                    "seed {seed}: list differs"
                );
            }
        }
    }
}

/// A crash in the middle of installing a snapshot (the `pending` marker is durable, the state
/// half cleared) is finished on the next open; a state machine found behind its own snapshot
/// is reloaded from it. Both crashes are simulated by editing the sled trees directly.
#[tokio::test]
async fn an_interrupted_install_and_a_state_behind_its_snapshot_are_repaired_on_open() {
    let log = make_log(21, 150);
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    let (a_path, b_path) = (dirs[0].path().join("d"), dirs[1].path().join("d"));
    let (snap_meta, snap_digest) = {
        let (_l, mut a) = idemraft_store::open(&a_path).unwrap();
        apply_in_groups(&mut a, &log, 10).await;
        let snap = a.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let (_lb, mut b) = idemraft_store::open(&b_path).unwrap();
        apply_in_groups(&mut b, &log[..30], 10).await;
        let mut incoming = b.begin_receiving_snapshot().await.unwrap();
        tokio::io::copy(&mut *{ snap.snapshot }, &mut *incoming).await.unwrap();
        b.install_snapshot(&snap.meta, incoming).await.unwrap();
        b.flush().await.unwrap();
        (snap.meta, a.digest().await.unwrap())
    };

    // B crashed half-way through loading: pending marker set, most records and the applied
    // id gone, junk left behind.
    {
        let db = raw_db(&b_path);
        let sm = db.open_tree("sm").unwrap();
        let keys: Vec<_> = sm.iter().keys().map(|k| k.unwrap()).collect();
        for k in keys.iter().skip(3) {
            sm.remove(k).unwrap();
        }
        sm.insert(b"rjunk\0junk\0junk-junk-junk-junk", &b"\x01"[..]).unwrap();
        let snap = db.open_tree("snap").unwrap();
        snap.insert(b"pending", bincode::serialize(&snap_meta).unwrap()).unwrap();
        db.flush().unwrap();
    }
    {
        let (_l, mut b) = idemraft_store::open(&b_path).unwrap();
        assert_eq!(b.digest().await.unwrap(), snap_digest, "the interrupted install was finished");
        assert_eq!(b.applied_state().await.unwrap().0, snap_meta.last_log_id);
    }

    // A's state machine lost its latest writes (applied id rolled back), but its snapshot is
    // newer: opening reloads the snapshot instead of serving an older state.
    {
        let db = raw_db(&a_path);
        let sm = db.open_tree("sm").unwrap();
        sm.insert(b"mapplied", bincode::serialize(&Some(log[40].log_id)).unwrap()).unwrap();
        db.flush().unwrap();
    }
    let (_l, mut a) = idemraft_store::open(&a_path).unwrap();
    assert_eq!(a.applied_state().await.unwrap().0, snap_meta.last_log_id);
    assert_eq!(a.digest().await.unwrap(), snap_digest);
}

/// Apply writes are not one sled batch, so after a crash the tree may hold half an apply. Only
/// a clean shutdown's mark makes an open trust it: without one the state is the newest
/// snapshot's (or empty without a snapshot), and re-applying the log from there gives the
/// state the whole log gives; with one, the tree is kept as it is.
#[tokio::test]
async fn without_a_clean_shutdown_the_state_restarts_from_the_snapshot_and_the_log_completes_it() {
    let log = make_log(33, 120);
    let want = mem_digest(&log);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    let snap_meta = {
        let (_l, mut sm) = idemraft_store::open(&path).unwrap();
        apply_in_groups(&mut sm, &log[..60], 10).await;
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        apply_in_groups(&mut sm, &log[60..100], 10).await;
        snap.meta
    };
    // A crash in the middle of an apply: some of entry 101's writes reached the tree (here a
    // record that no entry writes, and an applied id that claims more than was applied).
    {
        let db = raw_db(&path);
        let sm = db.open_tree("sm").unwrap();
        // Records sort last in the tree (prefix `r`), so the last value is a record's.
        let record = sm.iter().values().next_back().unwrap().unwrap();
        sm.insert([&b"r"[..], &key(999_999).encode()].concat(), record).unwrap();
        sm.insert(b"mapplied", bincode::serialize(&Some(log[110].log_id)).unwrap()).unwrap();
        db.flush().unwrap();
    }
    {
        let (_l, mut sm) = idemraft_store::open(&path).unwrap();
        assert_eq!(sm.applied_state().await.unwrap().0, snap_meta.last_log_id, "back to the snapshot");
        assert!(sm.get(&key(999_999)).await.unwrap().is_none(), "the torn write is gone");
        apply_in_groups(&mut sm, &log[60..], 10).await;
        assert_eq!(sm.digest().await.unwrap(), want);
        sm.flush().await.unwrap();
    }
    // A clean shutdown: the next open keeps the tree, and its first apply takes the mark away,
    // so a crash after it is treated as one.
    let (_l, mut sm) = idemraft_store::open(&path).unwrap();
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log[119].log_id));
    assert_eq!(sm.digest().await.unwrap(), want);
    let more = make_log(33, 121);
    apply_in_groups(&mut sm, &more[120..], 1).await;
    drop((_l, sm));
    let (_l, mut sm) = idemraft_store::open(&path).unwrap();
    assert_eq!(sm.applied_state().await.unwrap().0, snap_meta.last_log_id, "a crash after the mark was taken away");
}

/// A read racing a snapshot install sees the state before or after it, never the tree half
/// cleared: records present on both sides must never read as absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_during_a_snapshot_install_never_see_a_half_loaded_state() {
    // Many long-lived records, so the load takes long enough for reads to race it.
    let log: Vec<Entry> = (1..=300u64)
        .map(|index| {
            let cmds = (0..32)
                .map(|slot| Command {
                    now_ms: 1_700_000_000_000 + index,
                    op: Op::Claim {
                        id: RecordKey::new("default", "bulk", format!("bulk-key-{index:06}-{slot:04}")).unwrap(),
                        fingerprint: None,
                        owner: "w".into(),
                        lease_ms: 60_000,
                        ttl_ms: 86_400_000,
                        allow_takeover: false,
                    },
                })
                .collect();
            Entry {
                log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Normal(CommandBatch(cmds)),
            }
        })
        .collect();
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    let (_la, mut a) = idemraft_store::open(&dirs[0].path().join("d")).unwrap();
    let (_lb, mut b) = idemraft_store::open(&dirs[1].path().join("d")).unwrap();
    apply_in_groups(&mut a, &log, 50).await;
    apply_in_groups(&mut b, &log[..250], 50).await;
    // Keys of B that A has too, spread over the whole key range.
    let both: Vec<RecordKey> = (1..=250u64)
        .step_by(7)
        .map(|i| RecordKey::new("default", "bulk", format!("bulk-key-{i:06}-0003")).unwrap())
        .collect();

    let snap = a.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let mut incoming = b.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ snap.snapshot }, &mut *incoming).await.unwrap();
    let reader = b.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_reading = stop.clone();
    let reads = tokio::spawn(async move {
        let mut reads = 0u64;
        while !stop_reading.load(std::sync::atomic::Ordering::Relaxed) && reads < 2_000_000 {
            for id in &both {
                // Expiry can only remove a record at a later clock; at clock 0 both states hold it.
                let got = reader.get(id).await.unwrap();
                assert!(got.is_some(), "read {reads}: {id} vanished while the snapshot was loading");
                reads += 1;
            }
            tokio::task::yield_now().await;
        }
        reads
    });
    b.install_snapshot(&snap.meta, incoming).await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reads.await.unwrap();
    assert!(reads > 0);
    assert_eq!(b.digest().await.unwrap(), a.digest().await.unwrap());
}

/// The in-memory store answers like the sled store, and snapshots cross between the two in
/// both directions with the state intact.
#[tokio::test]
async fn memory_and_sled_stores_agree_and_exchange_snapshots() {
    let log = make_log(41, 300);
    let dir = TempDir::new().unwrap();
    let (_l, mut sled_sm) = idemraft_store::open(&dir.path().join("d")).unwrap();
    let mut mem_sm = idemraft_store::MemStateMachine::new();
    for chunk in log[..200].chunks(9) {
        let a = sled_sm.apply(chunk.to_vec()).await.unwrap();
        let b = mem_sm.apply(chunk.to_vec()).await.unwrap();
        assert_eq!(a, b, "entries {:?} answered differently", chunk.first().map(|e| e.log_id.index));
    }
    assert_eq!(sled_sm.digest().await.unwrap(), mem_sm.digest());

    // sled -> memory
    let snap = sled_sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let mut fresh_mem = idemraft_store::MemStateMachine::new();
    let mut incoming = fresh_mem.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ snap.snapshot }, &mut *incoming).await.unwrap();
    fresh_mem.install_snapshot(&snap.meta, incoming).await.unwrap();
    assert_eq!(fresh_mem.digest(), mem_sm.digest());
    assert_eq!(fresh_mem.applied_state().await.unwrap(), sled_sm.applied_state().await.unwrap());

    // memory -> sled, then both go on with the rest of the log
    apply_in_groups_mem(&mut mem_sm, &log[200..]).await;
    let snap = mem_sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let other = TempDir::new().unwrap();
    let (_l2, mut fresh_sled) = idemraft_store::open(&other.path().join("d")).unwrap();
    let mut incoming = fresh_sled.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ snap.snapshot }, &mut *incoming).await.unwrap();
    fresh_sled.install_snapshot(&snap.meta, incoming).await.unwrap();
    assert_eq!(fresh_sled.digest().await.unwrap(), mem_sm.digest());
    assert_eq!(mem_sm.digest(), mem_digest(&log));
    let q = idemraft_store::ListQuery { tenant: "default".into(), limit: 1_000, ..Default::default() };
    assert_eq!(fresh_sled.list(&q).await.unwrap(), mem_sm.list(&q));
}

async fn apply_in_groups_mem(sm: &mut idemraft_store::MemStateMachine, log: &[Entry]) {
    for chunk in log.chunks(13) {
        sm.apply(chunk.to_vec()).await.unwrap();
    }
}

/// Builds snapshot bytes by hand, frame by frame, with a valid checksum: how a buggy or newer
/// peer could send well-formed bytes that do not hold what they should.
fn forged_snapshot(meta: &idemraft_store::raft::SnapshotMeta, records: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    use sha2::Digest;
    let mut out = b"IDEMSNAP".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    let mut frame = |body: Vec<u8>| {
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
    };
    let mut header = 0u32.to_le_bytes().to_vec();
    header.extend(bincode::serialize(meta).unwrap());
    header.extend(7u64.to_le_bytes());
    frame(header);
    for (k, v) in records {
        let mut rec = 1u32.to_le_bytes().to_vec();
        rec.extend((k.len() as u64).to_le_bytes());
        rec.extend(k);
        rec.extend((v.len() as u64).to_le_bytes());
        rec.extend(v);
        frame(rec);
    }
    let mut end = 2u32.to_le_bytes().to_vec();
    end.extend((records.len() as u64).to_le_bytes());
    frame(end);
    let sum = sha2::Sha256::digest(&out);
    out.extend_from_slice(&sum);
    out
}

#[tokio::test]
async fn a_well_formed_snapshot_with_bad_contents_is_refused_before_the_state_is_touched() {
    let log = make_log(51, 40);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    let (_l, mut b) = idemraft_store::open(&path).unwrap();
    apply_in_groups(&mut b, &log, 10).await;
    let before = b.digest().await.unwrap();
    let good = bincode::serialize(&b.get(&key(1)).await.unwrap().map(|v| v.record)).unwrap();
    let meta = idemraft_store::raft::SnapshotMeta {
        last_log_id: Some(LogId::new(CommittedLeaderId::new(3, 1), 500)),
        last_membership: Default::default(),
        snapshot_id: "3-500-forged".into(),
    };
    let k = |i: u64| key(i).encode();
    let cases: Vec<(&str, idemraft_store::raft::SnapshotMeta, Vec<u8>)> = vec![
        ("a record that does not decode", meta.clone(), forged_snapshot(&meta, &[(k(1), b"\xff\xff".to_vec())])),
        ("an invalid key", meta.clone(), forged_snapshot(&meta, &[(b"no separators".to_vec(), good.clone())])),
        ("a repeated key", meta.clone(), forged_snapshot(&meta, &[(k(1), good.clone()), (k(1), good.clone())])),
        (
            "a header that names another snapshot",
            idemraft_store::raft::SnapshotMeta { snapshot_id: "3-500-other".into(), ..meta.clone() },
            forged_snapshot(&meta, &[]),
        ),
        (
            "an id that is a path",
            idemraft_store::raft::SnapshotMeta { snapshot_id: "../../escape".into(), ..meta.clone() },
            forged_snapshot(
                &idemraft_store::raft::SnapshotMeta { snapshot_id: "../../escape".into(), ..meta.clone() },
                &[],
            ),
        ),
    ];
    for (what, sent_as, bytes) in cases {
        let mut incoming = b.begin_receiving_snapshot().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut *incoming, &bytes).await.unwrap();
        let err = b.install_snapshot(&sent_as, incoming).await;
        assert!(err.is_err(), "{what}: installed");
        assert_eq!(b.digest().await.unwrap(), before, "{what}: the state changed");
        let mut mem = idemraft_store::MemStateMachine::new();
        let mut incoming = mem.begin_receiving_snapshot().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut *incoming, &bytes).await.unwrap();
        assert!(mem.install_snapshot(&sent_as, incoming).await.is_err(), "{what}: installed in memory");
    }
    assert!(!dir.path().join("escape.snap").exists() && !dir.path().join("escape.snap.tmp").exists());
    // A clean shutdown; nothing was marked pending, so the directory opens as it was.
    b.flush().await.unwrap();
    drop((_l, b));
    let (_l, b) = idemraft_store::open(&path).unwrap();
    assert_eq!(b.digest().await.unwrap(), before);
}

fn bulk_claim(now_ms: u64, key: String, ttl_ms: u64) -> Command {
    Command {
        now_ms,
        op: Op::Claim {
            id: RecordKey::new("default", "bulk", key).unwrap(),
            fingerprint: None,
            owner: "w".into(),
            lease_ms: 1_000,
            ttl_ms,
            allow_takeover: false,
        },
    }
}

/// A snapshot built while apply keeps changing, creating and deleting records holds exactly
/// the state at its own last log id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_built_while_apply_runs_holds_exactly_the_state_at_its_index() {
    let t0 = 1_700_000_000_000u64;
    let entry = |index: u64, cmds: Vec<Command>| Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(CommandBatch(cmds)),
    };
    // 1..=600: 32 claims each; slot 0 of every entry lives only 1 s.
    let mut log: Vec<Entry> = (1..=600u64)
        .map(|i| {
            let cmds = (0..32u64)
                .map(|slot| {
                    bulk_claim(t0, format!("bulk-key-{i:06}-{slot:04}"), if slot == 0 { 1_000 } else { 86_400_000 })
                })
                .collect();
            entry(i, cmds)
        })
        .collect();
    // 601..=900: each changes records all over the key range while the build runs: completes
    // (new values), claims of new keys between existing ones, and sweeps of the short-lived
    // ones two seconds later (deletions).
    for i in 601..=900u64 {
        let now = t0 + 2_000 + i;
        let mut cmds = Vec::new();
        for j in 0..8u64 {
            let target = 1 + (i * 7 + j * 71) % 600;
            let slot = 1 + (i + j) % 31;
            let id = RecordKey::new("default", "bulk", format!("bulk-key-{target:06}-{slot:04}")).unwrap();
            cmds.push(Command {
                now_ms: now,
                op: Op::Complete {
                    id,
                    token: Token::new(target, slot as usize),
                    response: Response { status: 200, headers: vec![], body: i.to_le_bytes().to_vec() },
                },
            });
            cmds.push(bulk_claim(now, format!("bulk-key-{target:06}-{slot:04}-n{i}"), 86_400_000));
        }
        cmds.push(Command { now_ms: now, op: Op::Sweep { limit: 4 } });
        log.push(entry(i, cmds));
    }

    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    let (_la, mut a) = idemraft_store::open(&dirs[0].path().join("d")).unwrap();
    apply_in_groups(&mut a, &log[..600], 100).await;
    let mut builder = a.get_snapshot_builder().await;
    let build = tokio::spawn(async move { builder.build_snapshot().await.unwrap() });
    let mut applied_during_build = 0;
    for e in &log[600..] {
        a.apply(vec![e.clone()]).await.unwrap();
        if !build.is_finished() {
            applied_during_build += 1;
        }
    }
    let snap = build.await.unwrap();
    let at = snap.meta.last_log_id.unwrap().index;
    eprintln!("snapshot at index {at}; {applied_during_build} entries applied while it was being built");
    assert!(applied_during_build > 0, "apply must keep running while a snapshot builds");

    let (_lc, mut c) = idemraft_store::open(&dirs[1].path().join("d")).unwrap();
    let mut incoming = c.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ snap.snapshot }, &mut *incoming).await.unwrap();
    c.install_snapshot(&snap.meta, incoming).await.unwrap();
    assert_eq!(c.digest().await.unwrap(), mem_digest(&log[..at as usize]), "snapshot is not the state at {at}");
    // And the rest of the log on top of it gives the same state as the store that built it.
    apply_in_groups(&mut c, &log[at as usize..], 50).await;
    assert_eq!(c.digest().await.unwrap(), a.digest().await.unwrap());
}

fn open_err(path: &Path) -> String {
    match idemraft_store::open(path) {
        Ok(_) => panic!("{} opened, but it should have been refused", path.display()),
        Err(e) => {
            assert!(matches!(e, StoreError::DataDir { .. }), "{e:?}");
            e.to_string()
        }
    }
}

#[test]
fn a_foreign_newer_or_damaged_data_directory_is_refused_with_a_clear_error() {
    let dir = TempDir::new().unwrap();

    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("important.txt"), b"someone else's data").unwrap();
    let msg = open_err(&foreign);
    assert!(msg.contains(&foreign.display().to_string()) && msg.contains("no FORMAT file"), "{msg}");
    assert!(foreign.join("important.txt").exists(), "nothing of theirs was touched");

    let ours = dir.path().join("ours");
    drop(idemraft_store::open(&ours).unwrap());
    std::fs::write(ours.join("FORMAT"), b"idemraft-data-format 99\n").unwrap();
    let msg = open_err(&ours);
    assert!(msg.contains("data format 99") && msg.contains("this build reads format 2"), "{msg}");

    std::fs::write(ours.join("FORMAT"), b"\x00\x01garbage").unwrap();
    assert!(open_err(&ours).contains("FORMAT file is damaged"));

    std::fs::write(ours.join("FORMAT"), b"idemraft-data-format 2\n").unwrap();
    std::fs::rename(ours.join("log"), ours.join("log.away")).unwrap();
    assert!(open_err(&ours).contains("log/ directory is missing"));
    std::fs::rename(ours.join("log.away"), ours.join("log")).unwrap();
    std::fs::remove_dir_all(ours.join("db")).unwrap();
    assert!(open_err(&ours).contains("db/ directory is missing"));
}

/// Writes a format-1 data directory the way the sled log store of that release did: entries
/// in tree `log` under their big-endian index, vote / committed / purged in tree `raft`, and
/// applied state in tree `sm` through the state machine (whose layout did not change).
async fn write_format_1(path: &Path, log: &[Entry], purged: Option<LogId<u64>>, committed: LogId<u64>) {
    {
        // The state machine of format 1 is the one of format 2: apply through it, then turn
        // the directory back into format 1 by hand.
        let (_l, mut sm) = idemraft_store::open(path).unwrap();
        apply_in_groups(&mut sm, log, 16).await;
        sm.flush().await.unwrap();
    }
    std::fs::remove_dir_all(path.join("log")).unwrap();
    std::fs::write(path.join("FORMAT"), b"idemraft-data-format 1\n").unwrap();
    let db = raw_db(path);
    let tree = db.open_tree("log").unwrap();
    for e in log {
        tree.insert(e.log_id.index.to_be_bytes(), idemraft_store::codec::encode(e).unwrap()).unwrap();
    }
    let raft = db.open_tree("raft").unwrap();
    raft.insert("vote", idemraft_store::codec::encode(&openraft::Vote::new_committed(3u64, 2u64)).unwrap()).unwrap();
    raft.insert("committed", idemraft_store::codec::encode(&Some(committed)).unwrap()).unwrap();
    if let Some(p) = purged {
        raft.insert("purged", idemraft_store::codec::encode(&Some(p)).unwrap()).unwrap();
    }
    db.flush().unwrap();
}

#[tokio::test]
async fn a_format_1_directory_is_upgraded_once_keeping_every_entry_the_vote_and_the_state() {
    let log = make_log(21, 300);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    // Entries 1..=40 are below the purge point: an interrupted purge left them in the tree.
    write_format_1(&path, &log, Some(log[39].log_id), log[289].log_id).await;
    let digest = mem_digest(&log);

    // A previous attempt that stopped half way is discarded and redone.
    std::fs::create_dir_all(path.join("log.migrating")).unwrap();
    std::fs::write(path.join("log.migrating/00000000000000000001.seg"), b"half").unwrap();
    {
        let (mut l, mut sm) = idemraft_store::open(&path).unwrap();
        assert_eq!(std::fs::read_to_string(path.join("FORMAT")).unwrap(), "idemraft-data-format 2\n");
        assert!(path.join("log").is_dir() && !path.join("log.migrating").exists());
        let state = l.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log[39].log_id));
        assert_eq!(state.last_log_id, Some(log[299].log_id));
        let got = openraft::RaftLogReader::try_get_log_entries(&mut l, ..).await.unwrap();
        let enc = |v: &[Entry]| v.iter().map(|e| idemraft_store::codec::encode(e).unwrap()).collect::<Vec<_>>();
        assert_eq!(enc(&got), enc(&log[40..]));
        assert_eq!(l.read_vote().await.unwrap(), Some(openraft::Vote::new_committed(3, 2)));
        assert_eq!(l.read_committed().await.unwrap(), Some(log[289].log_id));
        assert_eq!(sm.digest().await.unwrap(), digest, "the state machine is untouched");
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log[299].log_id));
    }
    let db = raw_db(&path);
    let names: Vec<String> = db.tree_names().iter().map(|n| String::from_utf8_lossy(n).into_owned()).collect();
    assert!(!names.iter().any(|n| n == "log" || n == "raft"), "old trees dropped: {names:?}");
    // A crash after FORMAT was rewritten but before the trees were dropped: they go on open.
    db.open_tree("log").unwrap().insert(1u64.to_be_bytes(), b"stale".to_vec()).unwrap();
    db.flush().unwrap();
    drop(db);
    let (mut l, sm) = idemraft_store::open(&path).unwrap();
    assert_eq!(l.get_log_state().await.unwrap().last_log_id, Some(log[299].log_id));
    drop((l, sm));
    let db = raw_db(&path);
    assert!(!db.tree_names().iter().any(|n| n.as_ref() == b"log"));
}

#[tokio::test]
async fn a_format_1_directory_whose_migration_finished_but_was_not_recorded_is_migrated_again() {
    let log = make_log(22, 50);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    write_format_1(&path, &log, None, log[49].log_id).await;
    // A complete `log/` from a run that died before rewriting FORMAT; its contents are
    // rebuilt from the sled trees, which are still the truth.
    std::fs::create_dir_all(path.join("log")).unwrap();
    std::fs::write(path.join("log/meta"), b"whatever").unwrap();
    let (mut l, _sm) = idemraft_store::open(&path).unwrap();
    let got = openraft::RaftLogReader::try_get_log_entries(&mut l, ..).await.unwrap();
    assert_eq!(got.len(), 50);
    assert_eq!(l.read_vote().await.unwrap(), Some(openraft::Vote::new_committed(3, 2)));
}

#[test]
fn a_directory_in_use_is_refused_after_a_short_wait_and_opens_once_released() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    let held = idemraft_store::open(&path).unwrap();
    let msg = open_err(&path);
    assert!(msg.contains(&path.display().to_string()) && msg.contains("another process holds its lock"), "{msg}");
    drop(held);
    // Released in place (a restart inside one process): the next open waits out sled's
    // flusher thread instead of failing.
    drop(idemraft_store::open(&path).unwrap());
}

#[tokio::test]
async fn a_damaged_record_is_refused_at_open_instead_of_being_skipped() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    let log = make_log(11, 20);
    {
        let (_l, mut sm) = idemraft_store::open(&path).unwrap();
        apply_in_groups(&mut sm, &log, 20).await;
        sm.flush().await.unwrap();
    }
    // Damage every stored record in place through sled itself.
    {
        let db = raw_db(&path);
        let sm = db.open_tree("sm").unwrap();
        for kv in sm.scan_prefix(b"r") {
            let (k, _) = kv.unwrap();
            sm.insert(k, &b"\xff\xff"[..]).unwrap();
        }
        db.flush().unwrap();
    }
    let msg = open_err(&path);
    assert!(msg.contains("its stored state is damaged (corrupt record"), "{msg}");
}

fn model_counts(state: &MemState) -> idemraft_store::RecordCounts {
    use idemraft_store::RecordState;
    let mut c = idemraft_store::RecordCounts::default();
    for (_, r) in state.records() {
        match r.state {
            RecordState::InProgress => c.in_progress += 1,
            RecordState::Completed => c.completed += 1,
            RecordState::Failed => c.failed += 1,
        }
    }
    c
}

#[tokio::test]
async fn record_counts_by_state_follow_every_apply_and_survive_reopening() {
    let log = make_log(0x1DE7_0C01, 200);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    let expected = {
        let (_, mut sm) = idemraft_store::open(&path).unwrap();
        // Check after each group, not only at the end: sweeps, fails and takeovers move
        // records between states along the way.
        for (i, chunk) in log.chunks(10).enumerate() {
            sm.apply(chunk.to_vec()).await.unwrap();
            let want = model_counts(&mem_state(&log[..((i + 1) * 10).min(log.len())]));
            let got = sm.record_counts();
            assert_eq!(got, want, "after {} entries", (i + 1) * 10);
            assert_eq!(got.in_progress + got.completed + got.failed, sm.record_count() as u64);
        }
        sm.flush().await.unwrap();
        sm.record_counts()
    };
    assert!(expected.in_progress > 0 && expected.completed > 0, "the log exercises several states: {expected:?}");
    let (_, sm) = idemraft_store::open(&path).unwrap();
    assert_eq!(sm.record_counts(), expected, "rebuilt from the records on open");
}

/// The sled store's quota report, built from the in-memory reference state instead.
fn model_report(state: &MemState) -> idemraft_store::QuotaReport {
    use idemraft_store::machine::StateStore;
    let q = state.quotas();
    let names: std::collections::BTreeSet<&String> = state.tenant_counts().keys().chain(q.tenants.keys()).collect();
    let tenants = names
        .into_iter()
        .map(|t| idemraft_store::QuotaUsage {
            tenant: t.clone(),
            records: state.tenant_counts().get(t).copied().unwrap_or(0),
            limit: q.limit_for(t),
            own: q.tenants.contains_key(t),
        })
        .collect();
    idemraft_store::QuotaReport { default: q.default, tenants }
}

fn snapshot_format(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

#[tokio::test]
async fn quotas_and_tenant_counts_follow_the_log_survive_reopening_and_travel_in_snapshots() {
    let log = make_log(0x1DE7_0A07, 300);
    let mut replay = MemState::new();
    let mut refused = 0;
    for e in &log {
        if let EntryPayload::Normal(b) = &e.payload {
            let outs = apply_batch(&mut replay, e.log_id.index, &b.0).unwrap();
            refused += outs.iter().filter(|o| matches!(o, Outcome::QuotaExceeded { .. })).count();
        }
    }
    let model = mem_state(&log);
    let want = model_report(&model);
    assert!(!want.tenants.is_empty() && refused > 0, "the seeded log meets full quotas ({refused} refusals)");
    let dirs: Vec<TempDir> = (0..2).map(|_| TempDir::new().unwrap()).collect();
    let path = dirs[0].path().join("d");
    let snap = {
        let (_, mut sm) = idemraft_store::open(&path).unwrap();
        for (i, chunk) in log.chunks(25).enumerate() {
            sm.apply(chunk.to_vec()).await.unwrap();
            let upto = ((i + 1) * 25).min(log.len());
            assert_eq!(sm.quota_report(None).await, model_report(&mem_state(&log[..upto])), "after {upto} entries");
        }
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        sm.flush().await.unwrap();
        snap
    };
    let (_, sm) = idemraft_store::open(&path).unwrap();
    assert_eq!(sm.quota_report(None).await, want, "counts rebuilt from the records and quotas read back on open");
    assert_eq!(sm.digest().await.unwrap(), model.digest());

    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut *{ snap.snapshot }, &mut bytes).await.unwrap();
    let quotas_set = {
        use idemraft_store::machine::StateStore;
        !model.quotas().is_empty()
    };
    assert!(quotas_set, "the seeded log leaves a quota set");
    assert_eq!(snapshot_format(&bytes), 2, "a snapshot with quotas is format 2");
    let (_, mut other) = idemraft_store::open(&dirs[1].path().join("d")).unwrap();
    let mut incoming = other.begin_receiving_snapshot().await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut *incoming, &bytes).await.unwrap();
    other.install_snapshot(&snap.meta, incoming).await.unwrap();
    assert_eq!(other.quota_report(None).await, want, "quotas and counts after a snapshot install");
    assert_eq!(other.digest().await.unwrap(), model.digest());
    assert_eq!(
        other.quota_report(Some("nobody")).await.tenants,
        vec![idemraft_store::QuotaUsage { tenant: "nobody".into(), records: 0, limit: want.default, own: false }]
    );
}

#[tokio::test]
async fn a_state_without_quotas_is_snapshotted_in_format_1_and_digested_as_before() {
    // No SetQuota: the snapshot must stay readable by the previous release.
    let log: Vec<Entry> = make_log(0x1DE7_0A08, 120)
        .into_iter()
        .map(|mut e| {
            if let EntryPayload::Normal(b) = &mut e.payload {
                b.0.retain(|c| !matches!(c.op, Op::SetQuota { .. }));
            }
            e
        })
        .collect();
    let dir = TempDir::new().unwrap();
    let (_, mut sm) = idemraft_store::open(&dir.path().join("d")).unwrap();
    apply_in_groups(&mut sm, &log, 30).await;
    let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut *{ snap.snapshot }, &mut bytes).await.unwrap();
    assert_eq!(snapshot_format(&bytes), 1);
    // The digest of the previous release: clock and records only.
    let model = mem_state(&log);
    let mut d = idemraft_store::StateDigest::new(idemraft_store::machine::StateStore::clock(&model));
    for (id, rec) in model.records() {
        d.add(id, rec);
    }
    assert_eq!(sm.digest().await.unwrap(), d.finish());
}

#[derive(Default)]
struct Seen {
    fsyncs: std::sync::atomic::AtomicU64,
    committed: std::sync::atomic::AtomicU64,
}

impl idemraft_store::LogObserver for Seen {
    fn append_fsynced(&self, _elapsed: std::time::Duration) {
        self.fsyncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn committed(&self, index: u64) {
        self.committed.store(index, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test]
async fn the_log_observer_sees_each_append_fsync_and_the_committed_index() {
    use std::sync::atomic::Ordering::Relaxed;
    let log = make_log(11, 30);
    let dir = TempDir::new().unwrap();
    let (l, _sm) = idemraft_store::open(&dir.path().join("d")).unwrap();
    let seen = std::sync::Arc::new(Seen::default());
    let mut l = l.with_observer(seen.clone());
    for chunk in log.chunks(10) {
        l.append_durably(chunk.to_vec()).await.unwrap();
    }
    assert_eq!(seen.fsyncs.load(Relaxed), 3, "one fsync per append");
    l.save_committed(Some(log[24].log_id)).await.unwrap();
    assert_eq!(seen.committed.load(Relaxed), 25);
    // A clone (the log reader openraft takes) reports to the same observer.
    let mut reader = l.clone();
    reader.save_committed(Some(log[29].log_id)).await.unwrap();
    assert_eq!(seen.committed.load(Relaxed), 30);
}

/// A List page over many large records stays within the page's byte bound, and paging with
/// `next_after` returns every record exactly once, in key order, on the sled store and the
/// in-memory one alike.
#[tokio::test]
async fn list_pages_are_bounded_in_bytes_and_paging_returns_every_record_once() {
    use idemraft_store::{ListQuery, LIST_PAGE_BYTES};
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = idemraft_store::open(&dir.path().join("d")).unwrap();
    let mut mem = idemraft_store::MemStateMachine::new();
    let t0 = 1_700_000_000_000u64;
    let limits = idemraft_store::Limits::DEFAULT;
    let id = |i: u64| RecordKey::new("default", "big", format!("order-{i:016}")).unwrap();
    let entry = |index: u64, cmds: Vec<Command>| Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(CommandBatch(cmds)),
    };
    // 60 records, every third a small one; the others as large as the default limits allow:
    // a 256 KiB body, 8 KiB of headers, 64 KiB of checkpoint and a full recovery point.
    // Together about 14 MiB, well past the 8 MiB a client message may carry.
    let total = 60u64;
    let mut log = Vec::new();
    for i in 0..total {
        let base = 1 + i * 3;
        let claim = Op::Claim {
            id: id(i),
            fingerprint: None,
            owner: "w".into(),
            lease_ms: 60_000,
            ttl_ms: 86_400_000,
            allow_takeover: false,
        };
        log.push(entry(base, vec![Command { now_ms: t0, op: claim }]));
        let token = Token::new(base, 0);
        let large = i % 3 != 0;
        let checkpoint = Op::Checkpoint {
            id: id(i),
            token,
            recovery_point: if large { "p".repeat(limits.recovery_point_max_bytes) } else { "step-1".into() },
            data: if large { vec![7; limits.checkpoint_max_bytes] } else { vec![7; 10] },
            lease_ms: 60_000,
        };
        log.push(entry(base + 1, vec![Command { now_ms: t0 + 1, op: checkpoint }]));
        let header_value = "v".repeat(limits.headers_max_bytes / limits.headers_max_count - 8);
        let response = Response {
            status: 200,
            headers: if large {
                (0..limits.headers_max_count).map(|h| (format!("x-h{h:04}"), header_value.clone())).collect()
            } else {
                vec![]
            },
            body: if large { vec![1; limits.body_max_bytes] } else { b"ok".to_vec() },
        };
        log.push(entry(base + 2, vec![Command { now_ms: t0 + 2, op: Op::Complete { id: id(i), token, response } }]));
    }
    for e in &log {
        let outcomes = sm.apply(vec![e.clone()]).await.unwrap();
        assert!(
            outcomes[0].0.iter().all(|o| !matches!(o, Outcome::Invalid(_))),
            "{:?} refused: {outcomes:?}",
            e.log_id
        );
    }
    apply_in_groups_mem(&mut mem, &log).await;

    let mut seen = Vec::new();
    let mut pages = 0;
    let mut after = None;
    loop {
        let q = ListQuery { tenant: "default".into(), limit: 1_000, start_after: after.clone(), ..Default::default() };
        let page = sm.list(&q).await.unwrap();
        assert_eq!(page, mem.list(&q), "sled and memory pages differ");
        let bytes: usize = page.records.iter().map(|v| v.encoded_len_bound()).sum();
        assert!(bytes <= LIST_PAGE_BYTES, "page {pages}: {bytes} bytes");
        assert!(!page.records.is_empty(), "page {pages} is empty");
        assert!(page.records.iter().all(|v| v.record.response.is_some()), "a record came back without its response");
        pages += 1;
        seen.extend(page.records.iter().map(|v| v.id.clone()));
        match page.next_after {
            Some(next) => {
                assert_eq!(Some(&next), page.records.last().map(|v| &v.id));
                after = Some(next);
            }
            None => break,
        }
    }
    assert_eq!(seen, (0..total).map(id).collect::<Vec<_>>(), "each record exactly once, in key order");
    assert!(pages >= 4, "{pages} pages for about 14 MiB of records");
}

/// Every blob file under a data directory's `blobs/`.
fn blob_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            out.push(f.unwrap().path());
        }
    }
    out.sort();
    out
}

fn normal(index: u64, cmds: Vec<Command>) -> Entry {
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(CommandBatch(cmds)) }
}

/// Large bodies in blob files of their own, as releases before packs took every size wrote
/// them: replays read them back byte for byte, a snapshot links them (no second copy) and
/// carries them to another store, expiry deletes them, and a blob damaged at rest is refused
/// with an error naming its file.
#[tokio::test]
async fn large_bodies_in_blob_files_are_linked_by_snapshots_and_freed_by_expiry() {
    let t0 = 1_700_000_000_000u64;
    let body = |i: usize| -> Vec<u8> { (0..100 * 1024).map(|b| (b * 7 + i) as u8).collect() };
    let keys: Vec<String> = (0..4).map(|i| format!("large-body-{i:08}")).collect();
    let id = |k: &String| RecordKey::new("default", "bulk", k.clone()).unwrap();
    let mut log = vec![Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
        payload: EntryPayload::Membership(Membership::new(vec![[1u64].into_iter().collect()], None)),
    }];
    log.push(normal(2, keys.iter().map(|k| bulk_claim(t0, k.clone(), 60_000)).collect()));
    log.push(normal(
        3,
        keys.iter()
            .enumerate()
            .map(|(i, k)| Command {
                now_ms: t0 + 10,
                op: Op::Complete {
                    id: id(k),
                    token: Token::new(2, i),
                    response: Response { status: 201, headers: vec![], body: body(i) },
                },
            })
            .collect(),
    ));
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("a");
    let files_from = idemraft_store::OpenOptions { files_from: Some(64 * 1024), ..Default::default() };
    let (_l, mut a) = idemraft_store::open_with_options(&path, &files_from).unwrap();
    a.apply(log.clone()).await.unwrap();
    let files = blob_files(&path.join("blobs"));
    assert_eq!(files.len(), 4, "one blob file per large body");
    assert!(files.iter().all(|f| std::fs::metadata(f).unwrap().len() == 100 * 1024));
    for (i, k) in keys.iter().enumerate() {
        let view = a.get(&id(k)).await.unwrap().unwrap();
        assert_eq!(view.record.response.unwrap().body, body(i), "replay of {k}");
    }
    assert_eq!(a.digest().await.unwrap(), mem_digest(&log), "the digest sees whole records");

    // A snapshot links the blobs: the same inodes, no copy.
    let snap = a.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let links: Vec<_> = std::fs::read_dir(path.join("snapshots").join(format!("{}.blobs", snap.meta.snapshot_id)))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(links.len(), 4);
    use std::os::unix::fs::MetadataExt;
    assert!(links.iter().all(|l| std::fs::metadata(l).unwrap().nlink() == 2), "hard links, not copies");

    // It travels to another sled store and to a memory store with every body.
    let other = dir.path().join("b");
    let (_l2, mut b) = idemraft_store::open(&other).unwrap();
    let current = a.get_current_snapshot().await.unwrap().unwrap();
    assert!(matches!(*current.snapshot, idemraft_store::SnapshotData::Blobs(_)));
    let mut incoming = b.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ current.snapshot }, &mut *incoming).await.unwrap();
    b.install_snapshot(&current.meta, incoming).await.unwrap();
    assert_eq!(b.digest().await.unwrap(), a.digest().await.unwrap());
    assert_eq!(blob_files(&other.join("blobs")).len(), 4);
    let mut mem = idemraft_store::MemStateMachine::new();
    let current = a.get_current_snapshot().await.unwrap().unwrap();
    let mut incoming = mem.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ current.snapshot }, &mut *incoming).await.unwrap();
    mem.install_snapshot(&current.meta, incoming).await.unwrap();
    assert_eq!(mem.digest(), a.digest().await.unwrap());

    // Expiry gives the space back; the snapshot keeps its own links.
    a.apply(vec![normal(4, vec![Command { now_ms: t0 + 120_000, op: Op::Sweep { limit: 100 } }])]).await.unwrap();
    assert_eq!(blob_files(&path.join("blobs")).len(), 0, "swept records leave no blob behind");
    assert!(links.iter().all(|l| std::fs::metadata(l).unwrap().nlink() == 1));

    // A blob damaged at rest is never served.
    let victim = &blob_files(&other.join("blobs"))[0];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[500] ^= 0x40;
    std::fs::write(victim, bytes).unwrap();
    let err = b.digest().await.unwrap_err().to_string();
    assert!(err.contains("blob file") && err.contains("damaged"), "{err}");
    assert!(err.contains(&victim.display().to_string()), "names the file: {err}");
}

/// A one-voter log that claims `keys` at `t0` (even ones expiring after a minute, odd ones
/// after ten) and completes each with `body(i)`, one complete per entry, as a lone client's
/// would arrive.
fn half_expiring_completions(t0: u64, keys: &[String], body: impl Fn(usize) -> Vec<u8>) -> Vec<Entry> {
    let mut log = vec![Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
        payload: EntryPayload::Membership(Membership::new(vec![[1u64].into_iter().collect()], None)),
    }];
    let ttl = |i: usize| if i % 2 == 0 { 60_000 } else { 600_000 };
    log.push(normal(2, keys.iter().enumerate().map(|(i, k)| bulk_claim(t0, k.clone(), ttl(i))).collect()));
    for (i, k) in keys.iter().enumerate() {
        let complete = Op::Complete {
            id: RecordKey::new("default", "bulk", k.clone()).unwrap(),
            token: Token::new(2, i),
            response: Response { status: 200, headers: vec![], body: body(i) },
        };
        log.push(normal(3 + i as u64, vec![Command { now_ms: t0 + 10, op: complete }]));
    }
    log
}

/// Mid-sized bodies share packs: a pack is one file for many bodies, a snapshot seals and
/// links it, expiry that leaves it less than half live gets it compacted (its live bodies
/// moved, the file deleted) by the applies that follow, and every body still replays byte for
/// byte, after a clean reopen and after a crash too. A pack damaged at rest is refused.
#[tokio::test]
async fn mid_sized_bodies_share_packs_that_snapshots_link_and_compaction_shrinks() {
    let t0 = 1_700_000_000_000u64;
    let body = |i: usize| -> Vec<u8> { (0..1024 + i % 7).map(|b| (b * 13 + i) as u8).collect() };
    let keys: Vec<String> = (0..200).map(|i| format!("packed-body-{i:08}")).collect();
    let id = |k: &String| RecordKey::new("default", "bulk", k.clone()).unwrap();
    let mut log = half_expiring_completions(t0, &keys, body);
    let sweep = |index: u64, at: u64| normal(index, vec![Command { now_ms: at, op: Op::Sweep { limit: 1_000 } }]);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("a");
    let (_l, mut a) = idemraft_store::open(&path).unwrap();
    a.apply(log.clone()).await.unwrap();
    let files = blob_files(&path.join("blobs"));
    assert_eq!(files.len(), 1, "one pack for 200 mid-sized bodies: {files:?}");
    let pack_len = std::fs::metadata(&files[0]).unwrap().len();
    let payload: u64 = (0..200).map(|i| body(i).len() as u64).sum();
    assert!(pack_len > payload && pack_len < payload + 200 * 64, "{pack_len} bytes of pack for {payload} of bodies");
    for (i, k) in keys.iter().enumerate().step_by(17) {
        assert_eq!(a.get(&id(k)).await.unwrap().unwrap().record.response.unwrap().body, body(i), "replay of {k}");
    }

    // The snapshot seals the pack and links it; it travels to a sled and a memory store.
    let snap = a.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let links = path.join("snapshots").join(format!("{}.blobs", snap.meta.snapshot_id));
    assert_eq!(std::fs::read_dir(&links).unwrap().count(), 1, "a pack is linked once");
    let current = a.get_current_snapshot().await.unwrap().unwrap();
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut *{ current.snapshot }, &mut bytes).await.unwrap();
    assert_eq!(snapshot_format(&bytes), 4, "packed stubs are format 4");
    let (_l2, mut b) = idemraft_store::open(&dir.path().join("b")).unwrap();
    let mut mem = idemraft_store::MemStateMachine::new();
    for target in [&mut b as &mut dyn std::any::Any, &mut mem] {
        let current = a.get_current_snapshot().await.unwrap().unwrap();
        if let Some(b) = target.downcast_mut::<StateMachineStore>() {
            let mut incoming = b.begin_receiving_snapshot().await.unwrap();
            tokio::io::copy(&mut *{ current.snapshot }, &mut *incoming).await.unwrap();
            b.install_snapshot(&current.meta, incoming).await.unwrap();
        } else if let Some(m) = target.downcast_mut::<idemraft_store::MemStateMachine>() {
            let mut incoming = m.begin_receiving_snapshot().await.unwrap();
            tokio::io::copy(&mut *{ current.snapshot }, &mut *incoming).await.unwrap();
            m.install_snapshot(&current.meta, incoming).await.unwrap();
        }
    }
    let want = mem_digest(&log);
    assert_eq!(a.digest().await.unwrap(), want);
    assert_eq!(b.digest().await.unwrap(), want);
    assert_eq!(mem.digest(), want);

    // Half the bodies expire: the pack is less than half live, and the next applies move the
    // other half to a new pack and delete the old one (the snapshot keeps its own link).
    let mut more = vec![sweep(203, t0 + 120_000)];
    more.extend((204..208).map(|i| sweep(i, t0 + 120_000 + i)));
    a.apply(more.clone()).await.unwrap();
    log.extend(more);
    let after = blob_files(&path.join("blobs"));
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after, files, "the sparse pack was replaced");
    let new_len = std::fs::metadata(&after[0]).unwrap().len();
    assert!(new_len < pack_len / 2 + 100 * 64, "{new_len} bytes left of {pack_len}");
    for (i, k) in keys.iter().enumerate() {
        let got = a.get(&id(k)).await.unwrap();
        if i % 2 == 0 {
            assert!(got.is_none(), "{k} expired");
        } else {
            assert_eq!(got.unwrap().record.response.unwrap().body, body(i), "replay of {k} after compaction");
        }
    }
    let want = mem_digest(&log);
    assert_eq!(a.digest().await.unwrap(), want);

    // A crash (no clean mark) restarts from the snapshot, whose pack is still linked, and the
    // log completes it; a clean reopen keeps the compacted pack.
    drop((_l, a));
    let (_l, mut a) = idemraft_store::open(&path).unwrap();
    let applied = a.applied_state().await.unwrap().0.unwrap().index as usize;
    a.apply(log[applied..].to_vec()).await.unwrap();
    assert_eq!(a.digest().await.unwrap(), want, "after a crash");
    a.flush().await.unwrap();
    drop((_l, a));
    let (_l, a) = idemraft_store::open(&path).unwrap();
    assert_eq!(a.digest().await.unwrap(), want, "after a clean reopen");

    // Everything expires: no pack is left.
    let mut a = a;
    a.apply(vec![sweep(log.len() as u64 + 1, t0 + 1_200_000)]).await.unwrap();
    assert_eq!(blob_files(&path.join("blobs")).len(), 0, "swept records leave no pack behind");

    // A pack damaged at rest is never served.
    let victim = &blob_files(&dir.path().join("b").join("blobs"))[0];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[700] ^= 0x40;
    std::fs::write(victim, bytes).unwrap();
    let err = b.digest().await.unwrap_err().to_string();
    assert!(err.contains("pack") && err.contains("damaged"), "{err}");
    assert!(err.contains(&victim.display().to_string()), "names the file: {err}");
}

/// Blocks a file holds on disk.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// Whether the file system under `dir` frees the blocks of a punched hole, asked as the store
/// asks it.
fn punches_holes(dir: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let path = dir.join("probe");
    let f = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all_at(&[1u8; 16 * 1024], 0).unwrap();
    f.sync_data().unwrap();
    let before = allocated(&path);
    let flags = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
    let ok = nix::fcntl::fallocate(&f, flags, 4096, 8192).is_ok() && allocated(&path) < before;
    std::fs::remove_file(&path).unwrap();
    ok
}

/// Large bodies share packs too, and a released one is punched out of its pack instead of
/// being copied away by compaction, but only once no snapshot on disk can name it: not while
/// the snapshot captured before its release is current, nor while that one is still being
/// sent after a newer build. Every snapshot on the way carries whole bodies, the live bodies
/// replay byte for byte, and the punched pack is not compacted, before or after a reopen.
#[tokio::test]
async fn released_large_bodies_are_punched_out_once_no_snapshot_names_them() {
    let t0 = 1_700_000_000_000u64;
    let body = |i: usize| -> Vec<u8> { (0..64 * 1024).map(|b| (b * 31 + i * 7) as u8).collect() };
    let keys: Vec<String> = (0..16).map(|i| format!("large-body-{i:08}")).collect();
    let id = |k: &String| RecordKey::new("default", "bulk", k.clone()).unwrap();
    let mut log = half_expiring_completions(t0, &keys, body);
    let sweep = |index: u64, at: u64| normal(index, vec![Command { now_ms: at, op: Op::Sweep { limit: 1_000 } }]);
    let dir = TempDir::new().unwrap();
    let punches = punches_holes(dir.path());
    let path = dir.path().join("a");
    let (_l, mut a) = idemraft_store::open(&path).unwrap();
    a.apply(log.clone()).await.unwrap();
    let files = blob_files(&path.join("blobs"));
    assert_eq!(files.len(), 1, "16 bodies of 64 KiB share one pack: {files:?}");
    let pack = files[0].clone();
    let full = allocated(&pack);
    assert!(full >= 16 * 64 * 1024, "{full}");
    let whole = mem_digest(&log);

    // The first snapshot seals and links the pack; then half the bodies expire.
    drop(a.get_snapshot_builder().await.build_snapshot().await.unwrap());
    let more = vec![sweep(19, t0 + 120_000)];
    a.apply(more.clone()).await.unwrap();
    log.extend(more);
    assert_eq!(allocated(&pack), full, "the current snapshot names the released bodies");

    // While that snapshot is still being sent, a newer build punches nothing.
    let sending = a.get_current_snapshot().await.unwrap().unwrap();
    let more = vec![sweep(20, t0 + 120_001)];
    a.apply(more.clone()).await.unwrap();
    log.extend(more);
    drop(a.get_snapshot_builder().await.build_snapshot().await.unwrap());
    assert_eq!(allocated(&pack), full, "a snapshot being sent names the released bodies");
    let (_lb, mut b) = idemraft_store::open(&dir.path().join("b")).unwrap();
    let mut incoming = b.begin_receiving_snapshot().await.unwrap();
    let sent_meta = sending.meta.clone();
    tokio::io::copy(&mut *{ sending.snapshot }, &mut *incoming).await.unwrap();
    b.install_snapshot(&sent_meta, incoming).await.unwrap();
    assert_eq!(b.digest().await.unwrap(), whole, "the older snapshot arrived with every body whole");

    // The next build, with no older snapshot left, punches them out.
    let more = vec![sweep(21, t0 + 120_002)];
    a.apply(more.clone()).await.unwrap();
    log.extend(more);
    drop(a.get_snapshot_builder().await.build_snapshot().await.unwrap());
    let after = allocated(&pack);
    if punches {
        // Each released body gives back the whole blocks inside it: 14 or 15 of the 16 it
        // touches, as it lies across them.
        assert!(after <= full - 8 * 14 * 4096, "{after} bytes still allocated of {full}");
    } else {
        println!("this file system does not punch holes: the released bodies stay allocated");
        assert_eq!(after, full);
    }
    let want = mem_digest(&log);
    assert_eq!(a.digest().await.unwrap(), want);
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
        assert_eq!(a.get(&id(k)).await.unwrap().unwrap().record.response.unwrap().body, body(i), "replay of {k}");
    }
    let (_lc, mut c) = idemraft_store::open(&dir.path().join("c")).unwrap();
    let current = a.get_current_snapshot().await.unwrap().unwrap();
    let mut incoming = c.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ current.snapshot }, &mut *incoming).await.unwrap();
    c.install_snapshot(&current.meta, incoming).await.unwrap();
    assert_eq!(c.digest().await.unwrap(), want, "the punched pack travels with its live bodies whole");

    // Half live by its length, but not by its blocks: the applies that follow leave it be, and
    // so do they after a clean reopen, which reads the holes off the file.
    let more: Vec<Entry> = (22..26).map(|i| sweep(i, t0 + 120_000 + i)).collect();
    a.apply(more.clone()).await.unwrap();
    log.extend(more);
    assert_eq!(blob_files(&path.join("blobs")), files, "a punched pack is not compacted");
    a.flush().await.unwrap();
    drop((_l, a));
    let (_l, mut a) = idemraft_store::open(&path).unwrap();
    let more: Vec<Entry> = (26..30).map(|i| sweep(i, t0 + 120_000 + i)).collect();
    a.apply(more.clone()).await.unwrap();
    log.extend(more);
    let kept = blob_files(&path.join("blobs"));
    if punches {
        assert_eq!(kept, files, "nor after a reopen");
    }
    assert_eq!(a.digest().await.unwrap(), mem_digest(&log), "after a clean reopen");
}

/// A pack whose every body is released while it is still open (the records expired before
/// any snapshot sealed it) is deleted when it is sealed, by a snapshot build or by filling up:
/// a release leaves an open pack alone, so nothing else would ever delete it.
#[tokio::test]
async fn a_pack_emptied_while_open_is_deleted_once_sealed() {
    let t0 = 1_700_000_000_000u64;
    let id = |k: &String| RecordKey::new("default", "bulk", k.clone()).unwrap();
    let membership = Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), 1),
        payload: EntryPayload::Membership(Membership::new(vec![[1u64].into_iter().collect()], None)),
    };
    // Claims expiring after a minute, their completes (bodies of `len` bytes: packed), and a
    // sweep two minutes later, from log index `first`.
    let round = |first: u64, at: u64, keys: &[String], len: usize| -> Vec<Entry> {
        let mut cmds: Vec<Command> = keys.iter().map(|k| bulk_claim(at, k.clone(), 60_000)).collect();
        cmds.extend(keys.iter().enumerate().map(|(i, k)| Command {
            now_ms: at + 10,
            op: Op::Complete {
                id: id(k),
                token: Token::new(first, i),
                response: Response { status: 200, headers: vec![], body: vec![i as u8; len] },
            },
        }));
        vec![
            normal(first, cmds),
            normal(first + 1, vec![Command { now_ms: at + 120_000, op: Op::Sweep { limit: 10_000 } }]),
        ]
    };
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("a");
    let (_l, mut a) = idemraft_store::open(&path).unwrap();

    // Sealed by a snapshot build.
    let keys: Vec<String> = (0..20).map(|i| format!("short-lived-{i:04}")).collect();
    let mut log = vec![membership];
    log.extend(round(2, t0, &keys, 1024));
    // One apply call writes each record's last state only: the sweep goes on its own.
    a.apply(log[..2].to_vec()).await.unwrap();
    a.apply(log[2..].to_vec()).await.unwrap();
    assert_eq!(blob_files(&path.join("blobs")).len(), 1, "the open pack stays while it is appended to");
    a.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert_eq!(blob_files(&path.join("blobs")), Vec::<std::path::PathBuf>::new(), "the emptied pack was deleted");

    // Sealed by filling up: 3 KiB bodies until the open pack holds 4 MiB, all expire, and the
    // next body seals the full, empty pack and starts a new one.
    let mut index = 4;
    let pack_bytes =
        |path: &Path| blob_files(&path.join("blobs")).iter().map(|f| std::fs::metadata(f).unwrap().len()).sum::<u64>();
    while pack_bytes(&path) < 4 * 1024 * 1024 {
        let more = round(index, t0 + 200_000 + index, &[format!("filler-body-{index:08}")], 3 * 1024);
        a.apply(more[..1].to_vec()).await.unwrap();
        log.extend_from_slice(&more[..1]);
        index += 1;
    }
    assert_eq!(blob_files(&path.join("blobs")).len(), 1, "one full pack");
    let sweep = normal(index, vec![Command { now_ms: t0 + 400_000, op: Op::Sweep { limit: 10_000 } }]);
    a.apply(vec![sweep.clone()]).await.unwrap();
    log.push(sweep);
    let full = blob_files(&path.join("blobs"));
    assert_eq!(full.len(), 1, "a release leaves the open pack alone");
    let last = vec!["the-last-one-body".to_string()];
    let more = round(index + 1, t0 + 400_000, &last, 1024);
    a.apply(more[..1].to_vec()).await.unwrap();
    log.extend_from_slice(&more[..1]);
    let left = blob_files(&path.join("blobs"));
    assert_eq!(left.len(), 1, "only the new pack is left: {left:?}");
    assert_ne!(left, full, "the full pack was deleted");
    assert!(pack_bytes(&path) < 2 * 1024, "one body in the new pack: {} bytes", pack_bytes(&path));
    assert_eq!(a.get(&id(&last[0])).await.unwrap().unwrap().record.response.unwrap().body, vec![0u8; 1024]);
    assert_eq!(a.digest().await.unwrap(), mem_digest(&log));
}

/// Without a clean shutdown the blob directory is put back to the snapshot's blobs, and the
/// log re-applies the rest: the state, bodies included, is the one the whole log gives.
#[tokio::test]
async fn after_a_crash_the_blob_directory_is_reconciled_with_the_snapshot() {
    let log = make_log(57, 160);
    let want = mem_digest(&log);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    {
        let (_l, mut sm) = idemraft_store::open(&path).unwrap();
        apply_in_groups(&mut sm, &log[..80], 7).await;
        sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        apply_in_groups(&mut sm, &log[80..130], 7).await;
        // A stray file a crash left half-written, under a name no record uses.
        std::fs::write(path.join("blobs/00/00000000ffffff00-00000000"), b"torn").unwrap();
    }
    let (_l, mut sm) = idemraft_store::open(&path).unwrap();
    assert!(!path.join("blobs/00/00000000ffffff00-00000000").exists(), "unnamed blobs are removed");
    let applied = sm.applied_state().await.unwrap().0.unwrap().index as usize;
    apply_in_groups(&mut sm, &log[applied..], 7).await;
    assert_eq!(sm.digest().await.unwrap(), want);
    sm.flush().await.unwrap();
    drop((_l, sm));
    let (_l, sm) = idemraft_store::open(&path).unwrap();
    assert_eq!(sm.digest().await.unwrap(), want, "a clean reopen keeps every blob");
}

/// A snapshot being streamed (to a lagging follower, or as a backup) keeps its files while a
/// newer snapshot replaces it; they go once the stream is closed and a later snapshot tidies up.
#[tokio::test]
async fn a_snapshot_stream_outlives_the_snapshot_a_newer_one_replaces() {
    let log = make_log(61, 200);
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("d");
    let (_l, mut sm) = idemraft_store::open(&path).unwrap();
    apply_in_groups(&mut sm, &log[..100], 10).await;
    let first = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert!(matches!(*first.snapshot, idemraft_store::SnapshotData::Blobs(_)), "the log holds large bodies");
    let sending = sm.get_current_snapshot().await.unwrap().unwrap();
    apply_in_groups(&mut sm, &log[100..], 10).await;
    sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let old_file = path.join("snapshots").join(format!("{}.snap", first.meta.snapshot_id));
    assert!(old_file.exists(), "kept while a stream reads it");

    let (_l2, mut other) = idemraft_store::open(&dir.path().join("e")).unwrap();
    let mut incoming = other.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *{ sending.snapshot }, &mut *incoming).await.unwrap();
    other.install_snapshot(&sending.meta, incoming).await.unwrap();
    assert_eq!(other.digest().await.unwrap(), mem_digest(&log[..100]));

    drop(first);
    sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert!(!old_file.exists(), "removed once no stream reads it");
}
