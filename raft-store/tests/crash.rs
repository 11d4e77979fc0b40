//! Crash durability of the sled stores with real processes and SIGKILL.
//!
//! The parent test (`acknowledged_entries_survive_sigkill`) re-executes this test binary as a
//! child process running only `crash_child_process_entry_point`. The child opens the data
//! directory, catches the state machine up with the log the way openraft does at start, then
//! appends batches of entries with `append_durably`, calls `save_committed` and `apply`, and
//! only after both prints `ACK <index>` for each entry of the batch. The parent kills it with
//! SIGKILL a random 5–150 ms after its first ACK, reopens the directory itself and checks:
//!
//! * every acknowledged index is in the log, and every entry of the log holds exactly the
//!   payload that the seed prescribes for its index (the parent recomputes entries from
//!   `(seed, index)`; it never relies on the child's memory);
//! * after re-applying `(applied, last log index]` (what openraft does at start; in this
//!   single-node setting the whole log is committed), every claim, complete and fail of the
//!   log has its effect: long-lived keys read back with the granted token, state and response;
//! * the state digest equals that of an in-memory [`MemState`] fed the same log from index 1.
//!
//! Then the next child continues on the same directory from where the log ends.
//!
//! `acknowledged_entries_survive_power_loss` runs the same rounds on a `lazyfs` mount, with
//! children that also build a snapshot every [`SNAPSHOT_EVERY`] entries (a build deletes the
//! one before it), and after each SIGKILL drops everything the child wrote but never made
//! durable, as a power loss would. A SIGKILL alone cannot show a missing fsync: the page cache
//! outlives the process. It needs root and `/dev/fuse`; without them it prints why and passes
//! as skipped, unless `IDEMRAFT_REQUIRE_FUSE=1`.
//!
//! Deterministic given the seed, except for when the kills land. The seed is printed at the
//! start and on failure; rerun with `IDEMRAFT_CRASH_SEED=<seed>`. `IDEMRAFT_CRASH_ITERS`
//! overrides the number of kill/reopen rounds (default 50).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use idemraft_store::machine::{apply_batch, StateStore};
use idemraft_store::raft::Entry;
use idemraft_store::{
    Command, CommandBatch, LogStore, MemState, Op, Outcome, OutcomeBatch, RecordKey, RecordState, Response,
    StateMachineStore, Token,
};
use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftLogReader};

const CHILD_TEST: &str = "crash_child_process_entry_point";
const ENV_CHILD_DIR: &str = "IDEMRAFT_CRASH_CHILD_DIR";
const ENV_CHILD_SEED: &str = "IDEMRAFT_CRASH_CHILD_SEED";
const ENV_SEED: &str = "IDEMRAFT_CRASH_SEED";
const ENV_ITERS: &str = "IDEMRAFT_CRASH_ITERS";
const ENV_CHILD_SNAPSHOTS: &str = "IDEMRAFT_CRASH_CHILD_SNAPSHOTS";
/// Entries between the snapshots a power-loss child builds.
const SNAPSHOT_EVERY: u64 = 40;

const TERM: u64 = 1;
const NODE: u64 = 1;
/// Unix ms of index 0; each index moves the proposer's clock by `MS_PER_INDEX`.
const BASE_MS: u64 = 1_700_000_000_000;
const MS_PER_INDEX: u64 = 100;
/// A claim is settled (or not) at most this many entries after the entry that made it.
const MAX_SETTLE_DELAY: u64 = 6;
/// Most commands in one entry.
const MAX_COMMANDS: usize = 32;
/// Most new claims in one entry (the rest of the room is for settlements and a sweep).
const MAX_CLAIMS: u64 = 16;
const LONG_TTL_MS: u64 = 24 * 60 * 60 * 1000;
const LONG_LEASE_MS: u64 = 60 * 1000;
/// A child that was never killed stops by itself after this long (a stuck parent).
const CHILD_MAX_RUN: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Seeded randomness and the workload, a pure function of (seed, index)

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Complete,
    FailRetryable,
    FailTerminal,
}

/// One claim of a fresh key, as planned for entry `index` at `slot` (claims come first in an
/// entry, so the slot is the claim's position and its token is `Token::new(index, slot)`).
struct ClaimPlan {
    slot: usize,
    id: RecordKey,
    lease_ms: u64,
    ttl_ms: u64,
    fingerprint: [u8; 32],
    /// Settled this many entries later, if at all.
    fate: Option<(u64, Fate)>,
}

fn record_key(seed: u64, index: u64, slot: usize) -> RecordKey {
    RecordKey::new("tenant-1", "crash.test", format!("key-{seed:016x}-{index:08}-{slot:02}")).expect("valid key")
}

fn claims_of(seed: u64, index: u64) -> Vec<ClaimPlan> {
    let mut r = Rng::stream(seed, index, 1);
    // Mostly small entries, sometimes a big one, as under bursty load.
    let n = if r.below(4) == 0 { 1 + r.below(MAX_CLAIMS) } else { 1 + r.below(4) };
    (0..n as usize)
        .map(|slot| {
            // Long-lived keys are checked one by one after each crash; short ones expire, get
            // swept, and are covered by the digest.
            let long = r.below(8) == 0;
            let (lease_ms, ttl_ms) =
                if long { (LONG_LEASE_MS, LONG_TTL_MS) } else { (1 + r.below(800), 1000 + r.below(1000)) };
            let fate = match r.below(10) {
                0..=6 => Some(Fate::Complete),
                7 => Some(Fate::FailRetryable),
                8 => Some(Fate::FailTerminal),
                _ => None,
            };
            let delay = 1 + r.below(MAX_SETTLE_DELAY);
            let mut fingerprint = [0u8; 32];
            fingerprint.copy_from_slice(&r.bytes(32));
            ClaimPlan {
                slot,
                id: record_key(seed, index, slot),
                lease_ms,
                ttl_ms,
                fingerprint,
                fate: fate.map(|f| (delay, f)),
            }
        })
        .collect()
}

/// The response a completed key stores: about 256 bytes, derived from the key's origin.
fn success_response(seed: u64, index: u64, slot: usize) -> Response {
    let mut r = Rng::stream(seed, index, 1000 + slot as u64);
    Response {
        status: 201,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-request-id".into(), format!("{:016x}", r.next())),
        ],
        body: r.bytes(200),
    }
}

fn error_response(seed: u64, index: u64, slot: usize) -> Response {
    let mut r = Rng::stream(seed, index, 5000 + slot as u64);
    Response { status: 502, headers: vec![("retry".into(), "no".into())], body: r.bytes(32) }
}

/// The commands of the entry at `index`: fresh claims, then settlements of claims made up to
/// `MAX_SETTLE_DELAY` entries earlier, then sometimes a sweep. At most `MAX_COMMANDS`.
fn entry_commands(seed: u64, index: u64) -> Vec<Command> {
    let mut r = Rng::stream(seed, index, 2);
    let mut now = || BASE_MS + index * MS_PER_INDEX + r.below(50);
    let sweep = Rng::stream(seed, index, 3).below(4) == 0;
    let mut cmds: Vec<Command> = claims_of(seed, index)
        .into_iter()
        .map(|c| Command {
            now_ms: now(),
            op: Op::Claim {
                id: c.id,
                fingerprint: Some(c.fingerprint),
                owner: format!("worker-{}", index % 7),
                lease_ms: c.lease_ms,
                ttl_ms: c.ttl_ms,
                allow_takeover: true,
            },
        })
        .collect();
    let room = MAX_COMMANDS - usize::from(sweep);
    'settle: for from in index.saturating_sub(MAX_SETTLE_DELAY).max(1)..index {
        for c in claims_of(seed, from) {
            let Some((delay, fate)) = c.fate else { continue };
            if from + delay != index {
                continue;
            }
            if cmds.len() == room {
                // No room: this claim stays in progress (deterministically).
                break 'settle;
            }
            let token = Token::new(from, c.slot);
            let op = match fate {
                Fate::Complete => Op::Complete { id: c.id, token, response: success_response(seed, from, c.slot) },
                Fate::FailRetryable => Op::Fail { id: c.id, token, retryable: true, response: None },
                Fate::FailTerminal => {
                    Op::Fail { id: c.id, token, retryable: false, response: Some(error_response(seed, from, c.slot)) }
                }
            };
            cmds.push(Command { now_ms: now(), op });
        }
    }
    if sweep {
        cmds.push(Command { now_ms: now(), op: Op::Sweep { limit: 64 } });
    }
    cmds
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(TERM, NODE), index)
}

fn expected_entry(seed: u64, index: u64) -> Entry {
    Entry { log_id: log_id(index), payload: EntryPayload::Normal(CommandBatch(entry_commands(seed, index))) }
}

/// Entries per `append_durably` call for the batch that starts at `first`: 1..=8.
fn batch_len(seed: u64, first: u64) -> u64 {
    1 + Rng::stream(seed, first, 4).below(8)
}

/// Every outcome must be what a correct machine answers for this workload: fresh claims are
/// granted the entry's token, settlements of the owner's token are accepted.
fn check_outcomes(index: u64, cmds: &[Command], outcomes: &[Outcome]) -> Result<(), String> {
    if cmds.len() != outcomes.len() {
        return Err(format!("entry {index}: {} commands but {} outcomes", cmds.len(), outcomes.len()));
    }
    for (slot, (cmd, outcome)) in cmds.iter().zip(outcomes).enumerate() {
        let ok = match (&cmd.op, outcome) {
            (Op::Claim { .. }, Outcome::Acquired(g)) => g.token == Token::new(index, slot) && g.attempt == 1,
            (Op::Complete { token, .. }, Outcome::Completed { token: t }) => t == token,
            (Op::Fail { token, retryable, .. }, Outcome::Failed { token: t, retryable: r }) => {
                t == token && r == retryable
            }
            (Op::Sweep { limit }, Outcome::Swept { deleted }) => deleted <= limit,
            _ => false,
        };
        if !ok {
            return Err(format!("entry {index} slot {slot}: command {:?} answered {outcome:?}", cmd.op));
        }
    }
    Ok(())
}

fn commands_of(entry: &Entry) -> &[Command] {
    match &entry.payload {
        EntryPayload::Normal(CommandBatch(cmds)) => cmds,
        other => panic!("entry {} is not a normal entry: {other:?}", entry.log_id.index),
    }
}

/// Applies log entries to the state machine in chunks and checks each outcome.
async fn apply_checked(sm: &mut StateMachineStore, entries: &[Entry]) -> Result<(), String> {
    for chunk in entries.chunks(64) {
        let replies: Vec<OutcomeBatch> =
            sm.apply(chunk.to_vec()).await.map_err(|e| format!("apply of {} entries failed: {e}", chunk.len()))?;
        if replies.len() != chunk.len() {
            return Err(format!("apply of {} entries returned {} replies", chunk.len(), replies.len()));
        }
        for (entry, reply) in chunk.iter().zip(&replies) {
            check_outcomes(entry.log_id.index, commands_of(entry), &reply.0)?;
        }
    }
    Ok(())
}

/// What openraft does at start: apply the log after the last applied id. Everything in the
/// log is committed here (one node). Returns the last log index.
async fn catch_up(log: &mut LogStore, sm: &mut StateMachineStore) -> Result<(u64, u64), String> {
    let state = log.get_log_state().await.map_err(|e| format!("get_log_state: {e}"))?;
    if state.last_purged_log_id.is_some() {
        return Err(format!("nothing purges in this test, yet the log says {:?}", state.last_purged_log_id));
    }
    let last = state.last_log_id.map_or(0, |l| l.index);
    let committed = log.read_committed().await.map_err(|e| format!("read_committed: {e}"))?;
    if committed.map_or(0, |c| c.index) > last {
        return Err(format!("committed id {committed:?} is beyond the log's last index {last}"));
    }
    let (applied, _) = sm.applied_state().await.map_err(|e| format!("applied_state: {e}"))?;
    let applied_index = applied.map_or(0, |l| l.index);
    if applied_index > last {
        return Err(format!("state machine applied index {applied_index}, beyond the log's last index {last}"));
    }
    if let Some(applied) = applied {
        let at = log
            .try_get_log_entries(applied.index..=applied.index)
            .await
            .map_err(|e| format!("reading entry {}: {e}", applied.index))?;
        if at.first().map(|e| e.log_id) != Some(applied) {
            return Err(format!("applied log id {applied} is not in the log (found {:?})", at.first()));
        }
    }
    let pending =
        log.try_get_log_entries(applied_index + 1..=last).await.map_err(|e| format!("reading the log tail: {e}"))?;
    check_contiguous(&pending, applied_index + 1, last)?;
    apply_checked(sm, &pending).await?;
    Ok((applied_index, last))
}

fn check_contiguous(entries: &[Entry], first: u64, last: u64) -> Result<(), String> {
    let want = (last + 1).saturating_sub(first);
    if entries.len() as u64 != want {
        return Err(format!("log range {first}..={last} holds {} entries, expected {want}", entries.len()));
    }
    for (i, e) in entries.iter().enumerate() {
        if e.log_id.index != first + i as u64 {
            return Err(format!("log hole: position {i} of {first}..={last} holds index {}", e.log_id.index));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The child

/// Entry point of the child process. A no-op unless the parent set `IDEMRAFT_CRASH_CHILD_DIR`.
#[test]
fn crash_child_process_entry_point() {
    let Some(dir) = std::env::var_os(ENV_CHILD_DIR) else { return };
    let seed: u64 = std::env::var(ENV_CHILD_SEED).expect("child seed").parse().expect("numeric child seed");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(child_main(Path::new(&dir), seed));
}

async fn child_main(dir: &Path, seed: u64) {
    let snapshots = std::env::var_os(ENV_CHILD_SNAPSHOTS).is_some();
    let (mut log, mut sm) = idemraft_store::open(dir).expect("child: open data dir");
    let (_, mut last) = catch_up(&mut log, &mut sm).await.expect("child: catch up");
    let started = Instant::now();
    let stdout = std::io::stdout();
    while started.elapsed() < CHILD_MAX_RUN {
        let first = last + 1;
        let n = batch_len(seed, first);
        let entries: Vec<Entry> = (first..first + n).map(|i| expected_entry(seed, i)).collect();
        log.append_durably(entries.clone()).await.expect("child: append_durably");
        last = first + n - 1;
        log.save_committed(Some(log_id(last))).await.expect("child: save_committed");
        apply_checked(&mut sm, &entries).await.expect("child: apply");
        if snapshots && last / SNAPSHOT_EVERY != (first - 1) / SNAPSHOT_EVERY {
            sm.get_snapshot_builder().await.build_snapshot().await.expect("child: build a snapshot");
        }
        let mut lines = String::new();
        for i in first..=last {
            lines.push_str(&format!("ACK {i}\n"));
        }
        let mut out = stdout.lock();
        out.write_all(lines.as_bytes()).expect("child: stdout");
        out.flush().expect("child: flush stdout");
    }
}

// ---------------------------------------------------------------------------------------------
// The parent

/// Prints the seed if the test panics, whichever assertion fails.
struct SeedOnPanic(u64);

impl Drop for SeedOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("crash test FAILED with seed {0}; rerun with {ENV_SEED}={0}", self.0);
        }
    }
}

/// The seed's entries, each computed once (entry `i` at position `i - 1`).
struct Expected {
    seed: u64,
    entries: Vec<Entry>,
}

impl Expected {
    fn get(&mut self, index: u64) -> &Entry {
        while (self.entries.len() as u64) < index {
            let next = self.entries.len() as u64 + 1;
            self.entries.push(expected_entry(self.seed, next));
        }
        &self.entries[index as usize - 1]
    }
}

/// Expected final state of a long-lived key, from the log alone.
#[derive(Debug, PartialEq)]
struct Expect {
    token: Token,
    state: RecordState,
    response: Option<Response>,
}

/// Everything the parent knows, built only from entries it verified against the seed.
struct Model {
    expected: Expected,
    /// Entries `1..=verified` were read back and matched the seed's entries.
    verified: u64,
    /// MemState fed entries `1..=verified`. Each round re-reads the whole log and checks it
    /// against the seed, so feeding only the new entries equals a fresh MemState fed the log
    /// from index 1 (which the final pass also builds, from scratch).
    mem: MemState,
    long: BTreeMap<RecordKey, Expect>,
    long_total: usize,
}

impl Model {
    /// Folds a verified entry into the expectations; returns the long-lived keys it touched.
    fn absorb(&mut self, entry: &Entry) -> Vec<RecordKey> {
        let index = entry.log_id.index;
        assert_eq!(index, self.verified + 1, "entries are absorbed in order");
        let cmds = commands_of(entry);
        let outcomes = apply_batch(&mut self.mem, index, cmds).unwrap_or_else(|e| match e {});
        if let Err(e) = check_outcomes(index, cmds, &outcomes) {
            panic!("reference MemState disagrees with the workload: {e}");
        }
        let mut touched = Vec::new();
        for (slot, cmd) in cmds.iter().enumerate() {
            match &cmd.op {
                Op::Claim { id, ttl_ms, .. } if *ttl_ms == LONG_TTL_MS => {
                    let token = Token::new(index, slot);
                    self.long.insert(id.clone(), Expect { token, state: RecordState::InProgress, response: None });
                    self.long_total += 1;
                    touched.push(id.clone());
                }
                Op::Complete { id, response, .. } => {
                    if let Some(e) = self.long.get_mut(id) {
                        e.state = RecordState::Completed;
                        e.response = Some(response.clone());
                        touched.push(id.clone());
                    }
                }
                Op::Fail { id, retryable, response, .. } => {
                    if let Some(e) = self.long.get_mut(id) {
                        if *retryable {
                            e.state = RecordState::Failed;
                        } else {
                            e.state = RecordState::Completed;
                            e.response = response.clone();
                        }
                        touched.push(id.clone());
                    }
                }
                _ => {}
            }
        }
        self.verified = index;
        touched
    }
}

/// A fresh in-memory state fed `entries` (the log from index 1), each outcome checked.
fn reference_state(entries: &[Entry]) -> MemState {
    let mut mem = MemState::new();
    for e in entries {
        let outcomes = apply_batch(&mut mem, e.log_id.index, commands_of(e)).unwrap_or_else(|e| match e {});
        if let Err(e) = check_outcomes(e.log_id.index, commands_of(e), &outcomes) {
            panic!("reference MemState disagrees with the workload: {e}");
        }
    }
    mem
}

/// Reads `first..=last`, checks each entry against the seed's.
async fn read_and_match(log: &mut LogStore, expected: &mut Expected, first: u64, last: u64) -> Vec<Entry> {
    let entries = log.try_get_log_entries(first..=last).await.expect("reading the log");
    if let Err(e) = check_contiguous(&entries, first, last) {
        panic!("{e}");
    }
    for e in &entries {
        let want = expected.get(e.log_id.index);
        assert!(e == want, "log entry {} differs from what was appended:\n got {e:?}\nwant {want:?}", e.log_id.index);
    }
    entries
}

async fn check_long_key(sm: &StateMachineStore, id: &RecordKey, want: &Expect, round: usize) {
    let view = sm.get(id).await.expect("state machine get");
    let Some(view) = view else { panic!("round {round}: long-lived key {id} is missing; expected {want:?}") };
    let got = Expect { token: view.record.token, state: view.record.state, response: view.record.response };
    assert_eq!(got, *want, "round {round}: key {id} does not hold the log's effect");
}

struct ChildRun {
    acks: Vec<u64>,
    killed_after_first_ack: Duration,
    status: std::process::ExitStatus,
}

fn run_child(exe: &Path, dir: &Path, seed: u64, stderr_path: &Path, kill_after: Duration, snapshots: bool) -> ChildRun {
    let stderr = std::fs::File::create(stderr_path).expect("child stderr file");
    let mut child = Process::new(exe);
    if snapshots {
        child.env(ENV_CHILD_SNAPSHOTS, "1");
    }
    let mut child = child
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(ENV_CHILD_DIR, dir)
        .env(ENV_CHILD_SEED, seed.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("spawning the child");
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel::<u64>();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // A line cut by the kill (no newline) is not an acknowledgement. The first ACK
            // shares its line with libtest's `test crash_child_process_entry_point ... `.
            if let Some(index) = line.strip_suffix('\n').and_then(|l| l.find("ACK ").map(|at| &l[at + 4..])) {
                let index: u64 = index.trim().parse().expect("ACK line with an index");
                if tx.send(index).is_err() {
                    break;
                }
            }
        }
    });
    let mut acks = Vec::new();
    let first = rx.recv_timeout(Duration::from_secs(30));
    let killed_after_first_ack = match first {
        Ok(index) => {
            acks.push(index);
            let t = Instant::now();
            std::thread::sleep(kill_after);
            child.kill().expect("SIGKILL the child");
            t.elapsed()
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(stderr_path).unwrap_or_default();
            panic!("the child never acknowledged anything; its stderr:\n{log}");
        }
    };
    let status = child.wait().expect("waiting for the child");
    reader.join().expect("stdout reader");
    acks.extend(rx.try_iter());
    ChildRun { acks, killed_after_first_ack, status }
}

/// One round's checks after the child died. Returns the checked counts for the log line.
async fn check_round(dir: &Path, model: &mut Model, acks: &[u64], round: usize) -> (u64, u64, usize) {
    let (mut log, mut sm) = idemraft_store::open(dir).expect("parent: reopen data dir after SIGKILL");
    let state = log.get_log_state().await.expect("get_log_state");
    let last = state.last_log_id.map_or(0, |l| l.index);
    assert!(
        last >= model.verified,
        "round {round}: log ends at {last}, but entries up to {} were durable",
        model.verified
    );

    // Acknowledged means durable: each ACK names an index in the log, in order from where the
    // previous round's log ended.
    for (i, &a) in acks.iter().enumerate() {
        assert_eq!(a, model.verified + 1 + i as u64, "round {round}: ACKs out of order: {acks:?}");
        assert!(a <= last, "round {round}: acknowledged index {a} LOST: the log ends at {last} after SIGKILL");
    }

    // The whole log, acknowledged entries included, matches the seed's entries exactly.
    let all = read_and_match(&mut log, &mut model.expected, 1, last).await;

    // What openraft does at start.
    let (applied_before, _) = catch_up(&mut log, &mut sm).await.unwrap_or_else(|e| panic!("round {round}: {e}"));
    let (applied, _) = sm.applied_state().await.expect("applied_state");
    assert_eq!(applied.map_or(0, |l| l.index), last, "round {round}: state machine did not catch up");

    let mut touched = Vec::new();
    for e in &all[model.verified as usize..] {
        touched.extend(model.absorb(e));
    }
    let mem = &model.mem;
    assert_eq!(sm.clock(), mem.clock(), "round {round}: state machine clock differs from MemState's");
    assert_eq!(
        sm.digest().await.expect("digest"),
        mem.digest(),
        "round {round}: state digest differs from MemState fed the log 1..={last}"
    );
    for id in &touched {
        check_long_key(&sm, id, &model.long[id], round).await;
    }
    drop(log);
    drop(sm);
    (applied_before, last, touched.len())
}

#[test]
fn acknowledged_entries_survive_sigkill() {
    crash_rounds(None, 50);
}

#[test]
fn acknowledged_entries_survive_power_loss() {
    let tmp = tempfile::TempDir::new().expect("temp dir");
    let (backing, mount) = (tmp.path().join("disk"), tmp.path().join("mnt"));
    std::fs::create_dir_all(&backing).expect("backing dir");
    std::fs::create_dir_all(&mount).expect("mount dir");
    let opts = lazyfs::Options { backing, mount, staging: None, control: None };
    let fs = match lazyfs::LazyFs::mount(&opts) {
        Ok(fs) => fs,
        Err(e) => {
            assert!(
                std::env::var("IDEMRAFT_REQUIRE_FUSE").as_deref() != Ok("1"),
                "IDEMRAFT_REQUIRE_FUSE=1 but the lazy filesystem cannot mount: {e}"
            );
            println!("skipped: FUSE unavailable ({e})");
            return;
        }
    };
    crash_rounds(Some(&fs), 30);
}

/// `iters` rounds of a child killed mid-write and the directory checked; on `lazy`, each
/// SIGKILL is followed by a power loss, and the children build snapshots as they go.
fn crash_rounds(lazy: Option<&lazyfs::LazyFs>, default_iters: usize) {
    let seed = match std::env::var(ENV_SEED) {
        Ok(s) => s.parse().expect("IDEMRAFT_CRASH_SEED must be a u64"),
        Err(_) => {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            (nanos as u64) ^ u64::from(std::process::id()).rotate_left(32)
        }
    };
    let iters: usize =
        std::env::var(ENV_ITERS).ok().map_or(default_iters, |s| s.parse().expect("IDEMRAFT_CRASH_ITERS"));
    eprintln!("crash test seed: {seed} (rerun with {ENV_SEED}={seed}), {iters} rounds");
    let _guard = SeedOnPanic(seed);

    let started = Instant::now();
    let exe = std::env::current_exe().expect("current test binary");
    let tmp = tempfile::TempDir::new().expect("temp dir");
    let dir = lazy.map_or_else(|| tmp.path().join("data"), |fs| fs.mount_point().join("data"));
    let stderr_path = tmp.path().join("child.stderr");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut model = Model {
        expected: Expected { seed, entries: Vec::new() },
        verified: 0,
        mem: MemState::new(),
        long: BTreeMap::new(),
        long_total: 0,
    };
    let mut timing = Rng::stream(seed, u64::MAX, 9);
    let mut total_acks = 0usize;

    for round in 0..iters {
        let kill_after = Duration::from_millis(5 + timing.below(146));
        let run = run_child(&exe, &dir, seed, &stderr_path, kill_after, lazy.is_some());
        {
            use std::os::unix::process::ExitStatusExt;
            if run.status.signal() != Some(9) {
                let log = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                panic!(
                    "round {round}: the child ended by itself ({:?}) instead of by SIGKILL; stderr:\n{log}",
                    run.status
                );
            }
        }
        total_acks += run.acks.len();
        let mut lost = String::new();
        if let Some(fs) = lazy {
            let pending = fs.stats();
            fs.power_loss().expect("power loss");
            lost =
                format!("; power loss dropped {} bytes, {} entry changes", pending.pending_bytes, pending.pending_ops);
        }
        let check_started = Instant::now();
        let (applied_before, last, touched) = rt.block_on(check_round(&dir, &mut model, &run.acks, round));
        eprintln!(
            "round {round:2}: killed {:3} ms after first ACK{lost}; {:4} ACKs (last {:?}); log ends at {last}, state \
             machine was at {applied_before}; {touched} long keys checked; checks took {} ms",
            run.killed_after_first_ack.as_millis(),
            run.acks.len(),
            run.acks.last(),
            check_started.elapsed().as_millis(),
        );
    }

    // Final pass: a clean reopen, the whole log once more, every long-lived key.
    rt.block_on(async {
        let (mut log, mut sm) = idemraft_store::open(&dir).expect("final reopen");
        let (_, last) = catch_up(&mut log, &mut sm).await.unwrap_or_else(|e| panic!("final: {e}"));
        assert_eq!(last, model.verified, "final: log end moved without a writer");
        let all = read_and_match(&mut log, &mut model.expected, 1, last).await;
        let fresh = reference_state(&all);
        assert_eq!(fresh.digest(), model.mem.digest(), "final: fresh and incremental MemState differ");
        assert_eq!(sm.digest().await.expect("digest"), fresh.digest(), "final: sled state differs from MemState");
        for (id, want) in &model.long {
            check_long_key(&sm, id, want, iters).await;
        }
        eprintln!(
            "crash test passed: seed {seed}, {iters} SIGKILLs, {total_acks} acknowledged entries, log of {last} \
             entries, {} long-lived keys checked, {} records in the final state, {:.1} s",
            model.long_total,
            fresh.len(),
            started.elapsed().as_secs_f64()
        );
    });
}
