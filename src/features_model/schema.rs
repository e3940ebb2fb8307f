//! The features model's schema (`schema.toml` in its directory): which request features it
//! reads, in the model's input order, their kinds and units, the value an absent optional
//! feature takes, and an optional standardisation. [`Schema::vector`] turns a request's
//! `features` object into the model's input row, or says exactly which feature is wrong.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// How a feature's JSON value is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A JSON number.
    Number,
    /// `true`/`false`, or the numbers 0 and 1; read as 1.0 / 0.0.
    Bool,
}

/// `(x - mean) / std`, applied after the missing value is filled in.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Standardize {
    pub mean: f64,
    pub std: f64,
}

/// One `[[feature]]` of `schema.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureSpec {
    /// The key in the request's `features` object.
    pub name: String,
    pub kind: Kind,
    /// For people (the model card, `explain`): `km`, `currency units`, `share`...
    #[serde(default)]
    pub unit: String,
    /// A request the features model scores must carry it (else 422).
    #[serde(default)]
    pub required: bool,
    /// The value used when an optional feature is absent (required for optional features).
    #[serde(default)]
    pub missing: Option<f64>,
    #[serde(default)]
    pub standardize: Option<Standardize>,
    #[serde(default)]
    pub description: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SchemaFile {
    feature: Vec<FeatureSpec>,
}

/// The schema: features in the model's input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub features: Vec<FeatureSpec>,
}

/// Why a request's features cannot be scored; the gateway answers 422 naming them.
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureError {
    /// Required features the request lacks, in schema order.
    Missing(Vec<String>),
    /// A feature whose value cannot be used: not a number (or bool), or not finite as the
    /// model reads it (f32: a JSON number past ±3.4e38 would become infinite).
    Invalid { name: String, message: String },
}

impl Schema {
    /// Parses and checks `schema.toml` text. Errors name the feature and the key: duplicate
    /// names, an optional feature without a finite `missing`, a non-finite mean or a `std`
    /// that is not positive.
    pub fn parse(text: &str) -> Result<Schema, String> {
        let file: SchemaFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.feature.is_empty() {
            return Err("the schema declares no [[feature]]".into());
        }
        let mut seen = BTreeSet::new();
        for f in &file.feature {
            if !seen.insert(f.name.as_str()) {
                return Err(format!("feature `{}` is declared twice", f.name));
            }
            if !f.required && !f.missing.is_some_and(f64::is_finite) {
                return Err(format!("feature `{}`: an optional feature needs a finite `missing` value", f.name));
            }
            if let Some(s) = f.standardize {
                if !(s.mean.is_finite() && s.std.is_finite() && s.std > 0.0) {
                    return Err(format!("feature `{}`: standardize needs a finite mean and a std > 0", f.name));
                }
            }
        }
        Ok(Schema { features: file.feature })
    }

    /// The names, in input order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.features.iter().map(|f| f.name.as_str())
    }

    /// Whether a request with these features is for this model: it carries at least one of
    /// the schema's features (a request without any is not scored).
    pub fn applies(&self, features: &Map<String, Value>) -> bool {
        !features.is_empty() && self.names().any(|n| features.contains_key(n))
    }

    /// The model's input row (length = number of features, each finite). Errors: every
    /// required feature that is absent ([`FeatureError::Missing`], all of them), else the first
    /// feature whose value is unusable.
    pub fn vector(&self, features: &Map<String, Value>) -> Result<Vec<f32>, FeatureError> {
        let missing: Vec<String> = self
            .features
            .iter()
            .filter(|f| f.required && features.get(&f.name).is_none_or(Value::is_null))
            .map(|f| f.name.clone())
            .collect();
        if !missing.is_empty() {
            return Err(FeatureError::Missing(missing));
        }
        self.features.iter().map(|f| f.read(features.get(&f.name))).collect()
    }

    /// The row every absent optional feature takes: `missing` values (0 for required ones),
    /// standardised. The baseline occlusion attributions are measured against.
    pub fn baseline(&self) -> Vec<f32> {
        self.features.iter().map(|f| f.scale(f.missing.unwrap_or(0.0)) as f32).collect()
    }
}

impl FeatureSpec {
    fn read(&self, value: Option<&Value>) -> Result<f32, FeatureError> {
        let invalid = |message: String| FeatureError::Invalid { name: self.name.clone(), message };
        let raw = match (value, self.kind) {
            (None | Some(Value::Null), _) => self.missing.unwrap_or(0.0),
            (Some(Value::Bool(b)), Kind::Bool) => f64::from(u8::from(*b)),
            (Some(Value::Number(n)), Kind::Bool) => match n.as_f64() {
                Some(v) if v == 0.0 || v == 1.0 => v,
                _ => return Err(invalid(format!("`{}` is a bool: true, false, 0 or 1; got {n}", self.name))),
            },
            (Some(Value::Number(n)), Kind::Number) => n.as_f64().unwrap_or(f64::NAN),
            (Some(other), kind) => {
                let want = if kind == Kind::Bool { "a bool" } else { "a number" };
                return Err(invalid(format!("`{}` must be {want}, got {other}", self.name)));
            }
        };
        let x = self.scale(raw) as f32;
        if !x.is_finite() {
            return Err(invalid(format!("`{}` must be a finite number within ±3.4e38, got {raw}", self.name)));
        }
        Ok(x)
    }

    fn scale(&self, raw: f64) -> f64 {
        match self.standardize {
            Some(s) => (raw - s.mean) / s.std,
            None => raw,
        }
    }
}
