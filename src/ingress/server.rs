//! The HTTP server: hyper (HTTP/1.1 and HTTP/2) under a tower stack (request id -> trace),
//! framing checks, connection deadlines ([`conn`]), proxied routes or the endpoints under the whole-request timeout, graceful
//! shutdown. [`handle`] is where every error becomes a response.

use super::app::{App, Role};
use super::conn;
use super::endpoints;
use crate::error::ApiError;
use crate::metrics::ResponseLabels;
use crate::trace::{attr, Trace};
use crate::web::{self, boxed, BoxBody, PeerAddr, ServerConfig};
use http::{header, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

/// Serves `listener` until `shutdown` resolves, then stops accepting and lets in-flight
/// requests finish for up to `server.shutdown_grace_ms`. Each connection is closed when it has
/// been quiet too long (`header_read_timeout_ms` before its first request, `idle_timeout_ms`
/// after one: [`conn`]).
pub async fn serve(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    let server = app.server.clone();
    let shared = Arc::new(Shared {
        builder: connection_builder(&server),
        requests: Arc::new(Semaphore::new(server.max_concurrent_requests.max(1))),
        // `true` tells every connection to finish; `closed()` says they all have.
        stop: watch::channel(false).0,
        first: Duration::from_millis(server.header_read_timeout_ms),
        idle: Duration::from_millis(server.idle_timeout_ms),
        app,
    });
    let connections = Arc::new(Semaphore::new(server.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        // Waits here, not in accept, while the listener is at max_connections.
        let connection = tokio::select! {
            permit = Arc::clone(&connections).acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => spawn_connection(&shared, stream, peer, connection),
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: draining in-flight requests");
    shared.stop.send_replace(true);
    tokio::select! {
        _ = shared.stop.closed() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(Duration::from_millis(server.shutdown_grace_ms)) => {
            tracing::warn!(grace_ms = server.shutdown_grace_ms, "grace period over; closing remaining connections");
        }
    }
    Ok(())
}

/// What every connection of a listener shares.
struct Shared {
    app: Arc<App>,
    builder: auto::Builder<TokioExecutor>,
    /// `max_concurrent_requests`.
    requests: Arc<Semaphore>,
    /// Server shutdown, to every connection.
    stop: watch::Sender<bool>,
    /// `header_read_timeout_ms`, `idle_timeout_ms`.
    first: Duration,
    idle: Duration,
}

/// hyper's HTTP/1 and HTTP/2 settings from `[server]`: the HTTP/1 head's size, the HTTP/2
/// header list's size, and HTTP/2 keep-alive pings (a peer that stops answering them is gone,
/// whatever its socket says). hyper's own HTTP/1 header-read timer is off: it starts as soon as
/// a keep-alive connection waits for its next request, so it would close every idle connection
/// after `header_read_timeout_ms` (30 s by hyper's default) instead of `idle_timeout_ms`;
/// `conn::drive` bounds the first head by the one and each later head, idle time included,
/// by the other.
fn connection_builder(server: &ServerConfig) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        // hyper answers 431 when the head does not fit its read buffer (8 KiB at least).
        .max_buf_size(server.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(server.max_header_bytes.min(u32::MAX as usize) as u32)
        .keep_alive_interval(Duration::from_millis(server.http2_keep_alive_interval_ms))
        .keep_alive_timeout(Duration::from_millis(server.http2_keep_alive_timeout_ms));
    builder
}

/// Serves one accepted connection on its own task, holding its `max_connections` permit until
/// it closes. Its service puts the client's address in each request (X-Forwarded-For) and
/// counts each request in the connection's [`conn::Activity`] until its response is sent, under
/// the request id and trace layers; [`conn::drive`] closes it when quiet too long.
fn spawn_connection(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr, permit: OwnedSemaphorePermit) {
    let _ = stream.set_nodelay(true);
    let activity = conn::Activity::new();
    let handler = {
        let (app, requests, activity) = (Arc::clone(&shared.app), Arc::clone(&shared.requests), Arc::clone(&activity));
        tower::service_fn(move |mut req: Request<Incoming>| {
            let in_flight = activity.begin();
            req.extensions_mut().insert(PeerAddr(peer));
            let app = Arc::clone(&app);
            // Held until the response head is out; none left: shed at once.
            let permit = Arc::clone(&requests).try_acquire_owned().ok();
            async move {
                let response = handle(&app, req, permit.is_some()).await;
                drop(permit);
                Ok::<_, Infallible>(response.map(|body| conn::Counted::new(body, in_flight)))
            }
        })
    };
    let app = Arc::clone(&shared.app);
    let service = ServiceBuilder::new()
        .map_request(web::headers::drop_unusable_request_id)
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(PropagateRequestIdLayer::x_request_id())
        .map_request(move |mut req: Request<Incoming>| {
            begin_trace(&app, &mut req, peer);
            req
        })
        .layer(TraceLayer::new_for_http().make_span_with(request_span))
        .service(handler);
    let connection =
        shared.builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)).into_owned();
    let (stopping, first, idle) = (shared.stop.subscribe(), shared.first, shared.idle);
    tokio::spawn(async move {
        let _permit = permit;
        match conn::drive(connection, |c| c.graceful_shutdown(), &activity, first, idle, stopping).await {
            Some(Err(e)) => tracing::debug!(%peer, error = %e, "connection ended with an error"),
            None => tracing::debug!(%peer, "connection dropped: it did not close when told to"),
            Some(Ok(())) => {}
        }
    });
}

/// The answer to a request over `[server] max_concurrent_requests`: 503 at once with
/// `Connection: close`.
fn at_capacity(app: &App) -> Response<BoxBody> {
    let limit = app.server.max_concurrent_requests;
    let reason = format!("the server is handling its maximum of {limit} requests at once (max_concurrent_requests)");
    let mut response = boxed(ApiError::Shed { reason, retry_after_s: 1 }.into_response());
    // The request's body is never read, so the connection cannot carry another request: say so,
    // or a keep-alive client would write its next request into a connection being closed.
    response.headers_mut().insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    response
}

/// Refuses ambiguous framing, then hands the request to its proxy route (which applies the
/// route's own timeouts) or to tiergate's endpoints under the whole-request timeout (which also
/// bounds slow-body clients); a request not `admitted` under `max_concurrent_requests` is shed.
/// The one place the public and admin listeners turn errors into responses, and count them.
/// An admitted request's trace ([`begin_trace`]) ends here with the response, which names it
/// in `traceresponse`; a shed request's is dropped unexported.
async fn handle(app: &App, req: Request<Incoming>, admitted: bool) -> Response<BoxBody> {
    let response = if admitted {
        let trace = req.extensions().get::<Trace>().cloned().unwrap_or_default();
        let mut response = dispatch(app, req).await.unwrap_or_else(|e| boxed(e.into_response()));
        if let Some(root) = trace.root() {
            response
                .headers_mut()
                .insert(crate::trace::context::TRACERESPONSE, crate::trace::context::traceresponse(root));
        }
        trace.respond(response.status());
        trace.finish();
        response
    } else {
        at_capacity(app)
    };
    app.gateway.metrics.responses.get_or_create(&ResponseLabels { status: response.status().as_u16() }).inc();
    response
}

/// The log span of a request (tower-http's `TraceLayer`): with a trace, at INFO level with its
/// `trace_id` and `span_id` (the root span), so that every log line written while the request
/// is handled, tower-http's own included, leads to its trace; else tower-http's default.
fn request_span(req: &Request<Incoming>) -> tracing::Span {
    match req.extensions().get::<Trace>().and_then(Trace::root) {
        Some(sc) => {
            tracing::info_span!("request", method = %req.method(), trace_id = %sc.trace_id(), span_id = %sc.span_id())
        }
        None => tower_http::trace::MakeSpan::make_span(&mut tower_http::trace::DefaultMakeSpan::new(), req),
    }
}

/// Begins the request's trace, continuing the client's `traceparent` when valid, with the HTTP
/// server span's attributes, in the request's extensions for the log span, [`handle`] and the
/// endpoint or proxy route that serves it. Probes (`/healthz`, `/readyz`, `/metrics`) are not
/// traced.
fn begin_trace(app: &App, req: &mut Request<Incoming>, peer: SocketAddr) {
    if matches!(req.uri().path(), "/healthz" | "/readyz" | "/metrics") {
        return;
    }
    let trace = app.gateway.tracer.begin(req.headers(), SpanKind::Server);
    if trace.is_on() {
        let version = match req.version() {
            http::Version::HTTP_2 => "2",
            http::Version::HTTP_10 => "1.0",
            _ => "1.1",
        };
        let mut attributes = vec![
            KeyValue::new(attr::HTTP_REQUEST_METHOD, req.method().to_string()),
            KeyValue::new(attr::URL_PATH, req.uri().path().to_string()),
            KeyValue::new(attr::URL_SCHEME, "http"),
            KeyValue::new(attr::NETWORK_PROTOCOL_VERSION, version),
            KeyValue::new(attr::CLIENT_ADDRESS, peer.ip().to_string()),
        ];
        if let Some(id) = req.headers().get(web::headers::REQUEST_ID).and_then(|v| v.to_str().ok()) {
            attributes.push(KeyValue::new(attr::REQUEST_ID, id.to_string()));
        }
        trace.set(attributes);
        trace.rename(req.method().to_string());
        req.extensions_mut().insert(trace);
    }
}

async fn dispatch(app: &App, mut req: Request<Incoming>) -> Result<Response<BoxBody>, ApiError> {
    check_framing(req.headers())?;
    if let Role::Public { proxy: Some(proxy), .. } = &app.role {
        crate::proxy::normalize::request(&mut req)?;
        if let Some(route) = proxy.route(&req) {
            return proxy.handle(&app.port, &app.server, route, req).await;
        }
    }
    let timeout_ms = app.server.request_timeout_ms;
    match tokio::time::timeout(Duration::from_millis(timeout_ms), endpoints::serve(app, req)).await {
        Ok(response) => Ok(boxed(response?)),
        Err(_) => Err(ApiError::Timeout { timeout_ms }),
    }
}

/// Request smuggling defence (RFC 9112 §6.3): a message with both `Content-Length` and
/// `Transfer-Encoding`, or with several `Content-Length` values, is refused rather than
/// interpreted, since the next hop might interpret it differently. hyper already refuses
/// conflicting `Content-Length` values and a `Transfer-Encoding` that does not end in `chunked`.
fn check_framing(headers: &http::HeaderMap) -> Result<(), ApiError> {
    let lengths = headers.get_all(header::CONTENT_LENGTH).iter().count();
    if lengths > 1 {
        return Err(ApiError::BadFraming(format!("{lengths} Content-Length headers")));
    }
    if lengths == 1 && headers.contains_key(header::TRANSFER_ENCODING) {
        return Err(ApiError::BadFraming("both Content-Length and Transfer-Encoding".into()));
    }
    // hyper frames by a final `chunked` and passes other codings through undecoded: a body
    // `gzip, chunked` would reach the app with its coding dropped (RFC 9112 §6.1: 501).
    let codings: Vec<String> = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| {
            String::from_utf8_lossy(v.as_bytes()).split(',').map(|c| c.trim().to_ascii_lowercase()).collect::<Vec<_>>()
        })
        .filter(|c| !c.is_empty())
        .collect();
    if codings.iter().any(|c| c != "chunked") {
        return Err(ApiError::NotImplemented(format!("transfer coding `{}`", codings.join(", "))));
    }
    Ok(())
}
