//! The key (what changes it) and the cache's rules: only verdicts a tier gave are stored, a
//! waiter never inherits a failure, a waiter leaves at its own deadline, entries expire.

use super::key::{KeyBase, Scope, Secret};
use super::{CacheConfig, VerdictCache};
use crate::decision::{Arm, TierName};
use crate::text::LanguageCell;
use crate::tier::{ModelVerdict, TierError};
use prometheus_client::registry::Registry;
use serde_json::{json, Map, Value};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

fn features(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn scope<'a>(f: &'a Map<String, Value>) -> Scope<'a> {
    Scope {
        text: "send your pin to http://x.example",
        features: f,
        tenant: Some("acme"),
        limit_key: "acme",
        scenario: Some("payments"),
        route_policy: Path::new("/etc/tiergate/policies"),
        arm: Some(Arm::Live),
        policy_version: "0123456789ab",
        models: "cpu:abc gpu:none",
    }
}

#[test]
fn every_field_of_the_scope_changes_the_key() {
    let secret = Secret::fixed(7);
    let f = features(json!({"amount": 12.5, "country": "NL"}));
    let other_f = features(json!({"amount": 12.6, "country": "NL"}));
    let base = KeyBase::new(&secret, &scope(&f)).key(TierName::Cpu);
    let changed: Vec<(&str, Scope)> = vec![
        ("text", Scope { text: "send your pin to http://y.example", ..scope(&f) }),
        ("features", scope(&other_f)),
        ("tenant", Scope { tenant: None, ..scope(&f) }),
        ("limit key", Scope { limit_key: "other", ..scope(&f) }),
        ("scenario", Scope { scenario: None, ..scope(&f) }),
        ("route policy", Scope { route_policy: Path::new("/etc/tiergate/route-a"), ..scope(&f) }),
        ("arm", Scope { arm: Some(Arm::Candidate), ..scope(&f) }),
        ("no arm", Scope { arm: None, ..scope(&f) }),
        ("policy version", Scope { policy_version: "ba9876543210", ..scope(&f) }),
        ("models", Scope { models: "cpu:abd gpu:none", ..scope(&f) }),
    ];
    for (what, s) in changed {
        assert_ne!(KeyBase::new(&secret, &s).key(TierName::Cpu), base, "{what} must change the key");
    }
    assert_ne!(KeyBase::new(&secret, &scope(&f)).key(TierName::Gpu), base, "each tier has its own entry");
    assert_ne!(KeyBase::new(&Secret::fixed(8), &scope(&f)).key(TierName::Cpu), base, "the secret keys the digest");
}

#[test]
fn the_same_scope_gives_the_same_key_whatever_the_feature_order() {
    let secret = Secret::fixed(1);
    let a = features(json!({"amount": 1, "country": "NL"}));
    let mut b = Map::new();
    b.insert("country".into(), json!("NL"));
    b.insert("amount".into(), json!(1));
    assert_eq!(
        KeyBase::new(&secret, &scope(&a)).key(TierName::Cpu),
        KeyBase::new(&secret, &scope(&b)).key(TierName::Cpu)
    );
}

#[test]
fn fields_do_not_run_into_each_other() {
    // Length prefixes: the same bytes split differently between two fields are two keys.
    let secret = Secret::fixed(1);
    let f = Map::new();
    let a = Scope { tenant: Some("ab"), limit_key: "c", ..scope(&f) };
    let b = Scope { tenant: Some("a"), limit_key: "bc", ..scope(&f) };
    let c = Scope { tenant: Some(""), ..scope(&f) };
    let d = Scope { tenant: None, ..scope(&f) };
    assert_ne!(KeyBase::new(&secret, &a).key(TierName::Cpu), KeyBase::new(&secret, &b).key(TierName::Cpu));
    assert_ne!(KeyBase::new(&secret, &c).key(TierName::Cpu), KeyBase::new(&secret, &d).key(TierName::Cpu));
}

fn verdict(risk_score: f64) -> ModelVerdict {
    ModelVerdict {
        risk_score,
        confidence: risk_score.max(1.0 - risk_score),
        ood_score: Some(0.1),
        tokens: Some(9),
        queue_us: 0,
        infer_us: 100,
        batch_size: 1,
        endpoint: None,
        window: None,
        unread: false,
    }
}

fn cache(ttl_ms: u64) -> (VerdictCache, Registry) {
    let mut registry = Registry::default();
    let config = CacheConfig { enabled: true, max_entries: 100, ttl_ms };
    (VerdictCache::new(&config, "cpu:test".into(), &mut registry), registry)
}

/// One model call: counts itself, then answers `answer` after `after`.
async fn call(
    calls: &AtomicUsize,
    after: Duration,
    answer: Result<ModelVerdict, TierError>,
) -> Result<ModelVerdict, TierError> {
    calls.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(after).await;
    answer
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

#[tokio::test(start_paused = true)]
async fn a_verdict_is_reused_and_a_failure_never_is() {
    let (cache, _registry) = cache(60_000);
    let f = Map::new();
    let calls = AtomicUsize::new(0);
    let failures = [
        TierError::Overloaded { capacity: 256 },
        TierError::DeadlineExceeded { waited_us: 200_000 },
        TierError::Doomed { remaining_us: 10, expected_us: 5000 },
        TierError::Unavailable("no gpu tier configured".into()),
        TierError::CircuitOpen,
        TierError::Inference("bad input".into()),
    ];
    let scoped = cache.scope(scope(&f));
    for failure in failures {
        let before = calls.load(Ordering::SeqCst);
        let (r, cached) =
            scoped.through(TierName::Cpu, deadline(), None, call(&calls, Duration::ZERO, Err(failure.clone()))).await;
        assert!(r.is_err() && !cached, "{failure}: the failure itself is returned, not reused");
        assert_eq!(calls.load(Ordering::SeqCst), before + 1);
    }
    assert!(cache.is_empty(), "no failure was stored");
    let (first, cached) =
        scoped.through(TierName::Cpu, deadline(), None, call(&calls, Duration::ZERO, Ok(verdict(0.9)))).await;
    assert_eq!((first.unwrap().risk_score, cached), (0.9, false));
    let (again, cached) =
        scoped.through(TierName::Cpu, deadline(), None, call(&calls, Duration::ZERO, Ok(verdict(0.1)))).await;
    assert_eq!((again.unwrap().risk_score, cached), (0.9, true), "the stored verdict, without a call");
    assert_eq!(calls.load(Ordering::SeqCst), 7);
    let (gpu, cached) =
        scoped.through(TierName::Gpu, deadline(), None, call(&calls, Duration::ZERO, Ok(verdict(0.2)))).await;
    assert_eq!((gpu.unwrap().risk_score, cached), (0.2, false), "the gpu tier has its own entry");
}

#[tokio::test(start_paused = true)]
async fn an_entry_expires_after_its_ttl() {
    let (cache, _registry) = cache(1000);
    let f = Map::new();
    let calls = AtomicUsize::new(0);
    let scoped = cache.scope(scope(&f));
    let _ = scoped.through(TierName::Cpu, deadline(), None, call(&calls, Duration::ZERO, Ok(verdict(0.9)))).await;
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(scoped.through(TierName::Cpu, deadline(), None, call(&calls, Duration::ZERO, Ok(verdict(0.9)))).await.1);
    tokio::time::advance(Duration::from_millis(2)).await;
    let (_, cached) =
        scoped.through(TierName::Cpu, deadline(), None, call(&calls, Duration::ZERO, Ok(verdict(0.8)))).await;
    assert!(!cached, "past the TTL the model is called again");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// `n` identical requests at once, each through the cache with its own deadline.
async fn wave(
    cache: &Arc<VerdictCache>,
    calls: &Arc<AtomicUsize>,
    n: usize,
    answer: impl Fn(usize) -> Result<ModelVerdict, TierError>,
    deadline_of: impl Fn(usize) -> Instant,
) -> Vec<(Result<ModelVerdict, TierError>, bool)> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let (cache, calls, answer, deadline) = (Arc::clone(cache), Arc::clone(calls), answer(i), deadline_of(i));
        tasks.push(tokio::spawn(async move {
            let f = Map::new();
            let scoped = cache.scope(scope(&f));
            scoped.through(TierName::Cpu, deadline, None, call(&calls, Duration::from_millis(50), answer)).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn concurrent_identical_requests_wait_for_one_call() {
    let cache = Arc::new(cache(60_000).0);
    let calls = Arc::new(AtomicUsize::new(0));
    let results = wave(&cache, &calls, 100, |_| Ok(verdict(0.7)), |_| deadline()).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one model call for the wave");
    assert_eq!(results.iter().filter(|(_, cached)| *cached).count(), 99);
    assert!(results.iter().all(|(r, _)| r.as_ref().is_ok_and(|v| v.risk_score == 0.7)));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_does_not_inherit_a_failure_and_leaves_at_its_deadline() {
    let cache = Arc::new(cache(60_000).0);
    let calls = Arc::new(AtomicUsize::new(0));
    // The first caller's model call times out; the others must not get its timeout: the next
    // one calls the model itself, and its verdict serves the rest. One waiter's own deadline
    // (10 ms) passes before any answer: it leaves as a deadline, without a call.
    let answer =
        |i: usize| if i == 0 { Err(TierError::DeadlineExceeded { waited_us: 50_000 }) } else { Ok(verdict(0.3)) };
    let start = Instant::now();
    let deadline_of =
        move |i: usize| if i == 1 { start + Duration::from_millis(10) } else { start + Duration::from_secs(5) };
    let results = wave(&cache, &calls, 20, answer, deadline_of).await;
    assert!(matches!(results[0], (Err(TierError::DeadlineExceeded { .. }), false)));
    assert!(matches!(results[1], (Err(TierError::DeadlineExceeded { .. }), false)), "the short deadline is honoured");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "the failed call, then one more for everyone left");
    let served = results[2..].iter().filter(|(r, _)| r.as_ref().is_ok_and(|v| v.risk_score == 0.3)).count();
    assert_eq!(served, 18);
}

#[tokio::test]
async fn the_cache_stays_within_max_entries_and_counts_what_it_evicts() {
    let mut registry = Registry::default();
    let config = CacheConfig { enabled: true, max_entries: 64, ttl_ms: 60_000 };
    let cache = VerdictCache::new(&config, "cpu:test".into(), &mut registry);
    let (f, calls) = (Map::new(), AtomicUsize::new(0));
    for i in 0..1000 {
        let text = format!("message number {i}");
        let scoped = cache.scope(Scope { text: &text, ..scope(&f) });
        let _ = scoped.through(TierName::Cpu, deadline(), None, call(&calls, Duration::ZERO, Ok(verdict(0.5)))).await;
    }
    let evicted = cache.metrics.evictions.get_or_create(&crate::metrics::ReasonLabels { reason: "capacity" }).get();
    assert!(cache.len() <= 64, "{} entries", cache.len());
    assert_eq!(evicted as usize + cache.len(), 1000, "every insertion is still there or counted evicted");
    assert_eq!(cache.metrics.entries.get(), cache.len() as i64);
}

#[tokio::test]
async fn a_reused_verdict_brings_the_language_its_worker_detected() {
    let (cache, _registry) = cache(60_000);
    let f = Map::new();
    let calls = AtomicUsize::new(0);
    let scoped = cache.scope(scope(&f));
    let first = LanguageCell::new(Arc::from("Are we still on for lunch tomorrow at noon? I booked the usual place."));
    let english = *first.get(); // what the cpu worker detects beside tokenisation
    let _ =
        scoped.through(TierName::Cpu, deadline(), Some(&first), call(&calls, Duration::ZERO, Ok(verdict(0.1)))).await;
    // A cell whose own text would detect as French: filled from the entry, never detected.
    let second = LanguageCell::new(Arc::from("Nous sommes toujours d'accord pour le déjeuner de demain à midi ?"));
    let (_, cached) =
        scoped.through(TierName::Cpu, deadline(), Some(&second), call(&calls, Duration::ZERO, Ok(verdict(0.1)))).await;
    assert!(cached);
    assert_eq!(second.peek(), Some(&english));
    assert_eq!(english.code, "eng");
}

#[test]
fn the_bundled_config_holds_the_defaults_and_bad_values_name_their_key() {
    let bundled = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tiergate.toml")).unwrap();
    let c = crate::config::Config::parse(&bundled).unwrap().cache;
    let d = CacheConfig::default();
    assert_eq!((c.enabled, c.max_entries, c.ttl_ms), (d.enabled, d.max_entries, d.ttl_ms));
    let zero = crate::config::Config::parse("[cache]\nenabled = true\nmax_entries = 0\n").unwrap();
    assert!(zero.validate().unwrap_err().to_string().contains("`cache.max_entries` must be at least 1"));
    let typo = crate::config::Config::parse("[cache]\nttl = 5\n").unwrap_err().to_string();
    assert!(typo.contains("cache") && typo.contains("ttl"), "{typo}");
    let long = crate::config::Config::parse("[cache]\nttl_ms = 100000000\n").unwrap_err().to_string();
    assert!(long.contains("cache.ttl_ms"), "{long}");
}

#[test]
fn config_ranges() {
    assert!(CacheConfig::default().validate().is_ok());
    let e = CacheConfig { max_entries: 0, ..CacheConfig::default() }.validate().unwrap_err();
    assert!(e.contains("cache.max_entries"), "{e}");
    let e = CacheConfig { ttl_ms: 0, ..CacheConfig::default() }.validate().unwrap_err();
    assert!(e.contains("cache.ttl_ms"), "{e}");
}
