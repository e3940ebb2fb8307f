//! One decision through the gateway in process, without HTTP: admission, rating, the cascade
//! with the real cpu tier (the bundled model, config defaults, bundled policies), rules, guards,
//! drift and metrics — what an architecture change must leave as fast as it was. A short message
//! (one window) and a long one (several windows). A fixed CPU reading keeps routing on the cpu
//! tier; no gpu tier. `layer/short`: the short message through `TierGateLayer` in front of a
//! service that answers at once — the proxy's screening pipeline (read the JSON body, decide,
//! record, dispose, decision headers) around the same decision; `layer/short_rules`: the same
//! with the bundled policy's cpu `max_utilization` lowered under the fixed reading, so rules
//! decide and the pipeline's own cost is not hidden under an inference.
//!
//! Run: `cargo bench --bench decide`. Before/after a change: build this bench at both commits
//! and run the two binaries alternately on an idle machine (docs/BENCHMARKS.md, "Architecture").

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::Full;
use std::convert::Infallible;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tiergate::config::Config;
use tiergate::gateway::{Gateway, Sources};
use tiergate::proxy::config::ScreenConfig;
use tiergate::proxy::layer::TierGateLayer;
use tiergate::readings::cpu::CpuSource;
use tiergate::request::ClassifyRequest;
use tiergate::web::BoxBody;
use tower::{ServiceBuilder, ServiceExt};

const SHORT: &str = "Your account is locked. Confirm your password at http://secure-login.example.top/verify";

/// A paragraph of ordinary mail, repeated to about 3 KB (several of the model's windows).
const PARAGRAPH: &str = "Hi team, a quick recap of Thursday's planning session: the dashboard release moves to \
    the 14th so QA has a full week with the new filters, Priya owns the changelog, and the offsite venue is \
    confirmed for the Lakeside Room with lunch covered and parking validated at reception. ";

/// A CPU reading that never changes, so load never moves a request off the cpu tier.
struct Idle;

impl CpuSource for Idle {
    fn sample(&self) -> Option<f64> {
        Some(0.1)
    }
}

fn bench(c: &mut Criterion) {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut config = Config::default();
    config.model.dir = repo.join("models");
    config.policies.dir = repo.join("policies");
    config.policies.watch = false;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let gateway: Arc<Gateway> = rt.block_on(async {
        Gateway::start(&config.gateway(), Sources { cpu: Arc::new(Idle), ..Default::default() }).unwrap()
    });
    let long = PARAGRAPH.repeat(3000 / PARAGRAPH.len() + 1);
    let mut group = c.benchmark_group("decide");
    group.measurement_time(Duration::from_secs(10));
    for (name, text) in [("short", SHORT), ("long_3kb", long.as_str())] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let req = ClassifyRequest::new(
                    text.to_string(),
                    Default::default(),
                    None,
                    Duration::from_secs(5),
                    &config.server,
                )
                .unwrap();
                let d = rt.block_on(gateway.classify(req, "bench".into())).unwrap();
                black_box(d)
            })
        });
    }
    group.finish();
    let rules_only = {
        // The bundled policies with the cpu tier ineligible at the fixed 0.1 reading.
        let dir = std::env::temp_dir().join(format!("tiergate-bench-policies-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut lowered = 0;
        for entry in std::fs::read_dir(repo.join("policies")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                lowered += text.matches("max_utilization = 1.0").count();
                let text = text.replace("max_utilization = 1.0", "max_utilization = 0.05");
                std::fs::write(dir.join(path.file_name().unwrap()), text).unwrap();
            }
        }
        // Else `short_rules` would silently time the model again.
        assert!(
            lowered > 0,
            "no `max_utilization = 1.0` in policies/: layer/short_rules needs another way to rule out the cpu tier"
        );
        let mut config = config.clone();
        config.policies.dir = dir;
        rt.block_on(async {
            Gateway::start(&config.gateway(), Sources { cpu: Arc::new(Idle), ..Default::default() }).unwrap()
        })
    };
    let mut group = c.benchmark_group("layer");
    group.measurement_time(Duration::from_secs(10));
    for (name, gateway) in [("short", &gateway), ("short_rules", &rules_only)] {
        let screen: ScreenConfig = toml::from_str(r#"text = ["/text"]"#).unwrap();
        let layer = TierGateLayer::new(Arc::clone(gateway), config.server.clone(), "bench", &screen).unwrap();
        let service = ServiceBuilder::new().layer(layer).service(tower::service_fn(|_req: Request<BoxBody>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }));
        let body = serde_json::json!({ "text": SHORT }).to_string();
        group.bench_function(name, |b| {
            b.iter(|| {
                let request = Request::post("/")
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.clone())))
                    .unwrap();
                black_box(rt.block_on(service.clone().oneshot(request)).unwrap())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
