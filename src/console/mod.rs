//! The review console (docs/operations.md, "Review console"): a web page on the admin listener
//! where analysts label `review` decisions — the queue oldest first, filtered by tenant, scenario,
//! rule and language; each decision's text when `[audit.review_text]` kept it (else its keyed
//! hash and signals), its path and word attributions; `risk` / `ok` with keyboard shortcuts;
//! a live quality panel. Labels go through the same writer and checks as `POST /v1/feedback`,
//! as source `analyst` with the signed-in reviewer.
//!
//! Routes (admin listener only):
//! * `GET /admin/console` — the page, or the login form without a session ([`page`]);
//! * `POST /admin/console/login` (form: `reviewer`, `token`), `POST /admin/console/logout`;
//! * `GET /admin/review/queue?tenant=&scenario=&rule=&lang=`, `GET /admin/review/item?record_id=`,
//!   `GET /admin/review/quality` — JSON, with the session or `Authorization: Bearer` ([`queue`]);
//! * `POST /admin/review/label` — `{"record_id", "label": "risk"|"ok", "note"?}`, with the
//!   session, its CSRF token and a same-origin `Origin` ([`session`] says the model).

mod handlers;
pub mod page;
pub mod queue;
pub mod session;

use crate::error::ApiError;
use crate::gateway::Gateway;
use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use std::sync::Arc;

/// What the console needs of the listener it is served on.
pub struct Context<'a> {
    pub gateway: &'a Arc<Gateway>,
    /// `[admin] token`.
    pub token: Option<&'a str>,
    /// `[server] max_body_bytes`: the most a login or label body may be.
    pub max_body_bytes: usize,
}

/// Whether `path` is one of the console's (they carry their own authentication: a session
/// cookie or the bearer token, see [`session`]).
pub fn handles(path: &str) -> bool {
    path == "/admin/console" || path.starts_with("/admin/console/") || path.starts_with("/admin/review/")
}

/// Serves one of the console's routes. Errors: 401 without a session or the bearer token (the
/// page answers with the login form instead), 403 for a state change without the session's
/// CSRF token or from another origin, 404 without the audit trail, 405, 422 naming a bad field.
pub async fn serve(cx: Context<'_>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let not_allowed =
        |allowed: &'static str| ApiError::MethodNotAllowed { method: method.to_string(), path: path.clone(), allowed };
    match path.as_str() {
        "/admin/console" => match method {
            Method::GET | Method::HEAD => Ok(handlers::page(&cx, &req)),
            _ => Err(not_allowed("GET, HEAD")),
        },
        "/admin/console/login" => match method {
            Method::POST => handlers::login(&cx, req).await,
            _ => Err(not_allowed("POST")),
        },
        "/admin/console/logout" => match method {
            Method::POST => handlers::logout(&cx, &req),
            _ => Err(not_allowed("POST")),
        },
        "/admin/review/queue" | "/admin/review/item" | "/admin/review/quality" => match method {
            Method::GET => handlers::read(&cx, &req).await,
            _ => Err(not_allowed("GET")),
        },
        "/admin/review/label" => match method {
            Method::POST => handlers::label(&cx, req).await,
            _ => Err(not_allowed("POST")),
        },
        _ => Err(ApiError::NotFound { path }),
    }
}
