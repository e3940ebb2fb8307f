//! The cost of a shared quota check: `SharedQuotas::check_rate` and `take_daily` against a real
//! Redis on loopback (tests/common/redis.rs starts it), next to the local store for scale. Each
//! check is one EVALSHA round trip; the Redis `INFO commandstats` count is printed after the
//! run so the round trips per check can be read off.
//!
//! Run: `cargo bench --bench shared_quota`

// The tests' Redis harness, with the two things it takes from its parent module there: the
// service runner and a free port for the child process.
#[path = "../tests/common/redis.rs"]
mod redis_server;
#[path = "../tests/common/service.rs"]
mod service;

/// A loopback port for redis-server (the bench binds nothing else, so `bind(0)` cannot race).
fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use tiergate::tenant::shared::{OnOutage, RedisConfig, SharedQuotaMetrics, SharedQuotas};
use tiergate::tenant::{LocalQuotas, Quota, QuotaStore};

fn bench(c: &mut Criterion) {
    let redis = redis_server::Redis::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut config = RedisConfig::new(redis.url(), 2);
    // Closed: a check Redis did not decide fails the bench instead of timing the fallback.
    config.on_outage = OnOutage::Closed;
    config.timeout_ms = 100;
    let store = SharedQuotas::new(&config, Arc::new(LocalQuotas::new()), SharedQuotaMetrics::default()).unwrap();
    rt.block_on(store.connect()).unwrap();
    let local = LocalQuotas::new();
    let quota = Quota { per_second: u32::MAX / 2, burst: u32::MAX / 2 };

    // Loads both scripts (NOSCRIPT, SCRIPT LOAD) before the count starts.
    rt.block_on(store.check_rate("payments", quota)).unwrap();
    rt.block_on(store.take_daily("payments", u32::MAX)).unwrap();
    ::redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut redis.client()).unwrap();
    let mut checks = 0u64;
    c.bench_function("quota/shared_check_rate", |b| {
        b.iter(|| {
            checks += 1;
            rt.block_on(store.check_rate(black_box("payments"), quota)).unwrap()
        })
    });
    c.bench_function("quota/shared_take_daily", |b| {
        b.iter(|| {
            checks += 1;
            rt.block_on(store.take_daily(black_box("payments"), u32::MAX)).unwrap()
        })
    });
    c.bench_function("quota/local_check_rate", |b| {
        b.iter(|| rt.block_on(local.check_rate(black_box("payments"), quota)).unwrap())
    });
    // commandstats also counts the commands a script runs (TIME, GET, SET, INCR, EXPIREAT);
    // the client's own commands are the EVALSHAs.
    let calls = redis.all_command_calls();
    let evalsha = calls.iter().find(|(c, _)| c == "evalsha").map_or(0, |(_, n)| *n);
    println!(
        "redis: {evalsha} EVALSHA for {checks} shared checks ({:.3} round trips per check); {calls:?}",
        evalsha as f64 / checks as f64
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
