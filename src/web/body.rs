//! Reading a request body within its limit, checking its content type, and bounding how long a
//! streamed body may stall.

use super::BoxError;
use crate::error::ApiError;
use bytes::Bytes;
use http::{header, HeaderMap};
use http_body_util::{BodyExt, Limited};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Reads the body up to `limit` bytes. A declared `Content-Length` over the limit is refused
/// before reading anything.
pub async fn read_body<B>(headers: &HeaderMap, body: B, limit: usize) -> Result<Bytes, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Some(len) =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(ApiError::PayloadTooLarge { limit });
        }
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::PayloadTooLarge { limit }),
        Err(e) => Err(ApiError::BodyRead(e.to_string())),
    }
}

/// Checks that the body is JSON as sent: one `content-type`, `application/json` (parameters such
/// as charset allowed), and no content coding but `identity`.
///
/// Errors: `RepeatedHeader` (two content types: which one describes the body?),
/// `UnsupportedMediaType`, `UnsupportedEncoding` (a gzip body would otherwise read as malformed
/// JSON, and a plain one labelled gzip as something the app would decode differently).
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let count = headers.get_all(header::CONTENT_TYPE).iter().count();
    if count > 1 {
        return Err(ApiError::RepeatedHeader { header: "content-type".into(), count });
    }
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let value = String::from_utf8_lossy(value.as_bytes());
        let coded = value.split(',').map(str::trim).find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"));
        if let Some(got) = coded {
            return Err(ApiError::UnsupportedEncoding { got: got.to_string() });
        }
    }
    let got = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let essence = got.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType { got: if got.is_empty() { "(none)".into() } else { got } })
    }
}

/// A body that fails when no frame arrives for `limit`: an app that stalls mid-response, or a
/// client that stalls mid-upload, ends the stream with an error instead of holding it open.
pub struct IdleTimeout<B> {
    inner: B,
    limit: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Whose body, for the error: "the app's response body", "the client's request body".
    whose: &'static str,
}

impl<B> IdleTimeout<B> {
    pub fn new(inner: B, limit: Duration, whose: &'static str) -> Self {
        IdleTimeout { inner, limit, sleep: Box::pin(tokio::time::sleep(limit)), whose }
    }
}

impl<B> http_body::Body for IdleTimeout<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                let deadline = tokio::time::Instant::now() + this.limit;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let message = format!("{} sent nothing for {} ms", this.whose, this.limit.as_millis());
                    Poll::Ready(Some(Err(message.into())))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
