//! Span attribute names: OpenTelemetry's semantic conventions where the field has a name
//! (HTTP, server, URL: <https://opentelemetry.io/docs/specs/semconv/http/http-spans/>),
//! `tiergate.*` where it does not. Span names are the stages' (`admission`, `canonical`,
//! `tier cpu`, `tier gpu`, `rules`, `guards`, `record`, `app`).

// HTTP semantic conventions (stable).
/// HTTP method, e.g. `POST`.
pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
/// The response's status code (int).
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
/// The matched route template: tiergate's endpoint path or the proxy route's name.
pub const HTTP_ROUTE: &str = "http.route";
/// The request target's path.
pub const URL_PATH: &str = "url.path";
/// `http` (tiergate's listeners speak plain HTTP).
pub const URL_SCHEME: &str = "url.scheme";
/// The full URL of a request tiergate sends (client spans).
pub const URL_FULL: &str = "url.full";
/// The peer a client span talks to, host and port.
pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
/// The client's address (the connection's peer).
pub const CLIENT_ADDRESS: &str = "client.address";
/// `1.1` or `2`.
pub const NETWORK_PROTOCOL_VERSION: &str = "network.protocol.version";
/// Error class of a failed operation (semantic conventions' `error.type`).
pub const ERROR_TYPE: &str = "error.type";

// The decision, on the root span.
/// The request id (`x-request-id`).
pub const REQUEST_ID: &str = "tiergate.request_id";
/// The policy version (content hash) that decided.
pub const POLICY_VERSION: &str = "tiergate.policy_version";
/// `allow`, `review` or `block`.
pub const ACTION: &str = "tiergate.action";
/// The stage whose verdict stands (`cpu`, `gpu`, `rules`, `guard`): on the root span; on a
/// tier span, the tier it is.
pub const TIER: &str = "tiergate.tier";
/// Why an unsampled trace was exported: `blocked`, `error`, `deadline`.
pub const TRACE_KEPT: &str = "tiergate.trace.kept";
pub const KEPT_BLOCKED: &str = "blocked";
pub const KEPT_ERROR: &str = "error";
pub const KEPT_DEADLINE: &str = "deadline";

// Stages.
/// How a stage ended (`accepted`, `low_confidence`, `timeout`, `matched`, ...).
pub const OUTCOME: &str = "tiergate.outcome";
/// Why it ended so, in words (routing's reason; never message text).
pub const REASON: &str = "tiergate.reason";
/// Calibrated probability of risk from a model tier, or the rule's declared score.
pub const RISK_SCORE: &str = "tiergate.risk_score";
/// Calibrated probability of the model's label.
pub const CONFIDENCE: &str = "tiergate.confidence";
/// The cpu model's out-of-distribution score.
pub const OOD_SCORE: &str = "tiergate.ood_score";
/// The window of a long text that decided (index, int).
pub const WINDOW: &str = "tiergate.window";
/// The model server that answered (gpu tier, upstream backend).
pub const ENDPOINT: &str = "tiergate.endpoint";
/// Time in the stage as the request saw it, µs (int).
pub const LATENCY_US: &str = "tiergate.latency_us";
/// true on a model tier's span whose verdict came from the verdict cache (`[cache]`).
pub const CACHED: &str = "tiergate.cached";
/// The rule (rules stage) or guard/allow-list rule ids that matched.
pub const RULE: &str = "tiergate.rule";
/// The tenant's label (`[tenants]`).
pub const TENANT: &str = "tiergate.tenant";
/// The canonical text's language, ISO 639-3 (`und` when unreliable).
pub const LANGUAGE: &str = "tiergate.language";
/// The screened text's length, Unicode scalar values (int): its size, never its content.
pub const TEXT_CHARS: &str = "tiergate.text.chars";
/// The complexity score routing started from.
pub const COMPLEXITY: &str = "tiergate.complexity";
/// The proxy route that handled the request.
pub const ROUTE: &str = "tiergate.route";
/// The audit record was queued (bool).
pub const AUDITED: &str = "tiergate.audited";
