//! The Kafka sink's config section (`[audit.kafka]`): where the brokers are, the topic, how
//! records are batched and compressed, backoff, and SASL. Strict: unknown keys are errors, and
//! [`KafkaConfig::validate`] names the key at fault.

use rskafka::client::partition::Compression;
use serde::Deserialize;

/// Where and how audit records are shipped. Every duration is in milliseconds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port` each (at least one); the cluster's metadata names the rest.
    pub brokers: Vec<String>,
    /// The topic records are produced to, keyed by request id.
    pub topic: String,
    /// Partitions of the topic when the shipper creates it (it does when the topic is missing).
    pub partitions: i32,
    /// Replication factor of the topic when the shipper creates it.
    pub replication_factor: i16,
    /// Compression of produced record batches.
    pub compression: KafkaCompression,
    /// Records taken from the outbox per round trip.
    pub batch_records: usize,
    /// Bound on one produce request's records (key + value bytes, before compression); keep it
    /// below the topic's `max.message.bytes` (1 MB by default). A record larger than this is
    /// sent alone.
    pub batch_bytes: usize,
    /// Wait between polls of the outbox when it is empty.
    pub poll_interval_ms: u64,
    /// Bound on one produce (or connect) round trip, including the client's own retries.
    pub request_timeout_ms: u64,
    /// First wait after a failure; doubles on each further failure up to `backoff_max_ms`.
    pub backoff_initial_ms: u64,
    /// Cap of the wait between retries while the broker is unreachable.
    pub backoff_max_ms: u64,
    /// On stop, how long the shipper keeps shipping what is left before it returns.
    pub drain_timeout_ms: u64,
    /// The Kafka client id the brokers see.
    pub client_id: String,
    /// SASL authentication (over plaintext TCP; TLS is not supported).
    pub sasl: Option<SaslConfig>,
    /// Not supported: present only to refuse it with a clear error (see [`KafkaConfig::validate`]).
    #[doc(hidden)]
    pub tls: Option<toml::Value>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: vec!["127.0.0.1:9092".into()],
            topic: "tiergate.audit".into(),
            partitions: 1,
            replication_factor: 1,
            compression: KafkaCompression::None,
            batch_records: 500,
            batch_bytes: 900_000,
            poll_interval_ms: 200,
            request_timeout_ms: 10_000,
            backoff_initial_ms: 100,
            backoff_max_ms: 30_000,
            drain_timeout_ms: 5_000,
            client_id: "tiergate".into(),
            sasl: None,
            tls: None,
        }
    }
}

/// Compression codecs of produced batches (the ones the client, rskafka, implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KafkaCompression {
    None,
    Gzip,
    Lz4,
    Snappy,
    Zstd,
}

impl KafkaCompression {
    /// The client's codec.
    pub fn codec(self) -> Compression {
        match self {
            KafkaCompression::None => Compression::NoCompression,
            KafkaCompression::Gzip => Compression::Gzip,
            KafkaCompression::Lz4 => Compression::Lz4,
            KafkaCompression::Snappy => Compression::Snappy,
            KafkaCompression::Zstd => Compression::Zstd,
        }
    }
}

/// SASL credentials and mechanism.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslConfig {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

/// SASL mechanisms the client implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslConfig {
    /// The client's SASL config.
    pub fn client_config(&self) -> rskafka::client::SaslConfig {
        use rskafka::client::{Credentials, SaslConfig as Client};
        let credentials = Credentials::new(self.username.clone(), self.password.clone());
        match self.mechanism {
            SaslMechanism::Plain => Client::Plain(credentials),
            SaslMechanism::ScramSha256 => Client::ScramSha256(credentials),
            SaslMechanism::ScramSha512 => Client::ScramSha512(credentials),
        }
    }
}

impl KafkaConfig {
    /// Checks ranges; the error names the key under `prefix` (e.g. `audit.kafka`).
    pub fn validate(&self, prefix: &str) -> Result<(), String> {
        if self.tls.is_some() {
            return Err(format!(
                "`{prefix}.tls`: TLS to Kafka is not supported (plaintext TCP only; use SASL over a private network, or a local TLS-terminating proxy)"
            ));
        }
        if self.brokers.is_empty() {
            return Err(format!("`{prefix}.brokers` must name at least one `host:port`"));
        }
        if let Some(bad) = self.brokers.iter().find(|b| !is_host_port(b)) {
            return Err(format!("`{prefix}.brokers`: {bad:?} is not `host:port`"));
        }
        if self.topic.is_empty() || self.topic.len() > 249 || !self.topic.chars().all(topic_char) {
            return Err(format!(
                "`{prefix}.topic`: {:?} is not a Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -)",
                self.topic
            ));
        }
        let positive = [
            ("partitions", self.partitions.max(0) as u64),
            ("replication_factor", self.replication_factor.max(0) as u64),
            ("batch_records", self.batch_records as u64),
            ("batch_bytes", self.batch_bytes as u64),
            ("poll_interval_ms", self.poll_interval_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            ("backoff_initial_ms", self.backoff_initial_ms),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{prefix}.{name}` must be at least 1"));
        }
        if self.backoff_max_ms < self.backoff_initial_ms {
            return Err(format!("`{prefix}.backoff_max_ms` must be at least `{prefix}.backoff_initial_ms`"));
        }
        Ok(())
    }
}

fn is_host_port(broker: &str) -> bool {
    broker.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

fn topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `[kafka]`-section TOML the way the config file is read: errors carry the key path.
    fn parse(text: &str) -> Result<KafkaConfig, String> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
        let config: KafkaConfig =
            serde_path_to_error::deserialize(table).map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
        config.validate("audit.kafka")?;
        Ok(config)
    }

    #[test]
    fn defaults_are_valid_and_a_full_section_parses() {
        assert_eq!(parse("").unwrap(), KafkaConfig::default());
        let c = parse(
            r#"brokers = ["k1:9092", "k2:9092"]
               topic = "risk.audit"
               partitions = 6
               replication_factor = 3
               compression = "zstd"
               batch_records = 100
               poll_interval_ms = 50
               sasl = { mechanism = "SCRAM-SHA-512", username = "u", password = "p" }"#,
        )
        .unwrap();
        assert_eq!(c.brokers, ["k1:9092", "k2:9092"]);
        assert_eq!((c.partitions, c.replication_factor, c.batch_records), (6, 3, 100));
        assert_eq!(c.compression.codec(), Compression::Zstd);
        assert_eq!(c.sasl.unwrap().mechanism, SaslMechanism::ScramSha512);
    }

    #[test]
    fn every_codec_parses() {
        for name in ["none", "gzip", "lz4", "snappy", "zstd"] {
            parse(&format!("compression = {name:?}")).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("compression = \"brotli\"", "compression"),
            ("brokers = []", "audit.kafka.brokers"),
            ("brokers = [\"localhost\"]", "audit.kafka.brokers"),
            ("topic = \"a b\"", "audit.kafka.topic"),
            ("partitions = 0", "audit.kafka.partitions"),
            ("batch_records = 0", "audit.kafka.batch_records"),
            ("batch_bytes = 0", "audit.kafka.batch_bytes"),
            ("batch_bytes = -1", "batch_bytes"),
            ("backoff_max_ms = 10", "audit.kafka.backoff_max_ms"),
            ("tls = { ca = \"ca.pem\" }", "audit.kafka.tls"),
            ("tls = true", "audit.kafka.tls"),
            ("topics = \"x\"", "topics"),
            ("sasl = { mechanism = \"GSSAPI\", username = \"u\", password = \"p\" }", "sasl.mechanism"),
            ("sasl = { mechanism = \"PLAIN\", user = \"u\", password = \"p\" }", "sasl"),
        ];
        for (text, key) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(key), "{text}: {err:?} does not name {key}");
        }
    }
}
