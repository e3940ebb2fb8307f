//! `[proxy]` and `[[routes]]`: tiergate as a reverse proxy in front of apps.

use crate::policy::Action;
use serde::Deserialize;
use std::collections::BTreeMap;

/// `[proxy]`: settings of the upstream client, shared by every route.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// TCP connect timeout to an app, ms (502 after, or a retry on another address).
    pub connect_timeout_ms: u64,
    /// Idle keep-alive connections to apps are closed after this long, ms.
    pub pool_idle_timeout_ms: u64,
    /// Most idle keep-alive connections kept per app address, per runtime thread (each thread
    /// forwards through its own pool: [`crate::proxy::Proxy`]).
    pub pool_max_idle_per_host: usize,
    /// Pseudonym added to `Via` (RFC 9110 §7.6.3); empty: no `Via` header is added.
    pub via: String,
    /// Consecutive failures (connect errors, timeouts, 502/503/504) that eject an app address.
    pub eject_after_failures: u32,
    /// How long an ejected address stays out before it gets a probe request again, ms.
    pub eject_ms: u64,
    /// Below this share of a route's addresses in service, the route balances over all of them,
    /// ejected ones included (panic mode, as Envoy's `healthy_panic_threshold`); 0 turns it off.
    pub panic_threshold: f64,
    /// Keep the client's `X-Forwarded-Proto` / `-Host` (set it when tiergate sits behind a
    /// trusted proxy such as a TLS terminator); otherwise tiergate sets them itself.
    pub trust_forwarded_headers: bool,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            connect_timeout_ms: 1000,
            pool_idle_timeout_ms: 90_000,
            pool_max_idle_per_host: 64,
            via: "tiergate".into(),
            eject_after_failures: 5,
            eject_ms: 5000,
            panic_threshold: 0.5,
            trust_forwarded_headers: false,
        }
    }
}

/// One `[[routes]]` entry: what it matches, where it forwards, how it screens.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Route name, in metrics and logs.
    pub name: String,
    /// Host (or `:authority`) to match, port ignored, case-insensitive; absent: any host.
    #[serde(default)]
    pub host: Option<String>,
    /// Path prefix to match at a segment boundary (`/v1` matches `/v1` and `/v1/x`, not `/v10`).
    #[serde(default)]
    pub path_prefix: Option<String>,
    /// Regex the whole path must match (anchored); exclusive with `path_prefix`.
    #[serde(default)]
    pub path: Option<String>,
    /// Methods to match; empty: every method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// App base URLs (`http://host:port`), balanced by P2C over peak EWMA; empty (or absent) only
    /// on a refusing route.
    #[serde(default)]
    pub upstream: Vec<String>,
    /// Answer every matching request 403 `unscreened_path_refused` and forward nothing: for a
    /// path family that must not reach the app unscreened (an app's alias and future model
    /// endpoints), placed after the routes that screen. Excludes `upstream`, `screen` and
    /// `stream_guard`.
    #[serde(default)]
    pub refuse: bool,
    /// Speak HTTP/2 (prior knowledge, h2c) to the app instead of HTTP/1.1.
    #[serde(default)]
    pub http2: bool,
    /// `Host` sent to the app: `preserve` (the client's), `upstream` (the app address), or a literal.
    #[serde(default = "default_host_header")]
    pub host_header: String,
    /// Time from sending the request until the app's response head arrives, ms (504 after).
    #[serde(default = "default_response_header_timeout_ms")]
    pub response_header_timeout_ms: u64,
    /// Longest time from the request's arrival until the app's response head is back, ms:
    /// screening, the upload (however steadily it trickles) and the app's wait together; 408
    /// `request_timeout` after. The response body is bounded by `body_idle_timeout_ms` instead.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Longest silence inside a streamed response body, ms; the body ends with an error after.
    #[serde(default = "default_body_idle_timeout_ms")]
    pub body_idle_timeout_ms: u64,
    /// Extra attempts on another address, only for requests that never reached an app (the
    /// connection could not be opened: any method) and whose body can be sent again.
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// Screen requests before forwarding; absent: pass straight through.
    #[serde(default)]
    pub screen: Option<ScreenConfig>,
    /// Screen what the app streams back.
    #[serde(default)]
    pub stream_guard: Option<StreamGuardConfig>,
}

fn default_host_header() -> String {
    "preserve".into()
}
fn default_response_header_timeout_ms() -> u64 {
    30_000
}
fn default_request_timeout_ms() -> u64 {
    300_000
}
fn default_body_idle_timeout_ms() -> u64 {
    60_000
}
fn default_retries() -> u32 {
    1
}

/// `[routes.screen]`: where the text and features come from and what each action does.
///
/// A *source* is a JSON pointer into the request body (RFC 6901, plus `-1` for an array's last
/// element), `header:NAME` or `query:NAME`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScreenConfig {
    /// Sources of the text; those present are joined by newlines.
    pub text: Vec<String>,
    /// Feature name -> source; a missing source leaves the feature out.
    #[serde(default)]
    pub features: BTreeMap<String, String>,
    /// Source of the tenant the request claims (absent: the `x-tiergate-tenant` header); a claim
    /// counts only under `[tenants] accept_claimed = true`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The tenant every request on this route is for (a tenant in `[tenants.known]`); an API
    /// key or the trusted header still takes precedence.
    #[serde(default)]
    pub tenant_name: Option<String>,
    /// Largest body read for screening, bytes.
    #[serde(default = "default_screen_body")]
    pub max_body_bytes: usize,
    /// When screening cannot run: `closed` answers the error; `open` forwards the request
    /// unscreened when tiergate's own infrastructure failed (no model capacity under
    /// `when_saturated = "shed"`, an internal error) and answers the error for everything the
    /// client controls (body unreadable, over the limit, not JSON, a repeated key, no text, a
    /// bad tenant or repeated identity header, its own rate limit) and for
    /// `quota_store_unavailable` (see `ApiError::may_fail_open`).
    #[serde(default)]
    pub on_error: FailMode,
    /// What `review` does: `forward` (with the decision headers) or `block`.
    #[serde(default = "forward")]
    pub on_review: Disposition,
    /// What `block` does: `block` (403 with the decision), or `forward` (monitor mode).
    #[serde(default = "block")]
    pub on_block: Disposition,
    /// What a decision made by rules because the model tiers were out of capacity
    /// (`overloaded` in the decision) does: `forward` it with its action, or `shed` the request
    /// with 503 and `Retry-After` (the client retries; the app never sees a request no model
    /// judged). A `block` is blocked either way.
    #[serde(default)]
    pub on_overload: OverloadMode,
    /// Decision budget, ms; absent: `server.default_deadline_ms`.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Policy directory for this route (its own thresholds, cascade and rules; watched and
    /// reloaded like `policies.dir`); absent: the live policy.
    #[serde(default)]
    pub policy: Option<std::path::PathBuf>,
}

fn default_screen_body() -> usize {
    64 * 1024
}
fn forward() -> Disposition {
    Disposition::Forward
}
fn block() -> Disposition {
    Disposition::Block
}

/// What a route does when screening cannot run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    /// Refuse the request (the error's own status: 413, 415, 422, 429, 503 ...).
    #[default]
    Closed,
    /// Forward it unscreened, marked `x-tiergate-action: unscreened`, when tiergate itself
    /// failed; refuse what the client controls, as `Closed` does.
    Open,
}

/// What a route does with a decision made under overload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverloadMode {
    /// Forward it with the rules' action, as any decision.
    #[default]
    Forward,
    /// Answer 503 with `Retry-After`.
    Shed,
}

/// What happens to a request given an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    Forward,
    Block,
}

/// `[routes.stream_guard]`: the policy's rules over a streamed response, as it flows. The policy
/// is the route's `screen.policy` when it has one, else the live policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamGuardConfig {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Text is held back until a sentence ends or this long has passed, then evaluated, ms.
    #[serde(default = "default_buffer_ms")]
    pub buffer_ms: u64,
    /// Actions that end the stream.
    #[serde(default = "default_cut_on")]
    pub cut_on: Vec<Action>,
    /// The rules see at most this many trailing bytes of the generated text.
    #[serde(default = "default_window")]
    pub window_bytes: usize,
    /// Most bytes held back before an evaluation is forced (as when `buffer_ms` is up), so a
    /// fast app cannot make the guard buffer without bound within `buffer_ms`; an incomplete
    /// SSE event is held whole up to 64 KiB besides.
    #[serde(default = "default_max_held")]
    pub max_held_bytes: usize,
}

fn yes() -> bool {
    true
}
fn default_buffer_ms() -> u64 {
    300
}
fn default_cut_on() -> Vec<Action> {
    vec![Action::Block]
}
fn default_window() -> usize {
    4096
}
fn default_max_held() -> usize {
    64 * 1024
}
