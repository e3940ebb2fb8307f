//! Whether a model tier may take a request now, and if not, why ([`Ineligible`]).

use super::signals::{Below, GpuLoad, GpuMemory, KvCache, LoadSnapshot, TenantLoad};
use super::Outcome;
use crate::breaker::CircuitState;
use crate::policy::{GpuLimits, Policy, UnknownSignal};
use crate::tenant::fair_share_slots;
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
    /// The expected queue wait is above the policy's share of the remaining deadline
    /// (`[cpu] max_queue_wait_share`).
    QueueWait {
        wait_us: u64,
        remaining: Duration,
        share: f64,
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
    /// The remaining deadline does not cover the expected queue wait plus the tier's service
    /// time (cpu: its EWMA; gpu: its p95), µs: queue-aware admission.
    Deadline {
        tier: &'static str,
        remaining: Duration,
        wait_us: u64,
        service_us: u64,
    },
    /// The request's tenant holds its fair share of the gpu tier already (`[tenants.classes]
    /// gpu_share` of `[gpu] max_in_flight`): it goes down the cascade, other tenants do not wait.
    TenantGpuShare {
        tenant: String,
        in_flight: usize,
        share: f64,
        slots: usize,
    },
    /// The request's tenant spent its daily budget of gpu-tier calls (until midnight UTC).
    TenantGpuBudget {
        tenant: String,
        per_day: u32,
    },
    /// The cascade already ran this tier for this request.
    AlreadyTried,
    /// The tier was just tried and failed with this outcome.
    Failed(Outcome),
}

impl Ineligible {
    /// Whether the tier is refused for lack of capacity now (utilisation, queue, in-flight,
    /// memory or KV-cache limits, or a queue wait the deadline cannot cover), as opposed to
    /// configuration, health or the request itself.
    pub fn is_capacity(&self) -> bool {
        match self {
            Ineligible::CpuUtilization { .. }
            | Ineligible::QueueDepth { .. }
            | Ineligible::QueueWait { .. }
            | Ineligible::InFlight { .. }
            | Ineligible::FreeMemory { .. }
            | Ineligible::KvCacheHeadroom { .. } => true,
            Ineligible::Deadline { wait_us, .. } => *wait_us > 0,
            _ => false,
        }
    }
}

impl Ineligible {
    /// The tenant limit's stable name (`gpu_share`, `gpu_daily_budget`) for a tenant reason;
    /// `other` for the rest.
    pub fn limit_name(&self) -> &'static str {
        match self {
            Ineligible::TenantGpuShare { .. } => "gpu_share",
            Ineligible::TenantGpuBudget { .. } => "gpu_daily_budget",
            _ => "other",
        }
    }
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
            Ineligible::QueueWait { wait_us, remaining, share } => write!(
                f,
                "cpu queue wait {:.1} ms above max_queue_wait_share {share} of the remaining {} ms",
                *wait_us as f64 / 1000.0,
                remaining.as_millis()
            ),
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
            Ineligible::Deadline { tier, remaining, wait_us, service_us } => write!(
                f,
                "remaining deadline {} ms does not cover {tier} queue wait {:.1} ms + service {:.1} ms",
                remaining.as_millis(),
                *wait_us as f64 / 1000.0,
                *service_us as f64 / 1000.0
            ),
            Ineligible::TenantGpuShare { tenant, in_flight, share, slots } => write!(
                f,
                "tenant {tenant} at its gpu fair share: {in_flight} in flight, gpu_share {share} of max_in_flight = {slots}"
            ),
            Ineligible::TenantGpuBudget { tenant, per_day } => {
                write!(f, "tenant {tenant} spent its gpu_daily_budget of {per_day} calls (renews at midnight UTC)")
            }
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

/// Whether the cpu tier may take a request now (utilisation, queue depth, and queue-aware
/// admission: the expected queue wait plus the service time must fit the remaining deadline, so
/// a request the tier cannot serve in time goes to the next stage at once instead of timing out
/// in the queue).
pub fn cpu_eligibility(policy: &Policy, s: &LoadSnapshot, remaining: Duration) -> Result<(), Ineligible> {
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
    covers(remaining, s.cpu.queue_wait_us, s.cpu.service_us, "cpu")?;
    let share = limits.max_queue_wait_share;
    match s.cpu.queue_wait_us {
        Some(wait_us) if wait_us as f64 > share * remaining.as_micros() as f64 => {
            Err(Ineligible::QueueWait { wait_us, remaining, share })
        }
        _ => Ok(()),
    }
}

/// Whether the gpu tier may take a request now (configured, circuit, admission, memory, KV
/// cache, endpoints, deadline).
pub fn gpu_eligibility(policy: &Policy, s: &LoadSnapshot, remaining: Duration) -> Result<(), Ineligible> {
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
    tenant_gpu_eligibility(&s.tenant, limits.max_in_flight)?;
    let unknown_ineligible = policy.routing.unknown_signals == UnknownSignal::Ineligible;
    let below = gpu_below(g, limits);
    match &g.memory {
        GpuMemory::FreeMb(free) if below.free_memory => {
            return Err(Ineligible::FreeMemory { free_mb: *free, min_mb: limits.min_free_memory_mb })
        }
        GpuMemory::Unknown if unknown_ineligible => return Err(Ineligible::Unknown { what: "gpu memory" }),
        _ => {}
    }
    match g.kv_cache {
        KvCache::Headroom(headroom) if below.kv_cache => {
            return Err(Ineligible::KvCacheHeadroom { headroom, min: limits.min_kv_cache_headroom })
        }
        KvCache::Unknown if unknown_ineligible => {
            return Err(Ineligible::Unknown { what: "upstream KV-cache headroom" })
        }
        _ => {}
    }
    if g.endpoints_available == Some(0) {
        return Err(Ineligible::NoHealthyEndpoint);
    }
    covers(remaining, g.queue_wait_us, g.p95_us, "gpu")
}

/// Whether the request's tenant may use the gpu tier: under its fair share of the tier's
/// concurrency (`max_in_flight`) and with daily budget left. Either limit only ever sends this
/// tenant's request down the cascade; it never holds another tenant's back.
pub fn tenant_gpu_eligibility(t: &TenantLoad, max_in_flight: usize) -> Result<(), Ineligible> {
    if let Some(share) = t.gpu_share {
        let slots = fair_share_slots(share, max_in_flight);
        if t.gpu_in_flight >= slots {
            return Err(Ineligible::TenantGpuShare {
                tenant: t.tenant.clone(),
                in_flight: t.gpu_in_flight,
                share,
                slots,
            });
        }
    }
    match t.gpu_budget_spent {
        Some(per_day) => Err(Ineligible::TenantGpuBudget { tenant: t.tenant.clone(), per_day }),
        None => Ok(()),
    }
}

/// A "stay at or above `min`" limit with hysteresis (a Schmitt trigger): below it once `value`
/// drops under `min`, and until `value` reaches `min + band` again. `was_below` is the state at
/// the previous reading.
pub fn below_limit(was_below: bool, value: f64, min: f64, band: f64) -> bool {
    if was_below {
        value < min + band
    } else {
        value < min
    }
}

/// Which of the gpu tier's limits it is below now, given `g.was_below`. A reading that is not
/// there (unknown, not exposed, no GPU) keeps the previous state for when it returns; the
/// gateway keeps the result for the next snapshot.
pub fn gpu_below(g: &GpuLoad, limits: &GpuLimits) -> Below {
    let was = g.was_below;
    Below {
        free_memory: match g.memory {
            GpuMemory::FreeMb(free) => below_limit(
                was.free_memory,
                free as f64,
                limits.min_free_memory_mb as f64,
                limits.free_memory_hysteresis_mb as f64,
            ),
            GpuMemory::Unknown | GpuMemory::NotPresent(_) => was.free_memory,
        },
        kv_cache: match g.kv_cache {
            KvCache::Headroom(h) => {
                below_limit(was.kv_cache, h, limits.min_kv_cache_headroom, limits.kv_cache_hysteresis)
            }
            KvCache::Unknown | KvCache::NotExposed => was.kv_cache,
        },
    }
}

/// Whether `remaining` covers the expected queue wait plus the service time (an unknown part
/// counts as 0: the request probes the tier, so an estimate forms again).
fn covers(
    remaining: Duration,
    wait_us: Option<u64>,
    service_us: Option<u64>,
    tier: &'static str,
) -> Result<(), Ineligible> {
    let (wait_us, service_us) = (wait_us.unwrap_or(0), service_us.unwrap_or(0));
    // No time left at all: skipped, even with nothing known (a call would fail at once and count
    // against the tier for what was the caller's or an earlier stage's time).
    if remaining.is_zero() || Duration::from_micros(wait_us.saturating_add(service_us)) > remaining {
        return Err(Ineligible::Deadline { tier, remaining, wait_us, service_us });
    }
    Ok(())
}
