//! A circuit breaker (Nygard, "Release It!"; the closed / open / half-open scheme Envoy and
//! resilience4j use): `failure_threshold` consecutive failures open it; while open, calls are
//! refused at once (the cascade moves on); after `open_ms` one probe call is let through
//! (half-open) and its result closes or re-opens the circuit.

use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    pub failure_threshold: u32,
    pub open_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig { failure_threshold: 5, open_ms: 5000 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: Mutex<State>,
}

impl CircuitBreaker {
    pub fn new(config: BreakerConfig) -> Self {
        CircuitBreaker { config, state: Mutex::new(State::Closed { failures: 0 }) }
    }

    /// The state as of `now` (an open circuit whose time is up reads as half-open).
    pub fn state(&self, now: Instant) -> CircuitState {
        match *self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { until } if now < until => CircuitState::Open,
            State::Open { .. } | State::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Whether a call may go ahead now. In half-open, only one probe at a time.
    pub fn try_acquire(&self, now: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match *s {
            State::Closed { .. } => true,
            State::Open { until } if now < until => false,
            State::Open { .. } | State::HalfOpen { probing: false } => {
                *s = State::HalfOpen { probing: true };
                true
            }
            State::HalfOpen { probing: true } => false,
        }
    }

    /// Ends a call that `try_acquire` let through without judging the backend (the caller left,
    /// or the caller's own deadline ran out first): counts nothing, and frees the half-open probe
    /// so the next call probes instead.
    pub fn release(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let State::HalfOpen { probing: true } = *s {
            *s = State::HalfOpen { probing: false };
        }
    }

    /// Records the outcome of a call that `try_acquire` let through.
    pub fn record(&self, success: bool, now: Instant) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let open = State::Open { until: now + Duration::from_millis(self.config.open_ms) };
        *s = match (&*s, success) {
            (_, true) => State::Closed { failures: 0 },
            (State::Closed { failures }, false) if failures + 1 < self.config.failure_threshold => {
                State::Closed { failures: failures + 1 }
            }
            _ => open,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_call_counts_nothing_and_frees_the_probe() {
        let b = CircuitBreaker::new(BreakerConfig { failure_threshold: 2, open_ms: 100 });
        let t0 = Instant::now();
        for _ in 0..5 {
            assert!(b.try_acquire(t0));
            b.release();
        }
        assert_eq!(b.state(t0), CircuitState::Closed, "released calls never open the circuit");
        b.record(false, t0);
        b.record(false, t0);
        let t1 = t0 + Duration::from_millis(150);
        assert!(b.try_acquire(t1), "the probe");
        assert!(!b.try_acquire(t1));
        b.release();
        assert_eq!(b.state(t1), CircuitState::HalfOpen);
        assert!(b.try_acquire(t1), "a released probe lets the next call probe");
    }

    #[test]
    fn opens_after_threshold_probes_when_time_is_up_and_closes_on_success() {
        let b = CircuitBreaker::new(BreakerConfig { failure_threshold: 3, open_ms: 100 });
        let t0 = Instant::now();
        for _ in 0..2 {
            assert!(b.try_acquire(t0));
            b.record(false, t0);
        }
        assert_eq!(b.state(t0), CircuitState::Closed);
        assert!(b.try_acquire(t0));
        b.record(false, t0);
        assert_eq!(b.state(t0), CircuitState::Open);
        assert!(!b.try_acquire(t0 + Duration::from_millis(50)));
        let t1 = t0 + Duration::from_millis(101);
        assert_eq!(b.state(t1), CircuitState::HalfOpen);
        assert!(b.try_acquire(t1), "one probe");
        assert!(!b.try_acquire(t1), "only one probe at a time");
        b.record(false, t1);
        assert_eq!(b.state(t1), CircuitState::Open, "a failed probe re-opens");
        let t2 = t1 + Duration::from_millis(101);
        assert!(b.try_acquire(t2));
        b.record(true, t2);
        assert_eq!(b.state(t2), CircuitState::Closed);
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let b = CircuitBreaker::new(BreakerConfig { failure_threshold: 2, open_ms: 100 });
        let t = Instant::now();
        b.record(false, t);
        b.record(true, t);
        b.record(false, t);
        assert_eq!(b.state(t), CircuitState::Closed);
    }
}
