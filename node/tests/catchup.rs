//! Large responses against availability, on a real 3-node cluster: a follower that was down
//! while large-body writes went on restarts and catches up without any leader change and
//! without a gap in service, and the whole cluster, restarted on that data, serves again
//! within seconds. Run idle and with two CPU hogs beside the nodes (a busy machine is where
//! large AppendEntries used to miss their deadline and restarts deposed the leader).
//!
//! `IDEMRAFT_CATCHUP_CYCLES` sets how many 250 KiB responses are written while the follower
//! is down (default 120, 30 MB; 300 reproduces the 75 MB scenario this test was written for).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{incompressible, key, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Client, ClientConfig, Outcome, StoredResponse};
use tokio::time::Instant;

const SCOPE: &str = "orders.create";
const BODY: usize = 250 * 1024;

/// Busy loops in child processes, stopped when dropped (also when the test fails).
struct Hogs(Vec<Child>);

impl Hogs {
    fn start(n: usize) -> Hogs {
        Hogs((0..n).map(|_| Command::new("yes").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()).collect())
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn cycles() -> u64 {
    std::env::var("IDEMRAFT_CATCHUP_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(120)
}

/// A body of `size` bytes that names its key, so a replay from the wrong record shows, and
/// does not compress, so the entries a follower must catch up on are as large as the bodies.
fn body_of(k: &str, size: usize) -> Vec<u8> {
    incompressible(k.as_bytes(), size)
}

fn body_for(k: &str) -> Vec<u8> {
    body_of(k, BODY)
}

/// Claims and completes keys `prefix`-0 .. `prefix`-(n-1), one after another, with bodies of
/// `size` bytes.
async fn write_large_of(client: &Client, prefix: &str, n: u64, size: usize) {
    for i in 0..n {
        let k = key(prefix, i);
        let g = match client.claim(SCOPE, &k, "writer", &ClaimOptions::default()).await {
            Ok(Outcome::Acquired(g)) => g,
            other => panic!("claim {k}: {other:?}"),
        };
        match client.complete(SCOPE, &k, g.token, &StoredResponse::new(200, body_of(&k, size))).await {
            Ok(Outcome::Completed { .. }) => {}
            other => panic!("complete {k}: {other:?}"),
        }
    }
}

async fn write_large(client: &Client, prefix: &str, n: u64) {
    write_large_of(client, prefix, n, BODY).await
}

/// Claims a fresh key through one node every 100 ms until `stop`, recording when each
/// succeeded, and the longest stretch without a success after the first one.
async fn probe(client: Client, node: u64, stop: Arc<std::sync::atomic::AtomicBool>) -> (u64, u64, Duration) {
    let (mut ok, mut failed) = (0u64, 0u64);
    let mut last_ok: Option<Instant> = None;
    let mut longest = Duration::ZERO;
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Acquire) && i < 10_000 {
        i += 1;
        let k = key(&format!("probe{node}"), i);
        let opts = ClaimOptions::default();
        let call = client.claim(SCOPE, &k, "prober", &opts);
        match tokio::time::timeout(Duration::from_secs(3), call).await {
            Ok(Ok(Outcome::Acquired(_))) => {
                ok += 1;
                let now = Instant::now();
                if let Some(prev) = last_ok {
                    longest = longest.max(now - prev);
                }
                last_ok = Some(now);
            }
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(prev) = last_ok {
        longest = longest.max(prev.elapsed());
    }
    (ok, failed, longest)
}

/// Every node's (term, leader) as it reports them; nodes that do not answer are left out.
async fn terms(cluster: &Cluster) -> BTreeMap<u64, (u64, u64)> {
    let mut out = BTreeMap::new();
    for id in cluster.running() {
        if let Ok(s) = cluster.client_for(&[id]).node_status(0).await {
            out.insert(id, (s.term, s.leader_id));
        }
    }
    out
}

/// Bytes of the files under `path`, each file once: a snapshot's hard links to the blobs it
/// shares with the live state cost no space of their own.
fn du(path: &std::path::Path) -> u64 {
    fn walk(path: &std::path::Path, seen: &mut std::collections::BTreeSet<(u64, u64)>) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let mut total = 0;
        if let Ok(entries) = std::fs::read_dir(path) {
            for e in entries.flatten() {
                match e.metadata() {
                    Ok(m) if m.is_dir() => total += walk(&e.path(), seen),
                    Ok(m) if seen.insert((m.dev(), m.ino())) => total += m.len(),
                    _ => {}
                }
            }
        }
        total
    }
    walk(path, &mut Default::default())
}

async fn scenario(hogs: usize) {
    let _serial = SERIAL.lock().await;
    let n = cycles();
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let other = (1..=3).find(|i| *i != leader && *i != follower).unwrap();
    let writer = cluster.client_for(&[leader]);
    write_large(&writer, "warm", 3).await;

    cluster.kill(follower);
    let t = Instant::now();
    write_large(&writer, "big", n).await;
    eprintln!(
        "wrote {n} responses of {BODY} bytes ({:.1} MB) with node {follower} down in {:.1} s",
        (n as usize * BODY) as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    let before = terms(&cluster).await;
    let (term, _) = before[&leader];
    let target = writer.node_status(0).await.unwrap().applied_index;

    let _hogs = Hogs::start(hogs);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probes: Vec<_> = [leader, other, follower]
        .into_iter()
        .map(|id| {
            let mut config = ClientConfig::new([cluster.client_addr(id)]);
            config.deadline = Duration::from_secs(2);
            tokio::spawn(probe(Client::new(config).unwrap(), id, stop.clone()))
        })
        .collect();
    // 60 s, the bound the scenario is held to; a state over 1 GiB (the by-hand 5 GB variant)
    // must be sent as a snapshot and is given 32 s more per GiB beyond that (32 MiB/s).
    let written = n * BODY as u64;
    let catch_up_bound = Duration::from_secs(60 + written.saturating_sub(1 << 30) / (32 << 20));
    let restarted = Instant::now();
    cluster.restart(follower);

    // Caught up: the follower applied everything the leader had when it restarted.
    let seen = Arc::new(Mutex::new(BTreeMap::<u64, (u64, u64)>::new()));
    let status = cluster.client_for(&[follower]);
    let caught_up = loop {
        for (id, tl) in terms(&cluster).await {
            seen.lock().unwrap().insert(id * 1_000_000 + tl.0, tl);
        }
        if let Ok(s) = status.node_status(0).await {
            if s.applied_index >= target {
                break restarted.elapsed();
            }
        }
        if restarted.elapsed() > catch_up_bound + Duration::from_secs(30) {
            cluster.dump_logs();
            panic!(
                "node {follower} did not catch up to index {target} within {catch_up_bound:?} + 30 s (hogs: {hogs})"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Keep probing a little past the catch-up: that is when a deposed leader would show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut results = Vec::new();
    for p in probes {
        results.push(p.await.unwrap());
    }
    let after = terms(&cluster).await;
    eprintln!(
        "hogs {hogs}: node {follower} caught up to index {target} in {:.1} s; terms before {before:?}, after {after:?}",
        caught_up.as_secs_f64()
    );
    for ((ok, failed, longest), id) in results.iter().zip([leader, other, follower]) {
        eprintln!(
            "  probes through node {id}: {ok} ok, {failed} failed, longest stretch without a success {} ms",
            longest.as_millis()
        );
    }
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.values().all(|(t, l)| *t == term && (*l == leader || *l == 0)),
        "a leader change happened during the catch-up (term was {term}, leader {leader}): {seen:?}"
    );
    assert!(after.values().all(|(t, l)| *t == term && *l == leader), "term or leader moved: {after:?}");
    assert!(caught_up < catch_up_bound, "catch-up took {caught_up:?} (bound {catch_up_bound:?})");
    for ((ok, _, longest), id) in results.iter().zip([leader, other]) {
        assert!(*ok > 0, "no probe through node {id} succeeded");
        assert!(*longest <= Duration::from_secs(2), "probes through node {id} failed for {longest:?}");
    }

    let payload = (n as usize + 3) * BODY;
    for id in 1..=3 {
        let dir = cluster.data_dir(id);
        eprintln!(
            "  node {id}: {:.1} MB on disk for {:.1} MB of responses (db {:.1} MB, log {:.1} MB)",
            du(&dir) as f64 / 1e6,
            payload as f64 / 1e6,
            du(&dir.join("db")) as f64 / 1e6,
            du(&dir.join("log")) as f64 / 1e6
        );
    }

    // The whole cluster down and up on the same data: the first claim within 10 s.
    for id in 1..=3 {
        assert!(cluster.terminate(id, Duration::from_secs(15)).is_some(), "node {id} did not stop on SIGTERM");
    }
    let up = Instant::now();
    for id in 1..=3 {
        cluster.restart(id);
    }
    let mut config = ClientConfig::new((1..=3).map(|i| cluster.client_addr(i)));
    config.deadline = Duration::from_secs(30);
    let client = Client::new(config).unwrap();
    let first = loop {
        let k = key("after-restart", up.elapsed().as_millis() as u64);
        if let Ok(Ok(Outcome::Acquired(_))) =
            tokio::time::timeout(Duration::from_secs(2), client.claim(SCOPE, &k, "first", &ClaimOptions::default()))
                .await
        {
            break up.elapsed();
        }
        if up.elapsed() > Duration::from_secs(60) {
            cluster.dump_logs();
            panic!("no claim succeeded within 60 s of restarting the whole cluster (hogs: {hogs})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("hogs {hogs}: first claim {:.1} s after the whole cluster restarted", first.as_secs_f64());
    for id in 1..=3 {
        let log = std::fs::read_to_string(cluster.log_path(id)).unwrap_or_default();
        let starts: Vec<&str> = log
            .lines()
            .filter(|l| {
                l.contains("opened")
                    || l.contains("node started")
                    || l.contains("election")
                    || l.contains("clean")
                    || l.contains("a snapshot")
                    || l.contains("streamed snapshot")
            })
            .collect();
        for l in starts.iter().rev().take(8).rev() {
            eprintln!("  node {id}: {l}");
        }
    }
    // Every large response is still there, byte for byte.
    for i in (0..n).step_by(7) {
        let k = key("big", i);
        match client.claim(SCOPE, &k, "auditor", &ClaimOptions::default()).await.unwrap() {
            Outcome::Replay { response, .. } => assert!(response.body == body_for(&k), "{k} replayed other bytes"),
            other => panic!("{k}: {other:?}"),
        }
    }
    // The release build serves within 10 s (docs/operations.md quotes it). The debug build CI
    // runs opens sled and rebuilds the indexes many times slower (7-12 s with the hogs), so
    // it gets 30 s: the bound still catches a cluster that cannot elect after a restart.
    let bound = if cfg!(debug_assertions) { Duration::from_secs(30) } else { Duration::from_secs(10) };
    assert!(first < bound, "first claim after a whole-cluster restart took {first:?} (bound {bound:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_restarted_after_large_writes_catches_up_without_a_leader_change() {
    scenario(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_with_two_cpu_hogs_beside_the_nodes() {
    scenario(2).await;
}

/// The largest responses the limits allow (4 MiB with `--max-response-bytes 4194304`), written
/// concurrently so batches form, while a follower is down: every entry and every AppendEntries
/// stays within its byte bound, so the follower catches up and serves each one byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_largest_allowed_responses_replicate_to_a_follower_that_was_down() {
    let _serial = SERIAL.lock().await;
    const MAX: usize = 4 * 1024 * 1024;
    let mut cluster = Cluster::start(3, &["--max-response-bytes", "4194304"]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    cluster.kill(follower);
    let writer = cluster.client_for(&[leader]);
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let writer = writer.clone();
        tasks.push(tokio::spawn(async move { write_large_of(&writer, &format!("max{w}"), 3, MAX).await }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let target = writer.node_status(0).await.unwrap().applied_index;
    let restarted = Instant::now();
    cluster.restart(follower);
    cluster.wait_applied(follower, target, Duration::from_secs(60)).await;
    eprintln!("12 responses of 4 MiB: node {follower} caught up in {:.1} s", restarted.elapsed().as_secs_f64());
    let reader = cluster.client_for(&[follower]);
    for w in 0..4u64 {
        for i in 0..3u64 {
            let k = key(&format!("max{w}"), i);
            match reader.claim(SCOPE, &k, "auditor", &ClaimOptions::default()).await.unwrap() {
                Outcome::Replay { response, .. } => {
                    assert!(response.body == body_of(&k, MAX), "{k} replayed other bytes")
                }
                other => panic!("{k}: {other:?}"),
            }
        }
    }
}
