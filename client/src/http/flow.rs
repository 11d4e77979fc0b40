//! One protected request: claim, then run the handler under the grant and settle the key, or
//! replay, or refuse; which responses are stored, and how a replay is rebuilt.

use super::*;

/// Claim, then run the handler under the grant (or replay, or refuse).
pub(super) fn protected<S, ResBody>(
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
pub(super) fn store_unavailable(e: &Error) -> bool {
    e.is_indeterminate() || matches!(e, Error::Rpc { code: tonic::Code::ResourceExhausted, .. })
}

/// What the caller gets, and what the SDK settles the key with.
pub(super) type Handled<E> = (Result<Response<Body>, E>, Result<StoredResponse, WorkError>);

/// Runs the inner service once, catching a panic.
pub(super) fn run_handler<S, ResBody>(
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

pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic".to_string()
    }
}

/// The stored form of a response: status, the allowed headers in order, body bytes.
pub(super) fn to_stored(parts: &http::response::Parts, body: &Bytes, s: &Settings) -> StoredResponse {
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
pub(super) fn replay(stored: &StoredResponse) -> Response<Body> {
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
pub(super) fn retry_after_secs(retry_after_ms: u64) -> u64 {
    retry_after_ms.div_ceil(1000).max(1)
}
