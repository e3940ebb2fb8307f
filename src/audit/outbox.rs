//! The store as an outbox: what a sink (the Kafka shipper) reads and marks shipped. The writer
//! thread inserts; the sink reads and updates through its own connection (WAL lets both run).

use super::store::Store;
use rusqlite::Connection;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One record waiting to be shipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The row id: increasing in insertion order, never reused.
    pub id: i64,
    /// The record's request id (the Kafka key).
    pub key: String,
    /// The record's JSON.
    pub payload: Vec<u8>,
}

/// What a sink needs of the store.
pub trait Outbox: Send + Sync + 'static {
    /// Oldest records not yet shipped, at most `limit`, in id order; then labels
    /// (`crate::feedback`), with negated ids.
    fn unshipped(&self, limit: usize) -> anyhow::Result<Vec<Pending>>;
    /// Marks records shipped (after the broker acknowledged them).
    fn mark_shipped(&self, ids: &[i64]) -> anyhow::Result<()>;
    /// Marks records the broker refused for good (too large, invalid): not shipped, and never
    /// handed out again, so that they do not hold back the records behind them. They stay in
    /// the local store only.
    fn mark_refused(&self, ids: &[i64]) -> anyhow::Result<()>;
    /// Records waiting to be shipped.
    fn backlog(&self) -> anyhow::Result<u64>;
}

/// Unshipped records, counted where they change (insert, ship, retention) so that reading the
/// count is free.
#[derive(Debug, Default)]
pub struct Backlog(AtomicU64);

impl Backlog {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn sub(&self, n: u64) {
        let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(n)));
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The SQLite store's outbox.
pub struct SqliteOutbox {
    conn: Mutex<Connection>,
    backlog: Arc<Backlog>,
}

impl SqliteOutbox {
    /// A connection of its own to `dir/audit.db` (opened, schema made, by [`Store::open`]).
    pub fn open(dir: &Path, backlog: Arc<Backlog>) -> anyhow::Result<SqliteOutbox> {
        let store = Store::open(dir)?;
        backlog.0.store(store.unshipped_count()?, Ordering::Relaxed);
        Ok(SqliteOutbox { conn: Mutex::new(store.into_connection()), backlog })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the `shipped` column of unshipped records (ids > 0) and labels (ids < 0, see
    /// [`Outbox::unshipped`]) to `state`, in one transaction.
    fn mark(&self, ids: &[i64], state: i64) -> anyhow::Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let mut changed = 0;
        {
            let mut record = tx.prepare_cached("UPDATE records SET shipped = ?2 WHERE id = ?1 AND shipped = 0")?;
            let mut label = tx.prepare_cached("UPDATE feedback SET shipped = ?2 WHERE id = ?1 AND shipped = 0")?;
            for &id in ids {
                changed += if id > 0 { record.execute([id, state])? } else { label.execute([-id, state])? } as u64;
            }
        }
        tx.commit()?;
        self.backlog.sub(changed);
        Ok(())
    }
}

/// The `shipped` column: 0 waiting, 1 acknowledged by the broker, 2 refused by it for good.
const SHIPPED: i64 = 1;
const REFUSED: i64 = 2;

impl Outbox for SqliteOutbox {
    fn unshipped(&self, limit: usize) -> anyhow::Result<Vec<Pending>> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare_cached("SELECT id, request_id, record FROM records WHERE shipped = 0 ORDER BY id LIMIT ?1")?;
        let rows = stmt.query_map([limit as i64], |r| {
            Ok(Pending { id: r.get(0)?, key: r.get(1)?, payload: r.get::<_, String>(2)?.into_bytes() })
        })?;
        let mut pending: Vec<Pending> = rows.collect::<Result<_, _>>()?;
        // Labels after records (a label's record ships first), with negated ids: one id space
        // for `mark_*`, whose callers only hand back what this returned.
        let room = limit.saturating_sub(pending.len());
        if room > 0 {
            let labels = crate::feedback::store::unshipped(&conn, room)?;
            pending.extend(labels.into_iter().map(|(id, key, payload)| Pending { id: -id, key, payload }));
        }
        Ok(pending)
    }

    fn mark_shipped(&self, ids: &[i64]) -> anyhow::Result<()> {
        self.mark(ids, SHIPPED)
    }

    fn mark_refused(&self, ids: &[i64]) -> anyhow::Result<()> {
        self.mark(ids, REFUSED)
    }

    fn backlog(&self) -> anyhow::Result<u64> {
        Ok(self.backlog.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::store::tests::record;

    #[test]
    fn unshipped_records_come_in_id_order_and_leave_once_shipped() {
        let dir = std::env::temp_dir().join(format!("tiergate-outbox-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = Store::open(&dir).unwrap();
        store.insert(&(0..5).map(|i| record(&format!("r{i}"), i)).collect::<Vec<_>>()).unwrap();
        let outbox = SqliteOutbox::open(&dir, Arc::default()).unwrap();
        assert_eq!(outbox.backlog().unwrap(), 5);
        let first = outbox.unshipped(3).unwrap();
        assert_eq!(first.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(), ["r0", "r1", "r2"]);
        let json: serde_json::Value = serde_json::from_slice(&first[0].payload).unwrap();
        assert_eq!(json["request_id"], "r0");
        outbox.mark_shipped(&first.iter().map(|p| p.id).collect::<Vec<_>>()).unwrap();
        outbox.mark_shipped(&[first[0].id]).unwrap();
        assert_eq!(outbox.backlog().unwrap(), 2, "marking twice counts once");
        assert_eq!(outbox.unshipped(10).unwrap().iter().map(|p| p.key.clone()).collect::<Vec<_>>(), ["r3", "r4"]);
        outbox.mark_refused(&[outbox.unshipped(1).unwrap()[0].id]).unwrap();
        assert_eq!(outbox.backlog().unwrap(), 1, "a refused record no longer waits");
        assert_eq!(outbox.unshipped(10).unwrap().iter().map(|p| p.key.clone()).collect::<Vec<_>>(), ["r4"]);
        let refused: i64 =
            store.connection().query_row("SELECT COUNT(*) FROM records WHERE shipped = 2", [], |r| r.get(0)).unwrap();
        assert_eq!(refused, 1, "kept in the store, marked refused rather than shipped");
    }
}
