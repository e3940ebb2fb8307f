//! `[audit]`: where the audit trail is kept, how it records text, how its queue and writer
//! behave, and how large and old it may grow.

use super::kafka::KafkaConfig;
pub use super::text::TextMode;
use serde::Deserialize;
use std::path::PathBuf;

/// What happens to a decision whose record finds the queue full (`[audit] on_full`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFull {
    /// The request is answered 503 with `Retry-After` (nothing is lost silently).
    #[default]
    Block,
    /// The record is dropped and counted in `tiergate_audit_dropped_total`.
    Drop,
}

/// `[audit]`. Present (with `dir`) turns the audit trail on.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Data directory (created if missing): `audit.db` (SQLite, WAL) and, when tiergate
    /// generates the HMAC key, `hmac.key`. Relative to the config file's directory.
    pub dir: PathBuf,
    pub text: TextMode,
    /// The HMAC key for `text = "hash"` (at least 16 bytes; `${VAR}` reads it from the
    /// environment). Else `key_file`, else the environment variable `TIERGATE_AUDIT_KEY`, else
    /// one is generated once and kept in `dir/hmac.key`.
    pub key: Option<String>,
    /// A file holding the HMAC key (surrounding whitespace ignored).
    pub key_file: Option<PathBuf>,
    /// Records waiting for the writer, at most; past it `on_full` applies.
    pub queue_capacity: usize,
    pub on_full: OnFull,
    /// The writer commits at least this often while records wait, ms. After SIGKILL (or a power
    /// cut before the OS wrote the WAL) the records of at most this interval, plus those still
    /// in the queue, are lost; SIGTERM flushes everything.
    pub flush_interval_ms: u64,
    /// ... and as soon as this many records wait, or half of `queue_capacity` when that is less
    /// (one transaction each time).
    pub flush_max_records: usize,
    /// The database's size in use is kept under this many bytes by deleting the oldest records
    /// (shipped ones first when a Kafka sink ships the trail).
    pub max_bytes: u64,
    /// Records older than this many days are deleted; 0 keeps them until `max_bytes`.
    pub max_age_days: u64,
    /// How often retention runs, ms.
    pub retention_interval_ms: u64,
    /// `[audit.kafka]`: ship the trail to a Kafka topic (the store is the outbox); absent: the
    /// trail stays local.
    pub kafka: Option<KafkaConfig>,
    /// `[audit.review_text]`: keep the text of `review` decisions for the review console, for a
    /// short time (off by default).
    pub review_text: super::review_text::ReviewTextConfig,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            dir: PathBuf::new(),
            text: TextMode::Hash,
            key: None,
            key_file: None,
            queue_capacity: 8192,
            on_full: OnFull::Block,
            flush_interval_ms: 100,
            flush_max_records: 1024,
            max_bytes: 1 << 30,
            max_age_days: 90,
            retention_interval_ms: 60_000,
            kafka: None,
            review_text: Default::default(),
        }
    }
}

impl AuditConfig {
    /// Checks ranges; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.dir.as_os_str().is_empty() {
            return Err("`audit.dir` must name the audit data directory".into());
        }
        let positive = [
            ("audit.queue_capacity", self.queue_capacity as u64),
            ("audit.flush_interval_ms", self.flush_interval_ms),
            ("audit.flush_max_records", self.flush_max_records as u64),
            ("audit.retention_interval_ms", self.retention_interval_ms),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{name}` must be at least 1"));
        }
        for (name, value) in
            [("audit.queue_capacity", self.queue_capacity), ("audit.flush_max_records", self.flush_max_records)]
        {
            if value > MAX_QUEUE {
                return Err(format!("`{name}` must be at most {MAX_QUEUE}, got {value}"));
            }
        }
        if self.max_bytes < MIN_MAX_BYTES {
            return Err(format!("`audit.max_bytes` must be at least {MIN_MAX_BYTES} (1 MiB), got {}", self.max_bytes));
        }
        if self.key.is_some() && self.key_file.is_some() {
            return Err("set `audit.key` or `audit.key_file`, not both".into());
        }
        if let Some(kafka) = &self.kafka {
            kafka.validate("audit.kafka")?;
        }
        self.review_text.validate()?;
        Ok(())
    }
}

/// The largest `queue_capacity` and `flush_max_records`: the queue's slots are allocated when
/// it opens (16 bytes each, 16 MiB at this bound), and a minute of decisions at any rate this
/// server reaches fits well inside it.
pub const MAX_QUEUE: usize = 1 << 20;

/// The smallest `max_bytes`: below it the schema and one flush would not fit.
pub const MIN_MAX_BYTES: u64 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_sizes_are_bounded_and_the_error_names_the_field_and_the_limit() {
        let base = || AuditConfig { dir: "data/audit".into(), ..AuditConfig::default() };
        let huge = AuditConfig { queue_capacity: 100_000_000_000, ..base() };
        assert_eq!(huge.validate().unwrap_err(), "`audit.queue_capacity` must be at most 1048576, got 100000000000");
        let huge = AuditConfig { flush_max_records: MAX_QUEUE + 1, ..base() };
        assert!(huge.validate().unwrap_err().starts_with("`audit.flush_max_records` must be at most 1048576"));
        assert_eq!(AuditConfig { queue_capacity: MAX_QUEUE, ..base() }.validate(), Ok(()));
    }
}
