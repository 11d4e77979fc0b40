//! The RFC 9457 problem bodies of every answer the layer gives itself.

use super::*;

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
    pub(super) fn new(status: StatusCode, slug: &str, title: &str, detail: String) -> Problem {
        Problem { status, kind: format!("{PROBLEM_TYPE_PREFIX}{slug}"), title: title.into(), detail, retry_after: None }
    }

    pub(super) fn retry_after(mut self, secs: u64) -> Problem {
        self.retry_after = Some(secs);
        self
    }

    pub(super) fn missing_key(header: &HeaderName) -> Problem {
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

    pub(super) fn malformed_key(header: &HeaderName, e: &KeyHeaderError) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed-idempotency-key",
            "Malformed idempotency key",
            format!("the {header} header is not a valid key: {e}"),
        )
    }

    pub(super) fn too_large(limit: usize) -> Problem {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the body is over this endpoint's limit of {limit} bytes; send a smaller body"),
        )
    }

    pub(super) fn unreadable_body(why: &str) -> Problem {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "unreadable-body",
            "Request body could not be read",
            format!("the body could not be read ({why}); send the request again with the same key"),
        )
    }

    pub(super) fn mismatch(header: &HeaderName) -> Problem {
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

    pub(super) fn in_flight(secs: u64) -> Problem {
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

    pub(super) fn unavailable(e: &Error) -> Problem {
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

    pub(super) fn quota_exceeded() -> Problem {
        Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "idempotency-quota-exceeded",
            "Too many idempotency keys in use",
            "the request was not processed: this service holds as many idempotency records as it is allowed; \
             retry later, when older keys have expired (requests that reuse an existing key still work)"
                .into(),
        )
    }

    pub(super) fn handler_failed() -> Problem {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "handler-failed",
            "The request failed and was not stored",
            "the request failed before it produced a response; the key was released, so retry the same request \
             with the same key"
                .into(),
        )
    }

    pub(super) fn lost_ownership() -> Problem {
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

    pub(super) fn internal(why: &str) -> Problem {
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
