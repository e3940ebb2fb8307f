//! The audit trail shipped to a real Kafka-protocol broker (Tansu, started by the harness) by the
//! real `tiergate serve` binary: the broker killed and restarted in the middle of a stream of
//! decisions, and frozen, loses no record (at least once; duplicates are counted and printed);
//! SIGTERM during the stream loses nothing (the writer's last flush, then the shipper's drain);
//! after SIGKILL the records lost are at most those answered in the last flush interval.
//!
//! Tansu here keeps records in memory only, so the test reads every record the broker holds
//! before it kills it (the records of the killed broker are gone with it, as they would be with
//! a real cluster's disks wiped: what matters is what tiergate keeps until acknowledged).

mod common;

use common::tansu::{consume, Tansu};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const TOPIC: &str = "tiergate-audit";
const TEXT: &str = "Your parcel is held at the depot; confirm the delivery fee at the link to release it.";

/// `tiergate serve` with the audit trail shipped to a broker.
type Server = common::Sidecar;

impl Server {
    /// With the audit trail in `dir` shipped to `broker`, flushing every `flush_ms`.
    fn with_audit(dir: &Path, broker: &str, flush_ms: u64) -> Server {
        let audit = format!(
            "flush_interval_ms = {flush_ms}\n\
             [audit.kafka]\nbrokers = [\"{broker}\"]\ntopic = \"{TOPIC}\"\npoll_interval_ms = 20\n\
             batch_records = 50\nrequest_timeout_ms = 1000\nbackoff_initial_ms = 20\nbackoff_max_ms = 300\n\
             drain_timeout_ms = 10000"
        );
        Server::audited(dir, &audit)
    }

    /// Classifies one text as request `id`; panics unless it is answered 200.
    async fn decide(&self, id: &str) {
        let headers = [("content-type", "application/json"), ("x-request-id", id), ("x-tiergate-deadline-ms", "5000")];
        let reply =
            common::send(self.public, "POST", "/v1/classify", &headers, json!({"text": TEXT}).to_string()).await;
        assert_eq!(reply.status, 200, "{id}: {:?}", reply.body);
    }

    async fn metric(&self, name: &str) -> f64 {
        let reply = common::send(self.admin, "GET", "/metrics", &[], "").await;
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics"))
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }

    async fn exited(&mut self) -> std::process::ExitStatus {
        let since = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(since.elapsed() < Duration::from_secs(30), "tiergate did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
}

/// Polls the broker until every id of `expected` is on it (or 30 s); returns request id ->
/// copies, over everything the broker holds.
async fn until_on_broker(broker: &Tansu, expected: &[String]) -> BTreeMap<String, usize> {
    let since = Instant::now();
    loop {
        let mut counts = BTreeMap::new();
        for c in consume(&broker.addr(), TOPIC).await {
            assert_eq!(c.key, c.request_id, "a record keyed by something else than its request id");
            *counts.entry(c.request_id).or_insert(0) += 1;
        }
        let missing: Vec<_> = expected.iter().filter(|id| !counts.contains_key(*id)).collect();
        if missing.is_empty() {
            return counts;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{} of {} records never reached the broker, e.g. {:?}",
            missing.len(),
            expected.len(),
            &missing[..missing.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn duplicates(counts: &BTreeMap<String, usize>) -> usize {
    counts.values().map(|n| n - 1).sum()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-audit-kafka-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_and_a_sigterm_lose_no_record() {
    let dir = scratch("outage");
    let mut broker = Tansu::start();
    let mut server = Server::with_audit(&dir, &broker.addr(), 50);

    // A: shipped while the broker is up.
    let a = ids("a", 40);
    for id in &a {
        server.decide(id).await;
    }
    let on_a = until_on_broker(&broker, &a).await;

    // B: decided while the broker is down — they wait in the store — then shipped after it is back.
    broker.stop();
    let b = ids("b", 40);
    for id in &b {
        server.decide(id).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let backlog = server.metric("tiergate_audit_backlog").await;
    assert!(backlog >= b.len() as f64, "backlog {backlog} while the broker is down");
    // The shipper finds the broker gone on its next produce (bounded by request_timeout_ms).
    let since = Instant::now();
    while server.metric("tiergate_audit_kafka_up").await != 0.0 {
        assert!(since.elapsed() < Duration::from_secs(10), "tiergate_audit_kafka_up stayed 1 with the broker down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    broker.restart();
    let on_b = until_on_broker(&broker, &b).await;

    // C: the broker frozen (it keeps its records but answers nothing) in the middle of the stream.
    let c = ids("c", 60);
    for (i, id) in c.iter().enumerate() {
        if i == 20 {
            broker.signal("STOP");
        }
        if i == 40 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            broker.signal("CONT");
        }
        server.decide(id).await;
    }
    let mut expected: Vec<String> = b.iter().chain(&c).cloned().collect();
    let on_c = until_on_broker(&broker, &expected).await;

    // D: SIGTERM right after the last answer: the writer's last flush, then the shipper drains.
    let d = ids("d", 40);
    for id in &d {
        server.decide(id).await;
    }
    server.signal("TERM");
    assert!(server.exited().await.success());
    expected.extend(d.iter().cloned());
    let on_d = until_on_broker(&broker, &expected).await;
    eprintln!(
        "audit -> kafka: all {} records before the broker's kill arrived ({} duplicates); all {} after its restart, \
         the freeze and SIGTERM arrived ({} duplicates; {} of them on the broker before SIGTERM)",
        a.len(),
        duplicates(&on_a),
        expected.len(),
        duplicates(&on_d),
        on_b.len().max(on_c.len()),
    );
    assert_eq!(on_d.len(), expected.len(), "records arrived that were never decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigkill_only_the_last_flush_interval_is_lost() {
    let dir = scratch("sigkill");
    let broker = Tansu::start();
    let flush = Duration::from_millis(1000);
    let server = Server::with_audit(&dir, &broker.addr(), flush.as_millis() as u64);
    let mut answered = Vec::new();
    let started = Instant::now();
    for id in ids("k", 2000) {
        server.decide(&id).await;
        answered.push((id, Instant::now()));
        if started.elapsed() > Duration::from_millis(2500) {
            break;
        }
    }
    server.signal("KILL");
    let killed = Instant::now();
    drop(server);
    let conn = tiergate::audit::store::Store::open_read_only(&dir.join("audit")).unwrap();
    let mut kept = BTreeSet::new();
    tiergate::audit::query::for_each(&conn, &tiergate::audit::query::Filter::default(), |json| {
        let record: tiergate::audit::AuditRecord = serde_json::from_str(json)?;
        kept.insert(record.request_id);
        Ok(())
    })
    .unwrap();
    let lost: Vec<&(String, Instant)> = answered.iter().filter(|(id, _)| !kept.contains(id)).collect();
    // Lost records must all be among those answered within the last flush interval before the
    // kill (and a little for the kill itself to land).
    let window = flush + Duration::from_millis(200);
    for (id, at) in &lost {
        assert!(killed.duration_since(*at) <= window, "{id}, answered {:?} before SIGKILL, was lost", killed - *at);
    }
    eprintln!(
        "SIGKILL: {} answered, {} kept, {} lost (all within the last {:?})",
        answered.len(),
        kept.len(),
        lost.len(),
        window
    );
    let answered_ids: BTreeSet<&String> = answered.iter().map(|(id, _)| id).collect();
    assert!(kept.iter().all(|id| answered_ids.contains(id)), "records for requests that were never answered");
    assert!(kept.len() + lost.len() == answered.len() && !kept.is_empty());
}

/// A label ships beside its record: after it on the record's key (so on its partition), with
/// the labelled record's id in `tiergate-feedback-for` — not `tiergate-record-id`, which a
/// consumer de-duplicates records by — and an update ships again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_ships_after_its_record_on_the_same_key() {
    let dir = scratch("label");
    let broker = Tansu::start();
    let server = Server::with_audit(&dir, &broker.addr(), 50);
    server.decide("labelled-0").await;
    let send_label = |truth: &'static str| {
        let body = json!({"request_id": "labelled-0", "label": truth, "source": "chargeback"}).to_string();
        common::send(server.admin, "POST", "/v1/feedback", &[("content-type", "application/json")], body)
    };
    assert_eq!(send_label("risk").await.json()["results"][0]["outcome"], "accepted");
    // Shipped before the update: a label replaced before it shipped ships once, as its latest.
    at_least(&broker.addr(), 2).await;
    assert_eq!(send_label("ok").await.json()["results"][0]["outcome"], "updated");
    let on_broker = at_least(&broker.addr(), 3).await;
    let (record, labels) = (&on_broker[0], &on_broker[1..]);
    let record_id = record.value["record_id"].as_str().unwrap().as_bytes().to_vec();
    assert_eq!(record.headers.get("tiergate-record-id"), Some(&record_id));
    let truths: Vec<&str> = labels.iter().map(|l| l.value["label"].as_str().unwrap()).collect();
    assert_eq!(truths, ["risk", "ok"], "in order, the update last");
    for label in labels {
        assert_eq!((label.value["type"].as_str(), label.key.as_str()), (Some("feedback"), "labelled-0"));
        assert_eq!(label.partition, record.partition);
        assert_eq!(label.headers.get("tiergate-feedback-for"), Some(&record_id));
        assert!(!label.headers.contains_key("tiergate-record-id"));
    }
}

/// Everything on the audit topic once it holds at least `n` messages (30 s at most).
async fn at_least(broker: &str, n: usize) -> Vec<common::tansu::Consumed> {
    let since = Instant::now();
    loop {
        let all = consume(broker, TOPIC).await;
        if all.len() >= n {
            return all;
        }
        assert!(since.elapsed() < Duration::from_secs(30), "labels never reached the broker: {all:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
