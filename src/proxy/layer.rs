//! [`TierGateLayer`]: the same screening as a proxied route, in-process, as a tower `Layer` an
//! axum or hyper app puts in its own stack (see `examples/tiergate_layer.rs`).
//!
//! A request the policy blocks gets 403 with the decision and never reaches the inner service;
//! otherwise the inner service gets the request with the decision headers set (as a proxied app
//! would) and the [`Decision`] in its extensions. A client-sent `x-tiergate-*` header never
//! reaches the inner service, nor do tiergate's own credentials (the trusted tenant header, an
//! API key of `[tenants.api_keys]`).

use super::forward::outgoing_body;
use super::headers::{set_decision_headers, strip_forged};
use super::pipeline::{self, Door, Screening};
use super::port::Port;
use super::screen::Screen;
use crate::decision::Decision;
use crate::error::ApiError;
use crate::trace::attr;
use crate::web::{boxed, headers, BoxBody, BoxError, ServerConfig};
use bytes::Bytes;
use futures_util::future::{Either, FutureExt, TryFutureExt};
use http::{Request, Response};
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Screens each request before the wrapped service; see the module docs.
#[derive(Clone)]
pub struct TierGateLayer {
    shared: Arc<Shared>,
}

struct Shared {
    port: Port,
    server: ServerConfig,
    screen: Screen,
    /// The label in `tiergate_proxy_requests_total{route}` and logs.
    name: String,
}

impl TierGateLayer {
    /// `screen` is a route's `[routes.screen]` section; `server` gives the text limit, the default
    /// deadline and the body-read timeout. Errors name the bad source, or a `policy` directory
    /// the gateway did not load.
    pub fn new(
        gateway: impl Into<Port>,
        server: ServerConfig,
        name: impl Into<String>,
        screen: &super::config::ScreenConfig,
    ) -> Result<Self, String> {
        // The gateway loads the policy directories its config's routes name, and decides under
        // the live policy for any other: a layer naming one it lacks would silently get that.
        let port: Port = gateway.into();
        if let Some(dir) = &screen.policy {
            if !port.loaded_policy(dir) {
                return Err(format!(
                    "`screen.policy` {} is not a policy directory the gateway loaded (`policies.dir` or a route's \
                     `[routes.screen] policy` in the config it started with)",
                    dir.display()
                ));
            }
        }
        let screen = Screen::new(screen)?;
        Ok(TierGateLayer { shared: Arc::new(Shared { port, server, screen, name: name.into() }) })
    }
}

impl<S> tower::Layer<S> for TierGateLayer {
    type Service = TierGate<S>;

    fn layer(&self, inner: S) -> TierGate<S> {
        TierGate { inner, shared: Arc::clone(&self.shared) }
    }
}

/// Screens `req` in a trace of its own (with `[tracing]` on: continuing the request's
/// `traceparent`, root span `tiergate screen {name}`, the stages under it): the request to pass
/// on, or why not (blocked, or refused when fail-closed).
async fn screen_request<B>(shared: Arc<Shared>, req: Request<B>) -> Result<Request<BoxBody>, ApiError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    let trace = shared.port.tracer().begin(req.headers(), SpanKind::Internal);
    if trace.is_on() {
        trace.rename(format!("tiergate screen {}", shared.name));
        trace.set([KeyValue::new(attr::ROUTE, shared.name.clone())]);
    }
    let (mut parts, body) = req.into_parts();
    if trace.is_on() {
        parts.extensions.insert(trace.clone());
    }
    let screened = screen_parts(&shared, parts, body).await;
    if let Err(e) = &screened {
        trace.set([KeyValue::new(attr::ERROR_TYPE, e.code())]);
        if e.status().is_server_error() {
            trace.fail(e.to_string());
        }
    }
    trace.finish();
    screened
}

/// [`screen_request`]'s work.
async fn screen_parts<B>(
    shared: &Shared,
    mut parts: http::request::Parts,
    body: B,
) -> Result<Request<BoxBody>, ApiError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    let request_id = match headers::client_request_id(&parts.headers) {
        Some(id) => id.to_string(),
        None => {
            // The inner service sees the id the decision carries.
            let id = uuid::Uuid::new_v4().to_string();
            if let Ok(v) = http::HeaderValue::from_str(&id) {
                parts.headers.insert(headers::REQUEST_ID, v);
            }
            id
        }
    };
    let door = Door { port: &shared.port, name: &shared.name, screen: &shared.screen, server: &shared.server };
    let (screening, outgoing) = pipeline::screen(&door, &parts, body, &request_id).await?;
    // Counted as a proxied route counts what it forwards, so that `outcome` adds up to every
    // request the layer saw (blocked and refused ones are counted by the pipeline).
    shared.port.count(&shared.name, screening.handled());
    strip_forged(&mut parts.headers);
    shared.port.tenants().strip_credentials(&mut parts.headers);
    set_decision_headers(&mut parts.headers, &screening);
    if let Screening::Decided(decision) = screening {
        parts.extensions.insert::<Decision>(decision);
    }
    Ok(Request::from_parts(parts, outgoing_body(outgoing)))
}

/// The service [`TierGateLayer`] makes.
#[derive(Clone)]
pub struct TierGate<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S, B, ResBody> tower::Service<Request<B>> for TierGate<S>
where
    S: tower::Service<Request<BoxBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<BoxBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<BoxBody>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this call (tower's documented pattern).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let screened = screen_request(Arc::clone(&self.shared), req);
        // Combinators rather than one `async` block: with `S::Future` held across an await,
        // rustc cannot prove the block `Send` for a generic `S` (rust-lang/rust#110338).
        Box::pin(screened.then(move |screened| match screened {
            // The layer's one place where an error becomes a response.
            Err(e) => Either::Left(std::future::ready(Ok(boxed(e.into_response())))),
            Ok(request) => Either::Right(inner.call(request).map_ok(|response| response.map(BoxBody::new))),
        }))
    }
}
