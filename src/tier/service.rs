//! What a worker pool's recent batches cost: the inputs of queue-aware admission and of the
//! workers' "no work for nobody" check.
//!
//! Two EWMAs, updated by the workers after every batch and read lock-free on the request path:
//! the service time of a batch (what a job just taken up will cost before it answers) and the
//! service time per job (a batch's time ÷ its size: how fast the pool drains its queue, so the
//! wait of a job joining now is about `depth × per_job ÷ workers`, Little's law).
//!
//! An estimate older than [`STALE_AFTER`] is unknown. That is what keeps admission from
//! latching: one stalled batch can make the pool look too slow for every deadline, and a pool
//! that takes nothing records nothing; once the estimate is unknown the next job probes the
//! pool and a fresh sample replaces the stale one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// EWMA weight of a new batch (a time constant of ~10 batches).
const ALPHA: f64 = 0.1;
/// An estimate not refreshed by a batch for this long is unknown.
pub const STALE_AFTER: Duration = Duration::from_secs(1);
/// "No value" in the atomics.
const NONE: u64 = u64::MAX;

/// A pool's service-time estimates (see the module docs). Shared by the pool and its workers.
#[derive(Debug)]
pub struct ServiceTime {
    origin: Instant,
    batch_us: AtomicU64,
    job_us: AtomicU64,
    /// When the last batch was recorded, µs since `origin`.
    updated_us: AtomicU64,
}

impl Default for ServiceTime {
    fn default() -> Self {
        ServiceTime {
            origin: Instant::now(),
            batch_us: AtomicU64::new(NONE),
            job_us: AtomicU64::new(NONE),
            updated_us: AtomicU64::new(0),
        }
    }
}

fn ewma(cell: &AtomicU64, sample: f64) {
    // Workers race here only on the rare simultaneous batch end; a lost update costs one sample.
    let old = cell.load(Ordering::Relaxed);
    let new = if old == NONE { sample } else { old as f64 + ALPHA * (sample - old as f64) };
    cell.store(new.round() as u64, Ordering::Relaxed);
}

impl ServiceTime {
    /// Records one batch of `size` jobs that took `us` µs (tokenisation and inference).
    pub fn record(&self, us: u64, size: usize) {
        ewma(&self.batch_us, us as f64);
        ewma(&self.job_us, us as f64 / size.max(1) as f64);
        self.updated_us.store(self.origin.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    fn fresh(&self, cell: &AtomicU64, now: Instant) -> Option<u64> {
        let at = self.origin + Duration::from_micros(self.updated_us.load(Ordering::Relaxed));
        let v = cell.load(Ordering::Relaxed);
        (v != NONE && now.saturating_duration_since(at) <= STALE_AFTER).then_some(v)
    }

    /// EWMA of a batch's service time, µs; `None` when unknown or stale.
    pub fn batch_us(&self, now: Instant) -> Option<u64> {
        self.fresh(&self.batch_us, now)
    }

    /// EWMA of the service time per job (a batch's time ÷ its size), µs; `None` when unknown or stale.
    pub fn job_us(&self, now: Instant) -> Option<u64> {
        self.fresh(&self.job_us, now)
    }
}

/// Expected wait of a job joining a queue of `depth` jobs drained by `workers` workers that take
/// `job_us` µs per job: `depth × job_us ÷ workers` µs. `None` when the service time is unknown
/// (the job probes the pool); with no worker alive, `u64::MAX` (never served).
pub fn queue_wait_us(depth: usize, job_us: Option<u64>, workers: usize) -> Option<u64> {
    let job_us = job_us?;
    if workers == 0 {
        return Some(u64::MAX);
    }
    Some((depth as u64).saturating_mul(job_us) / workers as u64)
}

/// Whether a job whose caller gives up at `deadline` would be served for nobody if started at
/// `now`: its remaining time is shorter than the expected service time `expected_us` (unknown:
/// it is started, so the estimate can form).
pub fn doomed(deadline: Instant, now: Instant, expected_us: Option<u64>) -> bool {
    let remaining = deadline.saturating_duration_since(now);
    remaining.is_zero() || expected_us.is_some_and(|us| remaining < Duration::from_micros(us))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_is_depth_times_per_job_over_workers() {
        assert_eq!(queue_wait_us(10, Some(3_000), 2), Some(15_000));
        assert_eq!(queue_wait_us(0, Some(3_000), 2), Some(0));
        assert_eq!(queue_wait_us(10, None, 2), None, "unknown service time: probe");
        assert_eq!(queue_wait_us(1, Some(1), 0), Some(u64::MAX), "no worker: never served");
    }

    #[test]
    fn a_job_shorter_than_its_service_is_doomed() {
        let now = Instant::now();
        assert!(doomed(now + Duration::from_millis(2), now, Some(5_000)));
        assert!(!doomed(now + Duration::from_millis(8), now, Some(5_000)));
        assert!(!doomed(now + Duration::from_millis(2), now, None), "unknown: start it");
        assert!(doomed(now, now, None), "past its deadline: always");
    }

    #[test]
    fn estimates_follow_batches_and_go_stale() {
        let s = ServiceTime::default();
        let now = Instant::now();
        assert_eq!((s.batch_us(now), s.job_us(now)), (None, None));
        s.record(8_000, 4);
        let now = Instant::now();
        assert_eq!((s.batch_us(now), s.job_us(now)), (Some(8_000), Some(2_000)));
        s.record(18_000, 4);
        assert_eq!(s.batch_us(Instant::now()), Some(9_000), "EWMA, weight 0.1");
        let later = Instant::now() + STALE_AFTER + Duration::from_millis(1);
        assert_eq!((s.batch_us(later), s.job_us(later)), (None, None), "stale: unknown, not stuck");
    }
}
