//! Whether a model tier may take a request now, and if not, why ([`Ineligible`]).

use super::signals::{GpuMemory, SignalsSnapshot};
use super::Outcome;
use crate::policy::{Policy, UnknownSignal};
use crate::tier::breaker::CircuitState;
use std::fmt;
use std::time::Duration;

/// Why a model tier may not take a request. Its `Display` is the reason a decision's path shows.
#[derive(Debug, Clone, PartialEq)]
pub enum Ineligible {
    /// The tier is not configured or cannot run on this machine (the reason).
    NotConfigured(String),
    CircuitOpen,
    CpuUtilization {
        value: f64,
        max: f64,
    },
    QueueDepth {
        depth: usize,
        max: usize,
    },
    InFlight {
        in_flight: usize,
        max: usize,
    },
    FreeMemory {
        free_mb: u64,
        min_mb: u64,
    },
    KvCacheHeadroom {
        headroom: f64,
        min: f64,
    },
    NoHealthyEndpoint,
    /// A signal is unknown and the policy counts unknown as ineligible (`what`: the signal).
    Unknown {
        what: &'static str,
    },
    /// The remaining deadline does not cover the tier's p95 service time.
    Deadline {
        tier: &'static str,
        remaining: Duration,
        p95_us: u64,
    },
    /// The cascade already ran this tier for this request.
    AlreadyTried,
    /// The tier was just tried and failed with this outcome.
    Failed(Outcome),
}

impl fmt::Display for Ineligible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ineligible::NotConfigured(why) => write!(f, "{why}"),
            Ineligible::CircuitOpen => write!(f, "gpu circuit open"),
            Ineligible::CpuUtilization { value, max } => {
                write!(f, "cpu utilization {value:.2} above max_utilization {max}")
            }
            Ineligible::QueueDepth { depth, max } => write!(f, "cpu queue depth {depth} above max_queue_depth {max}"),
            Ineligible::InFlight { in_flight, max } => {
                write!(f, "gpu admission: {in_flight} in flight, max_in_flight {max}")
            }
            Ineligible::FreeMemory { free_mb, min_mb } => {
                write!(f, "gpu free memory {free_mb} MiB below min_free_memory_mb {min_mb}")
            }
            Ineligible::KvCacheHeadroom { headroom, min } => {
                write!(f, "upstream KV-cache headroom {headroom:.2} below min_kv_cache_headroom {min}")
            }
            Ineligible::NoHealthyEndpoint => write!(f, "no healthy upstream endpoint"),
            Ineligible::Unknown { what } => write!(f, "{what} unknown (unknown_signals = \"ineligible\")"),
            Ineligible::Deadline { tier, remaining, p95_us } => write!(
                f,
                "remaining deadline {} ms does not cover {tier} p95 {:.1} ms",
                remaining.as_millis(),
                *p95_us as f64 / 1000.0
            ),
            Ineligible::AlreadyTried => write!(f, "already tried"),
            Ineligible::Failed(outcome) => write!(f, "gpu tier {}", outcome.as_str()),
        }
    }
}

impl serde::Serialize for Ineligible {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Whether the cpu tier may take a request now (utilisation, queue depth, deadline).
pub fn cpu_eligibility(policy: &Policy, s: &SignalsSnapshot, remaining: Duration) -> Result<(), Ineligible> {
    let limits = &policy.cpu;
    match s.cpu.utilization {
        Some(value) if value > limits.max_utilization => {
            return Err(Ineligible::CpuUtilization { value, max: limits.max_utilization })
        }
        None if policy.routing.unknown_signals == UnknownSignal::Ineligible => {
            return Err(Ineligible::Unknown { what: "cpu utilization" })
        }
        _ => {}
    }
    if s.cpu.queue_depth > limits.max_queue_depth {
        return Err(Ineligible::QueueDepth { depth: s.cpu.queue_depth, max: limits.max_queue_depth });
    }
    covers(remaining, s.cpu.p95_us, "cpu")
}

/// Whether the gpu tier may take a request now (configured, circuit, admission, memory, KV
/// cache, endpoints, deadline).
pub fn gpu_eligibility(policy: &Policy, s: &SignalsSnapshot, remaining: Duration) -> Result<(), Ineligible> {
    let g = &s.gpu;
    let limits = &policy.gpu;
    if let Some(why) = &g.unavailable {
        return Err(Ineligible::NotConfigured(why.clone()));
    }
    if g.circuit == CircuitState::Open {
        return Err(Ineligible::CircuitOpen);
    }
    if g.in_flight >= limits.max_in_flight {
        return Err(Ineligible::InFlight { in_flight: g.in_flight, max: limits.max_in_flight });
    }
    match &g.memory {
        GpuMemory::FreeMb(free) if *free < limits.min_free_memory_mb => {
            return Err(Ineligible::FreeMemory { free_mb: *free, min_mb: limits.min_free_memory_mb })
        }
        GpuMemory::Unknown if policy.routing.unknown_signals == UnknownSignal::Ineligible => {
            return Err(Ineligible::Unknown { what: "gpu memory" })
        }
        _ => {}
    }
    if let Some(headroom) = g.kv_cache_headroom.filter(|&h| h < limits.min_kv_cache_headroom) {
        return Err(Ineligible::KvCacheHeadroom { headroom, min: limits.min_kv_cache_headroom });
    }
    if g.endpoints_available == Some(0) {
        return Err(Ineligible::NoHealthyEndpoint);
    }
    covers(remaining, g.p95_us, "gpu")
}

fn covers(remaining: Duration, p95_us: Option<u64>, tier: &'static str) -> Result<(), Ineligible> {
    match p95_us {
        Some(p95_us) if Duration::from_micros(p95_us) > remaining => {
            Err(Ineligible::Deadline { tier, remaining, p95_us })
        }
        _ => Ok(()),
    }
}
