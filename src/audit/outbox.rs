//! The outbox: records stored locally, waiting to be shipped to a fleet sink (Kafka).

pub struct Pending {
    pub id: i64,
    pub key: String,      /* request id */
    pub payload: Vec<u8>, /* record JSON */
}
pub trait Outbox: Send + Sync + 'static {
    /// Oldest records not yet shipped, at most `limit`, in id order.
    fn unshipped(&self, limit: usize) -> anyhow::Result<Vec<Pending>>;
    /// Marks records shipped (after the broker acknowledged them).
    fn mark_shipped(&self, ids: &[i64]) -> anyhow::Result<()>;
    /// Records waiting to be shipped.
    fn backlog(&self) -> anyhow::Result<u64>;
}
