//! Routing policies: schema, loading, validation and the live store.
//!
//! A policy is a directory of TOML files merged in file-name order. Each file may hold any
//! of the sections below; a section (or a signal name) defined in two files is an error, and
//! `[[rules]]` concatenate in file order. Unknown keys are errors. Validation compiles every
//! regex and CEL rule and reports every problem at once, each with its file and rule.
//! The version is a content hash, so the same files always give the same `policy_version`.

mod config;
mod load;
mod prompt;
pub mod scenario;
mod sections;
mod store;
pub mod watch;

pub use crate::action::Action;
pub use config::PoliciesConfig;
pub use prompt::PromptSpec;
pub use scenario::{Limits, Scenario, ScenarioSpec, UnknownScenario};
pub use sections::{
    ActionThresholds, Calibration, Cascade, Combine, CpuLimits, FeaturesModelPolicy, GpuLimits, Routing, Safety,
    UnknownSignal, WhenSaturated,
};
pub use store::{PolicyStore, ReloadStatus};

use crate::complexity::ComplexitySpec;
use crate::rules::RuleSet;
use load::{one_line, Merged, PolicyFile};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a policy, located by file and (where there is one) rule or signal.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyProblem {
    pub file: PathBuf,
    /// 1-based line of the rule or signal in `file`, where known.
    pub line: Option<usize>,
    pub item: Option<String>,
    pub message: String,
}

impl fmt::Display for PolicyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        match &self.item {
            Some(item) => write!(f, ": {item}: {}", self.message),
            None => write!(f, ": {}", self.message),
        }
    }
}

impl PolicyProblem {
    /// A problem in `file` about `item` (a section, a key, a rule), without a line.
    fn in_file(file: &Path, item: Option<String>, message: String) -> PolicyProblem {
        PolicyProblem { file: file.to_path_buf(), line: None, item, message }
    }
}

/// The JSON Schema of a policy file (for editors: Taplo / Even Better TOML read JSON Schema).
/// `docs/policy.schema.json` is this, committed; a test keeps the two equal.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(PolicyFile)).unwrap_or_default()
}

/// Every problem found while loading a policy.
#[derive(Debug, Clone)]
pub struct PolicyError(pub Vec<PolicyProblem>);

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.0.iter().map(|p| p.to_string()).collect();
        write!(f, "{} problem(s) in policy:\n  {}", lines.len(), lines.join("\n  "))
    }
}

impl std::error::Error for PolicyError {}

/// A loaded, validated policy. Immutable: a new version is a new `Policy`.
#[derive(Debug)]
pub struct Policy {
    /// `sha256` over file names and contents, first 12 hex digits.
    pub version: String,
    pub dir: PathBuf,
    pub actions: ActionThresholds,
    pub cascade: Cascade,
    pub routing: Routing,
    pub complexity: ComplexitySpec,
    pub cpu: CpuLimits,
    pub gpu: GpuLimits,
    /// The prompt for an upstream gpu backend; required when one is configured.
    pub prompt: Option<PromptSpec>,
    pub safety: Safety,
    /// `[features_model]`: how the features model's risk combines with the text's verdict.
    pub features_model: FeaturesModelPolicy,
    /// `[calibration]`: the cpu tier's temperature under this policy (unset: the model's own).
    pub calibration: Calibration,
    /// Signals, rules, guards and the allow-list, compiled.
    pub rules: RuleSet,
    /// `[scenarios.NAME]`, resolved: what a request naming one is decided with.
    pub scenarios: std::collections::BTreeMap<String, Scenario>,
}

impl Policy {
    /// Loads and validates every `*.toml` in `dir`, against the default [`Limits`].
    pub fn load_dir(dir: &Path) -> Result<Policy, PolicyError> {
        Policy::load_dir_within(dir, &Limits::default())
    }

    /// Loads and validates every `*.toml` in `dir`; scenario deadlines must be within `limits`.
    pub fn load_dir_within(dir: &Path, limits: &Limits) -> Result<Policy, PolicyError> {
        let dir_problem = |message: String| {
            PolicyError(vec![PolicyProblem { line: None, file: dir.to_path_buf(), item: None, message }])
        };
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| dir_problem(format!("cannot read policy directory: {e}")))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            // Hidden files are editors' and tools' scratch files (".#routing.toml"), not policy.
            .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
            .filter(|p| !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')))
            .collect();
        paths.sort();
        if paths.is_empty() {
            return Err(dir_problem("no *.toml policy files".into()));
        }
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                PolicyError(vec![PolicyProblem {
                    line: None,
                    file: path.clone(),
                    item: None,
                    message: format!("cannot read: {e}"),
                }])
            })?;
            files.push((path, text));
        }
        Policy::from_sources_within(dir, &files, limits)
    }

    /// Builds a policy from `(file name, TOML text)` pairs, in order, against the default [`Limits`].
    pub fn from_sources(dir: &Path, files: &[(PathBuf, String)]) -> Result<Policy, PolicyError> {
        Policy::from_sources_within(dir, files, &Limits::default())
    }

    /// [`Policy::from_sources`], with scenario deadlines checked against `limits`.
    pub fn from_sources_within(
        dir: &Path,
        files: &[(PathBuf, String)],
        limits: &Limits,
    ) -> Result<Policy, PolicyError> {
        let mut problems = Vec::new();
        let mut hasher = Sha256::new();
        let mut merged = Merged::default();
        let mut parse_failed = false;
        for (path, text) in files {
            hasher.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
            hasher.update([0]);
            hasher.update(text.as_bytes());
            hasher.update([0]);
            match toml::from_str::<PolicyFile>(text) {
                Ok(file) => merged.add(path, text, file, &mut problems),
                Err(e) => {
                    parse_failed = true;
                    problems.push(PolicyProblem::in_file(path, None, one_line(&e.to_string())))
                }
            }
        }
        let version = format!("{:x}", hasher.finalize())[..12].to_string();
        // After a file failed to parse, its sections, signals and rules are missing for that
        // reason alone: checking the rest would bury the one real problem under its echoes (a
        // typo in rules.toml made every guard's signals "unknown": 42 problems for one).
        if parse_failed {
            return Err(PolicyError(problems));
        }
        merged.check(dir, &mut problems);
        merged.build(version, dir, limits, problems)
    }

    /// The scenario a request names: `Ok(None)` for none (the policy as written).
    ///
    /// Errors: [`UnknownScenario`] with every scenario this policy defines.
    pub fn scenario(&self, name: Option<&str>) -> Result<Option<&Scenario>, UnknownScenario> {
        let Some(name) = name else { return Ok(None) };
        self.scenarios
            .get(name)
            .map(Some)
            .ok_or_else(|| UnknownScenario { name: name.to_string(), known: self.scenarios.keys().cloned().collect() })
    }
}
