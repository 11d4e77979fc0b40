//! The [`Body`] the layer hands to the handler and returns, and request-body buffering
//! within the size limit.

use super::*;

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

/// Buffers a request body of at most `limit` bytes; 413 above it (told by `Content-Length`
/// before anything is read, when the client sent one).
pub(super) async fn read_body<B>(headers: &http::HeaderMap, body: B, limit: usize) -> Result<Bytes, Problem>
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

pub(super) fn full(bytes: Bytes) -> Body {
    Body::from_bytes(bytes)
}

pub(super) fn box_body<B>(body: B) -> Body
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Body::new(body)
}
