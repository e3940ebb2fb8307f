//! The HTTP floor both front doors stand on (tiergate's own endpoints in `ingress`, the reverse
//! proxy in `proxy`): the body type they send, reading a request body within its limit,
//! body idle timeouts, JSON bodies with one value per key ([`json`]), the header names tiergate
//! reads and writes, and `[server]`'s limits.
//! JSON responses and errors-as-responses are in [`crate::error`].

mod body;
mod config;
pub mod headers;
pub mod json;

pub use body::{read_body, require_json, IdleTimeout};
pub use config::ServerConfig;

use bytes::Bytes;
use http::Response;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The error of a streamed body: whatever the client's, the app's or hyper's body failed with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
/// Every body tiergate sends: a buffered JSON answer, or a streamed body of the client's or the
/// app's. A struct rather than an alias of `UnsyncBoxBody<Bytes, BoxError>`: with the boxed error's
/// trait-object lifetime visible in the type, rustc fails to prove futures holding it `Send`
/// (rust-lang/rust#110338).
pub struct BoxBody(UnsyncBoxBody<Bytes, BoxError>);

impl BoxBody {
    pub fn new<B>(body: B) -> BoxBody
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        BoxBody(body.map_err(Into::into).boxed_unsync())
    }
}

impl http_body::Body for BoxBody {
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

/// The client's address, put in each request's extensions by the server.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// Converts a buffered answer (a JSON body) into the streamed body type both front doors send.
pub fn boxed(response: Response<Full<Bytes>>) -> Response<BoxBody> {
    response.map(BoxBody::new)
}

/// A body held whole.
pub fn full(bytes: Bytes) -> BoxBody {
    BoxBody::new(Full::new(bytes))
}

/// No body.
pub fn empty() -> BoxBody {
    BoxBody::new(Empty::new())
}
