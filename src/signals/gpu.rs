//! GPU presence and memory headroom through the CUDA driver API (`cudarc`).
//!
//! `cudarc` loads libcuda at run time; without it `CudaContext::new` panics, so presence is
//! checked first with `is_culib_present` (DESIGN.md). No driver means "no GPU", never a panic.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct GpuDevice {
    pub ordinal: usize,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// What the probe found: devices, or why there are none.
#[derive(Debug, Clone, Serialize)]
pub struct GpuProbe {
    pub devices: Vec<GpuDevice>,
    /// Why no device could be used; `None` when at least one was found.
    pub unavailable: Option<String>,
}

/// Probes every CUDA device once (`cuInit`, `cuDeviceGetCount`, `cuMemGetInfo` per device).
pub fn probe() -> GpuProbe {
    use cudarc::driver::{result, sys, CudaContext};
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made unless it is present.
    if !unsafe { sys::is_culib_present() } {
        return GpuProbe { devices: vec![], unavailable: Some("no CUDA driver (libcuda not found)".into()) };
    }
    let count = match result::init().and_then(|_| result::device::get_count()) {
        Ok(n) => n.max(0) as usize,
        Err(e) => {
            return GpuProbe { devices: vec![], unavailable: Some(format!("CUDA driver present but unusable: {e}")) }
        }
    };
    let mut devices = Vec::new();
    let mut last_error = None;
    for ordinal in 0..count {
        match CudaContext::new(ordinal).and_then(|ctx| ctx.mem_get_info()) {
            Ok((free, total)) => {
                devices.push(GpuDevice { ordinal, free_bytes: free as u64, total_bytes: total as u64 })
            }
            Err(e) => last_error = Some(format!("device {ordinal}: {e}")),
        }
    }
    let unavailable =
        devices.is_empty().then(|| last_error.unwrap_or_else(|| "CUDA driver present but no device".into()));
    GpuProbe { devices, unavailable }
}
