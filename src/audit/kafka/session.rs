//! One connection to the Kafka cluster: the client, the topic (created when missing) and a
//! client per partition; produces a batch keyed by request id, partitioned the way Kafka's
//! default partitioner does (murmur2 of the key), so a fleet's Java consumers agree.

use super::config::KafkaConfig;
use crate::audit::outbox::Pending;
use chrono::{DateTime, Utc};
use rskafka::client::error::{Error as ClientError, ProtocolError};
use rskafka::client::partition::{PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use std::collections::BTreeMap;
use std::time::Duration;

/// The Kafka record header that carries the audit record's `record_id`.
pub const RECORD_ID_HEADER: &str = "tiergate-record-id";
/// The header of a label (`"type": "feedback"`): the `record_id` of the decision it labels. Not
/// [`RECORD_ID_HEADER`], so that a consumer de-duplicating records by it keeps both.
pub const FEEDBACK_FOR_HEADER: &str = "tiergate-feedback-for";

/// The seed of Kafka's `Utils.murmur2`, which its default partitioner hashes keys with.
const KAFKA_MURMUR2_SEED: u32 = 0x9747_b28c;

/// A connected client with the topic's partitions.
pub struct Session {
    /// Held for the connections the partition clients share.
    _client: Client,
    partitions: Vec<PartitionClient>,
}

/// Records produced by one [`Session::produce`], and the error that stopped it, if any.
#[derive(Default)]
pub struct Produced {
    /// Outbox ids the broker acknowledged.
    pub acked: Vec<i64>,
    /// Records the broker refused for good (e.g. larger than its `message.max.bytes`).
    pub rejected: Vec<Rejected>,
    pub error: Option<String>,
}

/// A record the broker refused, with its reason (the Kafka protocol error).
pub struct Rejected {
    pub id: i64,
    pub request_id: String,
    pub reason: String,
}

impl Session {
    /// Connects, creates the topic when missing, and opens every partition; bounded by
    /// `request_timeout_ms`. The error says what failed, for the log.
    pub async fn connect(config: &KafkaConfig) -> Result<Session, String> {
        let timeout = Duration::from_millis(config.request_timeout_ms);
        match tokio::time::timeout(timeout, Session::connect_unbounded(config, timeout)).await {
            Ok(result) => result,
            Err(_) => Err(format!("connecting to {:?} took over {timeout:?}", config.brokers)),
        }
    }

    async fn connect_unbounded(config: &KafkaConfig, timeout: Duration) -> Result<Session, String> {
        // The client retries inside one call only until `timeout`: the shipper's own backoff
        // (with a log line per state change) takes over from there.
        let backoff = rskafka::BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(timeout),
        };
        let mut builder =
            ClientBuilder::new(config.brokers.clone()).client_id(config.client_id.as_str()).backoff_config(backoff);
        if let Some(sasl) = &config.sasl {
            builder = builder.sasl_config(sasl.client_config());
        }
        let client = builder.build().await.map_err(|e| format!("connecting to {:?}: {e}", config.brokers))?;
        let count = ensure_topic(&client, config, timeout).await?;
        let mut partitions = Vec::with_capacity(count);
        for partition in 0..count as i32 {
            let handle = client
                .partition_client(config.topic.as_str(), partition, UnknownTopicHandling::Error)
                .await
                .map_err(|e| format!("opening {}/{partition}: {e}", config.topic))?;
            partitions.push(handle);
        }
        Ok(Session { _client: client, partitions })
    }

    /// Produces `batch`: grouped by partition, in requests of at most `batch_bytes` (key +
    /// value, uncompressed) each. Returns what was acknowledged and what the broker refused for
    /// good; stops at the first failed request.
    pub async fn produce(&self, batch: Vec<Pending>, config: &KafkaConfig) -> Produced {
        let mut groups: BTreeMap<usize, Vec<Pending>> = BTreeMap::new();
        for pending in batch {
            groups.entry(partition_for(pending.key.as_bytes(), self.partitions.len())).or_default().push(pending);
        }
        let mut out = Produced::default();
        for (partition, pendings) in groups {
            for chunk in chunks(&pendings, config.batch_bytes) {
                if let Err(error) = self.produce_chunk(partition, chunk, config, &mut out).await {
                    out.error = Some(error);
                    return out;
                }
            }
        }
        out
    }

    /// One request; when the broker refuses the batch for its content (too large, invalid), each
    /// record is tried alone so that one bad record does not hold back the others.
    async fn produce_chunk(
        &self,
        partition: usize,
        chunk: &[Pending],
        config: &KafkaConfig,
        out: &mut Produced,
    ) -> Result<(), String> {
        match self.send(partition, chunk, config).await {
            Ok(()) => out.acked.extend(chunk.iter().map(|p| p.id)),
            Err(Sent::Refused(reason)) if chunk.len() == 1 => {
                out.rejected.push(Rejected { id: chunk[0].id, request_id: chunk[0].key.clone(), reason })
            }
            Err(Sent::Refused(_)) => {
                for one in chunk.chunks(1) {
                    Box::pin(self.produce_chunk(partition, one, config, out)).await?;
                }
            }
            Err(Sent::Failed(error)) => return Err(error),
        }
        Ok(())
    }

    async fn send(&self, partition: usize, chunk: &[Pending], config: &KafkaConfig) -> Result<(), Sent> {
        let timeout = Duration::from_millis(config.request_timeout_ms);
        let records = chunk.iter().map(record).collect();
        let produce = self.partitions[partition].produce(records, config.compression.codec());
        match tokio::time::timeout(timeout, produce).await {
            Ok(Ok(_offsets)) => Ok(()),
            Ok(Err(e)) => match refusal(&e) {
                Some(protocol_error) => Err(Sent::Refused(protocol_error.to_string())),
                None => Err(Sent::Failed(format!("producing to {}/{partition}: {e}", config.topic))),
            },
            Err(_) => Err(Sent::Failed(format!(
                "producing to {}/{partition}: no acknowledgement within {timeout:?}",
                config.topic
            ))),
        }
    }
}

/// How a request failed: the broker refused its records for good, or anything else (retried).
enum Sent {
    Refused(String),
    Failed(String),
}

/// The protocol error when the broker refuses the records themselves (retrying cannot help).
fn refusal(error: &ClientError) -> Option<ProtocolError> {
    match error {
        ClientError::ServerError {
            // Not CORRUPT_MESSAGE: Kafka marks it retriable (a CRC broken on the wire, not a
            // record the broker will never take), so it is retried like a lost connection.
            protocol_error:
                e @ (ProtocolError::MessageTooLarge | ProtocolError::RecordListTooLarge | ProtocolError::InvalidRecord),
            ..
        } => Some(*e),
        _ => None,
    }
}

/// Consecutive runs of `pendings` of at most `max_bytes` of key + value each (a record larger
/// than that alone).
fn chunks(pendings: &[Pending], max_bytes: usize) -> Vec<&[Pending]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, p) in pendings.iter().enumerate() {
        let size = p.key.len() + p.payload.len();
        if i > start && bytes + size > max_bytes {
            out.push(&pendings[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < pendings.len() {
        out.push(&pendings[start..]);
    }
    out
}

/// Creates the topic unless it exists; returns its partition count.
async fn ensure_topic(client: &Client, config: &KafkaConfig, timeout: Duration) -> Result<usize, String> {
    let topic = &config.topic;
    let existing = partition_count(client, topic).await?;
    if existing > 0 {
        return Ok(existing);
    }
    let controller = client.controller_client().map_err(|e| format!("controller client: {e}"))?;
    let created = controller
        .create_topic(topic.as_str(), config.partitions, config.replication_factor, timeout.as_millis() as i32)
        .await;
    match created {
        Ok(()) => {}
        // Another shipper of the fleet created it first.
        Err(ClientError::ServerError { protocol_error: ProtocolError::TopicAlreadyExists, .. }) => {}
        Err(e) => return Err(format!("creating topic {topic}: {e}")),
    }
    tracing::info!(topic = %topic, partitions = config.partitions, "audit kafka: created the topic");
    match partition_count(client, topic).await? {
        0 => Err(format!("topic {topic} has no partitions after creating it")),
        n => Ok(n),
    }
}

/// Partitions of `topic` (0: no such topic), from fresh metadata.
async fn partition_count(client: &Client, topic: &str) -> Result<usize, String> {
    let topics = client.list_topics().await.map_err(|e| format!("listing topics: {e}"))?;
    Ok(topics.into_iter().find(|t| t.name == topic).map_or(0, |t| t.partitions.len()))
}

/// Kafka's default partitioner for a keyed record: `toPositive(murmur2(key)) % partitions`.
pub fn partition_for(key: &[u8], partitions: usize) -> usize {
    (murmur2::murmur2(key, KAFKA_MURMUR2_SEED) & 0x7fff_ffff) as usize % partitions.max(1)
}

/// The Kafka record of an outbox record: key the request id, value the record's JSON, time
/// the decision's `unix_ms` (the ship time if the JSON has none).
fn record(pending: &Pending) -> Record {
    #[derive(serde::Deserialize, Default)]
    struct Fields {
        unix_ms: Option<i64>,
        record_id: Option<String>,
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    let fields = serde_json::from_slice::<Fields>(&pending.payload).unwrap_or_default();
    let unix_ms = fields.unix_ms.unwrap_or_else(now_ms);
    // The record's own id as a header too, so that a consumer can de-duplicate without parsing.
    let header = if fields.kind.as_deref() == Some("feedback") { FEEDBACK_FOR_HEADER } else { RECORD_ID_HEADER };
    let headers = fields.record_id.filter(|id| !id.is_empty()).map(|id| (header.to_string(), id.into_bytes()));
    Record {
        key: Some(pending.key.clone().into_bytes()),
        value: Some(pending.payload.clone()),
        headers: headers.into_iter().collect(),
        timestamp: DateTime::<Utc>::from_timestamp_millis(unix_ms).unwrap_or_default(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of Kafka's `Utils.murmur2` / default partitioner, as the Java client computes them.
    #[test]
    fn keys_land_where_kafkas_default_partitioner_puts_them() {
        // `Utils.murmur2("21".getBytes())` is -973932308 in Kafka's own unit test (UtilsTest).
        assert_eq!(murmur2::murmur2(b"21", KAFKA_MURMUR2_SEED) as i32, -973932308);
        assert_eq!(murmur2::murmur2(b"foobar", KAFKA_MURMUR2_SEED) as i32, -790332482);
        assert_eq!(partition_for(b"anything", 1), 0);
    }

    fn pending(id: i64, bytes: usize) -> Pending {
        Pending { id, key: format!("r{id}"), payload: vec![b'x'; bytes - 2] }
    }

    #[test]
    fn batches_are_cut_at_batch_bytes_and_an_oversized_record_goes_alone() {
        let batch: Vec<Pending> =
            [400, 400, 400, 1500, 100, 100].iter().zip(1..).map(|(b, id)| pending(id, *b)).collect();
        let ids = |chunks: Vec<&[Pending]>| -> Vec<Vec<i64>> {
            chunks.iter().map(|c| c.iter().map(|p| p.id).collect()).collect()
        };
        assert_eq!(ids(chunks(&batch, 1000)), [vec![1, 2], vec![3], vec![4], vec![5, 6]]);
        assert_eq!(ids(chunks(&batch, 1_000_000)), [vec![1, 2, 3, 4, 5, 6]]);
        assert!(chunks(&[], 10).is_empty());
    }

    #[test]
    fn only_content_errors_count_as_refusals() {
        let server = |protocol_error| ClientError::ServerError {
            protocol_error,
            error_message: None,
            request: rskafka::client::error::RequestContext::Topic("t".into()),
            response: None,
            is_virtual: false,
        };
        assert_eq!(refusal(&server(ProtocolError::MessageTooLarge)), Some(ProtocolError::MessageTooLarge));
        assert_eq!(refusal(&server(ProtocolError::NotLeaderOrFollower)), None);
        assert_eq!(refusal(&server(ProtocolError::UnknownTopicOrPartition)), None);
        assert_eq!(refusal(&server(ProtocolError::CorruptMessage)), None, "retriable in Kafka");
    }
}
