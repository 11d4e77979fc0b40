//! [`IdempotencyLayer`], its builder and its validation, and the [`Idempotent`] service it
//! wraps a handler in: safe methods pass through, the rest are protected.

use super::*;

/// A tower layer that makes the wrapped handler exactly-once per `Idempotency-Key`. Build one
/// per route (its scope names the route family), e.g.
/// `post(handler).layer(IdempotencyLayer::new(client, "payments.create"))`.
///
/// Safe methods (GET, HEAD, OPTIONS, TRACE) pass through untouched.
#[derive(Clone)]
pub struct IdempotencyLayer {
    client: Client,
    pub(super) settings: Arc<Settings>,
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

    pub(super) fn with(mut self, f: impl FnOnce(&mut Settings)) -> IdempotencyLayer {
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

pub(super) fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

pub(super) fn call_unprotected<S, ResBody>(
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
