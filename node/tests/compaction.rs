//! Snapshots by log size on real processes: with `--snapshot-every` far away, a log that grows
//! past `--snapshot-log-bytes` with large responses gets a snapshot on every node (after which
//! openraft purges the log behind it), and the bodies stay in packs that the snapshot links
//! instead of copying.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{get, incompressible, key, scrape, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Client, Outcome, StoredResponse};
use tokio::time::Instant;

const SCOPE: &str = "orders.create";

/// Claims `k` (it must be new) and completes it with a body of `size` bytes that starts with
/// the key, padded with `pad` or, when `pad` is `None`, with bytes that do not compress (so
/// the log grows by the whole body).
async fn claim_and_complete(
    client: &Client,
    k: &str,
    size: usize,
    pad: Option<u8>,
) -> Result<(), idemraft_client::Error> {
    let g = match client.claim(SCOPE, k, "w", &ClaimOptions::default()).await.unwrap() {
        Outcome::Acquired(g) => g,
        other => panic!("{other:?}"),
    };
    let body = match pad {
        Some(pad) => {
            let mut body = k.as_bytes().to_vec();
            body.resize(size, pad);
            body
        }
        None => incompressible(k.as_bytes(), size),
    };
    client.complete(SCOPE, k, g.token, &StoredResponse::new(200, body)).await.map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_log_past_its_byte_bound_is_snapshotted_on_every_node() {
    let _serial = SERIAL.lock().await;
    // 16 MiB: the smallest bound the node accepts with the default 1 MiB entries.
    let cluster = Cluster::start(3, &["--snapshot-every", "1000000", "--snapshot-log-bytes", "16777216"]).await;
    let client = cluster.client();
    // 160 bodies of 200 KiB: 32 MB, twice the bound, one claim and complete at a time.
    for i in 0..160u64 {
        let k = key("big", i);
        claim_and_complete(&client, &k, 200 * 1024, None).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for id in 1..=3 {
        loop {
            let m = scrape(&cluster, id).await;
            let snapshot = get(&m, "idemraft_raft_snapshot_index");
            let blobs = get(&m, "idemraft_blob_size_bytes");
            let snap_bytes = get(&m, "idemraft_snapshot_size_bytes");
            if snapshot > 0.0 && blobs >= 160.0 * 200.0 * 1024.0 {
                // The snapshot links the bodies: its own files are a small fraction of them.
                assert!(snap_bytes < blobs / 10.0, "node {id}: snapshot {snap_bytes} B for {blobs} B of blobs");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id}: no snapshot by log size within 30 s (snapshot index {snapshot}, blobs {blobs} B)"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // Every body still replays byte for byte after the purge.
    for i in (0..160u64).step_by(17) {
        let k = key("big", i);
        match client.claim(SCOPE, &k, "auditor", &ClaimOptions::default()).await.unwrap() {
            Outcome::Replay { response, .. } => {
                assert_eq!(response.body.len(), 200 * 1024, "{k}");
                assert!(response.body.starts_with(k.as_bytes()), "{k}");
            }
            other => panic!("{k}: {other:?}"),
        }
    }
}

/// A follower that was down while the log moved past what the others keep catches up from a
/// snapshot (sent as one `StreamSnapshot` stream), its blobs streamed after its records, and ends with the same state (bodies
/// included) as the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_behind_a_purged_log_installs_a_snapshot_with_its_blobs() {
    let _serial = SERIAL.lock().await;
    // Snapshots every 100 entries; the leader keeps 1000 entries behind its snapshot, so a
    // follower more than ~1100 entries behind can only catch up from a snapshot.
    let mut cluster = Cluster::start(3, &["--snapshot-every", "100"]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(follower);
    let others: Vec<u64> = (1..=3).filter(|id| *id != follower).collect();
    let client = cluster.client_for(&others);
    // 800 cycles, each its own two entries: 1600 entries, past what the leader keeps.
    // Two thirds of the bodies go to packs (900 B to 24 KiB, and 64–80 KiB, whose released
    // ranges are punched out), the rest stay inline.
    for i in 0..800u64 {
        let k = key("catch", i);
        let size = match i % 3 {
            0 => 300,
            1 => 900 + (i as usize % 6) * 4 * 1024,
            _ => 64 * 1024 + (i as usize % 5) * 4 * 1024,
        };
        if let Err(e) = claim_and_complete(&client, &k, size, Some(b'#')).await {
            cluster.dump_logs();
            panic!("complete {k}: {e}");
        }
    }
    let target = client.node_status(0).await.unwrap().applied_index;
    cluster.restart(follower);
    cluster.wait_applied(follower, target, Duration::from_secs(90)).await;
    // The sweeper appends an entry every second: ask the three replicas at once, and compare
    // the digests of a round in which all three answered at one index.
    let all = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (a, b, c) = tokio::join!(all.node_digest(0), all.node_digest(1), all.node_digest(2));
        if let (Ok(a), Ok(b), Ok(c)) = (a, b, c) {
            if a.digest_index == b.digest_index && b.digest_index == c.digest_index {
                assert!(
                    a.state_digest == b.state_digest && b.state_digest == c.state_digest,
                    "replicas differ at index {}",
                    a.digest_index
                );
                break;
            }
        }
        assert!(Instant::now() < deadline, "the three replicas never answered at one index within 60 s");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let m = scrape(&cluster, follower).await;
    assert!(get(&m, "idemraft_raft_snapshot_index") > 0.0, "the follower caught up from a snapshot");
    assert!(get(&m, "idemraft_blob_size_bytes") > 0.0, "and holds the bodies in packs");
    let log = std::fs::read_to_string(cluster.log_path(follower)).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    assert!(log.contains("installed a snapshot from the leader"), "the follower's log shows no install: {tail:#?}");
    assert!(log.contains("received a streamed snapshot"), "the snapshot did not come as one stream: {tail:#?}");
}
