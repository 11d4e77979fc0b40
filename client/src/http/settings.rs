//! What the layer is configured with: the header names, the request extensions it hands the
//! handler, the store policy, in-flight and unavailable choices, and the bounds a setting must
//! keep.

use super::*;

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
    pub(super) scope: String,
    pub(super) problem: String,
}

#[derive(Clone, Debug)]
pub(super) struct Settings {
    pub(super) scope: String,
    pub(super) header: HeaderName,
    pub(super) key_required: bool,
    pub(super) lease: Duration,
    pub(super) ttl: Option<Duration>,
    pub(super) in_flight: InFlight,
    pub(super) store: StorePolicy,
    pub(super) replay_headers: Vec<HeaderName>,
    pub(super) unavailable: Unavailable,
    pub(super) max_body_bytes: usize,
    pub(super) max_stored_body_bytes: usize,
    pub(super) cluster_timeout: Duration,
    pub(super) settle_timeout: Duration,
    pub(super) allow_takeover: bool,
}

/// Bounds of contract §1.4 (the server's defaults), checked by [`IdempotencyLayer::validate`].
pub(super) const LEASE_BOUNDS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(600));
pub(super) const TTL_BOUNDS: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(30 * 24 * 3600));
pub(super) const MAX_SCOPE_LEN: usize = 128;
/// Longest `Retry-After` on a 409. The server's hint is the holder's lease time left, an upper
/// bound rather than an estimate (the lease is renewed while the handler runs), and a first
/// request usually finishes long before it: so a client is told to come back soon.
pub(super) const MAX_IN_FLIGHT_RETRY_AFTER_SECS: u64 = 1;
/// How many times a waiting request claims again before it gives up with 409; each round
/// waits on the server, so this only bounds a key that keeps changing hands.
pub(super) const MAX_WAIT_ROUNDS: u32 = 32;
