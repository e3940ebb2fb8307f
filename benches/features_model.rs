//! The features model's cost on the request path: a request's `features` read into the model's
//! row by the schema and scored by ONNX Runtime (the bundled 120-tree ensemble over 18
//! features), one call at a time as the gateway makes them; and, apart, `explain`'s TreeSHAP.
//! Latency percentiles over every call (the bound: p99 ≤ 100 µs for scoring), after a
//! warm-up, on the rows of tests/data/features_reference.json in turn.
//!
//! Run: `cargo bench --bench features_model` (FEATURES_BENCH_CALLS, default 20000)

use serde_json::Value;
use std::time::Instant;
use tiergate::features_model::FeaturesModel;

fn percentiles(mut us: Vec<f64>) -> (f64, f64, f64, f64) {
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() as f64 * q) as usize).min(us.len() - 1)];
    (at(0.5), at(0.99), at(0.999), us[us.len() - 1])
}

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let env = tiergate::ort_lib::environment(None).expect("ONNX Runtime");
    let model = FeaturesModel::load(&root.join("models/features"), env).expect("the bundled features model");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("tests/data/features_reference.json")).unwrap())
            .unwrap();
    let requests: Vec<serde_json::Map<String, Value>> =
        reference["rows"].as_array().unwrap().iter().map(|r| r["features"].as_object().unwrap().clone()).collect();
    let calls: usize = std::env::var("FEATURES_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);

    let mut score_us = Vec::with_capacity(calls);
    let mut shap_us = Vec::with_capacity(calls / 10);
    for i in 0..calls + 1000 {
        let features = &requests[i % requests.len()];
        let t = Instant::now();
        let row = model.schema.vector(features).unwrap();
        let score = model.score(&row).unwrap();
        let took = t.elapsed().as_secs_f64() * 1e6;
        if i >= 1000 {
            score_us.push(took);
            if i % 10 == 0 {
                let t = Instant::now();
                std::hint::black_box(model.contributions(&row, score).unwrap());
                shap_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    println!("features model ({}), {calls} calls, µs:", model.manifest.name);
    println!("| step | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|");
    for (name, us) in
        [("schema row + score (request path)", score_us), ("TreeSHAP contributions (explain only)", shap_us)]
    {
        let (p50, p99, p999, max) = percentiles(us);
        println!("| {name} | {p50:.1} | {p99:.1} | {p999:.1} | {max:.1} |");
    }
}
