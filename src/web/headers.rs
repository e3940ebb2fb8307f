//! Header names tiergate reads and writes. Every `x-tiergate-*` header a client sends is removed
//! before a request reaches an app (see `proxy::headers::strip_forged`), so an app can trust them.
//! RFC 6648 discourages `X-` for new standards; these are private to a deployment and follow the
//! `x-request-id` convention.

/// The request's id: echoed, generated when absent, passed to the app.
pub const REQUEST_ID: &str = "x-request-id";
/// A per-request deadline in milliseconds (`/v1/classify`).
pub const DEADLINE: &str = "x-tiergate-deadline-ms";
/// The tenant, when the body does not name one.
pub const TENANT: &str = "x-tiergate-tenant";
/// The prefix of every header tiergate sets on a screened request.
pub const PREFIX: &str = "x-tiergate-";

/// The decision headers an app receives.
pub const ACTION: &str = "x-tiergate-action";
pub const RISK_SCORE: &str = "x-tiergate-risk-score";
pub const TIER: &str = "x-tiergate-tier";
pub const POLICY_VERSION: &str = "x-tiergate-policy-version";
pub const RULE: &str = "x-tiergate-rule";
/// Why a fail-open route forwarded a request unscreened.
pub const SCREEN_ERROR: &str = "x-tiergate-screen-error";
