//! Observability on a real 3-node cluster: `/metrics` counts what was done (claims by
//! outcome, stale tokens, takeovers, per-RPC latency, batches, fsyncs, records by state) and
//! reports sane Raft gauges; a leader counts the AppendEntries a stopped follower leaves
//! unanswered; gRPC health is SERVING while a quorum stands and NOT_SERVING on a
//! node cut off from it; reflection lists the client services; and debug logs name records
//! by `key_hash`, never by their raw key, and never print a response body.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{get, http_get, key, scrape, signal, Cluster, SERIAL};
use idemraft_proto::v1 as pb;
use pb::idempotency_client::IdempotencyClient;
use pb::outcome::Result as R;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

const SCOPE: &str = "obs.test";
const BODY: &str = "body-that-must-never-reach-a-log-4f1c";

/// The sum of a series over the nodes' pages (a missing series counts 0).
fn total(pages: &[BTreeMap<String, f64>], series: &str) -> f64 {
    pages.iter().map(|m| m.get(series).copied().unwrap_or(0.0)).sum()
}

fn id(k: &str) -> Option<pb::RecordId> {
    Some(pb::RecordId { tenant: String::new(), scope: SCOPE.into(), key: k.into() })
}

fn claim(k: &str, owner: &str, fp: u8) -> pb::ClaimRequest {
    pb::ClaimRequest {
        id: id(k),
        fingerprint: vec![fp; 32],
        owner: owner.into(),
        lease_ms: 30_000,
        ttl_ms: 0,
        allow_takeover: false,
    }
}

async fn call_claim(c: &mut IdempotencyClient<Channel>, req: pb::ClaimRequest) -> R {
    c.claim(req).await.unwrap().into_inner().result.expect("an outcome")
}

/// The tonic-health and tonic-reflection clients come without a transport: bring a channel.
async fn channel(endpoint: String) -> Option<Channel> {
    Channel::from_shared(endpoint).ok()?.connect().await.ok()
}

async fn health(cluster: &Cluster, id: u64, service: &str) -> Option<ServingStatus> {
    let endpoint = format!("http://{}", cluster.client_addr(id));
    let ask = async {
        let mut h = HealthClient::new(channel(endpoint).await?);
        let r = h.check(HealthCheckRequest { service: service.into() }).await.ok()?;
        ServingStatus::try_from(r.into_inner().status).ok()
    };
    tokio::time::timeout(Duration::from_secs(3), ask).await.ok().flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_reflection_and_logs() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start_with_log(3, &[], "info,idemraft_node=debug").await;
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;
    // Calls go to a follower, so the forwarding path is exercised; outcomes count at the edge.
    let edge = if leader == 1 { 2 } else { 1 };
    let mut c = IdempotencyClient::connect(format!("http://{}", cluster.client_addr(edge))).await.unwrap();
    let k1 = key("obs-secret-key", 1);
    let k2 = key("obs-secret-key", 2);
    let response = || Some(pb::StoredResponse { status: 201, headers: vec![], body: BODY.as_bytes().to_vec() });

    // k1: acquired, completed, replayed, then a mismatching fingerprint.
    let R::Acquired(g1) = call_claim(&mut c, claim(&k1, "worker-a", 1)).await else { panic!("k1 not acquired") };
    let done = c.complete(pb::CompleteRequest { id: id(&k1), token: g1.token, response: response() }).await;
    assert!(matches!(done.unwrap().into_inner().result, Some(R::Completed(_))));
    assert!(matches!(call_claim(&mut c, claim(&k1, "worker-b", 1)).await, R::Replay(_)));
    assert!(matches!(call_claim(&mut c, claim(&k1, "worker-b", 2)).await, R::Mismatch(_)));
    // k2: acquired, an in-progress conflict, a forced takeover, then the first owner's
    // complete with its now stale token.
    let R::Acquired(g2) = call_claim(&mut c, claim(&k2, "worker-a", 1)).await else { panic!("k2 not acquired") };
    assert!(matches!(call_claim(&mut c, claim(&k2, "worker-b", 1)).await, R::InProgress(_)));
    let took = c
        .takeover(pb::TakeoverRequest { id: id(&k2), owner: "worker-c".into(), force: true, lease_ms: 30_000 })
        .await
        .unwrap()
        .into_inner()
        .result;
    assert!(matches!(took, Some(R::Acquired(ref g)) if g.takeover), "{took:?}");
    let stale = c.complete(pb::CompleteRequest { id: id(&k2), token: g2.token, response: response() }).await;
    assert!(matches!(stale.unwrap().into_inner().result, Some(R::StaleToken(_))));

    // /metrics on every node.
    let mut pages = Vec::new();
    for n in 1..=3 {
        pages.push(scrape(&cluster, n).await);
    }
    let claims = |outcome: &str| total(&pages, &format!("idemraft_claims_total{{outcome=\"{outcome}\"}}"));
    assert_eq!(claims("acquired"), 2.0);
    assert_eq!(claims("replay"), 1.0);
    assert_eq!(claims("mismatch"), 1.0);
    assert_eq!(claims("in_progress"), 1.0);
    assert_eq!(claims("wrong_state"), 0.0);
    assert_eq!(total(&pages, "idemraft_stale_tokens_total{rpc=\"Complete\"}"), 1.0);
    assert_eq!(total(&pages, "idemraft_takeovers_total{rpc=\"Takeover\"}"), 1.0);
    assert_eq!(total(&pages, "idemraft_requests_total{rpc=\"Claim\",code=\"OK\"}"), 5.0);
    assert_eq!(total(&pages, "idemraft_request_duration_seconds_count{rpc=\"Claim\"}"), 5.0);
    assert_eq!(total(&pages, "idemraft_request_duration_seconds_count{rpc=\"Complete\"}"), 2.0);
    assert_eq!(total(&pages, "idemraft_request_duration_seconds_count{rpc=\"Takeover\"}"), 1.0);
    // Every call was answered at the edge node, within the histogram's last finite bucket.
    let edge_page = &pages[(edge - 1) as usize];
    assert_eq!(get(edge_page, "idemraft_request_duration_seconds_bucket{rpc=\"Claim\",le=\"+Inf\"}"), 5.0);
    assert!(get(edge_page, "idemraft_request_duration_seconds_sum{rpc=\"Claim\"}") > 0.0);
    // Seven client writes went through the leader's group commit (plus its own Resume and
    // sweeps): the replay and the mismatch of the nine are answered by the replay fast path,
    // with a read index and no log entry. Only a leader proposes.
    assert!(total(&pages, "idemraft_batch_size_sum") >= 7.0, "{:?}", total(&pages, "idemraft_batch_size_sum"));
    let leader_page = &pages[(leader - 1) as usize];
    assert!(get(leader_page, "idemraft_batch_size_count") >= 1.0);
    assert_eq!(get(leader_page, "idemraft_records{state=\"in_progress\"}"), 1.0);
    assert_eq!(get(leader_page, "idemraft_records{state=\"completed\"}"), 1.0);
    assert_eq!(get(leader_page, "idemraft_records{state=\"failed\"}"), 0.0);
    assert!(leader_page.contains_key("idemraft_sweeper_deleted_total"));
    assert!(leader_page.contains_key("idemraft_replication_cuts_total"));

    let mut leaders = 0;
    for (i, m) in pages.iter().enumerate() {
        let n = i + 1;
        let term = get(m, "idemraft_raft_term");
        assert!(term >= 1.0, "node {n}: term {term}");
        leaders += get(m, "idemraft_raft_role{role=\"leader\"}") as u32;
        let roles: f64 = ["leader", "follower", "candidate", "learner", "shutdown"]
            .iter()
            .map(|r| get(m, &format!("idemraft_raft_role{{role=\"{r}\"}}")))
            .sum();
        assert_eq!(roles, 1.0, "node {n} has exactly one role");
        assert_eq!(get(m, "idemraft_raft_has_leader"), 1.0, "node {n}");
        assert!(get(m, "idemraft_raft_leader_changes_total") >= 1.0, "node {n}");
        let (applied, commit) = (get(m, "idemraft_raft_applied_index"), get(m, "idemraft_raft_commit_index"));
        assert!(applied >= 1.0 && commit >= applied, "node {n}: applied {applied}, commit {commit}");
        assert!(get(m, "idemraft_raft_last_log_index") >= commit, "node {n}");
        let lag = get(m, "idemraft_raft_apply_lag");
        assert!((0.0..100.0).contains(&lag), "node {n}: apply lag {lag}");
        assert!(get(m, "idemraft_raft_log_entries") >= 1.0, "node {n}");
        assert!(get(m, "idemraft_log_fsync_duration_seconds_count") >= 1.0, "node {n} fsynced its log");
        assert!(get(m, "idemraft_db_size_bytes") > 0.0, "node {n}");
        assert!(get(m, "idemraft_log_size_bytes") > 0.0, "node {n}");
        assert!(m.contains_key("idemraft_snapshot_size_bytes"), "node {n}");
    }
    assert_eq!(leaders, 1, "exactly one node reports the leader role");

    // Health: SERVING everywhere, for the client service and for the server as a whole.
    for n in 1..=3 {
        for service in ["", "idemraft.v1.Idempotency"] {
            assert_eq!(health(&cluster, n, service).await, Some(ServingStatus::Serving), "node {n} {service:?}");
        }
        assert_eq!(http_get(&cluster.http_addr(n), "/readyz").await.0, 200);
    }

    // Reflection: the client services are listed, the peer service is not.
    let mut refl = ServerReflectionClient::new(channel(format!("http://{}", cluster.client_addr(edge))).await.unwrap());
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices("*".into())),
    };
    let symbol = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol("idemraft.v1.Idempotency".into())),
    };
    let mut answers =
        refl.server_reflection_info(tonic::codegen::tokio_stream::iter(vec![list, symbol])).await.unwrap().into_inner();
    let Some(MessageResponse::ListServicesResponse(listed)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list")
    };
    let names: Vec<String> = listed.service.into_iter().map(|s| s.name).collect();
    for want in ["idemraft.v1.Idempotency", "idemraft.v1.Admin", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    assert!(!names.iter().any(|n| n == "idemraft.v1.Raft"), "the peer service is not on the client port: {names:?}");
    let Some(MessageResponse::FileDescriptorResponse(files)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected the file holding idemraft.v1.Idempotency")
    };
    assert!(!files.file_descriptor_proto.is_empty());

    // A follower that stops answering (SIGSTOP): the leader's AppendEntries to it time out,
    // and the leader counts them. Writes still commit on the leader and the edge.
    let quiet = [1, 2, 3].into_iter().find(|n| *n != leader && *n != edge).unwrap();
    let before = get(&scrape(&cluster, leader).await, "idemraft_replication_timeouts_total");
    signal(cluster.children[&quiet].id(), "-STOP");
    let stopped_at = Instant::now();
    let mut i = 10;
    let timeouts = loop {
        let R::Acquired(_) = call_claim(&mut c, claim(&key("obs-quiet", i), "worker-a", 1)).await else {
            panic!("no grant with one follower stopped")
        };
        let now = get(&scrape(&cluster, leader).await, "idemraft_replication_timeouts_total");
        if now > before || stopped_at.elapsed() > Duration::from_secs(15) {
            break now - before;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    signal(cluster.children[&quiet].id(), "-CONT");
    assert!(timeouts >= 1.0, "no AppendEntries to the stopped node {quiet} counted as timed out in 15 s");

    // Cut the leader off from its majority: its health goes NOT_SERVING within a bound
    // (2 x the 800 ms election timeout, plus a tick), and /readyz and the gauge agree.
    for n in [1, 2, 3].into_iter().filter(|n| *n != leader) {
        cluster.kill(n);
    }
    let killed_at = Instant::now();
    let bound = Duration::from_secs(10);
    loop {
        let s = health(&cluster, leader, "idemraft.v1.Idempotency").await;
        if s == Some(ServingStatus::NotServing) {
            break;
        }
        assert!(killed_at.elapsed() < bound, "leader {leader} still reports {s:?} {bound:?} after losing its quorum");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(health(&cluster, leader, "").await, Some(ServingStatus::NotServing));
    assert_eq!(http_get(&cluster.http_addr(leader), "/readyz").await.0, 503);
    assert_eq!(get(&scrape(&cluster, leader).await, "idemraft_raft_has_leader"), 0.0);

    // Logs, at debug for the node crate: records appear by hash, never by key; bodies never.
    cluster.kill(leader);
    let mut logs = String::new();
    for n in 1..=3 {
        logs.push_str(&std::fs::read_to_string(cluster.log_path(n)).unwrap());
    }
    assert!(logs.contains("answered"), "debug logging was on");
    for raw in [&k1, &k2] {
        assert!(!logs.contains(raw.as_str()), "a raw key reached a log");
        let hash = idemraft_node::ops::instrument::key_hash(raw);
        assert!(logs.contains(&format!("key_hash={hash}")), "no log line names {hash}");
    }
    assert!(logs.contains("scope=obs.test"));
    assert!(!logs.contains("obs-secret-key"), "part of a raw key reached a log");
    assert!(!logs.contains(BODY), "a response body reached a log");
}
