//! What routing knows about load: one snapshot per request, as plain data, so every routing
//! function is pure and is tested with hand-built values.

use crate::breaker::CircuitState;
pub use crate::tier::backend::KvCache;
use serde::Serialize;

/// What routing knows about load, as plain data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadSnapshot {
    pub cpu: CpuLoad,
    pub gpu: GpuLoad,
    /// The request's tenant's use of the gpu tier (its fair share, its daily budget).
    pub tenant: TenantLoad,
    /// A confirm model is loaded (`[confirm]`) and has a live worker.
    pub confirm: bool,
}

/// What routing knows of the request's tenant: its requests on the gpu tier now (this
/// replica), its class's share of the tier, and whether its daily gpu budget is spent. All
/// unknown tenants count as one. Default: no tenant limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TenantLoad {
    /// The tenant's metrics label (a known tenant, or `other`), for reasons in words.
    pub tenant: String,
    /// The tenant's requests holding a gpu slot now.
    pub gpu_in_flight: usize,
    /// Its class's `gpu_share` of the policy's `[gpu] max_in_flight`; `None`: no share limit.
    pub gpu_share: Option<f64>,
    /// `Some(per_day)` when its daily budget of `per_day` gpu calls is spent (until midnight UTC).
    pub gpu_budget_spent: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuLoad {
    /// Machine CPU utilisation EWMA, [0, 1]; `None` when unknown or stale.
    pub utilization: Option<f64>,
    pub queue_depth: usize,
    pub in_flight: usize,
    /// EWMA of the pool's batch service time (tokenisation + inference, without the queue
    /// wait), µs; `None` when unknown or stale (see `tier::service`).
    pub service_us: Option<u64>,
    /// Expected queue wait of a job joining now, µs: depth × service time per job ÷ workers
    /// (`tier::service::queue_wait_us`); `None` when unknown.
    pub queue_wait_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuLoad {
    /// Why the gpu tier cannot run at all (not configured); `None` when it exists.
    pub unavailable: Option<String>,
    pub memory: GpuMemory,
    /// Kernel-busy share (NVML), [0, 1], where known.
    pub utilization: Option<f64>,
    pub in_flight: usize,
    /// p95 of successful calls' latency, µs, over the last `signals::latency::MAX_AGE`.
    pub p95_us: Option<u64>,
    /// `onnx` backend: expected queue wait of a job joining now, µs (as the cpu tier's).
    pub queue_wait_us: Option<u64>,
    /// EWMA of successful calls' latency, µs.
    pub ewma_us: Option<u64>,
    pub circuit: CircuitState,
    /// Upstream backend: KV-cache headroom scraped from the servers.
    pub kv_cache: KvCache,
    /// Which limits the tier was below at the previous snapshot (their hysteresis, see
    /// `select::gpu_below`); all false in a hand-built snapshot.
    pub was_below: Below,
    /// Upstream backend: endpoints healthy and not ejected.
    pub endpoints_available: Option<usize>,
}

/// Limits a tier is below, kept between snapshots for their hysteresis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Below {
    pub free_memory: bool,
    pub kv_cache: bool,
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
