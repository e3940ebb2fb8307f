//! Header names tiergate reads and writes. Every `x-tiergate-*` header a client sends is removed
//! before a request reaches an app (see `proxy::headers::strip_forged`), so an app can trust them.
//! RFC 6648 discourages `X-` for new standards; these are private to a deployment and follow the
//! `x-request-id` convention.

/// The request's id: echoed, generated when absent or unusable ([`client_request_id`]), passed
/// to the app.
pub const REQUEST_ID: &str = "x-request-id";

/// Longest client `x-request-id` kept, bytes (a UUID is 36; W3C trace ids 55). The id reaches
/// logs, decisions and the app, so a longer one, or one with anything but visible ASCII, is
/// replaced by a generated id rather than copied.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// The client's request id when it is usable: 1..=[`MAX_REQUEST_ID_BYTES`] bytes of visible
/// ASCII (no spaces or control characters).
pub fn client_request_id(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= MAX_REQUEST_ID_BYTES && id.bytes().all(|b| b.is_ascii_graphic()))
}

/// Removes an unusable client request id ([`client_request_id`]), so that one is generated in
/// its place.
pub fn drop_unusable_request_id<B>(mut req: http::Request<B>) -> http::Request<B> {
    if req.headers().contains_key(REQUEST_ID) && client_request_id(req.headers()).is_none() {
        req.headers_mut().remove(REQUEST_ID);
    }
    req
}
/// A per-request deadline in milliseconds (`/v1/classify`).
pub const DEADLINE: &str = "x-tiergate-deadline-ms";
/// The tenant the request claims, when the body does not name one; counted only under
/// `[tenants] accept_claimed = true` (see `crate::tenant::identity`).
pub const TENANT: &str = crate::tenant::config::CLAIM_HEADER;
/// The policy scenario (`[scenarios.NAME]`) of a `/v1/classify` request, when the body names none.
pub const SCENARIO: &str = "x-tiergate-scenario";
/// The prefix of every header tiergate sets on a screened request.
pub const PREFIX: &str = "x-tiergate-";

/// The decision headers an app receives.
pub const ACTION: &str = "x-tiergate-action";
pub const RISK_SCORE: &str = "x-tiergate-risk-score";
pub const TIER: &str = "x-tiergate-tier";
pub const POLICY_VERSION: &str = "x-tiergate-policy-version";
pub const RULE: &str = "x-tiergate-rule";
/// The decision's audit record id, when the audit trail is on: what the app names it by in a
/// label (`POST /v1/feedback`).
pub const RECORD_ID: &str = "x-tiergate-record-id";
/// `true` when rules decided because no model tier had capacity (absent otherwise).
pub const OVERLOADED: &str = "x-tiergate-overloaded";
/// Why a fail-open route forwarded a request unscreened.
pub const SCREEN_ERROR: &str = "x-tiergate-screen-error";
