//! The audit trail when the store or the process misbehaves: a store locked by another
//! connection for longer than any busy timeout (the queue backs up, then requests are refused —
//! no answered request without its record, nothing dropped), a SIGKILL (at most one flush
//! interval of answered decisions lost), and `tiergate audit backup` of a store being written.

mod common;

use http::StatusCode;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiergate::audit::query::{self, Filter};
use tiergate::audit::store::{Store, DB_FILE};
use tiergate::audit::{AuditConfig, AuditRecord};
use tiergate::gateway::Sources;

const BENIGN: &str = "Are we still on for lunch tomorrow at noon?";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-audit-durable-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Every record in the store at `dir`, oldest first.
fn all_records(dir: &Path) -> Vec<AuditRecord> {
    let conn = Store::open_read_only(dir).unwrap();
    let mut out = Vec::new();
    query::for_each(&conn, &Filter::default(), |json| {
        out.push(serde_json::from_str(json)?);
        Ok(())
    })
    .unwrap();
    out
}

async fn classify(addr: std::net::SocketAddr, id: &str) -> common::Reply {
    let headers = [("content-type", "application/json"), ("x-request-id", id), ("x-tiergate-deadline-ms", "5000")];
    common::send(addr, "POST", "/v1/classify", &headers, json!({"text": BENIGN}).to_string()).await
}

/// The queue in the store-lock test: at the test's 20 requests/s it fills in under a second of
/// the 35 s lock, so the test sees the queue back up and then the refusals.
const LOCK_QUEUE: usize = 16;
/// How long another connection holds the store's write lock: far past the store's 5 s busy
/// timeout and the old writer's 3 attempts (15 s), after which it dropped the batch.
const LOCK_HELD: Duration = Duration::from_secs(35);
/// The test's request rate while the lock is held.
const LOCK_RATE_PER_S: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_locked_for_35_s_backs_the_queue_up_then_refuses_and_loses_no_record() {
    let dir = scratch("locked");
    let mut config = common::config(&common::repo().join("policies"));
    config.audit = Some(AuditConfig { dir: dir.clone(), queue_capacity: LOCK_QUEUE, ..AuditConfig::default() });
    let (addr, gateway) = common::start_with(config, Sources::default());
    // Another connection (a backup tool, an operator's DELETE) takes the write lock and holds it.
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let db = dir.join(DB_FILE);
    let locker = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(db).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(LOCK_HELD);
        conn.execute_batch("COMMIT").unwrap();
    });
    locked.recv().unwrap();
    let started = Instant::now();
    let mut answered = Vec::new();
    let mut i = 0;
    // Through the lock and 3 s beyond it, at the test's rate.
    while started.elapsed() < LOCK_HELD + Duration::from_secs(3) {
        let id = format!("locked-{i:04}");
        let reply = classify(addr, &id).await;
        answered.push((id, reply.status, reply.headers.get("retry-after").cloned()));
        i += 1;
        let next = started + Duration::from_millis(i * 1000 / LOCK_RATE_PER_S);
        tokio::time::sleep_until(next.into()).await;
    }
    locker.join().unwrap();
    let audit = gateway.audit.clone().unwrap();
    tokio::task::spawn_blocking(move || audit.flush()).await.unwrap();
    let stored: Vec<AuditRecord> = all_records(&dir);
    let recorded: BTreeSet<&str> = stored.iter().map(|r| r.request_id.as_str()).collect();
    let (mut ok, mut refused) = (0, 0);
    for (id, status, retry_after) in &answered {
        match *status {
            StatusCode::OK => {
                ok += 1;
                assert!(recorded.contains(id.as_str()), "{id} was answered 200 and has no record");
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                refused += 1;
                assert!(retry_after.is_some(), "{id}: 503 without Retry-After");
                assert!(!recorded.contains(id.as_str()), "{id} was refused and has a record");
            }
            other => panic!("{id}: {other}"),
        }
    }
    assert!(refused > 0, "the queue of {LOCK_QUEUE} never filled during a {LOCK_HELD:?} lock ({ok} answered)");
    assert!(ok > LOCK_QUEUE, "requests after the lock were not answered: {ok} answered, {refused} refused");
    assert_eq!(stored.len(), ok, "one record per answered request");
    assert_eq!(gateway.metrics.audit_dropped.get(), 0, "nothing was dropped");
    // Every record has its own id, a UUIDv7.
    let ids: BTreeSet<&str> = stored.iter().map(|r| r.record_id.as_str()).collect();
    assert_eq!(ids.len(), stored.len(), "record ids repeat");
    for id in ids {
        assert_eq!(uuid::Uuid::parse_str(id).map(|u| u.get_version_num()).ok(), Some(7), "{id:?}");
    }
}

/// Busy threads at normal priority on every core (twice over), until dropped: the CPU-bound
/// server a starved audit writer falls behind on.
struct CpuHog {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuHog {
    fn start() -> CpuHog {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let n = 2 * std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                })
            })
            .collect();
        CpuHog { stop, threads }
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `tiergate serve` with the audit trail in `dir/audit` and these `[audit]` lines.
fn serve(dir: &Path, audit: &str) -> common::Sidecar {
    common::Sidecar::audited(dir, audit)
}

/// The flush interval of the SIGKILL test, ms.
const FLUSH_MS: u64 = 100;
/// Beyond the interval, the time one commit of a flush's records may take on a loaded machine.
const COMMIT_ALLOWANCE_MS: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_loses_at_most_one_flush_interval_of_answered_decisions() {
    let dir = scratch("sigkill");
    let mut server = serve(&dir, &format!("flush_interval_ms = {FLUSH_MS}"));
    let addr = server.public;
    let hog = CpuHog::start();
    let answered: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (answered, stop) = (Arc::clone(&answered), Arc::clone(&stop));
            tokio::spawn(async move {
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let id = format!("kill-{c}-{i:05}");
                    // A request cut by the kill panics inside `send`: its own task absorbs it.
                    let rid = id.clone();
                    if let Ok(reply) = tokio::spawn(async move { classify(addr, &rid).await }).await {
                        if reply.status == StatusCode::OK {
                            answered.lock().unwrap().push((id, Instant::now()));
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let killed_at = Instant::now();
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    drop(hog);
    let recorded: BTreeSet<String> = all_records(&dir.join("audit")).into_iter().map(|r| r.request_id).collect();
    let answered = answered.lock().unwrap();
    let old_enough = killed_at - Duration::from_millis(FLUSH_MS + COMMIT_ALLOWANCE_MS);
    let due: Vec<&String> = answered.iter().filter(|(_, at)| *at < old_enough).map(|(id, _)| id).collect();
    let lost: Vec<&&String> = due.iter().filter(|id| !recorded.contains(id.as_str())).collect();
    assert!(due.len() >= 50, "too few requests answered to tell: {}", due.len());
    assert!(
        lost.is_empty(),
        "{} of {} requests answered over {FLUSH_MS} + {COMMIT_ALLOWANCE_MS} ms before the SIGKILL have no record \
         (first: {:?}); {} answered in all, {} records",
        lost.len(),
        due.len(),
        lost.first(),
        answered.len(),
        recorded.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_backup_copies_the_store_while_the_server_writes_without_blocking_it() {
    let dir = scratch("backup");
    let mut config = common::config(&common::repo().join("policies"));
    config.audit = Some(AuditConfig { dir: dir.join("audit"), flush_interval_ms: 20, ..AuditConfig::default() });
    let (addr, gateway) = common::start_with(config, Sources::default());
    for i in 0..50 {
        assert_eq!(classify(addr, &format!("before-{i}")).await.status, StatusCode::OK);
    }
    let audit = gateway.audit.clone().unwrap();
    tokio::task::spawn_blocking(move || audit.flush()).await.unwrap();
    // The server keeps deciding (and committing every 20 ms) while the backup runs.
    let out = dir.join("backup.db");
    let (dir_arg, out_arg) = (dir.join("audit"), out.clone());
    let backup = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tiergate"))
            .args(["audit", "backup", "--dir"])
            .arg(dir_arg)
            .arg("--out")
            .arg(out_arg)
            .output()
            .unwrap()
    });
    let mut during = 0;
    while !backup.is_finished() || during < 20 {
        let reply = classify(addr, &format!("during-{during}")).await;
        assert_eq!(reply.status, StatusCode::OK, "a request was refused while the backup ran");
        during += 1;
    }
    let backup = backup.await.unwrap();
    assert!(backup.status.success(), "{}", String::from_utf8_lossy(&backup.stderr));
    assert!(String::from_utf8_lossy(&backup.stdout).starts_with("wrote "), "{backup:?}");
    // The copy is an audit store: `tiergate audit` reads it from a directory of its own.
    let copy = dir.join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::rename(&out, copy.join(DB_FILE)).unwrap();
    let copied: BTreeSet<String> = all_records(&copy).into_iter().map(|r| r.request_id).collect();
    assert!((0..50).all(|i| copied.contains(&format!("before-{i}"))), "{} records copied", copied.len());
    let audit = gateway.audit.clone().unwrap();
    tokio::task::spawn_blocking(move || audit.flush()).await.unwrap();
    let live: BTreeSet<String> = all_records(&dir.join("audit")).into_iter().map(|r| r.request_id).collect();
    assert!((0..during).all(|i| live.contains(&format!("during-{i}"))), "the writer lost records during the backup");
    assert_eq!(gateway.metrics.audit_dropped.get(), 0);
}
