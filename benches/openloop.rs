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

use clap::Parser;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// The generator's parts, one concern a file (files in benches/openloop/ are not bench targets
// of their own: Cargo only discovers benches/*.rs and benches/*/main.rs).
#[path = "openloop/client.rs"]
mod client;
#[path = "openloop/procstat.rs"]
mod procstat;
#[path = "openloop/report.rs"]
mod report;
#[path = "openloop/run.rs"]
mod run;
#[path = "openloop/schedule.rs"]
mod schedule;

use client::{load_bodies, parse_url, Pool};
use report::{header, row};
use run::run_rate;
use schedule::parse_phases;

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
