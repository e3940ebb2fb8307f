//! When requests are meant to go out: the send schedule of one rate or of consecutive phases,
//! and how long the latency took to recover after the highest-rate phase.

use crate::report::percentile;
use crate::run::{Outcome, Sample};

/// Send offsets from the start, in seconds.
pub(crate) fn schedule(rate: f64, seconds: f64, arrivals: &str, seed: u64) -> Vec<f64> {
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
pub(crate) fn parse_phases(phases: &[String]) -> anyhow::Result<Vec<(f64, f64)>> {
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
pub(crate) fn phased_schedule(phases: &[(f64, f64)], arrivals: &str, seed: u64) -> Vec<f64> {
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
pub(crate) fn recovery_s(samples: &[Sample], offsets: &[f64], phases: &[(f64, f64)], bound_ms: f64) -> f64 {
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
