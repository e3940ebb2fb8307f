//! A new model backend is one file plus its config section: this file is that file. It
//! implements `ModelTier` for a backend that answers a fixed, configured risk score, registers
//! it, and serves it as the gpu tier from `[gpu] backend = "fixed"` and `[gpu.fixed]`; the
//! real cpu tier escalates to it, and `/readyz` shows its status.

mod common;
use common::*;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;
use std::sync::{Arc, Mutex, OnceLock};
use tiergate::config::Config;
use tiergate::gateway::Sources;
use tiergate::tier::gpu::{self as backend, BackendSpec};
use tiergate::tier::{GpuConfig, ModelTier, ModelVerdict, TierError, TierInput};
use tokio::time::Instant;

/// `[gpu.fixed]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FixedConfig {
    /// The calibrated risk score it answers, [0, 1].
    risk_score: f64,
}

impl FixedConfig {
    fn read(gpu: &GpuConfig) -> Result<FixedConfig, String> {
        let c: FixedConfig = gpu.section("fixed")?;
        match (0.0..=1.0).contains(&c.risk_score) {
            true => Ok(c),
            false => Err(format!("[gpu.fixed]: `risk_score` must be in [0, 1], got {}", c.risk_score)),
        }
    }
}

/// The backend: the same verdict for every text.
struct Fixed {
    risk_score: f64,
}

impl ModelTier for Fixed {
    fn classify<'a>(&'a self, input: TierInput<'a>, _: Instant) -> BoxFuture<'a, Result<ModelVerdict, TierError>> {
        let tokens = input.text().split_whitespace().count();
        Box::pin(async move {
            Ok(ModelVerdict {
                risk_score: self.risk_score,
                confidence: self.risk_score.max(1.0 - self.risk_score),
                ood_score: None,
                tokens: Some(tokens),
                queue_us: 0,
                infer_us: 0,
                batch_size: 1,
                endpoint: None,
                window: None,
                unread: false,
            })
        })
    }

    fn status(&self) -> serde_json::Value {
        json!({ "risk_score": self.risk_score })
    }
}

fn register() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        backend::register(BackendSpec {
            name: "fixed",
            validate: |gpu| FixedConfig::read(gpu).map(|_| ()),
            start: |_, gpu| {
                let c = FixedConfig::read(gpu).map_err(anyhow::Error::msg)?;
                Ok(Arc::new(Fixed { risk_score: c.risk_score }))
            },
        })
        .unwrap()
    });
}

/// Every cpu verdict escalates (a confidence is below 1); a model verdict from 0.5 stands.
const ROUTING: &str = "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\nescalate_below = 1.0\n\
     accept_below = 0.5\nood_above = 1.0\n[default]\naction = \"allow\"\nscore = 0.2\n\
     [gpu]\nmin_free_memory_mb = 2048\nmax_in_flight = 8\n";

#[tokio::test]
async fn a_backend_added_in_one_file_serves_the_gpu_tier_from_its_config_section() {
    register();
    let mut c = fast_config(&policies_with_routing("fixed-backend", ROUTING));
    c.gpu = Config::parse("[gpu]\nbackend = \"fixed\"\n[gpu.fixed]\nrisk_score = 0.93\n").unwrap().gpu;
    let gpu = Arc::new(FakeGpu::with_free_mb(40_000));
    let sources = Sources { cpu: Arc::new(FakeCpu(Mutex::new(0.1))) as _, gpu: Arc::clone(&gpu) as _ };
    let (addr, gateway) = start_with(c, sources);
    eventually("a GPU reading", || load_now(&gateway).gpu.memory == tiergate::select::GpuMemory::FreeMb(40_000)).await;

    let d = classify(addr, json!({"text": "Lunch at noon on Friday? The usual place."})).await.json();
    assert_eq!(d["path"][0]["tier"], "cpu", "{d}");
    assert_eq!(d["path"][1]["tier"], "gpu", "{d}");
    assert_eq!(d["tier"], "gpu", "the added backend decided: {d}");
    assert!((d["risk_score"].as_f64().unwrap() - 0.93).abs() < 1e-12, "its configured score: {d}");
    assert_eq!(d["action"], "block", "0.93 is over block_at: {d}");

    let ready = send(addr, "GET", "/readyz", &[], String::new()).await.json();
    let tier = &ready["tiers"]["gpu"];
    assert_eq!(tier["backend"], "fixed", "{ready}");
    assert_eq!(tier["status"], "ready", "{ready}");
    assert_eq!(tier["risk_score"], 0.93, "the backend's own status is in /readyz: {ready}");
}

#[test]
fn its_config_section_is_checked_and_unknown_backends_are_refused() {
    register();
    let err =
        |toml: &str| Config::parse(toml).and_then(|c| c.validate()).err().map(|e| e.to_string()).unwrap_or_default();
    let e = err("[gpu]\nbackend = \"fixed\"\n[gpu.fixed]\nrisk_score = 1.5\n");
    assert!(e.contains("[gpu.fixed]") && e.contains("risk_score"), "{e}");
    let e = err("[gpu]\nbackend = \"fixed\"\n[gpu.fixed]\nrisk = 0.5\n");
    assert!(e.contains("[gpu.fixed]") && e.contains("risk"), "unknown field in the section: {e}");
    let e = err("[gpu]\nbackend = \"fixd\"\n");
    assert!(e.contains("\"fixd\"") && e.contains("fixed") && e.contains("upstream"), "{e}");
    let e = err("[gpu]\nbackend = \"none\"\n[gpu.fixd]\nrisk_score = 0.5\n");
    assert!(e.contains("`gpu.fixd`"), "an unknown section is named: {e}");
    assert!(
        backend::register(BackendSpec { name: "fixed", ..backend::builtin()[0] }).is_err(),
        "one name, one backend"
    );
    assert!(backend::register(BackendSpec { name: "none", ..backend::builtin()[0] }).is_err());
}
