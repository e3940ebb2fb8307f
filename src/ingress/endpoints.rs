//! tiergate's own endpoints: `POST /v1/classify`, the probes `/healthz` and `/readyz`,
//! `/metrics` (on the admin listener; on the public one only as `[admin] public_*` allow),
//! `POST /v1/feedback` (labels: `super::feedback`), and on the admin listener `/admin/policy`,
//! `/admin/reload` and the review console (`crate::console`). Handlers return `Result`; the
//! server turns errors into responses.

use super::app::{App, Role};
use crate::audit::record::Event;
use crate::audit::Kind;
use crate::breaker::CircuitState;
use crate::error::{json_response, ApiError};
use crate::request::{self, ClassifyRequest};
use crate::trace::{attr, Trace};
use crate::web::{self, headers};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use opentelemetry::KeyValue;
use serde_json::json;
use sha2::Digest;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// tiergate's own endpoints on the listener's role.
pub(super) async fn serve(app: &App, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let views = match &app.role {
        Role::Public { views, .. } => *views,
        Role::Admin { token, .. } => {
            // Probes, scrapes and classification need no token: they change nothing, and
            // kubelet/Prometheus carry none. `/v1/classify` is here so that it stays reachable
            // when a catch-all proxy route takes every public path.
            match (path.as_str(), &method) {
                ("/v1/classify", &Method::POST) => return classify(app, req).await,
                ("/healthz", &Method::GET | &Method::HEAD) => {
                    return Ok(json_response(StatusCode::OK, &json!({"status": "ok"})))
                }
                ("/readyz", &Method::GET | &Method::HEAD) => return Ok(readyz(app)),
                ("/metrics", &Method::GET) => return Ok(metrics(app)),
                // A wrong method on these is 405 naming the right one, as on the public listener.
                ("/v1/classify", _) => return Err(not_allowed(&method, path, "POST")),
                ("/healthz" | "/readyz", _) => return Err(not_allowed(&method, path, "GET, HEAD")),
                ("/metrics", _) => return Err(not_allowed(&method, path, "GET")),
                // The review console authenticates itself: a session cookie or the bearer token.
                _ if crate::console::handles(&path) => {
                    let max_body_bytes = app.server.max_body_bytes;
                    let cx = crate::console::Context { gateway: &app.gateway, token: token.as_deref(), max_body_bytes };
                    return crate::console::serve(cx, req).await;
                }
                _ => {}
            }
            authorize(req.headers(), token.as_deref())?;
            if path == "/v1/feedback" {
                return match method {
                    Method::POST => super::feedback::feedback(app, req).await,
                    _ => Err(not_allowed(&method, path, "POST")),
                };
            }
            return admin(app, &path, &method).await;
        }
    };
    match (path.as_str(), &method) {
        ("/v1/classify", &Method::POST) => classify(app, req).await,
        ("/v1/feedback", &Method::POST) => super::feedback::feedback(app, req).await,
        ("/v1/feedback", _) => Err(not_allowed(&method, path, "POST")),
        ("/healthz", &Method::GET | &Method::HEAD) => Ok(json_response(StatusCode::OK, &json!({"status": "ok"}))),
        ("/readyz", &Method::GET | &Method::HEAD) if views.readyz_details => Ok(readyz(app)),
        // The status and its code are what probes need; the rest (thresholds, tier state) stays
        // on the admin listener.
        ("/readyz", &Method::GET | &Method::HEAD) => {
            let full = readyz(app);
            Ok(json_response(
                full.status(),
                &json!({"status": if full.status().is_success() { "ready" } else { "not_ready" }}),
            ))
        }
        ("/metrics", &Method::GET) if views.metrics => Ok(metrics(app)),
        ("/metrics", _) if !views.metrics => Err(ApiError::NotFound { path }),
        ("/v1/classify", _) => Err(ApiError::MethodNotAllowed { method: method.to_string(), path, allowed: "POST" }),
        ("/healthz" | "/readyz" | "/metrics", _) => {
            Err(ApiError::MethodNotAllowed { method: method.to_string(), path, allowed: "GET, HEAD" })
        }
        _ => Err(ApiError::NotFound { path }),
    }
}

fn not_allowed(method: &Method, path: String, allowed: &'static str) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path, allowed }
}

async fn classify(app: &App, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let (parts, body) = req.into_parts();
    web::require_json(&parts.headers)?;
    let bytes = web::read_body(&parts.headers, body, app.server.max_body_bytes).await?;
    let mut request = ClassifyRequest::from_json(&parts.headers, &bytes, &app.server)?;
    request.trace = parts.extensions.get::<Trace>().cloned().unwrap_or_default();
    request.trace.rename("POST /v1/classify");
    request.trace.set([KeyValue::new(attr::HTTP_ROUTE, "/v1/classify")]);
    request.identify(&app.gateway.tenants, &parts.headers, None)?;
    request.explain = request::explain_flag(parts.uri.query())?;
    if request.explain && matches!(app.role, Role::Public { views, .. } if !views.explain) {
        return Err(ApiError::invalid(
            "explain",
            "`explain=true` is served on the admin listener; set `[admin] public_explain = true` to allow it here",
        ));
    }
    let request_id = headers::client_request_id(&parts.headers).unwrap_or_default().to_string();
    let trace = request.trace.clone();
    let mut decision = app.gateway.classify_public(request, request_id, &parts.headers).await?;
    let span = trace.start("record");
    let recorded = app.gateway.record(Event::Decided { kind: Kind::Classify, decision: &decision }, None);
    let audited = app.gateway.audit.is_some() && recorded.is_ok();
    trace.end(span, || vec![KeyValue::new(attr::AUDITED, audited)], None);
    decision.record_id = recorded?;
    Ok(json_response(StatusCode::OK, &decision))
}

/// Checks the bearer token when one is set: `Authorization: Bearer <token>`, the scheme in any
/// case (RFC 9110 §11.1). The tokens are compared as SHA-256 digests with `subtle`'s
/// constant-time equality, so neither the position of the first wrong byte nor the token's
/// length shows in the time taken.
fn authorize(headers: &http::HeaderMap, token: Option<&str>) -> Result<(), ApiError> {
    let Some(token) = token else { return Ok(()) };
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let presented = match given.trim().split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
        _ => return Err(ApiError::Unauthorized),
    };
    let digest = |t: &str| sha2::Sha256::digest(t.as_bytes());
    if bool::from(digest(presented).ct_eq(&digest(token))) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

async fn admin(app: &App, path: &str, method: &Method) -> Result<Response<Full<Bytes>>, ApiError> {
    let g = &app.gateway;
    match (path, method) {
        ("/admin/policy", &Method::GET) => {
            let mut status = json!(g.policies.status());
            if let Some(shadow) = &g.shadow {
                status["shadow"] = json!({"share": shadow.share, "status": shadow.policies.status()});
            }
            if let Some(ab) = &g.ab {
                status["ab"] = ab.status();
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

fn readyz(app: &App) -> Response<Full<Bytes>> {
    let g = &app.gateway;
    let policy = g.policies.snapshot();
    let cpu_ready = g.cpu.workers_alive() > 0;
    let now = tokio::time::Instant::now();
    let snapshot = g.snapshot(now, &policy);
    let readings = g.readings.at(now);
    let gpu = match (&g.gpu, &snapshot.gpu.unavailable) {
        (None, reason) => json!({"status": "unavailable", "backend": g.gpu_backend(), "reason": reason}),
        (Some(tier), _) => {
            let mut v = tier.status();
            if !v.is_object() {
                v = json!({ "details": v });
            }
            v["status"] = json!(if tier.circuit(now) == CircuitState::Open { "circuit_open" } else { "ready" });
            v["backend"] = json!(tier.name());
            v["circuit"] = json!(tier.circuit(now));
            v["in_flight"] = json!(tier.in_flight());
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
                // The temperature its verdicts are read at now: the live policy's, else the model's.
                "temperature": policy.calibration.cpu_temperature_or(g.cpu.info().temperature),
                "temperature_from": if policy.calibration.cpu_temperature.is_some() { "policy" } else { "model" },
            },
            "confirm": match &g.confirm {
                None => json!({"status": "unavailable", "reason": "no [confirm] model configured"}),
                Some(c) => json!({
                    "status": if c.workers_alive() > 0 { "ready" } else { "down" },
                    "model": c.info(),
                    "workers": c.workers_alive(),
                    "queue_depth": c.queue_depth(),
                    "confirm_from": policy.cascade.confirm_from,
                    "confirm_at": policy.cascade.confirm_at,
                }),
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
    if let Some(m) = &g.shadow_model {
        body["shadow_model"] = m.status();
    }
    if let Role::Public { proxy: Some(proxy), .. } | Role::Admin { proxy: Some(proxy), .. } = &app.role {
        body["routes"] = proxy.status();
    }
    json_response(if cpu_ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, &body)
}

fn metrics(app: &App) -> Response<Full<Bytes>> {
    let g = &app.gateway;
    let m = &g.metrics;
    let now = tokio::time::Instant::now();
    let s = g.snapshot(now, &g.policies.snapshot());
    m.cpu_queue_depth.set(s.cpu.queue_depth as i64);
    m.cpu_in_flight.set(s.cpu.in_flight as i64);
    m.cpu_queue_wait.set(s.cpu.queue_wait_us.unwrap_or(0) as f64 / 1e6);
    m.cpu_service_time.set(s.cpu.service_us.unwrap_or(0) as f64 / 1e6);
    if let Some(u) = s.cpu.utilization {
        m.cpu_utilization.set(u);
    }
    m.gpu_in_flight.set(s.gpu.in_flight as i64);
    m.gpu_circuit_open.set((s.gpu.circuit == CircuitState::Open) as i64);
    if let Ok(devices) = g.readings.at(now).gpu_devices {
        for d in devices {
            let device = crate::metrics::DeviceLabels { device: d.ordinal as u32 };
            m.gpu_free_bytes.get_or_create(&device).set(d.free_bytes as i64);
            m.gpu_total_bytes.get_or_create(&device).set(d.total_bytes as i64);
            if let Some(u) = d.utilization {
                m.gpu_utilization.get_or_create(&device).set(u);
            }
        }
    }
    if let Role::Public { proxy: Some(proxy), .. } | Role::Admin { proxy: Some(proxy), .. } = &app.role {
        proxy.export(m);
    }
    if let Some(audit) = &g.audit {
        audit.export();
    }
    let mut response = Response::new(Full::new(Bytes::from(g.metrics.encode())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}
