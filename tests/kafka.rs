//! The Kafka sink against a real Kafka-protocol broker (Tansu, started by the test, see
//! tests/common/tansu.rs): records stream through the shipper and are consumed back with a
//! Kafka client; the broker is frozen, killed and restarted mid-stream; a stop signal ships
//! what is left. The outbox is an in-memory test double of the store's outbox with the same
//! contract (oldest unshipped first, marked only on acknowledgement).

mod common;

use common::tansu::{consume, Consumed, Tansu};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiergate::audit::kafka::{self, KafkaCompression, KafkaConfig, KafkaMetrics};
use tiergate::audit::outbox::{Outbox, Pending};
use tokio::sync::watch;

/// Outbox rows in memory; `hold` makes `unshipped` hand out nothing (the test's way to let the
/// shipper go idle before it kills the broker).
#[derive(Default)]
struct MemOutbox {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    rows: Vec<(i64, String, Vec<u8>, bool)>,
    hold: bool,
    /// Ids of the last batch handed out and not yet marked shipped.
    handed: BTreeSet<i64>,
}

impl MemOutbox {
    /// Appends a decision record (the audit record's shape) for `request_id`.
    fn push(&self, request_id: &str) {
        let record = serde_json::json!({
            "request_id": request_id, "unix_ms": 1_764_633_600_123u64, "kind": "classify",
            "tenant": "t1", "route": null, "policy_version": "v1",
            "model": {"name": "cpu", "sha256": "00"}, "action": "allow", "label": "ok",
            "risk_score": 0.12, "ood_score": null, "tier": "cpu", "path": [], "rules": [],
            "latency_us": 1234, "lang": "en", "text_chars": 5, "text": {"mode": "hash", "value": "ab"}
        });
        let mut state = self.state.lock().unwrap();
        let id = state.rows.len() as i64 + 1;
        state.rows.push((id, request_id.to_string(), record.to_string().into_bytes(), false));
    }
    fn hold(&self, hold: bool) {
        self.state.lock().unwrap().hold = hold;
    }
    fn in_flight(&self) -> usize {
        self.state.lock().unwrap().handed.len()
    }
    fn waiting(&self) -> u64 {
        self.backlog().unwrap()
    }
}

impl Outbox for MemOutbox {
    fn unshipped(&self, limit: usize) -> anyhow::Result<Vec<Pending>> {
        let mut state = self.state.lock().unwrap();
        if state.hold {
            return Ok(Vec::new());
        }
        let batch: Vec<Pending> = state
            .rows
            .iter()
            .filter(|r| !r.3)
            .take(limit)
            .map(|(id, key, payload, _)| Pending { id: *id, key: key.clone(), payload: payload.clone() })
            .collect();
        state.handed = batch.iter().map(|p| p.id).collect();
        Ok(batch)
    }
    fn mark_shipped(&self, ids: &[i64]) -> anyhow::Result<()> {
        let mut state = self.state.lock().unwrap();
        for id in ids {
            state.rows[*id as usize - 1].3 = true;
            state.handed.remove(id);
        }
        Ok(())
    }
    fn mark_refused(&self, ids: &[i64]) -> anyhow::Result<()> {
        self.mark_shipped(ids)
    }
    fn backlog(&self) -> anyhow::Result<u64> {
        Ok(self.state.lock().unwrap().rows.iter().filter(|r| !r.3).count() as u64)
    }
}

fn config(broker: &Tansu, topic: &str) -> KafkaConfig {
    let config = KafkaConfig {
        brokers: vec![broker.addr()],
        topic: topic.into(),
        poll_interval_ms: 10,
        batch_records: 25,
        request_timeout_ms: 1000,
        backoff_initial_ms: 20,
        backoff_max_ms: 400,
        drain_timeout_ms: 5000,
        ..KafkaConfig::default()
    };
    config.validate("audit.kafka").unwrap();
    config
}

fn ids(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// Polls `cond` every 10 ms until `limit`.
async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Counts each expected id in `consumed`: panics naming the missing ones; returns duplicates.
fn check_every_id_arrived(expected: &[String], consumed: &[Consumed]) -> usize {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for c in consumed {
        assert_eq!(c.key, c.request_id, "a record keyed by something else than its request id");
        *counts.entry(c.request_id.as_str()).or_default() += 1;
    }
    let missing: Vec<&String> = expected.iter().filter(|id| !counts.contains_key(id.as_str())).collect();
    assert!(
        missing.is_empty(),
        "{} of {} records never arrived, e.g. {:?}",
        missing.len(),
        expected.len(),
        &missing[..missing.len().min(5)]
    );
    assert_eq!(counts.len(), expected.len(), "records arrived that were never written");
    consumed.len() - expected.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_records_arrives_keyed_by_request_id() {
    let broker = Tansu::start();
    let mut config = config(&broker, "audit-stream");
    config.partitions = 3;
    config.compression = KafkaCompression::Zstd;
    // Records are about 450 bytes: a round trip of 25 becomes several produce requests.
    config.batch_bytes = 4000;
    let outbox = Arc::new(MemOutbox::default());
    let mut registry = Registry::with_prefix("tiergate");
    let metrics = KafkaMetrics::register(&mut registry);
    let (stop, stopped) = watch::channel(false);
    let shipper = kafka::spawn(config.clone(), outbox.clone(), metrics.clone(), stopped);

    let expected = ids(500, "req");
    for chunk in expected.chunks(20) {
        chunk.iter().for_each(|id| outbox.push(id));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    until("the outbox to be shipped", Duration::from_secs(30), || outbox.waiting() == 0).await;
    stop.send(true).unwrap();
    shipper.await.unwrap();

    let consumed = consume(&broker.addr(), &config.topic).await;
    assert_eq!(check_every_id_arrived(&expected, &consumed), 0, "duplicates with a healthy broker");
    for c in &consumed {
        assert_eq!(c.partition as usize, kafka::partition_for(c.key.as_bytes(), 3), "{} on the wrong partition", c.key);
    }
    let used: BTreeSet<i32> = consumed.iter().map(|c| c.partition).collect();
    assert_eq!(used.len(), 3, "500 keys over 3 partitions use every partition");
    assert_eq!((metrics.shipped.get(), metrics.up.get(), metrics.errors.get(), metrics.rejected.get()), (500, 1, 0, 0));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for name in
        ["tiergate_audit_kafka_shipped_total 500", "tiergate_audit_kafka_errors_total 0", "tiergate_audit_kafka_up 1"]
    {
        assert!(text.contains(name), "{name} not in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_then_killed_and_restarted_broker_loses_no_record() {
    let mut broker = Tansu::start();
    let mut config = config(&broker, "audit-restart");
    config.compression = KafkaCompression::Gzip;
    let outbox = Arc::new(MemOutbox::default());
    let metrics = KafkaMetrics::default();
    let (stop, stopped) = watch::channel(false);
    let shipper = kafka::spawn(config.clone(), outbox.clone(), metrics.clone(), stopped);
    let expected = ids(1500, "dec");
    let feeder = {
        let (outbox, expected) = (outbox.clone(), expected.clone());
        tokio::spawn(async move {
            for chunk in expected.chunks(5) {
                chunk.iter().for_each(|id| outbox.push(id));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    until("150 records shipped", Duration::from_secs(20), || metrics.shipped.get() >= 150).await;

    // A hung broker: requests in flight get no acknowledgement; the shipper times out, retries,
    // and what the broker wrote before it froze may arrive twice.
    broker.signal("STOP");
    until("the shipper to notice the frozen broker", Duration::from_secs(10), || metrics.up.get() == 0).await;
    broker.signal("CONT");
    until("the shipper to be back", Duration::from_secs(10), || metrics.up.get() == 1).await;

    // The broker keeps records in memory only, so what it acknowledged is read back before it is
    // killed: the shipper is held idle (the outbox hands out nothing) until its last batch is
    // acknowledged and marked.
    outbox.hold(true);
    until("the batch in flight", Duration::from_secs(10), || outbox.in_flight() == 0).await;
    let mut consumed = consume(&broker.addr(), &config.topic).await;
    let before = consumed.len();
    tokio::task::block_in_place(|| broker.stop());
    let (errors_at_stop, backlog_at_stop) = (metrics.errors.get(), outbox.waiting() as i64);
    outbox.hold(false);
    until("the shipper to see the broker down", Duration::from_secs(10), || {
        metrics.errors.get() > errors_at_stop && metrics.up.get() == 0
    })
    .await;
    until("the backlog metric to grow while down", Duration::from_secs(10), || {
        metrics.backlog.get() > backlog_at_stop + 20
    })
    .await;
    let backlog_down = metrics.backlog.get();
    tokio::task::block_in_place(|| broker.restart());

    feeder.await.unwrap();
    until("the backlog to be shipped", Duration::from_secs(60), || outbox.waiting() == 0).await;
    stop.send(true).unwrap();
    shipper.await.unwrap();
    consumed.extend(consume(&broker.addr(), &config.topic).await);
    let duplicates = check_every_id_arrived(&expected, &consumed);
    eprintln!(
        "{} records, {} consumed ({before} before the kill, {} after the restart), {duplicates} duplicates; \
         backlog {backlog_at_stop} at the kill, {backlog_down} while down; {} errors",
        expected.len(),
        consumed.len(),
        consumed.len() - before,
        metrics.errors.get()
    );
    assert_eq!(metrics.up.get(), 1);
    assert_eq!(metrics.backlog.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ships_what_is_left_and_returns() {
    let broker = Tansu::start();
    let mut config = config(&broker, "audit-stop");
    config.compression = KafkaCompression::Lz4;
    // Long enough that only the stop, not a poll, can ship the records written below.
    config.poll_interval_ms = 60_000;
    let outbox = Arc::new(MemOutbox::default());
    let metrics = KafkaMetrics::default();
    let (stop, stopped) = watch::channel(false);
    let shipper = kafka::spawn(config.clone(), outbox.clone(), metrics.clone(), stopped);
    // The shipper's first poll finds nothing; then it sleeps for a minute.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let expected = ids(300, "left");
    expected.iter().for_each(|id| outbox.push(id));
    let stopping = Instant::now();
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), shipper).await.expect("the shipper returns after a stop").unwrap();
    eprintln!("drained 300 records in {:?}", stopping.elapsed());
    assert_eq!(outbox.waiting(), 0);
    let consumed = consume(&broker.addr(), &config.topic).await;
    assert_eq!(check_every_id_arrived(&expected, &consumed), 0);
    assert_eq!(metrics.shipped.get(), 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_the_broker_down_returns_within_the_drain_timeout_and_keeps_the_records() {
    let mut broker = Tansu::start();
    let mut config = config(&broker, "audit-down");
    config.drain_timeout_ms = 1500;
    tokio::task::block_in_place(|| broker.stop());
    let outbox = Arc::new(MemOutbox::default());
    ids(40, "kept").iter().for_each(|id| outbox.push(id));
    let metrics = KafkaMetrics::default();
    let (stop, stopped) = watch::channel(false);
    let shipper = kafka::spawn(config, outbox.clone(), metrics.clone(), stopped);
    until("a failed connect", Duration::from_secs(10), || metrics.errors.get() > 0).await;
    let stopping = Instant::now();
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), shipper)
        .await
        .expect("the shipper gives up at the drain timeout")
        .unwrap();
    let took = stopping.elapsed();
    assert!(took < Duration::from_millis(1500 + 1200), "stop took {took:?}");
    assert_eq!(outbox.waiting(), 40, "records stay in the outbox");
    assert_eq!((metrics.up.get(), metrics.shipped.get()), (0, 0));
}
