//! From policy files to a [`Policy`]: parsing each file, merging sections across files, checking
//! ranges and required sections, compiling the rules.

use super::scenario::{self, Limits, ScenarioSpec};
use super::sections::{
    ActionThresholds, Calibration, Cascade, CpuLimits, FeaturesModelPolicy, GpuLimits, Routing, Safety,
};
use super::{Policy, PolicyError, PolicyProblem, PromptSpec};
use crate::complexity::ComplexitySpec;
use crate::rules::{self, DefaultVerdict, RuleClasses, RuleSpec, SignalSpec, SpecRef};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One policy file. Every section is optional in a file; across a policy directory,
/// `[actions]`, `[cascade]` and `[default]` must each be defined once.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "tiergate policy file")]
pub(super) struct PolicyFile {
    actions: Option<ActionThresholds>,
    cascade: Option<Cascade>,
    default: Option<DefaultVerdict>,
    routing: Option<Routing>,
    complexity: Option<ComplexitySpec>,
    cpu: Option<CpuLimits>,
    gpu: Option<GpuLimits>,
    prompt: Option<PromptSpec>,
    safety: Option<Safety>,
    features_model: Option<FeaturesModelPolicy>,
    /// The policy's own temperature for the cpu model, in place of the model's.
    calibration: Option<Calibration>,
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, SignalSpec>")]
    signals: BTreeMap<String, toml::Spanned<SignalSpec>>,
    /// Decide when no model verdict stands; the first match decides.
    #[serde(default)]
    #[schemars(with = "Vec<RuleSpec>")]
    rules: Vec<toml::Spanned<RuleSpec>>,
    /// Evaluated on every request; the most severe match can only raise the action.
    #[serde(default)]
    #[schemars(with = "Vec<RuleSpec>")]
    guards: Vec<toml::Spanned<RuleSpec>>,
    /// Explicit exceptions: the first match lowers the action to its own (see `[safety]`).
    #[serde(default)]
    #[schemars(with = "Vec<RuleSpec>")]
    allowlist: Vec<toml::Spanned<RuleSpec>>,
    /// Named variants a `/v1/classify` request may choose (`x-tiergate-scenario`): thresholds,
    /// deadline and the rules that may decide.
    #[serde(default)]
    scenarios: BTreeMap<String, ScenarioSpec>,
}

/// A rule of one class, with the file and line it came from.
type Located = (PathBuf, usize, RuleSpec);

/// Sections gathered from all files, each remembering the file that defined it.
#[derive(Default)]
pub(super) struct Merged {
    actions: Option<(PathBuf, ActionThresholds)>,
    cascade: Option<(PathBuf, Cascade)>,
    default: Option<(PathBuf, DefaultVerdict)>,
    routing: Option<(PathBuf, Routing)>,
    complexity: Option<(PathBuf, ComplexitySpec)>,
    cpu: Option<(PathBuf, CpuLimits)>,
    gpu: Option<(PathBuf, GpuLimits)>,
    prompt: Option<(PathBuf, PromptSpec)>,
    safety: Option<(PathBuf, Safety)>,
    features_model: Option<(PathBuf, FeaturesModelPolicy)>,
    calibration: Option<(PathBuf, Calibration)>,
    signals: Vec<(PathBuf, usize, String, SignalSpec)>,
    rules: Vec<Located>,
    guards: Vec<Located>,
    allowlist: Vec<Located>,
    scenarios: Vec<(PathBuf, String, ScenarioSpec)>,
}

impl Merged {
    pub(super) fn add(&mut self, path: &Path, text: &str, file: PolicyFile, problems: &mut Vec<PolicyProblem>) {
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
        section(&mut self.safety, path, "safety", file.safety, problems);
        section(&mut self.features_model, path, "features_model", file.features_model, problems);
        section(&mut self.calibration, path, "calibration", file.calibration, problems);
        let located = |r: toml::Spanned<RuleSpec>| (path.to_path_buf(), line_of(r.span().start), r.into_inner());
        self.rules.extend(file.rules.into_iter().map(located));
        self.guards.extend(file.guards.into_iter().map(located));
        self.allowlist.extend(file.allowlist.into_iter().map(located));
        scenario::merge(&mut self.scenarios, path, file.scenarios, problems);
    }
}

impl Merged {
    /// Pushes a problem for every required section missing, every value out of range and every
    /// inconsistent pair, in section order. Called only when every file parsed.
    pub(super) fn check(&self, dir: &Path, problems: &mut Vec<PolicyProblem>) {
        let required = [
            ("[actions]", self.actions.is_none()),
            ("[cascade]", self.cascade.is_none()),
            ("[default]", self.default.is_none()),
        ];
        for (what, missing) in required {
            if missing {
                problems.push(PolicyProblem::in_file(dir, None, format!("no file defines {what}")));
            }
        }
        let at = |file: &Path, item: &str, message: String| PolicyProblem::in_file(file, Some(item.into()), message);
        if let Some((file, a)) = &self.actions {
            check_thresholds(file, "actions", a.review_at, a.block_at, problems);
        }
        if let Some((file, f)) = &self.features_model {
            check_thresholds(file, "features_model", f.review_at, f.block_at, problems);
        }
        if let Some((file, c)) = &self.cascade {
            check_cascade(file, c, problems);
        }
        if let Some((file, r)) = &self.routing {
            check_unit(file, "routing.cpu_max_complexity", r.cpu_max_complexity, problems);
            check_unit(file, "routing.gpu_min_complexity", r.gpu_min_complexity, problems);
        }
        if let Some((file, c)) = &self.complexity {
            problems.extend(c.problems().into_iter().map(|m| at(file, "complexity", m)));
        }
        if let Some((file, c)) = &self.cpu {
            check_unit(file, "cpu.max_utilization", c.max_utilization, problems);
            check_unit(file, "cpu.max_queue_wait_share", c.max_queue_wait_share, problems);
        }
        if let Some((file, g)) = &self.gpu {
            check_unit(file, "gpu.min_kv_cache_headroom", g.min_kv_cache_headroom, problems);
            check_unit(file, "gpu.kv_cache_hysteresis", g.kv_cache_hysteresis, problems);
        }
        if let Some((file, Err(message))) = self.prompt.as_ref().map(|(f, p)| (f, p.validate())) {
            problems.push(at(file, "prompt", message));
        }
        if let Some((file, d)) = &self.default {
            check_unit(file, "default.score", d.score, problems);
        }
        if let Some((file, Some(t))) = self.calibration.as_ref().map(|(f, c)| (f, c.cpu_temperature)) {
            if !(t.is_finite() && t > 0.0) {
                problems.push(at(file, "calibration.cpu_temperature", format!("must be a finite number > 0, got {t}")));
            }
        }
    }

    /// Compiles the rules and assembles the policy, or returns every problem found.
    pub(super) fn build(
        self,
        version: String,
        dir: &Path,
        limits: &Limits,
        mut problems: Vec<PolicyProblem>,
    ) -> Result<Policy, PolicyError> {
        let locate = |at: SpecRef| match at {
            SpecRef::Signal(i) => (&self.signals[i].0, self.signals[i].1),
            SpecRef::Rule(i) => (&self.rules[i].0, self.rules[i].1),
            SpecRef::Guard(i) => (&self.guards[i].0, self.guards[i].1),
            SpecRef::Allow(i) => (&self.allowlist[i].0, self.allowlist[i].1),
        };
        let signals = self.signals.iter().map(|(_, _, name, spec)| (name.clone(), spec.clone())).collect();
        let specs = |class: &[Located]| class.iter().map(|(_, _, spec)| spec.clone()).collect();
        let classes =
            RuleClasses { rules: specs(&self.rules), guards: specs(&self.guards), allowlist: specs(&self.allowlist) };
        let (rules, rule_problems) = rules::compile(signals, classes, self.default.as_ref().map(|(_, d)| d.clone()));
        problems.extend(rule_problems.into_iter().map(|p| {
            let (file, line) = locate(p.at);
            PolicyProblem { file: file.clone(), line: Some(line), item: Some(p.item), message: p.message }
        }));
        let scenarios = match (&self.actions, &rules) {
            (Some((_, actions)), Some(rules)) => {
                scenario::resolve(&self.scenarios, actions, rules, limits, &mut problems)
            }
            _ => Default::default(),
        };
        match (problems.is_empty(), self.actions, self.cascade, rules) {
            (true, Some((_, actions)), Some((_, cascade)), Some(rules)) => Ok(Policy {
                version,
                dir: dir.to_path_buf(),
                actions,
                cascade,
                routing: self.routing.map(|(_, r)| r).unwrap_or_default(),
                complexity: self.complexity.map(|(_, c)| c).unwrap_or_default(),
                cpu: self.cpu.map(|(_, c)| c).unwrap_or_default(),
                gpu: self.gpu.map(|(_, g)| g).unwrap_or_default(),
                prompt: self.prompt.map(|(_, p)| p),
                safety: self.safety.map(|(_, s)| s).unwrap_or_default(),
                features_model: self.features_model.map(|(_, f)| f).unwrap_or_default(),
                calibration: self.calibration.map(|(_, c)| c).unwrap_or_default(),
                rules,
                scenarios,
            }),
            _ => Err(PolicyError(problems)),
        }
    }
}

/// `[cascade]`'s ranges and combinations.
fn check_cascade(file: &Path, c: &Cascade, problems: &mut Vec<PolicyProblem>) {
    let at = |item: &str, message: String| PolicyProblem::in_file(file, Some(item.into()), message);
    check_unit(file, "cascade.accept_below", c.accept_below, problems);
    if let Some(r) = c.accept_risk_below {
        // Below accept_below it has no effect (the higher applies): no error, so that raising
        // accept_below alone stays valid.
        check_unit(file, "cascade.accept_risk_below", r, problems);
    }
    check_unit(file, "cascade.ood_above", c.ood_above, problems);
    check_unit(file, "cascade.confirm_at", c.confirm_at, problems);
    if let Some(from) = c.confirm_from {
        check_unit(file, "cascade.confirm_from", from, problems);
        let stands = c.accept_below_for(1.0);
        if from >= stands {
            let message = format!(
                "confirm_from ({from}) must be below the confidence a risk verdict needs to stand \
                 ({stands}, accept_risk_below or accept_below): a verdict there stands unconfirmed"
            );
            problems.push(at("cascade.confirm_from", message));
        }
    }
    for (guess, served) in &c.language_neighbours {
        if !c.model_languages.contains(served) {
            let message = format!(
                "language_neighbours reads `{guess}` as `{served}`, which is not in model_languages ({})",
                c.model_languages.join(", ")
            );
            problems.push(at("cascade.language_neighbours", message));
        }
    }
    if let Some(e) = c.escalate_below {
        check_unit(file, "cascade.escalate_below", e, problems);
        if c.accept_below > e {
            problems
                .push(at("cascade", format!("accept_below ({}) must not exceed escalate_below ({e})", c.accept_below)));
        }
    }
}

/// `review_at` and `block_at` of section `name`: each in [0, 1], review at or below block.
fn check_thresholds(file: &Path, name: &str, review_at: f64, block_at: f64, problems: &mut Vec<PolicyProblem>) {
    check_unit(file, &format!("{name}.review_at"), review_at, problems);
    check_unit(file, &format!("{name}.block_at"), block_at, problems);
    if review_at > block_at {
        let message = format!("review_at ({review_at}) must not exceed block_at ({block_at})");
        problems.push(PolicyProblem::in_file(file, Some(name.into()), message));
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

pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
