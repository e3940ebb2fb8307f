//! The features model: an ONNX model over a request's declared `features` (a transaction's
//! behaviour: amounts, velocity, distances), run in process by ONNX Runtime in microseconds
//! (tree ensembles are `ai.onnx.ml` operators it runs natively), calibrated by temperature
//! scaling like the text tiers, with each feature's contribution for `?explain=true` (exact
//! TreeSHAP when the trees ship beside the model, else occlusion against the schema's
//! baseline).
//!
//! A model directory (`[features_model] dir`; `tiergate features-model pack` writes one):
//! `model.onnx` (input float `[N, F]`, output `[N, 1]` margin or `[N, 2]` probabilities, as
//! `manifest.json` `output` says), `schema.toml` ([`schema`]), `calibration.json` (its
//! `temperature`), `manifest.json` (`name`, `output`), and optionally `trees.json` ([`shap`]).
//!
//! Files by concern: this one (loading, scoring, contributions), [`schema`] (request features
//! to the model's row), [`shap`] (TreeSHAP), [`config`] (`[features_model]` of the server
//! config), `pack` (the pack command's calibration and manifest).

pub mod config;
pub mod schema;
pub mod shap;

pub use config::FeaturesModelConfig;
pub use schema::{FeatureError, Schema};

use anyhow::{bail, Context};
use ort::session::Session;
use ort::value::Tensor;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Mutex;

/// What `manifest.json` says of the model.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Manifest {
    pub name: String,
    /// `margin` (log-odds, `[N, 1]`) or `probability` (`[N, 2]`, column 1 the risk; its logit
    /// is the margin).
    #[serde(default = "margin")]
    pub output: Output,
}

fn margin() -> Output {
    Output::Margin
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    Margin,
    Probability,
}

#[derive(Deserialize)]
struct Calibration {
    temperature: f64,
}

/// A score: the model's margin (log-odds) and its calibrated risk, `sigmoid(margin / T)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Score {
    pub margin: f64,
    pub risk: f64,
}

/// A request's features as the features model scored them: what the cascade combines with
/// the text's verdict, and a shadow replay reuses.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The model's input row ([`Schema::vector`]).
    pub row: Vec<f32>,
    /// `Err`: ONNX Runtime failed or the margin was not finite (the message).
    pub score: Result<Score, String>,
    /// When scoring started (the trace's `tier features` span), and how long it took.
    pub at: std::time::SystemTime,
    pub latency_us: u64,
}

/// One feature's part in a score, for `explain`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Contribution {
    pub feature: String,
    /// The value the model read (after the missing value and standardisation).
    pub value: f32,
    /// Margin units (log-odds): positive pushes towards risk.
    pub contribution: f64,
}

/// Why the features model scored what it did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Contributions {
    /// `tree_shap` (exact Shapley values; `bias + Σ contribution = margin`) or `occlusion`
    /// (margin minus the margin with the feature at its baseline; they need not add up).
    pub method: &'static str,
    /// The expected margin (tree_shap) or the margin of the schema's baseline row (occlusion).
    pub bias: f64,
    pub margin: f64,
    /// Largest |contribution| first.
    pub features: Vec<Contribution>,
}

/// The loaded model. Scoring takes a lock on its one session: a tree ensemble runs in
/// microseconds, far less than a thread hand-off would cost.
pub struct FeaturesModel {
    pub manifest: Manifest,
    pub schema: Schema,
    /// sha256 of `model.onnx`, hex.
    pub digest: String,
    temperature: f64,
    trees: Option<shap::Trees>,
    session: Mutex<Session>,
}

impl FeaturesModel {
    /// Loads `dir` into an ONNX Runtime session from `env`. Errors name the file: unreadable or
    /// invalid schema, calibration or manifest, a model ONNX Runtime refuses or whose input
    /// width is not the schema's, a non-positive temperature, or `trees.json` that disagrees
    /// with the ONNX model on the schema's baseline row (by more than 1e-3 in margin).
    pub fn load(dir: &Path, env: &ort::environment::Environment) -> anyhow::Result<FeaturesModel> {
        let read = |name: &str| -> anyhow::Result<String> {
            std::fs::read_to_string(dir.join(name)).with_context(|| format!("reading {}", dir.join(name).display()))
        };
        let schema = Schema::parse(&read("schema.toml")?).map_err(|e| anyhow::anyhow!("schema.toml: {e}"))?;
        let manifest: Manifest = serde_json::from_str(&read("manifest.json")?).context("manifest.json")?;
        let calibration: Calibration = serde_json::from_str(&read("calibration.json")?).context("calibration.json")?;
        if !(calibration.temperature.is_finite() && calibration.temperature > 0.0) {
            bail!("calibration.json: temperature must be a finite number > 0, got {}", calibration.temperature);
        }
        let onnx = dir.join("model.onnx");
        let bytes = std::fs::read(&onnx).with_context(|| format!("reading {}", onnx.display()))?;
        let session = Session::builder(env)
            .map_err(|e| anyhow::anyhow!("creating an ONNX Runtime session: {e}"))?
            .with_intra_threads(1)
            .map_err(|e| anyhow::anyhow!("configuring the ONNX Runtime session: {e}"))?
            .commit_from_memory(&bytes)
            .map_err(|e| anyhow::anyhow!("loading {} into ONNX Runtime: {e}", onnx.display()))?;
        let trees = match std::fs::read_to_string(dir.join("trees.json")) {
            Ok(text) => Some(shap::Trees::parse(&text).map_err(|e| anyhow::anyhow!("trees.json: {e}"))?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).context("reading trees.json"),
        };
        let model = FeaturesModel {
            digest: crate::tier::manifest::sha256_hex(&bytes),
            manifest,
            temperature: calibration.temperature,
            trees,
            session: Mutex::new(session),
            schema,
        };
        model.check()?;
        Ok(model)
    }

    /// The load-time checks: the schema's baseline row scores, to a finite margin, and the
    /// trees (if any) name the schema's features and reproduce the ONNX margin.
    fn check(&self) -> anyhow::Result<()> {
        let baseline = self.schema.baseline();
        let margin = self.margin(&baseline).context("scoring the schema's baseline row")?;
        if let Some(trees) = &self.trees {
            let names: Vec<&str> = self.schema.names().collect();
            if trees.features != names {
                bail!("trees.json lists features {:?}, the schema {:?}", trees.features, names);
            }
            let from_trees = trees.margin(&baseline);
            if (from_trees - margin).abs() > 1e-3 {
                bail!(
                    "trees.json gives margin {from_trees} on the baseline row, model.onnx {margin}: not the same model"
                );
            }
        }
        Ok(())
    }

    /// Scores one row ([`Schema::vector`]). Errors: ONNX Runtime failed, or the margin is not
    /// finite (a score that is not a number never passes).
    pub fn score(&self, row: &[f32]) -> anyhow::Result<Score> {
        let margin = self.margin(row)?;
        // One logit against 0: the two-class softmax at T is sigmoid(margin / T).
        let risk = crate::calibrate::softmax_t(&[0.0, margin as f32], self.temperature)[1];
        Ok(Score { margin, risk })
    }

    fn margin(&self, row: &[f32]) -> anyhow::Result<f64> {
        let n = self.schema.features.len();
        if row.len() != n {
            bail!("a row of {} values for a schema of {n} features", row.len());
        }
        let input = Tensor::from_array(([1usize, n], row.to_vec()))?;
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let outputs = session.run(ort::inputs![input])?;
        let (_, values) = outputs[0].try_extract_tensor::<f32>()?;
        let margin = match (self.manifest.output, values) {
            (Output::Margin, [m]) => f64::from(*m),
            (Output::Probability, [_, p]) => {
                let p = f64::from(*p);
                (p / (1.0 - p)).ln()
            }
            (kind, v) => bail!("the model gave {} values; manifest output {kind:?} expects 1 (margin) or 2", v.len()),
        };
        if !margin.is_finite() {
            bail!("the model's margin is not finite ({margin})");
        }
        Ok(margin)
    }

    /// Each feature's contribution to `score` of `row`: TreeSHAP with `trees.json`, else
    /// occlusion (one model run per feature). Errors as [`FeaturesModel::score`].
    pub fn contributions(&self, row: &[f32], score: Score) -> anyhow::Result<Contributions> {
        let (method, bias, values) = match &self.trees {
            Some(trees) => ("tree_shap", trees.bias(), trees.shap(row)),
            None => {
                let baseline = self.schema.baseline();
                let mut deltas = Vec::with_capacity(row.len());
                for i in 0..row.len() {
                    let mut occluded = row.to_vec();
                    occluded[i] = baseline[i];
                    deltas.push(score.margin - self.margin(&occluded)?);
                }
                ("occlusion", self.margin(&baseline)?, deltas)
            }
        };
        let mut features: Vec<Contribution> = self
            .schema
            .names()
            .zip(row)
            .zip(values)
            .map(|((name, &value), contribution)| Contribution { feature: name.to_string(), value, contribution })
            .collect();
        features.sort_by(|a, b| b.contribution.abs().total_cmp(&a.contribution.abs()));
        Ok(Contributions { method, bias, margin: score.margin, features })
    }
}

#[cfg(test)]
mod tests;
