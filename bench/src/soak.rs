//! `soak`: a bounded, paced, mixed-size claim+complete load with TTLs shorter than the run,
//! reporting every interval what an operator watches for (RSS, disk, records, leader changes,
//! latency), and judging at the end whether memory and disk stayed flat once the first TTL
//! period had passed (records that expire must give their space back), that no cycle failed
//! and that the leader never changed.
//!
//! RSS and disk are read every [`SAMPLE_EVERY`] and each row shows the lowest, mean and
//! highest reading of its interval. Disk is a sawtooth by design: the log grows until a
//! snapshot and is purged behind it, and the previous snapshot's links hold released bodies
//! until the next one replaces it. One reading lands anywhere on that tooth, so two readings
//! differ by the tooth even when nothing leaks. A leak raises the mean of many readings: the
//! judgement compares each interval's mean with that of the first interval after the first
//! TTL period (see [`Drift`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use idemraft_client::{ClaimOptions, Client, ClientConfig, Outcome, StoredResponse};

use crate::procstat::{dir_bytes, Procs};
use crate::workload::mix;

#[derive(Parser, Debug)]
pub struct SoakArgs {
    #[command(flatten)]
    cluster: crate::ClusterArgs,
    /// How long the load runs, seconds.
    #[arg(long, default_value_t = 1800)]
    secs: u64,
    /// TTL of every record, seconds (at least the node's shortest, 60 by default).
    #[arg(long, default_value_t = 60)]
    ttl_secs: u64,
    /// Report every this many seconds.
    #[arg(long, default_value_t = 60)]
    every_secs: u64,
    /// Claim+complete cycles per second over all clients (the load is paced, not flat out).
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Client tasks.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seed of the response-size mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Largest allowed drift of an interval's mean RSS and mean disk, either way, from those of
    /// the first interval after the first TTL period, percent.
    #[arg(long, default_value_t = 10.0)]
    tolerance_pct: f64,
    /// A short run: judge only failed cycles and leader changes, and print the RSS and disk
    /// drift without judging it (the Raft log holds up to `--snapshot-every` entries between
    /// snapshots, so disk settles only over several snapshot periods).
    #[arg(long)]
    smoke: bool,
}

/// The largest body [`body_size`] draws: the node's default response limit.
const BODY_MAX: usize = 256 * 1024;

/// The response sizes real APIs store: mostly small JSON, a tail of large documents, up to
/// the 256 KiB limit. Mean about 14 KiB.
pub fn body_size(r: u64) -> usize {
    let pick = r % 100;
    let within = |lo: usize, hi: usize| lo + ((r >> 8) as usize % (hi - lo + 1));
    match pick {
        0..=59 => within(64, 2048),
        60..=84 => within(2048, 16 * 1024),
        85..=96 => within(16 * 1024, 64 * 1024),
        _ => within(128 * 1024, BODY_MAX),
    }
}

#[derive(Default)]
struct Window {
    cycles: u64,
    errors: u64,
    bytes: u64,
    first_error: Option<String>,
}

/// How often RSS and disk are read within an interval.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// An interval's readings of one quantity (per node): lowest, highest, and their sum for the
/// mean.
#[derive(Clone, Copy)]
struct Readings {
    low: u64,
    high: u64,
    sum: u128,
    n: u64,
}

impl Readings {
    fn of(v: u64) -> Readings {
        Readings { low: v, high: v, sum: u128::from(v), n: 1 }
    }

    fn add(self, v: u64) -> Readings {
        Readings { low: self.low.min(v), high: self.high.max(v), sum: self.sum + u128::from(v), n: self.n + 1 }
    }

    fn mean(&self) -> u64 {
        u64::try_from(self.sum / u128::from(self.n.max(1))).unwrap_or(u64::MAX)
    }
}

/// RSS and disk over one interval.
#[derive(Clone, Copy)]
struct Band {
    rss: Readings,
    disk: Readings,
}

impl Band {
    fn of(rss: u64, disk: u64) -> Band {
        Band { rss: Readings::of(rss), disk: Readings::of(disk) }
    }

    fn add(self, rss: u64, disk: u64) -> Band {
        Band { rss: self.rss.add(rss), disk: self.disk.add(disk) }
    }
}

/// How far one quantity moved from the baseline interval, in percent: its mean either way
/// (judged), and its highest reading upward (reported). An interval's highest reading is one
/// moment: a tooth of disk's sawtooth (the log grows until a snapshot and is purged behind
/// it), or of RSS with a few 256 KiB bodies in flight at once, so it moves by a tenth from
/// minute to minute with nothing retained. A leak raises the mean, which averages 30
/// readings over several teeth.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Drift {
    mean: f64,
    high_up: f64,
}

impl Drift {
    fn between(base: &Readings, now: &Readings) -> Drift {
        let pct = |now: u64, then: u64| (now as f64 - then as f64) * 100.0 / (then.max(1) as f64);
        Drift { mean: pct(now.mean(), base.mean()).abs(), high_up: pct(now.high, base.high).max(0.0) }
    }

    fn worst(self, other: Drift) -> Drift {
        Drift { mean: self.mean.max(other.mean), high_up: self.high_up.max(other.high_up) }
    }

    fn within(&self, tolerance_pct: f64) -> bool {
        self.mean <= tolerance_pct
    }
}

/// A client's next start after the one due at `due`: one period on, or, when that has passed
/// already, the first slot of its own phase still ahead. A slow cycle does not buy a burst
/// afterwards (the pace is a ceiling), and clients that a stall held up all at once do not
/// leave it in step, firing together from then on (which raised the latency of the whole
/// rest of a run after one stall, docs/deployment.md).
fn next_due(due: Instant, period: Duration, now: Instant) -> Instant {
    let next = due + period;
    if next >= now || period.is_zero() {
        return next;
    }
    let missed = (now - next).as_nanos().div_ceil(period.as_nanos());
    next + period.mul_f64(missed as f64)
}

pub async fn soak(args: SoakArgs) -> Result<bool, String> {
    let mut config = ClientConfig::new(args.cluster.endpoints.iter().cloned());
    config.deadline = Duration::from_secs(10);
    let client = Client::new(config).map_err(|e| e.to_string())?;
    let procs = Procs::new(args.cluster.pids.clone());
    let nodes = args.cluster.pids.len().max(1) as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let window = Arc::new(Mutex::new(Window::default()));
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 2).map_err(|e| e.to_string())?));
    let run = format!("soak{}", std::process::id());
    let started = Instant::now();
    let per_client = Duration::from_secs_f64(args.clients as f64 / args.rate.max(1) as f64);
    // Every body is a prefix of one made up front, the largest `body_size` draws, so the load
    // loop formats no JSON.
    let bodies = Arc::new(crate::workload::response_body(BODY_MAX, args.seed));
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (client, stop, next, window, hist, run, bodies) =
            (client.clone(), stop.clone(), next.clone(), window.clone(), hist.clone(), run.clone(), bodies.clone());
        let (seed, ttl, clients) = (args.seed, Duration::from_secs(args.ttl_secs), args.clients.max(1));
        tasks.push(tokio::spawn(async move {
            let mut due = Instant::now() + per_client.mul_f64(c as f64 / clients as f64);
            while !stop.load(Ordering::Acquire) {
                tokio::time::sleep_until(due.into()).await;
                due = next_due(due, per_client, Instant::now());
                let i = next.fetch_add(1, Ordering::Relaxed);
                let key = format!("{run}-{i:012}");
                let size = body_size(mix(seed ^ i));
                let t = Instant::now();
                let opts = ClaimOptions { ttl: Some(ttl), ..ClaimOptions::default() };
                let result = match client.claim("soak", &key, "soaker", &opts).await {
                    Ok(Outcome::Acquired(g)) => {
                        let body = bodies[..size.min(bodies.len())].to_vec();
                        match client.complete("soak", &key, g.token, &StoredResponse::new(200, body)).await {
                            Ok(Outcome::Completed { .. }) => Ok(()),
                            Ok(other) => Err(format!("complete {key}: {other:?}")),
                            Err(e) => Err(format!("complete {key}: {e}")),
                        }
                    }
                    Ok(other) => Err(format!("claim of fresh key {key}: {other:?}")),
                    Err(e) => Err(format!("claim {key}: {e}")),
                };
                let us = t.elapsed().as_micros() as u64;
                let mut w = window.lock().unwrap_or_else(|e| e.into_inner());
                match result {
                    Ok(()) => {
                        w.cycles += 1;
                        w.bytes += size as u64;
                        let _ = hist.lock().unwrap_or_else(|e| e.into_inner()).record(us.max(1));
                    }
                    Err(e) => {
                        w.errors += 1;
                        w.first_error.get_or_insert(e);
                    }
                }
            }
        }));
    }

    let settle = Duration::from_secs(args.ttl_secs + args.every_secs);
    let every = Duration::from_secs(args.every_secs.max(1));
    let read = || (procs.rss_bytes() / nodes, args.cluster.data_dirs.iter().map(|d| dir_bytes(d)).sum::<u64>() / nodes);
    let mut baseline: Option<Band> = None;
    let mut worst = (Drift::default(), Drift::default());
    let mut terms = std::collections::BTreeSet::new();
    let mut failed_cycles = 0u64;
    let end = started + Duration::from_secs(args.secs);
    println!(
        "soak: {} s at {} cycles/s, TTL {} s, {} clients, seed {}",
        args.secs, args.rate, args.ttl_secs, args.clients, args.seed
    );
    println!(
        "   t |  cycles  err |   MB in | p50 ms  p99 ms |  records | RSS MiB/node low/mean/high | disk MiB/node low/mean/high | term"
    );
    let mut row_end = started + every;
    while Instant::now() < end {
        let row_end_now = row_end.min(end);
        let mut band: Option<Band> = None;
        loop {
            let now = Instant::now();
            tokio::time::sleep(SAMPLE_EVERY.min(row_end_now.saturating_duration_since(now))).await;
            let (rss, disk) = read();
            band = Some(band.map_or(Band::of(rss, disk), |a| a.add(rss, disk)));
            if Instant::now() >= row_end_now {
                break;
            }
        }
        row_end += every;
        let band = band.unwrap_or_else(|| {
            let (rss, disk) = read();
            Band::of(rss, disk)
        });
        let w = std::mem::take(&mut *window.lock().unwrap_or_else(|e| e.into_inner()));
        failed_cycles += w.errors;
        let (p50, p99) = {
            let mut h = hist.lock().unwrap_or_else(|e| e.into_inner());
            let q = (h.value_at_quantile(0.5) as f64 / 1000.0, h.value_at_quantile(0.99) as f64 / 1000.0);
            h.reset();
            q
        };
        let status = client.node_status(0).await.ok();
        let (records, term) = status.as_ref().map_or((0, 0), |s| (s.records, s.term));
        terms.insert(term);
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let three = |r: &Readings| format!("{:.0}/{:.0}/{:.0}", mib(r.low), mib(r.mean()), mib(r.high));
        println!(
            "{:>4} | {:>7} {:>4} | {:>7.1} | {:>6.1} {:>7.1} | {:>8} | {:>26} | {:>27} | {}{}",
            started.elapsed().as_secs(),
            w.cycles,
            w.errors,
            w.bytes as f64 / 1e6,
            p50,
            p99,
            records,
            three(&band.rss),
            three(&band.disk),
            term,
            w.first_error.map_or(String::new(), |e| format!("  (first error: {e})"))
        );
        if started.elapsed() >= settle {
            match &baseline {
                None => baseline = Some(band),
                Some(b) => {
                    worst.0 = worst.0.worst(Drift::between(&b.rss, &band.rss));
                    worst.1 = worst.1.worst(Drift::between(&b.disk, &band.disk));
                }
            }
        }
    }
    stop.store(true, Ordering::Release);
    for t in tasks {
        let _ = t.await;
    }
    let leader_changes = terms.len().saturating_sub(1);
    let healthy = failed_cycles == 0 && leader_changes == 0;
    println!("soak: {failed_cycles} failed cycles; terms seen {terms:?} ({leader_changes} leader changes)");
    if baseline.is_none() {
        println!("soak: the run was shorter than one TTL period plus one report; no reading of RSS and disk drift");
        return Ok(healthy && args.smoke);
    }
    let flat = worst.0.within(args.tolerance_pct) && worst.1.within(args.tolerance_pct);
    println!(
        "soak: after the first TTL period, against the first interval after it: the mean RSS of an interval moved at most {:.1}% (its highest reading rose at most {:.1}%), the mean disk at most {:.1}% (highest reading {:.1}%); tolerance {}% of the mean: {}",
        worst.0.mean,
        worst.0.high_up,
        worst.1.mean,
        worst.1.high_up,
        args.tolerance_pct,
        match (args.smoke, flat) {
            (true, _) => "not judged in a smoke run",
            (false, true) => "flat",
            (false, false) => "NOT flat",
        }
    );
    Ok(healthy && (args.smoke || flat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_mix_spans_64_bytes_to_256_kib_with_a_heavy_tail() {
        let sizes: Vec<usize> = (0..10_000).map(|i| body_size(mix(i))).collect();
        assert!(sizes.iter().all(|s| (64..=256 * 1024).contains(s)));
        let large = sizes.iter().filter(|s| **s >= 128 * 1024).count();
        let small = sizes.iter().filter(|s| **s <= 2048).count();
        assert!((200..=400).contains(&large), "{large} of 10000 at 128 KiB or more");
        assert!((5500..=6500).contains(&small), "{small} of 10000 at 2 KiB or less");
    }

    #[test]
    fn a_sawtooth_that_gives_space_back_is_flat_and_a_leak_is_not() {
        let interval = |vals: &[u64]| vals[1..].iter().fold(Readings::of(vals[0]), |r, v| r.add(*v));
        let base = interval(&[100, 130, 160, 100, 130, 160]);
        // Lower teeth: the highest reading falls 6 %, the mean stays.
        let lower = interval(&[110, 125, 136, 110, 125, 136, 150]);
        let d = Drift::between(&base, &lower);
        assert_eq!(d.high_up, 0.0);
        assert!(d.mean < 5.0 && d.within(10.0), "{d:?}");
        // One moment 12 % higher (a burst of large bodies in flight): reported, not drift.
        let burst = interval(&[100, 130, 160, 100, 130, 179]);
        let d = Drift::between(&base, &burst);
        assert!(d.high_up > 11.0 && d.within(10.0), "{d:?}");
        // Every tooth 15 % higher: both figures see it.
        let leak = interval(&[115, 150, 184, 115, 150, 184]);
        let d = Drift::between(&base, &leak);
        assert!(d.high_up > 14.0 && d.mean > 14.0 && !d.within(10.0), "{d:?}");
        // A mean that moves more than the tolerance, either way, is drift.
        let emptied = interval(&[50, 60, 70, 50, 60, 70]);
        assert!(!Drift::between(&base, &emptied).within(10.0));
        assert_eq!(Drift::between(&base, &leak).worst(Drift::between(&base, &lower)), Drift::between(&base, &leak));
    }

    #[test]
    fn a_client_held_up_skips_the_slots_it_missed_and_keeps_its_phase() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // In time: one period on.
        assert_eq!(next_due(t0, ms(160), t0 + ms(5)), t0 + ms(160));
        // Held up past three slots: the next slot of its own phase, not now.
        assert_eq!(next_due(t0, ms(160), t0 + ms(500)), t0 + ms(640));
        // Exactly on a slot.
        assert_eq!(next_due(t0, ms(160), t0 + ms(320)), t0 + ms(320));
        // Two clients a quarter period apart, held up by the same stall, stay apart.
        let (a, b) = (next_due(t0, ms(160), t0 + ms(1000)), next_due(t0 + ms(40), ms(160), t0 + ms(1000)));
        assert_eq!(((a - t0).as_millis() % 160, (b - t0).as_millis() % 160), (0, 40));
        assert!(a >= t0 + ms(1000) && b >= t0 + ms(1000));
    }
}
