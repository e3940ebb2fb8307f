//! The HTTP server: hyper (HTTP/1.1 and HTTP/2) under a tower stack
//! (request id -> trace), the whole-request timeout, the routes, and graceful shutdown.

use crate::config::{Config, ServerConfig};
use crate::error::{json_response, ApiError};
use crate::gateway::Gateway;
use crate::ingress::extract;
use crate::metrics::ResponseLabels;
use crate::proxy::{boxed, PeerAddr, Proxy};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub use crate::proxy::BoxBody as Body;

/// What the request handlers share.
pub struct App {
    pub gateway: Arc<Gateway>,
    pub limits: ServerConfig,
    pub role: Role,
}

impl App {
    /// The public listener's app (the configured `[[routes]]`, then tiergate's own endpoints) and
    /// the admin listener's (`[admin]`), sharing the routes' upstream state.
    pub fn pair(gateway: Arc<Gateway>, config: &Config) -> Result<(App, App), String> {
        let proxy = Proxy::new(&config.proxy, &config.routes)?.map(Arc::new);
        let admin = App {
            gateway: Arc::clone(&gateway),
            limits: config.server.clone(),
            role: Role::Admin { token: config.admin.token.clone(), proxy: proxy.clone() },
        };
        Ok((App { gateway, limits: config.server.clone(), role: Role::Public { proxy } }, admin))
    }
}

/// Which routes a listener serves. Admin routes are never served on the public listener.
pub enum Role {
    /// Proxy routes (when configured, matched first), `/v1/classify`, `/healthz`, `/readyz`, `/metrics`.
    Public { proxy: Option<Arc<Proxy>> },
    /// `/admin/policy`, `/admin/reload` (with a bearer token when one is set), and the
    /// unauthenticated probes `/healthz`, `/readyz`, `/metrics`.
    Admin { token: Option<String>, proxy: Option<Arc<Proxy>> },
}

/// Serves `listener` until `shutdown` resolves, then stops accepting and lets in-flight
/// requests finish for up to `limits.shutdown_grace_ms`.
pub async fn serve(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    let limits = app.limits.clone();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms))
        // hyper answers 431 when the head does not fit its read buffer (8 KiB at least).
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                // One service per connection: the client's address travels with each of its
                // requests (X-Forwarded-For).
                let handler = {
                    let app = Arc::clone(&app);
                    tower::service_fn(move |mut req: Request<Incoming>| {
                        req.extensions_mut().insert(PeerAddr(peer));
                        let app = Arc::clone(&app);
                        async move { Ok::<_, Infallible>(handle(&app, req).await) }
                    })
                };
                let service = ServiceBuilder::new()
                    .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                    .layer(PropagateRequestIdLayer::x_request_id())
                    .layer(TraceLayer::new_for_http())
                    .service(handler);
                let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!("shutting down: draining in-flight requests");
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(Duration::from_millis(limits.shutdown_grace_ms)) => {
            tracing::warn!(grace_ms = limits.shutdown_grace_ms, "grace period over; closing remaining connections");
        }
    }
    Ok(())
}

/// Refuses ambiguous framing, then hands the request to its proxy route (which applies the
/// route's own timeouts) or to tiergate's endpoints under the whole-request timeout (which also
/// bounds slow-body clients).
async fn handle(app: &App, mut req: Request<Incoming>) -> Response<Body> {
    let proxy = match &app.role {
        Role::Public { proxy: Some(proxy) } => Some(proxy),
        _ => None,
    };
    let checked = check_framing(req.headers()).and_then(|()| match proxy {
        Some(_) => crate::proxy::normalize::request(&mut req),
        None => Ok(()),
    });
    let response = match (checked, proxy) {
        (Err(e), _) => boxed(e.into_response()),
        (Ok(()), Some(proxy)) => match proxy.route(&req) {
            Some(route) => proxy.handle(&app.gateway, &app.limits, route, req).await,
            None => own_endpoints(app, req).await,
        },
        (Ok(()), None) => own_endpoints(app, req).await,
    };
    app.gateway.metrics.responses.get_or_create(&ResponseLabels { status: response.status().as_u16() }).inc();
    response
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

async fn own_endpoints(app: &App, req: Request<Incoming>) -> Response<Body> {
    let timeout_ms = app.limits.request_timeout_ms;
    let response = tokio::time::timeout(Duration::from_millis(timeout_ms), route(app, req))
        .await
        .unwrap_or_else(|_| ApiError::Timeout { timeout_ms }.into_response());
    boxed(response)
}

async fn route(app: &App, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if let Role::Admin { token, .. } = &app.role {
        // Probes and scrapes need no token: they change nothing and kubelet/Prometheus carry none.
        match (path.as_str(), &method) {
            ("/healthz", &Method::GET | &Method::HEAD) => {
                return json_response(StatusCode::OK, &json!({"status": "ok"}))
            }
            ("/readyz", &Method::GET | &Method::HEAD) => return readyz(app),
            ("/metrics", &Method::GET) => return metrics(app),
            _ => {}
        }
        if let Err(e) = authorize(req.headers(), token.as_deref()) {
            return e.into_response();
        }
        return admin(app, &path, &method).await.unwrap_or_else(ApiError::into_response);
    }
    let result = match (path.as_str(), &method) {
        ("/v1/classify", &Method::POST) => classify(app, req).await,
        ("/healthz", &Method::GET | &Method::HEAD) => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        ("/readyz", &Method::GET | &Method::HEAD) => Ok(readyz(app)),
        ("/metrics", &Method::GET) => Ok(metrics(app)),
        ("/v1/classify", _) => Err(ApiError::MethodNotAllowed { method: method.to_string(), path, allowed: "POST" }),
        ("/healthz" | "/readyz" | "/metrics", _) => {
            Err(ApiError::MethodNotAllowed { method: method.to_string(), path, allowed: "GET, HEAD" })
        }
        _ => Err(ApiError::NotFound { path }),
    };
    result.unwrap_or_else(ApiError::into_response)
}

async fn classify(app: &App, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let (parts, body) = req.into_parts();
    extract::require_json(&parts.headers)?;
    let bytes = extract::read_body(&parts.headers, body, app.limits.max_body_bytes).await?;
    let mut request = extract::classify_request(&parts.headers, &bytes, &app.limits)?;
    request.explain = extract::explain_flag(parts.uri.query())?;
    let request_id = parts.headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let decision = app.gateway.classify(request, request_id).await?;
    Ok(json_response(StatusCode::OK, &decision))
}

/// Checks the bearer token when one is set.
fn authorize(headers: &http::HeaderMap, token: Option<&str>) -> Result<(), ApiError> {
    if let Some(token) = token {
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default();
        if !constant_time_eq(given.as_bytes(), format!("Bearer {token}").as_bytes()) {
            return Err(ApiError::Unauthorized);
        }
    }
    Ok(())
}

async fn admin(app: &App, path: &str, method: &Method) -> Result<Response<Full<Bytes>>, ApiError> {
    let g = &app.gateway;
    match (path, method) {
        ("/admin/policy", &Method::GET) => {
            let mut status = json!(g.policies.status());
            if let Some(shadow) = &g.shadow {
                status["shadow"] = json!({"share": shadow.share, "status": shadow.policies.status()});
            }
            if !g.route_policies.is_empty() {
                status["route_policies"] = g.route_policies.values().map(|p| json!(p.status())).collect();
            }
            Ok(json_response(StatusCode::OK, &status))
        }
        // Reading files and compiling rules is blocking work: keep it off the async workers.
        ("/admin/reload", &Method::POST) => match tokio::task::spawn_blocking({
            let g = Arc::clone(g);
            move || g.reload_all("admin")
        })
        .await
        .map_err(|e| ApiError::Internal(format!("reload task: {e}")))?
        {
            Ok(changed) => Ok(json_response(
                StatusCode::OK,
                &json!({
                    "status": if changed.is_some() { "reloaded" } else { "unchanged" },
                    "version": g.policies.snapshot().version,
                }),
            )),
            Err(e) => Err(ApiError::PolicyInvalid { problems: e.0.iter().map(|p| p.to_string()).collect() }),
        },
        ("/admin/policy", _) => {
            Err(ApiError::MethodNotAllowed { method: method.to_string(), path: path.into(), allowed: "GET" })
        }
        ("/admin/reload", _) => {
            Err(ApiError::MethodNotAllowed { method: method.to_string(), path: path.into(), allowed: "POST" })
        }
        _ => Err(ApiError::NotFound { path: path.into() }),
    }
}

/// Compares secrets without an early exit that would leak how many leading bytes match.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn readyz(app: &App) -> Response<Full<Bytes>> {
    let g = &app.gateway;
    let policy = g.policies.snapshot();
    let cpu_ready = g.cpu.workers_alive() > 0;
    let now = tokio::time::Instant::now();
    let snapshot = g.snapshot(now);
    let readings = g.signals.readings(now);
    let gpu = match (&g.gpu, &snapshot.gpu.unavailable) {
        (None, reason) => json!({"status": "unavailable", "backend": g.gpu_backend(), "reason": reason}),
        (Some(tier), _) => {
            let mut v = json!({
                "status": if tier.circuit(now) == crate::tier::breaker::CircuitState::Open { "circuit_open" } else { "ready" },
                "backend": g.gpu_backend(),
                "circuit": tier.circuit(now),
                "in_flight": tier.in_flight(),
            });
            match tier.backend() {
                crate::tier::gpu::Backend::Onnx(pool) => v["model"] = json!(pool.info()),
                crate::tier::gpu::Backend::Upstream(pool) => v["endpoints"] = json!(pool.endpoints()),
            }
            v
        }
    };
    let mut body = json!({
        "status": if cpu_ready { "ready" } else { "not_ready" },
        "policy_version": policy.version,
        "model": g.cpu.info(),
        "tiers": {
            "cpu": {
                "status": if cpu_ready { "ready" } else { "down" },
                "workers": g.cpu.workers_alive(),
                "queue_depth": g.cpu.queue_depth(),
            },
            "gpu": gpu,
            "rules": {"status": "ready", "rules": policy.rules.rule_count()},
        },
        "devices": match &readings.gpu_devices {
            Ok(d) if readings.gpu_stale => json!({"status": "unknown", "reason": "no fresh GPU reading yet"}),
            Ok(d) => json!({"status": "present", "gpus": d}),
            Err(reason) => json!({"status": "absent", "reason": reason}),
        },
        "signals": snapshot,
    });
    if let Role::Public { proxy: Some(proxy) } | Role::Admin { proxy: Some(proxy), .. } = &app.role {
        body["routes"] = proxy.status();
    }
    json_response(if cpu_ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &body)
}

fn metrics(app: &App) -> Response<Full<Bytes>> {
    let g = &app.gateway;
    let m = &g.metrics;
    let now = tokio::time::Instant::now();
    let s = g.snapshot(now);
    m.cpu_queue_depth.set(s.cpu.queue_depth as i64);
    m.cpu_in_flight.set(s.cpu.in_flight as i64);
    if let Some(u) = s.cpu.utilization {
        m.cpu_utilization.set(u);
    }
    m.gpu_in_flight.set(s.gpu.in_flight as i64);
    m.gpu_circuit_open.set((s.gpu.circuit == crate::tier::breaker::CircuitState::Open) as i64);
    if let Ok(devices) = g.signals.readings(now).gpu_devices {
        for d in devices {
            let device = crate::metrics::DeviceLabels { device: d.ordinal as u32 };
            m.gpu_free_bytes.get_or_create(&device).set(d.free_bytes as i64);
            m.gpu_total_bytes.get_or_create(&device).set(d.total_bytes as i64);
            if let Some(u) = d.utilization {
                m.gpu_utilization.get_or_create(&device).set(u);
            }
        }
    }
    if let Role::Public { proxy: Some(proxy) } | Role::Admin { proxy: Some(proxy), .. } = &app.role {
        proxy.export(m);
    }
    let mut response = Response::new(Full::new(Bytes::from(g.metrics.encode())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
