//! Per-RPC tracing and metrics for the client port. [`Observed`] wraps a generated tonic
//! service: every call runs inside an `rpc` span and, once answered, counts in
//! `idemraft_requests_total{rpc,code}` and `idemraft_request_duration_seconds{rpc}`.
//! Wrapping the whole service rather than each handler means an RPC added to the `.proto`
//! file is covered without touching this file.
//!
//! The span carries `rpc`, `scope` and `key_hash`, never the key: keys are often derived from
//! customer data, and logs travel further than the store. The handler fills in `scope` and
//! `key_hash` through [`tag`] once it has the record id, so every event logged while the call
//! runs (including "call refused") names the record by its hash. No event here logs a
//! message body or an error text, which could quote what a caller sent.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use sha2::{Digest, Sha256};
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tracing::field::{display, Empty};
use tracing::Instrument;

use crate::ops::metrics::{code_name, Metrics};

/// The hash that stands for a key in logs: the first 8 bytes of its SHA-256, in hex. An
/// operator finds a key's hash with `printf %s "$KEY" | sha256sum | cut -c1-16`.
pub fn key_hash(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Records the record a call is about on the current `rpc` span. A scope that breaks its
/// rule is not logged as sent (it could be anything); the call is refused anyway.
pub fn tag(scope: &str, key: &str) {
    let span = tracing::Span::current();
    let scope = if idemraft_store::validate::scope(scope).is_ok() { scope } else { "<invalid>" };
    // Display, not Debug: `key_hash=867e…` without quotes, as an operator would grep it.
    span.record("scope", display(scope));
    span.record("key_hash", display(key_hash(key)));
}

/// The method of a gRPC path (`/package.Service/Method`), when it looks like one. Anything
/// else is `unknown`: the path is the caller's, and the metric label must stay bounded.
fn method(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some((service, m))
            if !service.is_empty()
                && !m.is_empty()
                && m.len() <= 64
                && m.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            m
        }
        _ => "unknown",
    }
}

/// The gRPC code of an answer. tonic sends an error as a trailers-only response, so its
/// code is in the headers; an answer without one is a success whose OK comes in trailers.
fn code_of<B>(resp: &http::Response<B>) -> tonic::Code {
    resp.headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32)
}

/// A tonic service with per-call spans and metrics (see the module docs).
#[derive(Clone)]
pub struct Observed<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Observed<S> {
    /// Wraps `inner`, recording into `metrics`.
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Observed<S> {
        Observed { inner, metrics }
    }
}

impl<S: NamedService> NamedService for Observed<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Observed<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>, Error = Infallible>,
    S::Future: Send + 'static,
    R: 'static,
{
    type Response = http::Response<R>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let rpc = method(req.uri().path()).to_string();
        let span = tracing::info_span!("rpc", rpc = %rpc, scope = Empty, key_hash = Empty);
        let started = tokio::time::Instant::now();
        let metrics = self.metrics.clone();
        // Only builds the future: tonic's handler runs when it is polled, which `instrument`
        // does with the span entered, so the handler's events carry the span.
        let call = self.inner.call(req);
        Box::pin(
            async move {
                let resp = call.await?;
                let code = code_of(&resp);
                let elapsed = started.elapsed();
                // An unknown method is answered UNIMPLEMENTED by tonic: not counted, so no
                // caller can grow the label set.
                if code != tonic::Code::Unimplemented {
                    metrics.record_rpc(&rpc, code, elapsed);
                }
                tracing::debug!(code = %code_name(code), elapsed_us = elapsed.as_micros() as u64, "answered");
                Ok(resp)
            }
            .instrument(span),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_hash_is_the_first_eight_bytes_of_sha256_in_hex() {
        // printf %s abc | sha256sum
        assert_eq!(key_hash("abc"), "ba7816bf8f01cfea");
        assert_eq!(key_hash("order-0000000000000001").len(), 16);
        assert_ne!(key_hash("order-0000000000000001"), key_hash("order-0000000000000002"));
    }

    #[test]
    fn methods_are_taken_from_grpc_paths_and_bounded() {
        assert_eq!(method("/idemraft.v1.Idempotency/Claim"), "Claim");
        assert_eq!(method("/grpc.health.v1.Health/Check"), "Check");
        assert_eq!(method("/x/"), "unknown");
        assert_eq!(method("Claim"), "unknown");
        assert_eq!(method("/x/a-b"), "unknown");
        assert_eq!(method(&format!("/x/{}", "a".repeat(65))), "unknown");
    }

    /// A method name the caller made up is answered UNIMPLEMENTED by the generated service and
    /// never becomes an `rpc` label value, while a real method is counted.
    #[tokio::test]
    async fn a_made_up_method_adds_no_rpc_label() {
        let metrics = Arc::new(Metrics::new());
        let (_reporter, health) = tonic_health::server::health_reporter();
        let mut svc = Observed::new(health, metrics.clone());
        let call = |path: &str| {
            // One empty gRPC message: flag 0, length 0.
            let body = tonic::body::Body::new(String::from("\0\0\0\0\0"));
            http::Request::builder()
                .method("POST")
                .uri(format!("http://node{path}"))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(body)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        for path in ["/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/MadeUp1", "/grpc.health.v1.Health/MadeUp2"]
        {
            let resp = svc.call(call(path)).await.unwrap_or_else(|e| match e {});
            assert_eq!(resp.status(), http::StatusCode::OK, "{path}");
        }
        let page = metrics.encode();
        assert!(page.contains("idemraft_requests_total{rpc=\"Check\",code=\"OK\"} 1"), "{page}");
        assert!(!page.contains("MadeUp"), "{page}");
    }
}
