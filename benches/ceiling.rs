//! The physical limit of the cpu tier on this machine: the INT8 model called directly through
//! ONNX Runtime from Rust (tokenisation included, no queue, no HTTP), at batch sizes 1..32, on
//! short (~20 tokens) and long (128 tokens, truncated) real messages, with 1 and 2 intra-op threads.
//!
//! Run: `cargo bench --bench ceiling` (criterion reports time per batch and sequences/s).
//!
//! The `ceiling_stream` groups measure the same model on the message stream that the
//! end-to-end benchmark (benches/e2e.sh) sends: *all* messages of each kind, in the order of the
//! file, in consecutive batches that wrap around (so a batch is padded to the longest of
//! whichever messages arrive together, as in the server). Two layouts of the same two threads:
//! `1x2` (one session, 2 intra-op threads) and `2x1` (two sessions of 1 thread, each on its own
//! OS thread, running in parallel: the time is the wall time of both); and `1x1` at batch 1,
//! the cost of one request in the 2x1 layout.
//! Only those: `cargo bench --bench ceiling -- stream`.

mod common;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::path::Path;
use tiergate::tier::model::{ModelAssets, SessionOptions};
use tiergate::tier::ModelConfig;

fn messages(long: bool) -> Vec<String> {
    let mut all = all_messages(long);
    all.truncate(32);
    all
}

/// Every message of a kind, as `benches/e2e.sh` selects them (short: < 160 bytes; long: > 1500).
fn all_messages(long: bool) -> Vec<String> {
    if long {
        common::texts("test_sample.jsonl", |t| t.len() > 1500)
    } else {
        common::texts("ood_short.jsonl", |t| t.len() < 160)
    }
}

/// The `i`-th batch of `batch` consecutive messages, wrapping around.
fn window(texts: &[String], i: usize, batch: usize) -> Vec<&str> {
    (0..batch).map(|k| texts[(i * batch + k) % texts.len()].as_str()).collect()
}

fn bench_stream(c: &mut Criterion) {
    let env = tiergate::ort_lib::environment(None).expect("ONNX Runtime");
    let assets = ModelAssets::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models")).unwrap();
    let one = |threads| SessionOptions::from(&ModelConfig { intra_threads: threads, ..ModelConfig::default() });
    let mut alone = assets.classifier(env, one(1), None).unwrap();
    let mut single = assets.classifier(env, one(2), None).unwrap();
    let mut pair = [assets.classifier(env, one(1), None).unwrap(), assets.classifier(env, one(1), None).unwrap()];
    for long in [false, true] {
        let texts = all_messages(long);
        let kind = if long { "long" } else { "short" };
        let batches: &[usize] = if long { &[1, 2, 4, 8] } else { &[1, 2, 4, 8, 16] };
        // One inference at a time on one thread: what one request costs in the 2x1 layout.
        let mut group = c.benchmark_group(format!("ceiling_stream/{kind}/1x1"));
        group
            .sample_size(10)
            .warm_up_time(std::time::Duration::from_millis(500))
            .measurement_time(std::time::Duration::from_secs(2));
        group.throughput(Throughput::Elements(1));
        let mut i = 0;
        group.bench_function(BenchmarkId::from_parameter(1), |b| {
            b.iter(|| {
                i += 1;
                alone.classify(&window(&texts, i, 1)).unwrap()
            })
        });
        group.finish();
        let mut group = c.benchmark_group(format!("ceiling_stream/{kind}/1x2"));
        group
            .sample_size(10)
            .warm_up_time(std::time::Duration::from_millis(500))
            .measurement_time(std::time::Duration::from_secs(2));
        for &batch in batches {
            group.throughput(Throughput::Elements(batch as u64));
            let mut i = 0;
            group.bench_function(BenchmarkId::from_parameter(batch), |b| {
                b.iter(|| {
                    i += 1;
                    single.classify(&window(&texts, i, batch)).unwrap()
                })
            });
        }
        group.finish();
        let mut group = c.benchmark_group(format!("ceiling_stream/{kind}/2x1"));
        group
            .sample_size(10)
            .warm_up_time(std::time::Duration::from_millis(500))
            .measurement_time(std::time::Duration::from_secs(2));
        for &batch in batches {
            group.throughput(Throughput::Elements(2 * batch as u64));
            group.bench_function(BenchmarkId::from_parameter(batch), |b| {
                b.iter_custom(|iters| {
                    let start = std::time::Instant::now();
                    std::thread::scope(|scope| {
                        for (w, classifier) in pair.iter_mut().enumerate() {
                            let texts = &texts;
                            scope.spawn(move || {
                                for i in 0..iters as usize {
                                    classifier.classify(&window(texts, 2 * i + w, batch)).unwrap();
                                }
                            });
                        }
                    });
                    start.elapsed()
                })
            });
        }
        group.finish();
    }
}

fn bench(c: &mut Criterion) {
    let env = tiergate::ort_lib::environment(None).expect("ONNX Runtime");
    let assets = ModelAssets::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models")).unwrap();
    for threads in [1, 2] {
        let options = SessionOptions::from(&ModelConfig { intra_threads: threads, ..ModelConfig::default() });
        let mut classifier = assets.classifier(env, options, None).unwrap();
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

criterion_group!(benches, bench, bench_stream);
criterion_main!(benches);
