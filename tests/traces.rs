//! OpenTelemetry traces end to end: tiergate exports to a local OTLP/HTTP endpoint started
//! here, which decodes each export with the OpenTelemetry protobuf definitions
//! (`opentelemetry-proto`), and the tests check the span tree of real requests: a decision that
//! went cpu → gpu (the real llama.cpp server, `common::llama`) → rules under the client's
//! `traceparent`, the child context the app behind a proxy route and the model server receive,
//! an invalid `traceparent` replaced, and an exporter that is down failing no request while
//! its drops are counted.

mod common;

use bytes::Bytes;
use common::{app, fast_config, llama, policies_with_edited_routing, repo, routes, FakeCpu, FakeGpu};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tiergate::gateway::Sources;
use tiergate::Config;

/// The client's span: trace 4bf9…4736, span 00f0…02b7, sampled.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(flags: &str) -> String {
    format!("00-{TRACE}-{CLIENT_SPAN}-{flags}")
}

/// A span as decoded, with the resource's `service.name`.
#[derive(Debug, Clone)]
struct Got {
    span: Span,
    service: String,
}

impl Got {
    fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    fn id(&self) -> String {
        hex(&self.span.span_id)
    }
    fn parent(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    /// An attribute as text (strings as they are, numbers and bools formatted).
    fn attr(&self, key: &str) -> Option<String> {
        let kv = self.span.attributes.iter().find(|kv| kv.key == key)?;
        Some(match kv.value.as_ref()?.value.as_ref()? {
            Any::StringValue(s) => s.clone(),
            Any::IntValue(i) => i.to_string(),
            Any::DoubleValue(f) => f.to_string(),
            Any::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A local OTLP/HTTP traces endpoint: decodes every `POST /v1/traces` body as an
/// `ExportTraceServiceRequest` and keeps its spans.
#[derive(Clone, Default)]
struct Collector {
    addr: Option<SocketAddr>,
    spans: Arc<Mutex<Vec<Got>>>,
    content_types: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    fn start() -> Collector {
        let mut collector = Collector::default();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        collector.addr = Some(listener.local_addr().unwrap());
        let shared = collector.clone();
        serve_in_thread(listener, move |req| {
            let shared = shared.clone();
            async move { shared.receive(req).await }
        });
        collector
    }

    fn url(&self) -> String {
        format!("http://{}/v1/traces", self.addr.unwrap())
    }

    async fn receive(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let content_type = req.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
        self.content_types.lock().unwrap().push(content_type.unwrap_or_default());
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let export = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
        let mut spans = self.spans.lock().unwrap();
        for resource in export.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    Any::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| Got { span, service: service.clone() }));
            }
        }
        Response::builder().header("content-type", "application/x-protobuf").body(Full::new(Bytes::new())).unwrap()
    }

    /// The spans of `trace_id` once `count` have arrived (waits up to 30 s).
    async fn trace(&self, trace_id: &str, count: usize) -> Vec<Got> {
        for _ in 0..600 {
            let spans: Vec<Got> =
                self.spans.lock().unwrap().iter().filter(|s| s.trace_id() == trace_id).cloned().collect();
            if spans.len() >= count {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let all: Vec<String> =
            self.spans.lock().unwrap().iter().map(|s| format!("{} {}", s.trace_id(), s.span.name)).collect();
        panic!("fewer than {count} spans of trace {trace_id} arrived; got {all:?}");
    }
}

/// Serves `listener` with `handle` on its own thread and runtime (outliving any test's).
fn serve_in_thread<F, Fut>(listener: std::net::TcpListener, handle: F)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let handle = handle.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let handle = handle.clone();
                        async move { Ok::<_, Infallible>(handle(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    });
}

/// A pass-through in front of a model server that keeps the headers of every request it relays
/// (what the model server received).
#[derive(Clone)]
struct Relay {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<http::HeaderMap>>>,
}

impl Relay {
    fn start(target: String) -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let relay = Relay { addr: listener.local_addr().unwrap(), seen: Arc::default() };
        let (seen, target) = (Arc::clone(&relay.seen), Arc::new(target));
        serve_in_thread(listener, move |req: Request<Incoming>| {
            let (seen, target) = (Arc::clone(&seen), Arc::clone(&target));
            async move {
                let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
                let (mut parts, body) = req.into_parts();
                if parts.method == http::Method::POST {
                    seen.lock().unwrap().push(parts.headers.clone());
                }
                let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
                parts.uri = format!("{target}{path}").parse().unwrap();
                parts.headers.remove("host");
                let body = body.collect().await.unwrap().to_bytes();
                let response = client.request(Request::from_parts(parts, Full::new(body))).await.unwrap();
                let (parts, body) = response.into_parts();
                Response::from_parts(parts, Full::new(body.collect().await.unwrap().to_bytes()))
            }
        });
        relay
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// The bundled config with tracing on (every trace sampled, exported within 50 ms) to
/// `collector`, and a screened route `/chat` to `app`.
fn traced(policies: &std::path::Path, endpoint: &str, app: &app::AppHandle) -> Config {
    let mut c = common::config_with_routes(policies, &routes::screened_route("chat", "/chat", &app.url(), &[]));
    c.tracing.enabled = true;
    c.tracing.endpoint = endpoint.into();
    c.tracing.sampling_ratio = 1.0;
    c.tracing.scheduled_delay_ms = 50;
    c.tracing.service_name = "tiergate-test".into();
    c
}

/// One trace as an indented tree, children in start order: name, span id, start offset and
/// duration in ms, attributes (how docs/operations.md shows a decision's trace).
fn render(spans: &[Got]) -> String {
    let t0 = spans.iter().map(|s| s.span.start_time_unix_nano).min().unwrap_or(0);
    let mut out = String::new();
    let ids: Vec<String> = spans.iter().map(Got::id).collect();
    let mut roots: Vec<&Got> = spans.iter().filter(|s| !ids.contains(&s.parent())).collect();
    roots.sort_by_key(|s| s.span.start_time_unix_nano);
    fn walk(s: &Got, spans: &[Got], depth: usize, t0: u64, out: &mut String) {
        let ms = |ns: u64| ns as f64 / 1e6;
        let attrs: Vec<String> =
            s.span.attributes.iter().map(|kv| format!("{}={}", kv.key, s.attr(&kv.key).unwrap_or_default())).collect();
        out.push_str(&format!(
            "{}{} [{}] +{:.1} ms, {:.1} ms{}  {}\n",
            "  ".repeat(depth),
            s.span.name,
            s.id(),
            ms(s.span.start_time_unix_nano - t0),
            ms(s.span.end_time_unix_nano - s.span.start_time_unix_nano),
            s.span
                .status
                .as_ref()
                .filter(|st| st.code == 2)
                .map_or(String::new(), |st| format!(" ERROR {}", st.message)),
            attrs.join(" ")
        ));
        let mut children: Vec<&Got> = spans.iter().filter(|c| c.parent() == s.id()).collect();
        children.sort_by_key(|c| c.span.start_time_unix_nano);
        for c in children {
            walk(c, spans, depth + 1, t0, out);
        }
    }
    for r in roots {
        out.push_str(&format!(
            "trace {} (parent {})\n",
            r.trace_id(),
            if r.parent().is_empty() { "none".into() } else { r.parent() }
        ));
        walk(r, spans, 1, t0, &mut out);
    }
    out
}

/// The cascade test's tree: the root's HTTP attributes and decision, every stage a child of it
/// inside its time, and what each tier span says.
fn check_cascade_tree(named: &BTreeMap<String, Got>, d: &serde_json::Value, relay: &Relay) {
    let root = &named["POST /v1/classify"];
    assert_eq!(root.attr("tiergate.tier").as_deref(), d["tier"].as_str());
    assert_eq!(root.attr("tiergate.action").as_deref(), d["action"].as_str());
    assert_eq!(root.attr("tiergate.policy_version").as_deref(), d["policy_version"].as_str());
    assert_eq!(root.attr("http.request.method").as_deref(), Some("POST"));
    assert_eq!(root.attr("client.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(root.attr("http.route").as_deref(), Some("/v1/classify"));
    assert_eq!(root.attr("http.response.status_code").as_deref(), Some("200"));
    for stage in ["admission", "canonical", "tier cpu", "tier gpu", "rules", "guards", "record"] {
        let s = named.get(stage).unwrap_or_else(|| panic!("no `{stage}` span"));
        assert_eq!(s.parent(), root.id(), "{stage} is a child of the root");
        assert!(s.span.start_time_unix_nano >= root.span.start_time_unix_nano);
        assert!(s.span.end_time_unix_nano <= root.span.end_time_unix_nano, "{stage} ends inside the root");
    }
    let cpu = &named["tier cpu"];
    assert_eq!(cpu.attr("tiergate.outcome").as_deref(), Some("low_confidence"));
    assert!(cpu.attr("tiergate.risk_score").is_some() && cpu.attr("tiergate.latency_us").is_some());
    let gpu = &named["tier gpu"];
    assert_eq!(gpu.attr("tiergate.tier").as_deref(), Some("gpu"));
    assert_eq!(gpu.attr("tiergate.endpoint"), Some(relay.url()));
    assert_eq!(gpu.attr("tiergate.outcome").as_deref(), Some("low_confidence"));
    assert_eq!(named["rules"].attr("tiergate.tier").as_deref(), Some("rules"));
    assert!(named["canonical"].attr("tiergate.language").is_some());
}

/// Spans by name (one each expected).
fn by_name(spans: &[Got]) -> BTreeMap<String, Got> {
    spans.iter().map(|s| (s.span.name.clone(), s.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_gpu_rules_decision_is_one_span_tree_under_the_clients_span() {
    let collector = Collector::start();
    let llama = llama::shared();
    let relay = Relay::start(llama.url());
    // No model verdict stands (confidence is always below 1.0): cpu escalates, gpu hands over
    // to rules.
    let policies = policies_with_edited_routing(
        "traces-cascade",
        &[("escalate_below = 0.95", "escalate_below = 1.0"), ("accept_below = 0.94", "accept_below = 1.0")],
    );
    let app = app::start();
    let mut c = traced(&policies, &collector.url(), &app);
    c.readings = fast_config(&policies).readings;
    c.gpu.backend = "upstream".into();
    c.gpu.upstream.endpoints = vec![relay.url()];
    c.gpu.upstream.model = "smollm2-135m-instruct".into();
    c.gpu.upstream.connect_timeout_ms = 2000;
    c.gpu.timeout_ms = 300_000;
    c.server.max_deadline_ms = 300_000;
    c.server.request_timeout_ms = 310_000;
    let sources =
        Sources { cpu: Arc::new(FakeCpu(Mutex::new(0.1))) as _, gpu: Arc::new(FakeGpu::with_free_mb(40_000)) as _ };
    let (addr, _gateway) = common::start_with(c, sources);

    let headers = [
        ("content-type", "application/json"),
        ("traceparent", &traceparent("01") as &str),
        ("tracestate", "vendor=abc"),
        ("x-tiergate-deadline-ms", "300000"),
        ("x-request-id", "trace-cascade-1"),
    ];
    let r = common::send(addr, "POST", "/v1/classify", &headers, json!({"text": common::BENIGN}).to_string()).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let d = r.json();
    let tiers: Vec<&str> = d["path"].as_array().unwrap().iter().map(|s| s["tier"].as_str().unwrap()).collect();
    assert_eq!(tiers, ["cpu", "gpu", "rules"], "{d}");
    let traceresponse = r.headers["traceresponse"].to_str().unwrap().to_string();
    assert!(traceresponse.starts_with(&format!("00-{TRACE}-")), "{traceresponse}");

    let spans = collector.trace(TRACE, 8).await;
    eprintln!("{}", render(&spans));
    let named = by_name(&spans);
    let root = &named["POST /v1/classify"];
    check_cascade_tree(&named, &d, &relay);
    assert_eq!(root.parent(), CLIENT_SPAN, "the root continues the client's span");
    assert_eq!(traceresponse, format!("00-{TRACE}-{}-01", root.id()));
    assert_eq!(root.span.trace_state, "vendor=abc");
    assert_eq!(root.service, "tiergate-test");
    assert_eq!(root.attr("tiergate.request_id").as_deref(), Some("trace-cascade-1"));
    // No message text anywhere in the export.
    for s in &spans {
        for kv in &s.span.attributes {
            let v = s.attr(&kv.key).unwrap_or_default();
            assert!(!v.contains("lunch"), "message text in {}.{}: {v}", s.span.name, kv.key);
        }
    }
    // The model server received the gpu span's context: its spans join the trace there.
    let sent = relay.seen.lock().unwrap().clone();
    let parent = sent.last().expect("the relay saw the model call")["traceparent"].to_str().unwrap().to_string();
    assert_eq!(parent, format!("00-{TRACE}-{}-01", named["tier gpu"].id()));
    assert_eq!(collector.content_types.lock().unwrap()[0], "application/x-protobuf");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_behind_a_route_gets_a_child_context_and_an_invalid_one_is_replaced() {
    let collector = Collector::start();
    let app = app::start();
    let addr = common::start(traced(&repo().join("policies"), &collector.url(), &app));
    let body = json!({"text": common::BENIGN}).to_string();

    let valid = traceparent("01");
    let r = common::proxy::post_json(addr, "/chat", body.clone(), &[("traceparent", &valid)]).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let spans = collector.trace(TRACE, 3).await;
    let named = by_name(&spans);
    let root = &named["POST"];
    assert_eq!(root.parent(), CLIENT_SPAN);
    assert_eq!(root.attr("tiergate.route").as_deref(), Some("chat"));
    let forward = &named["app"];
    assert_eq!(forward.parent(), root.id());
    assert_eq!(forward.span.kind, opentelemetry_proto::tonic::trace::v1::span::SpanKind::Client as i32);
    assert_eq!(forward.attr("http.response.status_code").as_deref(), Some("200"));
    let seen = app.last().headers["traceparent"].to_str().unwrap().to_string();
    assert_eq!(seen, format!("00-{TRACE}-{}-01", forward.id()), "the app's parent is tiergate's client span");
    assert!(named.contains_key("tier cpu") && named.contains_key("record"), "{:?}", named.keys());

    for invalid in [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-xyz",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        let r = common::proxy::post_json(
            addr,
            "/chat",
            body.clone(),
            &[("traceparent", invalid), ("tracestate", "evil=1")],
        )
        .await;
        assert_eq!(r.status, 200);
        let seen = app.last().headers.clone();
        let forwarded = seen["traceparent"].to_str().unwrap();
        assert_ne!(forwarded, invalid, "never echoed");
        let new_trace = forwarded.split('-').nth(1).unwrap().to_string();
        assert_eq!(new_trace.len(), 32);
        assert_ne!(new_trace, TRACE);
        assert!(seen.get("tracestate").is_none(), "the invalid parent's tracestate is dropped");
        let answered = r.headers["traceresponse"].to_str().unwrap();
        assert!(answered.contains(&new_trace), "{answered}");
        let spans = collector.trace(&new_trace, 3).await;
        let root = spans.iter().find(|s| s.span.name == "POST").unwrap();
        assert!(root.span.parent_span_id.is_empty(), "a new trace's root has no parent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_ratio_zero_blocked_decisions_are_still_exported_and_audited_with_their_trace_id() {
    let collector = Collector::start();
    let app = app::start();
    let mut c = traced(&repo().join("policies"), &collector.url(), &app);
    c.tracing.sampling_ratio = 0.0;
    let audit = std::env::temp_dir().join(format!("tiergate-traces-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&audit);
    c.audit = Some(tiergate::audit::AuditConfig { dir: audit.clone(), ..Default::default() });
    let addr = common::start(c);
    let trace_of =
        |r: &common::Reply| r.headers["traceresponse"].to_str().unwrap().split('-').nth(1).unwrap().to_string();
    let allowed = common::classify(addr, json!({"text": common::BENIGN})).await;
    assert_eq!(allowed.json()["action"], "allow");
    let blocked = common::classify(addr, json!({"text": common::PHISHING})).await;
    assert_eq!(blocked.json()["action"], "block");
    let spans = collector.trace(&trace_of(&blocked), 2).await;
    let root = spans.iter().find(|s| s.span.name == "POST /v1/classify").unwrap();
    assert_eq!(root.attr("tiergate.trace.kept").as_deref(), Some("blocked"));
    assert_eq!(root.attr("tiergate.action").as_deref(), Some("block"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let unsampled = trace_of(&allowed);
    assert!(
        collector.spans.lock().unwrap().iter().all(|s| s.trace_id() != unsampled),
        "an allowed decision at ratio 0 is not exported"
    );
    assert!(allowed.headers["traceresponse"].to_str().unwrap().ends_with("-00"), "not sampled");
    // The audit record leads to the trace, sampled or not.
    for reply in [&blocked, &allowed] {
        let record = audited(&audit, reply.json()["request_id"].as_str().unwrap()).await;
        assert_eq!(record.trace_id, Some(trace_of(reply)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_features_model_is_a_span_of_its_own_with_its_step() {
    let collector = Collector::start();
    let app = app::start();
    let mut c = traced(&repo().join("policies"), &collector.url(), &app);
    c.features_model = Some(tiergate::features_model::FeaturesModelConfig { dir: repo().join("models/features") });
    let addr = common::start(c);
    let features = json!({"amount": 1630, "card_not_present": true, "is_night": true, "is_weekend": false,
                          "billing_shipping_km": 2407});
    let r = common::classify(addr, json!({"text": common::BENIGN, "features": features})).await;
    assert_eq!((r.json()["action"].as_str(), r.json()["tier"].as_str()), (Some("block"), Some("features")));
    let trace_id = r.headers["traceresponse"].to_str().unwrap().split('-').nth(1).unwrap().to_string();
    let spans = collector.trace(&trace_id, 3).await;
    let span = spans.iter().find(|s| s.span.name == "tier features").expect("a `tier features` span");
    assert_eq!(span.attr("tiergate.tier").as_deref(), Some("features"));
    assert_eq!(span.attr("tiergate.outcome").as_deref(), Some("accepted"));
    assert!(span.attr("tiergate.risk_score").is_some_and(|r| r.parse::<f64>().unwrap() > 0.9), "{:?}", span.span);
}

/// The audit record of `request_id`, once the writer has committed it (waits up to 10 s).
async fn audited(dir: &std::path::Path, request_id: &str) -> tiergate::audit::AuditRecord {
    use tiergate::audit::query::{self, Filter};
    for _ in 0..500 {
        if let Ok(conn) = tiergate::audit::store::Store::open_read_only(dir) {
            let mut found = Vec::new();
            let filter = Filter { request_id: Some(request_id.into()), ..Filter::default() };
            query::for_each(&conn, &filter, |json| {
                found.push(serde_json::from_str(json)?);
                Ok(())
            })
            .unwrap();
            if let Some(record) = found.pop() {
                return record;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no audit record for {request_id}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_written_for_a_request_name_its_trace() {
    let dir = std::env::temp_dir().join(format!("tiergate-traces-log-{}", std::process::id()));
    let dead = common::proxy::dead_address();
    let extra = format!(
        "[tracing]\nenabled = true\nendpoint = \"{dead}/v1/traces\"\n{}",
        routes::route("dead", "/dead", &dead)
    );
    let sidecar = common::Sidecar::serve_in(&dir, &repo().join("policies"), &extra);
    let r = common::send(sidecar.public, "GET", "/dead/x", &[("traceparent", &traceparent("01"))], "").await;
    assert_eq!(r.status, 502);
    let span = r.headers["traceresponse"].to_str().unwrap().split('-').nth(2).unwrap().to_string();
    let mut log = String::new();
    for _ in 0..100 {
        log = sidecar.log_text();
        if log.contains("response failed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ids = format!("trace_id={TRACE} span_id={span}");
    for line in ["app request failed", "response failed"] {
        let found = log.lines().find(|l| l.contains(line)).unwrap_or_else(|| panic!("no {line:?} in:\n{log}"));
        assert!(found.contains(&ids), "{found}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_exporter_down_no_request_fails_and_drops_are_counted() {
    let dead = format!("{}/v1/traces", common::proxy::dead_address());
    let app = app::start();
    let mut c = traced(&repo().join("policies"), &dead, &app);
    c.tracing.export_timeout_ms = 500;
    let addr = common::start(c);
    for i in 0..20 {
        let text = if i % 2 == 0 { common::BENIGN } else { common::PHISHING };
        let r = common::classify(addr, json!({"text": text})).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert!(r.headers.contains_key("traceresponse"));
    }
    // The series is exported from the start (at 0): wait for the failed exports to count.
    let export_failed = |metrics: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with("tiergate_trace_spans_dropped_total{reason=\"export_failed\"}"))
            .unwrap_or_else(|| panic!("no export_failed series in:\n{metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = String::from_utf8_lossy(&common::send(addr, "GET", "/metrics", &[], "").await.body).into_owned();
        if export_failed(&metrics) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(export_failed(&metrics) >= 1.0, "no export_failed drops in:\n{metrics}");
    assert!(metrics.contains("tiergate_trace_spans_exported_total 0"), "nothing was exported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tower_layer_screens_in_a_trace_under_the_requests_traceparent() {
    use tower::ServiceExt;
    let collector = Collector::start();
    let app = app::start();
    let config = traced(&repo().join("policies"), &collector.url(), &app);
    let gateway = tiergate::Gateway::start(&config.gateway(), Sources::default()).expect("gateway starts");
    let screen: tiergate::proxy::config::ScreenConfig = toml::from_str(r#"text = ["header:x-text"]"#).unwrap();
    let layer =
        tiergate::proxy::layer::TierGateLayer::new(Arc::clone(&gateway), config.server.clone(), "inproc", &screen)
            .unwrap();
    let service = tower::ServiceBuilder::new().layer(layer).service(tower::service_fn(
        |_: Request<tiergate::web::BoxBody>| async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) },
    ));
    let request = Request::get("/")
        .header("x-text", common::PHISHING)
        .header("traceparent", traceparent("00"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 403);
    // Unsampled by the client, exported because blocked.
    let spans = collector.trace(TRACE, 4).await;
    let named = by_name(&spans);
    let root = &named["tiergate screen inproc"];
    assert_eq!(root.parent(), CLIENT_SPAN);
    assert_eq!(root.attr("tiergate.trace.kept").as_deref(), Some("blocked"));
    assert_eq!(root.attr("error.type").as_deref(), Some("blocked"));
    for stage in ["admission", "canonical", "guards", "record"] {
        assert_eq!(named[stage].parent(), root.id(), "{stage}");
    }
}
