//! The layer's unit tests, on fake nodes and a fake handler.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn hv(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap()
}

fn key_of(values: &[&str]) -> Result<Option<String>, KeyHeaderError> {
    let values: Vec<HeaderValue> = values.iter().map(|v| hv(v)).collect();
    parse_key(values.iter())
}

const UUID: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

#[test]
fn keys_bare_and_quoted_are_accepted() {
    assert_eq!(key_of(&[]), Ok(None));
    assert_eq!(key_of(&[UUID]), Ok(Some(UUID.into())));
    assert_eq!(key_of(&[&format!("\"{UUID}\"")]), Ok(Some(UUID.into())));
    assert_eq!(key_of(&[&format!("  {UUID}\t")]), Ok(Some(UUID.into())));
    assert_eq!(key_of(&["order:2024.01_x-0000001"]), Ok(Some("order:2024.01_x-0000001".into())));
}

#[test]
fn malformed_keys_are_refused_with_the_rule() {
    assert_eq!(key_of(&[UUID, UUID]), Err(KeyHeaderError::Repeated));
    assert_eq!(key_of(&["short"]), Err(KeyHeaderError::Rule(KeyError::Length { len: 5 })));
    assert_eq!(key_of(&[&"k".repeat(256)]), Err(KeyHeaderError::Rule(KeyError::Length { len: 256 })));
    assert!(matches!(
        key_of(&["has space in the key 123"]),
        Err(KeyHeaderError::Rule(KeyError::BadCharacter { found: ' ', .. }))
    ));
    assert!(matches!(key_of(&["slash/not/allowed/in/keys"]), Err(KeyHeaderError::Rule(_))));
    assert_eq!(key_of(&[&format!("\"{UUID}")]), Err(KeyHeaderError::BadQuoting));
    assert_eq!(key_of(&["\"abc\\\"defghijklmnopqrs\""]), Err(KeyHeaderError::BadQuoting));
    let non_ascii = HeaderValue::from_bytes("clé-0000000000000000".as_bytes()).unwrap();
    assert_eq!(parse_key([&non_ascii].into_iter()), Err(KeyHeaderError::NotAscii));
    let msg = KeyHeaderError::Rule(KeyError::Length { len: 5 }).to_string();
    assert!(msg.contains("16 to 255") && msg.contains("UUID"), "{msg}");
}

#[test]
fn default_store_policy_is_contract_section_7_6() {
    let p = StorePolicy::default();
    for s in [200, 201, 204, 400, 402, 404, 422] {
        assert!(p.stores(StatusCode::from_u16(s).unwrap()), "{s} should be stored");
    }
    for s in [408, 409, 429, 500, 502, 503, 504, 302] {
        assert!(!p.stores(StatusCode::from_u16(s).unwrap()), "{s} should not be stored");
    }
    assert!(StorePolicy::Everything.stores(StatusCode::INTERNAL_SERVER_ERROR));
    let only_created = StorePolicy::Custom(|s| s == StatusCode::CREATED);
    assert!(only_created.stores(StatusCode::CREATED) && !only_created.stores(StatusCode::OK));
}

#[test]
fn retry_after_rounds_up_to_whole_seconds() {
    assert_eq!(retry_after_secs(0), 1);
    assert_eq!(retry_after_secs(1), 1);
    assert_eq!(retry_after_secs(1000), 1);
    assert_eq!(retry_after_secs(1001), 2);
    assert_eq!(retry_after_secs(29_500), 30);
}

#[tokio::test]
async fn builder_and_validation() {
    let client = Client::connect(["127.0.0.1:1"]).unwrap();
    let layer = IdempotencyLayer::new(client.clone(), "payments.create");
    assert!(layer.validate().is_ok());
    let s = &layer.settings;
    assert!(s.key_required && s.allow_takeover);
    assert_eq!(s.in_flight, InFlight::Conflict);
    assert_eq!(s.unavailable, Unavailable::FailClosed);
    assert_eq!(s.replay_headers, vec![CONTENT_TYPE, http::header::LOCATION, http::header::ETAG]);

    let tuned = layer
        .clone()
        .key_required(false)
        .lease(Duration::from_secs(5))
        .ttl(Duration::from_secs(3600))
        .wait_for_in_flight(Duration::from_secs(2))
        .replay_header(HeaderName::from_static("x-charge-id"))
        .replay_header(CONTENT_TYPE)
        .fail_open(true);
    let t = &tuned.settings;
    assert!(!t.key_required);
    assert_eq!(t.in_flight, InFlight::Wait(Duration::from_secs(2)));
    assert_eq!(t.unavailable, Unavailable::FailOpen);
    assert_eq!(t.replay_headers.len(), 4, "no duplicates: {:?}", t.replay_headers);
    // The original is untouched (settings are copied on write).
    assert!(layer.settings.key_required);

    for bad in [
        IdempotencyLayer::new(client.clone(), ""),
        IdempotencyLayer::new(client.clone(), "has space"),
        layer.clone().lease(Duration::from_millis(10)),
        layer.clone().lease(Duration::from_secs(3600)),
        layer.clone().ttl(Duration::from_secs(1)),
        layer.clone().max_body_bytes(0),
    ] {
        assert!(bad.validate().is_err(), "{bad:?}");
    }
    let e = layer.clone().lease(Duration::from_millis(10)).validate().unwrap_err().to_string();
    assert!(e.contains("payments.create") && e.contains("lease"), "{e}");
}

#[test]
fn problems_are_rfc_9457() {
    let r = Problem::in_flight(3).into_response();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.headers()[CONTENT_TYPE], PROBLEM_JSON);
    assert_eq!(r.headers()[RETRY_AFTER], "3");
    let body: serde_json::Value = serde_json::from_str(&Problem::in_flight(3).body()).unwrap();
    assert_eq!(body["type"], "urn:idemraft:problem:request-in-progress");
    assert_eq!(body["status"], 409);
    assert!(body["title"].is_string());
    assert!(body["detail"].as_str().unwrap().contains("retry"));
    assert!(Problem::mismatch(&IDEMPOTENCY_KEY).retry_after.is_none());
    // A used-up quota: 429, and nothing that names the tenant or the operator's tools.
    let q = Problem::quota_exceeded();
    assert_eq!(q.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(q.kind, "urn:idemraft:problem:idempotency-quota-exceeded");
    assert!(q.retry_after.is_none() && !q.detail.contains("idemctl"), "{q:?}");
}

#[test]
fn only_allowed_headers_are_stored_and_replayed() {
    let settings = IdempotencyLayerSettingsForTest::settings();
    let resp = Response::builder()
        .status(201)
        .header("content-type", "application/json")
        .header("location", "/v1/charges/ch_1")
        .header("set-cookie", "sid=secret")
        .header("content-length", "2")
        .body(())
        .unwrap();
    let (parts, ()) = resp.into_parts();
    let stored = to_stored(&parts, &Bytes::from_static(b"{}"), &settings);
    assert_eq!(stored.status, 201);
    assert_eq!(
        stored.headers,
        vec![("content-type".into(), "application/json".into()), ("location".into(), "/v1/charges/ch_1".into())]
    );
    let r = replay(&stored);
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["location"], "/v1/charges/ch_1");
    assert_eq!(r.headers()[IDEMPOTENT_REPLAYED], "true");
    assert!(r.headers().get("set-cookie").is_none());

    // Too large to keep: the status and Location stay, the body says why.
    let small = Settings { max_stored_body_bytes: 1, ..settings };
    let stored = to_stored(&parts, &Bytes::from_static(b"{}"), &small);
    assert_eq!(stored.status, 201);
    assert!(stored.headers.contains(&("location".into(), "/v1/charges/ch_1".into())));
    assert!(stored.headers.contains(&("content-type".into(), PROBLEM_JSON.into())));
    assert!(String::from_utf8(stored.body).unwrap().contains("response-not-stored"));
}

struct IdempotencyLayerSettingsForTest;

impl IdempotencyLayerSettingsForTest {
    fn settings() -> Settings {
        Settings {
            scope: "t".into(),
            header: IDEMPOTENCY_KEY,
            key_required: true,
            lease: Duration::from_secs(30),
            ttl: None,
            in_flight: InFlight::Conflict,
            store: StorePolicy::Default,
            replay_headers: vec![CONTENT_TYPE, http::header::LOCATION, http::header::ETAG],
            unavailable: Unavailable::FailClosed,
            max_body_bytes: 1024,
            max_stored_body_bytes: 1024,
            cluster_timeout: Duration::from_secs(1),
            settle_timeout: Duration::from_secs(1),
            allow_takeover: true,
        }
    }
}

/// An inner service that counts its calls and answers 201.
#[derive(Clone, Default)]
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl Service<Request<Body>> for Counting {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let token = req.extensions().get::<FencingToken>().copied();
        Box::pin(async move {
            let mut r = Response::new(full(Bytes::from(format!("{token:?}"))));
            *r.status_mut() = StatusCode::CREATED;
            Ok(r)
        })
    }
}

async fn send(svc: &mut Idempotent<Counting>, req: Request<Full<Bytes>>) -> (StatusCode, http::HeaderMap, String) {
    let r = svc.call(req).await.unwrap();
    let (parts, body) = r.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

fn post(key: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut b = Request::builder().method("POST").uri("/v1/charges");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap()
}

/// What needs no cluster: refusals before the claim, safe methods, and an unreachable
/// cluster (a port nothing listens on), fail-closed and fail-open.
#[tokio::test]
async fn answers_that_need_no_cluster() {
    let client = Client::connect(["127.0.0.1:1"]).unwrap();
    let counting = Counting::default();
    let layer =
        IdempotencyLayer::new(client, "payments.create").max_body_bytes(8).cluster_timeout(Duration::from_millis(300));
    let mut svc = layer.layer(counting.clone());

    let (status, headers, body) = send(&mut svc, post(None, "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(headers[CONTENT_TYPE], PROBLEM_JSON);
    assert!(body.contains("missing-idempotency-key"), "{body}");

    let (status, _, body) = send(&mut svc, post(Some("short"), "{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("malformed-idempotency-key") && body.contains("16 to 255"), "{body}");

    let (status, headers, body) = send(&mut svc, post(Some(UUID), "{\"amount\": 100}")).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(headers[CONTENT_TYPE], PROBLEM_JSON);
    assert!(body.contains("8 bytes"), "{body}");

    let (status, headers, body) = send(&mut svc, post(Some(UUID), "{}")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(headers[RETRY_AFTER], "1");
    assert!(body.contains("idempotency-store-unavailable"), "{body}");

    let get = Request::builder().uri("/v1/charges").body(Full::new(Bytes::new())).unwrap();
    let (status, _, body) = send(&mut svc, get).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "None"));
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 1, "only the GET reached the handler");

    let mut open = layer.clone().fail_open(true).layer(counting.clone());
    let (status, _, body) = send(&mut open, post(Some(UUID), "{}")).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "None"), "fail-open runs it without a token");

    let mut optional = layer.key_required(false).layer(counting.clone());
    let (status, _, _) = send(&mut optional, post(None, "{}")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 3);
}

/// A claim whose connection breaks mid-call, or that an overloaded leader sheds until the
/// cluster timeout, has no answer: 503 fail-closed and the handler fail-open, never 500.
#[tokio::test]
async fn a_lost_or_shed_claim_is_unavailable_not_an_internal_error() {
    let (broken, calls) = crate::test_support::breaks_connections().await;
    let shedding = crate::test_support::sheds_every_call().await;
    for (what, addr) in [("broken connection", broken), ("shed", shedding)] {
        let client = Client::connect([addr]).unwrap();
        let counting = Counting::default();
        let layer = IdempotencyLayer::new(client, "payments.create").cluster_timeout(Duration::from_millis(300));
        let mut closed = layer.clone().layer(counting.clone());
        let (status, headers, body) = send(&mut closed, post(Some(UUID), "{}")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{what}: {body}");
        assert_eq!(headers[RETRY_AFTER], "1", "{what}");
        assert!(body.contains("idempotency-store-unavailable"), "{what}: {body}");
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 0, "{what}: ran fail-closed");

        let mut open = layer.fail_open(true).layer(counting.clone());
        let (status, _, body) = send(&mut open, post(Some(UUID), "{}")).await;
        assert_eq!((status, body.as_str()), (StatusCode::CREATED, "None"), "{what}: fail-open runs it unprotected");
    }
    assert!(calls.load(std::sync::atomic::Ordering::SeqCst) >= 2, "the claims never reached the breaking node");
}
