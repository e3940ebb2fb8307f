//! `SharedQuotas` against a real Redis server (tests/common/redis.rs): the GCRA script's burst,
//! refill and retry-after, the daily budget, one round trip per check, and the outage paths
//! (Redis killed, frozen, restarted), with what the fallback admitted charged to Redis after.

mod common;

use common::redis::Redis;
use std::sync::Arc;
use std::time::Duration;
use tiergate::breaker::CircuitState;
use tiergate::tenant::shared::{OnOutage, RedisConfig, SharedQuotaMetrics, SharedQuotas};
use tiergate::tenant::{Limit, LocalQuotas, Quota, QuotaStore};

/// A connected store over `redis`; generous timeout: this machine is shared and loaded.
async fn store(redis: &Redis, on_outage: OnOutage, replicas: u32) -> (SharedQuotas, SharedQuotaMetrics) {
    let mut config = RedisConfig::new(redis.url(), replicas);
    config.on_outage = on_outage;
    config.timeout_ms = 250;
    config.open_ms = 200;
    let metrics = SharedQuotaMetrics::default();
    let store = SharedQuotas::new(&config, Arc::new(LocalQuotas::new()), metrics.clone()).unwrap();
    store.connect().await.expect("connects to the test server");
    (store, metrics)
}

fn fallbacks(metrics: &SharedQuotaMetrics, check: &'static str, on_outage: &'static str) -> u64 {
    use tiergate::tenant::shared::metrics::FallbackLabels;
    metrics.fallbacks.get_or_create(&FallbackLabels { check, on_outage }).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcra_allows_the_burst_then_refuses_with_retry_after_and_refills() {
    let redis = Redis::start();
    let (store, metrics) = store(&redis, OnOutage::Closed, 1).await;
    let quota = Quota { per_second: 2, burst: 5 };
    for i in 0..5 {
        store.check_rate("payments", quota).await.unwrap_or_else(|d| panic!("request {i} of the burst: {d:?}"));
    }
    let denied = store.check_rate("payments", quota).await.expect_err("the burst is spent");
    assert_eq!(denied.limit, Limit::Rate);
    // One emission interval (500 ms) minus the time the burst took.
    assert!(denied.retry_after > Duration::ZERO && denied.retry_after <= Duration::from_millis(500), "{denied:?}");
    // Another key has its own state.
    store.check_rate("chat", quota).await.expect("another tenant is not limited by payments");

    // The key holds the TAT with a TTL of at most the debt (5 intervals) plus a millisecond.
    let mut conn = redis.client();
    let ttl: i64 = redis::cmd("PTTL").arg(store.rate_key("payments")).query(&mut conn).unwrap();
    assert!((1..=2502).contains(&ttl), "PTTL {ttl}");

    tokio::time::sleep(denied.retry_after + Duration::from_millis(20)).await;
    store.check_rate("payments", quota).await.expect("one interval later one request conforms");
    let again = store.check_rate("payments", quota).await.expect_err("and only one");
    // A whole interval (500 ms) less the time between the two checks; 250 ms leaves room for
    // a stall on a loaded machine.
    assert!(again.retry_after > Duration::from_millis(250), "most of an interval to wait: {again:?}");
    assert_eq!(fallbacks(&metrics, "rate", "closed"), 0, "every check was decided by Redis");
    assert_eq!(store.circuit(), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daily_budget_counts_to_the_limit_and_expires_at_utc_midnight() {
    let redis = Redis::start();
    let (store, _) = store(&redis, OnOutage::Closed, 1).await;
    for i in 0..3 {
        store.take_daily("support", 3).await.unwrap_or_else(|d| panic!("call {i}: {d:?}"));
    }
    let denied = store.take_daily("support", 3).await.expect_err("the budget is spent");
    assert_eq!(denied.limit, Limit::GpuDailyBudget);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let to_midnight = 86_400 - now % 86_400;
    assert!(denied.retry_after.as_secs().abs_diff(to_midnight) <= 2, "{denied:?} vs {to_midnight} s");

    let mut conn = redis.client();
    let used: u32 = redis::cmd("GET").arg(store.daily_key("support")).query(&mut conn).unwrap();
    assert_eq!(used, 3, "a refused call takes nothing");
    let ttl: i64 = redis::cmd("TTL").arg(store.daily_key("support")).query(&mut conn).unwrap();
    assert!(ttl.abs_diff(to_midnight as i64) <= 2, "TTL {ttl} vs {to_midnight}");
    store.take_daily("chat", 3).await.expect("another tenant has its own budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_round_trip_per_check() {
    let redis = Redis::start();
    let (store, _) = store(&redis, OnOutage::Closed, 1).await;
    let quota = Quota { per_second: 1_000_000, burst: 1_000_000 };
    // The first check of each script loads it (NOSCRIPT, SCRIPT LOAD, EVALSHA): once per server.
    store.check_rate("warm", quota).await.unwrap();
    store.take_daily("warm", 1_000_000).await.unwrap();
    redis::cmd("CONFIG").arg("RESETSTAT").query::<()>(&mut redis.client()).unwrap();
    let mut admin = redis.client();
    let connections = Redis::connections_received(&mut admin);
    let n = 500;
    let started = std::time::Instant::now();
    for i in 0..n {
        store.check_rate(&format!("tenant-{}", i % 7), quota).await.unwrap();
    }
    let rate_elapsed = started.elapsed();
    for i in 0..n {
        store.take_daily(&format!("tenant-{}", i % 7), 1_000_000).await.unwrap();
    }
    // Commands a script runs count in commandstats too; each script call runs TIME once.
    let calls = redis.all_command_calls();
    let calls_of = |name: &str| calls.iter().find(|(c, _)| c == name).map_or(0, |(_, n)| *n);
    assert_eq!(calls_of("evalsha"), 2 * n, "one EVALSHA per check: {calls:?}");
    assert_eq!(calls_of("time"), 2 * n, "each EVALSHA ran one script: {calls:?}");
    let inside_scripts = ["time", "get", "set", "incr", "expireat"];
    let other: Vec<_> = calls
        .iter()
        .filter(|(c, _)| c != "evalsha" && !inside_scripts.contains(&c.as_str()))
        .filter(|(c, _)| !c.starts_with("config") && !c.starts_with("info"))
        .collect();
    assert!(other.is_empty(), "no other command from the store: {other:?}");
    // all_command_calls opened one connection of its own.
    assert_eq!(Redis::connections_received(&mut admin), connections + 1, "the store did not reconnect");
    // A measured note, not an assertion: the mean round trip on this machine.
    eprintln!("shared check_rate: {n} sequential checks in {rate_elapsed:?} ({:?} each)", rate_elapsed / n as u32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_falls_back_to_the_replica_share_and_recovers_after_restart() {
    let mut redis = Redis::start();
    let (store, metrics) = store(&redis, OnOutage::Local, 2).await;
    let quota = Quota { per_second: 1, burst: 4 };
    store.check_rate("shared", quota).await.unwrap();

    redis.stop();
    // Local at the per-replica share: burst 4 / 2 replicas = 2, then refused by the local GCRA.
    for i in 0..2 {
        store.check_rate("down", quota).await.unwrap_or_else(|d| panic!("local burst {i}: {d:?}"));
    }
    let denied = store.check_rate("down", quota).await.expect_err("the local share is 2");
    assert_eq!(denied.limit, Limit::Rate);
    store.take_daily("down", 4).await.unwrap();
    store.take_daily("down", 4).await.unwrap();
    assert_eq!(store.take_daily("down", 4).await.unwrap_err().limit, Limit::GpuDailyBudget, "half of 4 per replica");
    assert!(fallbacks(&metrics, "rate", "local") >= 3 && fallbacks(&metrics, "daily", "local") == 3);
    assert_eq!(metrics.up.get(), 0);
    // The failures (the broken connection, then background connects refused) open the circuit.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while metrics.circuit_open.get() != 1 {
        assert!(std::time::Instant::now() < deadline, "the circuit never opened: {:?}", store.circuit());
        let _ = store.check_rate("down", quota).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    redis.restart();
    // Back once the circuit's open time is up and a probe reconnects: the restarted server is
    // empty, so the burst of 4 is shared again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = store.check_rate("probe", Quota { per_second: 1000, burst: 1000 }).await;
        if store.circuit() == CircuitState::Closed && metrics.up.get() == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no recovery within 10 s: {:?}", store.circuit());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = fallbacks(&metrics, "rate", "local");
    for i in 0..4 {
        store.check_rate("after", quota).await.unwrap_or_else(|d| panic!("shared burst {i}: {d:?}"));
    }
    assert!(store.check_rate("after", quota).await.is_err());
    assert_eq!(fallbacks(&metrics, "rate", "local"), before, "decided by Redis again");
    let exists: bool = redis::cmd("EXISTS").arg(store.rate_key("after")).query(&mut redis.client()).unwrap();
    assert!(exists, "the state is in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_continues_the_shared_cell_and_charges_it_when_redis_is_back() {
    let mut redis = Redis::start();
    let (store, metrics) = store(&redis, OnOutage::Local, 1).await;
    // 1/s: the test's own pauses (seconds on a loaded machine) refill only a few requests.
    let quota = Quota { per_second: 1, burst: 20 };
    for i in 0..10 {
        store.check_rate("k", quota).await.unwrap_or_else(|d| panic!("shared burst {i}: {d:?}"));
    }
    redis.stop();
    let outage = std::time::Instant::now();
    // The fallback continues from Redis's TAT: the 10 left of the burst (plus what refilled
    // meanwhile), not a fresh burst of 20.
    let mut local: u64 = 0;
    while store.check_rate("k", quota).await.is_ok() {
        local += 1;
        assert!(local <= 40, "the fallback keeps admitting");
    }
    let refill = outage.elapsed().as_secs() + 2;
    assert!((10..=10 + refill).contains(&local), "{local} admitted locally; 10 + {refill} s of refill at most");

    redis.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let _ = store.check_rate("probe", Quota { per_second: 1000, burst: 1000 }).await;
        if store.circuit() == CircuitState::Closed && metrics.up.get() == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no recovery within 10 s: {:?}", store.circuit());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The restarted Redis is empty, but the first check of `k` carries the local admissions:
    // the cell stays spent, with only what refilled since the outage began.
    let before = fallbacks(&metrics, "rate", "local");
    // The probes' own local admissions were carried by the probe that Redis answered.
    let reconciled = metrics.reconciled.get();
    let mut after = 0;
    while store.check_rate("k", quota).await.is_ok() {
        after += 1;
        assert!(after <= 40, "Redis keeps admitting");
    }
    assert_eq!(fallbacks(&metrics, "rate", "local"), before, "decided by Redis");
    let refill = outage.elapsed().as_secs() + 2;
    assert!(after <= refill, "{after} admitted by the restarted Redis: a fresh burst, not {refill} s of refill");
    assert_eq!(metrics.reconciled.get() - reconciled, local, "every local admission of `k` was charged to Redis");
    let pttl: i64 = redis::cmd("PTTL").arg(store.rate_key("k")).query(&mut redis.client()).unwrap();
    assert!(pttl > 15_000, "Redis holds the debt of the burst: PTTL {pttl} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_open_allows_and_closed_refuses() {
    let mut redis = Redis::start();
    let (open, _) = store(&redis, OnOutage::Open, 2).await;
    let (closed, metrics) = store(&redis, OnOutage::Closed, 2).await;
    redis.stop();
    let quota = Quota { per_second: 1, burst: 1 };
    for _ in 0..5 {
        open.check_rate("t", quota).await.expect("open: no limit while Redis is down");
        open.take_daily("t", 1).await.expect("open: no budget while Redis is down");
    }
    let denied = closed.check_rate("t", quota).await.expect_err("closed: refused");
    assert_eq!(denied.limit, Limit::QuotaStoreUnavailable);
    assert!(denied.retry_after >= Duration::from_secs(1));
    assert_eq!(closed.take_daily("t", 5).await.unwrap_err().limit, Limit::QuotaStoreUnavailable);
    assert_eq!(fallbacks(&metrics, "rate", "closed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_a_check_at_most_the_timeout() {
    let redis = Redis::start();
    let (store, metrics) = store(&redis, OnOutage::Local, 1).await;
    let quota = Quota { per_second: 100, burst: 100 };
    store.check_rate("t", quota).await.unwrap();
    redis.signal("STOP");
    // Each check waits out the 250 ms timeout, then the local store decides; after 3 the
    // circuit opens and checks no longer wait at all. Bounded by the test's own timeout, not
    // asserted as a speed.
    let checks = async {
        for _ in 0..10 {
            store.check_rate("t", quota).await.expect("the local store allows");
        }
    };
    let finished = tokio::time::timeout(Duration::from_secs(10), checks).await;
    redis.signal("CONT");
    finished.expect("checks against a frozen Redis finish (timeout, then circuit open)");
    use tiergate::tenant::shared::metrics::StoreErrorLabels;
    let timeouts = metrics.errors.get_or_create(&StoreErrorLabels { error: "timeout" }).get();
    // failure_threshold (3) checks waited; the open circuit kept the rest off Redis (one more
    // timeout if a half-open probe's connect ran into the frozen server).
    assert!((3..=4).contains(&timeouts), "{timeouts} timeouts");
    assert_eq!(fallbacks(&metrics, "rate", "local"), 10);
}
