//! Errors, and the one place that maps them to HTTP responses.
//!
//! Client-facing problems are [`ApiError`]; every response body for an error is
//! `{"error": {"code", "message", "field"?}}`. Tier failures (`tier::TierError`) never reach
//! the client: the cascade records them in the decision's `path` and moves to the next
//! stage (the rules engine never fails). This module depends on nothing else in the crate, so
//! every layer can use it.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde_json::json;

/// A request tiergate refuses, or cannot serve. Each variant maps to exactly one status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not JSON at all.
    #[error("request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// 400: the body could not be read (client reset, broken chunking).
    #[error("request body could not be read: {0}")]
    BodyRead(String),
    /// 413: body over `server.max_body_bytes`.
    #[error("request body must be at most {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// 415: anything but `application/json`.
    #[error("content-type must be application/json, got `{got}`")]
    UnsupportedMediaType { got: String },
    /// 415: a content coding (`content-encoding: gzip`, ...) on a body tiergate must read: it
    /// reads bodies as sent (RFC 9110 §15.5.16 names 415 for an unsupported coding).
    #[error("content-encoding `{got}` is not supported; send the body unencoded")]
    UnsupportedEncoding { got: String },
    /// 422: the JSON is well-formed but a field is missing, of the wrong type or out of range.
    #[error("{message}")]
    InvalidField { field: String, message: String },
    /// 422: the request names a policy scenario the live policy does not define; the body's
    /// `error.known` lists those it does.
    #[error("unknown scenario `{name}`; known: {}", known.join(", "))]
    UnknownScenario { name: String, known: Vec<String> },
    /// 404
    #[error("no route for {path}")]
    NotFound { path: String },
    /// 404: a label (`POST /v1/feedback`) names a decision record that is not here: never made,
    /// past retention, another tenant's, or a shadow record. `field`: `record_id` or `request_id`.
    #[error("no decision record with {field} `{id}` (unknown, or past the audit trail's retention)")]
    UnknownRecord { field: &'static str, id: String },
    /// 405
    #[error("method {method} is not allowed on {path}; allowed: {allowed}")]
    MethodNotAllowed { method: String, path: String, allowed: &'static str },
    /// 429: the tenant is over a limit of its class. `tenant`: a known tenant or `other` (every
    /// unknown tenant shares one limit); `limit`: the limit's stable name (`rate`,
    /// `quota_store_unavailable`), also the body's `error.limit`; `detail`: its setting in words.
    #[error("tenant `{tenant}` is over its {limit} limit ({detail}); retry in {retry_after_s} s")]
    RateLimited { tenant: String, limit: &'static str, detail: String, retry_after_s: u64 },
    /// 503: both model tiers are saturated and the policy says to shed.
    #[error("overloaded: {reason}; retry in {retry_after_s} s")]
    Shed { reason: String, retry_after_s: u64 },
    /// 401: `/admin/*` without the right bearer token.
    #[error("admin routes need `Authorization: Bearer <token>`")]
    Unauthorized,
    /// 401: a public-listener route that only a tenant authenticated by its API key may use.
    #[error("this route needs a tenant's API key (`x-api-key`, `[tenants.api_keys]`)")]
    NoApiKey,
    /// 403: a state-changing request of the review console without its session's CSRF token,
    /// or from another origin; `reason` says which.
    #[error("{reason}")]
    Forbidden { reason: String },
    /// 422: a policy reload was refused; the last good policy keeps serving.
    #[error("policy refused, the last good policy keeps serving: {} problem(s)", problems.len())]
    PolicyInvalid { problems: Vec<String> },
    /// 408: the whole request ran past `server.request_timeout_ms` (in practice a client that
    /// sends its body too slowly or not at all: deciding is bounded by the far shorter deadline).
    #[error("request did not complete within {timeout_ms} ms; was the body sent in full?")]
    Timeout { timeout_ms: u64 },
    /// 400: message framing that request smuggling relies on: `Content-Length` together with
    /// `Transfer-Encoding`, or more than one `Content-Length` (RFC 9112 §6.3).
    #[error("ambiguous message framing: {0}")]
    BadFraming(String),
    /// 400: a request target or `Host` that routes could read differently from the app: an
    /// encoded `/` in the path, a literal `\` or `;` in it, broken percent-encoding, several
    /// `Host` headers, none in HTTP/1.1.
    #[error("bad request target: {0}")]
    BadTarget(String),
    /// 400: an identity header (an API key, the trusted tenant header, the tenant claim) sent
    /// more than once: tiergate would read one line and the app might read another, so the
    /// request is refused rather than interpreted. `header` is its name, also `error.field`.
    #[error("header `{header}` appears {count} times; an identity header must be sent once")]
    RepeatedHeader { header: String, count: usize },
    /// 501: a transfer coding other than `chunked` (RFC 9112 §6.1).
    #[error("{0} is not implemented; send the body unencoded or chunked")]
    NotImplemented(String),
    /// 403: a screened route's decision blocks the request; the body carries the decision
    /// (serialised by the caller, which owns the decision type).
    #[error("{message}")]
    Blocked { message: String, decision: Box<serde_json::Value> },
    /// 403: a route with `refuse = true` matched: this path is not screened on this proxy, so it
    /// is not forwarded at all.
    #[error("{method} {path} is not screened by this proxy (route `{route}` refuses it); send it to a screened path")]
    Unscreened { route: String, method: String, path: String },
    /// 502: the app could not be reached or did not answer properly.
    #[error("upstream of route `{route}` failed: {reason}")]
    BadGateway { route: String, reason: String },
    /// 504: the app sent no response head within the route's `response_header_timeout_ms`.
    #[error("upstream of route `{route}` sent no response within {timeout_ms} ms")]
    GatewayTimeout { route: String, timeout_ms: u64 },
    /// 500: a bug; logged with the request id.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidField { field: field.into(), message: message.into() }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MalformedJson(_)
            | ApiError::BodyRead(_)
            | ApiError::BadFraming(_)
            | ApiError::BadTarget(_)
            | ApiError::RepeatedHeader { .. } => StatusCode::BAD_REQUEST,
            ApiError::Blocked { .. } | ApiError::Unscreened { .. } | ApiError::Forbidden { .. } => {
                StatusCode::FORBIDDEN
            }
            ApiError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            ApiError::BadGateway { .. } => StatusCode::BAD_GATEWAY,
            ApiError::GatewayTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType { .. } | ApiError::UnsupportedEncoding { .. } => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            ApiError::InvalidField { .. } | ApiError::PolicyInvalid { .. } | ApiError::UnknownScenario { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::Unauthorized | ApiError::NoApiKey => StatusCode::UNAUTHORIZED,
            ApiError::NotFound { .. } | ApiError::UnknownRecord { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Shed { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Stable machine-readable code for the `error.code` field.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::MalformedJson(_) => "malformed_json",
            ApiError::BodyRead(_) => "body_unreadable",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::UnsupportedMediaType { .. } => "unsupported_media_type",
            ApiError::UnsupportedEncoding { .. } => "unsupported_content_encoding",
            ApiError::InvalidField { .. } => "invalid_field",
            ApiError::UnknownScenario { .. } => "unknown_scenario",
            ApiError::NotFound { .. } => "not_found",
            ApiError::UnknownRecord { .. } => "unknown_record",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Unauthorized | ApiError::NoApiKey => "unauthorized",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::PolicyInvalid { .. } => "policy_invalid",
            ApiError::Shed { .. } => "overloaded",
            ApiError::Timeout { .. } => "request_timeout",
            ApiError::BadFraming(_) => "bad_framing",
            ApiError::BadTarget(_) => "bad_request_target",
            ApiError::RepeatedHeader { .. } => "repeated_header",
            ApiError::Blocked { .. } => "blocked",
            ApiError::Unscreened { .. } => "unscreened_path_refused",
            ApiError::NotImplemented(_) => "not_implemented",
            ApiError::BadGateway { .. } => "bad_gateway",
            ApiError::GatewayTimeout { .. } => "upstream_timeout",
            ApiError::Internal(_) => "internal",
        }
    }

    fn field(&self) -> Option<&str> {
        match self {
            ApiError::InvalidField { field, .. } => Some(field),
            ApiError::PayloadTooLarge { .. } => Some("body"),
            ApiError::UnsupportedMediaType { .. } => Some("content-type"),
            ApiError::UnsupportedEncoding { .. } => Some("content-encoding"),
            ApiError::RateLimited { .. } => Some("tenant"),
            ApiError::UnknownScenario { .. } => Some("scenario"),
            ApiError::RepeatedHeader { header, .. } => Some(header),
            ApiError::UnknownRecord { field, .. } => Some(field),
            _ => None,
        }
    }

    /// Whether a route with `on_error = "open"` may forward a request that screening failed
    /// with this error, unscreened. Only when tiergate's own infrastructure could not screen it
    /// (no model capacity under `when_saturated = "shed"`, a bug): that is what fail-open is
    /// for, availability when tiergate itself is down. Never for what the client controls (its
    /// body, size, JSON, headers, its own rate or budget): forwarding those would let any client
    /// skip screening by sending a bad request on purpose (text over the limit carrying the
    /// payload past the screen). Never for `quota_store_unavailable` either, although a shared
    /// store down is infrastructure: that 429 is the decision the operator configured for an
    /// outage (`[tenants.redis] on_outage = "closed"`: no request passes unmetered), and
    /// `on_outage = "local"` or `"open"` is the setting that admits requests during an outage,
    /// screened; failing open here would turn "closed" into "open and unscreened", less than
    /// either. The match names every variant, so a new error must be placed here.
    pub fn may_fail_open(&self) -> bool {
        match self {
            ApiError::Shed { .. } | ApiError::Internal(_) => true,
            ApiError::RateLimited { .. } => false,
            ApiError::MalformedJson(_)
            | ApiError::BodyRead(_)
            | ApiError::PayloadTooLarge { .. }
            | ApiError::UnsupportedMediaType { .. }
            | ApiError::UnsupportedEncoding { .. }
            | ApiError::InvalidField { .. }
            | ApiError::UnknownScenario { .. }
            | ApiError::Timeout { .. }
            | ApiError::BadFraming(_)
            | ApiError::BadTarget(_)
            | ApiError::RepeatedHeader { .. }
            | ApiError::NotImplemented(_) => false,
            // Not outcomes of screening: refused whatever the mode.
            ApiError::NotFound { .. }
            | ApiError::UnknownRecord { .. }
            | ApiError::MethodNotAllowed { .. }
            | ApiError::Unauthorized
            | ApiError::NoApiKey
            | ApiError::Forbidden { .. }
            | ApiError::PolicyInvalid { .. }
            | ApiError::Blocked { .. }
            | ApiError::Unscreened { .. }
            | ApiError::BadGateway { .. }
            | ApiError::GatewayTimeout { .. } => false,
        }
    }

    /// The response for this error: status, JSON body, `Allow` for 405, `Retry-After` for 429/503.
    pub fn into_response(self) -> Response<Full<Bytes>> {
        let mut error = json!({ "code": self.code(), "message": self.to_string() });
        if let Some(field) = self.field() {
            error["field"] = json!(field);
        }
        if let ApiError::PolicyInvalid { problems } = &self {
            error["problems"] = json!(problems);
        }
        if let ApiError::RateLimited { limit, .. } = &self {
            error["limit"] = json!(limit);
        }
        if let ApiError::UnknownScenario { known, .. } = &self {
            error["known"] = json!(known);
        }
        let mut body = json!({ "error": error });
        if let ApiError::Blocked { decision, .. } = &self {
            body["decision"] = (**decision).clone();
        }
        let mut response = json_response(self.status(), &body);
        match self {
            ApiError::MethodNotAllowed { allowed, .. } => {
                response.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allowed));
            }
            ApiError::RateLimited { retry_after_s, .. } | ApiError::Shed { retry_after_s, .. } => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            }
            _ => {}
        }
        response
    }
}

/// A JSON response with the given status.
pub fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    // Serialising our own types cannot fail (no maps with non-string keys, no foreign Serialize impls).
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An error and its sources, `a: b: c` (hyper's own messages say little without their cause).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The JSON type of `v` with its article ("a number", "null"), for an error message naming
/// what a field held instead of what it needs.
pub fn json_type(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fail-open is for tiergate's own faults only: one of each variant, with who controls it.
    #[test]
    fn only_tiergates_own_faults_may_fail_open() {
        let rate = |limit| ApiError::RateLimited { tenant: "t".into(), limit, detail: String::new(), retry_after_s: 1 };
        let client = [
            ApiError::MalformedJson("duplicate key `text`".into()),
            ApiError::BodyRead("reset".into()),
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::UnsupportedMediaType { got: "text/plain".into() },
            ApiError::UnsupportedEncoding { got: "gzip".into() },
            ApiError::invalid("text", "`text` must be at most 1 bytes"),
            ApiError::invalid("x-client-tenant", "must be ASCII"),
            ApiError::UnknownScenario { name: "x".into(), known: vec![] },
            ApiError::Timeout { timeout_ms: 1 },
            ApiError::BadFraming("two lengths".into()),
            ApiError::BadTarget("`;`".into()),
            ApiError::RepeatedHeader { header: "x-api-key".into(), count: 2 },
            ApiError::NotImplemented("gzip".into()),
            rate("rate"),
            rate("gpu_daily_budget"),
            // Infrastructure, but the operator's chosen outage behaviour: see `may_fail_open`.
            rate("quota_store_unavailable"),
        ];
        for e in &client {
            assert!(!e.may_fail_open(), "{e:?} is the client's doing (or a configured refusal)");
        }
        let own = [
            ApiError::Shed { reason: "both model tiers saturated".into(), retry_after_s: 1 },
            ApiError::Internal("bug".into()),
        ];
        for e in &own {
            assert!(e.may_fail_open(), "{e:?} is tiergate's own fault");
        }
        let e = ApiError::RepeatedHeader { header: "x-api-key".into(), count: 2 };
        assert_eq!((e.status(), e.code(), e.field()), (StatusCode::BAD_REQUEST, "repeated_header", Some("x-api-key")));
    }
}
