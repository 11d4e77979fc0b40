//! The workloads and one timed run of one of them against one target.
//!
//! A run opens its connections, lets every client task loop for the warm-up and then for the
//! measured duration, and counts only the operations that started after the warm-up and
//! ended before the end. Every operation has its own timeout, so a task stops within
//! [`OP_TIMEOUT`] of the end whatever the server does. The server processes' CPU time is
//! sampled at the start and the end of the measured window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use crate::procstat::{self, Procs};
use crate::target::{self, Claimed, Conn, Spec};

/// Longest one operation may take before it counts as an error.
pub const OP_TIMEOUT: Duration = Duration::from_secs(5);
/// Size of the response every cycle stores.
pub const BODY_BYTES: usize = 256;
/// Attempts per key when completing keys beforehand (replay keys, the load mode).
const PREPARE_ATTEMPTS: u32 = 5;
/// Keys a contention run fights over.
pub const CONTENDED_KEYS: usize = 8;
/// The seed of every body the cycle, replay and contention workloads store.
const BODY_SEED: u64 = 0x1de3_4af7;

/// What the client tasks do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// Claim a fresh key, then complete it with a 256-byte response: one op per cycle.
    Cycle,
    /// Claim keys completed beforehand (a retry storm): one op per claim, each a replay.
    Replay,
    /// Many clients claim a few keys; the winner completes and the key moves on to a new
    /// generation. One op per claim attempt, whatever it answers.
    Contention,
}

impl Workload {
    /// Its name on the command line and in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Cycle => "cycle",
            Workload::Replay => "replay",
            Workload::Contention => "contention",
        }
    }

    /// Parses a name.
    pub fn parse(s: &str) -> Result<Workload, String> {
        match s {
            "cycle" => Ok(Workload::Cycle),
            "replay" => Ok(Workload::Replay),
            "contention" => Ok(Workload::Contention),
            other => Err(format!("unknown workload '{other}': use cycle, replay or contention")),
        }
    }
}

/// A latency histogram in microseconds, 1 us to 60 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    // Constant bounds that hdrhistogram accepts: a failure here is a programming error.
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap_or_else(|e| panic!("histogram bounds refused: {e}"))
}

/// The figures of one run (or, after [`RunResult::absorb`], of several runs of the same cell).
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Measured seconds.
    pub secs: f64,
    /// Operations that succeeded within the window.
    pub ops: u64,
    /// Operations that failed or timed out within the window.
    pub errors: u64,
    /// Claims that acquired (contention: the winners).
    pub wins: u64,
    /// Latency of an op.
    pub op: Histogram<u64>,
    /// Latency of the claim alone (cycle and contention).
    pub claim: Histogram<u64>,
    /// Server CPU seconds in the window.
    pub server_cpu: f64,
    /// Driver CPU seconds in the window.
    pub driver_cpu: f64,
    /// Peak RSS of the server processes at the end, bytes.
    pub peak_rss: u64,
    /// The first error seen, for the log.
    pub first_error: Option<String>,
}

impl RunResult {
    fn empty() -> RunResult {
        RunResult {
            secs: 0.0,
            ops: 0,
            errors: 0,
            wins: 0,
            op: histogram(),
            claim: histogram(),
            server_cpu: 0.0,
            driver_cpu: 0.0,
            peak_rss: 0,
            first_error: None,
        }
    }

    /// Operations per second.
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    /// Adds another run of the same cell.
    pub fn absorb(&mut self, other: &RunResult) {
        self.secs += other.secs;
        self.ops += other.ops;
        self.errors += other.errors;
        self.wins += other.wins;
        let _ = self.op.add(&other.op);
        let _ = self.claim.add(&other.claim);
        self.server_cpu += other.server_cpu;
        self.driver_cpu += other.driver_cpu;
        self.peak_rss = self.peak_rss.max(other.peak_rss);
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }
}

/// Everything the tasks of one run share.
struct Shared {
    workload: Workload,
    prefix: String,
    measure_from: Instant,
    end: Instant,
    replay_keys: Arc<Vec<String>>,
    generations: Vec<AtomicU64>,
    body: Vec<u8>,
}

/// Per-task tallies.
struct Tally {
    ops: u64,
    errors: u64,
    wins: u64,
    op: Histogram<u64>,
    claim: Histogram<u64>,
    first_error: Option<String>,
}

async fn timed<T>(f: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {OP_TIMEOUT:?}")),
    }
}

/// xorshift64*: a per-task key picker that needs no shared state.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// One op; `Ok(true)` when it won a claim. The claim latency goes to `claim`.
async fn one_op(
    conn: &mut Conn,
    sh: &Shared,
    task: usize,
    i: u64,
    rng: &mut Rng,
    claim: &mut Option<Duration>,
) -> Result<bool, String> {
    let owner = format!("t{task}");
    match sh.workload {
        Workload::Cycle => {
            let key = format!("{}-{task:04}-{i:010}", sh.prefix);
            let t = Instant::now();
            let got = timed(conn.claim(&key, &owner)).await?;
            *claim = Some(t.elapsed());
            let Claimed::Acquired(token) = got else { return Err(format!("fresh key claimed as {got:?}")) };
            timed(conn.complete(&key, token, &sh.body)).await?;
            Ok(true)
        }
        Workload::Replay => {
            let n = sh.replay_keys.len().max(1);
            let key = sh.replay_keys.get((rng.next() as usize) % n).ok_or("no replay keys")?;
            match timed(conn.claim(key, &owner)).await? {
                Claimed::Replay(len) if len == sh.body.len() => Ok(false),
                other => Err(format!("completed key claimed as {other:?}")),
            }
        }
        Workload::Contention => {
            let slot = (rng.next() as usize) % CONTENDED_KEYS;
            let generation = sh.generations[slot].load(Ordering::Acquire);
            let key = format!("{}-c{slot}-{generation:010}", sh.prefix);
            let t = Instant::now();
            let got = timed(conn.claim(&key, &owner)).await?;
            *claim = Some(t.elapsed());
            match got {
                Claimed::Acquired(token) => {
                    timed(conn.complete(&key, token, &sh.body)).await?;
                    sh.generations[slot].fetch_max(generation + 1, Ordering::AcqRel);
                    Ok(true)
                }
                Claimed::Replay(_) | Claimed::InProgress => Ok(false),
            }
        }
    }
}

async fn task(mut conn: Conn, sh: Arc<Shared>, id: usize) -> Tally {
    let mut t = Tally { ops: 0, errors: 0, wins: 0, op: histogram(), claim: histogram(), first_error: None };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((id as u64 + 1) << 17));
    let mut i = 0u64;
    loop {
        let start = Instant::now();
        if start >= sh.end {
            return t;
        }
        i += 1;
        let mut claim = None;
        let r = one_op(&mut conn, &sh, id, i, &mut rng, &mut claim).await;
        let done = Instant::now();
        let counted = start >= sh.measure_from && done <= sh.end;
        match r {
            Ok(won) if counted => {
                t.ops += 1;
                t.wins += u64::from(won);
                let _ = t.op.record((done - start).as_micros().max(1) as u64);
                if let Some(c) = claim {
                    let _ = t.claim.record(c.as_micros().max(1) as u64);
                }
            }
            Ok(_) => {}
            Err(e) => {
                if counted {
                    t.errors += 1;
                }
                if t.first_error.is_none() {
                    t.first_error = Some(e);
                }
                // A failing server is not hammered in a tight loop.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct RunSettings {
    /// Client tasks.
    pub clients: usize,
    /// Unmeasured lead-in.
    pub warmup: Duration,
    /// Measured window.
    pub duration: Duration,
    /// Unique per run: keys never collide with an earlier run's.
    pub prefix: String,
    /// Size of every stored response body.
    pub body_bytes: usize,
}

/// splitmix64's output function: a well-mixed 64-bit value for each input.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stored response body of exactly `len` bytes, shaped like what a payments API returns: a
/// JSON list of charges with random ids, amounts and timestamps (cut at `len`, so not always
/// valid JSON). A body of one repeated byte compresses to almost nothing, and PostgreSQL
/// compresses every `bytea` value over about 2 KiB on its own, so such a body let it write a
/// small fraction of the bytes the other targets write. This one compresses about as real
/// JSON does. The same seed gives the same body, so runs compare like with like.
pub fn response_body(len: usize, seed: u64) -> Vec<u8> {
    use std::fmt::Write;
    const CURRENCIES: [&str; 4] = ["usd", "eur", "gbp", "jpy"];
    const STATUSES: [&str; 3] = ["succeeded", "pending", "failed"];
    let mut out = String::with_capacity(len + 512);
    out.push_str("{\"object\":\"list\",\"has_more\":false,\"data\":[");
    let mut i = 0u64;
    while out.len() < len {
        let r = |k: u64| mix(seed ^ mix(i.wrapping_mul(16).wrapping_add(k)));
        if i > 0 {
            out.push(',');
        }
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "{{\"id\":\"ch_{:016x}{:08x}\",\"object\":\"charge\",\"amount\":{},\"currency\":\"{}\",\
             \"status\":\"{}\",\"created\":{},\"customer\":\"cus_{:014x}\",\"description\":\"order {:08x}\",\
             \"metadata\":{{\"order_id\":\"ord_{:016x}\",\"attempt\":\"{}\"}}}}",
            r(0),
            r(1) as u32,
            r(2) % 1_000_000,
            CURRENCIES[(r(3) % 4) as usize],
            STATUSES[(r(4) % 3) as usize],
            1_700_000_000 + r(5) % 100_000_000,
            r(6) >> 8,
            r(7) as u32,
            r(8),
            1 + r(9) % 5,
        );
        i += 1;
    }
    let mut body = out.into_bytes();
    body.truncate(len);
    body
}

/// Runs `workload` against `spec` once.
pub async fn run(
    spec: &Spec,
    procs: &Procs,
    workload: Workload,
    settings: &RunSettings,
    replay_keys: Arc<Vec<String>>,
) -> Result<RunResult, String> {
    let conns = target::connect(spec, settings.clients).await?;
    let now = Instant::now();
    let sh = Arc::new(Shared {
        workload,
        prefix: settings.prefix.clone(),
        measure_from: now + settings.warmup,
        end: now + settings.warmup + settings.duration,
        replay_keys,
        generations: (0..CONTENDED_KEYS).map(|_| AtomicU64::new(0)).collect(),
        body: response_body(settings.body_bytes, BODY_SEED),
    });
    let handles: Vec<_> = conns.into_iter().enumerate().map(|(i, c)| tokio::spawn(task(c, sh.clone(), i))).collect();

    tokio::time::sleep_until(sh.measure_from).await;
    let p = procs.clone();
    let (cpu0, self0) = tokio::task::spawn_blocking(move || (p.cpu_seconds(), procstat::self_cpu_seconds()))
        .await
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    tokio::time::sleep_until(sh.end).await;
    let p = procs.clone();
    let (cpu1, self1, peak) =
        tokio::task::spawn_blocking(move || (p.cpu_seconds(), procstat::self_cpu_seconds(), p.peak_rss_bytes()))
            .await
            .map_err(|e| e.to_string())?;
    let secs = (Instant::now() - t0).as_secs_f64();

    let mut out = RunResult::empty();
    out.secs = secs;
    out.server_cpu = cpu1 - cpu0;
    out.driver_cpu = self1 - self0;
    out.peak_rss = peak;
    // Each task ends within OP_TIMEOUT (plus its error pause) of the end.
    let stop_by = sh.end + OP_TIMEOUT + Duration::from_secs(2);
    for h in handles {
        match tokio::time::timeout_at(stop_by, h).await {
            Ok(Ok(t)) => {
                out.ops += t.ops;
                out.errors += t.errors;
                out.wins += t.wins;
                let _ = out.op.add(&t.op);
                let _ = out.claim.add(&t.claim);
                if out.first_error.is_none() {
                    out.first_error = t.first_error;
                }
            }
            Ok(Err(e)) => return Err(format!("a client task failed: {e}")),
            Err(_) => return Err("a client task did not stop after the run".into()),
        }
    }
    Ok(out)
}

/// Completes `n` fresh keys with `clients` tasks, for the replay workload; returns them.
pub async fn completed_keys(
    spec: &Spec,
    prefix: &str,
    n: usize,
    clients: usize,
    body_bytes: usize,
) -> Result<Vec<String>, String> {
    let conns = target::connect(spec, clients).await?;
    let next = Arc::new(AtomicU64::new(0));
    let body = Arc::new(response_body(body_bytes, BODY_SEED));
    let mut handles = Vec::new();
    for (t, mut conn) in conns.into_iter().enumerate() {
        let next = next.clone();
        let body = body.clone();
        let prefix = prefix.to_string();
        handles.push(tokio::spawn(async move {
            let mut keys = Vec::new();
            let owner = format!("p{t}");
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    return Ok::<_, String>(keys);
                }
                let key = format!("{prefix}-r{i:010}");
                // A few attempts per key: a loaded machine may stall one call past its timeout.
                // Both calls are safe to repeat (the same owner gets the same grant back, and a
                // repeated Complete with the same response is accepted).
                let mut last = None;
                for attempt in 0..PREPARE_ATTEMPTS {
                    if attempt > 0 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    let done = match timed(conn.claim(&key, &owner)).await {
                        Ok(Claimed::Acquired(token)) => timed(conn.complete(&key, token, &body)).await,
                        Ok(Claimed::Replay(_)) => Ok(()),
                        Ok(Claimed::InProgress) => return Err(format!("{key} is held by someone else")),
                        Err(e) => Err(e),
                    };
                    match done {
                        Ok(()) => {
                            last = None;
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                if let Some(e) = last {
                    return Err(format!("{key}: {e} ({PREPARE_ATTEMPTS} attempts)"));
                }
                keys.push(key);
            }
        }));
    }
    let mut keys = Vec::with_capacity(n);
    for h in handles {
        keys.extend(h.await.map_err(|e| e.to_string())??);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::response_body;

    #[test]
    fn bodies_have_the_asked_length_and_depend_only_on_the_seed() {
        for len in [0, 1, 255, 256, 4096, 65536, 262_144] {
            assert_eq!(response_body(len, 7).len(), len);
        }
        assert_eq!(response_body(4096, 7), response_body(4096, 7));
        assert_ne!(response_body(4096, 7), response_body(4096, 8));
        // A prefix of a longer body: sizes differ only in where the list is cut.
        assert_eq!(response_body(4096, 7)[..], response_body(65536, 7)[..4096]);
    }

    #[test]
    fn bodies_do_not_repeat_themselves() {
        // Ids, amounts and timestamps differ in every object: no 32-byte run of the body
        // appears twice at 32-byte steps, where one repeated byte would everywhere.
        let body = response_body(65536, 7);
        let mut chunks: Vec<&[u8]> = body.chunks_exact(32).collect();
        let n = chunks.len();
        chunks.sort_unstable();
        chunks.dedup();
        assert!(chunks.len() * 10 > n * 9, "{} distinct of {n}", chunks.len());
        let distinct = body.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert!(distinct >= 30, "{distinct} distinct bytes");
    }
}
