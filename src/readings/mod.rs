//! Live readings of the machine, sampled in the background and read lock-free on the request
//! path: machine CPU utilisation (EWMA over `/proc/stat`) and, per GPU, free memory and
//! utilisation. Each reading carries its time; [`ReadingsHub::at`] turns a reading older than
//! the staleness limit into "unknown", and the policy says what unknown means
//! (`routing.unknown_signals`, a policy key that keeps its older name).

pub mod cpu;
pub mod gpu;
pub mod latency;

use arc_swap::ArcSwap;
use cpu::CpuSource;
use gpu::{GpuDevice, GpuSource};
use serde::Deserialize;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// `[signals]` in config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadingsConfig {
    /// CPU sampling period, ms.
    pub cpu_interval_ms: u64,
    /// Time constant of the CPU utilisation EWMA, ms.
    pub cpu_ewma_ms: u64,
    /// GPU sampling period, ms.
    pub gpu_interval_ms: u64,
    /// A reading older than this counts as unknown, ms.
    pub stale_after_ms: u64,
}

impl Default for ReadingsConfig {
    fn default() -> Self {
        ReadingsConfig { cpu_interval_ms: 100, cpu_ewma_ms: 1000, gpu_interval_ms: 500, stale_after_ms: 2000 }
    }
}

#[derive(Debug, Clone, Default)]
struct Raw {
    cpu_utilization: Option<(f64, Instant)>,
    gpu: Option<(Result<Vec<GpuDevice>, String>, Instant)>,
}

/// Fresh readings (staleness applied): what routing sees of the machine.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Readings {
    /// EWMA of machine CPU utilisation, [0, 1]; `None` when unknown or stale.
    pub cpu_utilization: Option<f64>,
    /// GPU devices, or `Err(reason)` when there is no usable GPU.
    pub gpu_devices: Result<Vec<GpuDevice>, String>,
    /// Whether the GPU reading is missing or stale (then `gpu_devices` is `Ok(vec![])`).
    pub gpu_stale: bool,
}

pub struct ReadingsHub {
    raw: ArcSwap<Raw>,
    stale_after: Duration,
}

impl ReadingsHub {
    pub fn new(config: &ReadingsConfig) -> Arc<ReadingsHub> {
        Arc::new(ReadingsHub {
            raw: ArcSwap::from_pointee(Raw::default()),
            stale_after: Duration::from_millis(config.stale_after_ms),
        })
    }

    /// Readings as of `now`: anything older than the staleness limit is unknown.
    pub fn at(&self, now: Instant) -> Readings {
        let raw = self.raw.load();
        let fresh = |at: Instant| now.saturating_duration_since(at) <= self.stale_after;
        let cpu_utilization = raw.cpu_utilization.filter(|(_, at)| fresh(*at)).map(|(u, _)| u);
        let (gpu_devices, gpu_stale) = match &raw.gpu {
            Some((Err(reason), _)) => (Err(reason.clone()), false),
            Some((Ok(devices), at)) if fresh(*at) => (Ok(devices.clone()), false),
            _ => (Ok(Vec::new()), true),
        };
        Readings { cpu_utilization, gpu_devices, gpu_stale }
    }

    /// Starts the background samplers; they stop when the hub is dropped. Needs a tokio runtime.
    /// The GPU is sampled even without a gpu tier, so `/readyz` can say whether one is present.
    pub fn spawn_samplers(self: &Arc<Self>, config: &ReadingsConfig, cpu: Arc<dyn CpuSource>, gpu: Arc<dyn GpuSource>) {
        let weak = Arc::downgrade(self);
        let (interval, tau) = (Duration::from_millis(config.cpu_interval_ms.max(1)), config.cpu_ewma_ms.max(1) as f64);
        tokio::spawn(sample_cpu(weak.clone(), cpu, interval, tau));
        tokio::spawn(sample_gpu(weak, gpu, Duration::from_millis(config.gpu_interval_ms.max(1))));
    }

    fn update(&self, f: impl Fn(&mut Raw)) {
        self.raw.rcu(|old| {
            let mut new = Raw::clone(old);
            f(&mut new);
            new
        });
    }
}

async fn sample_cpu(hub: Weak<ReadingsHub>, source: Arc<dyn CpuSource>, interval: Duration, tau_ms: f64) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ewma: Option<(f64, Instant)> = None;
    loop {
        tick.tick().await;
        let Some(hub) = hub.upgrade() else { return };
        let Some(u) = source.sample() else { continue };
        let now = Instant::now();
        // Time-based EWMA: the weight of the old value decays as exp(-Δt / τ).
        let value = match ewma {
            Some((old, at)) => {
                let keep = (-(now - at).as_secs_f64() * 1000.0 / tau_ms).exp();
                keep * old + (1.0 - keep) * u
            }
            None => u,
        };
        ewma = Some((value, now));
        hub.update(|raw| raw.cpu_utilization = Some((value, now)));
    }
}

async fn sample_gpu(hub: Weak<ReadingsHub>, source: Arc<dyn GpuSource>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(hub) = hub.upgrade() else { return };
        // Driver calls can block; keep them off the async workers.
        let s = Arc::clone(&source);
        let Ok(sample) = tokio::task::spawn_blocking(move || s.sample()).await else { continue };
        let now = Instant::now();
        hub.update(|raw| raw.gpu = Some((sample.clone(), now)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(f64);
    impl CpuSource for Fixed {
        fn sample(&self) -> Option<f64> {
            Some(self.0)
        }
    }
    struct NoGpu;
    impl GpuSource for NoGpu {
        fn sample(&self) -> gpu::GpuSample {
            Err("no CUDA driver (test)".into())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn readings_arrive_and_go_stale() {
        let config = ReadingsConfig { cpu_interval_ms: 10, cpu_ewma_ms: 10, gpu_interval_ms: 10, stale_after_ms: 100 };
        let hub = ReadingsHub::new(&config);
        assert_eq!(hub.at(Instant::now()).cpu_utilization, None);
        assert!(hub.at(Instant::now()).gpu_stale);
        hub.spawn_samplers(&config, Arc::new(Fixed(0.9)), Arc::new(NoGpu));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = hub.at(Instant::now());
        assert!((r.cpu_utilization.unwrap() - 0.9).abs() < 1e-6);
        assert_eq!(r.gpu_devices, Err("no CUDA driver (test)".into()));
        let later = Instant::now() + Duration::from_millis(500);
        assert_eq!(hub.at(later).cpu_utilization, None, "a reading older than stale_after is unknown");
    }
}
