//! What the report reads from the audit store, through one read-only connection: the window's
//! decision records one at a time (never all in memory: a week of traffic is millions), the
//! labels of the decisions made in the window (`tiergate::feedback::store`), and each labelled
//! record's kind.

use rusqlite::Connection;
use std::collections::HashMap;
use tiergate::drift::Observation;

/// Decisions made in `[since_ms, until_ms)` (ms since the Unix epoch), counted per bucket of
/// `bucket_ms` aligned to the epoch (whole UTC hours or days: the first and last buckets may
/// hold only part of theirs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub since_ms: u64,
    pub until_ms: u64,
    pub bucket_ms: u64,
}

impl Span {
    fn size(&self) -> u64 {
        self.bucket_ms.max(1)
    }

    /// How many buckets the span touches.
    pub fn buckets(&self) -> usize {
        if self.until_ms <= self.since_ms {
            return 0;
        }
        ((self.until_ms - 1) / self.size() - self.since_ms / self.size() + 1) as usize
    }

    /// The bucket of a time inside the span.
    pub fn bucket_of(&self, unix_ms: u64) -> usize {
        (unix_ms / self.size()).saturating_sub(self.since_ms / self.size()) as usize
    }

    /// Where bucket `i` starts (the first may start before `since_ms`).
    pub fn start_of(&self, i: usize) -> u64 {
        (self.since_ms / self.size() + i as u64) * self.size()
    }
}

/// One served decision's record as the report reads it (shadow records are left out: they
/// repeat a live decision with the candidate policy's verdict).
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    pub unix_ms: u64,
    /// classify, screen or stream_cut.
    pub kind: String,
    /// allow, review, block or unscreened.
    pub action: String,
    /// The deciding tier: cpu, gpu, rules, guard, features, unscreened.
    pub tier: String,
    /// The policy version that decided it.
    pub policy_version: Option<String>,
    /// `None` for records written before records had ids.
    pub record_id: Option<String>,
    /// What the drift monitor reads of it; `None` without a risk score (unscreened).
    pub observation: Option<Observation>,
}

/// Errors when the store was written by a tiergate from before labels (no `feedback` table or
/// record ids): opened read-only, the report cannot add them; the current tiergate does on start.
pub fn check_schema(conn: &Connection, store: &std::path::Path) -> anyhow::Result<()> {
    let has = |sql: &str| -> rusqlite::Result<bool> { conn.prepare(sql)?.exists([]) };
    let feedback = has("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'feedback'")?;
    let record_id = has("SELECT 1 FROM pragma_table_info('records') WHERE name = 'record_id'")?;
    anyhow::ensure!(
        feedback && record_id,
        "the audit store {} predates labels (no {}): start the current tiergate on it once to add them",
        store.display(),
        if feedback { "record ids" } else { "feedback table" }
    );
    Ok(())
}

fn clamp(ms: u64) -> i64 {
    ms.min(i64::MAX as u64) as i64
}

/// Calls `each` with every served decision made in the span, oldest first. Errors: the store
/// cannot be read, or `each`'s.
pub fn for_each_decision(
    conn: &Connection,
    span: &Span,
    mut each: impl FnMut(Decided) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut stmt = conn.prepare(
        "SELECT unix_ms, kind, action, record_id, json_extract(record, '$.risk_score'),
                json_extract(record, '$.ood_score'), json_extract(record, '$.text_chars'),
                json_extract(record, '$.lang'), tier, json_extract(record, '$.policy_version')
         FROM records WHERE unix_ms >= ?1 AND unix_ms < ?2 AND kind != 'shadow' ORDER BY unix_ms, id",
    )?;
    let mut rows = stmt.query([clamp(span.since_ms), clamp(span.until_ms)])?;
    let mut n = 0;
    while let Some(r) = rows.next()? {
        let risk_score: Option<f64> = r.get(4)?;
        let observation = risk_score.map(|risk_score| -> rusqlite::Result<Observation> {
            Ok(Observation {
                risk_score,
                ood_score: r.get(5)?,
                text_chars: r.get::<_, Option<i64>>(6)?.unwrap_or(0).max(0) as u64,
                lang: r.get(7)?,
            })
        });
        each(Decided {
            unix_ms: r.get::<_, i64>(0)?.max(0) as u64,
            kind: r.get(1)?,
            action: r.get(2)?,
            tier: r.get(8)?,
            policy_version: r.get(9)?,
            record_id: r.get(3)?,
            observation: observation.transpose()?,
        })?;
        n += 1;
    }
    Ok(n)
}

/// The record kind (classify, screen, stream_cut) of every labelled decision made in the span,
/// by record id.
pub fn labelled_kinds(conn: &Connection, span: &Span) -> anyhow::Result<HashMap<String, String>> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT f.record_id, r.kind FROM feedback f JOIN records r ON r.id = f.record_row
         WHERE f.decided_ms >= ?1 AND f.decided_ms < ?2",
    )?;
    let rows = stmt.query_map([clamp(span.since_ms), clamp(span.until_ms)], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::{check_schema, Span};

    #[test]
    fn a_store_from_before_labels_is_named_with_what_it_lacks() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE records (id INTEGER PRIMARY KEY, record TEXT)").unwrap();
        let e = check_schema(&conn, std::path::Path::new("/var/audit")).unwrap_err().to_string();
        assert!(e.contains("/var/audit predates labels (no feedback table)"), "{e}");
        conn.execute_batch("CREATE TABLE feedback (id INTEGER)").unwrap();
        let e = check_schema(&conn, std::path::Path::new("/var/audit")).unwrap_err().to_string();
        assert!(e.contains("(no record ids)"), "{e}");
        conn.execute_batch("ALTER TABLE records ADD COLUMN record_id TEXT").unwrap();
        check_schema(&conn, std::path::Path::new("/var/audit")).unwrap();
    }

    #[test]
    fn buckets_are_whole_hours_and_cover_the_span() {
        let hour = 3_600_000;
        // 00:30 to 02:30 and 1 ms: parts of three hours.
        let span = Span { since_ms: hour / 2, until_ms: 2 * hour + hour / 2 + 1, bucket_ms: hour };
        assert_eq!(span.buckets(), 3);
        assert_eq!((span.bucket_of(hour / 2), span.bucket_of(hour), span.bucket_of(2 * hour + hour / 2)), (0, 1, 2));
        assert_eq!((span.start_of(0), span.start_of(2)), (0, 2 * hour));
        assert_eq!(Span { since_ms: 0, until_ms: 2 * hour, bucket_ms: hour }.buckets(), 2, "until is excluded");
        assert_eq!(Span { since_ms: 5, until_ms: 5, bucket_ms: 10 }.buckets(), 0);
    }
}
