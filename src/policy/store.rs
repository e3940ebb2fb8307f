//! The live policy, swapped whole on reload.

use super::{Limits, Policy, PolicyError};
use arc_swap::ArcSwap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The live policy. Each request takes one snapshot at its start and keeps it to the end,
/// so no request is decided by half of one policy and half of another. A reload builds and
/// validates the new policy off to the side and swaps it in only if it is valid; otherwise the
/// last good one keeps serving and the error is kept for `GET /admin/policy`.
pub struct PolicyStore {
    current: ArcSwap<Policy>,
    dir: PathBuf,
    /// What every reload is checked against beside the files (the server's limits).
    limits: Limits,
    status: std::sync::Mutex<ReloadStatus>,
}

/// What `GET /admin/policy` shows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadStatus {
    pub version: String,
    pub dir: PathBuf,
    /// The policy's `[calibration] cpu_temperature`: the temperature the cpu tier's verdicts are
    /// read at under it; `null`: the served model's own (`/readyz` shows the live one in effect).
    pub cpu_temperature: Option<f64>,
    /// When the current version was loaded, seconds since the Unix epoch.
    pub loaded_at_unix: f64,
    /// The last refused reload's problems, until a reload succeeds.
    pub last_error: Option<Vec<String>>,
    /// When a reload was last refused, seconds since the Unix epoch; kept after a later reload
    /// succeeds (`last_error` is cleared then), so a refusal since start stays visible.
    pub last_error_at_unix: Option<f64>,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl PolicyStore {
    /// The store of a loaded policy; reloads are checked against the default [`Limits`].
    pub fn new(policy: Policy) -> Self {
        PolicyStore::within(policy, Limits::default())
    }

    /// The store of a policy loaded within `limits`, which every reload is checked against too.
    pub fn within(policy: Policy, limits: Limits) -> Self {
        let status = ReloadStatus {
            version: policy.version.clone(),
            dir: policy.dir.clone(),
            cpu_temperature: policy.calibration.cpu_temperature,
            loaded_at_unix: unix_now(),
            last_error: None,
            last_error_at_unix: None,
            reloads_ok: 0,
            reloads_failed: 0,
        };
        PolicyStore {
            dir: policy.dir.clone(),
            limits,
            current: ArcSwap::from_pointee(policy),
            status: std::sync::Mutex::new(status),
        }
    }

    pub fn snapshot(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// Reloads the policy directory. On success the new policy serves every request that
    /// starts from now on (`Ok(Some(version))`, or `Ok(None)` when the content did not change);
    /// on error nothing changes but the recorded error. Reloads are serialised.
    pub fn reload(&self) -> Result<Option<String>, PolicyError> {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        match Policy::load_dir_within(&self.dir, &self.limits) {
            Ok(policy) if policy.version == status.version => {
                status.last_error = None;
                Ok(None)
            }
            Ok(policy) => {
                let version = policy.version.clone();
                status.cpu_temperature = policy.calibration.cpu_temperature;
                self.current.store(Arc::new(policy));
                status.version = version.clone();
                status.loaded_at_unix = unix_now();
                status.last_error = None;
                status.reloads_ok += 1;
                Ok(Some(version))
            }
            Err(e) => {
                status.last_error = Some(e.0.iter().map(|p| p.to_string()).collect());
                status.last_error_at_unix = Some(unix_now());
                status.reloads_failed += 1;
                Err(e)
            }
        }
    }

    pub fn status(&self) -> ReloadStatus {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
