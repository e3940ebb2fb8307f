//! Per-tier latency: an EWMA and a p95 over the most recent samples, none older than [`MAX_AGE`].
//!
//! The request path only records (a short mutex hold); the p95 is recomputed off the hot path
//! by the signals sampler ([`LatencyTracker::refresh`]) and read as an atomic.
//!
//! Samples age out because routing skips a tier whose p95 does not fit a request's deadline, and
//! a skipped tier records nothing: with a window of counts alone, one overload would leave a high
//! p95 behind for good and the tier would never be tried again. Once the window is empty the
//! p95 and EWMA are unknown, and the next request probes the tier.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tokio::time::Instant;

/// Samples kept for the p95.
const WINDOW: usize = 256;
/// Samples older than this leave the window at the next refresh.
pub const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(5);
/// EWMA weight of a new sample (a time constant of ~10 samples).
const ALPHA: f64 = 0.1;
/// "No value" in the atomics.
const NONE: u64 = u64::MAX;

#[derive(Debug)]
pub struct LatencyTracker {
    window: Mutex<VecDeque<(Instant, u64)>>,
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
        w.push_back((Instant::now(), us));
        let old = self.ewma_us.load(Ordering::Relaxed);
        let new = if old == NONE { us as f64 } else { old as f64 + ALPHA * (us as f64 - old as f64) };
        self.ewma_us.store(new as u64, Ordering::Relaxed);
    }

    /// Drops samples older than [`MAX_AGE`] and recomputes the p95 (nearest-rank); with no
    /// sample left, p95 and EWMA become unknown. Called by the sampler.
    pub fn refresh(&self) {
        let mut samples: Vec<u64> = {
            let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            while w.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > MAX_AGE) {
                w.pop_front();
            }
            w.iter().map(|(_, us)| *us).collect()
        };
        if samples.is_empty() {
            self.p95_us.store(NONE, Ordering::Relaxed);
            self.ewma_us.store(NONE, Ordering::Relaxed);
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

    #[tokio::test(start_paused = true)]
    async fn old_samples_age_out_so_a_skipped_tier_is_tried_again() {
        let t = LatencyTracker::default();
        t.record(300_000); // one overload: 300 ms
        t.refresh();
        assert_eq!(t.p95_us(), Some(300_000));
        tokio::time::advance(MAX_AGE + std::time::Duration::from_millis(1)).await;
        t.refresh();
        assert_eq!((t.p95_us(), t.ewma_us()), (None, None), "no recent sample: unknown, not stuck high");
    }

    #[tokio::test]
    async fn p95_is_nearest_rank_over_the_window() {
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
