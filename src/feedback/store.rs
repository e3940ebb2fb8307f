//! The `feedback` table in the audit store (`audit.db`): one row per (record, source), written
//! only by the audit writer thread ([`apply`]), read by live quality, `tiergate report` and
//! `tiergate tune` ([`labelled`], [`labels`]) through their own read-only connections.
//!
//! A row copies what quality is counted by from its record (decision time, tier, action, risk
//! score, scenario, language, tenant, deciding rule), so that windows and breakdowns read one
//! table; `record_row` ties it to the record's row, and retention deletes the labels of deleted
//! records ([`retain`]).

use super::{Applied, Label, Outcome, Target, Truth};
use rusqlite::{params, Connection, OptionalExtension, Transaction};

/// The table and its indexes (created with the audit schema).
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    record_id TEXT NOT NULL,
    record_row INTEGER NOT NULL,
    source TEXT NOT NULL,
    truth TEXT NOT NULL,
    reviewer TEXT,
    note TEXT,
    received_ms INTEGER NOT NULL,
    decided_ms INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    tenant TEXT,
    scenario TEXT,
    tier TEXT NOT NULL,
    action TEXT NOT NULL,
    risk_score REAL,
    lang TEXT,
    rule TEXT,
    policy_version TEXT NOT NULL,
    model TEXT NOT NULL,
    shipped INTEGER NOT NULL DEFAULT 0,
    UNIQUE (record_id, source)
);
CREATE INDEX IF NOT EXISTS feedback_decided ON feedback (decided_ms);
CREATE INDEX IF NOT EXISTS feedback_record_row ON feedback (record_row);
CREATE INDEX IF NOT EXISTS feedback_unshipped ON feedback (id) WHERE shipped = 0;
";

/// Record kinds a label may name: decisions that were served (a shadow record is the
/// candidate's, never served).
const DECIDED: &str = "kind IN ('classify', 'screen', 'stream_cut')";

/// A labelled decision: its record's facts and the label that counts for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Labelled {
    pub record_id: String,
    pub request_id: String,
    /// When the decision was made, ms since the Unix epoch (windows are keyed by it).
    pub decided_ms: u64,
    /// When the label arrived, ms since the Unix epoch.
    pub received_ms: u64,
    pub source: String,
    pub reviewer: Option<String>,
    pub truth: Truth,
    pub tenant: Option<String>,
    pub scenario: Option<String>,
    /// The record's `tier`: cpu, confirm, gpu, rules, guard, features, unscreened.
    pub tier: String,
    /// The record's `action`: allow, review, block, unscreened.
    pub action: String,
    /// The decision's calibrated risk score (rule scores when rules decided).
    pub risk_score: Option<f64>,
    pub lang: Option<String>,
    /// The rule or guard that decided, when one did (`tier` rules or guard).
    pub rule: Option<String>,
    pub policy_version: String,
    pub model: String,
}

/// A record as a label reads it.
struct Found {
    row: i64,
    record_id: String,
    request_id: String,
    decided_ms: i64,
    tenant: Option<String>,
    tier: String,
    action: String,
    record: serde_json::Value,
}

/// The record `target` names; under a tenant `scope`, only among that tenant's (a request id is
/// the client's and can repeat across tenants: the newest of the scope's own is taken).
fn find(tx: &Transaction<'_>, target: &Target, scope: Option<&str>) -> rusqlite::Result<Option<Found>> {
    let columns = "id, record_id, request_id, unix_ms, tenant, tier, action, record";
    let within = if scope.is_some() { "AND tenant = ?2" } else { "AND ?2 IS NULL" };
    let (sql, id) = match target {
        Target::RecordId(id) => {
            (format!("SELECT {columns} FROM records WHERE record_id = ?1 {within} AND {DECIDED}"), id)
        }
        Target::RequestId(id) => (
            format!(
                "SELECT {columns} FROM records WHERE request_id = ?1 {within} AND {DECIDED} ORDER BY id DESC LIMIT 1"
            ),
            id,
        ),
    };
    tx.prepare_cached(&sql)?
        .query_row(params![id, scope], |r| {
            Ok(Found {
                row: r.get(0)?,
                record_id: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                request_id: r.get(2)?,
                decided_ms: r.get(3)?,
                tenant: r.get(4)?,
                tier: r.get(5)?,
                action: r.get(6)?,
                record: serde_json::from_str(&r.get::<_, String>(7)?).unwrap_or_default(),
            })
        })
        .optional()
}

/// Writes `labels` (the writer thread, inside its transaction) and says what became of each.
/// A label for a record that is not here (or is another tenant's, under a tenant scope) is
/// [`Outcome::Unknown`] and writes nothing.
pub fn apply(tx: &Transaction<'_>, labels: &[Label], now_ms: u64) -> anyhow::Result<Vec<Applied>> {
    labels.iter().map(|label| apply_one(tx, label, now_ms)).collect()
}

fn apply_one(tx: &Transaction<'_>, label: &Label, now_ms: u64) -> anyhow::Result<Applied> {
    let found = find(tx, &label.target, label.tenant_scope.as_deref())?;
    let Some(f) = found.filter(|f| !f.record_id.is_empty()) else {
        let (record_id, request_id) = match &label.target {
            Target::RecordId(id) => (Some(id.clone()), None),
            Target::RequestId(id) => (None, Some(id.clone())),
        };
        return Ok(Applied { record_id, request_id, outcome: Outcome::Unknown, replica: None });
    };
    let before: Option<String> = tx
        .prepare_cached("SELECT truth FROM feedback WHERE record_id = ?1 AND source = ?2")?
        .query_row([&f.record_id, &label.source], |r| r.get(0))
        .optional()?;
    let outcome = match before.as_deref() {
        Some(t) if t == label.truth.as_str() => Outcome::Duplicate,
        Some(_) => {
            tx.prepare_cached(
                "UPDATE feedback SET truth = ?3, reviewer = ?4, note = ?5, received_ms = ?6, shipped = 0
                 WHERE record_id = ?1 AND source = ?2",
            )?
            .execute(params![
                f.record_id,
                label.source,
                label.truth.as_str(),
                label.reviewer,
                label.note,
                now_ms as i64
            ])?;
            Outcome::Updated
        }
        None => {
            insert(tx, &f, label, now_ms)?;
            Outcome::Accepted
        }
    };
    Ok(Applied { record_id: Some(f.record_id), request_id: Some(f.request_id), outcome, replica: None })
}

fn insert(tx: &Transaction<'_>, f: &Found, label: &Label, now_ms: u64) -> anyhow::Result<()> {
    let r = &f.record;
    let rule = match f.tier.as_str() {
        "rules" | "guard" => r["rules"].as_array().and_then(|rules| rules.last()).and_then(|v| v.as_str()),
        _ => None,
    };
    tx.prepare_cached(
        "INSERT INTO feedback (record_id, record_row, source, truth, reviewer, note, received_ms, decided_ms,
             request_id, tenant, scenario, tier, action, risk_score, lang, rule, policy_version, model)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
    )?
    .execute(params![
        f.record_id,
        f.row,
        label.source,
        label.truth.as_str(),
        label.reviewer,
        label.note,
        now_ms as i64,
        f.decided_ms,
        f.request_id,
        f.tenant,
        r["scenario"].as_str(),
        f.tier,
        f.action,
        r["risk_score"].as_f64(),
        r["lang"].as_str(),
        rule,
        r["policy_version"].as_str().unwrap_or_default(),
        r["model"]["name"].as_str().unwrap_or_default(),
    ])?;
    Ok(())
}

/// Deletes the labels whose record retention deleted (a label lives as long as its record).
pub fn retain(conn: &Connection) -> rusqlite::Result<usize> {
    conn.execute("DELETE FROM feedback WHERE record_row NOT IN (SELECT id FROM records)", [])
}

const COLUMNS: &str = "record_id, request_id, decided_ms, received_ms, source, reviewer, truth, tenant, scenario,
    tier, action, risk_score, lang, rule, policy_version, model";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Labelled> {
    let truth: String = r.get(6)?;
    Ok(Labelled {
        record_id: r.get(0)?,
        request_id: r.get(1)?,
        decided_ms: r.get::<_, i64>(2)? as u64,
        received_ms: r.get::<_, i64>(3)? as u64,
        source: r.get(4)?,
        reviewer: r.get(5)?,
        truth: Truth::parse(&truth).unwrap_or(Truth::Risk),
        tenant: r.get(7)?,
        scenario: r.get(8)?,
        tier: r.get(9)?,
        action: r.get(10)?,
        risk_score: r.get(11)?,
        lang: r.get(12)?,
        rule: r.get(13)?,
        policy_version: r.get(14)?,
        model: r.get(15)?,
    })
}

/// Labelled decisions decided in `[since_ms, until_ms)`, one per record, oldest first. Where
/// several sources labelled a record, a `chargeback` (the payment network's finding) counts over
/// an `analyst`'s, and an analyst's over any other source's; within a source, the latest label.
pub fn labelled(conn: &Connection, since_ms: u64, until_ms: u64) -> anyhow::Result<Vec<Labelled>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM (
             SELECT *, ROW_NUMBER() OVER (PARTITION BY record_id ORDER BY
                 CASE source WHEN 'chargeback' THEN 0 WHEN 'analyst' THEN 1 ELSE 2 END,
                 received_ms DESC, id DESC) AS pick
             FROM feedback WHERE decided_ms >= ?1 AND decided_ms < ?2)
         WHERE pick = 1 ORDER BY decided_ms, id"
    );
    query(conn, &sql, since_ms, until_ms)
}

/// Every label of decisions decided in `[since_ms, until_ms)`, oldest decision first (one per
/// record and source): for per-source and per-reviewer tables.
pub fn labels(conn: &Connection, since_ms: u64, until_ms: u64) -> anyhow::Result<Vec<Labelled>> {
    let sql =
        format!("SELECT {COLUMNS} FROM feedback WHERE decided_ms >= ?1 AND decided_ms < ?2 ORDER BY decided_ms, id");
    query(conn, &sql, since_ms, until_ms)
}

fn query(conn: &Connection, sql: &str, since_ms: u64, until_ms: u64) -> anyhow::Result<Vec<Labelled>> {
    let clamp = |ms: u64| ms.min(i64::MAX as u64) as i64;
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map([clamp(since_ms), clamp(until_ms)], row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A label as the Kafka sink ships it (beside its record, keyed by the record's request id).
pub fn unshipped(conn: &Connection, limit: usize) -> rusqlite::Result<Vec<(i64, String, Vec<u8>)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, request_id, record_id, source, truth, reviewer, note, received_ms, decided_ms
         FROM feedback WHERE shipped = 0 ORDER BY id LIMIT ?1",
    )?;
    let rows = stmt.query_map([limit as i64], |r| {
        let payload = serde_json::json!({
            "type": "feedback",
            "record_id": r.get::<_, String>(2)?,
            "request_id": r.get::<_, String>(1)?,
            "source": r.get::<_, String>(3)?,
            "label": r.get::<_, String>(4)?,
            "reviewer": r.get::<_, Option<String>>(5)?,
            "note": r.get::<_, Option<String>>(6)?,
            "received_ms": r.get::<_, i64>(7)?,
            "decided_ms": r.get::<_, i64>(8)?,
        });
        Ok((r.get(0)?, r.get(1)?, payload.to_string().into_bytes()))
    })?;
    rows.collect()
}
