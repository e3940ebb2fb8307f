//! The reference distribution shipped with the model (`models/reference.json`): what the
//! signals looked like on the validation split, decided by the same gateway, model and policy.
//!
//! It keeps the **samples** (sorted), not quantiles: the validation sample is small (hundreds
//! of rows), so the file stays small and the KS statistic against it is exact; a reference from
//! a split of millions would keep quantiles instead. It pins the model it was made with
//! (`model.manifest_sha256`, which covers the weights, tokenizer, temperature and OOD data):
//! a new temperature moves every risk score, and the monitor warns when the pins differ.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Current file format.
pub const FORMAT: u32 = 1;

/// The model a reference was made with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPin {
    pub name: String,
    /// sha256 of the model directory's `MANIFEST.sha256`.
    pub manifest_sha256: String,
}

/// The numeric signals' samples, each sorted ascending.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Samples {
    /// The decision's risk score, [0, 1].
    pub risk_score: Vec<f64>,
    /// The model stage's OOD score, where a model stage ran.
    pub ood_score: Vec<f64>,
    /// Length of the request text in Unicode scalar values (Rust `chars`, Python `len`).
    pub text_chars: Vec<f64>,
}

/// `reference.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reference {
    pub format: u32,
    /// The labelled file it was made from, as given on the command line.
    pub made_from: String,
    pub model: ModelPin,
    /// The policy version that decided the rows (the risk score of a rules decision is the
    /// policy's).
    pub policy_version: String,
    pub samples: Samples,
    /// Decisions per language code (ISO 639-3, "und" when not reliable).
    pub language: BTreeMap<String, u64>,
}

impl Reference {
    /// Reads and checks a reference file. Errors name the file and the problem (unreadable,
    /// not the format, unsorted or non-finite samples, an empty signal).
    pub fn load(path: &Path) -> anyhow::Result<Reference> {
        let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let r: Reference = serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{}: not a drift reference: {e}", path.display()))?;
        anyhow::ensure!(r.format == FORMAT, "{}: format {} (expected {FORMAT})", path.display(), r.format);
        for (name, v) in r.numeric() {
            anyhow::ensure!(!v.is_empty(), "{}: samples.{name} is empty", path.display());
            anyhow::ensure!(
                v.iter().all(|x| x.is_finite()),
                "{}: samples.{name} has a non-finite value",
                path.display()
            );
            anyhow::ensure!(v.windows(2).all(|w| w[0] <= w[1]), "{}: samples.{name} is not sorted", path.display());
        }
        anyhow::ensure!(!r.language.is_empty(), "{}: language is empty", path.display());
        Ok(r)
    }

    /// The numeric signals by name, in gauge label order.
    pub fn numeric(&self) -> [(&'static str, &[f64]); 3] {
        let s = &self.samples;
        [("risk_score", &s.risk_score), ("ood_score", &s.ood_score), ("text_chars", &s.text_chars)]
    }

    /// Writes it as one line of JSON.
    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string(self)?;
        std::fs::write(path, text + "\n").map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
    }
}
