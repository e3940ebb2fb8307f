//! The drift monitor end to end: a running tiergate with a small window, fed real requests,
//! read from `/metrics`. A stream drawn from the reference's own sample (the multilingual
//! validation split's `val_ml_sample.jsonl`: a seeded bootstrap sample of its rows) keeps the
//! text-length KS below 0.1; English mailing-list e-mails after it (`val_sample.jsonl`, several
//! times longer than the chat and SMS that make up most of the reference) raise it above 0.1.
//! The measured gauge values then go through the real alert rule with promtool.

mod common;

use common::{classify_unhurried, config, labelled, repo, send, start_with};
use std::net::SocketAddr;
use tiergate::gateway::Sources;

/// The window: as large as the reference (300 rows), so a same-distribution window's KS is
/// mostly below 0.1 (its 95 % critical value is 1.36·√(2/300) ≈ 0.11; the seeded sample is
/// fixed, so the test is deterministic).
const WINDOW: usize = 300;

async fn gauge(addr: SocketAddr, series: &str) -> Option<f64> {
    let body = send(addr, "GET", "/metrics", &[], "").await.body;
    let text = String::from_utf8_lossy(&body).to_string();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Sends every text, then waits until the drift task has seen a full window of them.
async fn feed(addr: SocketAddr, texts: &[String]) -> f64 {
    for t in texts {
        let r = classify_unhurried(addr, serde_json::json!({ "text": t })).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
    }
    // The task recomputes every 100 ms; two ticks after the last request the window is current.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(gauge(addr, "tiergate_drift_window_size").await, Some(WINDOW as f64));
    gauge(addr, "tiergate_drift_ks{signal=\"text_chars\"}").await.expect("the text length KS gauge")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shifted_stream_raises_the_text_length_ks_and_an_unshifted_one_does_not() {
    let mut c = config(&repo().join("policies"));
    c.drift.window = WINDOW;
    c.drift.min_window = WINDOW;
    c.drift.interval_ms = 100;
    let (addr, _) = start_with(c, Sources::default());

    // Before a full window the gauges read NaN (the alert's `> 0.1` is false on NaN).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(gauge(addr, "tiergate_drift_ks{signal=\"text_chars\"}").await.unwrap().is_nan());

    let val: Vec<String> = labelled("val_ml_sample.jsonl").into_iter().map(|(t, _)| t).collect();
    let mut rng = fastrand::Rng::with_seed(14);
    let unshifted: Vec<String> = (0..WINDOW).map(|_| val[rng.usize(..val.len())].clone()).collect();
    let ks_unshifted = feed(addr, &unshifted).await;
    assert!(ks_unshifted < 0.1, "unshifted stream: KS {ks_unshifted}");
    for signal in ["risk_score", "ood_score"] {
        let ks = gauge(addr, &format!("tiergate_drift_ks{{signal=\"{signal}\"}}")).await.unwrap();
        assert!((0.0..=1.0).contains(&ks), "{signal}: {ks}");
    }
    assert!(gauge(addr, "tiergate_drift_tvd{signal=\"language\"}").await.unwrap() <= 1.0);

    let mail: Vec<String> = labelled("val_sample.jsonl").into_iter().map(|(t, _)| t).take(WINDOW).collect();
    assert_eq!(mail.len(), WINDOW);
    let ks_shifted = feed(addr, &mail).await;
    assert!(ks_shifted > 0.1, "shifted stream: KS {ks_shifted}");

    alert_fires_on(ks_shifted, ks_unshifted);
}

/// The measured values through `TiergateInputDrift` of deploy/prometheus/alerts.yml, with
/// promtool (deploy/prometheus/check.sh fetches it): it fires for the shifted value held 20
/// minutes and not for the unshifted one.
fn alert_fires_on(shifted: f64, unshifted: f64) {
    let dir = std::env::temp_dir().join(format!("tiergate-drift-alert-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = repo().join("deploy/prometheus/alerts.yml");
    let test = format!(
        r#"rule_files: ["{rules}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'tiergate_drift_ks{{instance="shifted", signal="text_chars"}}'
        values: '{shifted}x30'
      - series: 'tiergate_drift_ks{{instance="unshifted", signal="text_chars"}}'
        values: '{unshifted}x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: TiergateInputDrift
        exp_alerts:
          - exp_labels: {{severity: warning, instance: shifted, signal: text_chars}}
            exp_annotations:
              summary: live traffic no longer looks like the model's reference
              runbook: docs/operations.md#tiergateinputdrift
"#,
        rules = rules.display()
    );
    let path = dir.join("drift_test.yml");
    std::fs::write(&path, test).unwrap();
    let out = std::process::Command::new(repo().join("deploy/prometheus/check.sh"))
        .arg(&path)
        .output()
        .expect("deploy/prometheus/check.sh runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && log.contains("SUCCESS"), "{log}");
}
