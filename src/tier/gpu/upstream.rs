//! The gpu tier's `upstream` backend: a pool of local OpenAI-compatible model servers
//! (vLLM, TGI, llama.cpp server, SGLang) asked to classify one text per call.
//!
//! What the pool does, in the order a call sees it:
//!
//! 1. **pick** an endpoint by power of two choices over a peak-sensitive EWMA of latency
//!    ([`UpstreamPool::classify`], see `Ewma` for the cost), among endpoints that are
//!    healthy and not ejected;
//! 2. **ask** it: `POST {base}/v1/chat/completions` with the policy's [`PromptSpec`],
//!    `temperature: 0` and `logprobs: true`, until the caller's deadline;
//! 3. **read** the answer (a JSON `{"label", "confidence"}` or a bare label word) and turn it
//!    into a [`ModelVerdict`] (see [`parse_completion`] for where the probability comes from);
//! 4. **record** the outcome: latency into the EWMA, failures into the endpoint's consecutive
//!    failure count, which ejects the endpoint after `eject_after_failures`.
//!
//! Beside the calls, one task per endpoint runs active health checks (and scrapes vLLM's
//! Prometheus `/metrics` for KV-cache usage when configured); a health check re-admits an
//! ejected endpoint once `eject_ms` has passed (outlier ejection with re-admission, as in
//! pingora's health checks and Envoy's outlier detection). The tasks stop when the pool is
//! dropped.
//!
//! There are no retries here on purpose: the caller's cascade falls back to the rules engine,
//! which never waits, and a retry would spend the deadline that fallback needs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::balance::{Balancer, BalancerConfig, MemberStatus, Readmit};
use crate::error::{error_chain, TierError};
use crate::tier::ModelVerdict;

/// Largest response body read from a model server (answers are a few hundred bytes; vLLM's
/// `/metrics` is a few hundred KiB). Anything longer is a failure, never an allocation.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// The OpenAI chat-completions path, appended to each endpoint's base URL.
const CHAT_PATH: &str = "/v1/chat/completions";

/// Static configuration of the pool (`[gpu.upstream]` in the config file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Base URLs, e.g. `http://127.0.0.1:8000` (plain HTTP: these are local servers).
    pub endpoints: Vec<String>,
    /// Model name sent in each request (vLLM and SGLang check it; llama.cpp ignores it).
    pub model: String,
    /// Health path; vLLM, TGI and llama.cpp server all serve `/health`.
    pub health_path: String,
    /// Interval of the active health checks, per endpoint.
    pub health_interval_ms: u64,
    /// Prometheus text to scrape for vLLM's KV-cache usage (`vllm:gpu_cache_usage_perc` or
    /// `vllm:kv_cache_usage_perc`, 0..1) and waiting queue (`vllm:num_requests_waiting`),
    /// e.g. `/metrics`. `None`: no scraping, no headroom.
    pub metrics_path: Option<String>,
    /// Consecutive failures (requests or health checks) that eject an endpoint.
    pub eject_after_failures: u32,
    /// How long an ejected endpoint stays out before a passing health check may re-admit it.
    pub eject_ms: u64,
    /// TCP connect timeout.
    pub connect_timeout_ms: u64,
    /// Time constant of the latency EWMA (linkerd's PeakEWMA decays in time, not in samples).
    pub ewma_decay_ms: u64,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            endpoints: Vec::new(),
            model: String::new(),
            health_path: "/health".into(),
            health_interval_ms: 2000,
            metrics_path: None,
            eject_after_failures: 3,
            eject_ms: 5000,
            connect_timeout_ms: 500,
            ewma_decay_ms: 10_000,
        }
    }
}

impl UpstreamConfig {
    /// Checks what [`UpstreamPool::start`] needs; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("`endpoints` must list at least one base URL".into());
        }
        for url in &self.endpoints {
            EndpointUris::parse(url, &self.health_path, self.metrics_path.as_deref())?;
        }
        if self.model.trim().is_empty() {
            return Err("`model` must not be empty".into());
        }
        for (field, value) in [
            ("health_interval_ms", self.health_interval_ms),
            ("eject_after_failures", u64::from(self.eject_after_failures)),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("ewma_decay_ms", self.ewma_decay_ms),
        ] {
            if value == 0 {
                return Err(format!("`{field}` must be at least 1"));
            }
        }
        Ok(())
    }
}

/// How to ask the model; lives in the routing policy (hot-reloaded) and is passed per call.
#[derive(Debug, Clone, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSpec {
    /// The system message.
    pub system: String,
    /// The user message; `{text}` is replaced by the text to classify.
    pub user: String,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// The label the model states for risky text.
    #[serde(default = "default_risk_label")]
    pub risk_label: String,
    /// The label the model states for benign text.
    #[serde(default = "default_ok_label")]
    pub ok_label: String,
}

fn default_max_tokens() -> u32 {
    16
}
fn default_risk_label() -> String {
    "risk".into()
}
fn default_ok_label() -> String {
    "ok".into()
}

impl PromptSpec {
    /// `{text}` present in `user`, labels non-empty and different (compared as the answer
    /// parser compares them: trimmed, ASCII case-insensitive), `max_tokens` at least 1.
    pub fn validate(&self) -> Result<(), String> {
        if !self.user.contains("{text}") {
            return Err("`user` must contain `{text}`".into());
        }
        if self.max_tokens == 0 {
            return Err("`max_tokens` must be at least 1".into());
        }
        let (risk, ok) = (self.risk_label.trim(), self.ok_label.trim());
        if risk.is_empty() {
            return Err("`risk_label` must not be empty".into());
        }
        if ok.is_empty() {
            return Err("`ok_label` must not be empty".into());
        }
        if risk.eq_ignore_ascii_case(ok) {
            return Err(format!("`risk_label` and `ok_label` must differ (both are `{risk}`)"));
        }
        Ok(())
    }

    /// The request body for `text` (OpenAI chat completions).
    pub fn request_body(&self, model: &str, text: &str) -> Value {
        json!({
            "model": model,
            "messages": [
                {"role": "system", "content": self.system},
                {"role": "user", "content": self.user.replace("{text}", text)},
            ],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "logprobs": true,
            "top_logprobs": 5,
        })
    }
}

/// One endpoint as [`UpstreamPool::endpoints`] reports it (for `/admin` and tests).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointStatus {
    /// Health, ejection, latency estimate and request counts.
    #[serde(flatten)]
    pub balance: MemberStatus,
    /// From the last scrape of `metrics_path`; `None` when not scraped, absent or failed.
    pub kv_cache_usage: Option<f64>,
    pub requests_waiting: Option<f64>,
}

impl std::ops::Deref for EndpointStatus {
    type Target = MemberStatus;
    fn deref(&self) -> &MemberStatus {
        &self.balance
    }
}

/// Which probability the verdict was built from (see [`parse_completion`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbabilitySource {
    /// `exp(logprob)` of the first token of the stated label.
    Logprobs,
    /// The answer's own `confidence` field.
    Confidence,
}

/// A model server's answer, read.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCompletion {
    /// The stated label is the risk label.
    pub is_risk: bool,
    /// Probability of the stated label.
    pub probability: f64,
    pub source: ProbabilitySource,
    /// `usage.prompt_tokens`, where the server reports it.
    pub prompt_tokens: Option<usize>,
}

impl ParsedCompletion {
    /// `risk_score` is the probability of the risk label, `confidence` that of the more likely label.
    pub fn scores(&self) -> (f64, f64) {
        let risk = if self.is_risk { self.probability } else { 1.0 - self.probability };
        (risk, risk.max(1.0 - risk))
    }
}

/// Reads a chat-completions response body into a verdict.
///
/// The answer is `choices[0].message.content`: JSON `{"label": .., "confidence": ..}` (surrounding
/// whitespace, a ```` ```json ```` fence or prose around the object are tolerated) or a bare label
/// word; labels compare trimmed and ASCII case-insensitive.
///
/// The probability `p` of the stated label comes, in order of preference, from:
/// 1. **token log-probabilities** (`choices[0].logprobs.content`, which vLLM and SGLang return
///    for `logprobs: true`): the tokens are concatenated to rebuild the text, the stated label is
///    located in it (after the `"label"` key when there is one), and `p = exp(logprob)` of the
///    token that holds the label's first character. At temperature 0 that token is where the
///    model committed to the label, so its probability is the model's own belief in the label,
///    which a self-reported number is not. (Labels sharing their first token would make this
///    the probability of the shared prefix; pick labels that differ from the first character.)
/// 2. the answer's `confidence`, a number (or numeric string) in [0, 1];
/// 3. neither: an error, never a made-up 0.5.
pub fn parse_completion(body: &[u8], prompt: &PromptSpec) -> Result<ParsedCompletion, String> {
    let response: Value = serde_json::from_slice(body).map_err(|e| format!("response is not JSON: {e}"))?;
    let choice = response.pointer("/choices/0").ok_or("response has no `choices[0]`")?;
    let content = choice
        .pointer("/message/content")
        .and_then(Value::as_str)
        .ok_or("`choices[0].message.content` is missing or not a string")?;
    let answer = parse_answer(content, prompt)?;
    let prompt_tokens =
        response.pointer("/usage/prompt_tokens").and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
    let logprob_p = choice
        .pointer("/logprobs/content")
        .and_then(Value::as_array)
        .and_then(|tokens| label_token_probability(tokens, &answer.label_text));
    let (probability, source) = match (logprob_p, answer.confidence) {
        (Some(p), _) => (p, ProbabilitySource::Logprobs),
        (None, Some(Ok(c))) => (c, ProbabilitySource::Confidence),
        (None, Some(Err(e))) => return Err(e),
        (None, None) => {
            return Err(format!(
                "answer `{}` has neither token logprobs for its label nor a `confidence`",
                snippet(content)
            ))
        }
    };
    Ok(ParsedCompletion { is_risk: answer.is_risk, probability, source, prompt_tokens })
}

/// The label and confidence stated in the assistant's content.
struct Answer {
    is_risk: bool,
    /// The label as configured (what to look for in the tokens).
    label_text: String,
    /// `None`: no confidence given; `Some(Err)`: given but unusable (only fatal without logprobs).
    confidence: Option<Result<f64, String>>,
}

fn parse_answer(content: &str, prompt: &PromptSpec) -> Result<Answer, String> {
    let text = strip_fence(content.trim());
    if let Some(object) = json_object(text) {
        let label = object
            .get("label")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("answer JSON has no string `label`: `{}`", snippet(content)))?;
        let (is_risk, label_text) = match_label(label, prompt).ok_or_else(|| {
            format!("answer label `{}` is neither `{}` nor `{}`", snippet(label), prompt.risk_label, prompt.ok_label)
        })?;
        let confidence = match object.get("confidence") {
            None | Some(Value::Null) => None,
            Some(value) => {
                let number = value.as_f64().or_else(|| value.as_str().and_then(|s| s.trim().parse::<f64>().ok()));
                Some(match number {
                    Some(c) if (0.0..=1.0).contains(&c) => Ok(c),
                    _ => Err(format!(
                        "answer `confidence` must be a number in [0, 1], got `{}`",
                        snippet(&value.to_string())
                    )),
                })
            }
        };
        return Ok(Answer { is_risk, label_text, confidence });
    }
    let word = text.trim_matches(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '.' | '!'));
    match match_label(word, prompt) {
        Some((is_risk, label_text)) => Ok(Answer { is_risk, label_text, confidence: None }),
        None => Err(format!(
            "answer is neither JSON with a `label` nor a bare `{}`/`{}`: `{}`",
            prompt.risk_label,
            prompt.ok_label,
            snippet(content)
        )),
    }
}

/// Drops a Markdown code fence (```` ```json ... ``` ````) around the answer.
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else { return text };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    let rest = rest.trim();
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// The answer as a JSON object: the whole text, or the span from the first `{` to the last `}`
/// (models like to add a sentence around it).
fn json_object(text: &str) -> Option<serde_json::Map<String, Value>> {
    if let Ok(Value::Object(map)) = serde_json::from_str(text) {
        return Some(map);
    }
    let (start, end) = (text.find('{')?, text.rfind('}')?);
    if start >= end {
        return None;
    }
    match serde_json::from_str(&text[start..=end]) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

fn match_label(label: &str, prompt: &PromptSpec) -> Option<(bool, String)> {
    let label = label.trim();
    if label.eq_ignore_ascii_case(prompt.risk_label.trim()) {
        Some((true, prompt.risk_label.trim().to_string()))
    } else if label.eq_ignore_ascii_case(prompt.ok_label.trim()) {
        Some((false, prompt.ok_label.trim().to_string()))
    } else {
        None
    }
}

/// `exp(logprob)` of the token holding the first character of `label` in the rebuilt text
/// (searched after a `"label"` key when there is one). `None` when the tokens do not spell the
/// label or carry no usable logprob.
fn label_token_probability(tokens: &[Value], label: &str) -> Option<f64> {
    let mut text = String::new();
    let mut spans = Vec::with_capacity(tokens.len());
    for token in tokens {
        let piece = token.get("token").and_then(Value::as_str).unwrap_or("");
        let start = text.len();
        text.push_str(piece);
        spans.push((start, text.len()));
    }
    // ASCII lowercasing keeps byte offsets, so positions in `lower` are positions in `text`.
    let lower = text.to_ascii_lowercase();
    let from = lower.find("\"label\"").map_or(0, |key| key + "\"label\"".len());
    let at = from + lower[from..].find(&label.to_ascii_lowercase())?;
    let index = spans.iter().position(|&(start, end)| start <= at && at < end)?;
    let logprob = tokens[index].get("logprob")?.as_f64()?;
    if !logprob.is_finite() {
        // -inf (or a NaN) from a server is not a probability we can use.
        return None;
    }
    // Servers round: a logprob of 1e-7 is a probability of 1.
    Some(logprob.min(0.0).exp())
}

/// At most 120 characters of `text`, for error messages.
fn snippet(text: &str) -> String {
    const MAX: usize = 120;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// vLLM's KV-cache usage (max over series, clamped to [0, 1]) and waiting requests (sum over
/// series) from Prometheus text. Unparsable lines and non-finite values are skipped.
pub fn parse_vllm_metrics(text: &str) -> (Option<f64>, Option<f64>) {
    let (mut usage, mut waiting): (Option<f64>, Option<f64>) = (None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(name_end) = line.find(|c: char| c == '{' || c.is_whitespace()) else { continue };
        let (name, mut rest) = line.split_at(name_end);
        if rest.starts_with('{') {
            let Some(close) = rest.rfind('}') else { continue };
            rest = &rest[close + 1..];
        }
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        if !value.is_finite() {
            continue;
        }
        match name {
            "vllm:gpu_cache_usage_perc" | "vllm:kv_cache_usage_perc" => {
                let value = value.clamp(0.0, 1.0);
                usage = Some(usage.map_or(value, |u| u.max(value)));
            }
            "vllm:num_requests_waiting" => waiting = Some(waiting.unwrap_or(0.0) + value.max(0.0)),
            _ => {}
        }
    }
    (usage, waiting)
}

/// Request, health and metrics URIs of one endpoint.
struct EndpointUris {
    chat: Uri,
    health: Uri,
    metrics: Option<Uri>,
}

impl EndpointUris {
    fn parse(base: &str, health_path: &str, metrics_path: Option<&str>) -> Result<Self, String> {
        let trimmed = base.trim().trim_end_matches('/');
        let uri: Uri = trimmed.parse().map_err(|e| format!("endpoint `{base}` is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "endpoint `{base}`: scheme `{other}` is not supported (local model servers speak plain http)"
                ))
            }
            None => return Err(format!("endpoint `{base}` must start with http://")),
        }
        if uri.query().is_some() {
            return Err(format!("endpoint `{base}` must not have a query string"));
        }
        let join = |path: &str| -> Result<Uri, String> {
            let path = if path.starts_with('/') { path.to_string() } else { format!("/{path}") };
            format!("{trimmed}{path}").parse().map_err(|e| format!("endpoint `{base}` with path `{path}`: {e}"))
        };
        Ok(EndpointUris {
            chat: join(CHAT_PATH)?,
            health: join(health_path)?,
            metrics: metrics_path.map(join).transpose()?,
        })
    }
}

/// An endpoint's URIs and its last vLLM metrics scrape; its load-balancing state is in the
/// [`Balancer`] at the same index.
struct Endpoint {
    uris: EndpointUris,
    /// (KV-cache usage, requests waiting) from the last scrape.
    scraped: Mutex<(Option<f64>, Option<f64>)>,
}

impl Endpoint {
    fn scraped(&self) -> (Option<f64>, Option<f64>) {
        *self.scraped.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What the pool and its background tasks share.
struct Shared {
    endpoints: Vec<Endpoint>,
    balancer: Balancer,
    client: Client<HttpConnector, Full<Bytes>>,
    model: String,
    health_interval: Duration,
    health_timeout: Duration,
}

impl Shared {
    /// GET `uri` with a timeout; `Ok(body)` for a 2xx status.
    async fn get(&self, uri: &Uri) -> Result<Bytes, String> {
        let request = Request::get(uri.clone()).body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
        let call = async {
            let response = self.client.request(request).await.map_err(|e| error_chain(&e))?;
            let status = response.status();
            let body = read_capped(response.into_body()).await?;
            if status.is_success() {
                Ok(body)
            } else {
                Err(format!("status {status}"))
            }
        };
        tokio::time::timeout(self.health_timeout, call)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {} ms", self.health_timeout.as_millis())))
    }

    async fn check(&self, index: usize) {
        let endpoint = &self.endpoints[index];
        let url = self.balancer.url(index);
        let result = self.get(&endpoint.uris.health).await;
        if let Err(e) = &result {
            tracing::debug!(endpoint = %url, error = %e, "health check failed");
        }
        self.balancer.on_health(index, result.is_ok());
        if let Some(metrics) = &endpoint.uris.metrics {
            // A failed scrape clears the values: stale KV-cache numbers would overstate headroom.
            let (usage, waiting) = match self.get(metrics).await {
                Ok(body) => parse_vllm_metrics(&String::from_utf8_lossy(&body)),
                Err(e) => {
                    tracing::debug!(endpoint = %url, error = %e, "metrics scrape failed");
                    (None, None)
                }
            };
            *endpoint.scraped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = (usage, waiting);
        }
    }

    /// One HTTP exchange with `endpoint`; the caller bounds it by the deadline.
    async fn ask(&self, index: usize, body: Bytes, prompt: &PromptSpec) -> Result<ParsedCompletion, TierError> {
        let url = self.balancer.url(index);
        let request = Request::post(self.endpoints[index].uris.chat.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(body))
            .map_err(|e| TierError::Inference(format!("{}: cannot build request: {e}", url)))?;
        let response = self.client.request(request).await.map_err(|e| {
            let message = format!("{}: {}", url, error_chain(&e));
            if e.is_connect() {
                TierError::Unavailable(message)
            } else {
                TierError::Inference(message)
            }
        })?;
        let status = response.status();
        let bytes = read_capped(response.into_body())
            .await
            .map_err(|e| TierError::Inference(format!("{}: status {status}, {e}", url)))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err(TierError::Inference(format!("{} answered {status}: {}", url, snippet(text.trim()))));
        }
        parse_completion(&bytes, prompt).map_err(|e| TierError::Inference(format!("{}: {e}", url)))
    }
}

/// Reads a body up to [`MAX_RESPONSE_BYTES`].
async fn read_capped(body: hyper::body::Incoming) -> Result<Bytes, String> {
    match Limited::new(body, MAX_RESPONSE_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(format!("response body over {MAX_RESPONSE_BYTES} bytes"))
        }
        Err(e) => Err(format!("response body could not be read: {}", error_chain(&*e))),
    }
}

/// A pool of OpenAI-compatible model servers; see the module docs.
pub struct UpstreamPool {
    shared: Arc<Shared>,
    tasks: Vec<AbortHandle>,
}

impl std::fmt::Debug for UpstreamPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamPool").field("endpoints", &self.endpoints()).finish()
    }
}

impl Drop for UpstreamPool {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl UpstreamPool {
    /// Must be called inside a tokio runtime: spawns one health-check (and metrics-scrape) task
    /// per endpoint; they stop when the pool is dropped. Endpoints start healthy; the first
    /// checks run at once.
    pub fn start(config: &UpstreamConfig) -> anyhow::Result<Arc<UpstreamPool>> {
        config.validate().map_err(|e| anyhow::anyhow!("upstream pool: {e}"))?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| anyhow::anyhow!("upstream pool: must be started inside a tokio runtime"))?;
        let mut endpoints = Vec::with_capacity(config.endpoints.len());
        for url in &config.endpoints {
            let uris = EndpointUris::parse(url, &config.health_path, config.metrics_path.as_deref())
                .map_err(|e| anyhow::anyhow!("upstream pool: {e}"))?;
            endpoints.push(Endpoint { uris, scraped: Mutex::new((None, None)) });
        }
        let balancer = Balancer::new(
            config.endpoints.iter().map(|url| url.trim().trim_end_matches('/').to_string()),
            BalancerConfig {
                eject_after_failures: config.eject_after_failures,
                eject: Duration::from_millis(config.eject_ms),
                decay_ms: config.ewma_decay_ms as f64,
                readmit: Readmit::HealthCheck,
            },
        );
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let health_interval = Duration::from_millis(config.health_interval_ms);
        let shared = Arc::new(Shared {
            endpoints,
            balancer,
            client,
            model: config.model.clone(),
            health_interval,
            // A probe may take up to one interval (at least the connect timeout, at most 5 s).
            health_timeout: health_interval
                .max(Duration::from_millis(config.connect_timeout_ms))
                .min(Duration::from_secs(5)),
        });
        let tasks = (0..shared.endpoints.len())
            .map(|index| {
                let shared = Arc::clone(&shared);
                runtime
                    .spawn(async move {
                        let mut tick = tokio::time::interval(shared.health_interval);
                        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        loop {
                            tick.tick().await;
                            shared.check(index).await;
                        }
                    })
                    .abort_handle()
            })
            .collect();
        Ok(Arc::new(UpstreamPool { shared, tasks }))
    }

    /// One classification: pick an endpoint by P2C, `POST {base}/v1/chat/completions`, parse the
    /// verdict; give up at `deadline`.
    ///
    /// Failures count against the endpoint: connect errors (`Unavailable`), non-2xx statuses and
    /// unreadable answers (`Inference`), and running out of time (`DeadlineExceeded`; the elapsed
    /// time also feeds the EWMA as a lower bound of the endpoint's latency). So deadlines
    /// persistently shorter than an endpoint's latency eject it: with every endpoint too slow the
    /// pool answers `Unavailable` at once instead of spending each caller's deadline, which is the
    /// degradation the cascade wants (rules answer instead). A call dropped by the caller counts
    /// as nothing.
    pub async fn classify(
        &self,
        prompt: &PromptSpec,
        text: &str,
        deadline: Instant,
    ) -> Result<ModelVerdict, TierError> {
        let start = Instant::now();
        if start >= deadline {
            return Err(TierError::DeadlineExceeded { waited_us: 0 });
        }
        let shared = &*self.shared;
        let pick = shared
            .balancer
            .pick(None)
            .map_err(|e| TierError::Unavailable(format!("no healthy upstream endpoint ({} ejected)", e.ejected)))?;
        // Serialising a `Value` of strings and numbers cannot fail.
        let body = Bytes::from(serde_json::to_vec(&prompt.request_body(&shared.model, text)).unwrap_or_default());
        let outcome = tokio::time::timeout_at(deadline, shared.ask(pick.index, body, prompt)).await;
        let elapsed = start.elapsed();
        match outcome {
            Ok(Ok(parsed)) => {
                pick.record(true);
                let (risk_score, confidence) = parsed.scores();
                Ok(ModelVerdict {
                    risk_score,
                    confidence,
                    ood_score: None,
                    tokens: parsed.prompt_tokens,
                    queue_us: 0,
                    infer_us: elapsed.as_micros() as u64,
                    batch_size: 1,
                    endpoint: Some(pick.url().to_string()),
                })
            }
            Ok(Err(e)) => {
                pick.record(false);
                Err(e)
            }
            Err(_) => {
                pick.record(false);
                Err(TierError::DeadlineExceeded { waited_us: elapsed.as_micros() as u64 })
            }
        }
    }

    /// Every endpoint's state, in configuration order.
    pub fn endpoints(&self) -> Vec<EndpointStatus> {
        self.shared
            .balancer
            .status()
            .into_iter()
            .zip(&self.shared.endpoints)
            .map(|(balance, e)| {
                let (kv_cache_usage, requests_waiting) = e.scraped();
                EndpointStatus { balance, kv_cache_usage, requests_waiting }
            })
            .collect()
    }

    /// Headroom in [0, 1] from the scraped KV-cache usage: max over available endpoints of
    /// `1 - kv_cache_usage`; `None` when no available endpoint exposes it.
    pub fn kv_cache_headroom(&self) -> Option<f64> {
        self.endpoints()
            .iter()
            .filter(|e| e.healthy && !e.ejected)
            .filter_map(|e| e.kv_cache_usage)
            .map(|usage| 1.0 - usage)
            .fold(None, |best: Option<f64>, x| Some(best.map_or(x, |b| b.max(x))))
    }

    /// Endpoints currently eligible (healthy and not ejected).
    pub fn available(&self) -> usize {
        self.shared.balancer.available()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt() -> PromptSpec {
        PromptSpec {
            system: "Classify.".into(),
            user: "Text: {text}".into(),
            max_tokens: 16,
            risk_label: "risk".into(),
            ok_label: "ok".into(),
        }
    }

    fn completion(content: &str, logprobs: Option<Value>) -> Vec<u8> {
        let mut choice = json!({"index": 0, "message": {"role": "assistant", "content": content}});
        if let Some(lp) = logprobs {
            choice["logprobs"] = json!({ "content": lp });
        }
        serde_json::to_vec(&json!({"choices": [choice], "usage": {"prompt_tokens": 42}})).unwrap()
    }

    #[test]
    fn answer_forms() {
        let p = prompt();
        let c = parse_completion(&completion(r#"{"label": "risk", "confidence": 0.9}"#, None), &p).unwrap();
        assert_eq!(
            (c.is_risk, c.probability, c.source, c.prompt_tokens),
            (true, 0.9, ProbabilitySource::Confidence, Some(42))
        );
        let c = parse_completion(&completion("```json\n{\"label\":\"OK\",\"confidence\":\"0.75\"}\n```", None), &p)
            .unwrap();
        assert_eq!((c.is_risk, c.probability), (false, 0.75));
        assert_eq!(c.scores(), (0.25, 0.75));
        let c = parse_completion(&completion("Sure! {\"label\": \"ok\", \"confidence\": 1} Hope it helps", None), &p)
            .unwrap();
        assert_eq!(c.scores(), (0.0, 1.0));
        // A bare word needs logprobs.
        assert!(parse_completion(&completion(" risk.\n", None), &p).unwrap_err().contains("neither token logprobs"));
        let lp = json!([{"token": "risk", "logprob": (0.8f64).ln()}, {"token": ".", "logprob": 0.0}]);
        let c = parse_completion(&completion("risk.", Some(lp)), &p).unwrap();
        assert!((c.probability - 0.8).abs() < 1e-12 && c.source == ProbabilitySource::Logprobs);
    }

    #[test]
    fn logprobs_take_the_first_label_token_after_the_key() {
        let p = prompt();
        // "ok" appears inside the system-ish prose before the key: must not be picked.
        let tokens = ["ok", " {\"", "label", "\":", " \"", "ok", "\",", " \"confidence\":", " 0.6", "}"];
        let lp: Vec<Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"token": t, "logprob": if i == 5 { (0.7f64).ln() } else { -0.01 }}))
            .collect();
        let content: String = tokens.concat();
        let c = parse_completion(&completion(&content, Some(Value::Array(lp))), &p).unwrap();
        assert!((c.probability - 0.7).abs() < 1e-12, "{c:?}");
        assert!(!c.is_risk);
        // Logprobs that do not spell the label fall back to the confidence.
        let lp = json!([{"token": "x", "logprob": -0.1}]);
        let c = parse_completion(&completion(r#"{"label":"ok","confidence":0.6}"#, Some(lp)), &p).unwrap();
        assert_eq!((c.probability, c.source), (0.6, ProbabilitySource::Confidence));
        // Garbage logprob values fall back too.
        let lp = json!([{"token": "ok", "logprob": "high"}]);
        let c = parse_completion(&completion(r#"{"label":"ok","confidence":0.6}"#, Some(lp)), &p).unwrap();
        assert_eq!(c.source, ProbabilitySource::Confidence);
    }

    #[test]
    fn malformed_answers_are_errors() {
        let p = prompt();
        for (body, needle) in [
            (b"not json".to_vec(), "not JSON"),
            (b"{}".to_vec(), "choices[0]"),
            (br#"{"choices": [{"message": {"content": null}}]}"#.to_vec(), "content"),
            (completion("maybe", None), "neither JSON"),
            (completion(r#"{"label": "fraud", "confidence": 0.9}"#, None), "neither `risk` nor `ok`"),
            (completion(r#"{"label": 3}"#, None), "no string `label`"),
            (completion(r#"{"label": "risk", "confidence": 95}"#, None), "in [0, 1]"),
            (completion(r#"{"label": "risk"}"#, None), "neither token logprobs"),
            (completion(&"x".repeat(10_000), None), "…"),
        ] {
            let err = parse_completion(&body, &p).unwrap_err();
            assert!(err.contains(needle), "{err}");
            assert!(err.len() < 600, "{err}");
        }
    }

    #[test]
    fn prompt_validation() {
        assert!(prompt().validate().is_ok());
        let mut p = prompt();
        p.user = "no placeholder".into();
        assert!(p.validate().unwrap_err().contains("{text}"));
        let mut p = prompt();
        p.ok_label = " RISK ".into();
        assert!(p.validate().unwrap_err().contains("differ"));
        let mut p = prompt();
        p.risk_label = "".into();
        assert!(p.validate().is_err());
        let p: PromptSpec = serde_json::from_value(json!({"system": "s", "user": "{text}"})).unwrap();
        assert_eq!((p.max_tokens, p.risk_label.as_str(), p.ok_label.as_str()), (16, "risk", "ok"));
        let body = p.request_body("m", "a {text} b");
        assert_eq!(body["messages"][1]["content"], "a {text} b");
    }

    #[test]
    fn metrics_text() {
        let text = "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage.\n\
            vllm:gpu_cache_usage_perc{model_name=\"a\",engine=\"0\"} 0.25\n\
            vllm:gpu_cache_usage_perc{model_name=\"b}\"} 0.5 1700000000\n\
            vllm:num_requests_waiting{model_name=\"a\"} 2\n\
            vllm:num_requests_waiting 3.0\n\
            vllm:kv_cache_usage_perc NaN\n\
            garbage line\n\
            vllm:num_requests_running 7\n";
        assert_eq!(parse_vllm_metrics(text), (Some(0.5), Some(5.0)));
        assert_eq!(parse_vllm_metrics("vllm:kv_cache_usage_perc 1.5"), (Some(1.0), None));
        assert_eq!(parse_vllm_metrics(""), (None, None));
    }

    #[test]
    fn config_validation() {
        let mut c = UpstreamConfig {
            endpoints: vec!["http://127.0.0.1:8000/".into()],
            model: "m".into(),
            ..Default::default()
        };
        assert!(c.validate().is_ok());
        let uris = EndpointUris::parse("http://127.0.0.1:8000/", "health", Some("/metrics")).unwrap();
        assert_eq!(uris.chat, "http://127.0.0.1:8000/v1/chat/completions");
        assert_eq!(uris.health, "http://127.0.0.1:8000/health");
        c.endpoints = vec!["https://x".into()];
        assert!(c.validate().unwrap_err().contains("https"));
        c.endpoints = vec!["127.0.0.1:8000".into()];
        assert!(c.validate().is_err());
        c.endpoints = vec![];
        assert!(c.validate().unwrap_err().contains("endpoints"));
        let parsed: Result<UpstreamConfig, _> = serde_json::from_value(json!({"endpoints": [], "bogus": 1}));
        assert!(parsed.is_err());
    }
}
