//! The gpu tier's `upstream` backend: a pool of local OpenAI-compatible model servers
//! (vLLM, SGLang, llama.cpp server: any that honours `response_format` with a JSON schema and
//! returns token logprobs) asked to classify one text per call.
//!
//! What the pool does, in the order a call sees it:
//!
//! 1. **pick** an endpoint by power of two choices over a peak-sensitive EWMA of latency
//!    ([`UpstreamPool::classify`], see `Ewma` for the cost), among endpoints that are
//!    healthy and not ejected;
//! 2. **ask** it: `POST {base}/v1/chat/completions` with the policy's [`PromptSpec`], the
//!    message as data (a JSON string in a delimited block, [`data_block`]), structured output
//!    (`response_format` with the [`verdict_schema`]), `temperature: 0` and `logprobs: true`,
//!    until the caller's deadline;
//! 3. **read** the answer strictly against the schema (anything else is an `Inference` error)
//!    and the label tokens' log-probabilities normalised over the two allowed labels (see
//!    [`parse_completion`]); scale the log-odds by the tier's `temperature` into a
//!    [`ModelVerdict`]. A stated label the model itself found less likely (a grammar forced it)
//!    is *unsure* (risk 0.5, confidence 0.5), never its opposite;
//! 4. **record** the outcome: latency into the EWMA, failures into the endpoint's consecutive
//!    failure count, which ejects the endpoint after `eject_after_failures`.
//!
//! Beside the calls, one task per endpoint runs active health checks (and scrapes vLLM's or
//! llama.cpp's Prometheus `/metrics` for KV-cache usage and queue depth when configured); a
//! health check re-admits an ejected endpoint once `eject_ms` has passed (outlier ejection with
//! re-admission, as in pingora's health checks and Envoy's outlier detection). The tasks stop
//! when the pool is dropped.
//!
//! There are no retries here on purpose: the caller's cascade falls back to the rules engine,
//! which never waits, and a retry would spend the deadline that fallback needs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::Serialize;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::balance::{Balancer, BalancerConfig, MemberStatus, Readmit};
use crate::error::error_chain;
use crate::tier::backend::{KvCache, ModelTier, TierInput, TierLoad};
use crate::tier::ModelVerdict;
use crate::tier::TierError;

/// Largest response body read from a model server (answers are a few hundred bytes; vLLM's
/// `/metrics` is a few hundred KiB). Anything longer is a failure, never an allocation.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// The OpenAI chat-completions path, appended to each endpoint's base URL.
const CHAT_PATH: &str = "/v1/chat/completions";

mod completion;
pub mod config;
mod metrics;

use crate::policy::PromptSpec;
use completion::snippet;
pub use completion::{
    data_block, parse_completion, request_body, scale, verdict_schema, ParsedCompletion, Reading, Unsure, DATA_CLOSE,
    DATA_OPEN, DATA_RULE, TOP_LOGPROBS,
};
pub use config::UpstreamConfig;
pub use metrics::{parse_server_metrics, ServerMetrics};

/// One endpoint as [`UpstreamPool::endpoints`] reports it (for `/admin` and tests).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EndpointStatus {
    /// Health, ejection, latency estimate and request counts.
    #[serde(flatten)]
    pub balance: MemberStatus,
    /// From the last successful scrape of `metrics_path` (kept while later ones fail); `None`
    /// when never scraped or not published.
    pub kv_cache_usage: Option<f64>,
    pub requests_waiting: Option<f64>,
    pub requests_running: Option<f64>,
    /// Milliseconds since the last successful scrape; `None` when never scraped.
    pub scraped_ms_ago: Option<u64>,
}

impl std::ops::Deref for EndpointStatus {
    type Target = MemberStatus;
    fn deref(&self) -> &MemberStatus {
        &self.balance
    }
}

/// Request, health and metrics URIs of one endpoint.
pub(super) struct EndpointUris {
    chat: Uri,
    health: Uri,
    metrics: Option<Uri>,
}

impl EndpointUris {
    pub(super) fn parse(base: &str, health_path: &str, metrics_path: Option<&str>) -> Result<Self, String> {
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

/// An endpoint's URIs and its last successful metrics scrape (with when); its load-balancing
/// state is in the [`Balancer`] at the same index.
struct Endpoint {
    uris: EndpointUris,
    scraped: Mutex<(ServerMetrics, Option<Instant>)>,
}

impl Endpoint {
    fn scraped(&self) -> (ServerMetrics, Option<Instant>) {
        *self.scraped.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A scrape older than this many health intervals is stale: the reading is unknown.
const SCRAPE_STALE_INTERVALS: u32 = 3;

/// What the pool and its background tasks share.
struct Shared {
    endpoints: Vec<Endpoint>,
    balancer: Balancer,
    client: Client<HttpConnector, Full<Bytes>>,
    model: String,
    temperature: f64,
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
            // A failed scrape keeps the last reading and its time: it stays in use until stale,
            // then reads as unknown ([`UpstreamPool::kv_cache`]) — never as "no limit".
            match self.get(metrics).await {
                Ok(body) => {
                    let scraped = parse_server_metrics(&String::from_utf8_lossy(&body));
                    *endpoint.scraped.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) =
                        (scraped, Some(Instant::now()));
                }
                Err(e) => tracing::debug!(endpoint = %url, error = %e, "metrics scrape failed"),
            }
        }
    }

    /// One HTTP exchange with `endpoint`; the caller bounds it by the deadline.
    async fn ask(&self, index: usize, body: Bytes, prompt: &PromptSpec) -> Result<ParsedCompletion, TierError> {
        let url = self.balancer.url(index);
        let mut request = Request::post(self.endpoints[index].uris.chat.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(body))
            .map_err(|e| TierError::Inference(format!("{}: cannot build request: {e}", url)))?;
        // The gpu tier's span, when the request is traced: the model server's spans join it.
        crate::trace::context::inject_current(request.headers_mut());
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

/// One answer of [`UpstreamPool::answer`].
#[derive(Debug, Clone)]
pub struct Answer {
    pub parsed: ParsedCompletion,
    /// The endpoint that answered.
    pub endpoint: String,
    pub elapsed: Duration,
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
            endpoints.push(Endpoint { uris, scraped: Mutex::new((ServerMetrics::default(), None)) });
        }
        let balancer = Balancer::new(
            config.endpoints.iter().map(|url| url.trim().trim_end_matches('/').to_string()),
            BalancerConfig {
                eject_after_failures: config.eject_after_failures,
                eject: Duration::from_millis(config.eject_ms),
                decay_ms: config.ewma_decay_ms as f64,
                readmit: Readmit::HealthCheck,
                // Nothing healthy: the cascade's next stage answers (rules), not a dead server.
                panic_threshold: 0.0,
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
            temperature: config.temperature,
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

    /// One classification: [`UpstreamPool::answer`], its label probability scaled by the tier's
    /// `temperature` into a verdict (risk 0.5, confidence 0.5 when the reading is unsure).
    pub async fn classify(
        &self,
        prompt: &PromptSpec,
        text: &str,
        deadline: Instant,
    ) -> Result<ModelVerdict, TierError> {
        let answer = self.answer(prompt, text, deadline).await?;
        if let Reading::Unsure(why) = answer.parsed.reading {
            tracing::debug!(endpoint = %answer.endpoint, ?why, "upstream answer is unsure");
        }
        let (risk_score, confidence) = answer.parsed.scores(self.shared.temperature);
        Ok(ModelVerdict {
            risk_score,
            confidence,
            ood_score: None,
            tokens: answer.parsed.prompt_tokens,
            queue_us: 0,
            infer_us: answer.elapsed.as_micros() as u64,
            batch_size: 1,
            window: None,
            unread: false,
            endpoint: Some(answer.endpoint),
        })
    }

    /// One answer, read but not scaled (what `tiergate calibrate --tier gpu` fits the
    /// temperature on): pick an endpoint by P2C, `POST {base}/v1/chat/completions`, parse the
    /// answer; give up at `deadline`.
    ///
    /// Failures count against the endpoint: connect errors (`Unavailable`), non-2xx statuses and
    /// answers outside the schema or without logprobs (`Inference`). Running out of time
    /// (`DeadlineExceeded`) does not: the deadline is the caller's, so a caller choosing 5 ms
    /// must not eject a healthy server; the elapsed time feeds the EWMA as a lower bound of the
    /// endpoint's latency (P2C avoids a slow endpoint), and the tier's own timeout counts
    /// against its circuit breaker (`GpuTier::classify`). A call dropped by the caller counts
    /// as nothing.
    pub async fn answer(&self, prompt: &PromptSpec, text: &str, deadline: Instant) -> Result<Answer, TierError> {
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
        let body = Bytes::from(serde_json::to_vec(&request_body(prompt, &shared.model, text)).unwrap_or_default());
        let outcome = crate::tier::by_deadline(deadline, shared.ask(pick.index, body, prompt)).await;
        let elapsed = start.elapsed();
        match outcome {
            Some(Ok(parsed)) => {
                pick.record(true);
                Ok(Answer { parsed, endpoint: pick.url().to_string(), elapsed })
            }
            Some(Err(e)) => {
                pick.record(false);
                Err(e)
            }
            None => {
                pick.record_timeout();
                Err(TierError::DeadlineExceeded { waited_us: elapsed.as_micros() as u64 })
            }
        }
    }

    /// The tier's temperature (`[gpu.upstream] temperature`).
    pub fn temperature(&self) -> f64 {
        self.shared.temperature
    }

    /// Every endpoint's state, in configuration order.
    pub fn endpoints(&self) -> Vec<EndpointStatus> {
        self.shared
            .balancer
            .status()
            .into_iter()
            .zip(&self.shared.endpoints)
            .map(|(balance, e)| {
                let (m, at) = e.scraped();
                EndpointStatus {
                    balance,
                    kv_cache_usage: m.kv_cache_usage,
                    requests_waiting: m.requests_waiting,
                    requests_running: m.requests_running,
                    scraped_ms_ago: at.map(|at| at.elapsed().as_millis() as u64),
                }
            })
            .collect()
    }

    /// KV-cache headroom over the available endpoints: the best `1 - usage` among fresh
    /// readings; `Unknown` when none is fresh and some endpoint's scrapes fail or are older than
    /// [`SCRAPE_STALE_INTERVALS`] health intervals (or have not succeeded yet); `NotExposed`
    /// without a `metrics_path` or when the servers publish no KV-cache gauge.
    pub fn kv_cache(&self) -> KvCache {
        if self.shared.endpoints.iter().all(|e| e.uris.metrics.is_none()) {
            return KvCache::NotExposed;
        }
        let stale_after = self.shared.health_interval * SCRAPE_STALE_INTERVALS;
        let now = Instant::now();
        let (mut best, mut unknown) = (None::<f64>, false);
        let status = self.shared.balancer.status();
        for (_, e) in status.iter().zip(&self.shared.endpoints).filter(|(b, _)| b.healthy && !b.ejected) {
            match e.scraped() {
                (m, Some(at)) if now.saturating_duration_since(at) <= stale_after => {
                    if let Some(u) = m.kv_cache_usage {
                        best = Some(best.map_or(1.0 - u, |b| b.max(1.0 - u)));
                    }
                }
                _ => unknown = true,
            }
        }
        match (best, unknown) {
            (Some(h), _) => KvCache::Headroom(h),
            (None, true) => KvCache::Unknown,
            (None, false) => KvCache::NotExposed,
        }
    }

    /// Endpoints currently eligible (healthy and not ejected).
    pub fn available(&self) -> usize {
        self.shared.balancer.available()
    }
}

impl ModelTier for UpstreamPool {
    fn classify<'a>(
        &'a self,
        input: TierInput<'a>,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<ModelVerdict, TierError>> {
        Box::pin(async move {
            let TierInput::Text { text, prompt, .. } = input;
            let Some(prompt) = prompt else {
                return Err(TierError::Unavailable("the policy has no [prompt] for the upstream backend".into()));
            };
            let started = Instant::now();
            match crate::tier::by_deadline(deadline, UpstreamPool::classify(self, prompt, &text, deadline)).await {
                Some(r) => r,
                None => Err(TierError::DeadlineExceeded { waited_us: started.elapsed().as_micros() as u64 }),
            }
        })
    }

    fn load(&self) -> TierLoad {
        TierLoad { kv_cache: self.kv_cache(), endpoints_available: Some(self.available()), queue_wait_us: None }
    }

    fn status(&self) -> serde_json::Value {
        serde_json::json!({ "endpoints": self.endpoints() })
    }

    fn needs_prompt(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
