//! Forwarding phase: the request to one of the route's app addresses (P2C over peak EWMA,
//! connect failures of requests whose body is held whole retried on another), timeouts on the
//! response head (from the end of the upload) and on idle bodies, and the response back.
//! Failures are `ApiError`s (502, 504, or the client's own 400), never the app's details.

use super::headers::{append_via, prepare_request_headers, request_host_header, strip_hop_by_hop};
use super::port::{Handled, Port};
use super::route::{AppAddr, HostHeader, Route};
use super::screen::Outgoing;
use super::{stream_guard, Proxy, Screening};
use crate::error::{error_chain, ApiError};
use crate::metrics::RouteLabels;
use crate::trace::{attr, Trace};
use crate::web::{empty, full, headers, BoxBody, BoxError, IdleTimeout};
use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, Uri, Version};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use opentelemetry::trace::SpanContext;
use opentelemetry::KeyValue;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// How one attempt at the app ended.
enum Attempt {
    Answered(Response<Incoming>),
    /// The client's own body failed (not the app's fault).
    ClientFailed(String),
    /// The app could not be reached or broke the exchange.
    Failed(hyper_util::client::legacy::Error),
    /// No response head within the route's timeout after the upload.
    TimedOut,
}

impl Proxy {
    /// Forwards a request (already screened, when the route screens) to the route's app, in a
    /// client span (`app`) of the request's trace whose context the app receives in
    /// `traceparent`/`tracestate` (replacing the client's).
    pub(super) async fn forward(
        &self,
        port: &Port,
        route: &Route,
        parts: http::request::Parts,
        body: Outgoing<Incoming>,
        screened: Option<&Screening>,
    ) -> Result<Response<BoxBody>, ApiError> {
        let trace = parts.extensions.get::<Trace>().cloned().unwrap_or_default();
        if !trace.is_on() {
            return self.forward_to_app(port, route, parts, body, screened, None).await;
        }
        trace.set([KeyValue::new(attr::ROUTE, route.name.clone())]);
        let span = trace.start_client("app");
        let method = parts.method.to_string();
        let result = self.forward_to_app(port, route, parts, body, screened, Some(&trace.context_of(&span))).await;
        let mut attributes =
            vec![KeyValue::new(attr::HTTP_REQUEST_METHOD, method), KeyValue::new(attr::ROUTE, route.name.clone())];
        let error = match &result {
            Ok(response) => {
                attributes.push(KeyValue::new(attr::HTTP_RESPONSE_STATUS_CODE, i64::from(response.status().as_u16())));
                response.status().is_server_error().then(|| response.status().to_string())
            }
            Err(e) => {
                attributes.push(KeyValue::new(attr::ERROR_TYPE, e.code()));
                Some(e.to_string())
            }
        };
        trace.end(span, || attributes, error);
        result
    }

    /// [`Proxy::forward`]'s work: attempts until one is answered; `context`: the trace context
    /// each attempt carries.
    async fn forward_to_app(
        &self,
        port: &Port,
        route: &Route,
        mut parts: http::request::Parts,
        body: Outgoing<Incoming>,
        screened: Option<&Screening>,
        context: Option<&SpanContext>,
    ) -> Result<Response<BoxBody>, ApiError> {
        // For a cut's audit record: the id the decision carries (set by the request-id layer).
        let request_id = (route.stream_guard.is_some() && port.audits()).then(|| {
            parts.headers.get(headers::REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string()
        });
        let original_host = self.prepare_request(port, route, &mut parts, screened);
        // A body we hold whole can be sent again; a streamed one only once.
        let replayable = match &body {
            Outgoing::Bytes(b) => Some(b.clone()),
            Outgoing::Stream(b) if http_body::Body::is_end_stream(b) => Some(Bytes::new()),
            _ => None,
        };
        let mut body = Some(outgoing_body(body));
        let (mut tried, mut attempt) = (None, 0);
        loop {
            let pick = route.balancer.pick(tried).map_err(|e| {
                port.count(&route.name, Handled::UpstreamError);
                ApiError::BadGateway { route: route.name.clone(), reason: e.to_string() }
            })?;
            tried = Some(pick.index);
            let app = &route.apps[pick.index];
            let body = body.take().unwrap_or_else(|| replayable.clone().map(full).unwrap_or_else(empty));
            let request = app_request(route, &parts, app, original_host.clone(), body, context);
            let sent = Instant::now();
            match self.attempt(route, request).await {
                Attempt::Answered(response) => {
                    let status = response.status();
                    port.observe_app(&route.name, status_class(status), sent.elapsed());
                    // The app answering 502-504 is the app (or what is behind it) failing.
                    pick.record(!matches!(status.as_u16(), 502..=504));
                    port.count(&route.name, screened.map_or(Handled::Forwarded, Screening::handled));
                    let head = parts.method == Method::HEAD;
                    return Ok(self.prepare_response(port, route, response, screened, head, request_id));
                }
                Attempt::ClientFailed(reason) => {
                    // Not the app's fault: no failure recorded against its address.
                    tracing::info!(route = %route.name, error = %reason, "the client's request body failed");
                    port.count(&route.name, Handled::ClientError);
                    return Err(ApiError::BodyRead(client_body_error(&reason)));
                }
                Attempt::Failed(e) => {
                    pick.record(false);
                    let reason = error_chain(&e);
                    // A connect failure means no byte of the request was sent, so any method may
                    // go to another address (nginx's `proxy_next_upstream error` does the same).
                    if e.is_connect() && replayable.is_some() && attempt < route.retries {
                        tracing::debug!(route = %route.name, app = %pick.url(), error = %reason, "connect failed; retrying on another address");
                        attempt += 1;
                        continue;
                    }
                    tracing::warn!(route = %route.name, app = %pick.url(), error = %reason, "app request failed");
                    port.count(&route.name, Handled::UpstreamError);
                    // The details (addresses, errors) go to the log, not to the client.
                    let reason = if e.is_connect() {
                        "could not connect to the app"
                    } else {
                        "the app closed the connection or sent an invalid response"
                    };
                    return Err(ApiError::BadGateway { route: route.name.clone(), reason: reason.into() });
                }
                Attempt::TimedOut => {
                    pick.record(false);
                    port.count(&route.name, Handled::UpstreamTimeout);
                    let timeout_ms = route.response_header_timeout.as_millis() as u64;
                    tracing::warn!(route = %route.name, app = %pick.url(), timeout_ms, "app sent no response head in time");
                    return Err(ApiError::GatewayTimeout { route: route.name.clone(), timeout_ms });
                }
            }
        }
    }

    /// The request's head as every attempt sends it; returns the client's `Host`.
    fn prepare_request(
        &self,
        port: &Port,
        route: &Route,
        parts: &mut http::request::Parts,
        screened: Option<&Screening>,
    ) -> Option<HeaderValue> {
        // tiergate's own credentials (API keys, the trusted tenant header) are not the app's.
        port.tenants().strip_credentials(&mut parts.headers);
        let original_host = request_host_header(parts);
        prepare_request_headers(parts, self.via.as_deref(), self.trust_forwarded, screened);
        if route.stream_guard.is_some() {
            // The guard reads the app's text as it flows: ask for it uncompressed.
            parts.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        parts.version = if route.http2 { Version::HTTP_2 } else { Version::HTTP_11 };
        original_host
    }

    /// Sends one request; the response-head timeout runs from the end of the upload, so a large
    /// or slow upload is bounded by the body idle timeout instead, and is not the app's delay.
    async fn attempt(&self, route: &Route, request: Request<BoxBody>) -> Attempt {
        let client = self.client(route);
        let (parts, body) = request.into_parts();
        let (body, mut upload) = Tracked::wrap(body, route.body_idle_timeout);
        let head_timeout = route.response_header_timeout;
        let result = tokio::select! {
            result = client.request(Request::from_parts(parts, body)) => Some(result),
            _ = async {
                let _ = upload.wait_for(|u| *u != Upload::Sending).await;
                tokio::time::sleep(head_timeout).await;
            } => None,
        };
        let upload = *upload.borrow();
        match result {
            Some(Err(e)) if upload == Upload::Failed => Attempt::ClientFailed(error_chain(&e)),
            Some(Ok(response)) => Attempt::Answered(response),
            Some(Err(e)) => Attempt::Failed(e),
            None => Attempt::TimedOut,
        }
    }

    /// The app's response as the client gets it: hop-by-hop headers out, `Via` and the
    /// decision in, the body idle-limited and, on a guarded route, screened as it streams.
    fn prepare_response(
        &self,
        port: &Port,
        route: &Route,
        response: Response<Incoming>,
        screened: Option<&Screening>,
        head: bool,
        request_id: Option<String>,
    ) -> Response<BoxBody> {
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(via) = &self.via {
            append_via(&mut parts.headers, parts.version, via);
        }
        // A proxy answers in its own version (RFC 9110 §6.2): an app speaking HTTP/1.0 must not
        // turn the client's connection into one. `Via` above keeps what the app spoke.
        parts.version = Version::HTTP_11;
        if let Some(Screening::Decided(d)) = screened {
            // The client sees the decision too (the app may also act on it).
            parts.headers.insert(headers::ACTION, HeaderValue::from_static(d.action.as_str()));
        }
        let body = BoxBody::new(IdleTimeout::new(body, route.body_idle_timeout, "the app's response body"));
        let body = match &route.stream_guard {
            // A HEAD response has no body to read, and keeps its Content-Length.
            Some(config) if !head && stream_guard::applies(&parts.headers) => {
                // The guard may end the stream early: the app's length no longer holds.
                parts.headers.remove(header::CONTENT_LENGTH);
                let policy = route.screen.as_ref().and_then(|s| s.config.policy.as_deref());
                let tenant = match screened {
                    Some(Screening::Decided(d)) => d.subject.tenant.clone(),
                    _ => None,
                };
                let audit = request_id.and_then(|id| port.cut_audit(id, tenant));
                stream_guard::spawn(
                    port.policy(policy),
                    port.stream_counter().clone(),
                    route.name.clone(),
                    config.clone(),
                    &parts.headers,
                    body,
                    audit,
                )
            }
            Some(_) if stream_guard::encoded(&parts.headers) => {
                // Asked for identity coding and got a compressed body anyway: it passes unread.
                tracing::warn!(route = %route.name, "compressed response on a guarded route; not screened");
                let labels = RouteLabels { route: route.name.clone(), outcome: "unreadable" };
                port.stream_counter().get_or_create(&labels).inc();
                body
            }
            _ => body,
        };
        Response::from_parts(parts, body)
    }
}

/// The request for one app address: its scheme and authority, the client's path and query,
/// `Host` as the route says, and the trace `context` (tiergate's client span) when traced.
fn app_request(
    route: &Route,
    parts: &http::request::Parts,
    app: &AppAddr,
    original_host: Option<HeaderValue>,
    body: BoxBody,
    context: Option<&SpanContext>,
) -> Request<BoxBody> {
    let path_and_query = parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
    let mut request = Request::from_parts(parts.clone(), body);
    let mut uri = http::uri::Parts::default();
    uri.scheme = Some(app.scheme.clone());
    uri.authority = Some(app.authority.clone());
    uri.path_and_query = Some(path_and_query);
    *request.uri_mut() = Uri::from_parts(uri).unwrap_or_default();
    let host = match &route.host_header {
        HostHeader::Preserve => original_host,
        HostHeader::App => HeaderValue::from_str(app.authority.as_str()).ok(),
        HostHeader::Literal(v) => Some(v.clone()),
    };
    if let Some(host) = host {
        request.headers_mut().insert(header::HOST, host);
    }
    if let Some(cx) = context {
        crate::trace::context::inject(cx, request.headers_mut());
    }
    request
}

fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The body to send, from what screening left of the client's.
pub(super) fn outgoing_body<B>(body: Outgoing<B>) -> BoxBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    match body {
        Outgoing::Bytes(b) => full(b),
        Outgoing::Stream(b) => BoxBody::new(b),
        Outgoing::Partial(prefix, rest) => {
            let head = futures_util::stream::once(async move { Ok::<_, BoxError>(hyper::body::Frame::data(prefix)) });
            let tail = http_body_util::BodyStream::new(rest.map_err(Into::into));
            BoxBody::new(StreamBody::new(futures_util::StreamExt::chain(head, tail)))
        }
        Outgoing::Broken => empty(),
    }
}

/// What a client is told about its own broken body: the innermost cause (hyper's outer layers
/// name the app-side request, which is not the client's business).
fn client_body_error(chain: &str) -> String {
    chain.rsplit(": ").next().unwrap_or(chain).to_string()
}

/// Where a request body stands on its way to the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upload {
    Sending,
    /// Sent whole: from now on, waiting is the app's doing.
    Sent,
    /// The client's body failed (broken framing, reset, stalled): the client's doing.
    Failed,
}

/// The request body as the app gets it: idle-limited, and reporting its [`Upload`] state, so
/// that the response-head timeout starts once the body is sent and a client's broken upload is
/// not counted against the app.
struct Tracked {
    inner: IdleTimeout<BoxBody>,
    state: tokio::sync::watch::Sender<Upload>,
}

impl Tracked {
    /// The body to send and its upload state. A body that is already complete (none, or one
    /// held whole) is sent as it is: it cannot stall, and it counts as sent from the start.
    fn wrap(body: BoxBody, idle: Duration) -> (BoxBody, tokio::sync::watch::Receiver<Upload>) {
        if http_body::Body::is_end_stream(&body) {
            return (body, tokio::sync::watch::channel(Upload::Sent).1);
        }
        let (state, watch) = tokio::sync::watch::channel(Upload::Sending);
        (BoxBody::new(Tracked { inner: IdleTimeout::new(body, idle, "the client's request body"), state }), watch)
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                this.state.send_replace(Upload::Sent);
            }
            Poll::Ready(Some(Err(_))) => {
                this.state.send_replace(Upload::Failed);
            }
            // hyper stops polling a body that says it has ended.
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => {
                this.state.send_replace(Upload::Sent);
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
