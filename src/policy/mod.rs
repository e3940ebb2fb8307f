//! Routing policies: schema, loading, validation and the live store.
//!
//! A policy is a directory of TOML files merged in file-name order. Each file may hold any
//! of the sections below; a section (or a signal name) defined in two files is an error, and
//! `[[rules]]` concatenate in file order. Unknown keys are errors. Validation compiles every
//! regex and CEL rule and reports every problem at once, each with its file and rule.
//! The version is a content hash, so the same files always give the same `policy_version`.

pub mod watch;

use crate::complexity::ComplexitySpec;
use crate::rules::RuleSet;
use crate::tier::gpu::upstream::PromptSpec;
use arc_swap::ArcSwap;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a decision does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Review,
    Block,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Review => "review",
            Action::Block => "block",
        }
    }
}

/// `[actions]`: map a calibrated risk score to an action.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionThresholds {
    /// `risk_score >= review_at` gives at least `review`.
    pub review_at: f64,
    /// `risk_score >= block_at` gives `block`.
    pub block_at: f64,
}

impl ActionThresholds {
    pub fn action_for(&self, risk_score: f64) -> Action {
        if risk_score >= self.block_at {
            Action::Block
        } else if risk_score >= self.review_at {
            Action::Review
        } else {
            Action::Allow
        }
    }
}

/// `[cascade]`: when a model verdict stands, escalates, or hands over to rules.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cascade {
    /// A cpu verdict with calibrated confidence below this escalates to the gpu tier when it
    /// is eligible. Defaults to `accept_below` (no band where escalation is tried but the cpu
    /// verdict would still stand).
    #[serde(default)]
    pub escalate_below: Option<f64>,
    /// A final model verdict with calibrated confidence below this goes to rules.
    pub accept_below: f64,
    /// A cpu verdict whose out-of-distribution score is above this is not trusted whatever its
    /// confidence: it escalates to the gpu tier when eligible, else goes to rules.
    pub ood_above: f64,
}

impl Cascade {
    pub fn escalate_below(&self) -> f64 {
        self.escalate_below.unwrap_or(self.accept_below)
    }
}

/// What to do when neither model tier can take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WhenSaturated {
    /// Rules decide (the decision records why).
    Rules,
    /// Answer 503 with `Retry-After`.
    Shed,
}

/// How a signal that is unknown (never sampled, or older than its staleness limit) counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnknownSignal {
    /// As if within limits (fail open).
    Eligible,
    /// As if over limits (fail closed).
    Ineligible,
}

/// `[routing]`: which tier a request starts on.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Routing {
    /// Complexity above this starts on the gpu tier when it is eligible.
    pub cpu_max_complexity: f64,
    /// Escalation to the gpu tier needs at least this complexity (0: any request may escalate).
    pub gpu_min_complexity: f64,
    pub when_saturated: WhenSaturated,
    /// `Retry-After` seconds when shedding.
    pub retry_after_s: u64,
    pub unknown_signals: UnknownSignal,
}

impl Default for Routing {
    fn default() -> Self {
        Routing {
            cpu_max_complexity: 0.7,
            gpu_min_complexity: 0.0,
            when_saturated: WhenSaturated::Rules,
            retry_after_s: 1,
            unknown_signals: UnknownSignal::Eligible,
        }
    }
}

/// `[cpu]`: when the cpu tier is too loaded to take a request.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CpuLimits {
    /// Machine CPU utilisation (EWMA, [0, 1]) above which the cpu tier is not eligible.
    pub max_utilization: f64,
    /// Requests waiting for a cpu worker above which the cpu tier is not eligible.
    pub max_queue_depth: usize,
}

impl Default for CpuLimits {
    fn default() -> Self {
        CpuLimits { max_utilization: 1.0, max_queue_depth: 128 }
    }
}

/// `[gpu]`: when the gpu tier may take a request.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GpuLimits {
    /// Free GPU memory (MiB) below which the gpu tier is not eligible (in-process backend).
    pub min_free_memory_mb: u64,
    /// Requests in flight on the gpu tier at or above which it admits no more (routes down).
    pub max_in_flight: usize,
    /// KV-cache headroom ([0, 1], upstream servers exposing metrics) below which the gpu tier is not eligible.
    pub min_kv_cache_headroom: f64,
}

impl Default for GpuLimits {
    fn default() -> Self {
        GpuLimits { min_free_memory_mb: 1024, max_in_flight: 16, min_kv_cache_headroom: 0.05 }
    }
}

/// `[signals.NAME]`: a named text signal, the number of regex matches in the text.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalSpec {
    pub patterns: Vec<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// `[[rules]]`: a CEL condition with the verdict it gives. Rules are tried in order; the
/// first that matches decides.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub name: String,
    /// CEL expression over `signals`, `features`, `tenant`, `text_len`, `model`; must yield a bool.
    pub when: String,
    pub action: Action,
    /// Risk score in [0, 1] reported when this rule decides.
    pub score: f64,
    #[serde(default)]
    pub description: Option<String>,
}

/// `[default]`: the verdict when rules decide and no rule matches.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DefaultVerdict {
    pub action: Action,
    pub score: f64,
}

/// One policy file. Every section is optional in a file; across a policy directory,
/// `[actions]`, `[cascade]` and `[default]` must each be defined once.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "tiergate policy file")]
struct PolicyFile {
    actions: Option<ActionThresholds>,
    cascade: Option<Cascade>,
    default: Option<DefaultVerdict>,
    routing: Option<Routing>,
    complexity: Option<ComplexitySpec>,
    cpu: Option<CpuLimits>,
    gpu: Option<GpuLimits>,
    prompt: Option<PromptSpec>,
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, SignalSpec>")]
    signals: BTreeMap<String, toml::Spanned<SignalSpec>>,
    #[serde(default)]
    #[schemars(with = "Vec<RuleSpec>")]
    rules: Vec<toml::Spanned<RuleSpec>>,
}

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
    pub rules: RuleSet,
}

impl Policy {
    /// Loads and validates every `*.toml` in `dir`.
    pub fn load_dir(dir: &Path) -> Result<Policy, PolicyError> {
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
        Policy::from_sources(dir, &files)
    }

    /// Builds a policy from `(file name, TOML text)` pairs, in order.
    pub fn from_sources(dir: &Path, files: &[(PathBuf, String)]) -> Result<Policy, PolicyError> {
        let mut problems = Vec::new();
        let mut hasher = Sha256::new();
        let mut merged = Merged::default();
        for (path, text) in files {
            hasher.update(path.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
            hasher.update([0]);
            hasher.update(text.as_bytes());
            hasher.update([0]);
            match toml::from_str::<PolicyFile>(text) {
                Ok(file) => merged.add(path, text, file, &mut problems),
                Err(e) => problems.push(PolicyProblem {
                    line: None,
                    file: path.clone(),
                    item: None,
                    message: one_line(&e.to_string()),
                }),
            }
        }
        let version = format!("{:x}", hasher.finalize())[..12].to_string();
        let whole = || dir.to_path_buf();
        let actions = merged.actions.take();
        let cascade = merged.cascade.take();
        let default = merged.default.take();
        // After a file failed to parse, its sections are missing for that reason alone.
        let parse_failed = !problems.is_empty();
        for (what, missing) in
            [("[actions]", actions.is_none()), ("[cascade]", cascade.is_none()), ("[default]", default.is_none())]
        {
            if missing && !parse_failed {
                problems.push(PolicyProblem {
                    line: None,
                    file: whole(),
                    item: None,
                    message: format!("no file defines {what}"),
                });
            }
        }
        if let Some((file, a)) = &actions {
            check_unit(file, "actions.review_at", a.review_at, &mut problems);
            check_unit(file, "actions.block_at", a.block_at, &mut problems);
            if a.review_at > a.block_at {
                problems.push(PolicyProblem {
                    line: None,
                    file: file.clone(),
                    item: Some("actions".into()),
                    message: format!("review_at ({}) must not exceed block_at ({})", a.review_at, a.block_at),
                });
            }
        }
        if let Some((file, c)) = &cascade {
            check_unit(file, "cascade.accept_below", c.accept_below, &mut problems);
            check_unit(file, "cascade.ood_above", c.ood_above, &mut problems);
            if let Some(e) = c.escalate_below {
                check_unit(file, "cascade.escalate_below", e, &mut problems);
                if c.accept_below > e {
                    problems.push(PolicyProblem {
                        line: None,
                        file: file.clone(),
                        item: Some("cascade".into()),
                        message: format!("accept_below ({}) must not exceed escalate_below ({e})", c.accept_below),
                    });
                }
            }
        }
        let routing = merged.routing.take();
        if let Some((file, r)) = &routing {
            check_unit(file, "routing.cpu_max_complexity", r.cpu_max_complexity, &mut problems);
            check_unit(file, "routing.gpu_min_complexity", r.gpu_min_complexity, &mut problems);
        }
        let complexity = merged.complexity.take();
        if let Some((file, c)) = &complexity {
            problems.extend(c.problems().into_iter().map(|message| PolicyProblem {
                line: None,
                file: file.clone(),
                item: Some("complexity".into()),
                message,
            }));
        }
        let cpu = merged.cpu.take();
        if let Some((file, c)) = &cpu {
            check_unit(file, "cpu.max_utilization", c.max_utilization, &mut problems);
        }
        let gpu = merged.gpu.take();
        if let Some((file, g)) = &gpu {
            check_unit(file, "gpu.min_kv_cache_headroom", g.min_kv_cache_headroom, &mut problems);
        }
        let prompt = merged.prompt.take();
        if let Some((file, p)) = &prompt {
            if let Err(message) = p.validate() {
                problems.push(PolicyProblem { line: None, file: file.clone(), item: Some("prompt".into()), message });
            }
        }
        if let Some((file, d)) = &default {
            check_unit(file, "default.score", d.score, &mut problems);
        }
        let rules =
            RuleSet::compile(merged.signals, merged.rules, default.as_ref().map(|(_, d)| d.clone()), &mut problems);
        match (problems.is_empty(), actions, cascade, rules) {
            (true, Some((_, actions)), Some((_, cascade)), Some(rules)) => Ok(Policy {
                version,
                dir: dir.to_path_buf(),
                actions,
                cascade,
                routing: routing.map(|(_, r)| r).unwrap_or_default(),
                complexity: complexity.map(|(_, c)| c).unwrap_or_default(),
                cpu: cpu.map(|(_, c)| c).unwrap_or_default(),
                gpu: gpu.map(|(_, g)| g).unwrap_or_default(),
                prompt: prompt.map(|(_, p)| p),
                rules,
            }),
            _ => Err(PolicyError(problems)),
        }
    }
}

fn check_unit(file: &Path, name: &str, value: f64, problems: &mut Vec<PolicyProblem>) {
    if !(0.0..=1.0).contains(&value) {
        problems.push(PolicyProblem {
            line: None,
            file: file.to_path_buf(),
            item: Some(name.into()),
            message: format!("must be in [0, 1], got {value}"),
        });
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Sections gathered from all files, each remembering the file that defined it.
#[derive(Default)]
struct Merged {
    actions: Option<(PathBuf, ActionThresholds)>,
    cascade: Option<(PathBuf, Cascade)>,
    default: Option<(PathBuf, DefaultVerdict)>,
    routing: Option<(PathBuf, Routing)>,
    complexity: Option<(PathBuf, ComplexitySpec)>,
    cpu: Option<(PathBuf, CpuLimits)>,
    gpu: Option<(PathBuf, GpuLimits)>,
    prompt: Option<(PathBuf, PromptSpec)>,
    signals: Vec<(PathBuf, usize, String, SignalSpec)>,
    rules: Vec<(PathBuf, usize, RuleSpec)>,
}

impl Merged {
    fn add(&mut self, path: &Path, text: &str, file: PolicyFile, problems: &mut Vec<PolicyProblem>) {
        let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
        fn section<T>(
            slot: &mut Option<(PathBuf, T)>,
            path: &Path,
            name: &str,
            value: Option<T>,
            problems: &mut Vec<PolicyProblem>,
        ) {
            let Some(value) = value else { return };
            if let Some((first, _)) = slot {
                problems.push(PolicyProblem {
                    line: None,
                    file: path.to_path_buf(),
                    item: Some(format!("[{name}]")),
                    message: format!("already defined in {}", first.display()),
                });
            } else {
                *slot = Some((path.to_path_buf(), value));
            }
        }
        section(&mut self.actions, path, "actions", file.actions, problems);
        section(&mut self.cascade, path, "cascade", file.cascade, problems);
        section(&mut self.default, path, "default", file.default, problems);
        section(&mut self.routing, path, "routing", file.routing, problems);
        section(&mut self.complexity, path, "complexity", file.complexity, problems);
        section(&mut self.cpu, path, "cpu", file.cpu, problems);
        section(&mut self.gpu, path, "gpu", file.gpu, problems);
        section(&mut self.prompt, path, "prompt", file.prompt, problems);
        for (name, spec) in file.signals {
            let line = line_of(spec.span().start);
            let spec = spec.into_inner();
            if let Some((first, _, _, _)) = self.signals.iter().find(|(_, _, n, _)| *n == name) {
                problems.push(PolicyProblem {
                    line: None,
                    file: path.to_path_buf(),
                    item: Some(format!("signal `{name}`")),
                    message: format!("already defined in {}", first.display()),
                });
            } else {
                self.signals.push((path.to_path_buf(), line, name, spec));
            }
        }
        self.rules
            .extend(file.rules.into_iter().map(|r| (path.to_path_buf(), line_of(r.span().start), r.into_inner())));
    }
}

/// The live policy. Each request takes one snapshot at its start and keeps it to the end,
/// so no request is decided by half of one policy and half of another. A reload builds and
/// validates the new policy off to the side and swaps it in only if it is valid; otherwise the
/// last good one keeps serving and the error is kept for `GET /admin/policy`.
pub struct PolicyStore {
    current: ArcSwap<Policy>,
    dir: PathBuf,
    status: std::sync::Mutex<ReloadStatus>,
}

/// What `GET /admin/policy` shows.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadStatus {
    pub version: String,
    pub dir: PathBuf,
    /// When the current version was loaded, seconds since the Unix epoch.
    pub loaded_at_unix: f64,
    /// The last refused reload's problems, until a reload succeeds.
    pub last_error: Option<Vec<String>>,
    pub last_error_at_unix: Option<f64>,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl PolicyStore {
    pub fn new(policy: Policy) -> Self {
        let status = ReloadStatus {
            version: policy.version.clone(),
            dir: policy.dir.clone(),
            loaded_at_unix: unix_now(),
            last_error: None,
            last_error_at_unix: None,
            reloads_ok: 0,
            reloads_failed: 0,
        };
        PolicyStore {
            dir: policy.dir.clone(),
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
        match Policy::load_dir(&self.dir) {
            Ok(policy) if policy.version == status.version => {
                status.last_error = None;
                Ok(None)
            }
            Ok(policy) => {
                let version = policy.version.clone();
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
