//! The SDK proper: connection, leader caching, retries within a deadline, typed outcomes,
//! and `execute`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::v1::admin_client::AdminClient;
use idemraft_proto::v1::idempotency_client::IdempotencyClient;
use idemraft_proto::{
    LEADER_ADDR_HEADER, NOT_PROPOSED_HEADER, QUOTA_LIMIT_HEADER, QUOTA_RECORDS_HEADER, QUOTA_TENANT_HEADER,
    SERVED_BY_HEADER,
};
use tokio::time::Instant;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use crate::fingerprint::Fingerprint;

/// Why a call failed. Conflicts that a caller handles in the normal course (IN_PROGRESS,
/// MISMATCH, ...) are [`Outcome`]s, not errors.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The request broke a rule; the message names it. Retrying will not help.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// No node could serve the call before the deadline (no leader, no quorum, nodes down).
    /// For a write the outcome is unknown; repeating the same call is safe.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// The deadline passed; for a write the outcome is unknown, repeating it is safe.
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    /// The outcome of the call is unknown; repeating the same call is safe. Either the
    /// connection broke before the answer arrived (or HTTP/2 closed it under load) and no
    /// other attempt got an answer before the deadline, or a retried write got an answer
    /// that an earlier attempt, whose outcome is unknown, may itself have caused. The message
    /// says which.
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
    /// The cluster cannot make this admin change now.
    #[error("refused: {0}")]
    FailedPrecondition(String),
    /// The client was configured wrongly (no endpoints, a malformed address).
    #[error("client configuration: {0}")]
    Config(String),
    /// Any other gRPC failure.
    #[error("{code:?}: {message}")]
    Rpc {
        /// gRPC code.
        code: Code,
        /// Its message.
        message: String,
    },
    /// The server answered with something this SDK does not understand (a newer server?).
    #[error("unexpected reply: {0}")]
    Protocol(String),
    /// A local file could not be written (e.g. `save_snapshot`'s target).
    #[error("local file: {0}")]
    Io(String),
    /// The claim would have created a record past the tenant's record quota, and the cluster
    /// refused it; nothing was stored. Not retried: the same claim gets the same answer until
    /// an operator raises the quota (`idemctl quota set`) or records expire. Claims on keys
    /// that already have a record are never refused this way.
    #[error("{message}")]
    QuotaExceeded {
        /// The tenant whose quota is used up.
        tenant: String,
        /// Its quota, in records.
        limit: u64,
        /// The records it holds.
        records: u64,
        /// The server's explanation, naming the fix.
        message: String,
    },
}

impl Error {
    pub(crate) fn from_status(s: &Status) -> Error {
        if let Some(why) = lost_reply(s) {
            return Error::Indeterminate(format!(
                "{why} ({:?}: {}); the call may or may not have taken effect: repeat it with the same arguments",
                s.code(),
                s.message()
            ));
        }
        let message = s.message().to_string();
        match s.code() {
            Code::InvalidArgument => Error::InvalidArgument(message),
            Code::Unavailable => Error::Unavailable(message),
            // A cancelled call is one whose time ran out: its outcome is just as unknown.
            Code::DeadlineExceeded | Code::Cancelled => Error::DeadlineExceeded(message),
            Code::FailedPrecondition => match quota_refusal(s) {
                Some((tenant, limit, records)) => Error::QuotaExceeded { tenant, limit, records, message },
                None => Error::FailedPrecondition(message),
            },
            code => Error::Rpc { code, message },
        }
    }

    /// Whether the outcome of the call is unknown (it may or may not have been applied).
    pub fn is_indeterminate(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::DeadlineExceeded(_) | Error::Indeterminate(_))
    }
}

/// The tenant, quota and record count of a quota refusal, which the node marks with metadata
/// (the message is for people; the metadata is what code relies on).
fn quota_refusal(s: &Status) -> Option<(String, u64, u64)> {
    let md = s.metadata();
    let text = |k: &str| md.get(k).and_then(|v| v.to_str().ok());
    let limit = text(QUOTA_LIMIT_HEADER)?.parse().ok()?;
    let records = text(QUOTA_RECORDS_HEADER).and_then(|v| v.parse().ok()).unwrap_or(limit);
    Some((text(QUOTA_TENANT_HEADER).unwrap_or_default().to_string(), limit, records))
}

/// A stored response: status, headers and body, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StoredResponse {
    /// Status code (the HTTP status for HTTP work).
    pub status: u32,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// A response with a status and body and no headers.
    pub fn new(status: u32, body: impl Into<Vec<u8>>) -> StoredResponse {
        StoredResponse { status, headers: Vec::new(), body: body.into() }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> StoredResponse {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn to_pb(&self) -> pb::StoredResponse {
        pb::StoredResponse {
            status: self.status,
            headers: self.headers.iter().map(|(n, v)| pb::Header { name: n.clone(), value: v.clone() }).collect(),
            body: self.body.clone(),
        }
    }

    fn from_pb(r: pb::StoredResponse) -> StoredResponse {
        StoredResponse {
            status: r.status,
            headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
            body: r.body,
        }
    }
}

/// An ownership grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token: pass it to downstream systems, which refuse lower tokens.
    pub token: u64,
    /// 1 for a first grant.
    pub attempt: u32,
    /// This grant took the key over from an owner whose lease expired.
    pub takeover: bool,
    /// Lease deadline, Unix ms of the cluster's clock.
    pub lease_expires_ms: u64,
    /// Record expiry, Unix ms.
    pub expires_ms: u64,
    /// Progress marker left by a previous owner.
    pub recovery_point: String,
    /// Progress data left by a previous owner.
    pub checkpoint: Vec<u8>,
}

/// A record's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordState {
    /// Owned under a lease.
    InProgress,
    /// Settled with a stored response.
    Completed,
    /// Failed retryably.
    Failed,
    /// A state this SDK does not know.
    Unknown,
}

impl RecordState {
    /// The state of a wire value (`Record::state`, `WrongState::state`).
    pub fn from_proto(v: i32) -> RecordState {
        match pb::RecordState::try_from(v) {
            Ok(pb::RecordState::InProgress) => RecordState::InProgress,
            Ok(pb::RecordState::Completed) => RecordState::Completed,
            Ok(pb::RecordState::Failed) => RecordState::Failed,
            _ => RecordState::Unknown,
        }
    }

    /// The state's name as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InProgress => "IN_PROGRESS",
            RecordState::Completed => "COMPLETED",
            RecordState::Failed => "FAILED",
            RecordState::Unknown => "UNKNOWN",
        }
    }
}

/// The decision on a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The caller owns the key.
    Acquired(Grant),
    /// The key was completed before; this is its stored response.
    Replay {
        /// Token of the completing grant.
        token: u64,
        /// When it completed, Unix ms.
        completed_ms: u64,
        /// The stored response.
        response: StoredResponse,
    },
    /// Someone else holds the key.
    InProgress {
        /// The holder's lease deadline, Unix ms.
        lease_expires_ms: u64,
        /// Suggested wait before retrying, ms.
        retry_after_ms: u64,
    },
    /// The key is bound to another request fingerprint.
    Mismatch,
    /// The token is not the record's current one.
    StaleToken {
        /// The current token.
        current: u64,
    },
    /// No live record with that id.
    NotFound,
    /// The record's state does not allow the call.
    WrongState(RecordState),
    /// Complete accepted.
    Completed {
        /// The completing token.
        token: u64,
    },
    /// Fail accepted.
    Failed {
        /// The failing token.
        token: u64,
        /// FAILED (true) or COMPLETED with the error response (false).
        retryable: bool,
    },
    /// Lease extended.
    LeaseExtended {
        /// The owner's token.
        token: u64,
        /// New deadline, Unix ms.
        lease_expires_ms: u64,
    },
}

impl Outcome {
    fn from_pb(o: pb::Outcome) -> Result<Outcome, Error> {
        use pb::outcome::Result as R;
        Ok(match o.result.ok_or_else(|| Error::Protocol("an outcome with no result".into()))? {
            R::Acquired(a) => Outcome::Acquired(Grant {
                token: a.token,
                attempt: a.attempt,
                takeover: a.takeover,
                lease_expires_ms: a.lease_expires_ms,
                expires_ms: a.expires_ms,
                recovery_point: a.recovery_point,
                checkpoint: a.checkpoint,
            }),
            R::Replay(r) => Outcome::Replay {
                token: r.token,
                completed_ms: r.completed_ms,
                response: StoredResponse::from_pb(r.response.unwrap_or_default()),
            },
            R::InProgress(p) => {
                Outcome::InProgress { lease_expires_ms: p.lease_expires_ms, retry_after_ms: p.retry_after_ms }
            }
            R::Mismatch(_) => Outcome::Mismatch,
            R::StaleToken(s) => Outcome::StaleToken { current: s.current },
            R::NotFound(_) => Outcome::NotFound,
            R::WrongState(w) => Outcome::WrongState(RecordState::from_proto(w.state)),
            R::Completed(c) => Outcome::Completed { token: c.token },
            R::Failed(f) => Outcome::Failed { token: f.token, retryable: f.retryable },
            R::LeaseExtended(l) => Outcome::LeaseExtended { token: l.token, lease_expires_ms: l.lease_expires_ms },
        })
    }

    /// The outcome's name as the API spells it (e.g. `ACQUIRED`).
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Acquired(_) => "ACQUIRED",
            Outcome::Replay { .. } => "REPLAY",
            Outcome::InProgress { .. } => "IN_PROGRESS",
            Outcome::Mismatch => "MISMATCH",
            Outcome::StaleToken { .. } => "STALE_TOKEN",
            Outcome::NotFound => "NOT_FOUND",
            Outcome::WrongState(_) => "WRONG_STATE",
            Outcome::Completed { .. } => "COMPLETED",
            Outcome::Failed { .. } => "FAILED",
            Outcome::LeaseExtended { .. } => "LEASE_EXTENDED",
        }
    }
}

/// A record as `Get`, `Wait` and `List` return it.
pub type Record = pb::Record;

/// A record after `Wait`.
#[derive(Clone, Debug)]
pub struct Waited {
    /// The record, if it exists.
    pub record: Option<Record>,
    /// Still IN_PROGRESS when the wait ended.
    pub timed_out: bool,
}

/// Options for a claim.
#[derive(Clone, Debug, Default)]
pub struct ClaimOptions {
    /// Request fingerprint, binding the key to one payload.
    pub fingerprint: Option<Fingerprint>,
    /// Lease; `None` takes the server's default.
    pub lease: Option<Duration>,
    /// Record TTL/retention; `None` takes the scope's default.
    pub ttl: Option<Duration>,
    /// Take over an expired lease.
    pub allow_takeover: bool,
}

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Client addresses of some or all nodes, `host:port` or `http://host:port`.
    pub endpoints: Vec<String>,
    /// Tenant of every record this client touches. Empty (the default) lets the node decide:
    /// the bearer token's tenant when the node checks tokens, `default` when it does not. A
    /// node that checks tokens refuses any other tenant than the token's.
    pub tenant: String,
    /// Deadline of a call when the caller gives none.
    pub deadline: Duration,
    /// Longest single attempt, so a hung node costs one attempt and not the whole deadline.
    pub attempt_timeout: Duration,
    /// First backoff after an UNAVAILABLE; doubles up to `backoff_max`, with full jitter.
    pub backoff_base: Duration,
    /// Backoff bound.
    pub backoff_max: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// PEM of the CA that signed the nodes' certificates. Set, endpoints without a scheme (and
    /// the leader addresses nodes hand back) are dialled with `https://`, verified against
    /// this CA only: the system's roots are never trusted for a cluster.
    pub tls_ca: Option<Vec<u8>>,
    /// A client certificate, for nodes started with `--tls-client-ca`.
    pub tls_identity: Option<TlsIdentity>,
    /// Sent as `authorization: Bearer <token>` on every call, for nodes started with
    /// `--tokens-file`; the node takes the tenant from it.
    pub bearer_token: Option<BearerToken>,
}

/// A client certificate chain and its private key, both PEM. `Debug` leaves the key out.
#[derive(Clone)]
pub struct TlsIdentity {
    /// Certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// Private key, PEM.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").field("cert_pem", &format!("{} bytes", self.cert_pem.len())).finish()
    }
}

/// A bearer token. `Debug` never prints it, so a logged [`ClientConfig`] leaks nothing.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(String);

impl BearerToken {
    /// Wraps a token (surrounding whitespace, such as a file's trailing newline, is dropped).
    pub fn new(token: impl Into<String>) -> BearerToken {
        BearerToken(token.into().trim().to_string())
    }

    /// The token itself.
    pub fn secret(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

fn read_pem(what: &str, path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::Config(format!("cannot read the {what} {}: {e}", path.display())))
}

impl ClientConfig {
    /// Settings for these endpoints with the defaults: the node's tenant, deadline 10 s,
    /// attempts of at most 2 s, backoff 20 ms doubling to 250 ms.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> ClientConfig {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            tenant: String::new(),
            deadline: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(2),
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(250),
            connect_timeout: Duration::from_millis(500),
            tls_ca: None,
            tls_identity: None,
            bearer_token: None,
        }
    }

    /// Reads the CA (and optionally a client certificate and key) from PEM files into
    /// [`ClientConfig::tls_ca`] and [`ClientConfig::tls_identity`].
    pub fn with_tls_files(
        mut self,
        ca: &std::path::Path,
        identity: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<ClientConfig, Error> {
        self.tls_ca = Some(read_pem("CA certificate", ca)?);
        if let Some((cert, key)) = identity {
            self.tls_identity = Some(TlsIdentity {
                cert_pem: read_pem("client certificate", cert)?,
                key_pem: read_pem("client key", key)?,
            });
        }
        Ok(self)
    }
}

/// Adds the bearer token, if any, to every call. An interceptor on the channel rather than a
/// line per call, so no call (a new one included) can go out without it.
#[derive(Clone)]
pub struct AddBearer(Option<MetadataValue<Ascii>>);

impl AddBearer {
    fn new(config: &ClientConfig) -> Result<AddBearer, Error> {
        let Some(token) = &config.bearer_token else { return Ok(AddBearer(None)) };
        if token.secret().is_empty() {
            return Err(Error::Config("the bearer token is empty: give the token from the tokens file's owner".into()));
        }
        let mut value: MetadataValue<Ascii> = format!("Bearer {}", token.secret()).parse().map_err(|_| {
            Error::Config("the bearer token has characters that cannot go in a header: use printable ASCII".into())
        })?;
        // Never put the token in HPACK's dynamic table, where a compression side channel
        // could recover it.
        value.set_sensitive(true);
        Ok(AddBearer(Some(value)))
    }
}

impl tonic::service::Interceptor for AddBearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A connection to one node, with the bearer token attached to every call.
pub type Conn = InterceptedService<Channel, AddBearer>;

struct Target {
    addr: String,
    channel: Conn,
}

struct Inner {
    config: ClientConfig,
    targets: Mutex<Vec<Target>>,
    /// Index into `targets` of the node believed to lead.
    preferred: AtomicUsize,
}

/// A connection to an Idemraft cluster. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// `host:port` gets `https://` when the client has a CA to verify nodes with, else `http://`.
fn normalise(addr: &str, tls: bool) -> String {
    let a = addr.trim();
    if a.starts_with("http://") || a.starts_with("https://") {
        a.to_string()
    } else if tls {
        format!("https://{a}")
    } else {
        format!("http://{a}")
    }
}

fn channel(addr: &str, config: &ClientConfig) -> Result<Conn, Error> {
    let url = normalise(addr, config.tls_ca.is_some());
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| Error::Config(format!("endpoint '{addr}' is not a usable address: {e}; write host:port")))?
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true);
    if url.starts_with("https://") {
        let ca = config.tls_ca.as_ref().ok_or_else(|| {
            Error::Config(format!("endpoint '{addr}' uses https but no CA is configured: set tls_ca (idemctl --ca)"))
        })?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(id) = &config.tls_identity {
            tls = tls.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Error::Config(format!("TLS settings for '{addr}' are unusable: {e}; check the PEM files")))?;
    }
    Ok(InterceptedService::new(endpoint.connect_lazy(), AddBearer::new(config)?))
}

/// Full-jitter exponential backoff.
fn backoff(config: &ClientConfig, attempt: u32) -> Duration {
    let cap = config.backoff_base.saturating_mul(1u32 << attempt.min(16)).min(config.backoff_max);
    let ms = cap.as_millis() as u64;
    Duration::from_millis(if ms == 0 { 0 } else { rand::random_range(0..=ms) })
}

/// Shortest attempt worth making; less is left only to learn that time ran out.
const MIN_ATTEMPT: Duration = Duration::from_millis(10);

/// Statuses that say only that an attempt's time ran out (tonic's server answers CANCELLED,
/// "Timeout expired", when a call's grpc-timeout passes).
fn ran_out(code: Code) -> bool {
    matches!(code, Code::DeadlineExceeded | Code::Cancelled)
}

fn retryable(status: &Status) -> bool {
    // Unavailable: no leader, no quorum, node down (connection refused). DeadlineExceeded
    // of one attempt while the call's own deadline still has time: try another node.
    // Cancelled: the attempt's time ran out or the stream was reset. ResourceExhausted: the
    // leader shed the call before proposing it; back off and retry. A lost reply (a broken
    // connection, whatever code tonic gave it): like a timeout. Every call is safe to repeat.
    matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted)
        || lost_reply(status).is_some()
}

/// Why the reply to a call was lost, when the status says it was: the connection under the
/// call broke, or HTTP/2 closed it, before an answer arrived. The call may have been carried
/// out, so this is a timeout's "outcome unknown", never a refusal.
///
/// tonic gives a broken connection no code of its own. A status made on this side of the
/// connection carries the transport's error as its source, so that chain is checked first:
/// an h2, hyper, IO or tonic transport error below the status is a broken connection, whatever code
/// tonic chose for it (INTERNAL for a reset stream or an h2 protocol error, UNKNOWN for a
/// closed connection, RESOURCE_EXHAUSTED for a GOAWAY with ENHANCE_YOUR_CALM). A status from
/// the server has no source: only tonic's own wording for an h2 failure is taken as one, so a
/// real INTERNAL error of the node (a storage failure) stays a determinate error.
fn lost_reply(status: &Status) -> Option<&'static str> {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<h2::Error>()
            || e.is::<hyper::Error>()
            || e.is::<std::io::Error>()
            || e.is::<tonic::transport::Error>()
        {
            return Some("the connection to the node broke before the answer arrived");
        }
        source = e.source();
    }
    match status.code() {
        Code::Internal | Code::Unknown if status.message().starts_with("h2 protocol error:") => {
            Some("the HTTP/2 connection to the node broke before the answer arrived")
        }
        // No gRPC status at all: something below gRPC ended the call.
        Code::Unknown => Some("the call ended without a gRPC status"),
        // The node marks every call it sheds; an unmarked one was ended by HTTP/2 (a GOAWAY
        // with ENHANCE_YOUR_CALM), possibly after the node had taken it.
        Code::ResourceExhausted if !never_proposed(status) => {
            Some("HTTP/2 closed the connection to the node as overloaded before the answer arrived")
        }
        _ => None,
    }
}

/// The error of a call whose deadline ran out, `last` being the most telling answer of its
/// attempts. When an earlier attempt may have taken effect, a determinate refusal after it
/// (an overloaded leader shedding the retry) does not make the outcome known.
fn gave_up(last: &Status, maybe_applied: bool) -> Error {
    match Error::from_status(last) {
        e if e.is_indeterminate() || !maybe_applied => e,
        e => Error::Indeterminate(format!(
            "an earlier attempt got no answer and may have taken effect, and the last was refused ({e}); \
             repeat the call with the same arguments"
        )),
    }
}

/// Whether the node says the call was refused before it was proposed. The code alone does not
/// prove it: tonic also reports an HTTP/2 GOAWAY with ENHANCE_YOUR_CALM as RESOURCE_EXHAUSTED,
/// and that can end calls the leader had already taken.
fn never_proposed(status: &Status) -> bool {
    status.code() == Code::ResourceExhausted && status.metadata().contains_key(NOT_PROPOSED_HEADER)
}

impl Client {
    /// A client for the cluster at `config.endpoints`. Connections are made on first use, so
    /// this succeeds while nodes are still starting. Call it inside a Tokio runtime.
    pub fn new(config: ClientConfig) -> Result<Client, Error> {
        if config.endpoints.is_empty() {
            return Err(Error::Config("no endpoints: give at least one node's client address".into()));
        }
        // tonic's lazy channels spawn their connection task on the current runtime.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::Config("Client::new must be called inside a Tokio runtime".into()));
        }
        let targets = config
            .endpoints
            .iter()
            .map(|a| Ok(Target { addr: normalise(a, config.tls_ca.is_some()), channel: channel(a, &config)? }))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Client { inner: Arc::new(Inner { config, targets: Mutex::new(targets), preferred: AtomicUsize::new(0) }) })
    }

    /// A client with default settings for these endpoints.
    pub fn connect<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Result<Client, Error> {
        Client::new(ClientConfig::new(endpoints))
    }

    /// The settings in use.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    fn pick(&self, index: usize) -> Option<(usize, Conn)> {
        let targets = self.inner.targets.lock().ok()?;
        let i = index % targets.len().max(1);
        targets.get(i).map(|t| (i, t.channel.clone()))
    }

    /// Points the client at `addr` (a leader hint), adding it if it is not an endpoint yet.
    fn prefer_addr(&self, addr: &str) -> Option<usize> {
        let wanted = normalise(addr, self.inner.config.tls_ca.is_some());
        let mut targets = self.inner.targets.lock().ok()?;
        let i = match targets.iter().position(|t| t.addr == wanted) {
            Some(i) => i,
            None => {
                let channel = channel(addr, &self.inner.config).ok()?;
                targets.push(Target { addr: wanted, channel });
                targets.len() - 1
            }
        };
        self.inner.preferred.store(i, Ordering::Relaxed);
        Some(i)
    }

    /// Runs one RPC with retries until `deadline`. `f` must build the same request each time.
    async fn call<T, F, Fut>(&self, deadline: Instant, f: F) -> Result<T, Error>
    where
        F: Fn(Conn, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_with(deadline, self.inner.config.attempt_timeout, f).await
    }

    /// [`Client::call`] with attempts of at most `attempt_timeout` each.
    pub(crate) async fn call_with<T, F, Fut>(
        &self,
        deadline: Instant,
        attempt_timeout: Duration,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Conn, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_tracked(deadline, attempt_timeout, None, f).await
    }

    /// [`Client::call_with`] that sets `unsure` when an attempt ended without an answer that
    /// proves it had no effect (a timeout, a broken connection, UNAVAILABLE after forwarding):
    /// the final answer may then be a reaction to that attempt's own effect.
    async fn call_tracked<T, F, Fut>(
        &self,
        deadline: Instant,
        attempt_timeout: Duration,
        unsure: Option<&AtomicBool>,
        f: F,
    ) -> Result<T, Error>
    where
        F: Fn(Conn, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let cfg = &self.inner.config;
        let mut index = self.inner.preferred.load(Ordering::Relaxed);
        let mut attempt: u32 = 0;
        // The last refusal: when the deadline runs out it says why better than "deadline".
        let mut last: Option<Status> = None;
        // Some attempt may have taken effect: then no refusal after it makes the call's
        // outcome known.
        let mut maybe_applied = false;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            // An attempt of a few ms can only time out, and would hide why earlier ones failed.
            if remaining < MIN_ATTEMPT {
                return Err(match last {
                    Some(s) => gave_up(&s, maybe_applied),
                    None => Error::DeadlineExceeded("the call's deadline passed before any node answered".into()),
                });
            }
            let (i, ch) = self.pick(index).ok_or_else(|| Error::Config("no endpoints".into()))?;
            let budget = remaining.min(attempt_timeout);
            let result = tokio::time::timeout(budget, f(ch, budget)).await;
            let status = match result {
                Ok(Ok(resp)) => {
                    // A follower that forwarded the call names the leader: go there next time.
                    let hint = resp.metadata().get(LEADER_ADDR_HEADER).and_then(|v| v.to_str().ok());
                    match hint {
                        Some(h) => {
                            self.prefer_addr(h);
                        }
                        None => self.inner.preferred.store(i, Ordering::Relaxed),
                    }
                    return Ok(resp.into_inner());
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!("no answer within {budget:?}")),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if !retryable(&status) {
                return Err(Error::from_status(&status));
            }
            // A shed call was never proposed; anything else may have been.
            if !never_proposed(&status) {
                maybe_applied = true;
                if let Some(flag) = unsure {
                    flag.store(true, Ordering::Relaxed);
                }
            }
            // "Time ran out" says less than a refusal before it (e.g. no quorum): keep that.
            if !(ran_out(status.code()) && last.is_some()) {
                last = Some(status.clone());
            }
            if left.is_zero() {
                return Err(gave_up(last.as_ref().unwrap_or(&status), maybe_applied));
            }
            let hint = status.metadata().get(LEADER_ADDR_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
            index = match hint.and_then(|h| self.prefer_addr(&h)) {
                // Follow the hint unless it points where we just failed.
                Some(h) if h != i => h,
                _ => i + 1,
            };
            tracing::debug!(code = ?status.code(), message = status.message(), attempt, "retrying");
            tokio::time::sleep(backoff(cfg, attempt).min(left)).await;
            attempt = attempt.saturating_add(1);
        }
    }

    fn id(&self, scope: &str, key: &str) -> Option<pb::RecordId> {
        Some(pb::RecordId { tenant: self.inner.config.tenant.clone(), scope: scope.into(), key: key.into() })
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.config.deadline
    }

    async fn write<F, Fut>(&self, deadline: Instant, f: F) -> Result<Outcome, Error>
    where
        F: Fn(IdempotencyClient<Conn>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<pb::Outcome>, Status>>,
    {
        let o = self.call(deadline, |ch, t| f(idem(ch), t)).await?;
        Outcome::from_pb(o)
    }

    /// Claims a key for `owner`. Retries keep the same owner, so a claim whose reply was lost
    /// comes back ACQUIRED with the same token.
    pub async fn claim(&self, scope: &str, key: &str, owner: &str, opts: &ClaimOptions) -> Result<Outcome, Error> {
        self.claim_until(self.deadline(), scope, key, owner, opts).await
    }

    /// [`Client::claim`] with an explicit deadline.
    pub async fn claim_until(
        &self,
        deadline: Instant,
        scope: &str,
        key: &str,
        owner: &str,
        opts: &ClaimOptions,
    ) -> Result<Outcome, Error> {
        let req = pb::ClaimRequest {
            id: self.id(scope, key),
            fingerprint: opts.fingerprint.map(|f| f.0.to_vec()).unwrap_or_default(),
            owner: owner.into(),
            lease_ms: millis(opts.lease),
            ttl_ms: millis(opts.ttl),
            allow_takeover: opts.allow_takeover,
        };
        self.write(deadline, |mut c, t| {
            let r = timed(req.clone(), t);
            async move { c.claim(r).await }
        })
        .await
    }

    /// Completes an owned key with the response to replay.
    pub async fn complete(
        &self,
        scope: &str,
        key: &str,
        token: u64,
        response: &StoredResponse,
    ) -> Result<Outcome, Error> {
        let req = pb::CompleteRequest { id: self.id(scope, key), token, response: Some(response.to_pb()) };
        self.write(self.deadline(), |mut c, t| {
            let r = timed(req.clone(), t);
            async move { c.complete(r).await }
        })
        .await
    }

    /// Fails an owned key: retryable (the next claim re-acquires) or terminal with an error
    /// response that is stored and replayed.
    pub async fn fail(
        &self,
        scope: &str,
        key: &str,
        token: u64,
        retryable: bool,
        response: Option<&StoredResponse>,
    ) -> Result<Outcome, Error> {
        let req = pb::FailRequest { id: self.id(scope, key), token, retryable, response: response.map(|r| r.to_pb()) };
        let unsure = AtomicBool::new(false);
        let o = self
            .call_tracked(self.deadline(), self.inner.config.attempt_timeout, Some(&unsure), |ch, t| {
                let r = timed(req.clone(), t);
                async move { idem(ch).fail(r).await }
            })
            .await?;
        let outcome = Outcome::from_pb(o)?;
        // A retryable Fail leaves the key FAILED, and the next claim grants it again with a new
        // token. If an earlier attempt of this call may have gone through, a STALE_TOKEN now
        // may only mean that: the key failed as asked and moved on. Saying "stale" would be a
        // guess; the honest answer is that the outcome is unknown.
        if let (true, Outcome::StaleToken { current }) = (retryable && unsure.load(Ordering::Relaxed), &outcome) {
            return Err(Error::Indeterminate(format!(
                "an earlier attempt of this Fail got no answer, and the key now has token {current}: \
                 the Fail may have gone through before the key was granted again"
            )));
        }
        Ok(outcome)
    }

    /// Extends an owned key's lease (`None`: the server's default length).
    pub async fn extend_lease(
        &self,
        scope: &str,
        key: &str,
        token: u64,
        lease: Option<Duration>,
    ) -> Result<Outcome, Error> {
        let req = pb::ExtendLeaseRequest { id: self.id(scope, key), token, lease_ms: millis(lease) };
        self.write(self.deadline(), |mut c, t| {
            let r = timed(req.clone(), t);
            async move { c.extend_lease(r).await }
        })
        .await
    }

    /// Records progress (handed to whoever takes over) and extends the lease.
    pub async fn checkpoint(
        &self,
        scope: &str,
        key: &str,
        token: u64,
        recovery_point: &str,
        data: &[u8],
        lease: Option<Duration>,
    ) -> Result<Outcome, Error> {
        let req = pb::CheckpointRequest {
            id: self.id(scope, key),
            token,
            recovery_point: recovery_point.into(),
            data: data.to_vec(),
            lease_ms: millis(lease),
        };
        self.write(self.deadline(), |mut c, t| {
            let r = timed(req.clone(), t);
            async move { c.checkpoint(r).await }
        })
        .await
    }

    /// Takes over an IN_PROGRESS key whose lease expired (any, with `force`).
    pub async fn takeover(
        &self,
        scope: &str,
        key: &str,
        owner: &str,
        force: bool,
        lease: Option<Duration>,
    ) -> Result<Outcome, Error> {
        let req = pb::TakeoverRequest { id: self.id(scope, key), owner: owner.into(), force, lease_ms: millis(lease) };
        self.write(self.deadline(), |mut c, t| {
            let r = timed(req.clone(), t);
            async move { c.takeover(r).await }
        })
        .await
    }

    /// Reads one record linearizably.
    pub async fn get(&self, scope: &str, key: &str) -> Result<Option<Record>, Error> {
        let req = pb::GetRequest { id: self.id(scope, key) };
        let r = self
            .call(self.deadline(), |ch, t| {
                let r = timed(req.clone(), t);
                async move { idem(ch).get(r).await }
            })
            .await?;
        Ok(r.record)
    }

    /// Waits until the record leaves IN_PROGRESS, at most `timeout`.
    pub async fn wait(&self, scope: &str, key: &str, timeout: Duration) -> Result<Waited, Error> {
        let deadline = Instant::now() + timeout + Duration::from_secs(2);
        let end = Instant::now() + timeout;
        let id = self.id(scope, key);
        let r = self
            .call(deadline, |ch, t| {
                // A retried wait asks only for what is left of the caller's timeout.
                let left = end.saturating_duration_since(Instant::now());
                let req = pb::WaitRequest { id: id.clone(), timeout_ms: (left.as_millis() as u64).max(1) };
                let mut r = tonic::Request::new(req);
                r.set_timeout(t.max(left + Duration::from_millis(500)));
                async move { idem(ch).wait(r).await }
            })
            .await;
        let r = r?;
        Ok(Waited { record: r.record, timed_out: r.timed_out })
    }

    /// One page of a tenant's records. A page ends at `limit` records or before 4 MiB of
    /// them; while `next_after` is set, pass it as `start_after` for the next page.
    pub async fn list(&self, req: pb::ListRequest) -> Result<pb::ListResponse, Error> {
        let mut req = req;
        if req.tenant.is_empty() {
            req.tenant = self.inner.config.tenant.clone();
        }
        // A record id's empty tenant means `default`, not the listed tenant: a start point
        // given without one would otherwise lie outside the listing.
        if let Some(after) = req.start_after.as_mut().filter(|a| a.tenant.is_empty()) {
            after.tenant = req.tenant.clone();
        }
        self.call(self.deadline(), |ch, t| {
            let r = timed(req.clone(), t);
            async move { idem(ch).list(r).await }
        })
        .await
    }

    /// The status of the node at endpoint `index` (no retries on other nodes: the point is
    /// to ask that node).
    pub async fn node_status(&self, index: usize) -> Result<pb::StatusResponse, Error> {
        self.status_of(index, false).await
    }

    /// Like [`Client::node_status`], with the node's state digest and the applied index it was
    /// taken at (`state_digest`, `digest_index`): equal on replicas that applied the same log.
    pub async fn node_digest(&self, index: usize) -> Result<pb::StatusResponse, Error> {
        self.status_of(index, true).await
    }

    async fn status_of(&self, index: usize, with_digest: bool) -> Result<pb::StatusResponse, Error> {
        let (_, ch) = self.pick(index).ok_or_else(|| Error::Config("no endpoints".into()))?;
        let t = self.inner.config.attempt_timeout;
        let mut admin = AdminClient::new(ch);
        match tokio::time::timeout(t, admin.status(timed(pb::StatusRequest { with_digest }, t))).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(Error::from_status(&s)),
            Err(_) => Err(Error::DeadlineExceeded(format!("no answer within {t:?}"))),
        }
    }

    /// Endpoint addresses, in the order `node_status` indexes them.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner.targets.lock().map(|t| t.iter().map(|t| t.addr.clone()).collect()).unwrap_or_default()
    }

    /// Asks every endpoint for its status and prefers the leader from now on. Returns the
    /// leader's id, if any node knows it.
    pub async fn discover(&self) -> Option<u64> {
        let n = self.endpoints().len();
        let mut leader = None;
        for i in 0..n {
            if let Ok(s) = self.node_status(i).await {
                if s.leader_id != 0 && s.leader_id == s.id {
                    self.inner.preferred.store(i, Ordering::Relaxed);
                    return Some(s.id);
                }
                if s.leader_id != 0 {
                    leader = Some(s.leader_id);
                    if !s.leader_client_addr.is_empty() {
                        self.prefer_addr(&s.leader_client_addr);
                    }
                }
            }
        }
        leader
    }

    /// Current membership, from the leader.
    pub async fn members(&self) -> Result<pb::MembersResponse, Error> {
        self.admin(|mut a, t| async move { a.members(timed(pb::MembersRequest {}, t)).await }).await
    }

    /// Adds a learner.
    pub async fn add_learner(
        &self,
        id: u64,
        peer_addr: &str,
        wait_caught_up: bool,
    ) -> Result<pb::MembersResponse, Error> {
        let req = pb::AddLearnerRequest { id, peer_addr: peer_addr.into(), wait_caught_up };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.add_learner(r).await }
        })
        .await
    }

    /// Promotes learners to voters.
    pub async fn promote(&self, ids: &[u64]) -> Result<pb::MembersResponse, Error> {
        let req = pb::PromoteRequest { ids: ids.to_vec() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.promote(r).await }
        })
        .await
    }

    /// Removes members.
    pub async fn remove(&self, ids: &[u64]) -> Result<pb::MembersResponse, Error> {
        let req = pb::RemoveRequest { ids: ids.to_vec() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.remove(r).await }
        })
        .await
    }

    /// Sets (`Some`) or clears (`None`) the record quota of `tenant`, or with `tenant = None`
    /// the default quota of tenants without their own. Needs an admin token.
    pub async fn set_quota(&self, tenant: Option<&str>, max_records: Option<u64>) -> Result<pb::QuotaResponse, Error> {
        let req = pb::SetQuotaRequest {
            tenant: tenant.unwrap_or_default().to_string(),
            default_quota: tenant.is_none(),
            max_records,
        };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.set_quota(r).await }
        })
        .await
    }

    /// The quotas and the records each tenant holds: one tenant, or every tenant that holds
    /// records or has a quota. Needs an admin token.
    pub async fn get_quota(&self, tenant: Option<&str>) -> Result<pb::QuotaResponse, Error> {
        let req = pb::GetQuotaRequest { tenant: tenant.unwrap_or_default().to_string() };
        self.admin(|mut a, t| {
            let r = timed(req.clone(), t);
            async move { a.get_quota(r).await }
        })
        .await
    }

    async fn admin<T, F, Fut>(&self, f: F) -> Result<T, Error>
    where
        F: Fn(AdminClient<Conn>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        // Membership changes wait for a learner to catch up or for joint consensus: give
        // each attempt the whole deadline.
        let deadline = self.deadline();
        self.call_with(deadline, self.inner.config.deadline, |ch, t| f(AdminClient::new(ch), t)).await
    }

    /// Runs `work` at most once for this key, per contract §4 and §5.7:
    /// - claims (one owner id for all retries of this execution);
    /// - on ACQUIRED runs `work` with the grant, extending the lease in the background
    ///   while it runs; then completes with its response, or fails the claim (retryable or
    ///   terminal, by the work's choice);
    /// - on REPLAY returns the stored response with `replayed = true`;
    /// - on IN_PROGRESS waits for the holder (server-side Wait) and claims again, until the
    ///   options' deadline;
    /// - MISMATCH and a lost lease surface as [`ExecuteError`]s.
    pub async fn execute<F, Fut>(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Option<Fingerprint>,
        opts: &ExecuteOptions,
        work: F,
    ) -> Result<Executed, ExecuteError>
    where
        F: FnOnce(WorkGrant) -> Fut,
        Fut: Future<Output = Result<StoredResponse, WorkError>>,
    {
        let deadline = Instant::now() + opts.deadline;
        let owner = opts.owner.clone().unwrap_or_else(|| crate::keys::random("owner-"));
        let claim_opts =
            ClaimOptions { fingerprint, lease: Some(opts.lease), ttl: opts.ttl, allow_takeover: opts.allow_takeover };
        let grant = loop {
            match self.claim_until(deadline, scope, key, &owner, &claim_opts).await? {
                Outcome::Acquired(g) => break g,
                Outcome::Replay { token, response, .. } => return Ok(Executed { token, response, replayed: true }),
                Outcome::Mismatch => return Err(ExecuteError::Mismatch),
                Outcome::InProgress { lease_expires_ms, retry_after_ms } => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left < Duration::from_millis(10) {
                        return Err(ExecuteError::InProgress { lease_expires_ms });
                    }
                    // Wait for the holder to settle, at most until its lease could expire
                    // (so a takeover is attempted promptly) and never past our deadline.
                    let wait = left.min(Duration::from_millis(retry_after_ms.max(100)) * 4);
                    self.wait(scope, key, wait).await?;
                    // A wait that used up the deadline leaves no time to claim again: the
                    // answer is what was seen, IN_PROGRESS, not a deadline error whose
                    // outcome would look unknown.
                    if deadline.saturating_duration_since(Instant::now()) < Duration::from_millis(10) {
                        return Err(ExecuteError::InProgress { lease_expires_ms });
                    }
                }
                other => return Err(ExecuteError::Unexpected(other.name())),
            }
        };

        self.run_granted(scope, key, grant, opts, work).await
    }

    /// The second half of [`Client::execute`], for a caller that made the claim itself (the
    /// HTTP layer, which answers IN_PROGRESS and MISMATCH in its own way): runs `work` under
    /// `grant`, extending the lease every third of `opts.lease` in the background while it
    /// runs, then completes with its response or fails the claim (retryable or terminal, by
    /// the work's choice). Settling is retried for up to `opts.deadline` while the cluster is
    /// unreachable. `opts.owner` and `opts.allow_takeover` are not used here.
    ///
    /// The background extension stops when this future finishes or is dropped.
    pub async fn run_granted<F, Fut>(
        &self,
        scope: &str,
        key: &str,
        grant: Grant,
        opts: &ExecuteOptions,
        work: F,
    ) -> Result<Executed, ExecuteError>
    where
        F: FnOnce(WorkGrant) -> Fut,
        Fut: Future<Output = Result<StoredResponse, WorkError>>,
    {
        let token = grant.token;
        let (lost_tx, lost_rx) = tokio::sync::watch::channel(false);
        // Aborted on drop, so a caller that gives up on this future (an HTTP client hanging
        // up) does not leave a task renewing a lease nobody will settle.
        let keeper = AbortOnDrop({
            let client = self.clone();
            let (scope, key) = (scope.to_string(), key.to_string());
            let lease = opts.lease;
            tokio::spawn(async move {
                let period = lease / 3;
                loop {
                    tokio::time::sleep(period).await;
                    match client.extend_lease(&scope, &key, token, Some(lease)).await {
                        Ok(Outcome::LeaseExtended { .. }) => {}
                        Ok(other) => {
                            tracing::warn!(outcome = other.name(), token, "lease lost while the work ran");
                            let _ = lost_tx.send(true);
                            return;
                        }
                        Err(e) => tracing::debug!(error = %e, "lease extension failed; retrying"),
                    }
                }
            })
        });
        let result = work(WorkGrant { grant, lost: lost_rx }).await;
        // The work is done and its result is in hand: settling it is worth a long fight. An
        // unsettled key would make a retry wait out the lease and run the work again, so the
        // settle is repeated (it is idempotent) for up to `opts.deadline` more while the
        // cluster is unreachable, and the lease is kept alive meanwhile.
        let settle_until = Instant::now() + opts.deadline;
        let settle = loop {
            let r = match &result {
                Ok(response) => self.complete(scope, key, token, response).await,
                Err(WorkError::Retryable(_)) => self.fail(scope, key, token, true, None).await,
                Err(WorkError::Terminal(response)) => self.fail(scope, key, token, false, Some(response)).await,
            };
            match r {
                Err(e) if e.is_indeterminate() && Instant::now() < settle_until => {
                    tracing::warn!(error = %e, token, "settling the key failed; retrying");
                }
                Err(e) => {
                    drop(keeper);
                    return Err(e.into());
                }
                Ok(o) => break o,
            }
        };
        drop(keeper);
        match (settle, result) {
            (Outcome::Completed { .. }, Ok(response)) => Ok(Executed { token, response, replayed: false }),
            (Outcome::Failed { retryable: false, .. }, Err(WorkError::Terminal(response))) => {
                Ok(Executed { token, response, replayed: false })
            }
            (Outcome::Failed { retryable: true, .. }, Err(WorkError::Retryable(reason))) => {
                Err(ExecuteError::WorkFailed(reason))
            }
            (Outcome::StaleToken { current }, _) => Err(ExecuteError::LostOwnership { token, current }),
            (other, _) => Err(ExecuteError::Unexpected(other.name())),
        }
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Milliseconds on the wire, where 0 means "the server's default".
fn millis(d: Option<Duration>) -> u64 {
    d.map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn idem(ch: Conn) -> IdempotencyClient<Conn> {
    IdempotencyClient::new(ch).max_decoding_message_size(8 * 1024 * 1024).max_encoding_message_size(8 * 1024 * 1024)
}

pub(crate) fn timed<T>(msg: T, t: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(t);
    r
}

/// The node that served a reply, from its metadata (for tests and diagnostics).
pub fn served_by<T>(r: &tonic::Response<T>) -> Option<u64> {
    r.metadata().get(SERVED_BY_HEADER)?.to_str().ok()?.parse().ok()
}

/// Options of [`Client::execute`].
#[derive(Clone, Debug)]
pub struct ExecuteOptions {
    /// Lease to hold while the work runs; extended every third of it.
    pub lease: Duration,
    /// Record TTL/retention; `None` takes the scope's default.
    pub ttl: Option<Duration>,
    /// How long to keep trying (claims, waiting for another holder) before giving up.
    pub deadline: Duration,
    /// Owner id; a fresh random one by default. Give your own to make a restarted process
    /// resume its own claims.
    pub owner: Option<String>,
    /// Take the key over when its holder's lease has expired (the holder crashed). Off, a
    /// dead holder's key waits for an explicit Takeover or its TTL.
    pub allow_takeover: bool,
}

impl Default for ExecuteOptions {
    fn default() -> Self {
        ExecuteOptions {
            lease: Duration::from_secs(30),
            ttl: None,
            deadline: Duration::from_secs(30),
            owner: None,
            allow_takeover: true,
        }
    }
}

/// What the work receives: the grant, and a way to learn that ownership was lost.
pub struct WorkGrant {
    /// The grant (token, attempt, recovery point of a previous owner).
    pub grant: Grant,
    lost: tokio::sync::watch::Receiver<bool>,
}

impl WorkGrant {
    /// The fencing token: pass it to every downstream write.
    pub fn token(&self) -> u64 {
        self.grant.token
    }

    /// Resolves if the lease was lost while the work runs (another owner may now hold the
    /// key): stop, the fencing token will be refused downstream.
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|l| *l).await;
    }

    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
}

/// How a piece of work failed.
#[derive(Clone, Debug)]
pub enum WorkError {
    /// Try again later: the claim is released as FAILED and the next claim re-acquires it.
    Retryable(String),
    /// Final: this error response is stored and replayed to every retry.
    Terminal(StoredResponse),
}

/// The result of [`Client::execute`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Executed {
    /// The token of the grant that produced the response.
    pub token: u64,
    /// The response (a terminal failure's stored error response included).
    pub response: StoredResponse,
    /// The response was stored by an earlier execution, not produced now.
    pub replayed: bool,
}

/// Why [`Client::execute`] produced no response.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecuteError {
    /// The key is bound to a different request fingerprint.
    #[error("the idempotency key was used with a different request (fingerprint mismatch)")]
    Mismatch,
    /// Another worker still holds the key at the deadline.
    #[error("another worker holds the key (its lease runs until {lease_expires_ms})")]
    InProgress {
        /// The holder's lease deadline.
        lease_expires_ms: u64,
    },
    /// The work failed retryably; the key was released for a retry.
    #[error("the work failed and may be retried: {0}")]
    WorkFailed(String),
    /// The lease was lost and another owner took the key over; this worker's completion was
    /// refused. Downstream writes fenced with the old token are refused too.
    #[error("ownership lost: token {token} was superseded by {current}")]
    LostOwnership {
        /// Our token.
        token: u64,
        /// The current one.
        current: u64,
    },
    /// An outcome that should not happen in this flow.
    #[error("unexpected outcome {0}")]
    Unexpected(&'static str),
    /// The cluster could not be reached or refused the request.
    #[error(transparent)]
    Client(#[from] Error),
}

#[cfg(test)]
mod tests {
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
                    for (k, v) in
                        [(QUOTA_TENANT_HEADER, "acme"), (QUOTA_LIMIT_HEADER, "3"), (QUOTA_RECORDS_HEADER, "3")]
                    {
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
}
