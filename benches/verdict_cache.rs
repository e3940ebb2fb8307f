//! What a verdict cache hit costs against the request path's own figure, in one run: one
//! decision through the gateway in process (no HTTP), three ways, interleaved so that the
//! machine's state is the same for each:
//!
//! - `rules`: the request path without a model — the bundled policies with the cpu tier ruled out
//!   (`max_utilization` under the fixed reading), so rules decide; cache off;
//! - `hit`: the same message with the cache on, its cpu verdict stored: the cascade reuses it;
//! - `miss`: the same message with a new `features` value each time: a lookup, the model call and
//!   the insertion (one in every 25 rounds; what a hit saves).
//!
//! Every path runs admission, canonicalisation, guards, the allow-list, drift and metrics. The
//! issue's bound: hit p99 ≤ rules p99 + 20 µs.
//!
//! Run: `cargo bench --bench verdict_cache` (`ROUNDS=N` to change the 40,000 rounds).

use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiergate::config::Config;
use tiergate::gateway::{CacheConfig, Gateway, Sources};
use tiergate::readings::cpu::CpuSource;
use tiergate::request::ClassifyRequest;

const SHORT: &str = "Your account is locked. Confirm your password at http://secure-login.example.top/verify";

/// A CPU reading that never changes, so load never moves a request off the cpu tier.
struct Idle;

impl CpuSource for Idle {
    fn sample(&self) -> Option<f64> {
        Some(0.1)
    }
}

/// The bundled policies with the cpu tier ineligible at the fixed 0.1 reading.
fn rules_only_policies(repo: &Path) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-bench-cache-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lowered = 0;
    for entry in std::fs::read_dir(repo.join("policies")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            lowered += text.matches("max_utilization = 1.0").count();
            std::fs::write(
                dir.join(path.file_name().unwrap()),
                text.replace("max_utilization = 1.0", "max_utilization = 0.05"),
            )
            .unwrap();
        }
    }
    assert!(lowered > 0, "no `max_utilization = 1.0` in policies/: `rules` needs another way to rule out the cpu tier");
    dir
}

fn start(rt: &tokio::runtime::Runtime, config: &Config) -> Arc<Gateway> {
    rt.block_on(async {
        Gateway::start(&config.gateway(), Sources { cpu: Arc::new(Idle), ..Default::default() }).unwrap()
    })
}

/// One decision's time, µs; `cpu_cached` is what the decision's cpu step must say (`None`: no
/// model step expected), so that no figure silently times another path.
fn decide(
    rt: &tokio::runtime::Runtime,
    g: &Gateway,
    config: &Config,
    features: Map<String, Value>,
    cpu_cached: Option<bool>,
) -> f64 {
    let t = Instant::now();
    let req = ClassifyRequest::new(SHORT.into(), features, None, Duration::from_secs(5), &config.server).unwrap();
    let d = rt.block_on(g.classify(req, "bench".into())).unwrap();
    let us = t.elapsed().as_secs_f64() * 1e6;
    let cpu = d.path.iter().find(|s| s.tier == tiergate::decision::TierName::Cpu && s.risk_score.is_some());
    assert_eq!(cpu.map(|s| s.cached), cpu_cached, "{:?}", d.path);
    black_box(d);
    us
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn report(name: &str, mut us: Vec<f64>) -> f64 {
    us.sort_by(f64::total_cmp);
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    let [p50, p90, p99, p999] = [0.5, 0.9, 0.99, 0.999].map(|p| percentile(&us, p));
    println!("{name:>5} {:>7} {mean:>9.1} {p50:>9.1} {p90:>9.1} {p99:>9.1} {p999:>9.1}", us.len());
    p99
}

fn main() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(40_000);
    let mut config = Config::default();
    config.model.dir = repo.join("models");
    config.policies.dir = repo.join("policies");
    config.policies.watch = false;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mut rules_config = config.clone();
    rules_config.policies.dir = rules_only_policies(&repo);
    let rules = start(&rt, &rules_config);
    config.cache = CacheConfig { enabled: true, ..CacheConfig::default() };
    let cached = start(&rt, &config);
    let none = Map::new();
    decide(&rt, &cached, &config, none.clone(), Some(false));
    for _ in 0..2000 {
        decide(&rt, &rules, &rules_config, none.clone(), None);
        decide(&rt, &cached, &config, none.clone(), Some(true));
    }
    let (mut r, mut h, mut m) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds), Vec::new());
    for i in 0..rounds {
        r.push(decide(&rt, &rules, &rules_config, none.clone(), None));
        h.push(decide(&rt, &cached, &config, none.clone(), Some(true)));
        if i % 25 == 0 {
            let fresh = json!({ "round": i }).as_object().unwrap().clone();
            m.push(decide(&rt, &cached, &config, fresh, Some(false)));
        }
    }
    println!("one decision in process, µs ({rounds} rounds, interleaved)");
    println!("{:>5} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}", "path", "n", "mean", "p50", "p90", "p99", "p99.9");
    let rules_p99 = report("rules", r);
    let hit_p99 = report("hit", h);
    report("miss", m);
    let verdict = if hit_p99 <= rules_p99 + 20.0 { "within" } else { "OVER" };
    println!("hit p99 - rules p99 = {:+.1} µs: {verdict} the bound of +20 µs", hit_p99 - rules_p99);
}
