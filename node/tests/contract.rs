//! The contract over the wire, on a real 3-node cluster: every outcome of contract §4, calls
//! through a follower, bad input of every kind, and a node that keeps serving afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{key, Cluster, SERIAL};
use idemraft_client::{fingerprint, ClaimOptions, Error, Outcome, RecordState, StoredResponse};

const SCOPE: &str = "payments.create";

fn acquired(o: Outcome) -> idemraft_client::Grant {
    match o {
        Outcome::Acquired(g) => g,
        other => panic!("expected ACQUIRED, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outcome_over_the_wire() {
    let _serial = SERIAL.lock().await;
    let cluster =
        Cluster::start(3, &["--max-response-bytes", "4096", "--scope-retention", "webhooks.deliver=2h"]).await;
    let client = cluster.client();
    let k = key("contract", 1);
    let fp = fingerprint("POST", "/v1/charges", Some(br#"{"amount":100,"currency":"usd"}"#));
    let opts = ClaimOptions { fingerprint: Some(fp), ..Default::default() };

    let g = acquired(client.claim(SCOPE, &k, "owner-a", &opts).await.unwrap());
    assert_eq!(g.attempt, 1);
    assert!(!g.takeover);

    // The same owner again (a retry after a lost reply) gets the same grant.
    let again = acquired(client.claim(SCOPE, &k, "owner-a", &opts).await.unwrap());
    assert_eq!(again.token, g.token);

    // Another owner while the lease is alive.
    match client.claim(SCOPE, &k, "owner-b", &opts).await.unwrap() {
        Outcome::InProgress { lease_expires_ms, retry_after_ms } => {
            assert_eq!(lease_expires_ms, g.lease_expires_ms);
            assert!(retry_after_ms > 0);
        }
        other => panic!("expected IN_PROGRESS, got {other:?}"),
    }

    // A waiter is released by the completion, without polling.
    let waiter = {
        let client = cluster.client();
        let k = k.clone();
        tokio::spawn(async move { client.wait(SCOPE, &k, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Stale token (lower than the grant) is refused with the current token.
    let body = br#"{"id":"ch_1","amount":100}"#.to_vec();
    let response = StoredResponse::new(201, body.clone())
        .with_header("Content-Type", "application/json")
        .with_header("Location", "/v1/charges/ch_1");
    match client.complete(SCOPE, &k, g.token - 1, &response).await.unwrap() {
        Outcome::StaleToken { current } => assert_eq!(current, g.token),
        other => panic!("expected STALE_TOKEN, got {other:?}"),
    }

    assert_eq!(client.complete(SCOPE, &k, g.token, &response).await.unwrap(), Outcome::Completed { token: g.token });
    // A retried Complete answers the same.
    assert_eq!(client.complete(SCOPE, &k, g.token, &response).await.unwrap(), Outcome::Completed { token: g.token });

    let waited = waiter.await.unwrap().unwrap();
    assert!(!waited.timed_out);
    assert_eq!(waited.record.map(|r| r.state), Some(idemraft_client::proto::RecordState::Completed as i32));

    // Replay: status, body bytes and headers exactly as stored, through every node.
    for id in 1..=3 {
        let via = cluster.client_for(&[id]);
        match via.claim(SCOPE, &k, &format!("owner-c{id}"), &opts).await.unwrap() {
            Outcome::Replay { token, response: r, .. } => {
                assert_eq!(token, g.token);
                assert_eq!(r, response, "replay through node {id}");
            }
            other => panic!("expected REPLAY through node {id}, got {other:?}"),
        }
    }

    // Same key, different request.
    let other_fp = fingerprint("POST", "/v1/charges", Some(br#"{"amount":999,"currency":"usd"}"#));
    let mismatch = ClaimOptions { fingerprint: Some(other_fp), ..Default::default() };
    assert_eq!(client.claim(SCOPE, &k, "owner-d", &mismatch).await.unwrap(), Outcome::Mismatch);

    // Get through a follower sees the completed record, and the follower's reply names the
    // leader, which the client then adds and prefers.
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(10)).await;
    let follower = if leader == 1 { 2 } else { 1 };
    let via_follower = cluster.client_for(&[follower]);
    let rec = via_follower.get(SCOPE, &k).await.unwrap().expect("record");
    let leader_addr = format!("http://{}", cluster.client_addr(leader));
    assert!(via_follower.endpoints().contains(&leader_addr), "{:?}", via_follower.endpoints());
    assert_eq!(rec.token, g.token);
    assert_eq!(rec.response.map(|r| r.body), Some(body));

    // Lease expiry, checkpoint, takeover with a larger token and the recovery point.
    let k2 = key("contract", 2);
    let short = ClaimOptions { lease: Some(Duration::from_secs(1)), ..Default::default() };
    let g2 = acquired(client.claim(SCOPE, &k2, "worker-1", &short).await.unwrap());
    match client.checkpoint(SCOPE, &k2, g2.token, "charged-card", b"auth=123", Some(Duration::from_secs(1))).await {
        Ok(Outcome::LeaseExtended { token, .. }) => assert_eq!(token, g2.token),
        other => panic!("expected LEASE_EXTENDED, got {other:?}"),
    }
    let no_takeover = ClaimOptions { allow_takeover: false, ..short.clone() };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(client.claim(SCOPE, &k2, "worker-2", &no_takeover).await.unwrap(), Outcome::InProgress { .. }));
    let takeover = ClaimOptions { allow_takeover: true, ..short.clone() };
    let g3 = acquired(client.claim(SCOPE, &k2, "worker-2", &takeover).await.unwrap());
    assert!(g3.takeover);
    assert_eq!(g3.attempt, 2);
    assert!(g3.token > g2.token, "takeover token {} must exceed {}", g3.token, g2.token);
    assert_eq!(g3.recovery_point, "charged-card");
    assert_eq!(g3.checkpoint, b"auth=123");
    // The old owner is fenced off.
    match client.complete(SCOPE, &k2, g2.token, &StoredResponse::new(200, "late")).await.unwrap() {
        Outcome::StaleToken { current } => assert_eq!(current, g3.token),
        other => panic!("expected STALE_TOKEN, got {other:?}"),
    }
    // Retryable fail, then re-acquire with a new token; terminal fail replays its error.
    assert!(matches!(
        client.fail(SCOPE, &k2, g3.token, true, None).await.unwrap(),
        Outcome::Failed { retryable: true, .. }
    ));
    let g4 = acquired(client.claim(SCOPE, &k2, "worker-3", &short).await.unwrap());
    assert!(g4.token > g3.token);
    let err = StoredResponse::new(402, r#"{"error":"card_declined"}"#);
    assert!(matches!(
        client.fail(SCOPE, &k2, g4.token, false, Some(&err)).await.unwrap(),
        Outcome::Failed { retryable: false, .. }
    ));
    match client.claim(SCOPE, &k2, "worker-4", &short).await.unwrap() {
        Outcome::Replay { response, .. } => assert_eq!(response, err),
        other => panic!("expected REPLAY of the terminal failure, got {other:?}"),
    }

    // NOT_FOUND and List.
    assert_eq!(client.extend_lease(SCOPE, &key("contract", 3), 1, None).await.unwrap(), Outcome::NotFound);
    let page = client
        .list(idemraft_client::proto::ListRequest { scope: SCOPE.into(), limit: 10, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(page.records.len(), 2);

    // execute: runs once, replays after.
    let k5 = key("contract", 5);
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    for round in 0..3 {
        let runs = runs.clone();
        let done = client
            .execute(SCOPE, &k5, Some(fp), &Default::default(), |grant| async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(StoredResponse::new(200, format!("charged with token {}", grant.token())))
            })
            .await
            .unwrap();
        assert_eq!(done.replayed, round > 0);
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    let _ = RecordState::Completed;

    // Per-scope retention applies to claims that ask for no TTL; the default elsewhere is 24 h.
    for (scope, ttl_ms) in [("webhooks.deliver", 2 * 3_600_000u64), ("other.scope", 24 * 3_600_000)] {
        let g = acquired(client.claim(scope, &key("retention", 1), "o", &ClaimOptions::default()).await.unwrap());
        let rec = client.get(scope, &key("retention", 1)).await.unwrap().unwrap();
        assert_eq!(g.expires_ms - rec.created_ms, ttl_ms, "{scope}");
    }

    // The leader's sweeps keep the log's clock moving while no client writes.
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(10)).await;
    let before = cluster.client_for(&[leader]).node_status(0).await.unwrap().clock_ms;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let after = cluster.client_for(&[leader]).node_status(0).await.unwrap().clock_ms;
    // Sweeps come once a second; a loaded machine may delay one, hence the slack.
    assert!(after >= before + 1000, "the log clock moved {} ms in 3 s idle", after - before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_node_keeps_serving() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, &["--max-response-bytes", "1024"]).await;
    let client = cluster.client();

    let invalid = |r: Result<Outcome, Error>, needle: &str| match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(needle), "message '{m}' should mention '{needle}'"),
        other => panic!("expected INVALID_ARGUMENT mentioning '{needle}', got {other:?}"),
    };
    let none = ClaimOptions::default();
    invalid(client.claim(SCOPE, "short", "o", &none).await, "key");
    invalid(client.claim(SCOPE, "has spaces in it, sadly", "o", &none).await, "forbidden character");
    invalid(client.claim("bad scope!", &key("bad", 1), "o", &none).await, "scope");
    invalid(client.claim(SCOPE, &key("bad", 2), "", &none).await, "owner");
    let long_lease = ClaimOptions { lease: Some(Duration::from_secs(3600)), ..Default::default() };
    invalid(client.claim(SCOPE, &key("bad", 3), "o", &long_lease).await, "lease_ms");

    // A tenant with characters outside the rule.
    let mut cfg = idemraft_client::ClientConfig::new([cluster.client_addr(1)]);
    cfg.tenant = "acme corp".into();
    let bad_tenant = idemraft_client::Client::new(cfg).unwrap();
    invalid(bad_tenant.claim(SCOPE, &key("bad", 4), "o", &none).await, "tenant");

    // Oversize response: refused, and the record stays IN_PROGRESS for the owner to decide.
    let k = key("bad", 5);
    let g = acquired(client.claim(SCOPE, &k, "o", &none).await.unwrap());
    let big = StoredResponse::new(200, vec![b'x'; 2048]);
    invalid(client.complete(SCOPE, &k, g.token, &big).await, "response body");
    let rec = client.get(SCOPE, &k).await.unwrap().unwrap();
    assert_eq!(rec.state, idemraft_client::proto::RecordState::InProgress as i32);

    // Garbage bytes on the client and peer ports: the connection is dropped, nothing else.
    for port in [7101u16, 7201] {
        let addr = format!("{}:{port}", cluster.ip);
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\x13garbage garbage garbage\r\n\r\n");
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf);
    }
    // A forged peer message (valid gRPC, garbage payload) is refused without harm.
    {
        use idemraft_client::proto::raft_client::RaftClient;
        let mut peer = RaftClient::connect(format!("http://{}", cluster.peer_addr(1))).await.unwrap();
        let msg = idemraft_client::proto::RaftMessage { target: 1, payload: vec![0xff; 64] };
        let err = peer.append_entries(msg).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        let misaddressed = idemraft_client::proto::RaftMessage { target: 9, payload: vec![] };
        let err = peer.vote(misaddressed).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        assert!(err.message().contains("meant for node 9"), "{}", err.message());

        // Streamed snapshots: a garbled header, a wrong addressee, and a stream that ends
        // before the bytes its header announced are each refused, and nothing is installed.
        use idemraft_client::proto::SnapshotFrame;
        let frame = |target: u64, header: Vec<u8>, data: Vec<u8>| SnapshotFrame { target, header, data };
        let header = idemraft_node::wire::encode(&idemraft_node::wire::SnapshotHeader {
            vote: openraft::Vote::new_committed(1_000_000, 1),
            meta: Default::default(),
            len: 1000,
        })
        .unwrap();
        let garbled = futures::stream::iter(vec![frame(1, vec![0xff; 8], vec![])]);
        let err = peer.stream_snapshot(garbled).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        let misaddressed = futures::stream::iter(vec![frame(9, header.clone(), vec![])]);
        let err = peer.stream_snapshot(misaddressed).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        let short = futures::stream::iter(vec![frame(1, header.clone(), vec![7; 10]), frame(1, vec![], vec![7; 10])]);
        let err = peer.stream_snapshot(short).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::DataLoss, "{err:?}");
        assert!(err.message().contains("after 20 of its 1000 bytes"), "{}", err.message());
        let long = futures::stream::iter(vec![frame(1, header, vec![7; 1001])]);
        let err = peer.stream_snapshot(long).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }

    // Still serving, on every node.
    for id in 1..=3 {
        let c = cluster.client_for(&[id]);
        acquired(c.claim(SCOPE, &key("after-garbage", id), "o", &none).await.unwrap());
    }
}

#[test]
fn a_bad_config_is_refused_naming_the_option() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_idemraft")).args(args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let cases: &[(&[&str], &str)] = &[
        (&[], "--id"),
        (&["--id", "1", "--initial-cluster", "1=127.0.0.1"], "--initial-cluster"),
        (&["--id", "1", "--heartbeat", "fast"], "--heartbeat"),
        (&["--id", "1", "--election-timeout-min", "900ms"], "--election-timeout-max"),
        (&["--id", "1", "--max-response-bytes", "99999999"], "--max-response-bytes"),
        (&["--id", "1", "--config", "/nonexistent/idemraft.toml"], "--config"),
    ];
    for (args, option) in cases {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(option), "{args:?}: stderr should name {option}: {stderr}");
    }
    // A port that is taken is named too.
    let taken = std::net::TcpListener::bind("127.77.250.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let (code, stderr) = run(&["--id", "1", "--client-addr", &addr, "--data-dir", data.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--client-addr"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn execute_keeps_its_lease_alive_and_a_duplicate_waits_for_the_first() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, &[]).await;
    let client = cluster.client();
    let k = key("execute", 1);
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    // A 2 s lease and 3.5 s of work: only the background ExtendLease keeps it owned.
    let opts = idemraft_client::ExecuteOptions { lease: Duration::from_secs(2), ..Default::default() };
    let run = |client: idemraft_client::Client, runs: std::sync::Arc<std::sync::atomic::AtomicU32>| {
        let k = k.clone();
        let opts = opts.clone();
        async move {
            client
                .execute(SCOPE, &k, None, &opts, |grant| async move {
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(3500)).await;
                    assert!(!grant.is_lost(), "the lease was lost while the work ran");
                    Ok(StoredResponse::new(200, format!("token {}", grant.token())))
                })
                .await
        }
    };
    let first = tokio::spawn(run(client.clone(), runs.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A duplicate with allow_takeover: it must neither run nor take over a live lease.
    let second = tokio::spawn(run(cluster.client(), runs.clone()));
    let a = first.await.unwrap().unwrap();
    let b = second.await.unwrap().unwrap();
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "the work ran twice");
    assert!(!a.replayed);
    assert!(b.replayed);
    assert_eq!(a.response, b.response);
    assert_eq!(a.token, b.token);

    // A holder that outlives the caller's deadline: IN_PROGRESS, not a deadline error.
    let held = key("execute", 4);
    let Outcome::Acquired(_) = client
        .claim(SCOPE, &held, "holder", &ClaimOptions { lease: Some(Duration::from_secs(30)), ..Default::default() })
        .await
        .unwrap()
    else {
        panic!("the holder's claim was not granted")
    };
    let short = idemraft_client::ExecuteOptions { deadline: Duration::from_millis(1500), ..Default::default() };
    let r = client.execute(SCOPE, &held, None, &short, |_| async { panic!("must not run while held") }).await;
    assert!(matches!(r, Err(idemraft_client::ExecuteError::InProgress { .. })), "{r:?}");

    // A different fingerprint on a used key is a typed error; the work does not run.
    let fp = Some(fingerprint("POST", "/x", Some(b"{}")));
    let r = client
        .execute(SCOPE, &key("execute", 2), fp, &Default::default(), |_| async {
            Ok(StoredResponse::new(200, "first"))
        })
        .await;
    assert!(r.is_ok());
    let other = Some(fingerprint("POST", "/x", Some(b"{\"a\":1}")));
    let r = client
        .execute(SCOPE, &key("execute", 2), other, &Default::default(), |_| async {
            panic!("must not run on a mismatched key")
        })
        .await;
    assert!(matches!(r, Err(idemraft_client::ExecuteError::Mismatch)), "{r:?}");

    // Retryable failure releases the key; the next execute runs again with a larger token.
    let k3 = key("execute", 3);
    let r = client
        .execute(SCOPE, &k3, None, &Default::default(), |_| async {
            Err(idemraft_client::WorkError::Retryable("downstream timeout".into()))
        })
        .await;
    assert!(matches!(r, Err(idemraft_client::ExecuteError::WorkFailed(_))), "{r:?}");
    let again = client
        .execute(SCOPE, &k3, None, &Default::default(), |g| async move {
            Ok(StoredResponse::new(200, format!("{}", g.grant.attempt)))
        })
        .await
        .unwrap();
    assert_eq!(again.response.body, b"2");
}
