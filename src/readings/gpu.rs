//! GPU presence, free memory (CUDA driver API through `cudarc`) and utilisation (NVML through
//! `nvml-wrapper`).
//!
//! `cudarc` loads libcuda at run time; without it `CudaContext::new` panics, so presence is
//! checked first with `is_culib_present` (DESIGN.md). NVML is loaded at run time too and
//! returns an error when absent. No driver means "no GPU", never a panic.

use serde::Serialize;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuDevice {
    pub ordinal: usize,
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// Kernel-busy share of the last NVML sample period, [0, 1]; `None` without NVML.
    pub utilization: Option<f64>,
}

/// One reading: the devices, or why there are none.
pub type GpuSample = Result<Vec<GpuDevice>, String>;

/// Where GPU readings come from: the real driver, or a test double (a GPU on a CPU-only machine).
pub trait GpuSource: Send + Sync + 'static {
    fn sample(&self) -> GpuSample;
}

/// The CUDA driver (memory) and NVML (utilisation), opened on first use and kept.
#[derive(Default)]
pub struct CudaDriver {
    state: Mutex<Option<Result<DriverState, String>>>,
}

struct DriverState {
    contexts: Vec<Arc<cudarc::driver::CudaContext>>,
    nvml: Option<nvml_wrapper::Nvml>,
}

impl GpuSource for CudaDriver {
    fn sample(&self) -> GpuSample {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = state.get_or_insert_with(open).as_ref().map_err(Clone::clone)?;
        let mut devices = Vec::with_capacity(state.contexts.len());
        for (ordinal, ctx) in state.contexts.iter().enumerate() {
            let (free, total) = ctx.mem_get_info().map_err(|e| format!("device {ordinal}: cuMemGetInfo: {e}"))?;
            let utilization = state.nvml.as_ref().and_then(|n| {
                let rates = n.device_by_index(ordinal as u32).and_then(|d| d.utilization_rates()).ok()?;
                Some(rates.gpu as f64 / 100.0)
            });
            devices.push(GpuDevice { ordinal, free_bytes: free as u64, total_bytes: total as u64, utilization });
        }
        Ok(devices)
    }
}

fn open() -> Result<DriverState, String> {
    use cudarc::driver::{result, sys, CudaContext};
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made unless it is present.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda not found)".into());
    }
    let count = result::init()
        .and_then(|_| result::device::get_count())
        .map_err(|e| format!("CUDA driver present but unusable: {e}"))?;
    if count <= 0 {
        return Err("CUDA driver present but no device".into());
    }
    let contexts = (0..count as usize)
        .map(|i| CudaContext::new(i).map_err(|e| format!("device {i}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let nvml =
        nvml_wrapper::Nvml::init().map_err(|e| tracing::info!(error = %e, "NVML unavailable; no GPU utilisation")).ok();
    Ok(DriverState { contexts, nvml })
}
