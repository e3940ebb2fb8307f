//! A Redis that is slow in alternating phases must not raise a shared quota (issue 25, item 5):
//! a real Redis (tests/common/redis.rs) behind a small TCP proxy written here that holds every
//! reply for 25 ms in alternating 1.5 s phases, so checks land in turn on the shared cell and
//! on the local fallback. Two independent cells each refilled while the other was in use and
//! admitted ~1.5× the limit; one mirrored budget keeps the total within the limit.

mod common;

use common::redis::Redis;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiergate::tenant::shared::metrics::{FallbackLabels, StoreErrorLabels};
use tiergate::tenant::shared::{OnOutage, RedisConfig, SharedQuotaMetrics, SharedQuotas};
use tiergate::tenant::{Limit, LocalQuotas, Quota, QuotaStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a phase lasts; phases alternate fast, slow, fast, ... from the proxy's start.
const PHASE: Duration = Duration::from_millis(1500);
/// How long each reply is held in a slow phase: well over the store's `timeout_ms` below.
const DELAY: Duration = Duration::from_millis(25);

/// Whether replies are held now: the odd phases since `started`.
fn slow(started: Instant) -> bool {
    (started.elapsed().as_millis() / PHASE.as_millis()) % 2 == 1
}

/// Listens on 127.0.0.1 and relays each connection to `upstream`; requests pass at once,
/// replies are held for [`DELAY`] while [`slow`]. Returns the address it listens on.
async fn delaying_proxy(upstream: String, started: Instant) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else { return };
                let (mut from_client, mut to_client) = client.into_split();
                let (mut from_server, mut to_server) = server.into_split();
                tokio::spawn(async move { drop(tokio::io::copy(&mut from_client, &mut to_server).await) });
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let n = match from_server.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    if slow(started) {
                        tokio::time::sleep(DELAY).await;
                    }
                    if to_client.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_slow_in_alternating_phases_keeps_the_shared_limit() {
    let redis = Redis::start();
    let started = Instant::now();
    let upstream = redis.url().trim_start_matches("redis://").to_string();
    let proxy = delaying_proxy(upstream, started).await;
    // One replica: the fallback may use the whole quota, so only double counting can exceed it.
    let mut config = RedisConfig::new(format!("redis://{proxy}"), 1);
    config.on_outage = OnOutage::Local;
    // Under DELAY, so every slow reply times out; a fast reply slower than this on a loaded
    // machine only adds fallbacks, which the bound must survive too.
    config.timeout_ms = 10;
    let metrics = SharedQuotaMetrics::default();
    let store = Arc::new(SharedQuotas::new(&config, Arc::new(LocalQuotas::new()), metrics.clone()).unwrap());
    store.connect().await.expect("connects through the proxy in its first, fast phase");

    let quota = Quota { per_second: 20, burst: 20 };
    let run_for = 8 * PHASE; // 12 s: four slow phases, four fast ones
    let (admitted, attempts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let first_sent = Instant::now();
    let last_done = Arc::new(Mutex::new(first_sent));
    let until = first_sent + run_for;
    // Four clients, 5 ms apart each: ~800 attempts a second against a limit of 20.
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (store, admitted, attempts, last_done) =
                (store.clone(), admitted.clone(), attempts.clone(), last_done.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    match store.check_rate("tenant:t", quota).await {
                        Ok(()) => drop(admitted.fetch_add(1, Ordering::Relaxed)),
                        Err(denied) => assert_eq!(denied.limit, Limit::Rate, "{denied:?}"),
                    }
                    attempts.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut last = last_done.lock().unwrap();
                        *last = (*last).max(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let elapsed = last_done.lock().unwrap().duration_since(first_sent);
    let (admitted, attempts) = (admitted.load(Ordering::Relaxed), attempts.load(Ordering::Relaxed));
    let limit = f64::from(quota.per_second) * elapsed.as_secs_f64() + f64::from(quota.burst);
    let fallbacks = metrics.fallbacks.get_or_create(&FallbackLabels { check: "rate", on_outage: "local" }).get();
    let timeouts = metrics.errors.get_or_create(&StoreErrorLabels { error: "timeout" }).get();
    eprintln!(
        "admitted {admitted} of {attempts} in {elapsed:?}; limit {limit:.0}; {fallbacks} local decisions, \
         {timeouts} timeouts, {} reconciled",
        metrics.reconciled.get()
    );
    // The test means something only if it offered far more than the limit and both paths
    // decided a real part of it.
    assert!(attempts as f64 > 3.0 * limit, "too few attempts to exceed the limit: {attempts}");
    assert!(timeouts >= 4 && fallbacks > 20, "the slow phases sent checks to the fallback");
    assert!(fallbacks < attempts * 9 / 10, "the fast phases were decided by Redis: {fallbacks} of {attempts}");
    assert!(
        admitted as f64 <= 1.05 * limit,
        "{admitted} admitted over {elapsed:?}: more than 1.05 × the limit of {limit:.0} (rate × elapsed + burst)"
    );
    // Not a bound on fairness, but the limit must not collapse either: most of it is usable.
    assert!(admitted as f64 >= 0.5 * limit, "only {admitted} admitted of a limit of {limit:.0}");
}
