//! The drift monitor: does today's traffic still look like the data the model was calibrated
//! on? A reference distribution ships with the model ([`reference`]); the gateway pushes every
//! live decision's signals into a rolling window ([`window`]); a background task compares the
//! window with the reference every `drift.interval_ms` ([`compare`]) and sets the gauges
//! `tiergate_drift_ks{signal}` (risk score, OOD score, text length: two-sample KS, [`ks`]),
//! `tiergate_drift_tvd{signal="language"}` (total variation distance: KS needs an order, and
//! language codes have none) and `tiergate_drift_window_size`. Nothing is computed on the
//! request path. `tiergate drift` computes the same from audit records.

pub mod compare;
mod config;
pub mod ks;
pub mod reference;
pub mod window;

pub use compare::{compare, Measure, Observation, SignalDrift};
pub use config::DriftConfig;
pub use reference::Reference;

use crate::decision::Decision;
use crate::metrics::{Metrics, SignalLabels};
use crate::text::LanguageCell;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use window::{Entry, Window};

/// The live monitor: the window and the reference. Shared by the gateway (which feeds it) and
/// the drift task (which reads it).
pub struct Monitor {
    window: Mutex<Window>,
    reference: Reference,
    config: DriftConfig,
}

impl Monitor {
    /// Loads the reference (`drift.reference`, else `reference.json` in `model_dir`) and starts
    /// the drift task, which sets `metrics`' drift gauges. `Ok(None)` when `drift.enabled` is
    /// false, or the default reference file does not exist (logged). Errors: a named reference
    /// that cannot be read, or a file that is not a valid reference. Call inside a tokio runtime.
    pub fn start(
        config: &DriftConfig,
        model_dir: &Path,
        model_manifest_sha256: &str,
        metrics: &Metrics,
    ) -> anyhow::Result<Option<Arc<Monitor>>> {
        if !config.enabled {
            return Ok(None);
        }
        let path = match &config.reference {
            Some(p) => p.clone(),
            None => {
                let p = model_dir.join("reference.json");
                if !p.exists() {
                    tracing::warn!(path = %p.display(), "no drift reference in the model directory: drift monitor off (make one with `tiergate drift reference`)");
                    return Ok(None);
                }
                p
            }
        };
        let reference = Reference::load(&path).map_err(|e| anyhow::anyhow!("drift.reference: {e:#}"))?;
        if reference.model.manifest_sha256 != model_manifest_sha256 {
            tracing::warn!(path = %path.display(), reference_model = %reference.model.manifest_sha256, model = %model_manifest_sha256,
                "the drift reference was made with another model or calibration: drift readings compare with that model's scores; remake it with `tiergate drift reference`");
        }
        let monitor =
            Arc::new(Monitor { window: Mutex::new(Window::new(config.window)), reference, config: config.clone() });
        let gauges = Gauges {
            ks: metrics.drift_ks.clone(),
            tvd: metrics.drift_tvd.clone(),
            size: metrics.drift_window_size.clone(),
        };
        gauges.publish(&monitor.reference, &[], config.min_window);
        tokio::spawn(run(Arc::downgrade(&monitor), gauges));
        Ok(Some(monitor))
    }

    /// Records one finished decision: `risk_score` is its risk score as the reference's model
    /// would give it (a policy's own cpu temperature undone: that moves scores on purpose, not
    /// the traffic), `text` the request's text (its length in chars is the signal), `lang` its
    /// language cell. One mutex-guarded push.
    pub fn observe(&self, decision: &Decision, risk_score: f64, text: &str, lang: &LanguageCell) {
        let entry = Entry {
            at: Instant::now(),
            risk_score,
            ood_score: decision.path.iter().find_map(|s| s.ood_score),
            text_chars: text.chars().count() as u64,
            lang: lang.clone(),
        };
        self.window.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
    }

    /// The reference the window is compared with.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }
}

/// The drift gauges (clones of the registered metrics).
struct Gauges {
    ks: Family<SignalLabels, Gauge<f64, AtomicU64>>,
    tvd: Family<SignalLabels, Gauge<f64, AtomicU64>>,
    size: Gauge,
}

impl Gauges {
    /// Compares `entries` with the reference and sets every gauge; NaN below `min_window`.
    fn publish(&self, reference: &Reference, entries: &[Entry], min_window: usize) {
        let observations: Vec<Observation> = entries.iter().map(Entry::observation).collect();
        self.size.set(entries.len() as i64);
        for s in compare(reference, &observations) {
            let value = match s.distance {
                Some(d) if entries.len() >= min_window => d,
                _ => f64::NAN,
            };
            let family = if s.measure == Measure::Ks { &self.ks } else { &self.tvd };
            family.get_or_create(&SignalLabels { signal: s.signal }).set(value);
        }
    }
}

/// The drift task: every `interval_ms`, the window against the reference, on the blocking pool
/// (sorting and language detection are not for runtime threads). Ends with the monitor.
async fn run(monitor: Weak<Monitor>, gauges: Gauges) {
    let gauges = Arc::new(gauges);
    let every = match monitor.upgrade() {
        Some(m) => Duration::from_millis(m.config.interval_ms),
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(m) = monitor.upgrade() else { return };
        let gauges = Arc::clone(&gauges);
        let _ = tokio::task::spawn_blocking(move || {
            let max_age = Duration::from_millis(m.config.max_age_ms);
            let entries = m.window.lock().unwrap_or_else(|e| e.into_inner()).current(Instant::now(), max_age);
            gauges.publish(&m.reference, &entries, m.config.min_window);
        })
        .await;
    }
}
