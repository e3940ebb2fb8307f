//! `[features_model]` of the server config: where the features model lives. Absent (the
//! default): no features model; requests' `features` reach only the rules. How its score
//! combines with the text's verdict is policy (`[features_model]` of the routing policy,
//! hot-reloaded: `crate::policy::FeaturesModelPolicy`).

use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeaturesModelConfig {
    /// The model directory (relative to the config file): `model.onnx`, `schema.toml`,
    /// `calibration.json`, `manifest.json`, optionally `trees.json`.
    pub dir: PathBuf,
}
