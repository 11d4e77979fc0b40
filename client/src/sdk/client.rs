//! The connection to a cluster: endpoints, the cached leader, every call retried within its
//! deadline, and the Idempotency calls.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_proto::v1 as pb;
use idemraft_proto::v1::admin_client::AdminClient;
use idemraft_proto::v1::idempotency_client::IdempotencyClient;
use idemraft_proto::{LEADER_ADDR_HEADER, SERVED_BY_HEADER};
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::Status;

use super::*;

pub(super) struct Target {
    pub(super) addr: String,
    pub(super) channel: Conn,
    /// Until when calls start elsewhere: this node left an attempt unanswered.
    pub(super) shunned_until: Option<Instant>,
}

/// How long a node that left an attempt unanswered (paused, partitioned, dead) is passed
/// over. Longer than a failover (about 1.6 s with the node's default election timeouts), so
/// that the hints of followers that have not yet noticed their leader's silence, which name
/// that leader, do not lead every new call back into it to wait out a whole attempt; short
/// enough that a node that was only slow for a moment soon takes calls again.
pub(super) const SHUN: Duration = Duration::from_secs(2);

impl Target {
    fn shunned(&self, now: Instant) -> bool {
        self.shunned_until.is_some_and(|u| u > now)
    }
}

pub(super) struct Inner {
    pub(super) config: ClientConfig,
    pub(super) targets: Mutex<Vec<Target>>,
    /// Index into `targets` of the node believed to lead.
    pub(super) preferred: AtomicUsize,
}

/// A connection to an Idemraft cluster. Cheap to clone; share one per process.
#[derive(Clone)]
pub struct Client {
    pub(super) inner: Arc<Inner>,
}

/// `host:port` gets `https://` when the client has a CA to verify nodes with, else `http://`.
pub(super) fn normalise(addr: &str, tls: bool) -> String {
    let a = addr.trim();
    if a.starts_with("http://") || a.starts_with("https://") {
        a.to_string()
    } else if tls {
        format!("https://{a}")
    } else {
        format!("http://{a}")
    }
}

pub(super) fn channel(addr: &str, config: &ClientConfig) -> Result<Conn, Error> {
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
pub(super) fn backoff(config: &ClientConfig, attempt: u32) -> Duration {
    let cap = config.backoff_base.saturating_mul(1u32 << attempt.min(16)).min(config.backoff_max);
    let ms = cap.as_millis() as u64;
    Duration::from_millis(if ms == 0 { 0 } else { rand::random_range(0..=ms) })
}

/// Shortest attempt worth making; less is left only to learn that time ran out.
pub(super) const MIN_ATTEMPT: Duration = Duration::from_millis(10);

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
            .map(|a| {
                Ok(Target {
                    addr: normalise(a, config.tls_ca.is_some()),
                    channel: channel(a, &config)?,
                    shunned_until: None,
                })
            })
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

    /// The endpoint at `index`, as asked: for calls meant for that node.
    pub(super) fn pick(&self, index: usize) -> Option<(usize, Conn)> {
        let targets = self.inner.targets.lock().ok()?;
        let i = index % targets.len().max(1);
        targets.get(i).map(|t| (i, t.channel.clone()))
    }

    /// The first endpoint from `index` on that is not shunned; `index` itself when all are.
    pub(super) fn pick_live(&self, index: usize) -> Option<(usize, Conn)> {
        let targets = self.inner.targets.lock().ok()?;
        let n = targets.len().max(1);
        let now = Instant::now();
        let i = (0..n)
            .map(|k| (index + k) % n)
            .find(|&i| targets.get(i).is_some_and(|t| !t.shunned(now)))
            .unwrap_or(index % n);
        targets.get(i).map(|t| (i, t.channel.clone()))
    }

    /// Passes over endpoint `i` for [`SHUN`] (or, with `None`, takes it back at once).
    pub(super) fn shun(&self, i: usize, until: Option<Instant>) {
        if let Ok(mut targets) = self.inner.targets.lock() {
            if let Some(t) = targets.get_mut(i) {
                t.shunned_until = until;
            }
        }
    }

    /// Points the client at `addr` (a leader hint), adding it if it is not an endpoint yet.
    pub(super) fn prefer_addr(&self, addr: &str) -> Option<usize> {
        let wanted = normalise(addr, self.inner.config.tls_ca.is_some());
        let mut targets = self.inner.targets.lock().ok()?;
        let i = match targets.iter().position(|t| t.addr == wanted) {
            Some(i) => i,
            None => {
                let channel = channel(addr, &self.inner.config).ok()?;
                targets.push(Target { addr: wanted, channel, shunned_until: None });
                targets.len() - 1
            }
        };
        // A hint naming a node that just left us unanswered is most likely a follower's stale
        // view of a leader that has stopped: keep the current preference until it has had
        // its time out.
        if !targets.get(i).is_some_and(|t| t.shunned(Instant::now())) {
            self.inner.preferred.store(i, Ordering::Relaxed);
        }
        Some(i)
    }

    /// Runs one RPC with retries until `deadline`. `f` must build the same request each time.
    pub(super) async fn call<T, F, Fut>(&self, deadline: Instant, f: F) -> Result<T, Error>
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
    pub(super) async fn call_tracked<T, F, Fut>(
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
            let (i, ch) = self.pick_live(index).ok_or_else(|| Error::Config("no endpoints".into()))?;
            let budget = remaining.min(attempt_timeout);
            let result = tokio::time::timeout(budget, f(ch, budget)).await;
            let status = match result {
                Ok(Ok(resp)) => {
                    self.shun(i, None);
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
                Ok(Err(status)) => {
                    if lost_reply(&status).is_some() {
                        self.shun(i, Some(Instant::now() + SHUN));
                    }
                    status
                }
                Err(_) => {
                    // Only an attempt that used its whole budget says the node is not
                    // answering; one cut short by the call's deadline says nothing of it.
                    if budget == attempt_timeout {
                        self.shun(i, Some(Instant::now() + SHUN));
                    }
                    Status::deadline_exceeded(format!("no answer within {budget:?}"))
                }
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

    pub(super) fn id(&self, scope: &str, key: &str) -> Option<pb::RecordId> {
        Some(pb::RecordId { tenant: self.inner.config.tenant.clone(), scope: scope.into(), key: key.into() })
    }

    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.inner.config.deadline
    }

    pub(super) async fn write<F, Fut>(&self, deadline: Instant, f: F) -> Result<Outcome, Error>
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
        // An attempt may take the whole poll and then a normal attempt's time: cut sooner, a
        // node holding the poll as asked would look like one that stopped answering.
        let attempt = timeout.saturating_add(self.inner.config.attempt_timeout);
        let r = self
            .call_with(deadline, attempt, |ch, t| {
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
    pub async fn node_status(&self, index: usize) -> Result<NodeStatus, Error> {
        self.status_of(index, false).await
    }

    /// Like [`Client::node_status`], with the node's state digest and the applied index it was
    /// taken at (`state_digest`, `digest_index`): equal on replicas that applied the same log.
    pub async fn node_digest(&self, index: usize) -> Result<NodeStatus, Error> {
        self.status_of(index, true).await
    }

    pub(super) async fn status_of(&self, index: usize, with_digest: bool) -> Result<NodeStatus, Error> {
        let (_, ch) = self.pick(index).ok_or_else(|| Error::Config("no endpoints".into()))?;
        let t = self.inner.config.attempt_timeout;
        let mut admin = AdminClient::new(ch);
        match tokio::time::timeout(t, admin.status(timed(pb::StatusRequest { with_digest }, t))).await {
            Ok(Ok(r)) => Ok(NodeStatus::from(r.into_inner())),
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
}

/// Milliseconds on the wire, where 0 means "the server's default".
pub(super) fn millis(d: Option<Duration>) -> u64 {
    d.map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub(super) fn idem(ch: Conn) -> IdempotencyClient<Conn> {
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
