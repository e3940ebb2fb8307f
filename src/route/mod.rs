//! Tier selection: pure functions of (complexity, policy, signals snapshot, remaining deadline)
//! -> what happens next, with the reason in words. No threads, clocks or I/O here: the caller
//! takes one [`SignalsSnapshot`] per request, so every branch is unit-tested with a
//! hand-built snapshot.

use crate::complexity::Complexity;
use crate::policy::{Policy, UnknownSignal, WhenSaturated};
use crate::tier::breaker::CircuitState;
use crate::tier::ModelVerdict;
use serde::Serialize;
use std::time::Duration;

/// What routing knows about load, as plain data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignalsSnapshot {
    pub cpu: CpuSignals,
    pub gpu: GpuSignals,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuSignals {
    /// Machine CPU utilisation EWMA, [0, 1]; `None` when unknown or stale.
    pub utilization: Option<f64>,
    pub queue_depth: usize,
    pub in_flight: usize,
    /// p95 of the tier's service time (inference, without the queue wait), µs, over the last
    /// [`crate::signals::latency::MAX_AGE`].
    pub p95_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuSignals {
    /// Why the gpu tier cannot run at all (not configured); `None` when it exists.
    pub unavailable: Option<String>,
    pub memory: GpuMemory,
    /// Kernel-busy share (NVML), [0, 1], where known.
    pub utilization: Option<f64>,
    pub in_flight: usize,
    pub p95_us: Option<u64>,
    /// EWMA of successful calls' latency, µs.
    pub ewma_us: Option<u64>,
    pub circuit: CircuitState,
    /// Upstream backend: KV-cache headroom scraped from the servers, where they expose it.
    pub kv_cache_headroom: Option<f64>,
    /// Upstream backend: endpoints healthy and not ejected.
    pub endpoints_available: Option<usize>,
}

/// GPU memory as routing sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuMemory {
    /// No GPU on this machine (the reason): the memory limit does not apply.
    NotPresent(String),
    /// The reading is missing or stale.
    Unknown,
    /// Least free memory over the devices, MiB.
    FreeMb(u64),
}

/// The stage that runs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Cpu,
    Gpu,
    Rules,
    /// Refuse with 503 + Retry-After (policy `when_saturated = "shed"`).
    Shed,
}

/// Where a request starts, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Start {
    pub stage: Stage,
    pub reason: String,
    /// The complexity this choice used (before the cpu tier's OOD score was known).
    pub complexity: f64,
    /// `Err(reason)` when the cpu tier may not take the request.
    #[serde(serialize_with = "eligibility")]
    pub cpu: Result<(), String>,
    #[serde(serialize_with = "eligibility")]
    pub gpu: Result<(), String>,
}

/// `{"eligible": true}` or `{"eligible": false, "reason": ...}`.
fn eligibility<S: serde::Serializer>(e: &Result<(), String>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(None)?;
    m.serialize_entry("eligible", &e.is_ok())?;
    if let Err(reason) = e {
        m.serialize_entry("reason", reason)?;
    }
    m.end()
}

/// What to do with a model verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// The verdict stands; `note` says why a wanted escalation did not happen.
    Accept { note: Option<String> },
    /// Try the gpu tier (`outcome` names why the verdict was not trusted).
    Escalate { outcome: &'static str, reason: String },
    /// Rules decide.
    Rules { outcome: &'static str, reason: String },
}

/// Whether the cpu tier may take a request now.
pub fn cpu_eligibility(policy: &Policy, s: &SignalsSnapshot, remaining: Duration) -> Result<(), String> {
    let limits = &policy.cpu;
    match s.cpu.utilization {
        Some(u) if u > limits.max_utilization => {
            return Err(format!("cpu utilization {u:.2} above max_utilization {}", limits.max_utilization))
        }
        None if policy.routing.unknown_signals == UnknownSignal::Ineligible => {
            return Err("cpu utilization unknown (unknown_signals = \"ineligible\")".into())
        }
        _ => {}
    }
    if s.cpu.queue_depth > limits.max_queue_depth {
        return Err(format!("cpu queue depth {} above max_queue_depth {}", s.cpu.queue_depth, limits.max_queue_depth));
    }
    covers(remaining, s.cpu.p95_us, "cpu")
}

/// Whether the gpu tier may take a request now (admission, memory, KV cache, circuit, deadline).
pub fn gpu_eligibility(policy: &Policy, s: &SignalsSnapshot, remaining: Duration) -> Result<(), String> {
    let g = &s.gpu;
    let limits = &policy.gpu;
    if let Some(why) = &g.unavailable {
        return Err(why.clone());
    }
    if g.circuit == CircuitState::Open {
        return Err("gpu circuit open".into());
    }
    if g.in_flight >= limits.max_in_flight {
        return Err(format!("gpu admission: {} in flight, max_in_flight {}", g.in_flight, limits.max_in_flight));
    }
    match &g.memory {
        GpuMemory::FreeMb(free) if *free < limits.min_free_memory_mb => {
            return Err(format!("gpu free memory {free} MiB below min_free_memory_mb {}", limits.min_free_memory_mb))
        }
        GpuMemory::Unknown if policy.routing.unknown_signals == UnknownSignal::Ineligible => {
            return Err("gpu memory unknown (unknown_signals = \"ineligible\")".into())
        }
        _ => {}
    }
    if let Some(h) = g.kv_cache_headroom.filter(|&h| h < limits.min_kv_cache_headroom) {
        return Err(format!(
            "upstream KV-cache headroom {h:.2} below min_kv_cache_headroom {}",
            limits.min_kv_cache_headroom
        ));
    }
    if g.endpoints_available == Some(0) {
        return Err("no healthy upstream endpoint".into());
    }
    covers(remaining, g.p95_us, "gpu")
}

fn covers(remaining: Duration, p95_us: Option<u64>, tier: &str) -> Result<(), String> {
    match p95_us {
        Some(p95) if Duration::from_micros(p95) > remaining => Err(format!(
            "remaining deadline {} ms does not cover {tier} p95 {:.1} ms",
            remaining.as_millis(),
            p95 as f64 / 1000.0
        )),
        _ => Ok(()),
    }
}

/// Where a request starts: complex requests on the gpu tier when it is eligible, the rest on
/// the cpu tier; either one when the other is not eligible; neither -> `when_saturated`.
pub fn start(complexity: &Complexity, policy: &Policy, s: &SignalsSnapshot, remaining: Duration) -> Start {
    let cpu = cpu_eligibility(policy, s, remaining);
    let gpu = gpu_eligibility(policy, s, remaining);
    let max = policy.routing.cpu_max_complexity;
    let complex = complexity.score > max;
    let (stage, reason) = match (&cpu, &gpu) {
        (_, Ok(())) if complex => {
            (Stage::Gpu, format!("complexity {:.2} above cpu_max_complexity {max}", complexity.score))
        }
        (Ok(()), Err(why)) if complex => (
            Stage::Cpu,
            format!("complexity {:.2} above cpu_max_complexity {max}, but gpu ineligible: {why}", complexity.score),
        ),
        (Ok(()), _) => (Stage::Cpu, format!("complexity {:.2} within cpu_max_complexity {max}", complexity.score)),
        (Err(why), Ok(())) => (Stage::Gpu, format!("cpu ineligible: {why}")),
        (Err(c), Err(g)) => {
            let stage = match policy.routing.when_saturated {
                WhenSaturated::Rules => Stage::Rules,
                WhenSaturated::Shed => Stage::Shed,
            };
            (stage, format!("both model tiers saturated: cpu: {c}; gpu: {g}"))
        }
    };
    Start { stage, reason, complexity: complexity.score, cpu, gpu }
}

/// After the cpu tier answered: accept, escalate to the gpu tier, or hand over to rules.
/// `gpu` is the gpu tier's eligibility now (an `Err` also when it was already tried).
pub fn after_cpu(v: &ModelVerdict, complexity: &Complexity, policy: &Policy, gpu: &Result<(), String>) -> Next {
    let c = &policy.cascade;
    let (outcome, reason) = if let Some(ood) = v.ood_score.filter(|&o| o > c.ood_above) {
        ("out_of_distribution", format!("ood_score {ood:.3} above ood_above {}", c.ood_above))
    } else if v.confidence < c.escalate_below() {
        ("low_confidence", format!("confidence {:.3} below escalate_below {}", v.confidence, c.escalate_below()))
    } else {
        return Next::Accept { note: None };
    };
    let min = policy.routing.gpu_min_complexity;
    let blocked = match gpu {
        Err(why) => Some(format!("gpu ineligible: {why}")),
        Ok(()) if complexity.score < min => {
            Some(format!("complexity {:.2} below gpu_min_complexity {min}", complexity.score))
        }
        Ok(()) => None,
    };
    match blocked {
        None => Next::Escalate { outcome, reason },
        Some(why) if outcome == "out_of_distribution" || v.confidence < c.accept_below => {
            let reason = if outcome == "low_confidence" {
                format!("confidence {:.3} below accept_below {}", v.confidence, c.accept_below)
            } else {
                reason
            };
            Next::Rules { outcome, reason: format!("{reason}; {why}") }
        }
        Some(why) => Next::Accept { note: Some(format!("{reason}, not escalated: {why}")) },
    }
}

/// After the gpu tier answered: accept, or hand over to rules.
pub fn after_gpu(v: &ModelVerdict, policy: &Policy) -> Next {
    let accept_below = policy.cascade.accept_below;
    if v.confidence < accept_below {
        Next::Rules {
            outcome: "low_confidence",
            reason: format!("confidence {:.3} below accept_below {accept_below}", v.confidence),
        }
    } else {
        Next::Accept { note: None }
    }
}

#[cfg(test)]
mod tests;
