//! The physical limit of the cpu tier on this machine: the INT8 model called directly through
//! ONNX Runtime from Rust (tokenisation included, no queue, no HTTP), at batch sizes 1..32, on
//! short (~20 tokens) and long (128 tokens, truncated) real messages, with 1 and 2 intra-op threads.
//!
//! Run: `cargo bench --bench ceiling` (criterion reports time per batch and sequences/s).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::path::Path;
use tiergate::config::ModelConfig;
use tiergate::tier::model::{ModelAssets, SessionOptions};

fn messages(long: bool) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let (file, keep): (&str, fn(&str) -> bool) =
        if long { ("test_sample.jsonl", |t| t.len() > 1500) } else { ("ood_short.jsonl", |t| t.len() < 160) };
    std::fs::read_to_string(root.join(file))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_string))
        .filter(|t| keep(t))
        .take(32)
        .collect()
}

fn bench(c: &mut Criterion) {
    let env = tiergate::ort_lib::environment(None).expect("ONNX Runtime");
    let assets = ModelAssets::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models")).unwrap();
    for threads in [1, 2] {
        let options = SessionOptions::from(&ModelConfig { intra_threads: threads, ..ModelConfig::default() });
        let mut classifier = assets.classifier(env, options).unwrap();
        for long in [false, true] {
            let texts = messages(long);
            assert_eq!(texts.len(), 32, "32 messages of each kind");
            let mut group =
                c.benchmark_group(format!("ceiling/{}/threads{threads}", if long { "long" } else { "short" }));
            group
                .sample_size(10)
                .warm_up_time(std::time::Duration::from_millis(500))
                .measurement_time(std::time::Duration::from_secs(2));
            for batch in [1usize, 2, 4, 8, 16, 32] {
                group.throughput(Throughput::Elements(batch as u64));
                let refs: Vec<&str> = texts.iter().take(batch).map(String::as_str).collect();
                group.bench_with_input(BenchmarkId::from_parameter(batch), &refs, |b, refs| {
                    b.iter(|| classifier.classify(refs).unwrap())
                });
            }
            group.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
