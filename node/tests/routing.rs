//! The node's routing on paused time: three whole nodes (proposer, elections after a pre-vote,
//! fast reads, sweeper, forwarding) in one process, on the in-memory stores, talking through
//! the in-process network (`api::in_process`), which can cut links, with a simulated wall clock. No socket, no
//! log or state on disk (only each node's identity file, in a temporary directory); tokio's
//! clock moves only when every task waits, so election timeouts of seconds take no time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idemraft_node::api::in_process::Network;
use idemraft_node::cluster::identity::IdentityHandle;
use idemraft_node::cluster::node::Parts;
use idemraft_node::cluster::observer::Unobserved;
use idemraft_node::cluster::proposer::WallClock;
use idemraft_node::cluster::storage::Stores;
use idemraft_node::error::NodeError;
use idemraft_node::wire::{Reply, Request};
use idemraft_node::{Node, Options};
use idemraft_store::{MemLogStore, MemStateMachine, Op, Outcome, RecordKey, Token};
use tokio::time::Instant;

/// Wall-clock milliseconds that move with tokio's (paused) clock.
fn simulated_clock() -> WallClock {
    let start = Instant::now();
    Arc::new(move || 1_800_000_000_000 + start.elapsed().as_millis() as u64)
}

struct Cluster {
    nodes: BTreeMap<u64, Node>,
    net: Arc<Network>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(n: u64) -> Cluster {
        Cluster::start_only(n, &(1..=n).collect::<Vec<_>>()).await
    }

    /// A cluster of `n` members of which only `up` run; the others never start.
    async fn start_only(n: u64, up: &[u64]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<String> = (1..=n).map(|i| format!("{i}=127.0.0.1:{}", 7200 + i)).collect();
        let net = Network::new();
        let clock = simulated_clock();
        let mut nodes = BTreeMap::new();
        for id in up.iter().copied() {
            let options = Options {
                id: Some(id),
                initial_cluster: Some(members.join(",")),
                data_dir: Some(dir.path().join(format!("node-{id}"))),
                ..Options::default()
            };
            let config = options.resolve().unwrap();
            std::fs::create_dir_all(&config.data_dir).unwrap();
            let identity = IdentityHandle::establish(&config, None).unwrap();
            let parts = Parts {
                stores: Stores { log: MemLogStore::new(), sm: MemStateMachine::new() },
                transport: net.link(id),
                wall_clock: clock.clone(),
                seed: id,
            };
            let node = Node::start_on(config, identity, parts, Arc::new(Unobserved)).await.unwrap();
            net.attach(id, node.clone());
            nodes.insert(id, node);
        }
        Cluster { nodes, net, _dir: dir }
    }

    async fn leader(&self, among: &[u64]) -> u64 {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            for id in among {
                let s = self.nodes[id].status();
                if s.role == "leader" && among.iter().all(|o| self.nodes[o].status().leader_id == Some(*id)) {
                    return *id;
                }
            }
            assert!(Instant::now() < until, "no leader among {among:?} within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) {
        for (id, node) in &self.nodes {
            node.shutdown().await;
            assert_eq!(node.background_tasks(), 0, "node {id} left tasks running after its shutdown");
        }
    }
}

fn key(k: &str) -> RecordKey {
    RecordKey::new("acme", "payments.create", format!("{k}-0000000000")).unwrap()
}

fn claim(k: &str, owner: &str) -> Request {
    Request::Write(Op::Claim {
        id: key(k),
        fingerprint: None,
        owner: owner.into(),
        lease_ms: 30_000,
        ttl_ms: 3_600_000,
        allow_takeover: false,
    })
}

fn granted(reply: Result<Reply, NodeError>) -> Token {
    match reply {
        Ok(Reply::Outcome(Outcome::Acquired(g))) => g.token,
        other => panic!("expected ACQUIRED, got {other:?}"),
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[tokio::test(start_paused = true)]
async fn a_call_to_a_follower_runs_on_the_leader_and_tells_where_it_is() {
    let c = Cluster::start(3).await;
    let leader = c.leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let token = granted(c.nodes[&follower].call(claim("order-1", "w"), soon()).await);
    // The same owner asking again, through the leader itself, gets the same grant.
    assert_eq!(granted(c.nodes[&leader].call(claim("order-1", "w"), soon()).await), token);
    // The follower learnt the leader's client address from the forwarded answer.
    let leader_addr = c.nodes[&leader].config().advertise_client_addr.clone();
    assert_eq!(c.nodes[&follower].leader_hint(), Some(leader_addr));
    assert_eq!(c.nodes[&leader].leader_hint(), None, "the leader hints at nobody");
    // A read through the other follower is linearizable: it sees the claim.
    let other = (1..=3).find(|i| *i != leader && *i != follower).unwrap();
    match c.nodes[&other].call(Request::Get(key("order-1")), soon()).await {
        Ok(Reply::Record(Some(view))) => assert_eq!(view.record.token, token),
        other => panic!("{other:?}"),
    }
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_forwarded_call_is_never_forwarded_again() {
    let c = Cluster::start(3).await;
    let leader = c.leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let answer = c.nodes[&follower].serve_forwarded(claim("order-2", "w"), soon()).await;
    match answer.result {
        Err(NodeError::NoLeader { why, leader_id, .. }) => {
            assert!(why.contains("no longer the leader"), "{why}");
            assert_eq!(leader_id, Some(leader));
        }
        other => panic!("a follower must refuse a forwarded call, not pass it on: {other:?}"),
    }
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_forward_the_leader_never_answers_does_not_point_the_caller_back_at_it() {
    let c = Cluster::start(3).await;
    let leader = c.leader(&[1, 2, 3]).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    // One forwarded call teaches the follower the leader's client address.
    granted(c.nodes[&follower].call(claim("order-8", "w"), soon()).await);
    assert!(c.nodes[&follower].leader_hint().is_some());
    // The follower still hears the leader (so it still names it) but cannot reach it, as when
    // the leader is paused: its forward fails, and the caller must try elsewhere, not there.
    c.net.cut(follower, leader);
    match c.nodes[&follower].call(claim("order-9", "w"), soon()).await {
        Err(NodeError::NoLeader { why, leader_id, leader_addr }) => {
            assert!(why.contains("did not take the call"), "{why}");
            assert_eq!(leader_id, Some(leader));
            assert_eq!(leader_addr, None, "the refusal sends the caller back to the leader that failed");
        }
        other => panic!("{other:?}"),
    }
    c.net.heal();
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_a_majority_a_call_waits_three_election_timeouts_then_says_no_leader() {
    // One node of three up: no leader can ever be elected.
    let c = Cluster::start_only(3, &[1]).await;
    let started = Instant::now();
    let answer = c.nodes[&1].call(claim("order-3", "w"), started + Duration::from_secs(60)).await;
    let waited = started.elapsed();
    match answer {
        Err(NodeError::NoLeader { why, .. }) => assert!(why.contains("majority"), "{why}"),
        other => panic!("{other:?}"),
    }
    let bound = c.nodes[&1].config().election_timeout.1 * 3;
    assert!(waited >= bound && waited < bound + Duration::from_secs(1), "waited {waited:?}, bound {bound:?}");
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_cut_off_refuses_at_once_and_the_majority_elects_a_larger_token() {
    let c = Cluster::start(3).await;
    let old = c.leader(&[1, 2, 3]).await;
    let before = granted(c.nodes[&old].call(claim("order-4", "w"), soon()).await);
    let rest: Vec<u64> = (1..=3).filter(|i| *i != old).collect();
    c.net.isolate(old, &rest);
    // Past the quorum bound (twice the longest election timeout) the old leader, which no
    // longer hears a majority, says so at once instead of holding the call to its deadline.
    let isolated = Instant::now();
    let bound = c.nodes[&old].config().election_timeout.1 * 2;
    tokio::time::sleep_until(isolated + bound + Duration::from_millis(200)).await;
    let asked = Instant::now();
    match c.nodes[&old].call(claim("order-5", "w"), asked + Duration::from_secs(10)).await {
        Err(NodeError::NoQuorum(why)) => assert!(why.contains("majority"), "{why}"),
        other => panic!("an isolated old leader must refuse, naming the lost majority: {other:?}"),
    }
    assert!(asked.elapsed() < Duration::from_millis(100), "refused after {:?}, not at once", asked.elapsed());
    let new = c.leader(&rest).await;
    assert_ne!(new, old);
    // Through the majority, a new claim's token is larger than any granted before.
    let after = granted(c.nodes[&rest[0]].call(claim("order-6", "w"), soon()).await);
    assert!(after > before, "{after:?} after {before:?}");
    // Healed, the old leader follows the new one and forwards to it.
    c.net.heal();
    let until = Instant::now() + Duration::from_secs(30);
    while c.nodes[&old].status().leader_id != Some(new) {
        assert!(Instant::now() < until, "the old leader never followed node {new}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let later = granted(c.nodes[&old].call(claim("order-7", "w"), soon()).await);
    assert!(later > after);
    c.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_removes_itself_and_another_leaves_a_lone_voter_that_takes_over() {
    let c = Cluster::start(3).await;
    let leader = c.leader(&[1, 2, 3]).await;
    let before = granted(c.nodes[&leader].call(claim("order-8", "w"), soon()).await);
    let lone = (1..=3).find(|i| *i != leader).unwrap();
    let gone: Vec<u64> = (1..=3).filter(|i| *i != lone).collect();
    match c.nodes[&leader].call(Request::Remove(gone.clone()), soon()).await {
        Ok(Reply::Members(list, _)) => {
            let voters: Vec<u64> = list.iter().filter(|m| m.voter).map(|m| m.id).collect();
            assert_eq!(voters, vec![lone], "{list:?}");
        }
        other => panic!("removing {gone:?} through the leader: {other:?}"),
    }
    // The lone voter must not wait forever for the leader that removed itself.
    assert_eq!(c.leader(&[lone]).await, lone);
    let after = granted(c.nodes[&lone].call(claim("order-9", "w"), soon()).await);
    assert!(after > before);
    c.stop().await;
}
