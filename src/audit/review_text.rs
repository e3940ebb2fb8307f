//! `[audit.review_text]`: an opt-in, short-lived store of the text of `review` decisions, for the
//! review console (docs/operations.md, "Review console"). The audit trail itself keeps only what
//! `[audit] text` says (by default a keyed hash); an analyst labelling a `review` decision needs
//! the words.
//!
//! The texts live in a file of their own, `audit.dir/review_text.db` (SQLite, WAL, mode 0600),
//! not in `audit.db`: a backup of the trail (`tiergate audit backup`), a copy kept for an
//! investigation and the Kafka sink never carry them, and retention is the file's own. Only the
//! audit writer thread writes it — the text of each committed record whose action is `review`
//! (shadow records aside: they are a candidate policy's, not a decision anyone acted on), right
//! after the records' commit — and its retention run deletes texts older than
//! `retention_hours`. With the store off, the file is deleted at start: turning it off forgets
//! what it kept. It is read only through the admin listener ([`read`]).

use super::record::{AuditRecord, Kind, RecordedAction};
use anyhow::Context as _;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file's name inside `audit.dir`.
pub const DB_FILE: &str = "review_text.db";

/// The longest `retention_hours`: a month. The store is for the review queue's working set,
/// not an archive.
pub const MAX_RETENTION_HOURS: u64 = 720;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS review_text (
    record_id TEXT PRIMARY KEY,
    unix_ms INTEGER NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS review_text_unix_ms ON review_text (unix_ms);
";

/// `[audit.review_text]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReviewTextConfig {
    /// Keep the text of `review` decisions (default false).
    pub enabled: bool,
    /// Texts older than this many hours are deleted (1 to [`MAX_RETENTION_HOURS`]; default 72).
    pub retention_hours: u64,
}

impl Default for ReviewTextConfig {
    fn default() -> Self {
        ReviewTextConfig { enabled: false, retention_hours: 72 }
    }
}

impl ReviewTextConfig {
    /// Checks the range; the error names the key and the limits.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_RETENTION_HOURS).contains(&self.retention_hours) {
            return Err(format!(
                "`audit.review_text.retention_hours` must be between 1 and {MAX_RETENTION_HOURS}, got {}",
                self.retention_hours
            ));
        }
        Ok(())
    }

    fn retention_ms(&self) -> u64 {
        self.retention_hours * 3_600_000
    }
}

/// The writer's side of the store: its connection and retention.
pub struct ReviewTexts {
    conn: Connection,
    retention_ms: u64,
}

impl ReviewTexts {
    /// Opens (creating) `dir/review_text.db` when `config.enabled`, else deletes any such file a
    /// previous run left (and returns `None`).
    ///
    /// Errors: the file cannot be created, opened or deleted (naming it).
    pub fn open(dir: &Path, config: &ReviewTextConfig) -> anyhow::Result<Option<ReviewTexts>> {
        let path = dir.join(DB_FILE);
        if !config.enabled {
            for file in [path.clone(), wal(&path, "-wal"), wal(&path, "-shm")] {
                match std::fs::remove_file(&file) {
                    Ok(()) => {
                        tracing::info!(file = %file.display(), "[audit.review_text] is off: deleted the kept texts")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e).with_context(|| format!("deleting {}", file.display())),
                }
            }
            return Ok(None);
        }
        let conn = set_up(&path).with_context(|| format!("opening the review-text store {}", path.display()))?;
        Ok(Some(ReviewTexts { conn, retention_ms: config.retention_ms() }))
    }

    /// Whether the text of a record of `kind` and `action` is to be kept: a `review` decision,
    /// not a shadow candidate's.
    pub fn wanted(kind: Kind, action: RecordedAction) -> bool {
        action == RecordedAction::Review && kind != Kind::Shadow
    }

    /// Keeps each committed record's text (one transaction). `texts[i]` belongs to `records[i]`
    /// (`None`: not kept).
    ///
    /// Errors: SQLite's (the records are committed regardless; the console then shows the hash).
    pub fn keep(&mut self, records: &[AuditRecord], texts: &[Option<Arc<str>>]) -> anyhow::Result<usize> {
        let tx = self.conn.transaction()?;
        let mut kept = 0;
        {
            let mut insert =
                tx.prepare_cached("INSERT OR REPLACE INTO review_text (record_id, unix_ms, text) VALUES (?1, ?2, ?3)")?;
            for (record, text) in records.iter().zip(texts) {
                if let Some(text) = text {
                    insert.execute(params![record.record_id, record.unix_ms as i64, &**text])?;
                    kept += 1;
                }
            }
        }
        tx.commit()?;
        Ok(kept)
    }

    /// Deletes the texts of decisions made before `now_ms - retention_hours`; says how many.
    pub fn retain(&mut self, now_ms: u64) -> anyhow::Result<u64> {
        let cutoff = now_ms.saturating_sub(self.retention_ms) as i64;
        Ok(self.conn.execute("DELETE FROM review_text WHERE unix_ms < ?1", [cutoff])? as u64)
    }
}

fn wal(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn set_up(path: &Path) -> anyhow::Result<Connection> {
    let fresh = !path.exists();
    let conn = Connection::open(path)?;
    if fresh {
        // Texts of users' messages: readable by tiergate's user only.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "SQLite refused WAL mode ({mode})");
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Deleted texts are overwritten, not left in free pages of the file.
    conn.pragma_update(None, "secure_delete", "ON")?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// The kept text of the record `record_id`, read through a read-only connection to
/// `dir/review_text.db`: `None` when the store is off (no file), or holds no text for it (not a
/// `review` decision, or past retention).
///
/// Errors: the file exists but cannot be read.
pub fn read(dir: &Path, record_id: &str) -> anyhow::Result<Option<String>> {
    let path = dir.join(DB_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let read = || -> anyhow::Result<Option<String>> {
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let text = conn
            .query_row("SELECT text FROM review_text WHERE record_id = ?1", [record_id], |r| r.get(0))
            .optional()?;
        Ok(text)
    };
    read().with_context(|| format!("reading the review-text store {}", path.display()))
}

#[cfg(test)]
mod tests;
