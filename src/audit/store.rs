//! The embedded store: SQLite (crate `rusqlite`, SQLite bundled) in `audit.dir/audit.db`, in WAL
//! mode, written by one writer thread in one transaction per flush. Each row holds a record's
//! JSON, the columns queries filter on (indexed) and the outbox flag `shipped`.
//!
//! Durability: `synchronous = NORMAL` in WAL mode, so a committed flush survives the process
//! being killed; a power cut can lose the last commits the OS had not yet written.
//!
//! Retention deletes the oldest records (by insertion order) first: those older than the age
//! limit, then as many as keep the bytes in use under the size limit, shipped ones before
//! unshipped ones when a sink ships the trail.

use super::record::AuditRecord;
use anyhow::Context as _;
use rusqlite::{params, Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The database's file name inside `audit.dir`.
pub const DB_FILE: &str = "audit.db";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    unix_ms INTEGER NOT NULL,
    kind TEXT NOT NULL,
    tenant TEXT,
    route TEXT,
    action TEXT NOT NULL,
    tier TEXT NOT NULL,
    shipped INTEGER NOT NULL DEFAULT 0,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_request_id ON records (request_id);
CREATE INDEX IF NOT EXISTS records_unix_ms ON records (unix_ms);
CREATE INDEX IF NOT EXISTS records_tenant ON records (tenant, unix_ms);
CREATE INDEX IF NOT EXISTS records_route ON records (route, unix_ms);
CREATE INDEX IF NOT EXISTS records_action ON records (action, unix_ms);
CREATE INDEX IF NOT EXISTS records_tier ON records (tier, unix_ms);
CREATE INDEX IF NOT EXISTS records_kind ON records (kind, unix_ms);
CREATE INDEX IF NOT EXISTS records_unshipped ON records (id) WHERE shipped = 0;
";

/// Added after the first stores were written: each record's own id as a column, so that a label
/// (`POST /v1/feedback`) finds its record by index. Older rows keep it `NULL`.
const RECORD_ID_COLUMN: &str = "ALTER TABLE records ADD COLUMN record_id TEXT";
const RECORD_ID_INDEX: &str = "CREATE INDEX IF NOT EXISTS records_record_id ON records (record_id)";

/// SQLite's answer when it must create the WAL's `-shm` file in a directory it cannot write.
fn is_read_only_directory(e: &anyhow::Error) -> bool {
    e.downcast_ref::<rusqlite::Error>().and_then(|e| e.sqlite_error()).is_some_and(|e| {
        e.extended_code == rusqlite::ffi::SQLITE_READONLY_DIRECTORY || e.extended_code == rusqlite::ffi::SQLITE_CANTOPEN
    })
}

/// How long a connection waits for another's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the store, schema in place.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// Size and age limits (`[audit] max_bytes`, `max_age_days`).
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_bytes: u64,
    /// `None`: no age limit.
    pub max_age_ms: Option<u64>,
    /// Delete shipped records before unshipped ones (a sink ships the trail).
    pub shipped_first: bool,
}

/// What one retention run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    pub by_age: u64,
    pub by_size: u64,
    /// Of those, records no sink had shipped yet.
    pub unshipped: u64,
}

impl Store {
    /// Opens (creating the directory, the file and the schema as needed) `dir/audit.db`.
    pub fn open(dir: &Path) -> anyhow::Result<Store> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating the audit directory {}", dir.display()))?;
        let path = dir.join(DB_FILE);
        let conn = Self::set_up(&path).with_context(|| format!("opening the audit store {}", path.display()))?;
        Ok(Store { conn, path })
    }

    fn set_up(path: &Path) -> anyhow::Result<Connection> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Before any table exists: lets retention hand freed pages back to the file system.
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "SQLite refused WAL mode ({mode})");
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(SCHEMA).context("creating the audit schema")?;
        let has_record_id: bool =
            conn.prepare("SELECT 1 FROM pragma_table_info('records') WHERE name = 'record_id'")?.exists([])?;
        if !has_record_id {
            conn.execute_batch(RECORD_ID_COLUMN).context("adding the record_id column")?;
        }
        conn.execute_batch(RECORD_ID_INDEX)?;
        conn.execute_batch(crate::feedback::store::SCHEMA).context("creating the feedback table")?;
        Ok(conn)
    }

    /// Opens an existing store read-only (for queries). Where the directory is read-only to this
    /// user (a copy kept for an investigation), SQLite cannot make the WAL's shared-memory file
    /// and the store is opened as immutable instead: it must then have no writer. Errors say what
    /// is missing, unreadable or not an audit store, naming the file.
    pub fn open_read_only(dir: &Path) -> anyhow::Result<Connection> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => anyhow::bail!("{} is not a directory: give the `[audit] dir`", dir.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                anyhow::bail!("no audit directory {}: it does not exist", dir.display())
            }
            Err(e) => anyhow::bail!("cannot read the audit directory {}: {e}", dir.display()),
        }
        let path = dir.join(DB_FILE);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => {}
            Ok(_) => anyhow::bail!("{} is not a file", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                anyhow::bail!("{} has no {DB_FILE}: is it the `[audit] dir` of a tiergate that ran?", dir.display())
            }
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        }
        let opened = Self::probe(Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY));
        let conn = match opened {
            Err(e) if is_read_only_directory(&e) => {
                let uri = format!("file:{}?immutable=1", path.display());
                Self::probe(Connection::open_with_flags(
                    &uri,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
                ))
            }
            other => other,
        };
        conn.with_context(|| format!("reading the audit store {}", path.display()))
    }

    /// Copies the store in `dir` to the new file `out` as one consistent snapshot, while a
    /// server may be writing it: SQLite's `VACUUM INTO` through a read-only connection, which
    /// reads a WAL snapshot and never takes the write lock, so the writer's commits go on
    /// meanwhile. Written to a temporary name beside `out` and renamed, so that `out` is either
    /// absent or complete. Returns the records copied.
    ///
    /// Errors: `out` exists, its directory cannot be written, or `dir` is not an audit store.
    pub fn backup(dir: &Path, out: &Path) -> anyhow::Result<u64> {
        anyhow::ensure!(!out.exists(), "{} exists: give a new file for the backup", out.display());
        let conn = Self::open_read_only(dir)?;
        let name = out.file_name().with_context(|| format!("{} names no file", out.display()))?;
        let partial = out.with_file_name(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
        let _ = std::fs::remove_file(&partial);
        let copied = conn
            .execute("VACUUM INTO ?1", [partial.to_string_lossy()])
            .with_context(|| format!("backing up {} into {}", dir.join(DB_FILE).display(), partial.display()));
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
        let records: i64 = Connection::open_with_flags(&partial, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| c.query_row("SELECT COUNT(*) FROM records", [], |r| r.get(0)))
            .with_context(|| format!("reading the backup {}", partial.display()))?;
        std::fs::rename(&partial, out)
            .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?;
        Ok(records as u64)
    }

    /// The connection if it reads an audit store: the `records` table is there.
    fn probe(conn: rusqlite::Result<Connection>) -> anyhow::Result<Connection> {
        let conn = conn?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let tables: i64 =
            conn.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'records'", [], |r| {
                r.get(0)
            })?;
        anyhow::ensure!(tables == 1, "no `records` table: not an audit store");
        Ok(conn)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    pub fn into_connection(self) -> Connection {
        self.conn
    }

    /// Writes `records` in one transaction (all or none).
    pub fn insert(&mut self, records: &[AuditRecord]) -> anyhow::Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO records (request_id, unix_ms, kind, tenant, route, action, tier, record, record_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?;
            for r in records {
                let json = serde_json::to_string(r)?;
                insert.execute(params![
                    r.request_id,
                    r.unix_ms as i64,
                    r.kind.as_str(),
                    r.tenant,
                    r.route,
                    r.action.as_str(),
                    r.tier.as_str(),
                    json,
                    r.record_id
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Writes `labels` in one transaction and says what became of each
    /// ([`crate::feedback::store::apply`]).
    pub fn feedback(
        &mut self,
        labels: &[crate::feedback::Label],
        now_ms: u64,
    ) -> anyhow::Result<Vec<crate::feedback::Applied>> {
        let tx = self.conn.transaction()?;
        let applied = crate::feedback::store::apply(&tx, labels, now_ms)?;
        tx.commit()?;
        Ok(applied)
    }

    /// Records and labels not shipped yet.
    pub fn unshipped_count(&self) -> anyhow::Result<u64> {
        let sql = "SELECT (SELECT COUNT(*) FROM records WHERE shipped = 0) + (SELECT COUNT(*) FROM feedback WHERE shipped = 0)";
        Ok(self.conn.query_row(sql, [], |r| r.get::<_, i64>(0))? as u64)
    }

    /// Bytes of the database file in use (pages not on the free list).
    pub fn used_bytes(&self) -> anyhow::Result<u64> {
        let pragma = |name: &str| self.conn.pragma_query_value(None, name, |r| r.get::<_, i64>(0));
        let (pages, free, size) = (pragma("page_count")?, pragma("freelist_count")?, pragma("page_size")?);
        Ok(((pages - free).max(0) * size) as u64)
    }

    /// Deletes what is past the limits, oldest first; says how many went.
    pub fn retain(&mut self, limits: &Retention, now_ms: u64) -> anyhow::Result<Deleted> {
        let mut deleted = Deleted::default();
        if let Some(age) = limits.max_age_ms {
            let cutoff = now_ms.saturating_sub(age) as i64;
            let (n, unshipped) = self.delete("DELETE FROM records WHERE unix_ms < ?1 RETURNING shipped", cutoff)?;
            deleted.by_age += n;
            deleted.unshipped += unshipped;
        }
        // Each round deletes what the average row size says is over; index pages free less
        // evenly than table pages, so a few rounds may be needed (bounded, never all at once).
        for _ in 0..32 {
            let used = self.used_bytes()?;
            if used <= limits.max_bytes {
                break;
            }
            let rows = self.conn.query_row("SELECT COUNT(*) FROM records", [], |r| r.get::<_, i64>(0))?;
            if rows == 0 {
                break;
            }
            let per_row = (used / rows as u64).max(1);
            let n = ((used - limits.max_bytes) / per_row + 1).max(rows as u64 / 100).max(1) as i64;
            let oldest =
                "DELETE FROM records WHERE id IN (SELECT id FROM records ORDER BY id LIMIT ?1) RETURNING shipped";
            let (mut gone, mut unshipped) = (0, 0);
            if limits.shipped_first {
                (gone, unshipped) = self.delete(
                    "DELETE FROM records WHERE id IN
                     (SELECT id FROM records WHERE shipped = 1 ORDER BY id LIMIT ?1) RETURNING shipped",
                    n,
                )?;
            }
            if gone == 0 {
                (gone, unshipped) = self.delete(oldest, n)?;
            }
            deleted.by_size += gone;
            deleted.unshipped += unshipped;
        }
        if deleted.by_age + deleted.by_size > 0 {
            // A label lives as long as its record.
            crate::feedback::store::retain(&self.conn)?;
            self.conn.execute_batch("PRAGMA incremental_vacuum;")?;
        }
        Ok(deleted)
    }

    /// Runs a `DELETE ... RETURNING shipped` with one parameter: (rows deleted, of them unshipped).
    fn delete(&self, sql: &str, param: i64) -> anyhow::Result<(u64, u64)> {
        let mut stmt = self.conn.prepare_cached(sql)?;
        let mut rows = stmt.query([param])?;
        let (mut n, mut unshipped) = (0, 0);
        while let Some(row) = rows.next()? {
            n += 1;
            unshipped += (row.get::<_, i64>(0)? == 0) as u64;
        }
        Ok((n, unshipped))
    }
}

#[cfg(test)]
pub(super) mod tests;
