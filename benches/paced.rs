//! What one inference costs when requests arrive paced rather than back to back (issue 28's
//! "unloaded gap"): the bundled model on one session of one intra-op thread (the shipped 2x1
//! layout, one worker), over `e2e.sh`'s short messages in file order, each call's wall time and
//! the calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`; ONNX Runtime runs a 1-thread session
//! on the caller), with the thread asleep for a fixed gap between calls: 0 (the ceiling bench's
//! back-to-back), 1, 5 (one worker's share of 400/s) and 20 ms.
//!
//! Run: `cargo bench --bench paced` (about a minute). Prints one table row per gap: median and
//! p90 wall time per call, mean thread CPU per call.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};
use tiergate::tier::model::{ModelAssets, SessionOptions};
use tiergate::tier::ModelConfig;

/// The calling thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and criterion-style probes
    }
    let env = tiergate::ort_lib::environment(None).expect("ONNX Runtime");
    let assets = ModelAssets::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models")).unwrap();
    let mut classifier = assets
        .classifier(env, SessionOptions::from(&ModelConfig { intra_threads: 1, ..ModelConfig::default() }), None)
        .unwrap();
    let texts = common::texts("ood_short.jsonl", |t| t.len() < 160);
    let calls = 400;
    for text in texts.iter().take(50) {
        classifier.classify(&[text]).unwrap(); // warm up
    }
    println!("| gap between calls | calls | wall per call, p50 | wall per call, p90 | thread CPU per call, mean |");
    println!("| --- | --- | --- | --- | --- |");
    // Back to back last as well as first: the VM's state drifts; two rows show by how much.
    for gap_ms in [0u64, 1, 5, 20, 0] {
        let gap = Duration::from_millis(gap_ms);
        let mut walls = Vec::with_capacity(calls);
        let cpu_start = thread_cpu();
        let mut slept = Duration::ZERO;
        for i in 0..calls {
            if !gap.is_zero() {
                let c = thread_cpu();
                std::thread::sleep(gap);
                // Sleeping costs the thread a little CPU (the syscall); not the inference's.
                slept += thread_cpu() - c;
            }
            let start = Instant::now();
            classifier.classify(&[&texts[i % texts.len()]]).unwrap();
            walls.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let cpu = (thread_cpu() - cpu_start - slept).as_secs_f64() * 1e3 / calls as f64;
        walls.sort_by(f64::total_cmp);
        println!(
            "| {gap_ms} ms | {calls} | {:.2} ms | {:.2} ms | {cpu:.2} ms |",
            quantile(&walls, 0.5),
            quantile(&walls, 0.9)
        );
    }
}
