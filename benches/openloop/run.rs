//! One offered rate, run: the send schedule fixed before the first request, workers that send
//! each request at its intended time on a connection of the pool, and the server sampled meanwhile.

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::client::Pool;
use crate::procstat::ServerProbe;
use crate::report::{summarize, tally, RateResult};
use crate::schedule::{phased_schedule, schedule};
use crate::Args;

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
pub(crate) enum Outcome {
    Ok,
    Degraded,
    Error,
    Timeout,
    Unsent,
}

#[derive(Clone, Copy)]
pub(crate) struct Sample {
    pub(crate) index: usize,
    pub(crate) outcome: Outcome,
    /// From the intended send time to the end of the response (or to giving up).
    pub(crate) latency_us: u64,
    /// From the actual send to the end of the response.
    pub(crate) service_us: u64,
    /// Actual send minus intended send.
    pub(crate) lag_us: u64,
    pub(crate) done: Instant,
}

/// One run's send schedule, fixed before its first request.
pub(crate) struct Plan {
    /// Intended send times, in seconds from `start`.
    pub(crate) offsets: Vec<f64>,
    /// The first request measured: those before it are the warm-up.
    pub(crate) measure_from: usize,
    pub(crate) timeout: Duration,
    pub(crate) start: Instant,
    /// A request still waiting for a connection past this instant is given up as unsent.
    pub(crate) drain_deadline: Instant,
}

impl Plan {
    fn new(args: &Args, phases: &[(f64, f64)], rate: f64) -> Plan {
        let offsets = if phases.is_empty() {
            schedule(rate, args.warmup + args.duration, &args.arrivals, args.seed)
        } else {
            phased_schedule(phases, &args.arrivals, args.seed)
        };
        let measure_from = offsets.partition_point(|&t| t < args.warmup);
        let timeout = Duration::from_millis(args.timeout_ms);
        let start = Instant::now() + Duration::from_millis(50);
        let total_s = if phases.is_empty() { args.warmup + args.duration } else { phases.iter().map(|p| p.1).sum() };
        let schedule_end = start + Duration::from_secs_f64(total_s);
        let drain_deadline = schedule_end + timeout;
        Plan { offsets, measure_from, timeout, start, drain_deadline }
    }
}

/// The `--degraded` markers, tiergate's by default, none with `--no-degraded`.
fn degraded_markers(args: &Args) -> Vec<String> {
    if args.no_degraded {
        Vec::new()
    } else if args.degraded.is_empty() {
        TIERGATE_DEGRADED.iter().map(|s| s.to_string()).collect()
    } else {
        args.degraded.clone()
    }
}

/// One measurement at one offered rate (or of the phases): the schedule, sent, then summed up.
pub(crate) async fn run_rate(
    args: &Args,
    phases: &[(f64, f64)],
    pool: Arc<Pool>,
    bodies: Arc<Vec<Bytes>>,
    rate: f64,
) -> RateResult {
    let degraded = Arc::new(degraded_markers(args));
    let plan = Arc::new(Plan::new(args, phases, rate));
    let opened_before = pool.opened.load(Ordering::Relaxed);
    let probe = ServerProbe::start(args.pid);
    let samples = send_all(args.connections, &plan, &pool, &bodies, &degraded).await;
    let usage = probe.finish().await;
    let tally = tally(args, phases, &plan, &samples);
    // Every worker is done: no connection opens any more.
    let connections_opened = pool.opened.load(Ordering::Relaxed) - opened_before;
    summarize(args, rate, &tally, bodies.len(), connections_opened, &usage)
}

/// Sends every request of the plan from up to `connections` workers (one request in flight
/// each); returns the samples of all, in no particular order.
async fn send_all(
    connections: usize,
    plan: &Arc<Plan>,
    pool: &Arc<Pool>,
    bodies: &Arc<Vec<Bytes>>,
    degraded: &Arc<Vec<String>>,
) -> Vec<Sample> {
    let n = plan.offsets.len();
    let next = Arc::new(AtomicUsize::new(0));
    let workers = connections.min(n.max(1));
    let mut handles = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (pool, bodies, plan, next, degraded) =
            (Arc::clone(pool), Arc::clone(bodies), Arc::clone(plan), Arc::clone(&next), Arc::clone(degraded));
        handles.push(tokio::spawn(worker(pool, bodies, plan, next, degraded)));
    }
    let mut samples = Vec::with_capacity(n);
    for h in handles {
        samples.extend(h.await.expect("worker"));
    }
    samples
}

/// Takes the next request not yet claimed, waits for its intended send time and sends it, until
/// none is left. The latency counts from the intended time, so the wait for this worker to be
/// free again (the server falling behind) is in it.
async fn worker(
    pool: Arc<Pool>,
    bodies: Arc<Vec<Bytes>>,
    plan: Arc<Plan>,
    next: Arc<AtomicUsize>,
    degraded: Arc<Vec<String>>,
) -> Vec<Sample> {
    let n = plan.offsets.len();
    let mut out = Vec::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= n {
            break;
        }
        let intended = plan.start + Duration::from_secs_f64(plan.offsets[i]);
        tokio::time::sleep_until(intended).await;
        let sent = Instant::now();
        if sent > plan.drain_deadline {
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
        let result = tokio::time::timeout(plan.timeout, pool.send(body)).await;
        let done = Instant::now();
        out.push(Sample {
            index: i,
            outcome: outcome(result, &degraded),
            latency_us: (done - intended).as_micros() as u64,
            service_us: (done - sent).as_micros() as u64,
            lag_us: (sent - intended).as_micros() as u64,
            done,
        });
    }
    out
}

/// What an answer (or its absence) counts as: a 2xx body with a degraded marker is `Degraded`.
fn outcome(
    result: Result<anyhow::Result<(hyper::StatusCode, Bytes)>, tokio::time::error::Elapsed>,
    degraded: &[String],
) -> Outcome {
    match result {
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
    }
}
