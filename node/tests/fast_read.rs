//! The replay fast path on a real 3-node cluster: with it on and off, a replay and a mismatch
//! answer the same fields from the same stored record, and with it on they cost no log entry,
//! and most of them no round trip to the followers either (the leader lease).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{get, key, scrape, Cluster, SERIAL};
use idemraft_client::{fingerprint, ClaimOptions, Client, Outcome, StoredResponse};

const SCOPE: &str = "payments.create";
const REPLAYS: u64 = 200;

async fn last_log_index(client: &Client, cluster: &Cluster) -> u64 {
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(10)).await;
    client.node_status((leader - 1) as usize).await.unwrap().last_log_index
}

/// Completes a key, then replays it REPLAYS times through a follower and the leader alike;
/// returns the log entries those replays added.
async fn replays(fast: bool) -> u64 {
    let cluster = Cluster::start(3, &["--replay-fast-path", if fast { "true" } else { "false" }]).await;
    let client = cluster.client();
    let k = key("fastread", 1);
    let fp = fingerprint("POST", "/v1/charges", Some(br#"{"amount":1}"#));
    let other = fingerprint("POST", "/v1/charges", Some(br#"{"amount":2}"#));
    let opts = ClaimOptions { fingerprint: Some(fp), ..Default::default() };
    let Outcome::Acquired(g) = client.claim(SCOPE, &k, "a", &opts).await.unwrap() else { panic!("not acquired") };
    let response = StoredResponse::new(201, vec![7u8; 256]).with_header("location", "/v1/charges/1");
    client.complete(SCOPE, &k, g.token, &response).await.unwrap();
    let record = client.get(SCOPE, &k).await.unwrap().expect("the record");

    let before = last_log_index(&client, &cluster).await;
    let started = tokio::time::Instant::now();
    for i in 0..REPLAYS {
        // Alternate a claim without a fingerprint and one with the bound fingerprint.
        let o = if i % 2 == 0 { ClaimOptions::default() } else { opts.clone() };
        match client.claim(SCOPE, &k, "b", &o).await.unwrap() {
            Outcome::Replay { token, completed_ms, response: r } => {
                assert_eq!(token, g.token);
                assert_eq!(completed_ms, record.completed_ms);
                assert_eq!(r, response, "fast path {fast}");
            }
            other => panic!("fast path {fast}: expected REPLAY, got {other:?}"),
        }
    }
    let mismatch = ClaimOptions { fingerprint: Some(other), ..Default::default() };
    assert_eq!(client.claim(SCOPE, &k, "c", &mismatch).await.unwrap(), Outcome::Mismatch);
    let added = last_log_index(&client, &cluster).await - before;
    // The leader proposes one sweep per second, which also lands in the log.
    let sweeps = started.elapsed().as_secs() + 2;
    if fast {
        assert!(added <= sweeps, "{added} entries for {REPLAYS} replays on the fast path");
        // One confirmation per claim here (they come one at a time); a round earns a lease
        // that serves the claims of the next quarter election timeout.
        let (mut lease, mut rounds) = (0.0, 0.0);
        for id in 1..=3 {
            let page = scrape(&cluster, id).await;
            lease += get(&page, r#"idemraft_replay_confirmations_total{via="lease"}"#);
            rounds += get(&page, r#"idemraft_replay_confirmations_total{via="read_index"}"#);
        }
        println!("fast path confirmations: {lease} under the lease, {rounds} read-index rounds");
        assert!(lease + rounds >= (REPLAYS + 1) as f64, "{lease} + {rounds} confirmations for {REPLAYS} replays");
        assert!(lease >= (REPLAYS / 2) as f64, "only {lease} of the confirmations under the lease ({rounds} rounds)");
    } else {
        assert!(added >= REPLAYS, "{added} entries for {REPLAYS} replays on the log path");
    }
    added
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_answer_alike_on_both_paths_and_the_fast_one_writes_nothing() {
    let _serial = SERIAL.lock().await;
    let fast = replays(true).await;
    let log = replays(false).await;
    println!("log entries for {REPLAYS} replays: {fast} with the fast path, {log} without");
}
