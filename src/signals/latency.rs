//! Per-tier latency: an EWMA and a p95 over the most recent samples.
//!
//! The request path only records (a short mutex hold); the p95 is recomputed off the hot path
//! by the signals sampler ([`LatencyTracker::refresh`]) and read as an atomic.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Samples kept for the p95.
const WINDOW: usize = 256;
/// EWMA weight of a new sample (a time constant of ~10 samples).
const ALPHA: f64 = 0.1;
/// "No value" in the atomics.
const NONE: u64 = u64::MAX;

#[derive(Debug)]
pub struct LatencyTracker {
    window: Mutex<VecDeque<u64>>,
    ewma_us: AtomicU64,
    p95_us: AtomicU64,
}

impl Default for LatencyTracker {
    fn default() -> Self {
        LatencyTracker {
            window: Mutex::new(VecDeque::with_capacity(WINDOW)),
            ewma_us: AtomicU64::new(NONE),
            p95_us: AtomicU64::new(NONE),
        }
    }
}

impl LatencyTracker {
    /// Records one successful call's latency, µs.
    pub fn record(&self, us: u64) {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.len() == WINDOW {
            w.pop_front();
        }
        w.push_back(us);
        let old = self.ewma_us.load(Ordering::Relaxed);
        let new = if old == NONE { us as f64 } else { old as f64 + ALPHA * (us as f64 - old as f64) };
        self.ewma_us.store(new as u64, Ordering::Relaxed);
    }

    /// Recomputes the p95 from the window (nearest-rank). Called by the sampler.
    pub fn refresh(&self) {
        let mut samples: Vec<u64> = self.window.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect();
        if samples.is_empty() {
            return;
        }
        samples.sort_unstable();
        let rank = ((samples.len() as f64) * 0.95).ceil() as usize;
        self.p95_us.store(samples[rank.clamp(1, samples.len()) - 1], Ordering::Relaxed);
    }

    pub fn p95_us(&self) -> Option<u64> {
        Some(self.p95_us.load(Ordering::Relaxed)).filter(|&v| v != NONE)
    }

    pub fn ewma_us(&self) -> Option<u64> {
        Some(self.ewma_us.load(Ordering::Relaxed)).filter(|&v| v != NONE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_is_nearest_rank_over_the_window() {
        let t = LatencyTracker::default();
        assert_eq!(t.p95_us(), None);
        for us in 1..=100 {
            t.record(us);
        }
        assert_eq!(t.p95_us(), None, "p95 only changes on refresh");
        t.refresh();
        assert_eq!(t.p95_us(), Some(95));
        for _ in 0..WINDOW {
            t.record(7);
        }
        t.refresh();
        assert_eq!(t.p95_us(), Some(7), "old samples leave the window");
        assert_eq!(t.ewma_us().map(|e| e <= 8), Some(true));
    }
}
