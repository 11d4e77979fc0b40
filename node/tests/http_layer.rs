//! The HTTP idempotency layer end to end: a real HTTP client (reqwest) against the payments
//! example, served on loopback, on a real 3-node cluster of `idemraft` processes. Every
//! answer of contract §7 (400, 413, 422, 409 with `Retry-After`, the bounded wait, replay
//! with `Idempotent-Replayed`, 503), byte-identical replays, a panicking handler, fail-closed
//! and fail-open with the cluster down, the token extension, and a retry storm through a
//! leader kill that must charge each key exactly once.
//!
//! These tests live in the node package because cargo gives `CARGO_BIN_EXE_idemraft` only to
//! this package's tests, and `common` already runs clusters with it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use common::{key, Cluster, SERIAL};
use idemraft_client::http::IdempotencyLayer;
use idemraft_client::Client;
use idemraft_payments_example::{default_layer, router, Bank, Books, ChargeResponse, SCOPE};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use tokio::time::Instant;

/// Serves `app` on the cluster's loopback address; returns its base URL.
async fn serve(ip: &str, app: Router) -> String {
    let listener = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, app).into_future());
    format!("http://{addr}")
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// An RFC 9457 problem with this status: the right media type, a `type`, a `title`, and a
    /// `detail` that mentions `detail_has`.
    fn assert_problem(&self, status: StatusCode, slug: &str, detail_has: &str) {
        let text = String::from_utf8_lossy(&self.body);
        assert_eq!(self.status, status, "{text}");
        assert_eq!(self.header("content-type"), Some("application/problem+json"), "{text}");
        let p = self.json();
        assert_eq!(p["type"], format!("urn:idemraft:problem:{slug}"), "{text}");
        assert!(p["title"].as_str().is_some_and(|t| !t.is_empty()), "{text}");
        assert_eq!(p["status"], status.as_u16(), "{text}");
        assert!(p["detail"].as_str().unwrap().contains(detail_has), "{text}");
    }
}

async fn send(http: &reqwest::Client, url: &str, key: Option<&str>, body: &str) -> Answer {
    let mut req = http.post(url).header("content-type", "application/json").body(body.to_string());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    let r = req.send().await.unwrap();
    let (status, headers) = (r.status(), r.headers().clone());
    Answer { status, headers, body: r.bytes().await.unwrap().to_vec() }
}

async fn books(http: &reqwest::Client, base: &str) -> Books {
    let bytes = http.get(format!("{base}/v1/bank/charges")).send().await.unwrap().bytes().await.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

const CHARGE: &str = r#"{"amount": 1200, "currency": "usd", "metadata": {"order": {"id": "o-1", "lines": [1, 2]}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_of_the_layer_over_http() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, &[]).await;
    let client = cluster.client();
    let bank = Bank::new();
    let http = http();
    // Two API servers on one cluster and one bank, as two replicas of a service would be:
    // one waits for an in-flight duplicate, the other answers 409 at once.
    let waiting = default_layer(client.clone()).cluster_timeout(Duration::from_secs(2));
    let conflict = IdempotencyLayer::new(client.clone(), SCOPE).cluster_timeout(Duration::from_secs(2));
    let base = serve(&cluster.ip, router(bank.clone(), waiting.clone().max_body_bytes(4096))).await;
    let base_409 = serve(&cluster.ip, router(bank.clone(), conflict)).await;
    let charges = format!("{base}/v1/charges");
    let charges_409 = format!("{base_409}/v1/charges");

    // Missing and malformed keys: 400, before anything is claimed or charged.
    send(&http, &charges, None, CHARGE).await.assert_problem(
        StatusCode::BAD_REQUEST,
        "missing-idempotency-key",
        "idempotency-key header",
    );
    send(&http, &charges, Some("too-short"), CHARGE).await.assert_problem(
        StatusCode::BAD_REQUEST,
        "malformed-idempotency-key",
        "16 to 255",
    );
    send(&http, &charges, Some("a key with spaces in it"), CHARGE).await.assert_problem(
        StatusCode::BAD_REQUEST,
        "malformed-idempotency-key",
        "' '",
    );
    // A body over the route's limit: 413.
    let big = format!(r#"{{"amount": 1, "currency": "usd", "metadata": "{}"}}"#, "x".repeat(5000));
    send(&http, &charges, Some(&key("http-big", 1)), &big).await.assert_problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
        "4096 bytes",
    );
    assert_eq!(books(&http, &base).await.total_charges, 0);

    // First call: 201 with Location; the handler got the fencing token of the claim.
    let k = key("http-charge", 1);
    let first = send(&http, &charges, Some(&k), CHARGE).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&first.body));
    assert!(!first.replayed());
    let created: ChargeResponse = serde_json::from_slice(&first.body).unwrap();
    let location = first.header("location").unwrap().to_string();
    assert_eq!(location, format!("/v1/charges/{}", created.charge.id));
    let record = client.get(SCOPE, &k).await.unwrap().expect("record");
    assert_eq!(created.charge.token, Some(record.token), "the token extension is the claim's token");
    assert_eq!(created.attempt, 1);

    // Replays, through both servers: the same status, body bytes and allowed headers.
    for url in [&charges, &charges_409] {
        let again = send(&http, url, Some(&k), CHARGE).await;
        assert_eq!(again.status, StatusCode::CREATED);
        assert!(again.replayed(), "Idempotent-Replayed: true");
        assert_eq!(again.body, first.body, "byte-identical body");
        assert_eq!(again.header("location"), Some(location.as_str()));
        assert_eq!(again.header("content-type"), first.header("content-type"));
    }
    // The IETF draft's quoted form of the same key, and the same JSON spelled differently
    // (key order, whitespace): the same request.
    let respelled = r#"{"metadata":{"order":{"lines":[1,2],"id":"o-1"}},"currency":"usd","amount":1200}"#;
    let quoted = send(&http, &charges, Some(&format!("\"{k}\"")), respelled).await;
    assert!(quoted.replayed() && quoted.body == first.body);

    // The same key with a different request: 422, whatever changed.
    let nested = CHARGE.replace("\"o-1\"", "\"o-2\"");
    for (url, body) in [
        (charges.clone(), CHARGE.replace("1200", "1300")),
        (charges.clone(), nested),
        (format!("{charges}?expand=customer"), CHARGE.to_string()),
    ] {
        send(&http, &url, Some(&k), &body).await.assert_problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "new key",
        );
    }
    assert_eq!(books(&http, &base).await.by_key[&k].charges, 1);

    // A 4xx from the handler is final too: stored and replayed.
    let kb = key("http-bad-charge", 1);
    let bad = send(&http, &charges, Some(&kb), r#"{"amount": 0, "currency": "usd"}"#).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let bad_again = send(&http, &charges, Some(&kb), r#"{"amount": 0, "currency": "usd"}"#).await;
    assert!(bad_again.replayed() && bad_again.body == bad.body && bad_again.status == StatusCode::BAD_REQUEST);

    // In flight, on the 409 server: 409 with Retry-After while the first runs; then a replay.
    let kf = key("http-in-flight", 1);
    let slow = r#"{"amount": 500, "currency": "eur", "delay_ms": 1500}"#;
    let first_call = {
        let (http, url, kf) = (http.clone(), charges_409.clone(), kf.clone());
        tokio::spawn(async move { send(&http, &url, Some(&kf), slow).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    let busy = send(&http, &charges_409, Some(&kf), slow).await;
    busy.assert_problem(StatusCode::CONFLICT, "request-in-progress", "retry");
    assert_eq!(busy.header("retry-after"), Some("1"), "come back soon, not when the 30 s lease would end");
    let first_answer = first_call.await.unwrap();
    assert_eq!(first_answer.status, StatusCode::CREATED);
    let later = send(&http, &charges_409, Some(&kf), slow).await;
    assert!(later.replayed() && later.body == first_answer.body);

    // Concurrent duplicates on the waiting server: one handler run, every caller gets its
    // response (one fresh, the rest replays).
    let kc = key("http-concurrent", 1);
    let body = r#"{"amount": 700, "currency": "usd", "delay_ms": 800}"#;
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (http, url, kc) = (http.clone(), charges.clone(), kc.clone());
            tokio::spawn(async move { send(&http, &url, Some(&kc), body).await })
        })
        .collect();
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    assert!(
        answers.iter().all(|a| a.status == StatusCode::CREATED),
        "{:?}",
        answers.iter().map(|a| a.status).collect::<Vec<_>>()
    );
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1, "exactly one fresh answer");
    assert!(answers.iter().all(|a| a.body == answers[0].body));
    assert_eq!(books(&http, &base).await.by_key[&kc].charges, 1, "exactly one handler run");

    // A handler that panics: 500, the key is released, and a retry at once succeeds.
    let kp = key("http-panic", 1);
    bank.panic_on_next(1);
    send(&http, &charges, Some(&kp), CHARGE).await.assert_problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "handler-failed",
        "retry",
    );
    let retried = send(&http, &charges, Some(&kp), CHARGE).await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    let after_panic: ChargeResponse = serde_json::from_slice(&retried.body).unwrap();
    assert_eq!(after_panic.attempt, 2, "the retry re-acquired the released key");
    assert_eq!(books(&http, &base).await.by_key[&kp].charges, 1);

    // A 5xx is not stored (contract §7.6): the next call runs the handler again.
    let runs = Arc::new(AtomicU32::new(0));
    let flaky = {
        let runs = runs.clone();
        Router::new().route(
            "/v1/flaky",
            post(move || {
                let runs = runs.clone();
                async move {
                    match runs.fetch_add(1, Ordering::SeqCst) {
                        0 => (StatusCode::SERVICE_UNAVAILABLE, "bank down"),
                        _ => (StatusCode::OK, "done"),
                    }
                }
            })
            .layer(IdempotencyLayer::new(client.clone(), "flaky.test")),
        )
    };
    let flaky_base = serve(&cluster.ip, flaky).await;
    let kx = key("http-flaky", 1);
    let url = format!("{flaky_base}/v1/flaky");
    assert_eq!(send(&http, &url, Some(&kx), "").await.status, StatusCode::SERVICE_UNAVAILABLE);
    let ok = send(&http, &url, Some(&kx), "").await;
    assert_eq!((ok.status, ok.replayed()), (StatusCode::OK, false));
    let ok_again = send(&http, &url, Some(&kx), "").await;
    assert_eq!((ok_again.status, ok_again.replayed(), ok_again.body), (StatusCode::OK, true, b"done".to_vec()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The cluster goes away. Fail-closed (the default): 503 with Retry-After, nothing charged.
    // Fail-open: the handler runs, without a fencing token.
    let open = IdempotencyLayer::new(client.clone(), SCOPE).cluster_timeout(Duration::from_secs(1)).fail_open(true);
    let base_open = serve(&cluster.ip, router(bank.clone(), open)).await;
    for id in [1, 2, 3] {
        cluster.kill(id);
    }
    let before = books(&http, &base).await.total_charges;
    let kd = key("http-down", 1);
    let down = send(&http, &charges, Some(&kd), CHARGE).await;
    down.assert_problem(StatusCode::SERVICE_UNAVAILABLE, "idempotency-store-unavailable", "same key");
    assert_eq!(down.header("retry-after"), Some("1"));
    assert_eq!(books(&http, &base).await.total_charges, before, "fail-closed never runs the handler");
    let opened = send(&http, &format!("{base_open}/v1/charges"), Some(&kd), CHARGE).await;
    assert_eq!(opened.status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&opened.body));
    let unprotected: ChargeResponse = serde_json::from_slice(&opened.body).unwrap();
    assert_eq!(unprotected.charge.token, None, "no claim, no token");
    assert_eq!(books(&http, &base).await.total_charges, before + 1);
}

/// What one simulated client saw: its final answer for the key.
struct Seen {
    key: String,
    status: StatusCode,
    body: Vec<u8>,
}

/// Retries like a careful client: the same key and body until a final answer, on 409, 503 or
/// a timeout. Bounded in attempts and time.
async fn careful_client(http: reqwest::Client, url: String, key: String, body: String, timeout: Duration) -> Seen {
    let end = Instant::now() + Duration::from_secs(60);
    for _ in 0..60 {
        let r = http
            .post(&url)
            .timeout(timeout)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        if let Ok(r) = r {
            let status = r.status();
            if let Ok(bytes) = r.bytes().await {
                if status != StatusCode::CONFLICT && status != StatusCode::SERVICE_UNAVAILABLE {
                    return Seen { key, status, body: bytes.to_vec() };
                }
            }
        }
        if Instant::now() > end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("no final answer for {key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_storm_through_a_leader_kill_charges_each_key_once() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, &[]).await;
    let client: Client = cluster.client();
    let bank = Bank::new();
    let http = http();
    let base = serve(&cluster.ip, router(bank.clone(), default_layer(client.clone()))).await;
    let url = format!("{base}/v1/charges");

    const KEYS: u64 = 12;
    let mut tasks = Vec::new();
    for i in 0..KEYS {
        let k = key("storm", i);
        let body = format!(r#"{{"amount": {}, "currency": "usd", "delay_ms": 300}}"#, 100 + i);
        // Parallel duplicates, a double click, and an impatient client that times out
        // before the charge is done and retries.
        for _ in 0..4 {
            tasks.push(tokio::spawn(careful_client(
                http.clone(),
                url.clone(),
                k.clone(),
                body.clone(),
                Duration::from_secs(20),
            )));
        }
        tasks.push(tokio::spawn(careful_client(
            http.clone(),
            url.clone(),
            k.clone(),
            body.clone(),
            Duration::from_millis(100),
        )));
        if i == KEYS / 2 {
            let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(10)).await;
            cluster.kill(leader);
        }
    }
    let mut by_key: BTreeMap<String, BTreeSet<(u16, Vec<u8>)>> = BTreeMap::new();
    for t in tasks {
        let seen = t.await.unwrap();
        by_key.entry(seen.key).or_default().insert((seen.status.as_u16(), seen.body));
    }
    let books = books(&http, &base).await;
    for (k, answers) in &by_key {
        assert_eq!(answers.len(), 1, "{k}: every retry got the same answer: {answers:?}");
        assert!(answers.iter().all(|(s, _)| *s == 201), "{k}: {answers:?}");
        assert_eq!(books.by_key.get(k).map(|b| b.charges), Some(1), "{k} charged exactly once");
    }
    assert_eq!(books.keys, KEYS);
    assert_eq!(books.max_charges_per_key, 1);
}
