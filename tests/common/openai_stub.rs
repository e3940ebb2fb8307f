//! A small OpenAI-compatible model server for tests (what vLLM, TGI, llama.cpp server and
//! SGLang look like to tiergate's upstream pool), on `127.0.0.1:0`, in the test's runtime.
//!
//! Routes:
//! * `POST /v1/chat/completions`: answers `{"label": ..}` as the assistant content, with
//!   vLLM-style `logprobs.content` (the label's token carries the configured logprob, and its
//!   `top_logprobs` the other label of the request's `response_format` enum), after the
//!   configured latency; or fails as configured ([`Fail`]). The real llama.cpp server
//!   (`tests/common/llama.rs`) is what the upstream tier is tested against; the stub is for
//!   what a real server cannot be made to do on cue: answers outside the schema, no logprobs,
//!   exact probabilities, statuses, hangs, latency, health and metrics.
//! * `GET /health`: the configured status, empty body.
//! * `GET /metrics`: Prometheus text with `vllm:gpu_cache_usage_perc` and
//!   `vllm:num_requests_waiting` (or llama.cpp's `llamacpp:*` names, [`Behaviour::llama_metrics`])
//!   when a KV-cache usage is set, else 404.
//!
//! Behaviour changes at run time through the [`StubHandle`] (`set_*`), and the handle counts
//! what was served. Dropping the handle (or [`StubHandle::stop`]) closes the listener and every
//! open connection, so the address then refuses connections.
//!
//! ```ignore
//! let stub = openai_stub::spawn(Behaviour::default().label("risk").logprob(0.9f64.ln())).await;
//! let config = UpstreamConfig { endpoints: vec![stub.url()], .. };
//! stub.set_latency_ms(200);
//! assert_eq!(stub.requests(), 1);
//! ```
#![allow(dead_code)]

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::AbortHandle;

/// How `/v1/chat/completions` fails, instead of answering.
#[derive(Debug, Clone, PartialEq)]
pub enum Fail {
    /// Answer normally.
    None,
    /// This status with a short JSON error body (after the latency).
    Status(u16),
    /// 200 with a body that is not JSON.
    InvalidJson,
    /// Never answer (the connection stays open until the client gives up).
    Hang,
}

/// What the stub does; every field can be changed at run time through the handle.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// Delay before answering a completion (not health or metrics).
    pub latency_ms: u64,
    pub fail: Fail,
    /// Status of `GET /health`.
    pub health_status: u16,
    /// The label in the answer.
    pub label: String,
    /// The logprob of the label's token; `None`: no `logprobs` in the response.
    pub label_logprob: Option<f64>,
    /// The logprob of the other label among the label token's `top_logprobs`; `None`: the
    /// complement of the label's probability (so the normalised probability is the label's);
    /// `-inf`: not listed.
    pub other_logprob: Option<f64>,
    /// Replaces the whole assistant content (for malformed answers); still tokenised for logprobs.
    pub content: Option<String>,
    /// `vllm:gpu_cache_usage_perc` on `/metrics`; `None`: `/metrics` is 404.
    pub kv_cache_usage: Option<f64>,
    /// `vllm:num_requests_waiting` on `/metrics`.
    pub requests_waiting: f64,
    /// `/metrics` in llama.cpp's names (`llamacpp:kv_cache_usage_ratio`, `requests_deferred`).
    pub llama_metrics: bool,
    /// `usage.prompt_tokens` in the response.
    pub prompt_tokens: u64,
}

impl Default for Behaviour {
    /// Answers `{"label": "risk"}` at once, with logprob ln 0.9 for the label, ln 0.1 for `ok`.
    fn default() -> Self {
        Behaviour {
            latency_ms: 0,
            fail: Fail::None,
            health_status: 200,
            label: "risk".into(),
            label_logprob: Some(0.9f64.ln()),
            other_logprob: None,
            content: None,
            kv_cache_usage: None,
            requests_waiting: 0.0,
            llama_metrics: false,
            prompt_tokens: 17,
        }
    }
}

impl Behaviour {
    pub fn latency_ms(mut self, ms: u64) -> Self {
        self.latency_ms = ms;
        self
    }
    pub fn label(mut self, label: &str) -> Self {
        self.label = label.into();
        self
    }
    pub fn logprob(mut self, logprob: Option<f64>) -> Self {
        self.label_logprob = logprob;
        self
    }
    pub fn kv_cache_usage(mut self, usage: Option<f64>) -> Self {
        self.kv_cache_usage = usage;
        self
    }
}

struct Shared {
    behaviour: Mutex<Behaviour>,
    completions: AtomicU64,
    health_checks: AtomicU64,
    metrics_scrapes: AtomicU64,
    last_request: Mutex<Option<Value>>,
    /// The accept loop and every connection task, aborted on stop.
    tasks: Mutex<Vec<AbortHandle>>,
}

/// Control handle of a running stub. Dropping it stops the stub.
pub struct StubHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

/// Starts a stub on an ephemeral port in the current runtime.
pub async fn spawn(behaviour: Behaviour) -> StubHandle {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("bind stub");
    let addr = listener.local_addr().unwrap();
    let shared = Arc::new(Shared {
        behaviour: Mutex::new(behaviour),
        completions: AtomicU64::new(0),
        health_checks: AtomicU64::new(0),
        metrics_scrapes: AtomicU64::new(0),
        last_request: Mutex::new(None),
        tasks: Mutex::new(Vec::new()),
    });
    let accept = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let service = {
                    let shared = Arc::clone(&shared);
                    hyper::service::service_fn(move |req| {
                        let shared = Arc::clone(&shared);
                        async move { Ok::<_, Infallible>(handle(&shared, req).await) }
                    })
                };
                let conn = tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                let mut tasks = shared.tasks.lock().unwrap();
                tasks.retain(|t| !t.is_finished());
                tasks.push(conn.abort_handle());
            }
        })
    };
    shared.tasks.lock().unwrap().push(accept.abort_handle());
    StubHandle { addr, shared }
}

impl StubHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// `http://127.0.0.1:PORT`, the base URL for the pool's `endpoints`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    /// Changes any part of the behaviour at once.
    pub fn update(&self, change: impl FnOnce(&mut Behaviour)) {
        change(&mut self.shared.behaviour.lock().unwrap());
    }
    pub fn behaviour(&self) -> Behaviour {
        self.shared.behaviour.lock().unwrap().clone()
    }
    pub fn set_latency_ms(&self, ms: u64) {
        self.update(|b| b.latency_ms = ms);
    }
    pub fn set_fail(&self, fail: Fail) {
        self.update(|b| b.fail = fail);
    }
    pub fn set_health(&self, status: u16) {
        self.update(|b| b.health_status = status);
    }
    /// The answer's label and the logprobs of its token and of the other label (see
    /// [`Behaviour::other_logprob`]).
    pub fn set_answer(&self, label: &str, logprob: f64, other: Option<f64>) {
        self.update(|b| {
            b.label = label.into();
            b.label_logprob = Some(logprob);
            b.other_logprob = other;
        });
    }
    /// Logprob of the label's token; `None` drops `logprobs` from responses.
    pub fn set_logprob(&self, logprob: Option<f64>) {
        self.update(|b| b.label_logprob = logprob);
    }
    /// Replaces the assistant content verbatim (`None`: the usual JSON answer).
    pub fn set_content(&self, content: Option<&str>) {
        self.update(|b| b.content = content.map(str::to_string));
    }
    pub fn set_kv_cache_usage(&self, usage: Option<f64>) {
        self.update(|b| b.kv_cache_usage = usage);
    }
    pub fn set_requests_waiting(&self, waiting: f64) {
        self.update(|b| b.requests_waiting = waiting);
    }
    /// Completion requests received (counted on arrival, whatever the answer).
    pub fn requests(&self) -> u64 {
        self.shared.completions.load(Ordering::SeqCst)
    }
    pub fn health_checks(&self) -> u64 {
        self.shared.health_checks.load(Ordering::SeqCst)
    }
    pub fn metrics_scrapes(&self) -> u64 {
        self.shared.metrics_scrapes.load(Ordering::SeqCst)
    }
    /// The JSON body of the last completion request.
    pub fn last_request(&self) -> Option<Value> {
        self.shared.last_request.lock().unwrap().clone()
    }
    /// Stops accepting and closes every connection; the port then refuses connections.
    pub fn stop(&self) {
        for task in self.shared.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

impl Drop for StubHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn reply(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", content_type)
        .body(Full::new(body.into()))
        .unwrap()
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    match (method, path.as_str()) {
        (Method::GET, "/health") => {
            shared.health_checks.fetch_add(1, Ordering::SeqCst);
            let status = shared.behaviour.lock().unwrap().health_status;
            reply(status, "text/plain", "")
        }
        (Method::GET, "/metrics") => {
            shared.metrics_scrapes.fetch_add(1, Ordering::SeqCst);
            let b = shared.behaviour.lock().unwrap().clone();
            match b.kv_cache_usage {
                Some(usage) if b.llama_metrics => {
                    reply(200, "text/plain; version=0.0.4", llama_metrics_text(usage, b.requests_waiting))
                }
                Some(usage) => reply(200, "text/plain; version=0.0.4", metrics_text(usage, b.requests_waiting)),
                None => reply(404, "text/plain", "not found"),
            }
        }
        (Method::POST, "/v1/chat/completions") => {
            shared.completions.fetch_add(1, Ordering::SeqCst);
            let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            *shared.last_request.lock().unwrap() = Some(request.clone());
            // Read the behaviour before sleeping: a change made during the latency applies to
            // the next request, as it would on a real server.
            let b = shared.behaviour.lock().unwrap().clone();
            if b.fail == Fail::Hang {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(b.latency_ms)).await;
            match b.fail {
                Fail::Status(status) => reply(
                    status,
                    "application/json",
                    json!({"object": "error", "message": "stub failure", "code": status}).to_string(),
                ),
                Fail::InvalidJson => reply(200, "application/json", "{\"choices\": [ this is not json"),
                _ => reply(200, "application/json", completion(&b, &request).to_string()),
            }
        }
        _ => reply(404, "text/plain", "not found"),
    }
}

/// vLLM's names. One literal a line: the architecture test counts a function's braces line by line.
fn metrics_text(usage: f64, waiting: f64) -> String {
    [
        "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.".to_string(),
        "# TYPE vllm:gpu_cache_usage_perc gauge".into(),
        format!("vllm:gpu_cache_usage_perc{{model_name=\"stub\"}} {usage}"),
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.".into(),
        "# TYPE vllm:num_requests_waiting gauge".into(),
        format!("vllm:num_requests_waiting{{model_name=\"stub\"}} {waiting}"),
        "# TYPE vllm:num_requests_running gauge".into(),
        "vllm:num_requests_running{model_name=\"stub\"} 1\n".into(),
    ]
    .join("\n")
}

/// llama.cpp server's names (`--metrics`), with the KV-cache ratio older versions expose.
fn llama_metrics_text(usage: f64, waiting: f64) -> String {
    [
        "# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.".to_string(),
        "# TYPE llamacpp:kv_cache_usage_ratio gauge".into(),
        format!("llamacpp:kv_cache_usage_ratio {usage}"),
        "# TYPE llamacpp:requests_processing gauge".into(),
        "llamacpp:requests_processing 1".into(),
        "# TYPE llamacpp:requests_deferred gauge".into(),
        format!("llamacpp:requests_deferred {waiting}\n"),
    ]
    .join("\n")
}

/// The assistant content for a behaviour.
pub fn answer_content(b: &Behaviour) -> String {
    match &b.content {
        Some(content) => content.clone(),
        None => json!({"label": b.label}).to_string(),
    }
}

/// The label of the request's `response_format` enum that is not `label` (`ok` or `risk`
/// when the request has none).
fn other_label(request: &Value, label: &str) -> String {
    let allowed =
        request.pointer("/response_format/json_schema/schema/properties/label/enum").and_then(Value::as_array);
    let other = allowed.into_iter().flatten().filter_map(Value::as_str).find(|l| *l != label);
    other.unwrap_or(if label == "ok" { "risk" } else { "ok" }).to_string()
}

/// Splits text the way a BPE tokenizer roughly does: runs of letters/digits are one token,
/// every other character its own token.
pub fn tokenize(text: &str) -> Vec<String> {
    let mut tokens: Vec<String> = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_alphanumeric() {
            word.push(c);
        } else {
            if !word.is_empty() {
                tokens.push(std::mem::take(&mut word));
            }
            tokens.push(c.to_string());
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    tokens
}

fn completion(b: &Behaviour, request: &Value) -> Value {
    let content = answer_content(b);
    let mut choice = json!({
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "finish_reason": "stop",
    });
    if let Some(label_logprob) = b.label_logprob {
        // The label's position: after the `"label"` key when there is one.
        let from = content.find("\"label\"").map_or(0, |k| k + 7);
        let label_at = content[from..].find(&b.label).map(|i| i + from);
        let other = other_label(request, &b.label);
        let p = label_logprob.exp().min(1.0);
        let other_logprob = b.other_logprob.unwrap_or(if p < 1.0 { (1.0 - p).ln() } else { f64::NEG_INFINITY });
        let mut offset = 0;
        let mut label_done = false;
        let tokens: Vec<Value> = tokenize(&content)
            .into_iter()
            .map(|token| {
                let (start, end) = (offset, offset + token.len());
                offset = end;
                let is_label = !label_done && label_at.is_some_and(|at| start <= at && at < end);
                label_done |= is_label;
                let logprob = if is_label { label_logprob } else { -0.0001 };
                let mut top = vec![json!({"token": token, "logprob": logprob})];
                if is_label && other_logprob.is_finite() {
                    top.push(json!({"token": other, "logprob": other_logprob}));
                }
                json!({"token": token, "logprob": logprob, "bytes": token.as_bytes(), "top_logprobs": top})
            })
            .collect();
        choice["logprobs"] = json!({ "content": tokens });
    }
    json!({
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 0,
        "model": request.get("model").cloned().unwrap_or(Value::Null),
        "choices": [choice],
        "usage": {"prompt_tokens": b.prompt_tokens, "completion_tokens": 12, "total_tokens": b.prompt_tokens + 12},
    })
}
