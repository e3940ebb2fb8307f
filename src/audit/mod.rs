//! The audit trail: one record per decision, kept in a local store whose unshipped records
//! form an [`outbox`] that [`kafka`] ships to a fleet's topic.

pub mod kafka;
pub mod outbox;
