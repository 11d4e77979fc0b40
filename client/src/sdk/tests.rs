//! The SDK's unit tests: retries, errors, leader discovery and execute, on fake nodes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::{NOT_PROPOSED_HEADER, QUOTA_LIMIT_HEADER, QUOTA_RECORDS_HEADER, QUOTA_TENANT_HEADER};
use tokio::time::Instant;
use tonic::{Code, Status};

use super::*;

#[test]
fn backoff_is_jittered_and_bounded() {
    let cfg = ClientConfig::new(["127.0.0.1:1"]);
    let mut seen = std::collections::BTreeSet::new();
    for attempt in 0..40 {
        let b = backoff(&cfg, attempt);
        assert!(b <= cfg.backoff_max, "attempt {attempt}: {b:?}");
        let cap = cfg.backoff_base.saturating_mul(1u32 << attempt.min(16)).min(cfg.backoff_max);
        assert!(b <= cap, "attempt {attempt}: {b:?} above its cap {cap:?}");
        seen.insert(b.as_millis());
    }
    assert!(seen.len() > 5, "backoff is not jittered: {seen:?}");
}

#[test]
fn addresses_are_normalised_and_bad_ones_refused() {
    assert_eq!(normalise("127.0.0.1:7101", false), "http://127.0.0.1:7101");
    assert_eq!(normalise(" http://h:1 ", true), "http://h:1");
    assert_eq!(normalise("h:1", true), "https://h:1");
    assert!(matches!(Client::connect(Vec::<String>::new()), Err(Error::Config(_))));
    // Outside a runtime: a clear error instead of a panic.
    assert!(matches!(Client::connect(["127.0.0.1:7101"]), Err(Error::Config(m)) if m.contains("Tokio runtime")));
}

#[test]
fn only_a_marked_shed_counts_as_never_proposed() {
    let mut shed = Status::resource_exhausted("overloaded: 4096 writes are already queued");
    assert!(!never_proposed(&shed), "a bare RESOURCE_EXHAUSTED may be the transport's");
    shed.metadata_mut().insert(NOT_PROPOSED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
    assert!(never_proposed(&shed));
    let mut other = Status::unavailable("no leader");
    other.metadata_mut().insert(NOT_PROPOSED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
    assert!(!never_proposed(&other));
}

#[tokio::test]
async fn a_deadline_reports_the_last_refusal_not_the_timeout() {
    let client = Client::connect(["127.0.0.1:1"]).unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_millis(300);
    // Every full attempt is refused UNAVAILABLE; the short last one times out the way
    // tonic's server reports it.
    let r: Result<(), Error> = client
        .call(deadline, |_, budget| async move {
            if budget < Duration::from_millis(60) {
                Err(Status::cancelled("Timeout expired"))
            } else {
                Err(Status::unavailable("no quorum"))
            }
        })
        .await;
    assert!(matches!(&r, Err(Error::Unavailable(m)) if m == "no quorum"), "{r:?}");
    assert!(matches!(Error::from_status(&Status::cancelled("x")), Error::DeadlineExceeded(_)));
}

#[tokio::test]
async fn a_quota_refusal_is_typed_and_answered_at_once_without_retries() {
    let client = Client::connect(["127.0.0.1:1"]).unwrap_or_else(|e| panic!("{e}"));
    let attempts = AtomicUsize::new(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let started = Instant::now();
    let r: Result<(), Error> = client
        .call(deadline, |_, _| {
            attempts.fetch_add(1, Ordering::Relaxed);
            async {
                let mut s = Status::failed_precondition("record quota exceeded: tenant 'acme' holds 3 records");
                for (k, v) in [(QUOTA_TENANT_HEADER, "acme"), (QUOTA_LIMIT_HEADER, "3"), (QUOTA_RECORDS_HEADER, "3")] {
                    s.metadata_mut().insert(k, v.parse().unwrap_or_else(|e| panic!("{e:?}")));
                }
                Err(s)
            }
        })
        .await;
    assert!(
        matches!(&r, Err(Error::QuotaExceeded { tenant, limit: 3, records: 3, message })
            if tenant == "acme" && message.contains("quota")),
        "{r:?}"
    );
    assert_eq!(attempts.load(Ordering::Relaxed), 1, "a quota refusal is not retried");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(r.is_err_and(|e| !e.is_indeterminate()));
    // Without the marker, FAILED_PRECONDITION stays what it was.
    assert!(matches!(Error::from_status(&Status::failed_precondition("x")), Error::FailedPrecondition(_)));
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let mut cfg = ClientConfig::new(["127.0.0.1:1"]);
    cfg.bearer_token = Some(BearerToken::new(" s3cret-token\n"));
    cfg.tls_identity =
        Some(TlsIdentity { cert_pem: b"cert".to_vec(), key_pem: b"-----BEGIN PRIVATE KEY-----".to_vec() });
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("s3cret") && !shown.contains("PRIVATE KEY"), "{shown}");
    assert_eq!(cfg.bearer_token.as_ref().map(BearerToken::secret), Some("s3cret-token"));
}

#[tokio::test]
async fn tls_and_token_settings_are_checked() {
    // https without a CA to verify the node with: a configuration error, not a silent
    // fallback to the system's roots.
    let r = Client::connect(["https://127.0.0.1:1"]);
    assert!(matches!(&r, Err(Error::Config(m)) if m.contains("tls_ca")), "{:?}", r.err());
    let mut cfg = ClientConfig::new(["127.0.0.1:1"]);
    cfg.bearer_token = Some(BearerToken::new("bad\u{7f}token"));
    assert!(matches!(Client::new(cfg), Err(Error::Config(_))));
    let mut cfg = ClientConfig::new(["127.0.0.1:1"]);
    cfg.bearer_token = Some(BearerToken::new("   "));
    assert!(matches!(Client::new(cfg), Err(Error::Config(m)) if m.contains("empty")));
    let mut cfg = ClientConfig::new(["127.0.0.1:1"]);
    cfg.tls_ca = Some(b"not pem".to_vec());
    let c = Client::new(cfg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.endpoints(), vec!["https://127.0.0.1:1".to_string()]);
}

#[test]
fn only_unknown_outcome_errors_are_retried() {
    for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Unknown, Code::Cancelled] {
        assert!(retryable(&Status::new(code, "x")), "{code:?}");
    }
    for code in [Code::InvalidArgument, Code::FailedPrecondition, Code::Internal, Code::PermissionDenied] {
        assert!(!retryable(&Status::new(code, "x")), "{code:?}");
    }
}

/// A status as tonic's client makes it from a transport error (`Status::from_error`).
fn from_transport(e: impl std::error::Error + Send + Sync + 'static) -> Status {
    Status::from_error(Box::new(e))
}

#[test]
fn a_broken_connection_is_an_unknown_outcome_whatever_code_tonic_gives_it() {
    let broken = [
        // A stream reset or a GOAWAY during the call: INTERNAL, "h2 protocol error: ...".
        from_transport(h2::Error::from(h2::Reason::NO_ERROR)),
        from_transport(h2::Error::from(h2::Reason::INTERNAL_ERROR)),
        // A GOAWAY with ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED, without the node's marker.
        from_transport(h2::Error::from(h2::Reason::ENHANCE_YOUR_CALM)),
        // The socket itself: UNKNOWN with the IO error below it.
        from_transport(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        from_transport(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        // As the server words its own h2 failure, and a bare RESOURCE_EXHAUSTED.
        Status::internal("h2 protocol error: http2 error"),
        Status::resource_exhausted("Too many active requests for the connection"),
        Status::unknown("transport error"),
    ];
    assert_eq!(broken[0].code(), Code::Internal, "{:?}", broken[0]);
    assert_eq!(broken[2].code(), Code::ResourceExhausted, "{:?}", broken[2]);
    assert_eq!(broken[3].code(), Code::Unknown, "{:?}", broken[3]);
    for s in &broken {
        assert!(retryable(s), "{s:?}");
        let e = Error::from_status(s);
        assert!(matches!(&e, Error::Indeterminate(m) if m.contains("repeat it")), "{s:?}: {e:?}");
        assert!(e.is_indeterminate());
    }
}

#[test]
fn a_real_internal_error_or_a_marked_shed_is_not_taken_for_a_broken_connection() {
    let internal = Status::internal("internal error: state machine: corrupt record r\\x00default");
    assert!(!retryable(&internal));
    assert!(matches!(Error::from_status(&internal), Error::Rpc { code: Code::Internal, .. }));
    let mut shed = Status::resource_exhausted("overloaded: 4096 writes are already queued");
    shed.metadata_mut().insert(NOT_PROPOSED_HEADER, tonic::metadata::MetadataValue::from_static("1"));
    assert!(retryable(&shed));
    assert!(matches!(Error::from_status(&shed), Error::Rpc { code: Code::ResourceExhausted, .. }));
    // Retried until the deadline: known not done only if no earlier attempt may have been.
    assert!(!gave_up(&shed, false).is_indeterminate());
    assert!(matches!(gave_up(&shed, true), Error::Indeterminate(_)));
}

#[tokio::test]
async fn a_call_whose_connection_breaks_is_retried_elsewhere_then_reported_as_unknown() {
    let (a, calls_a) = crate::test_support::breaks_connections().await;
    let (b, calls_b) = crate::test_support::breaks_connections().await;
    let client = Client::connect([a, b]).unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let deadline = started + Duration::from_millis(1500);
    let req = pb::CompleteRequest { id: client.id("s", "k"), token: 7, response: None };
    let r = client
        .call(deadline, |ch, t| {
            let r = timed(req.clone(), t);
            async move { idem(ch).complete(r).await }
        })
        .await;
    assert!(matches!(&r, Err(Error::Indeterminate(m)) if m.contains("broke")), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(1400), "gave up early: {:?}", started.elapsed());
    let (a, b) = (calls_a.load(Ordering::SeqCst), calls_b.load(Ordering::SeqCst));
    assert!(a >= 1 && b >= 1, "the call was not retried on the other node: {a} and {b} attempts");
}

#[tokio::test]
async fn a_node_that_left_an_attempt_unanswered_is_passed_over_even_when_hinted() {
    // A leader that stopped, and a follower that still names it: every new call used to
    // follow that hint into the stopped node and wait out a whole attempt there.
    let (stopped, calls) = crate::test_support::never_answers().await;
    let serving = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let follower = crate::test_support::follower_naming(stopped.clone(), serving.clone()).await;
    let cfg = ClientConfig {
        attempt_timeout: Duration::from_millis(300),
        deadline: Duration::from_millis(900),
        ..ClientConfig::new([stopped, follower])
    };
    let client = Client::new(cfg).unwrap_or_else(|e| panic!("{e}"));

    // While nobody leads: the stopped node takes one attempt, the follower refuses the rest.
    let r = client.get("s", "k").await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the stopped node was tried again within one call");

    // A leader is back behind the follower: the next call goes there first and is answered
    // within one attempt, without another visit to the stopped node.
    serving.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let r = client.get("s", "k").await;
    assert!(matches!(r, Ok(None)), "{r:?}");
    assert!(started.elapsed() < Duration::from_millis(300), "took {:?}", started.elapsed());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the stopped node was tried again");
}
