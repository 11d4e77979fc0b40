//! Throughput and latency figures for `idemraft-store`, printed as plain labelled lines.
//!
//! Measures:
//! * `mem`: the pure state machine on [`MemState`] — apply throughput for a cycle workload
//!   (claim a fresh key, complete it one entry later with a 256-byte body; 64 commands per
//!   entry), then replay throughput (claims of keys that are already completed).
//! * `sled-apply`: the same cycle workload through `StateMachineStore::apply`, one 64-command
//!   entry per call (apply never fsyncs; sled flushes in the background).
//! * `log-append`: `LogStore::append_durably` (one write to the segment file + fdatasync) with
//!   1, 16 and 256 entries per call, each entry one realistic Claim: appends/s, entries/s and the
//!   mean/p50/p99 latency of a call.
//! * `fsync`: the raw floor of the same disk — a 4 KiB write then `File::sync_all` — and a
//!   log-sized write then `fdatasync`, into a growing file and into reserved blocks.
//!
//! Every measurement stops after its operation count or [`TIME_BOUND`], whichever is first.
//! Data goes to fresh temporary directories under the system temp dir.
//!
//! Run: `cargo bench -p idemraft-store --bench store`. To run only some parts, pass their
//! names (substring match) after `--`, e.g. `cargo bench -p idemraft-store --bench store --
//! mem fsync`, or set `IDEMRAFT_BENCH_FILTER=mem,fsync`. Unknown `--flags` (cargo passes
//! `--bench`) are ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/rng.rs"]
mod rng;
use rng::Rng;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use idemraft_store::machine::apply_batch;
use idemraft_store::raft::Entry;
use idemraft_store::{Command, CommandBatch, MemState, Op, Outcome, RecordKey, Response, Token};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;
use openraft::{CommittedLeaderId, EntryPayload, LogId};

/// Upper bound of each measurement's duration.
const TIME_BOUND: Duration = Duration::from_secs(3);
/// Commands in the pure and sled apply workloads (upper bound; the time bound may stop earlier).
const APPLY_COMMANDS: usize = 200_000;
/// Commands per log entry in the apply workloads.
const COMMANDS_PER_ENTRY: usize = 64;
/// Claims per entry in the cycle workload; the other half of the entry completes the previous
/// entry's claims.
const CLAIMS_PER_ENTRY: usize = COMMANDS_PER_ENTRY / 2;
/// Response body stored by each Complete.
const BODY_BYTES: usize = 256;
const BASE_MS: u64 = 1_700_000_000_000;
const SECTIONS: [&str; 4] = ["mem", "sled-apply", "log-append", "fsync"];

fn main() {
    let mut filters: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    if let Ok(f) = std::env::var("IDEMRAFT_BENCH_FILTER") {
        filters.extend(f.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string));
    }
    let wanted = |section: &str| filters.is_empty() || filters.iter().any(|f| section.contains(f.as_str()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");

    println!(
        "idemraft-store bench: optimized={} temp_dir={} time_bound={}s sections={:?} filter={:?}",
        !cfg!(debug_assertions),
        std::env::temp_dir().display(),
        TIME_BOUND.as_secs(),
        SECTIONS,
        filters
    );
    if wanted("mem") {
        bench_mem();
    }
    if wanted("sled-apply") {
        rt.block_on(bench_sled_apply());
    }
    if wanted("log-append") {
        for batch in [1, 16, 256] {
            rt.block_on(bench_log_append(batch));
        }
    }
    if wanted("fsync") {
        bench_fsync_floor();
    }
}

// ---------------------------------------------------------------------------------------------
// Workload

/// A UUID-shaped idempotency key (36 bytes), unique per `n`.
fn key(n: u64) -> RecordKey {
    let mut r = Rng(n);
    let (a, b) = (r.next(), r.next());
    let k = format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFFF,
        b >> 48,
        b & 0xFFFF_FFFF_FFFF
    );
    RecordKey::new("tenant-0042", "payments.create", k).expect("valid key")
}

fn claim(n: u64, now_ms: u64, fingerprint: [u8; 32]) -> Command {
    Command {
        now_ms,
        op: Op::Claim {
            id: key(n),
            fingerprint: Some(fingerprint),
            owner: format!("worker-{:02}-5f3c9a1e-7d2b-4c4e-9a61", n % 16),
            lease_ms: 30_000,
            ttl_ms: 24 * 60 * 60 * 1000,
            allow_takeover: true,
        },
    }
}

fn response(r: &mut Rng) -> Response {
    Response {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: r.bytes(BODY_BYTES),
    }
}

/// A claimed key: its number (see [`key`]) and the fingerprint it was claimed with.
type Claimed = (u64, [u8; 32]);

/// The cycle workload: entry `i` (from 1) claims `CLAIMS_PER_ENTRY` fresh keys at slots
/// `0..CLAIMS_PER_ENTRY`, then completes the keys entry `i - 1` claimed, with the tokens they
/// were granted. Returns the entries' commands and the keys that end up completed.
fn cycle_workload(max_commands: usize) -> (Vec<Vec<Command>>, Vec<Claimed>) {
    let mut r = Rng(7);
    let mut entries = Vec::new();
    let mut total = 0;
    let mut prev: Vec<Claimed> = Vec::new();
    let mut completed = Vec::new();
    let mut next_key = 0u64;
    let mut index = 1u64;
    while total < max_commands {
        let now = BASE_MS + index;
        let mut cmds = Vec::with_capacity(COMMANDS_PER_ENTRY);
        let mut claimed = Vec::with_capacity(CLAIMS_PER_ENTRY);
        for _ in 0..CLAIMS_PER_ENTRY {
            let fp = r.fingerprint();
            cmds.push(claim(next_key, now, fp));
            claimed.push((next_key, fp));
            next_key += 1;
        }
        for (slot, &(n, fp)) in prev.iter().enumerate() {
            cmds.push(Command {
                now_ms: now,
                op: Op::Complete { id: key(n), token: Token::new(index - 1, slot), response: response(&mut r) },
            });
            completed.push((n, fp));
        }
        total += cmds.len();
        entries.push(cmds);
        prev = claimed;
        index += 1;
    }
    (entries, completed)
}

/// Whether an outcome is what the cycle and replay workloads expect.
fn expected(cmd: &Command, outcome: &Outcome) -> bool {
    matches!(
        (&cmd.op, outcome),
        (Op::Claim { .. }, Outcome::Acquired(_) | Outcome::Replay { .. })
            | (Op::Complete { .. }, Outcome::Completed { .. })
    )
}

fn log_id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn encoded_len<T: serde::Serialize>(v: &T) -> usize {
    bincode::serialize(v).map_or(0, |b| b.len())
}

// ---------------------------------------------------------------------------------------------
// Measurements

fn bench_mem() {
    let (entries, completed) = cycle_workload(APPLY_COMMANDS);
    let mut state = MemState::new();
    let mut done = 0usize;
    let mut unexpected = 0usize;
    let mut applied = 0usize;
    let start = Instant::now();
    for (i, cmds) in entries.iter().enumerate() {
        let outcomes = apply_batch(&mut state, i as u64 + 1, cmds).unwrap_or_else(|e| match e {});
        unexpected += cmds.iter().zip(&outcomes).filter(|(c, o)| !expected(c, o)).count();
        done += cmds.len();
        applied = i + 1;
        if start.elapsed() >= TIME_BOUND {
            break;
        }
    }
    // Entry j completes the claims of entry j - 1, so when the time bound cut the cycle short
    // only the first (applied - 1) entries' claims are completed: replay just those (a slow
    // machine's debug build used to replay never-completed keys and fail the check below).
    let completed = &completed[..(applied.saturating_sub(1) * CLAIMS_PER_ENTRY).min(completed.len())];
    let elapsed = start.elapsed();
    assert_eq!(unexpected, 0, "the cycle workload got unexpected outcomes");
    println!(
        "mem.apply.cycle: {:.0} commands/s ({done} commands in {:.3} s; {COMMANDS_PER_ENTRY} commands/entry = \
         {CLAIMS_PER_ENTRY} claims of fresh keys + {CLAIMS_PER_ENTRY} completes of the previous entry's claims; \
         {BODY_BYTES}-byte response body; {} records at the end)",
        per_sec(done, elapsed),
        elapsed.as_secs_f64(),
        state.len(),
    );

    assert!(!completed.is_empty(), "the cycle applied {applied} entries in {TIME_BOUND:?}: nothing to replay");
    // Replay: retried claims of completed keys, same fingerprint.
    let applied_entries = applied as u64;
    let replay: Vec<Vec<Command>> = completed
        .chunks(COMMANDS_PER_ENTRY)
        .enumerate()
        .map(|(i, keys)| {
            let now = BASE_MS + applied_entries + 1 + i as u64;
            keys.iter().map(|&(n, fp)| claim(n, now, fp)).collect()
        })
        .collect();
    let mut done = 0usize;
    let mut replays = 0usize;
    let start = Instant::now();
    'outer: loop {
        for (i, cmds) in replay.iter().enumerate() {
            let outcomes = apply_batch(&mut state, applied_entries + 1 + i as u64, cmds).unwrap_or_else(|e| match e {});
            replays += outcomes.iter().filter(|o| matches!(o, Outcome::Replay { .. })).count();
            done += cmds.len();
            if done >= APPLY_COMMANDS || start.elapsed() >= TIME_BOUND {
                break 'outer;
            }
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(replays, done, "every replay claim must be answered Replay");
    println!(
        "mem.apply.replay: {:.0} commands/s ({done} claims of completed keys in {:.3} s; {COMMANDS_PER_ENTRY} \
         commands/entry; each answer carries the {BODY_BYTES}-byte body; {} records)",
        per_sec(done, elapsed),
        elapsed.as_secs_f64(),
        state.len(),
    );
}

async fn bench_sled_apply() {
    let (workload, _) = cycle_workload(APPLY_COMMANDS);
    let entries: Vec<Entry> = workload
        .into_iter()
        .enumerate()
        .map(|(i, cmds)| Entry { log_id: log_id(i as u64 + 1), payload: EntryPayload::Normal(CommandBatch(cmds)) })
        .collect();
    let tmp = tempfile::TempDir::new().expect("temp dir");
    let (_log, mut sm) = idemraft_store::open(&tmp.path().join("data")).expect("open store");
    let mut done = 0usize;
    let mut unexpected = 0usize;
    let start = Instant::now();
    for entry in entries {
        let cmds = match &entry.payload {
            EntryPayload::Normal(b) => b.0.clone(),
            _ => Vec::new(),
        };
        let replies = sm.apply(vec![entry]).await.expect("apply");
        unexpected += cmds.iter().zip(&replies[0].0).filter(|(c, o)| !expected(c, o)).count();
        done += cmds.len();
        if start.elapsed() >= TIME_BOUND {
            break;
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(unexpected, 0, "the cycle workload got unexpected outcomes on sled");
    let flush_start = Instant::now();
    sm.flush().await.expect("flush");
    let flush = flush_start.elapsed();
    println!(
        "sled.sm.apply.cycle: {:.0} commands/s ({done} commands in {:.3} s; one {COMMANDS_PER_ENTRY}-command entry \
         per apply call, same cycle workload; apply does not fsync; one flush afterwards took {:.1} ms; {} records)",
        per_sec(done, elapsed),
        elapsed.as_secs_f64(),
        flush.as_secs_f64() * 1e3,
        sm.record_count(),
    );

    // What the records above cost in the slow paths: a snapshot (apply keeps running while it builds), its
    // install on a fresh store, and reopening (which rebuilds the in-memory indexes).
    let records = sm.record_count();
    let start = Instant::now();
    let snap = sm.get_snapshot_builder().await.build_snapshot().await.expect("build snapshot");
    let build = start.elapsed();
    let mut source = snap.snapshot;
    let snap_bytes = {
        use tokio::io::AsyncSeekExt;
        let len = source.seek(std::io::SeekFrom::End(0)).await.expect("seek");
        source.rewind().await.expect("rewind");
        len
    };
    let other = tempfile::TempDir::new().expect("temp dir");
    let (_log2, mut sm2) = idemraft_store::open(&other.path().join("data")).expect("open store");
    let mut incoming = sm2.begin_receiving_snapshot().await.expect("receive");
    tokio::io::copy(&mut *source, &mut *incoming).await.expect("copy snapshot");
    let start = Instant::now();
    sm2.install_snapshot(&snap.meta, incoming).await.expect("install snapshot");
    let install = start.elapsed();
    drop((_log2, sm2));
    drop((_log, sm));
    let start = Instant::now();
    let (_log, sm) = idemraft_store::open(&tmp.path().join("data")).expect("reopen store");
    let reopen = start.elapsed();
    assert_eq!(sm.record_count(), records);
    println!(
        "sled.sm.snapshot: build {:.0} ms (apply keeps running meanwhile), {} bytes; install on a fresh store {:.0} ms; \
         reopen with index rebuild {:.0} ms ({records} records)",
        build.as_secs_f64() * 1e3,
        snap_bytes,
        install.as_secs_f64() * 1e3,
        reopen.as_secs_f64() * 1e3,
    );
}

async fn bench_log_append(batch: usize) {
    // Upper bound of calls per batch size; the time bound usually stops earlier on slow disks.
    let max_calls = match batch {
        1 => 5_000,
        16 => 2_000,
        _ => 400,
    };
    let tmp = tempfile::TempDir::new().expect("temp dir");
    let (log, _sm) = idemraft_store::open(&tmp.path().join("data")).expect("open store");
    let mut r = Rng(11);
    let mut index = 0u64;
    let mut make_entry = |index: u64| Entry {
        log_id: log_id(index),
        payload: EntryPayload::Normal(CommandBatch(vec![claim(index, BASE_MS + index, r.fingerprint())])),
    };
    let entry_bytes = encoded_len(&make_entry(1));
    let mut latencies = Vec::with_capacity(max_calls);
    let start = Instant::now();
    while latencies.len() < max_calls && start.elapsed() < TIME_BOUND {
        let entries: Vec<Entry> = (0..batch)
            .map(|_| {
                index += 1;
                make_entry(index)
            })
            .collect();
        let t = Instant::now();
        log.append_durably(entries).await.expect("append_durably");
        latencies.push(t.elapsed());
    }
    let elapsed = start.elapsed();
    let calls = latencies.len();
    let busy: Duration = latencies.iter().sum();
    latencies.sort();
    println!(
        "file.log.append_durably batch={batch:<3}: {:.0} appends/s, {:.0} entries/s, latency per call mean {:.0} µs \
         p50 {:.0} µs p99 {:.0} µs ({calls} calls of {batch} entries in {:.3} s; entry = 1 Claim, {entry_bytes} bytes \
         encoded)",
        per_sec(calls, busy),
        per_sec(calls * batch, busy),
        micros(busy / calls.max(1) as u32),
        micros(percentile(&latencies, 50)),
        micros(percentile(&latencies, 99)),
        elapsed.as_secs_f64(),
    );
}

fn bench_fsync_floor() {
    let tmp = tempfile::TempDir::new().expect("temp dir");
    let path = tmp.path().join("fsync-floor");
    let mut file = std::fs::File::create(&path).expect("create file");
    let block = vec![0xA5u8; 4096];
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 2_000 && start.elapsed() < TIME_BOUND {
        file.write_all(&block).expect("write");
        let t = Instant::now();
        file.sync_all().expect("sync_all");
        samples.push(t.elapsed());
    }
    let n = samples.len();
    let mean = samples.iter().sum::<Duration>() / n.max(1) as u32;
    samples.sort();
    println!(
        "fsync.floor: p50 {:.0} µs (mean {:.0} µs, p99 {:.0} µs; {n} samples of File::sync_all after a 4 KiB append, \
         same temp dir)",
        micros(percentile(&samples, 50)),
        micros(mean),
        micros(percentile(&samples, 99)),
    );
    // What the log's segments get from reserving their room (file_log.rs, `preallocate`).
    for reserved in [false, true] {
        bench_log_sized_fdatasync(reserved);
    }
}

/// `fdatasync` after a 300-byte write at the end of what was written, into a file that grows
/// with each write, or into one whose blocks `fallocate` reserved beforehand.
fn bench_log_sized_fdatasync(reserved: bool) {
    const WRITE: usize = 300;
    const N: usize = 2_000;
    let tmp = tempfile::TempDir::new().expect("temp dir");
    let path = tmp.path().join("fdatasync");
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("create file");
    if reserved {
        nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, (N * WRITE) as i64).expect("fallocate");
        file.sync_all().expect("sync_all");
    }
    let block = vec![0xA5u8; WRITE];
    let mut samples = Vec::new();
    let cpu = thread_cpu();
    let start = Instant::now();
    while samples.len() < N && start.elapsed() < TIME_BOUND {
        let t = Instant::now();
        file.write_all_at(&block, (samples.len() * WRITE) as u64).expect("write");
        file.sync_data().expect("sync_data");
        samples.push(t.elapsed());
    }
    let cpu = thread_cpu().saturating_sub(cpu);
    let n = samples.len();
    samples.sort();
    println!(
        "fsync.{}: p50 {:.0} µs (p90 {:.0} µs, p99 {:.0} µs, this thread's CPU {:.0} µs per call; {n} samples of a \
         {WRITE}-byte write then File::sync_data, {})",
        if reserved { "reserved" } else { "growing" },
        micros(percentile(&samples, 50)),
        micros(percentile(&samples, 90)),
        micros(percentile(&samples, 99)),
        cpu.as_secs_f64() * 1e6 / n.max(1) as f64,
        if reserved { "into blocks fallocate reserved" } else { "at the end of a growing file" },
    );
}

/// This thread's time on a CPU so far, from /proc/thread-self/schedstat (zero if unreadable).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    Duration::from_nanos(stat.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0))
}
