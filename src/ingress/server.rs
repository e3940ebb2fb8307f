//! The HTTP server: hyper (HTTP/1.1 and HTTP/2) under a tower stack
//! (request id -> trace), the whole-request timeout, the routes, and graceful shutdown.

use crate::config::ServerConfig;
use crate::error::{json_response, ApiError};
use crate::gateway::Gateway;
use crate::ingress::extract;
use crate::metrics::ResponseLabels;
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

pub type Body = Full<Bytes>;

/// What the request handlers share.
pub struct App {
    pub gateway: Gateway,
    pub limits: ServerConfig,
}

/// Serves `listener` until `shutdown` resolves, then stops accepting and lets in-flight
/// requests finish for up to `limits.shutdown_grace_ms`.
pub async fn serve(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    let limits = app.limits.clone();
    let handler = {
        let app = Arc::clone(&app);
        tower::service_fn(move |req: Request<Incoming>| {
            let app = Arc::clone(&app);
            async move { Ok::<_, Infallible>(handle(&app, req).await) }
        })
    };
    let service = ServiceBuilder::new()
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(TraceLayer::new_for_http())
        .service(handler);

    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms));
    builder.http2().timer(TokioTimer::new());
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
                let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service.clone())).into_owned();
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

/// Routes one request under the whole-request timeout (which also bounds slow-body clients).
async fn handle(app: &App, req: Request<Incoming>) -> Response<Body> {
    let timeout_ms = app.limits.request_timeout_ms;
    let response = tokio::time::timeout(Duration::from_millis(timeout_ms), route(app, req))
        .await
        .unwrap_or_else(|_| ApiError::Timeout { timeout_ms }.into_response());
    app.gateway.metrics.responses.get_or_create(&ResponseLabels { status: response.status().as_u16() }).inc();
    response
}

async fn route(app: &App, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
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

async fn classify(app: &App, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    extract::require_json(&parts.headers)?;
    let bytes = extract::read_body(&parts.headers, body, app.limits.max_body_bytes).await?;
    let request = extract::classify_request(&parts.headers, &bytes, &app.limits)?;
    let request_id = parts.headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let decision = app.gateway.classify(request, request_id).await;
    Ok(json_response(StatusCode::OK, &decision))
}

fn readyz(app: &App) -> Response<Body> {
    let g = &app.gateway;
    let policy = g.policies.snapshot();
    let cpu_ready = g.cpu.workers_alive() > 0;
    let body = json!({
        "status": if cpu_ready { "ready" } else { "not_ready" },
        "policy_version": policy.version,
        "model": g.cpu.info(),
        "tiers": {
            "cpu": {
                "status": if cpu_ready { "ready" } else { "down" },
                "workers": g.cpu.workers_alive(),
                "queue_depth": g.cpu.queue_depth(),
            },
            "gpu": match g.gpu_unavailable() {
                Some(reason) => json!({"status": "unavailable", "reason": reason}),
                None => json!({"status": "ready", "devices": g.gpu.devices}),
            },
            "rules": {"status": "ready", "rules": policy.rules.rule_count()},
        },
    });
    json_response(if cpu_ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &body)
}

fn metrics(app: &App) -> Response<Body> {
    let g = &app.gateway;
    g.metrics.cpu_queue_depth.set(g.cpu.queue_depth() as i64);
    g.metrics.cpu_in_flight.set(g.cpu.in_flight() as i64);
    let mut response = Response::new(Full::new(Bytes::from(g.metrics.encode())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
