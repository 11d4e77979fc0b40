//! The HTTP idempotency layer (feature `http`): a tower [`Layer`] that makes the handler it
//! wraps run at most once per `Idempotency-Key`, with the cluster as the single source of
//! truth, following contract §6–§7, the IETF `Idempotency-Key` draft and Stripe.
//!
//! This module owns only the HTTP side: reading and checking the header, the request
//! fingerprint, the size limit, mapping outcomes to statuses and RFC 9457 problem bodies,
//! choosing which responses are stored, and the replay. Claiming, keeping the lease alive
//! and settling the key are the SDK's ([`Client::claim_until`], [`Client::wait`],
//! [`Client::run_granted`]).
//!
//! | case | answer |
//! |---|---|
//! | missing key (route requires one) | 400 problem+json |
//! | malformed key | 400 problem+json |
//! | body over the limit | 413 problem+json |
//! | key reused with a different request | 422 problem+json |
//! | first call still in flight | 409 problem+json with `Retry-After: 1`, or a bounded wait and the first call's response |
//! | completed before | the stored status, body bytes and allowed headers, plus `Idempotent-Replayed: true` |
//! | cluster unavailable, overloaded, or the claim's outcome unknown (a connection broken mid-call) | 503 problem+json with `Retry-After` (fail-closed), or the handler runs unprotected (fail-open) |
//! | handler panicked or errored | 500 problem+json; the key is released so a retry runs at once |
//!
//! ```no_run
//! use axum::{routing::post, Router, Extension};
//! use idemraft_client::http::{FencingToken, IdempotencyLayer};
//! use idemraft_client::Client;
//! use std::time::Duration;
//!
//! async fn create_charge(Extension(FencingToken(token)): Extension<FencingToken>) -> &'static str {
//!     let _ = token; // pass it to the ledger, which refuses lower tokens
//!     "charged"
//! }
//!
//! # fn app() -> Result<Router, idemraft_client::Error> {
//! let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
//! let app = Router::new().route(
//!     "/v1/charges",
//!     post(create_charge).layer(IdempotencyLayer::new(client, "payments.create").lease(Duration::from_secs(10))),
//! );
//! # Ok(app)
//! # }
//! ```

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body::Body as HttpBody;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::fingerprint::{fingerprint, Fingerprint};
use crate::keys::{self, KeyError};
use crate::sdk::{ClaimOptions, Client, Error, ExecuteError, ExecuteOptions, Outcome, StoredResponse, WorkError};

/// A boxed error, as tower and hyper pass them around.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of the requests the layer hands to the inner service and of the responses it
/// returns: on protected requests the request body is buffered (it must be hashed before
/// the handler runs), and so is the response (it must be stored before it is sent).
///
/// A struct rather than an alias of the boxed body, so that service bounds over it name no
/// trait-object lifetime (which defeats the compiler's `Send` check of the futures).
pub struct Body(UnsyncBoxBody<Bytes, BoxError>);

impl Body {
    /// A body of these bytes.
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Body {
        Body(Full::new(bytes.into()).map_err(|never: Infallible| match never {}).boxed_unsync())
    }

    /// Wraps any body.
    pub fn new<B>(body: B) -> Body
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Body(body.map_err(Into::into).boxed_unsync())
    }
}

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Body")
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

/// The request header carrying the key (IETF draft, Stripe).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header marking a replay (Stripe's name).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Media type of the error bodies (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Prefix of the `type` of every problem body this layer writes. A URN, so it names the
/// problem without promising a page at some address.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:idemraft:problem:";

/// The fencing token of the claim the handler runs under, as a request extension. Pass it to
/// every downstream write; a store that keeps the highest token per key and refuses lower
/// ones is safe even if a lease expires while the handler is still running. Absent when the
/// handler runs unprotected (no key on an optional route, or fail-open).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

/// The key the handler runs under, as a request extension (as the client sent it, without
/// the quotes of the structured-field form).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(pub String);

/// More about the claim the handler runs under, as a request extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimInfo {
    /// The scope of the route.
    pub scope: String,
    /// The fencing token (also in [`FencingToken`]).
    pub token: u64,
    /// 1 for a first run; more after a failed or abandoned attempt.
    pub attempt: u32,
    /// This run took the key over from a holder whose lease expired.
    pub takeover: bool,
    /// Progress marker a previous holder left with `Checkpoint`.
    pub recovery_point: String,
}

/// Which handler responses are stored and replayed. A response that is not stored releases
/// the key (a retryable `Fail`), so the next request with the key runs the handler again.
#[derive(Clone, Copy, Default)]
pub enum StorePolicy {
    /// Contract §7.6: 2xx and 4xx are final, except 408, 409 and 429, which say "try again";
    /// everything else (5xx above all) is released.
    #[default]
    Default,
    /// Stripe's: every response the handler produced is final, 5xx included. A panic or a
    /// handler error still releases the key: there is no response to store.
    Everything,
    /// A rule of your own: `true` stores the status.
    Custom(fn(StatusCode) -> bool),
}

impl StorePolicy {
    /// Whether a response with this status is stored.
    pub fn stores(&self, status: StatusCode) -> bool {
        match self {
            StorePolicy::Default => {
                (status.is_success() || status.is_client_error()) && !matches!(status.as_u16(), 408 | 409 | 429)
            }
            StorePolicy::Everything => true,
            StorePolicy::Custom(f) => f(status),
        }
    }
}

impl fmt::Debug for StorePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorePolicy::Default => f.write_str("Default"),
            StorePolicy::Everything => f.write_str("Everything"),
            StorePolicy::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

/// What a request gets while another request with its key is still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// 409 with `Retry-After` at once (the IETF draft's answer).
    Conflict,
    /// Wait up to this long for the first request to finish and answer with its response;
    /// 409 with `Retry-After` if it is still running then.
    Wait(Duration),
}

/// What the layer does when the cluster cannot be reached for the claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// 503: the handler never runs unprotected. The default.
    FailClosed,
    /// Run the handler without protection (no [`FencingToken`]); duplicates may run twice.
    FailOpen,
}

/// A setting the cluster would refuse, found by [`IdempotencyLayer::validate`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("idempotency layer for scope {scope:?}: {problem}")]
pub struct ConfigError {
    scope: String,
    problem: String,
}

#[derive(Clone, Debug)]
struct Settings {
    scope: String,
    header: HeaderName,
    key_required: bool,
    lease: Duration,
    ttl: Option<Duration>,
    in_flight: InFlight,
    store: StorePolicy,
    replay_headers: Vec<HeaderName>,
    unavailable: Unavailable,
    max_body_bytes: usize,
    max_stored_body_bytes: usize,
    cluster_timeout: Duration,
    settle_timeout: Duration,
    allow_takeover: bool,
}

/// Bounds of contract §1.4 (the server's defaults), checked by [`IdempotencyLayer::validate`].
const LEASE_BOUNDS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));
const TTL_BOUNDS: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(30 * 24 * 3600));
const MAX_SCOPE_LEN: usize = 128;
/// Longest `Retry-After` on a 409. The server's hint is the holder's lease time left, an upper
/// bound rather than an estimate (the lease is renewed while the handler runs), and a first
/// request usually finishes long before it: so a client is told to come back soon.
const MAX_IN_FLIGHT_RETRY_AFTER_SECS: u64 = 1;
/// How many times a waiting request claims again before it gives up with 409; each round
/// waits on the server, so this only bounds a key that keeps changing hands.
const MAX_WAIT_ROUNDS: u32 = 32;

/// A tower layer that makes the wrapped handler exactly-once per `Idempotency-Key`. Build one
/// per route (its scope names the route family), e.g.
/// `post(handler).layer(IdempotencyLayer::new(client, "payments.create"))`.
///
/// Safe methods (GET, HEAD, OPTIONS, TRACE) pass through untouched.
#[derive(Clone)]
pub struct IdempotencyLayer {
    client: Client,
    settings: Arc<Settings>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer for one route family, with the defaults: key required, 30 s lease extended in
    /// the background, the scope's TTL, 409 while in flight, contract §7.6's store policy,
    /// `Content-Type`, `Location` and `ETag` replayed, fail-closed, bodies up to 1 MiB, 5 s to
    /// reach the cluster.
    pub fn new(client: Client, scope: impl Into<String>) -> IdempotencyLayer {
        IdempotencyLayer {
            client,
            settings: Arc::new(Settings {
                scope: scope.into(),
                header: IDEMPOTENCY_KEY,
                key_required: true,
                lease: Duration::from_secs(30),
                ttl: None,
                in_flight: InFlight::Conflict,
                store: StorePolicy::Default,
                replay_headers: vec![CONTENT_TYPE, http::header::LOCATION, http::header::ETAG],
                unavailable: Unavailable::FailClosed,
                max_body_bytes: 1024 * 1024,
                max_stored_body_bytes: 256 * 1024,
                cluster_timeout: Duration::from_secs(5),
                settle_timeout: Duration::from_secs(30),
                allow_takeover: true,
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Settings)) -> IdempotencyLayer {
        f(Arc::make_mut(&mut self.settings));
        self
    }

    /// Whether a request without the header is refused with 400 (the default) or runs the
    /// handler unprotected.
    pub fn key_required(self, required: bool) -> IdempotencyLayer {
        self.with(|s| s.key_required = required)
    }

    /// The header carrying the key; `Idempotency-Key` by default.
    pub fn header(self, name: HeaderName) -> IdempotencyLayer {
        self.with(|s| s.header = name)
    }

    /// The lease the handler holds while it runs; extended every third of it in the
    /// background, so it only bounds how long a crashed server keeps a key busy.
    pub fn lease(self, lease: Duration) -> IdempotencyLayer {
        self.with(|s| s.lease = lease)
    }

    /// How long a record (and so its stored response) is kept; the scope's default on the
    /// server otherwise.
    pub fn ttl(self, ttl: Duration) -> IdempotencyLayer {
        self.with(|s| s.ttl = Some(ttl))
    }

    /// Wait up to `bound` for an in-flight first request and answer with its response,
    /// instead of 409 at once.
    pub fn wait_for_in_flight(self, bound: Duration) -> IdempotencyLayer {
        self.with(|s| s.in_flight = InFlight::Wait(bound))
    }

    /// What to do while the first request is in flight.
    pub fn in_flight(self, in_flight: InFlight) -> IdempotencyLayer {
        self.with(|s| s.in_flight = in_flight)
    }

    /// Which responses are stored and replayed.
    pub fn store(self, policy: StorePolicy) -> IdempotencyLayer {
        self.with(|s| s.store = policy)
    }

    /// Adds a response header to the replay allowlist (`Content-Type`, `Location` and `ETag`
    /// are on it by default). Headers off the list are sent on the first response only.
    pub fn replay_header(self, name: HeaderName) -> IdempotencyLayer {
        self.with(|s| {
            if !s.replay_headers.contains(&name) {
                s.replay_headers.push(name);
            }
        })
    }

    /// Replaces the replay allowlist.
    pub fn replay_headers(self, names: impl IntoIterator<Item = HeaderName>) -> IdempotencyLayer {
        self.with(|s| s.replay_headers = names.into_iter().collect())
    }

    /// Fail-open (`true`: the handler runs unprotected when the cluster is unreachable) or
    /// fail-closed (`false`, the default: 503).
    pub fn fail_open(self, open: bool) -> IdempotencyLayer {
        self.with(|s| s.unavailable = if open { Unavailable::FailOpen } else { Unavailable::FailClosed })
    }

    /// Largest request body, in bytes; a larger one is answered 413 before any claim.
    pub fn max_body_bytes(self, limit: usize) -> IdempotencyLayer {
        self.with(|s| s.max_body_bytes = limit)
    }

    /// Largest response body stored as is (the server's limit, 256 KiB by default). A larger
    /// response reaches the first caller whole; retries get its status and allowed headers
    /// with a problem body saying it was too large to keep.
    pub fn max_stored_body_bytes(self, limit: usize) -> IdempotencyLayer {
        self.with(|s| s.max_stored_body_bytes = limit)
    }

    /// How long to keep trying to reach the cluster for the claim before the request is
    /// answered 503 (or run unprotected, fail-open). 5 s by default.
    pub fn cluster_timeout(self, timeout: Duration) -> IdempotencyLayer {
        self.with(|s| s.cluster_timeout = timeout)
    }

    /// How long to keep trying to store a response once the handler has produced it (30 s by
    /// default). The handler's work is done by then, so this is worth a long fight: a key
    /// left unsettled makes a retry wait out the lease and run the handler again.
    pub fn settle_timeout(self, timeout: Duration) -> IdempotencyLayer {
        self.with(|s| s.settle_timeout = timeout)
    }

    /// Whether a request may take over a key whose holder's lease expired (the holder
    /// crashed); on by default. Off, such a key waits for an operator's Takeover or its TTL.
    pub fn allow_takeover(self, allow: bool) -> IdempotencyLayer {
        self.with(|s| s.allow_takeover = allow)
    }

    /// The scope this layer claims keys in.
    pub fn scope(&self) -> &str {
        &self.settings.scope
    }

    /// Checks the settings against the server's default bounds (contract §1.4), so a bad
    /// route configuration fails at startup instead of as a 500 on every request.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.settings;
        let err = |problem: String| Err(ConfigError { scope: s.scope.clone(), problem });
        let scope_ok = !s.scope.is_empty()
            && s.scope.len() <= MAX_SCOPE_LEN
            && s.scope.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
        if !scope_ok {
            return err(format!("a scope is 1 to {MAX_SCOPE_LEN} bytes of A-Z a-z 0-9 . _ : / -"));
        }
        if s.lease < LEASE_BOUNDS.0 || s.lease > LEASE_BOUNDS.1 {
            return err(format!("lease {:?} is outside {:?}..={:?}", s.lease, LEASE_BOUNDS.0, LEASE_BOUNDS.1));
        }
        if let Some(ttl) = s.ttl {
            if ttl < TTL_BOUNDS.0 || ttl > TTL_BOUNDS.1 {
                return err(format!("ttl {ttl:?} is outside {:?}..={:?}", TTL_BOUNDS.0, TTL_BOUNDS.1));
            }
        }
        if s.max_body_bytes == 0 {
            return err("max_body_bytes must be above 0".into());
        }
        if s.cluster_timeout.is_zero() || s.settle_timeout.is_zero() {
            return err("cluster_timeout and settle_timeout must be above 0".into());
        }
        Ok(())
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotent<S>;

    fn layer(&self, inner: S) -> Idempotent<S> {
        Idempotent { inner, client: self.client.clone(), settings: self.settings.clone() }
    }
}

/// The service [`IdempotencyLayer`] wraps a handler in.
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    client: Client,
    settings: Arc<Settings>,
}

impl<S> fmt::Debug for Idempotent<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotent").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotent<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: HttpBody<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is called much later (after the claim), on a clone that is
        // driven to readiness there.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let inner = self.inner.clone();
        let client = self.client.clone();
        let settings = self.settings.clone();
        Box::pin(async move {
            if is_safe(req.method()) {
                return call_unprotected(inner, req.map(box_body)).await;
            }
            let key = match parse_key(req.headers().get_all(&settings.header).iter()) {
                Ok(Some(key)) => key,
                Ok(None) if !settings.key_required => return call_unprotected(inner, req.map(box_body)).await,
                Ok(None) => return Ok(Problem::missing_key(&settings.header).into_response()),
                Err(e) => return Ok(Problem::malformed_key(&settings.header, &e).into_response()),
            };
            let (parts, body) = req.into_parts();
            let body = match read_body(&parts.headers, body, settings.max_body_bytes).await {
                Ok(b) => b,
                Err(p) => return Ok(p.into_response()),
            };
            let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
            let fp = fingerprint(parts.method.as_str(), path, Some(&body));
            let req = Request::from_parts(parts, full(body));
            // The rest runs in a task of its own: if the caller hangs up, the handler still
            // finishes and its response is stored, so the caller's retry gets a replay
            // instead of a second run after the lease expires.
            let task = tokio::spawn(protected(inner, client, settings, key, fp, req));
            match task.await {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "idempotent request task failed");
                    Ok(Problem::handler_failed().into_response())
                }
            }
        })
    }
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

fn call_unprotected<S, ResBody>(
    mut inner: S,
    req: Request<Body>,
) -> BoxFuture<'static, Result<Response<Body>, S::Error>>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // Boxed here (and in the other helpers): each is polled inside a spawned task, so each
    // must be `Send`, and a boxed helper has that checked where its types are written.
    Box::pin(async move {
        std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
        Ok(inner.call(req).await?.map(box_body))
    })
}

/// Why a key header is not usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyHeaderError {
    /// More than one header line.
    Repeated,
    /// Not visible ASCII.
    NotAscii,
    /// A quoted string with no closing quote, or with an escape.
    BadQuoting,
    /// The key breaks the key rule.
    Rule(KeyError),
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const RULE: &str = "a key is 16 to 255 characters of A-Z a-z 0-9 _ . : - (a UUID works)";
        match self {
            KeyHeaderError::Repeated => write!(f, "the header was sent more than once; send exactly one key"),
            KeyHeaderError::NotAscii => write!(f, "the header is not visible ASCII; {RULE}"),
            KeyHeaderError::BadQuoting => {
                write!(f, "the header starts a quoted string but is not one; send \"<key>\" or the bare key; {RULE}")
            }
            KeyHeaderError::Rule(KeyError::Length { len }) => write!(f, "the key is {len} characters long; {RULE}"),
            KeyHeaderError::Rule(KeyError::BadCharacter { offset, found }) => {
                write!(f, "the key has {found:?} at position {offset}; {RULE}")
            }
            KeyHeaderError::Rule(other) => write!(f, "{other}"),
        }
    }
}

/// Reads the key from the header's values: the IETF draft's structured-field string
/// (`"8e03978e-..."`) or Stripe's bare token, checked against the key rule. `Ok(None)` when
/// there is no header.
pub fn parse_key<'a>(mut values: impl Iterator<Item = &'a HeaderValue>) -> Result<Option<String>, KeyHeaderError> {
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(KeyHeaderError::Repeated);
    }
    let text = value.to_str().map_err(|_| KeyHeaderError::NotAscii)?.trim_matches([' ', '\t']);
    let key = match text.strip_prefix('"') {
        Some(rest) => {
            let inner = rest.strip_suffix('"').ok_or(KeyHeaderError::BadQuoting)?;
            // The key rule has neither quotes nor backslashes, so an escape is never needed.
            if inner.contains(['"', '\\']) {
                return Err(KeyHeaderError::BadQuoting);
            }
            inner
        }
        None => text,
    };
    keys::validate(key).map_err(KeyHeaderError::Rule)?;
    Ok(Some(key.to_string()))
}

/// Buffers a request body of at most `limit` bytes; 413 above it (told by `Content-Length`
/// before anything is read, when the client sent one).
async fn read_body<B>(headers: &http::HeaderMap, body: B, limit: usize) -> Result<Bytes, Problem>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let declared = headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Problem::too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(Problem::too_large(limit)),
        Err(e) => Err(Problem::unreadable_body(&e.to_string())),
    }
}

fn full(bytes: Bytes) -> Body {
    Body::from_bytes(bytes)
}

fn box_body<B>(body: B) -> Body
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Body::new(body)
}

/// Claim, then run the handler under the grant (or replay, or refuse).
fn protected<S, ResBody>(
    inner: S,
    client: Client,
    settings: Arc<Settings>,
    key: String,
    fp: Fingerprint,
    mut req: Request<Body>,
) -> BoxFuture<'static, Result<Response<Body>, S::Error>>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    Box::pin(async move {
        let s = &*settings;
        let owner = keys::random("http-");
        let claim =
            ClaimOptions { fingerprint: Some(fp), lease: Some(s.lease), ttl: s.ttl, allow_takeover: s.allow_takeover };
        let wait_until = match s.in_flight {
            InFlight::Conflict => None,
            InFlight::Wait(bound) => Some(Instant::now() + bound),
        };
        let mut rounds = 0;
        let grant = loop {
            let outcome = client.claim_until(Instant::now() + s.cluster_timeout, &s.scope, &key, &owner, &claim).await;
            match outcome {
                Ok(Outcome::Acquired(g)) => break g,
                Ok(Outcome::Replay { response, .. }) => return Ok(replay(&response)),
                Ok(Outcome::Mismatch) => return Ok(Problem::mismatch(&s.header).into_response()),
                Ok(Outcome::InProgress { retry_after_ms, .. }) => {
                    let left = wait_until.map(|w| w.saturating_duration_since(Instant::now())).unwrap_or_default();
                    rounds += 1;
                    if left < Duration::from_millis(10) || rounds > MAX_WAIT_ROUNDS {
                        let secs = retry_after_secs(retry_after_ms).min(MAX_IN_FLIGHT_RETRY_AFTER_SECS);
                        return Ok(Problem::in_flight(secs).into_response());
                    }
                    if let Err(e) = client.wait(&s.scope, &key, left).await {
                        // Waiting is a courtesy; the cluster going away during it is a 503 (never
                        // fail-open: another request is known to be running this key).
                        return Ok(Problem::unavailable(&e).into_response());
                    }
                }
                Ok(other) => {
                    tracing::error!(outcome = other.name(), "unexpected claim outcome");
                    return Ok(Problem::internal(&format!("unexpected claim outcome {}", other.name())).into_response());
                }
                Err(e @ Error::QuotaExceeded { .. }) => {
                    // The operator's problem, not the caller's: the full message (tenant, count,
                    // the fix) goes to the log; the caller learns only that it may retry later.
                    // Never fail-open: the cluster answered, and it said no.
                    tracing::error!(error = %e, scope = %s.scope, "the tenant's record quota refused a new key");
                    return Ok(Problem::quota_exceeded().into_response());
                }
                Err(e) if store_unavailable(&e) => {
                    return match s.unavailable {
                        Unavailable::FailClosed => Ok(Problem::unavailable(&e).into_response()),
                        Unavailable::FailOpen => {
                            tracing::warn!(error = %e, scope = %s.scope, "cluster unavailable; running the handler unprotected (fail-open)");
                            call_unprotected(inner, req).await
                        }
                    };
                }
                Err(e) => {
                    // The key was checked here with the server's default rule, so a refusal is
                    // a configuration mismatch between this route and the cluster.
                    tracing::error!(error = %e, scope = %s.scope, "the cluster refused the claim");
                    return Ok(Problem::internal(&e.to_string()).into_response());
                }
            }
        };

        req.extensions_mut().insert(FencingToken(grant.token));
        req.extensions_mut().insert(IdempotencyKey(key.clone()));
        req.extensions_mut().insert(ClaimInfo {
            scope: s.scope.clone(),
            token: grant.token,
            attempt: grant.attempt,
            takeover: grant.takeover,
            recovery_point: grant.recovery_point.clone(),
        });

        let opts = ExecuteOptions {
            lease: s.lease,
            ttl: s.ttl,
            deadline: s.settle_timeout,
            owner: Some(owner),
            allow_takeover: s.allow_takeover,
        };
        // What the caller of this request gets: the handler's full response, or the error the
        // service returned. The SDK gets only what is stored.
        let (answer_tx, mut answer_rx) = tokio::sync::oneshot::channel();
        let token = grant.token;
        let handler = run_handler(inner, req, settings.clone());
        let executed = client
            .run_granted(&s.scope, &key, grant, &opts, |_grant| async move {
                let (result, work) = handler.await;
                let _ = answer_tx.send(result);
                work
            })
            .await;
        match (executed, answer_rx.try_recv().ok()) {
            (Ok(_), Some(a)) => a,
            (Err(ExecuteError::WorkFailed(_)), Some(a)) => a,
            (Err(ExecuteError::LostOwnership { current, .. }), _) => {
                tracing::warn!(token, current, "lease lost while the handler ran; its response was not stored");
                Ok(Problem::lost_ownership().into_response())
            }
            (Err(e), Some(a)) => {
                // The handler ran, but its outcome could not be stored: the caller still gets
                // what the handler did. A retry after the lease expires may run it again, which
                // the fencing token makes safe downstream.
                tracing::error!(error = %e, token, "the response could not be stored");
                a
            }
            (Ok(_) | Err(_), None) => Ok(Problem::internal("the handler produced no answer").into_response()),
        }
    })
}

/// Whether the cluster gave the claim no answer: unreachable, the outcome unknown (a lost
/// reply, a connection broken mid-call), or every attempt shed by an overloaded leader. The
/// handler has not run, so these are 503 or fail-open; only a refusal the cluster stands by
/// is the operator's problem (500).
fn store_unavailable(e: &Error) -> bool {
    e.is_indeterminate() || matches!(e, Error::Rpc { code: tonic::Code::ResourceExhausted, .. })
}

/// What the caller gets, and what the SDK settles the key with.
type Handled<E> = (Result<Response<Body>, E>, Result<StoredResponse, WorkError>);

/// Runs the inner service once, catching a panic.
fn run_handler<S, ResBody>(
    mut inner: S,
    req: Request<Body>,
    settings: Arc<Settings>,
) -> BoxFuture<'static, Handled<S::Error>>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    Box::pin(async move {
        let s = &*settings;
        let ran = AssertUnwindSafe(async {
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(req).await
        })
        .catch_unwind()
        .await;
        let response = match ran {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return (Err(e), Err(WorkError::Retryable("the handler returned an error".into()))),
            Err(panic) => {
                let what = panic_message(&panic);
                tracing::error!(panic = %what, scope = %s.scope, "the handler panicked; the key is released");
                return (
                    Ok(Problem::handler_failed().into_response()),
                    Err(WorkError::Retryable(format!("the handler panicked: {what}"))),
                );
            }
        };
        let (parts, body) = response.into_parts();
        let bytes = match body.collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) => {
                let e: BoxError = e.into();
                tracing::error!(error = %e, "the handler's response body failed");
                return (
                    Ok(Problem::handler_failed().into_response()),
                    Err(WorkError::Retryable(format!("the response body failed: {e}"))),
                );
            }
        };
        let work = if s.store.stores(parts.status) {
            let stored = to_stored(&parts, &bytes, s);
            if parts.status.is_success() || parts.status.is_redirection() || parts.status.is_informational() {
                Ok(stored)
            } else {
                Err(WorkError::Terminal(stored))
            }
        } else {
            Err(WorkError::Retryable(format!("status {} is not stored", parts.status.as_u16())))
        };
        (Ok(Response::from_parts(parts, full(bytes))), work)
    })
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic".to_string()
    }
}

/// The stored form of a response: status, the allowed headers in order, body bytes.
fn to_stored(parts: &http::response::Parts, body: &Bytes, s: &Settings) -> StoredResponse {
    let mut stored = StoredResponse::new(u32::from(parts.status.as_u16()), body.to_vec());
    let too_large = body.len() > s.max_stored_body_bytes;
    for (name, value) in &parts.headers {
        if !s.replay_headers.contains(name) || (too_large && name == CONTENT_TYPE) {
            continue;
        }
        match value.to_str() {
            Ok(v) => stored.headers.push((name.as_str().to_string(), v.to_string())),
            Err(_) => tracing::warn!(header = %name, "a header that is not visible ASCII is not replayed"),
        }
    }
    if too_large {
        let p = Problem::new(
            parts.status,
            "response-not-stored",
            "Response too large to replay",
            format!(
                "the request was processed once, but its {}-byte response is over the {}-byte limit of what is \
                 kept; fetch the result another way (e.g. from the Location header)",
                body.len(),
                s.max_stored_body_bytes
            ),
        );
        stored.body = p.body().into_bytes();
        stored.headers.push((CONTENT_TYPE.as_str().to_string(), PROBLEM_JSON.to_string()));
    }
    stored
}

/// A stored response as a replay.
fn replay(stored: &StoredResponse) -> Response<Body> {
    let status = u16::try_from(stored.status)
        .ok()
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = Response::new(full(Bytes::from(stored.body.clone())));
    *r.status_mut() = status;
    for (name, value) in &stored.headers {
        match (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str())) {
            (Ok(n), Ok(v)) => {
                r.headers_mut().append(n, v);
            }
            _ => tracing::warn!(header = %name, "a stored header is not a valid HTTP header; skipped"),
        }
    }
    r.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    r
}

/// Seconds for `Retry-After`: the server's hint rounded up, at least 1.
fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}

/// An RFC 9457 problem: the body of every answer the layer itself gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// `type`: [`PROBLEM_TYPE_PREFIX`] followed by a slug.
    pub kind: String,
    /// `title`: the same for every occurrence of the problem.
    pub title: String,
    /// `detail`: this occurrence, naming the fix.
    pub detail: String,
    /// `Retry-After` seconds, if the request may be retried as is.
    pub retry_after: Option<u64>,
}

impl Problem {
    fn new(status: StatusCode, slug: &str, title: &str, detail: String) -> Problem {
        Problem { status, kind: format!("{PROBLEM_TYPE_PREFIX}{slug}"), title: title.into(), detail, retry_after: None }
    }

    fn retry_after(mut self, secs: u64) -> Problem {
        self.retry_after = Some(secs);
        self
    }

    fn missing_key(header: &HeaderName) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "missing-idempotency-key",
            "Idempotency key required",
            format!(
                "this endpoint requires an {header} header: generate a unique key (16 to 255 characters of \
                 A-Z a-z 0-9 _ . : -, e.g. a UUID) for each new request and send the same key on its retries"
            ),
        )
    }

    fn malformed_key(header: &HeaderName, e: &KeyHeaderError) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed-idempotency-key",
            "Malformed idempotency key",
            format!("the {header} header is not a valid key: {e}"),
        )
    }

    fn too_large(limit: usize) -> Problem {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the body is over this endpoint's limit of {limit} bytes; send a smaller body"),
        )
    }

    fn unreadable_body(why: &str) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "unreadable-body",
            "Request body could not be read",
            format!("the body could not be read ({why}); send the request again with the same key"),
        )
    }

    fn mismatch(header: &HeaderName) -> Problem {
        Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "Idempotency key reused with a different request",
            format!(
                "this {header} was first used with a different method, path or body; resend the original request \
                 unchanged to get its response, or use a new key for a new request"
            ),
        )
    }

    fn in_flight(secs: u64) -> Problem {
        Problem::new(
            StatusCode::CONFLICT,
            "request-in-progress",
            "A request with this idempotency key is in progress",
            format!(
                "the first request with this key has not finished; retry the same request with the same key after \
                 {secs} s to get its response"
            ),
        )
        .retry_after(secs)
    }

    fn unavailable(e: &Error) -> Problem {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "idempotency-store-unavailable",
            "Idempotency store unavailable",
            format!(
                "the request was not processed because the idempotency store could not be reached ({e}); retry the \
                 same request with the same key after 1 s"
            ),
        )
        .retry_after(1)
    }

    fn quota_exceeded() -> Problem {
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "idempotency-quota-exceeded",
            "Too many idempotency keys in use",
            "the request was not processed: this service holds as many idempotency records as it is allowed; \
             retry later, when older keys have expired (requests that reuse an existing key still work)"
                .into(),
        )
    }

    fn handler_failed() -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "handler-failed",
            "The request failed and was not stored",
            "the request failed before it produced a response; the key was released, so retry the same request \
             with the same key"
                .into(),
        )
    }

    fn lost_ownership() -> Problem {
        Problem::new(
            StatusCode::CONFLICT,
            "idempotency-lease-lost",
            "The request lost its claim on the key",
            "the request ran past its lease and another request took the key over; retry the same request with \
             the same key after 1 s to get the response that was stored"
                .into(),
        )
        .retry_after(1)
    }

    fn internal(why: &str) -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "idempotency-internal",
            "Idempotency check failed",
            format!("the idempotency check failed ({why}); the request was not processed; report this to the operator"),
        )
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        serde_json::json!({
            "type": self.kind,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        })
        .to_string()
    }

    /// The whole response: status, `Content-Type: application/problem+json`, `Retry-After`
    /// when set, the body.
    pub fn into_response(self) -> Response<Body> {
        let mut r = Response::new(full(Bytes::from(self.body())));
        *r.status_mut() = self.status;
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

#[cfg(test)]
mod tests {
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
        let layer = IdempotencyLayer::new(client, "payments.create")
            .max_body_bytes(8)
            .cluster_timeout(Duration::from_millis(300));
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
}
