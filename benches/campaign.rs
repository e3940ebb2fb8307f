//! The cost of a campaign lookup (`tiergate::campaign::Campaigns::lookup`: MinHash bands,
//! entities, HMACs and the store), measured per call for percentiles, in one run: the local
//! store alone, then with a real Redis on loopback (tests/common/redis.rs; one EVALSHA per
//! lookup), then the lookup sent beside a shared quota check as the gateway sends them
//! (`tokio::join!` on the one multiplexed connection), against the quota check alone.
//!
//! Run: `cargo bench --bench campaign` (prints p50 / p99 / max per case, and the EVALSHA count
//! per lookup from Redis's `INFO commandstats`).

#[path = "../tests/common/redis.rs"]
mod redis_server;
#[path = "../tests/common/service.rs"]
mod service;

/// A loopback port for redis-server (the bench binds nothing else, so `bind(0)` cannot race).
fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

use std::sync::Arc;
use std::time::{Duration, Instant};
use tiergate::campaign::metrics::CampaignMetrics;
use tiergate::campaign::{CampaignConfig, Campaigns};
use tiergate::tenant::shared::{OnOutage, RedisConfig, SharedQuotaMetrics, SharedQuotas};
use tiergate::tenant::{LocalQuotas, Quota, QuotaStore};

/// A realistic mix: one template varied per sender (names, amounts, a link and an IBAN), and
/// as many unrelated texts.
fn texts(n: usize) -> Vec<(String, serde_json::Map<String, serde_json::Value>)> {
    (0..n)
        .map(|i| {
            let text = if i % 2 == 0 {
                format!(
                    "Hi customer {i}, your parcel {} is waiting at the depot. Confirm delivery of your {}.50 EUR order at \
                     https://parcel-{}.example/p/{i} or pay to DE89 3704 0044 0532 0130 00 so we can bring it tomorrow.",
                    48_000 + i,
                    i % 90,
                    i % 500
                )
            } else {
                format!("Meeting notes {i}: the roadmap review moves to room {} on Thursday; bring the draft.", i % 40)
            };
            let features = serde_json::json!({ "sender_id": format!("s{}", i % 2000) });
            (text, features.as_object().cloned().unwrap())
        })
        .collect()
}

fn percentiles(name: &str, mut times: Vec<Duration>) {
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!(
        "{name:<40} n={:<6} p50 {:>8.1} µs  p99 {:>8.1} µs  max {:>8.1} µs",
        times.len(),
        at(0.50).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6,
        times[times.len() - 1].as_secs_f64() * 1e6
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let config = CampaignConfig { enabled: true, key: Some("bench-key-0123456789abcdef".into()), ..Default::default() };
    let inputs = texts(20_000);

    let local = Campaigns::new(&config, None, CampaignMetrics::register(&mut Default::default(), 10)).unwrap().unwrap();
    let mut times = Vec::with_capacity(inputs.len());
    for (text, features) in &inputs {
        let t = Instant::now();
        std::hint::black_box(rt.block_on(local.lookup(text, Some("acme"), features)));
        times.push(t.elapsed());
    }
    percentiles("campaign/lookup local", times);
    let mut times = Vec::new();
    for (text, _) in inputs.iter().take(5_000) {
        let t = Instant::now();
        std::hint::black_box(tiergate::campaign::minhash::bands(text));
        times.push(t.elapsed());
    }
    percentiles("campaign/minhash bands only", times);

    let redis = redis_server::Redis::start();
    let mut rc = RedisConfig::new(redis.url(), 2);
    rc.on_outage = OnOutage::Closed;
    rc.timeout_ms = 100;
    let quotas = SharedQuotas::new(&rc, Arc::new(LocalQuotas::new()), SharedQuotaMetrics::default()).unwrap();
    rt.block_on(quotas.connect()).unwrap();
    let link = Some((quotas.link(), rc.key_prefix.clone()));
    let shared =
        Campaigns::new(&config, link, CampaignMetrics::register(&mut Default::default(), 10)).unwrap().unwrap();
    let quota = Quota { per_second: u32::MAX / 2, burst: u32::MAX / 2 };
    // Loads the scripts (NOSCRIPT, SCRIPT LOAD) before the count starts.
    let warm = rt.block_on(shared.lookup(&inputs[0].0, Some("acme"), &inputs[0].1));
    assert!(warm.shared, "Redis answered the warm-up lookup");
    rt.block_on(quotas.check_rate("acme", quota)).unwrap();
    ::redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut redis.client()).unwrap();

    let n = 5_000;
    let mut times = Vec::new();
    for (text, features) in inputs.iter().take(n) {
        let t = Instant::now();
        let v = rt.block_on(shared.lookup(text, Some("acme"), features));
        times.push(t.elapsed());
        assert!(v.shared, "Redis answered");
    }
    percentiles("campaign/lookup redis", times);
    let (mut alone, mut both) = (Vec::new(), Vec::new());
    for (text, features) in inputs.iter().skip(n).take(n) {
        let t = Instant::now();
        rt.block_on(quotas.check_rate("acme", quota)).unwrap();
        alone.push(t.elapsed());
        let t = Instant::now();
        let (q, v) = rt.block_on(async {
            tokio::join!(quotas.check_rate("acme", quota), shared.lookup(text, Some("acme"), features))
        });
        both.push(t.elapsed());
        assert!(q.is_ok() && v.shared);
    }
    percentiles("quota/check_rate alone", alone);
    percentiles("quota/check_rate + campaign/lookup joined", both);
    let stats: String = ::redis::cmd("INFO").arg("commandstats").query(&mut redis.client()).unwrap();
    let evalsha = stats.lines().find(|l| l.starts_with("cmdstat_evalsha:")).unwrap_or("cmdstat_evalsha: none");
    println!("redis {evalsha}\n(expected calls: {} lookups + {} quota checks = {})", 2 * n, 2 * n, 4 * n);
}
