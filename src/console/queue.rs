//! What the console reads from the audit store (read-only connections, on the blocking pool):
//! the review queue — served `review` decisions no one has labelled yet, oldest first, narrowed
//! by tenant, scenario, rule and language —, one decision's record, and the day's labels for
//! the panel.

use crate::feedback::Truth;
use rusqlite::{Connection, OptionalExtension};
use serde::Serialize;
use serde_json::Value;

/// Most queue items one answer lists (the count of all waiting comes with them).
pub const PAGE: usize = 100;
/// Longest filter value, bytes.
pub const MAX_FILTER: usize = 128;

/// The queue's filters; `None`: any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tenant: Option<String>,
    pub scenario: Option<String>,
    /// A rule or guard id among the rules that matched.
    pub rule: Option<String>,
    /// ISO 639-3 code.
    pub lang: Option<String>,
}

/// One waiting decision, as the queue lists it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Item {
    pub record_id: String,
    pub request_id: String,
    /// When it was decided, ms since the Unix epoch.
    pub unix_ms: u64,
    pub tenant: Option<String>,
    pub scenario: Option<String>,
    pub route: Option<String>,
    pub lang: Option<String>,
    pub risk_score: Option<f64>,
    pub tier: String,
    pub rules: Vec<String>,
}

/// The queue: how many wait in all, and the oldest [`PAGE`] of them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Queue {
    pub waiting: u64,
    pub items: Vec<Item>,
}

/// `review` decisions that were served (not a shadow candidate's) and have no label from any
/// source, matching the filter (`?1`..`?4`).
const WAITING: &str = "FROM records r
    WHERE r.action = 'review' AND r.kind IN ('classify', 'screen', 'stream_cut') AND r.record_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM feedback f WHERE f.record_id = r.record_id)
      AND (?1 IS NULL OR r.tenant = ?1)
      AND (?2 IS NULL OR json_extract(r.record, '$.scenario') = ?2)
      AND (?3 IS NULL OR EXISTS (SELECT 1 FROM json_each(r.record, '$.rules') WHERE value = ?3))
      AND (?4 IS NULL OR json_extract(r.record, '$.lang') = ?4)";

/// The review queue under `filter`, oldest first.
///
/// Errors: the store cannot be read.
pub fn queue(conn: &Connection, filter: &Filter) -> anyhow::Result<Queue> {
    let params = [&filter.tenant, &filter.scenario, &filter.rule, &filter.lang];
    let waiting: i64 = conn.query_row(&format!("SELECT COUNT(*) {WAITING}"), params, |r| r.get(0))?;
    let sql = format!("SELECT r.record {WAITING} ORDER BY r.id LIMIT {PAGE}");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(params, |r| r.get::<_, String>(0))?;
    let mut items = Vec::new();
    for json in rows {
        let v: Value = serde_json::from_str(&json?)?;
        items.push(item(&v));
    }
    Ok(Queue { waiting: waiting as u64, items })
}

fn item(v: &Value) -> Item {
    let s = |k: &str| v[k].as_str().map(str::to_string);
    Item {
        record_id: s("record_id").unwrap_or_default(),
        request_id: s("request_id").unwrap_or_default(),
        unix_ms: v["unix_ms"].as_u64().unwrap_or_default(),
        tenant: s("tenant"),
        scenario: s("scenario"),
        route: s("route"),
        lang: s("lang"),
        risk_score: v["risk_score"].as_f64(),
        tier: s("tier").unwrap_or_default(),
        rules: v["rules"]
            .as_array()
            .map(|r| r.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
    }
}

/// The record (its JSON, as the audit trail keeps it) of the served decision `record_id`;
/// `None` when there is none (never made, past retention, or a shadow record).
///
/// Errors: the store cannot be read.
pub fn record(conn: &Connection, record_id: &str) -> anyhow::Result<Option<Value>> {
    let json: Option<String> = conn
        .query_row("SELECT record FROM records WHERE record_id = ?1 AND kind != 'shadow'", [record_id], |r| r.get(0))
        .optional()?;
    Ok(json.map(|j| serde_json::from_str(&j)).transpose()?)
}

/// Labels received since midnight UTC, from every source: the part of the console's panel that
/// is about the analysts' day (live quality itself is `crate::feedback::Feedback::live`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Today {
    /// Midnight UTC, ms since the Unix epoch.
    pub since_ms: u64,
    pub labels: u64,
    pub risk: u64,
    pub ok: u64,
    /// Of them, the signed-in reviewer's.
    pub mine: u64,
}

const DAY_MS: u64 = 86_400_000;

/// The labels received today (UTC) as of `now_ms`, and how many of them `reviewer` gave.
///
/// Errors: the store cannot be read.
pub fn today(conn: &Connection, now_ms: u64, reviewer: Option<&str>) -> anyhow::Result<Today> {
    let since_ms = now_ms - now_ms % DAY_MS;
    let mut today = Today { since_ms, labels: 0, risk: 0, ok: 0, mine: 0 };
    let mut stmt = conn.prepare(
        "SELECT truth, COUNT(*), COALESCE(SUM(reviewer IS NOT NULL AND reviewer = ?2), 0)
         FROM feedback WHERE received_ms >= ?1 GROUP BY truth",
    )?;
    let rows = stmt.query_map(rusqlite::params![since_ms as i64, reviewer], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64))
    })?;
    for row in rows {
        let (truth, n, mine) = row?;
        today.labels += n;
        today.mine += mine;
        match Truth::parse(&truth) {
            Some(Truth::Risk) => today.risk += n,
            Some(Truth::Ok) => today.ok += n,
            None => {}
        }
    }
    Ok(today)
}
