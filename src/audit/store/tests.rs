//! The store against a real SQLite file: inserts, retention by age and size.

use super::*;
use crate::audit::config::TextMode;
use crate::audit::record::{Kind, ModelRef, RecordedAction, RecordedTier};
use crate::audit::text::AuditText;

/// A record with this request id and time, and some bulk (so that size limits bite).
pub(crate) fn record(request_id: &str, unix_ms: u64) -> AuditRecord {
    AuditRecord {
        record_id: format!("rec-{request_id}"),
        request_id: request_id.to_string(),
        unix_ms,
        kind: Kind::Classify,
        tenant: Some("t1".into()),
        route: None,
        policy_version: "p1".into(),
        scenario: None,
        model: ModelRef { name: "m".into(), sha256: Some("0".repeat(64)) },
        action: RecordedAction::Allow,
        label: Some(crate::decision::Label::Ok),
        risk_score: Some(0.1),
        ood_score: None,
        tier: RecordedTier::Cpu,
        path: vec![serde_json::json!({"tier": "cpu", "outcome": "accepted", "latency_us": 10})],
        rules: vec![],
        latency_us: 10,
        lang: Some("eng".into()),
        text_chars: 200,
        text: AuditText { mode: TextMode::Full, value: "x".repeat(200) },
        trace_id: None,
    }
}

fn fresh(name: &str) -> Store {
    let dir = std::env::temp_dir().join(format!("tiergate-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Store::open(&dir).unwrap()
}

fn ids(store: &Store) -> Vec<String> {
    let mut stmt = store.connection().prepare("SELECT request_id FROM records ORDER BY id").unwrap();
    stmt.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
}

#[test]
fn records_round_trip_as_json_with_their_columns() {
    let mut store = fresh("roundtrip");
    let r = record("a", 5);
    store.insert(std::slice::from_ref(&r)).unwrap();
    let (json, kind, tier): (String, String, String) = store
        .connection()
        .query_row("SELECT record, kind, tier FROM records WHERE request_id = 'a'", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(serde_json::from_str::<AuditRecord>(&json).unwrap(), r);
    assert_eq!((kind.as_str(), tier.as_str()), ("classify", "cpu"));
    let mode: String = store.connection().pragma_query_value(None, "journal_mode", |r| r.get(0)).unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn retention_by_age_deletes_the_old_records_only() {
    let mut store = fresh("age");
    store.insert(&(0..10).map(|i| record(&format!("r{i}"), 1000 + i)).collect::<Vec<_>>()).unwrap();
    let limits = Retention { max_bytes: u64::MAX, max_age_ms: Some(5), shipped_first: false };
    let deleted = store.retain(&limits, 1009).unwrap();
    assert_eq!(deleted, Deleted { by_age: 4, by_size: 0, unshipped: 4 });
    assert_eq!(ids(&store), ["r4", "r5", "r6", "r7", "r8", "r9"]);
}

#[test]
fn retention_by_size_deletes_oldest_first_and_counts() {
    let mut store = fresh("size");
    for batch in 0..20 {
        let records: Vec<_> = (0..100).map(|i| record(&format!("r{:04}", batch * 100 + i), 1)).collect();
        store.insert(&records).unwrap();
    }
    let before = store.used_bytes().unwrap();
    let limits = Retention { max_bytes: before / 2, max_age_ms: None, shipped_first: false };
    let deleted = store.retain(&limits, 2).unwrap();
    assert!(store.used_bytes().unwrap() <= before / 2, "under the limit after retention");
    let left = ids(&store);
    assert_eq!(deleted.by_size as usize + left.len(), 2000, "every deletion is counted");
    assert!(deleted.by_size >= 500 && deleted.by_size < 2000, "{deleted:?}");
    // Oldest first: what is left is exactly the newest records, in order.
    let expected: Vec<String> = (2000 - left.len()..2000).map(|i| format!("r{i:04}")).collect();
    assert_eq!(left, expected);
    assert_eq!(store.retain(&limits, 2).unwrap(), Deleted::default(), "nothing more once under the limit");
}

#[test]
fn with_a_sink_shipped_records_go_before_older_unshipped_ones() {
    let mut store = fresh("shipped");
    let records: Vec<_> = (0..1000).map(|i| record(&format!("r{i:04}"), 1)).collect();
    store.insert(&records).unwrap();
    // The newer half was shipped; the older half was not.
    store.connection().execute("UPDATE records SET shipped = 1 WHERE request_id >= 'r0500'", []).unwrap();
    let used = store.used_bytes().unwrap();
    let limits = Retention { max_bytes: used * 3 / 4, max_age_ms: None, shipped_first: true };
    let deleted = store.retain(&limits, 2).unwrap();
    assert!(deleted.by_size > 0 && deleted.unshipped == 0, "{deleted:?}");
    let left = ids(&store);
    assert!(left[..500].iter().zip(0..).all(|(id, i)| *id == format!("r{i:04}")), "every unshipped record stays");
    assert_eq!(left.len() as u64 + deleted.by_size, 1000);
}

#[test]
fn a_backup_is_a_consistent_copy_taken_while_another_connection_holds_the_write_lock() {
    let mut store = fresh("backup");
    store.insert(&(0..50).map(|i| record(&format!("r{i}"), i)).collect::<Vec<_>>()).unwrap();
    let dir = store.path().parent().unwrap().to_path_buf();
    // A writer mid-transaction (as the live server's writer is between BEGIN and COMMIT).
    let writer = Connection::open(store.path()).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE; DELETE FROM records WHERE request_id = 'r0';").unwrap();
    let out = dir.with_extension("backup.db");
    let _ = std::fs::remove_file(&out);
    let started = std::time::Instant::now();
    assert_eq!(Store::backup(&dir, &out).unwrap(), 50, "the last committed state, not the open transaction");
    assert!(started.elapsed() < BUSY_TIMEOUT / 2, "the backup waited for the write lock: {:?}", started.elapsed());
    writer.execute_batch("COMMIT").unwrap();
    let copy = Connection::open(&out).unwrap();
    let n: i64 = copy.query_row("SELECT COUNT(*) FROM records WHERE request_id = 'r0'", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 1);
    let again = Store::backup(&dir, &out).unwrap_err().to_string();
    assert!(again.contains("exists"), "an existing file is not overwritten: {again}");
}

/// Labels (`crate::feedback::store`) in the store they live in.
mod feedback {
    use super::*;
    use crate::feedback::store::{labelled, labels, unshipped};
    use crate::feedback::{Label, Outcome, Target, Truth};

    fn label(target: Target, truth: Truth, source: &str) -> Label {
        Label { target, truth, source: source.into(), reviewer: None, note: None, tenant_scope: None }
    }

    fn outcomes(store: &mut Store, labels: &[Label]) -> Vec<Outcome> {
        store.feedback(labels, 5_000).unwrap().into_iter().map(|a| a.outcome).collect()
    }

    #[test]
    fn a_label_joins_its_record_once_per_source_and_the_strongest_source_counts() {
        let mut store = fresh("feedback-join");
        let mut blocked = record("q1", 1_000);
        blocked.action = RecordedAction::Block;
        blocked.risk_score = Some(0.97);
        blocked.scenario = Some("payments".into());
        let mut shadow = record("q1", 1_001);
        shadow.kind = Kind::Shadow;
        shadow.record_id = "rec-shadow".into();
        store.insert(&[blocked, record("q2", 2_000), shadow]).unwrap();
        let by_record = |id: &str, truth, source| label(Target::RecordId(id.into()), truth, source);
        let got = outcomes(
            &mut store,
            &[
                by_record("rec-q1", Truth::Ok, "analyst"),
                by_record("rec-q1", Truth::Ok, "analyst"),
                by_record("rec-q1", Truth::Risk, "chargeback"),
                label(Target::RequestId("q2".into()), Truth::Ok, "user_report"),
                by_record("rec-q2", Truth::Risk, "user_report"),
                by_record("nope", Truth::Ok, "analyst"),
                by_record("rec-shadow", Truth::Ok, "analyst"),
            ],
        );
        use Outcome::*;
        assert_eq!(got, [Accepted, Duplicate, Accepted, Accepted, Updated, Unknown, Unknown]);
        let counted = labelled(store.connection(), 0, u64::MAX).unwrap();
        assert_eq!(counted.len(), 2, "one per record");
        assert_eq!(
            (counted[0].record_id.as_str(), counted[0].truth, counted[0].source.as_str()),
            ("rec-q1", Truth::Risk, "chargeback")
        );
        assert_eq!(
            (counted[0].action.as_str(), counted[0].risk_score, counted[0].scenario.as_deref()),
            ("block", Some(0.97), Some("payments"))
        );
        assert_eq!((counted[0].decided_ms, counted[0].received_ms), (1_000, 5_000), "windows key on decision time");
        assert_eq!(counted[1].truth, Truth::Risk, "the update replaced the label");
        assert_eq!(labels(store.connection(), 0, u64::MAX).unwrap().len(), 3);
        assert_eq!(labelled(store.connection(), 1_500, u64::MAX).unwrap().len(), 1, "decided in the window");
        let shipped = unshipped(store.connection(), 10).unwrap();
        assert_eq!(shipped.len(), 3);
        let payload: serde_json::Value = serde_json::from_slice(&shipped[0].2).unwrap();
        assert_eq!((payload["type"].as_str(), payload["record_id"].as_str()), (Some("feedback"), Some("rec-q1")));
        assert_eq!(shipped[0].1, "q1", "keyed like its record");
    }

    #[test]
    fn a_tenant_scope_sees_only_its_own_records_and_labels_go_with_their_records() {
        let mut store = fresh("feedback-scope");
        store.insert(&[record("a", 1_000), record("b", 2_000)]).unwrap();
        let mut scoped = label(Target::RecordId("rec-a".into()), Truth::Risk, "user_report");
        scoped.tenant_scope = Some("t2".into());
        assert_eq!(outcomes(&mut store, &[scoped.clone()]), [Outcome::Unknown], "another tenant's record");
        scoped.tenant_scope = Some("t1".into());
        let b = label(Target::RecordId("rec-b".into()), Truth::Ok, "analyst");
        assert_eq!(outcomes(&mut store, &[scoped, b]), [Outcome::Accepted, Outcome::Accepted]);
        let limits = Retention { max_bytes: u64::MAX, max_age_ms: Some(10_000), shipped_first: false };
        store.retain(&limits, 11_500).unwrap();
        let left = labelled(store.connection(), 0, u64::MAX).unwrap();
        assert_eq!(
            left.iter().map(|l| l.record_id.as_str()).collect::<Vec<_>>(),
            ["rec-b"],
            "retention took rec-a's label"
        );
    }
}
