//! Two tiergate replicas (two processes of the real binary) sharing one real Redis
//! (tests/common/redis.rs): together they admit the class's rate within 5 %, and Redis killed
//! and restarted in the middle of the traffic fails no request (both replicas keep serving on
//! their local share), with the shared limit back after the restart.

mod common;

use bytes::Bytes;
use common::redis::Redis;
use common::Sidecar;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::BENIGN_WITH_EMAIL as BENIGN;
/// The default class's quota: every test request is from the unknown tenant, one shared key.
const PER_SECOND: u32 = 20;
const BURST: u32 = 20;

/// A replica's config: the bundled model and policies, a rate on the default class, shared
/// through `redis`. The timeout is generous: this machine is small and shared.
fn replica(name: &str, redis: &Redis) -> Sidecar {
    let dir = std::env::temp_dir().join(format!("tiergate-fleet-{name}-{}", std::process::id()));
    let tenants = format!(
        "[tenants]\ndefault_class = \"standard\"\n\
         [tenants.classes.standard]\nrate = {{ per_second = {PER_SECOND}, burst = {BURST} }}\n\
         [tenants.redis]\nurl = \"{}\"\nreplicas = 2\ntimeout_ms = 500\nopen_ms = 300\n",
        redis.url()
    );
    Sidecar::serve_in(&dir, &common::repo().join("policies"), &tenants)
}

/// What one replica answered.
#[derive(Debug, Default, Clone)]
struct Tally {
    admitted: u64,
    limited: u64,
    /// Anything else: a status other than 200/429, or no response at all.
    failed: Vec<String>,
}

/// Sends classify requests to `addrs` in turn from `clients` concurrent loops until `until`
/// (each loop pausing `pause` between requests); returns each replica's tally and the span
/// from the first send to the last.
async fn traffic(addrs: &[SocketAddr], clients: usize, pause: Duration, until: Instant) -> (Vec<Tally>, Duration) {
    let http: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let tallies = Arc::new(Mutex::new(vec![Tally::default(); addrs.len()]));
    let body = Bytes::from(serde_json::json!({ "text": BENIGN }).to_string());
    let started = Instant::now();
    let last = Arc::new(Mutex::new(started));
    let mut loops = Vec::new();
    for c in 0..clients {
        let (http, tallies, body, addrs, last) =
            (http.clone(), tallies.clone(), body.clone(), addrs.to_vec(), last.clone());
        loops.push(tokio::spawn(async move {
            let mut i = c;
            while Instant::now() < until {
                let r = i % addrs.len();
                i += 1;
                let sent = Instant::now();
                {
                    let mut last = last.lock().unwrap();
                    *last = (*last).max(sent);
                }
                let req = http::Request::post(format!("http://{}/v1/classify", addrs[r]))
                    .header("content-type", "application/json")
                    .header("x-tiergate-deadline-ms", "5000")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let outcome = match http.request(req).await {
                    Ok(resp) => {
                        let status = resp.status();
                        let text = resp.into_body().collect().await.map(|b| b.to_bytes());
                        match (status.as_u16(), text) {
                            (200, Ok(_)) => Ok(true),
                            (429, Ok(_)) => Ok(false),
                            (s, text) => Err(format!("replica {r}: {s} {text:?}")),
                        }
                    }
                    Err(e) => Err(format!("replica {r}: no response: {e:?}")),
                };
                {
                    let mut all = tallies.lock().unwrap();
                    match outcome {
                        Ok(true) => all[r].admitted += 1,
                        Ok(false) => all[r].limited += 1,
                        Err(e) => all[r].failed.push(e),
                    }
                }
                tokio::time::sleep(pause).await;
            }
        }));
    }
    for l in loops {
        l.await.unwrap();
    }
    let span = last.lock().unwrap().duration_since(started);
    let tallies = tallies.lock().unwrap().clone();
    (tallies, span)
}

/// `name`'s value in the replica's `/metrics` (the sum over its label sets).
async fn metric(replica: &Sidecar, name: &str) -> f64 {
    let reply = common::send(replica.admin, "GET", "/metrics", &[], "").await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until a request has gone through each replica with Redis answering (the store
/// connects in the background at start).
async fn until_shared(replicas: &[&Sidecar]) {
    for r in replicas {
        let deadline = Instant::now() + Duration::from_secs(30);
        while metric(r, "tiergate_quota_store_up").await != 1.0 {
            let _ = common::classify_unhurried(r.public, serde_json::json!({ "text": BENIGN })).await;
            assert!(Instant::now() < deadline, "replica never reached Redis");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_limit_within_5_percent() {
    let redis = Redis::start();
    let (a, b) = (replica("share-a", &redis), replica("share-b", &redis));
    until_shared(&[&a, &b]).await;
    // Let the warm-up requests' debt drain: a full burst at the start.
    tokio::time::sleep(Duration::from_secs_f64(f64::from(BURST) / f64::from(PER_SECOND) + 0.2)).await;
    let fallbacks_before = metric(&a, "tiergate_quota_store_fallbacks_total").await
        + metric(&b, "tiergate_quota_store_fallbacks_total").await;

    let (tallies, span) =
        traffic(&[a.public, b.public], 6, Duration::from_millis(5), Instant::now() + Duration::from_secs(6)).await;
    let admitted: u64 = tallies.iter().map(|t| t.admitted).sum();
    let limited: u64 = tallies.iter().map(|t| t.limited).sum();
    // GCRA over the span: the burst plus the rate for the time the traffic lasted.
    let expected = f64::from(BURST) + f64::from(PER_SECOND) * span.as_secs_f64();
    let fallbacks = metric(&a, "tiergate_quota_store_fallbacks_total").await
        + metric(&b, "tiergate_quota_store_fallbacks_total").await
        - fallbacks_before;
    eprintln!(
        "fleet: admitted {admitted} (a {}, b {}), limited {limited}, over {span:?}: expected {expected:.1} \
         ({:+.2} %), checks that fell back: {fallbacks}",
        tallies[0].admitted,
        tallies[1].admitted,
        (admitted as f64 - expected) / expected * 100.0
    );
    assert!(tallies.iter().all(|t| t.failed.is_empty()), "{tallies:?}");
    assert!(limited > admitted, "the clients sent well over the limit: {tallies:?}");
    assert!(tallies.iter().all(|t| t.admitted > 0), "both replicas admitted some: {tallies:?}");
    assert!(
        (admitted as f64 - expected).abs() <= 0.05 * expected,
        "admitted {admitted}, expected {expected:.1} within 5 % (two unshared replicas would admit twice as many)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_mid_traffic_fails_no_request() {
    let mut redis = Redis::start();
    let (a, b) = (replica("outage-a", &redis), replica("outage-b", &redis));
    until_shared(&[&a, &b]).await;
    let addrs = [a.public, b.public];
    let phase = |secs: f64| Instant::now() + Duration::from_secs_f64(secs);

    let (before, _) = traffic(&addrs, 4, Duration::from_millis(5), phase(1.5)).await;
    redis.stop();
    let (during, _) = traffic(&addrs, 4, Duration::from_millis(5), phase(3.0)).await;
    redis.restart();
    let evalsha_at_restart = redis.command_calls("evalsha");
    let (after, _) = traffic(&addrs, 4, Duration::from_millis(5), phase(4.0)).await;

    for (phase, tallies) in [("before", &before), ("during", &during), ("after", &after)] {
        assert!(tallies.iter().all(|t| t.failed.is_empty()), "{phase}: {tallies:?}");
        assert!(tallies.iter().all(|t| t.admitted > 0), "{phase}: both replicas serve: {tallies:?}");
    }
    eprintln!("outage: before {before:?}\nduring {during:?}\nafter {after:?}");
    for r in [&a, &b] {
        assert!(metric(r, "tiergate_quota_store_fallbacks_total").await > 0.0, "the outage took the local path");
        assert_eq!(metric(r, "tiergate_quota_store_up").await, 1.0, "Redis answers the replica again");
    }
    // The shared limit is back: the restarted (empty) Redis holds the rate state and answered
    // checks from both replicas' traffic.
    let keys: Vec<String> = ::redis::cmd("KEYS").arg("tiergate:rate:*").query(&mut redis.client()).unwrap();
    assert!(!keys.is_empty(), "no rate key in Redis after the restart");
    assert!(redis.command_calls("evalsha") > evalsha_at_restart, "checks went to Redis after the restart");
}
