//! Crashes on a real cluster: SIGKILL the leader under SDK load, SIGKILL every node at once,
//! lose the quorum, stop a node with SIGTERM. Nothing acknowledged may be lost, tokens only
//! grow, and a call without a quorum answers within its deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{key, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Client, ClientConfig, Error, Outcome, StoredResponse};
use tokio::time::Instant;

const SCOPE: &str = "orders.create";

/// One acknowledged completion: the key, its token, its body, and when it was acknowledged.
#[derive(Clone, Debug)]
struct Acked {
    key: String,
    /// When the claim was sent.
    invoked: Instant,
    token: u64,
    body: Vec<u8>,
    at: Instant,
}

/// Claim + complete as fast as possible for `run_for`, recording every acknowledged cycle.
async fn worker(client: Client, w: u64, run_for: Duration, acked: Arc<Mutex<Vec<Acked>>>) -> Result<u64, String> {
    let end = Instant::now() + run_for;
    let mut i = 0u64;
    // Bounded in count and time.
    while Instant::now() < end && i < 100_000 {
        i += 1;
        let k = key(&format!("w{w}"), i);
        let owner = format!("worker-{w}-{i}");
        let invoked = Instant::now();
        let g = match client.claim(SCOPE, &k, &owner, &ClaimOptions::default()).await {
            Ok(Outcome::Acquired(g)) => g,
            Ok(other) => return Err(format!("claim of fresh key {k}: {other:?}")),
            Err(e) => return Err(format!("claim {k}: {e}")),
        };
        let body = format!("result of {k} under {}", g.token).into_bytes();
        match client.complete(SCOPE, &k, g.token, &StoredResponse::new(200, body.clone())).await {
            Ok(Outcome::Completed { .. }) => {}
            Ok(other) => return Err(format!("complete {k}: {other:?}")),
            Err(e) => return Err(format!("complete {k}: {e}")),
        }
        acked.lock().unwrap().push(Acked { key: k, invoked, token: g.token, body, at: Instant::now() });
    }
    Ok(i)
}

async fn check_replays(client: &Client, acked: &[Acked]) {
    for a in acked {
        match client.claim(SCOPE, &a.key, "auditor", &ClaimOptions::default()).await.unwrap() {
            Outcome::Replay { token, response, .. } => {
                assert_eq!(token, a.token, "{}", a.key);
                assert_eq!(response.body, a.body, "{}", a.key);
            }
            other => panic!("acknowledged completion of {} lost: {other:?}", a.key),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_sigkill_under_load_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let client = cluster.client();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> =
        (0..8).map(|w| tokio::spawn(worker(client.clone(), w, Duration::from_secs(6), acked.clone()))).collect();

    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before: Vec<Acked> = acked.lock().unwrap().clone();
    assert!(before.len() > 20, "too little load before the crash: {} cycles", before.len());
    let max_before = before.iter().map(|a| a.token).max().unwrap();
    let killed_at = Instant::now();
    cluster.kill(leader);

    let mut cycles = 0;
    for w in workers {
        cycles += w.await.unwrap().unwrap_or_else(|e| panic!("a worker saw a failed call: {e}"));
    }
    let all = acked.lock().unwrap().clone();
    // Cycles begun after the crash: they can only have been served by a new leader.
    let after: Vec<&Acked> = all.iter().filter(|a| a.invoked > killed_at).collect();
    assert!(!after.is_empty(), "no cycle completed after the leader was killed");
    let first_after = after.iter().map(|a| a.at).min().unwrap();
    let pause = first_after - killed_at;
    eprintln!(
        "failover: leader {leader} killed; first acknowledged cycle {} ms later (election timeout 400..800 ms); {cycles} cycles, {} after the crash",
        pause.as_millis(),
        after.len()
    );
    assert!(pause < Duration::from_secs(8), "failover took {pause:?}");
    // Tokens granted after the crash (claims invoked after it) exceed every earlier token.
    let new_leader = cluster.wait_for_leader_other_than(&cluster.running(), leader, Duration::from_secs(10)).await;
    assert_ne!(new_leader, leader);
    let k = key("after-crash", 0);
    match client.claim(SCOPE, &k, "probe", &ClaimOptions::default()).await.unwrap() {
        Outcome::Acquired(g) => assert!(g.token > all.iter().map(|a| a.token).max().unwrap()),
        other => panic!("{other:?}"),
    }
    assert!(after.iter().all(|a| a.token > max_before));
    // Unique tokens across all acknowledged grants.
    let mut tokens: Vec<u64> = all.iter().map(|a| a.token).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), all.len(), "a token was granted twice");

    // Restart the killed node; once it has caught up, every acknowledged completion replays,
    // through it as well.
    cluster.restart(leader);
    let status = cluster.client_for(&[new_leader]).node_status(0).await.unwrap();
    cluster.wait_applied(leader, status.applied_index, Duration::from_secs(30)).await;
    check_replays(&cluster.client_for(&[leader]), &all).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_nodes_sigkilled_at_once_keep_every_acknowledged_completion() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, &[]).await;
    let client = cluster.client();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> =
        (0..4).map(|w| tokio::spawn(worker(client.clone(), w, Duration::from_secs(2), acked.clone()))).collect();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    let all = acked.lock().unwrap().clone();
    assert!(all.len() > 20, "too little load: {}", all.len());
    for id in [1, 2, 3] {
        cluster.kill(id);
    }
    for id in [1, 2, 3] {
        cluster.restart(id);
    }
    cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;
    let client = cluster.client();
    check_replays(&client, &all).await;
    // New grants after the restart are larger than every earlier token.
    match client.claim(SCOPE, &key("post-restart", 1), "probe", &ClaimOptions::default()).await.unwrap() {
        Outcome::Acquired(g) => assert!(g.token > all.iter().map(|a| a.token).max().unwrap()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_quorum_calls_answer_unavailable_within_their_deadline() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();

    // SIGTERM is a graceful stop: exit status 0, promptly.
    let status = cluster.terminate(followers[0], Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "SIGTERM exit: {status:?}");
    cluster.kill(followers[1]);

    let mut results = BTreeMap::new();
    for (name, addr_of) in [("leader", leader)] {
        let mut cfg = ClientConfig::new([cluster.client_addr(addr_of)]);
        cfg.deadline = Duration::from_secs(2);
        let c = Client::new(cfg).unwrap();
        let started = Instant::now();
        let r = c.claim(SCOPE, &key("no-quorum", 1), "o", &ClaimOptions::default()).await;
        let took = started.elapsed();
        assert!(took < Duration::from_millis(2600), "{name}: a claim without quorum took {took:?}");
        let read_started = Instant::now();
        let g = c.get(SCOPE, &key("no-quorum", 1)).await;
        assert!(read_started.elapsed() < Duration::from_millis(2600), "a read without quorum hung");
        results.insert(name, (format!("{r:?}"), format!("{g:?}")));
        assert!(matches!(r, Err(Error::Unavailable(_)) | Err(Error::DeadlineExceeded(_))), "{r:?}");
        assert!(matches!(g, Err(Error::Unavailable(_)) | Err(Error::DeadlineExceeded(_))), "{g:?}");
    }
    eprintln!("without quorum: {results:?}");

    // Quorum back: the same claim (same owner) succeeds.
    cluster.restart(followers[1]);
    let c = cluster.client_for(&[leader, followers[1]]);
    assert!(matches!(
        c.claim(SCOPE, &key("no-quorum", 1), "o", &ClaimOptions::default()).await.unwrap(),
        Outcome::Acquired(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_far_behind_catches_up_from_a_snapshot_over_the_network() {
    let _serial = SERIAL.lock().await;
    // Snapshots every 100 entries; the leader keeps 1000 entries past its snapshot, so a
    // follower more than ~1100 entries behind can only catch up from a snapshot.
    let mut cluster = Cluster::start(3, &["--snapshot-every", "100"]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let lagging = if leader == 3 { 2 } else { 3 };
    let start_index = cluster.client_for(&[leader]).node_status(0).await.unwrap().applied_index;
    cluster.kill(lagging);

    let client = cluster.client_for(&[leader]);
    let acked = Arc::new(Mutex::new(Vec::new()));
    // Bounded: 8 workers, at most 60 s, stopping once far enough ahead (a debug build on a
    // busy 2-core machine writes the 1500 entries in 15-30 s).
    let end = Instant::now() + Duration::from_secs(60);
    for round in 0u64.. {
        let workers: Vec<_> = (0..8)
            .map(|w| tokio::spawn(worker(client.clone(), 100 * round + w, Duration::from_millis(700), acked.clone())))
            .collect();
        for w in workers {
            w.await.unwrap().unwrap();
        }
        let now = client.node_status(0).await.unwrap().applied_index;
        if now > start_index + 1500 || Instant::now() > end {
            assert!(now > start_index + 1500, "only {} entries written while the follower was down", now - start_index);
            break;
        }
    }
    let target = client.node_status(0).await.unwrap().applied_index;
    cluster.restart(lagging);
    cluster.wait_applied(lagging, target, Duration::from_secs(60)).await;
    let log = std::fs::read_to_string(cluster.log_path(lagging)).unwrap();
    assert!(log.contains("installed a snapshot from the leader"), "the follower caught up without a snapshot");
    let all = acked.lock().unwrap().clone();
    check_replays(&cluster.client_for(&[lagging]), &all).await;
}

fn signal(cluster: &Cluster, id: u64, sig: &str) {
    let pid = cluster.children[&id].id();
    assert!(std::process::Command::new("kill").arg(sig).arg(pid.to_string()).status().unwrap().success());
}

/// Contract §2: lease time stands still while the cluster cannot hear renewals, also when the
/// leader keeps its term through the outage. Both followers are frozen for twice the owner's
/// lease and thawed together; the leader stays leader (they hear it as soon as they wake), its
/// next entry carries Resume, and a takeover attempt right after finds the lease alive: the
/// owner completes with its token. The owner does not renew during the outage: renewals the
/// leader queued before it noticed the lost quorum would land after the thaw and extend the
/// lease themselves, which would hide a missing Resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_survives_a_quorum_loss_under_the_same_leader_and_term() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let followers: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
    let client = cluster.client_for(&[leader]);
    let k = key("same-term", 1);
    let lease = Duration::from_secs(2);
    let opts = ClaimOptions { lease: Some(lease), ..ClaimOptions::default() };
    let token = match client.claim(SCOPE, &k, "owner-a", &opts).await.unwrap() {
        Outcome::Acquired(g) => g.token,
        other => panic!("{other:?}"),
    };
    let term_before = client.node_status(0).await.unwrap().term;

    for f in &followers {
        signal(&cluster, *f, "-STOP");
    }
    tokio::time::sleep(lease * 2).await;
    for f in &followers {
        signal(&cluster, *f, "-CONT");
    }

    let rival = ClaimOptions { lease: Some(lease), allow_takeover: true, ..ClaimOptions::default() };
    match client.claim(SCOPE, &k, "owner-b", &rival).await.unwrap() {
        Outcome::InProgress { .. } => {}
        other => panic!("the owner's lease did not survive the outage: a takeover got {other:?}"),
    }
    match client.complete(SCOPE, &k, token, &StoredResponse::new(200, b"done".to_vec())).await.unwrap() {
        Outcome::Completed { .. } => {}
        other => panic!("the owner could not complete after the outage: {other:?}"),
    }
    let term_after = client.node_status(0).await.unwrap().term;
    assert_eq!(term_before, term_after, "the leader lost its term: this test is about the same term");
}

/// A follower forwarding a call to a leader that stopped (SIGSTOP) gives up on it as soon as
/// it sees another leader, instead of holding the caller for the whole attempt: the caller's
/// retry through the same follower reaches the new leader. The attempt timeout (8 s) is far
/// longer than a failover, so a forward held to its deadline shows as a call of 8 s or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_forwarded_to_a_stopped_leader_moves_on_with_the_election() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let cfg = ClientConfig {
        attempt_timeout: Duration::from_secs(8),
        deadline: Duration::from_secs(12),
        ..ClientConfig::new([cluster.client_addr(follower)])
    };
    let client = Client::new(cfg).unwrap();
    // No call before the stop: its answer would name the leader, and the client would go
    // there directly.
    signal(&cluster, leader, "-STOP");
    let started = Instant::now();
    let r = client.claim(SCOPE, &key("forward-stopped", 1), "o", &ClaimOptions::default()).await;
    let took = started.elapsed();
    signal(&cluster, leader, "-CONT");
    assert!(matches!(r, Ok(Outcome::Acquired(_))), "{r:?}");
    assert!(took < Duration::from_secs(6), "the forwarded call waited out its attempt: {took:?}");
    eprintln!("a call forwarded to a stopped leader answered in {took:?}");
}
