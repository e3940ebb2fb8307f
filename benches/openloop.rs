//! An open-loop HTTP load generator for `POST /v1/classify` (or any JSON endpoint taking
//! `{"text": ...}`), corrected for coordinated omission.
//!
//! For each offered rate the whole send schedule is computed before the first request
//! (uniform spacing, or Poisson arrivals with a fixed seed), and every request's latency is
//! measured from its *intended* send time, not from when it was actually sent: when the server
//! falls behind, the time a request spends waiting for a free connection counts, as it would
//! for a real client (wrk2's correction). Requests go out on up to `--connections` keep-alive
//! connections, taken last-in-first-out from a pool and opened on demand, so a slow response
//! holds up only its own connection. Messages rotate through the `text` fields of JSONL files.
//!
//! Run (the server must be up):
//!
//! ```sh
//! cargo bench --bench openloop -- --url http://127.0.0.1:8080/v1/classify \
//!     --data tests/data/ood_short.jsonl --rates 100,200,400,800 --duration 8
//! ```
//!
//! Per rate it prints one table row and, with `--json FILE`, appends one JSON line. What counts:
//! - `ok`: 2xx and the body matches none of the `--degraded` markers (for tiergate: the cpu
//!   tier really ran, not skipped, shed or out of time); `goodput` = ok per second;
//! - `degraded`: 2xx with a marker: tiergate answered from its rules because the model tier
//!   was overloaded or out of time (fast answers that must not count as model throughput);
//! - `errors`: connection errors and non-2xx; `timeouts`: no answer within `--timeout-ms`;
//!   `unsent`: still waiting for a connection when the drain deadline (end of schedule +
//!   timeout) passed. Timed-out and unsent requests enter the latency percentiles at the
//!   latency they had reached when given up (a lower bound); errors do not.
//! - `service_p50`: p50 from the actual send to the end of the response (no schedule lag):
//!   the figure for an unloaded single request at a low rate, where tokio's 1 ms timer
//!   granularity would otherwise add up to 1 ms of send lag.
//!
//! With `--pid PID` it also samples the server (that process and its descendants): resident
//! memory (sum of VmRSS, peak over 200 ms samples; sum of VmHWM at the end) and CPU time, and
//! the CPU that other processes used meanwhile (`other_cpu_cores`, to discard disturbed runs);
//! `server_cpu_ms_per_req_by_thread` splits the server's CPU per request by thread name (all of
//! a name summed: `tiergate-cpu-0`, `tokio-rt-worker`, `tiergate-audit`, ...), which attributes
//! a cost to the thread that pays it when the total is too noisy to show it.
//! With `--phases R1:S1,R2:S2,...` the offered rate changes over time (a burst: `350:2,2100:5,350:8`):
//! the schedule is the phases in turn, `--warmup` seconds of it are not measured, and the JSON
//! adds `recovery_s`: from the end of the highest-rate phase to the end of the last 100 ms bin
//! (by intended send time) whose p99 is at or above `--p99-bound-ms` (0: none after it).
//! With `--deadline-ms D` it counts `late`: answers later than D + 5 ms after their intended send.
//! Without `--url` (plain `cargo bench`) it prints how to use it and exits.

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

#[derive(Parser, Debug, Clone)]
#[command(name = "openloop", about = "open-loop load generator (coordinated-omission corrected)")]
struct Args {
    /// Target, e.g. http://127.0.0.1:8080/v1/classify
    #[arg(long)]
    url: Option<String>,
    /// One offered rate (requests/s).
    #[arg(long)]
    rate: Option<f64>,
    /// A sweep: comma-separated rates, run in the order given.
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// Measured seconds per rate (after the warm-up).
    #[arg(long, default_value_t = 8.0)]
    duration: f64,
    /// Seconds at the same rate before measuring (not counted).
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// JSONL files whose `text` fields are sent in turn (repeatable).
    #[arg(long, required = false)]
    data: Vec<PathBuf>,
    /// Keep only texts of at least this many bytes.
    #[arg(long, default_value_t = 0)]
    min_bytes: usize,
    /// Keep only texts of at most this many bytes.
    #[arg(long, default_value_t = usize::MAX)]
    max_bytes: usize,
    /// Most connections open at once (= most requests in flight).
    #[arg(long, default_value_t = 256)]
    connections: usize,
    /// Give up on a request after this long (counted as a timeout).
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// `uniform` (fixed spacing, as wrk2) or `poisson` (exponential gaps, fixed seed).
    #[arg(long, default_value = "uniform")]
    arrivals: String,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Append one JSON line per rate to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// A name for this server/config in the output.
    #[arg(long, default_value = "")]
    label: String,
    /// Seconds of quiet between rates (lets queues drain).
    #[arg(long, default_value_t = 1.0)]
    pause: f64,
    /// A 2xx body containing any of these is `degraded`, not `ok` (repeatable). Default:
    /// tiergate's markers for a cpu tier that was skipped, shed or out of time.
    #[arg(long)]
    degraded: Vec<String>,
    /// Count nothing as degraded.
    #[arg(long)]
    no_degraded: bool,
    /// Server process to sample (RSS, CPU), with its descendants.
    #[arg(long)]
    pid: Option<u32>,
    /// In a sweep, stop after the first saturated rate (goodput < 90 % of offered, or p99 > 1 s).
    #[arg(long)]
    stop_on_saturation: bool,
    /// The p99 bound (ms) that a rate must meet to count as sustained in the summary.
    #[arg(long, default_value_t = 50.0)]
    p99_bound_ms: f64,
    /// Tokio worker threads of the generator (1: current-thread runtime).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A changing rate: comma-separated `rate:seconds` phases, run in turn as one measurement
    /// (instead of --rate/--rates; --duration is their total less --warmup).
    #[arg(long, value_delimiter = ',')]
    phases: Vec<String>,
    /// The server's request deadline, ms: answers later than this + 5 ms count as `late`.
    #[arg(long)]
    deadline_ms: Option<f64>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// tiergate's path steps for a cpu tier that did not run the model (serde writes `tier` first).
const TIERGATE_DEGRADED: [&str; 7] = [
    r#""tier":"cpu","outcome":"skipped""#,
    r#""tier":"cpu","outcome":"shed""#,
    r#""tier":"cpu","outcome":"doomed""#,
    r#""tier":"cpu","outcome":"timeout""#,
    r#""tier":"cpu","outcome":"unavailable""#,
    r#""tier":"cpu","outcome":"circuit_open""#,
    r#""tier":"cpu","outcome":"error""#,
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Ok,
    Degraded,
    Error,
    Timeout,
    Unsent,
}

#[derive(Clone, Copy)]
struct Sample {
    index: usize,
    outcome: Outcome,
    /// From the intended send time to the end of the response (or to giving up).
    latency_us: u64,
    /// From the actual send to the end of the response.
    service_us: u64,
    /// Actual send minus intended send.
    lag_us: u64,
    done: Instant,
}

struct Target {
    addr: String,
    authority: String,
    path: String,
}

/// Keep-alive HTTP/1.1 connections, reused last-in-first-out so that a low rate keeps few warm.
struct Pool {
    target: Target,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    opened: AtomicUsize,
}

impl Pool {
    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = tokio::net::TcpStream::connect(&self.target.addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(sender)
    }

    fn take(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap();
        while let Some(s) = idle.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    fn put(&self, s: SendRequest<Full<Bytes>>) {
        if !s.is_closed() {
            self.idle.lock().unwrap().push(s);
        }
    }

    fn request(&self, body: Bytes) -> hyper::Request<Full<Bytes>> {
        hyper::Request::post(&self.target.path)
            .header(hyper::header::HOST, &self.target.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("valid request")
    }

    /// Sends one request; a reused connection that the server closed while idle is retried
    /// once on a new one (as HTTP clients do). Returns the status and the body, and the
    /// instant the request was handed to a connection.
    async fn send(&self, body: Bytes) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        for _ in 0..2 {
            let (mut s, reused) = match self.take() {
                Some(s) => (s, true),
                None => (self.connect().await?, false),
            };
            if let Err(e) = s.ready().await {
                if reused {
                    continue;
                }
                return Err(e.into());
            }
            match s.send_request(self.request(body.clone())).await {
                Ok(resp) => {
                    let status = resp.status();
                    let keep = !resp
                        .headers()
                        .get(hyper::header::CONNECTION)
                        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                    let bytes = resp.into_body().collect().await?.to_bytes();
                    if keep {
                        self.put(s);
                    }
                    return Ok((status, bytes));
                }
                Err(e) if reused && (e.is_canceled() || e.is_closed() || e.is_incomplete_message()) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::bail!("connection closed twice")
    }
}

fn parse_url(url: &str) -> anyhow::Result<Target> {
    let uri: hyper::Uri = url.parse()?;
    anyhow::ensure!(uri.scheme_str() == Some("http"), "only http:// URLs");
    let authority = uri.authority().ok_or_else(|| anyhow::anyhow!("URL without host"))?.to_string();
    let addr = if uri.port().is_some() { authority.clone() } else { format!("{authority}:80") };
    let path = uri.path_and_query().map(|p| p.to_string()).unwrap_or_else(|| "/".into());
    Ok(Target { addr, authority, path })
}

fn load_bodies(args: &Args) -> anyhow::Result<Vec<Bytes>> {
    let mut bodies = Vec::new();
    for file in &args.data {
        let content = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
        for line in content.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)?;
            if let Some(text) = v["text"].as_str() {
                if text.len() >= args.min_bytes && text.len() <= args.max_bytes {
                    bodies.push(Bytes::from(serde_json::to_vec(&serde_json::json!({ "text": text }))?));
                }
            }
        }
    }
    anyhow::ensure!(!bodies.is_empty(), "no messages in --data within the byte limits");
    Ok(bodies)
}

/// Send offsets from the start, in seconds.
fn schedule(rate: f64, seconds: f64, arrivals: &str, seed: u64) -> Vec<f64> {
    let n = (rate * seconds).round() as usize;
    match arrivals {
        "poisson" => {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut t = 0.0;
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                t += -(1.0 - rng.f64()).ln() / rate;
                out.push(t);
            }
            out
        }
        _ => (0..n).map(|i| i as f64 / rate).collect(),
    }
}

/// Parses `rate:seconds` phases.
fn parse_phases(phases: &[String]) -> anyhow::Result<Vec<(f64, f64)>> {
    phases
        .iter()
        .map(|p| {
            let (r, s) = p.split_once(':').ok_or_else(|| anyhow::anyhow!("phase {p:?}: want rate:seconds"))?;
            let (r, s): (f64, f64) = (r.trim().parse()?, s.trim().parse()?);
            anyhow::ensure!(r > 0.0 && s > 0.0, "phase {p:?}: rate and seconds must be positive");
            Ok((r, s))
        })
        .collect()
}

/// Send offsets of consecutive phases, in seconds from the start.
fn phased_schedule(phases: &[(f64, f64)], arrivals: &str, seed: u64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut t0 = 0.0;
    for (k, &(rate, secs)) in phases.iter().enumerate() {
        out.extend(schedule(rate, secs, arrivals, seed + k as u64).into_iter().map(|t| t0 + t));
        t0 += secs;
    }
    out
}

/// Seconds from the end of the highest-rate phase to the end of the last 100 ms bin (by intended
/// send offset) whose p99 latency is at or above `bound_ms`; 0 when none is.
fn recovery_s(samples: &[Sample], offsets: &[f64], phases: &[(f64, f64)], bound_ms: f64) -> f64 {
    let peak = phases.iter().enumerate().max_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(i, _)| i).unwrap_or(0);
    let peak_end: f64 = phases[..=peak].iter().map(|p| p.1).sum();
    let mut bins: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for s in samples.iter().filter(|s| s.outcome != Outcome::Error && offsets[s.index] >= peak_end) {
        bins.entry(((offsets[s.index] - peak_end) * 10.0) as u64).or_default().push(s.latency_us);
    }
    let last_bad = bins.iter_mut().rev().find_map(|(bin, lat)| {
        lat.sort_unstable();
        (percentile(lat, 0.99) >= bound_ms).then_some(*bin)
    });
    last_bad.map_or(0.0, |b| (b + 1) as f64 / 10.0)
}

/// A process and its descendants, from /proc.
fn process_tree(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                // The comm field may hold spaces: the fields after the last ')' are fixed.
                if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
                    if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse::<u32>().ok()) {
                        parents.push((pid, ppid));
                    }
                }
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// utime + stime of a process in seconds (clock ticks of 1/100 s, as on every Linux we run).
fn cpu_seconds(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After ')': state(0) ppid(1) ... utime(11) stime(12)
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(0.0)
}

/// Busy CPU seconds of the whole machine (all but idle and iowait), from /proc/stat.
fn machine_busy_seconds() -> f64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let f: Vec<f64> = s.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            let total: f64 = f.iter().take(8).sum();
            Some((total - f.get(3)? - f.get(4)?) / 100.0)
        })
        .unwrap_or(0.0)
}

fn tree_cpu(tree: &[u32]) -> f64 {
    tree.iter().map(|p| cpu_seconds(&p.to_string())).sum()
}

/// CPU seconds of the tree's threads, summed by thread name (`/proc/P/task/T/comm`).
fn thread_cpu(tree: &[u32]) -> std::collections::BTreeMap<String, f64> {
    let mut by_name = std::collections::BTreeMap::new();
    for pid in tree {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for task in tasks.flatten() {
            let tid = task.file_name().to_string_lossy().into_owned();
            let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) else { continue };
            *by_name.entry(name.trim().to_string()).or_insert(0.0) += cpu_seconds(&format!("{pid}/task/{tid}"));
        }
    }
    by_name
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

struct RateResult {
    json: serde_json::Value,
    saturated: bool,
    sustained: bool,
}

async fn run_rate(
    args: &Args,
    phases: &[(f64, f64)],
    pool: Arc<Pool>,
    bodies: Arc<Vec<Bytes>>,
    rate: f64,
) -> RateResult {
    let degraded: Arc<Vec<String>> = Arc::new(if args.no_degraded {
        Vec::new()
    } else if args.degraded.is_empty() {
        TIERGATE_DEGRADED.iter().map(|s| s.to_string()).collect()
    } else {
        args.degraded.clone()
    });
    let offsets = Arc::new(if phases.is_empty() {
        schedule(rate, args.warmup + args.duration, &args.arrivals, args.seed)
    } else {
        phased_schedule(phases, &args.arrivals, args.seed)
    });
    let n = offsets.len();
    let measure_from = offsets.partition_point(|&t| t < args.warmup);
    let timeout = Duration::from_millis(args.timeout_ms);
    let start = Instant::now() + Duration::from_millis(50);
    let total_s = if phases.is_empty() { args.warmup + args.duration } else { phases.iter().map(|p| p.1).sum() };
    let schedule_end = start + Duration::from_secs_f64(total_s);
    let drain_deadline = schedule_end + timeout;
    let next = Arc::new(AtomicUsize::new(0));
    let opened_before = pool.opened.load(Ordering::Relaxed);

    // Server sampling: RSS every 200 ms, CPU time at the start and end.
    let tree = args.pid.map(process_tree).unwrap_or_default();
    let server_cpu0 = tree_cpu(&tree);
    let threads0 = thread_cpu(&tree);
    let client_cpu0 = cpu_seconds("self");
    let machine0 = machine_busy_seconds();
    let wall0 = std::time::Instant::now();
    let stop_sampling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (tree, stop) = (tree.clone(), Arc::clone(&stop_sampling));
        tokio::spawn(async move {
            let mut peak = 0u64;
            while !stop.load(Ordering::Relaxed) && !tree.is_empty() {
                peak = peak.max(tree.iter().map(|p| status_kb(*p, "VmRSS:")).sum());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            peak
        })
    };

    let workers = args.connections.min(n.max(1));
    let mut handles = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (pool, bodies, offsets, next, degraded) =
            (Arc::clone(&pool), Arc::clone(&bodies), Arc::clone(&offsets), Arc::clone(&next), Arc::clone(&degraded));
        handles.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let intended = start + Duration::from_secs_f64(offsets[i]);
                tokio::time::sleep_until(intended).await;
                let sent = Instant::now();
                if sent > drain_deadline {
                    let us = (sent - intended).as_micros() as u64;
                    out.push(Sample {
                        index: i,
                        outcome: Outcome::Unsent,
                        latency_us: us,
                        service_us: 0,
                        lag_us: us,
                        done: sent,
                    });
                    continue;
                }
                let body = bodies[i % bodies.len()].clone();
                let result = tokio::time::timeout(timeout, pool.send(body)).await;
                let done = Instant::now();
                let outcome = match result {
                    Err(_) => Outcome::Timeout,
                    Ok(Err(_)) => Outcome::Error,
                    Ok(Ok((status, _))) if !status.is_success() => Outcome::Error,
                    Ok(Ok((_, body))) => {
                        let text = String::from_utf8_lossy(&body);
                        if degraded.iter().any(|m| text.contains(m.as_str())) {
                            Outcome::Degraded
                        } else {
                            Outcome::Ok
                        }
                    }
                };
                out.push(Sample {
                    index: i,
                    outcome,
                    latency_us: (done - intended).as_micros() as u64,
                    service_us: (done - sent).as_micros() as u64,
                    lag_us: (sent - intended).as_micros() as u64,
                    done,
                });
            }
            out
        }));
    }
    let mut samples = Vec::with_capacity(n);
    for h in handles {
        samples.extend(h.await.expect("worker"));
    }
    stop_sampling.store(true, Ordering::Relaxed);
    let rss_peak_kb = sampler.await.unwrap_or(0);
    let hwm_kb: u64 = tree.iter().map(|p| status_kb(*p, "VmHWM:")).sum();
    let wall = wall0.elapsed().as_secs_f64();
    let server_cpu = tree_cpu(&tree) - server_cpu0;
    let threads = thread_cpu(&tree);
    let client_cpu = cpu_seconds("self") - client_cpu0;
    let machine = machine_busy_seconds() - machine0;
    let answered_all = samples.iter().filter(|s| matches!(s.outcome, Outcome::Ok | Outcome::Degraded)).count();

    let measured: Vec<&Sample> = samples.iter().filter(|s| s.index >= measure_from).collect();
    let count = |o: Outcome| measured.iter().filter(|s| s.outcome == o).count();
    let (ok, deg, err, tmo, unsent) = (
        count(Outcome::Ok),
        count(Outcome::Degraded),
        count(Outcome::Error),
        count(Outcome::Timeout),
        count(Outcome::Unsent),
    );
    let window_start = start + Duration::from_secs_f64(args.warmup);
    let last_done = measured
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::Ok | Outcome::Degraded))
        .map(|s| s.done)
        .max()
        .unwrap_or(window_start);
    let duration =
        offsets.last().map_or(args.duration, |&t| if phases.is_empty() { args.duration } else { t - args.warmup });
    let span = duration.max((last_done - window_start).as_secs_f64());
    let latencies = |o: Outcome| {
        let mut l: Vec<u64> = measured.iter().filter(|s| s.outcome == o).map(|s| s.latency_us).collect();
        l.sort_unstable();
        l
    };
    let (ok_lat, deg_lat) = (latencies(Outcome::Ok), latencies(Outcome::Degraded));
    let late = args.deadline_ms.map(|d| {
        let bound = ((d + 5.0) * 1000.0) as u64;
        measured.iter().filter(|s| s.outcome != Outcome::Error && s.latency_us > bound).count()
    });
    let recovery = (!phases.is_empty()).then(|| recovery_s(&samples, &offsets, phases, args.p99_bound_ms));
    let mut lat: Vec<u64> = measured.iter().filter(|s| s.outcome != Outcome::Error).map(|s| s.latency_us).collect();
    lat.sort_unstable();
    let mut svc: Vec<u64> = measured
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::Ok | Outcome::Degraded))
        .map(|s| s.service_us)
        .collect();
    svc.sort_unstable();
    let mut lag: Vec<u64> = measured.iter().map(|s| s.lag_us).collect();
    lag.sort_unstable();
    let goodput = ok as f64 / span;
    let achieved = (ok + deg) as f64 / span;
    let p99 = percentile(&lat, 0.99);
    let saturated = goodput < 0.9 * rate || p99 > 1000.0;
    let sustained = err == 0 && goodput >= 0.99 * rate && p99 < args.p99_bound_ms;
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let json = serde_json::json!({
        "label": args.label,
        "data": args.data.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
        "messages": bodies.len(),
        "arrivals": args.arrivals,
        "offered_rps": rate,
        "phases": args.phases,
        "duration_s": r3(duration),
        "measured": measured.len(),
        "ok": ok, "degraded": deg, "errors": err, "timeouts": tmo, "unsent": unsent,
        "achieved_rps": r3(achieved),
        "goodput_rps": r3(goodput),
        "p50_ms": r3(percentile(&lat, 0.50)),
        "p90_ms": r3(percentile(&lat, 0.90)),
        "p95_ms": r3(percentile(&lat, 0.95)),
        "p99_ms": r3(p99),
        "p999_ms": r3(percentile(&lat, 0.999)),
        "max_ms": r3(lat.last().map(|&x| x as f64 / 1000.0).unwrap_or(f64::NAN)),
        "ok_p99_ms": r3(percentile(&ok_lat, 0.99)),
        "degraded_p50_ms": r3(percentile(&deg_lat, 0.50)),
        "degraded_p99_ms": r3(percentile(&deg_lat, 0.99)),
        "late": late,
        "recovery_s": recovery,
        "service_p50_ms": r3(percentile(&svc, 0.50)),
        "service_p99_ms": r3(percentile(&svc, 0.99)),
        "send_lag_p50_ms": r3(percentile(&lag, 0.50)),
        "send_lag_p99_ms": r3(percentile(&lag, 0.99)),
        "connections_opened": pool.opened.load(Ordering::Relaxed) - opened_before,
        "client_cpu_cores": r3(client_cpu / wall),
        "server_cpu_cores": if tree.is_empty() { serde_json::Value::Null } else { r3(server_cpu / wall).into() },
        "server_cpu_ms_per_req": if tree.is_empty() || answered_all == 0 { serde_json::Value::Null }
            else { r3(server_cpu * 1000.0 / answered_all as f64).into() },
        "server_cpu_ms_per_req_by_thread": if tree.is_empty() || answered_all == 0 { serde_json::Value::Null } else {
            threads.iter().map(|(name, s)| {
                let ms = (s - threads0.get(name).copied().unwrap_or(0.0)) * 1000.0 / answered_all as f64;
                (name.clone(), serde_json::Value::from(r3(ms)))
            }).collect::<serde_json::Map<_, _>>().into()
        },
        "server_rss_peak_mb": if tree.is_empty() { serde_json::Value::Null } else { r3(rss_peak_kb as f64 / 1024.0).into() },
        "server_hwm_mb": if tree.is_empty() { serde_json::Value::Null } else { r3(hwm_kb as f64 / 1024.0).into() },
        "server_processes": tree.len(),
        // CPU that neither the server nor this generator used: other work on the machine.
        "other_cpu_cores": if tree.is_empty() { serde_json::Value::Null } else { r3((machine - server_cpu - client_cpu).max(0.0) / wall).into() },
        "sustained": sustained,
        "saturated": saturated,
    });
    RateResult { json, saturated, sustained }
}

fn fmt_ms(v: &serde_json::Value) -> String {
    v.as_f64().map(|x| if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.2}") }).unwrap_or_else(|| "-".into())
}

fn row(j: &serde_json::Value) -> String {
    let opt = |k: &str| j[k].as_f64().map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
    format!(
        "{:<18} {:>7} {:>9.1} {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>7}",
        j["label"].as_str().unwrap_or(""),
        j["offered_rps"],
        j["achieved_rps"].as_f64().unwrap_or(0.0),
        j["goodput_rps"].as_f64().unwrap_or(0.0),
        fmt_ms(&j["p50_ms"]),
        fmt_ms(&j["p95_ms"]),
        fmt_ms(&j["p99_ms"]),
        fmt_ms(&j["max_ms"]),
        fmt_ms(&j["service_p50_ms"]),
        j["degraded"],
        j["errors"],
        j["timeouts"],
        j["unsent"],
        j["connections_opened"],
        opt("server_cpu_cores"),
        opt("client_cpu_cores"),
        j["server_rss_peak_mb"].as_f64().map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into()),
    )
}

fn header() -> String {
    format!(
        "{:<18} {:>7} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>7}",
        "label",
        "offered",
        "achieved",
        "goodput",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "max ms",
        "svc p50",
        "degr",
        "err",
        "tmo",
        "unsnt",
        "conns",
        "srvCPU",
        "cliCPU",
        "RSS MB"
    )
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let Some(url) = args.url.clone() else {
        eprintln!("openloop: no --url given, nothing to do (see benches/openloop.rs or benches/e2e.sh)");
        return Ok(());
    };
    let mut rates = args.rates.clone();
    if let Some(r) = args.rate {
        rates.insert(0, r);
    }
    let phases = parse_phases(&args.phases)?;
    if !phases.is_empty() {
        // One measurement; its "rate" is the mean offered rate.
        let (n, secs) = phases.iter().fold((0.0, 0.0), |(n, t), (r, s)| (n + r * s, t + s));
        rates = vec![(n / secs * 10.0).round() / 10.0];
    }
    anyhow::ensure!(!rates.is_empty(), "give --rate R or --rates R1,R2,...");
    anyhow::ensure!(rates.iter().all(|r| *r > 0.0), "rates must be positive");
    let bodies = Arc::new(load_bodies(&args)?);
    let pool = Arc::new(Pool { target: parse_url(&url)?, idle: Mutex::new(Vec::new()), opened: AtomicUsize::new(0) });
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build()?
    };
    runtime.block_on(async {
        println!("{}", header());
        let mut sustained_best: Option<f64> = None;
        for (k, &rate) in rates.iter().enumerate() {
            if k > 0 {
                tokio::time::sleep(Duration::from_secs_f64(args.pause)).await;
            }
            let r = run_rate(&args, &phases, Arc::clone(&pool), Arc::clone(&bodies), rate).await;
            println!("{}", row(&r.json));
            if let Some(path) = &args.json {
                use std::io::Write as _;
                let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
                writeln!(f, "{}", r.json)?;
            }
            if r.sustained {
                let g = r.json["goodput_rps"].as_f64().unwrap_or(0.0);
                sustained_best = Some(sustained_best.map_or(g, |b: f64| b.max(g)));
            }
            if args.stop_on_saturation && r.saturated && k + 1 < rates.len() {
                println!("(saturated at {rate}/s: sweep stopped)");
                break;
            }
        }
        match sustained_best {
            Some(g) => println!(
                "sustained (goodput >= 99% of offered, p99 < {} ms, no errors): {g:.1}/s at best",
                args.p99_bound_ms
            ),
            None => println!("no rate sustained (goodput >= 99% of offered, p99 < {} ms)", args.p99_bound_ms),
        }
        Ok::<_, anyhow::Error>(())
    })
}
