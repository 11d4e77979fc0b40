//! A rolling restart under load: 3 nodes, 8 SDK workers claiming and completing; each node
//! in turn gets SIGTERM, exits cleanly, restarts from its data directory and catches up
//! before the next one goes. No SDK call may fail (the SDK retries within its deadline), and
//! every acknowledged completion replays afterwards. A third of the bodies are JSON of 2 to
//! 64 KiB, most of which the leaders log compressed, so restarted nodes re-apply compressed entries
//! from their logs. A node of the release before compressed commands still gets its link.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{key, scrape, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Client, Outcome, StoredResponse};
use idemraft_node::cluster::link::PREFACE_V1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const SCOPE: &str = "rolling.restart";

type Acked = (String, u64, Vec<u8>);

/// Claim + complete until `stop` (bounded in count and time); returns the number of cycles,
/// or the first failed call.
async fn worker(client: Client, w: u64, stop: Arc<AtomicBool>, acked: Arc<Mutex<Vec<Acked>>>) -> Result<u64, String> {
    let end = Instant::now() + Duration::from_secs(180);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end && i < 100_000 {
        i += 1;
        let k = key(&format!("r{w}"), i);
        let owner = format!("worker-{w}-{i}");
        let g = match client.claim(SCOPE, &k, &owner, &ClaimOptions::default()).await {
            Ok(Outcome::Acquired(g)) => g,
            Ok(other) => return Err(format!("claim of fresh key {k}: {other:?}")),
            Err(e) => return Err(format!("claim {k} failed: {e}")),
        };
        let body = match i % 3 {
            0 => json(2048 + (i as usize * 7919) % (62 * 1024), i),
            _ => format!("result of {k} under {}", g.token).into_bytes(),
        };
        match client.complete(SCOPE, &k, g.token, &StoredResponse::new(200, body.clone())).await {
            Ok(Outcome::Completed { .. }) => {}
            Ok(other) => return Err(format!("complete {k}: {other:?}")),
            Err(e) => return Err(format!("complete {k} failed: {e}")),
        }
        acked.lock().unwrap().push((k, g.token, body));
    }
    Ok(i)
}

/// A JSON-like body of `len` bytes, which compresses as API responses do.
fn json(len: usize, seed: u64) -> Vec<u8> {
    let mut s = String::with_capacity(len + 100);
    let mut i = seed;
    while s.len() < len {
        i = i.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s.push_str(&format!("{{\"id\":\"ch_{:016x}\",\"amount\":{},\"status\":\"succeeded\"}},", i, i % 100_000));
    }
    s.truncate(len);
    s.into_bytes()
}

/// Waits until node `id` has applied what the leader had when it came back.
async fn wait_caught_up(cluster: &Cluster, id: u64, within: Duration) {
    let leader = cluster.wait_for_leader(&[1, 2, 3], within).await;
    let target = cluster.client_for(&[leader]).node_status(0).await.unwrap().last_log_index;
    cluster.wait_applied(id, target, within).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restart_under_load_fails_no_call_and_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, &[]).await;
    // A sender of the release before opens with its own preface and gets it echoed.
    let mut older = tokio::net::TcpStream::connect(cluster.peer_addr(1)).await.unwrap();
    older.write_all(PREFACE_V1).await.unwrap();
    let mut echo = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(5), older.read_exact(&mut echo)).await.unwrap().unwrap();
    assert_eq!(&echo, PREFACE_V1, "the peer port must keep serving the previous release's link");
    drop(older);
    let client = cluster.client();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> =
        (0..8).map(|w| tokio::spawn(worker(client.clone(), w, stop.clone(), acked.clone()))).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;

    for id in [1u64, 2, 3] {
        let before = acked.lock().unwrap().len();
        let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
        let t = Instant::now();
        let status = cluster.terminate(id, Duration::from_secs(20));
        assert!(status.is_some_and(|s| s.success()), "node {id} did not stop cleanly on SIGTERM: {status:?}");
        let stopped_in = t.elapsed();
        // Some load while it is down.
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.restart(id);
        wait_caught_up(&cluster, id, Duration::from_secs(30)).await;
        let after = acked.lock().unwrap().len();
        eprintln!(
            "node {id} ({}) stopped in {stopped_in:?}, back and caught up {:?} after SIGTERM; {} cycles meanwhile",
            if id == leader { "leader" } else { "follower" },
            t.elapsed(),
            after - before
        );
        assert!(after > before, "no progress while node {id} restarted");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut cycles = 0;
    for w in workers {
        match w.await.unwrap() {
            Ok(n) => cycles += n,
            Err(e) => panic!("an SDK call failed during the rolling restart: {e}"),
        }
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!("{cycles} cycles, {} acknowledged completions, zero failed calls", acked.len());
    let mut compressed = 0.0;
    for n in [1u64, 2, 3] {
        compressed += scrape(&cluster, n).await.get("idemraft_compressed_commands_total").copied().unwrap_or(0.0);
    }
    eprintln!("{compressed} commands compressed by the leaders since their last restart");
    assert!(compressed > 0.0, "no leader compressed a large body");
    assert!(acked.len() > 100, "too little load: {}", acked.len());

    // Every acknowledged completion replays, through every node.
    for n in [1u64, 2, 3] {
        let c = cluster.client_for(&[n]);
        for (k, token, body) in acked.iter().step_by(if n == 1 { 1 } else { 7 }) {
            match c.claim(SCOPE, k, "auditor", &ClaimOptions::default()).await.unwrap() {
                Outcome::Replay { token: t, response, .. } => {
                    assert_eq!(t, *token, "{k}");
                    assert_eq!(&response.body, body, "{k}");
                }
                other => panic!("acknowledged completion of {k} lost: {other:?}"),
            }
        }
    }
}
