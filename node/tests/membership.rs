//! Membership changes on a real 5-node cluster under light load: add a learner, promote it,
//! remove a voter (the leader, to make it hard). No SDK call may fail beyond the retried
//! UNAVAILABLEs the SDK absorbs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{key, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Outcome, StoredResponse};

const SCOPE: &str = "webhooks.deliver";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_learner_promote_and_remove_a_voter_under_load() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(5, &[]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3, 4, 5], Duration::from_secs(30)).await;
    // The load talks to nodes 2..5 and the newcomer, so removing node 1 later costs it no endpoint.
    let load_client = cluster.client_for(&[2, 3, 4, 5, 6]);
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut done = 0u64;
            // Bounded in count; stopped by the flag.
            while !stop.load(Ordering::Relaxed) && done < 50_000 {
                let k = key("load", done);
                let g = match load_client.claim(SCOPE, &k, "loader", &ClaimOptions::default()).await {
                    Ok(Outcome::Acquired(g)) => g,
                    other => return Err(format!("claim {k}: {other:?}")),
                };
                match load_client.complete(SCOPE, &k, g.token, &StoredResponse::new(200, "ok")).await {
                    Ok(Outcome::Completed { .. }) => {}
                    other => return Err(format!("complete {k}: {other:?}")),
                }
                done += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(done)
        })
    };

    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.spawn(6, false);
    let admin = cluster.client_for(&[2, 3, 4, 5]);
    let m = admin.add_learner(6, &cluster.peer_addr(6), true).await.unwrap();
    assert!(m.members.iter().any(|x| x.id == 6 && !x.voter), "{m:?}");
    let m = admin.promote(&[6]).await.unwrap();
    assert!(m.members.iter().any(|x| x.id == 6 && x.voter), "{m:?}");
    assert_eq!(m.members.iter().filter(|x| x.voter).count(), 6);

    // Remove the leader itself: a new leader takes over among the rest.
    let m = admin.remove(&[leader]).await.unwrap();
    assert!(!m.members.iter().any(|x| x.id == leader), "{m:?}");
    assert_eq!(m.members.iter().filter(|x| x.voter).count(), 5);
    cluster.kill(leader);
    let remaining: Vec<u64> = (1..=6).filter(|i| *i != leader).collect();
    let new_leader = cluster.wait_for_leader_other_than(&remaining, leader, Duration::from_secs(30)).await;
    assert_ne!(new_leader, leader);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    let done = load.await.unwrap().unwrap_or_else(|e| panic!("a call failed during the membership changes: {e}"));
    assert!(done > 20, "too little load: {done}");
    let members = cluster.client_for(&remaining).members().await.unwrap();
    let mut voters: Vec<u64> = members.members.iter().filter(|m| m.voter).map(|m| m.id).collect();
    voters.sort_unstable();
    assert_eq!(voters, remaining);
}
