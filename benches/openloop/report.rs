//! What one run measured: the counts and latency percentiles of its measured window, the JSON
//! line they make with the server's usage, and the table row printed from it.

use std::time::Duration;

use crate::procstat::Usage;
use crate::run::{Outcome, Plan, Sample};
use crate::schedule::recovery_s;
use crate::Args;

/// The `q` quantile of sorted microseconds, in milliseconds (NaN for none).
pub(crate) fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64 / 1000.0
}

pub(crate) struct RateResult {
    pub(crate) json: serde_json::Value,
    pub(crate) saturated: bool,
    pub(crate) sustained: bool,
}

/// The samples of one run, counted: the measured window's outcomes and sorted latencies (µs).
pub(crate) struct Tally {
    measured: usize,
    ok: usize,
    deg: usize,
    err: usize,
    tmo: usize,
    unsent: usize,
    /// Answered (ok or degraded) requests, warm-up included: the divisor of CPU per request.
    answered_all: usize,
    /// The measured seconds of the schedule.
    duration: f64,
    /// The measured seconds, or longer when the last answer came after the schedule's end.
    span: f64,
    /// All but errors (timed-out and unsent at the latency they had reached).
    lat: Vec<u64>,
    ok_lat: Vec<u64>,
    deg_lat: Vec<u64>,
    svc: Vec<u64>,
    lag: Vec<u64>,
    late: Option<usize>,
    recovery: Option<f64>,
}

pub(crate) fn tally(args: &Args, phases: &[(f64, f64)], plan: &Plan, samples: &[Sample]) -> Tally {
    let (offsets, start) = (&plan.offsets, plan.start);
    let answered_all = samples.iter().filter(|s| matches!(s.outcome, Outcome::Ok | Outcome::Degraded)).count();
    let measured: Vec<&Sample> = samples.iter().filter(|s| s.index >= plan.measure_from).collect();
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
    let recovery = (!phases.is_empty()).then(|| recovery_s(samples, offsets, phases, args.p99_bound_ms));
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
    let measured = measured.len();
    Tally {
        measured,
        ok,
        deg,
        err,
        tmo,
        unsent,
        answered_all,
        duration,
        span,
        lat,
        ok_lat,
        deg_lat,
        svc,
        lag,
        late,
        recovery,
    }
}

/// The JSON line of one run, and whether the rate was saturated or sustained.
pub(crate) fn summarize(
    args: &Args,
    rate: f64,
    t: &Tally,
    messages: usize,
    connections_opened: usize,
    usage: &Usage,
) -> RateResult {
    let (ok, deg, err, lat, answered_all) = (t.ok, t.deg, t.err, &t.lat, t.answered_all);
    let (tree, threads, threads0) = (&usage.tree, &usage.threads, &usage.threads0);
    let (server_cpu, client_cpu, wall) = (usage.server_cpu, usage.client_cpu, usage.wall);
    let goodput = ok as f64 / t.span;
    let achieved = (ok + deg) as f64 / t.span;
    let p99 = percentile(lat, 0.99);
    let saturated = goodput < 0.9 * rate || p99 > 1000.0;
    let sustained = err == 0 && goodput >= 0.99 * rate && p99 < args.p99_bound_ms;
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let json = serde_json::json!({
        "label": args.label,
        "data": args.data.iter().map(|d| d.display().to_string()).collect::<Vec<_>>(),
        "messages": messages,
        "arrivals": args.arrivals,
        "offered_rps": rate,
        "phases": args.phases,
        "duration_s": r3(t.duration),
        "measured": t.measured,
        "ok": ok, "degraded": deg, "errors": err, "timeouts": t.tmo, "unsent": t.unsent,
        "achieved_rps": r3(achieved),
        "goodput_rps": r3(goodput),
        "p50_ms": r3(percentile(lat, 0.50)),
        "p90_ms": r3(percentile(lat, 0.90)),
        "p95_ms": r3(percentile(lat, 0.95)),
        "p99_ms": r3(p99),
        "p999_ms": r3(percentile(lat, 0.999)),
        "max_ms": r3(lat.last().map(|&x| x as f64 / 1000.0).unwrap_or(f64::NAN)),
        "ok_p99_ms": r3(percentile(&t.ok_lat, 0.99)),
        "degraded_p50_ms": r3(percentile(&t.deg_lat, 0.50)),
        "degraded_p99_ms": r3(percentile(&t.deg_lat, 0.99)),
        "late": t.late,
        "recovery_s": t.recovery,
        "service_p50_ms": r3(percentile(&t.svc, 0.50)),
        "service_p99_ms": r3(percentile(&t.svc, 0.99)),
        "send_lag_p50_ms": r3(percentile(&t.lag, 0.50)),
        "send_lag_p99_ms": r3(percentile(&t.lag, 0.99)),
        "connections_opened": connections_opened,
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
        "server_rss_peak_mb": if tree.is_empty() { serde_json::Value::Null } else { r3(usage.rss_peak_kb as f64 / 1024.0).into() },
        "server_hwm_mb": if tree.is_empty() { serde_json::Value::Null } else { r3(usage.hwm_kb as f64 / 1024.0).into() },
        "server_processes": tree.len(),
        // CPU that neither the server nor this generator used: other work on the machine.
        "other_cpu_cores": if tree.is_empty() { serde_json::Value::Null } else { r3((usage.machine - server_cpu - client_cpu).max(0.0) / wall).into() },
        "sustained": sustained,
        "saturated": saturated,
    });
    RateResult { json, saturated, sustained }
}

fn fmt_ms(v: &serde_json::Value) -> String {
    v.as_f64().map(|x| if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.2}") }).unwrap_or_else(|| "-".into())
}

pub(crate) fn row(j: &serde_json::Value) -> String {
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

pub(crate) fn header() -> String {
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
