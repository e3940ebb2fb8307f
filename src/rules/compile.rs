//! Compiling rule specs into a [`RuleSet`]: every regex and CEL program is built, every rule
//! is checked (unknown variables and signals, scores, a dry run on an empty request), and every
//! problem is reported at once, located by the spec it came from.

use super::spec::{DefaultVerdict, RuleSpec, SignalSpec};
use super::{context, Rule, RuleSet, RulesInput, Signal};
use crate::text::Obfuscation;
use cel::{Env, Program, Value};
use regex::{Regex, RegexSet};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Which spec a problem is in: an index into the `signals` or a class of [`RuleClasses`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecRef {
    Signal(usize),
    Rule(usize),
    Guard(usize),
    Allow(usize),
}

/// The three rule classes, as written.
#[derive(Debug, Clone, Default)]
pub struct RuleClasses {
    pub rules: Vec<RuleSpec>,
    pub guards: Vec<RuleSpec>,
    pub allowlist: Vec<RuleSpec>,
}

/// One problem in a rule spec.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleProblem {
    pub at: SpecRef,
    /// `signal `NAME`` or `rule `NAME``.
    pub item: String,
    pub message: String,
}

/// Compiles signals and the three rule classes. The set is `Some` only when there was no
/// problem and a default verdict is given (a missing `[default]` is the caller's to report).
pub fn compile(
    signals: Vec<(String, SignalSpec)>,
    classes: RuleClasses,
    default: Option<DefaultVerdict>,
) -> (Option<RuleSet>, Vec<RuleProblem>) {
    let env = Arc::new(Env::stdlib());
    let mut problems = Vec::new();
    let signals: Vec<Signal> = signals
        .into_iter()
        .enumerate()
        .map(|(i, (name, spec))| compile_signal(i, name, &spec, &mut problems))
        .collect();
    let names: Vec<String> = signals.iter().map(|s| s.name.clone()).collect();
    let mut class = |specs: Vec<RuleSpec>, at: fn(usize) -> SpecRef, what: &str| {
        compile_class(&env, specs, &names, at, what, &mut problems)
    };
    let rules = class(classes.rules, SpecRef::Rule, "rule");
    let guards = class(classes.guards, SpecRef::Guard, "guard");
    let allowlist = class(classes.allowlist, SpecRef::Allow, "allowlist entry");
    match default {
        Some(default) if problems.is_empty() => {
            let prefilter = RegexSet::new(signals.iter().flat_map(|s| s.patterns.iter().map(Regex::as_str))).ok();
            (Some(RuleSet { env, signals, prefilter, rules, guards, allowlist, default }), problems)
        }
        _ => (None, problems),
    }
}

/// Compiles one class of rules; names must be unique within the class.
fn compile_class(
    env: &Arc<Env>,
    specs: Vec<RuleSpec>,
    signals: &[String],
    at: fn(usize) -> SpecRef,
    what: &str,
    problems: &mut Vec<RuleProblem>,
) -> Vec<Rule> {
    let mut compiled: Vec<Rule> = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let mut report = |message: String| {
            problems.push(RuleProblem { at: at(i), item: format!("{what} `{}`", spec.name), message })
        };
        if compiled.iter().any(|r| r.name == spec.name) {
            report(format!("duplicate {what} name"));
        }
        if let Some(program) = compile_rule(env, &spec, signals, &mut report) {
            compiled.push(Rule { name: spec.name, program, action: spec.action, score: spec.score });
        }
    }
    compiled
}

fn compile_signal(i: usize, name: String, spec: &SignalSpec, problems: &mut Vec<RuleProblem>) -> Signal {
    let mut report = |message: String| {
        problems.push(RuleProblem { at: SpecRef::Signal(i), item: format!("signal `{name}`"), message })
    };
    if spec.patterns.is_empty() {
        report("needs at least one pattern".into());
    }
    let mut patterns = Vec::new();
    for p in &spec.patterns {
        // Folded as the text is (`count_signals`): a pattern in either Chinese script matches both.
        match Regex::new(&crate::text::han::fold_script(p)) {
            Ok(r) => patterns.push(r),
            Err(e) => report(format!("bad regex `{p}`: {}", e.to_string().lines().last().unwrap_or_default().trim())),
        }
    }
    Signal { name, patterns }
}

/// The rule's program, checked; `None` when its CEL does not compile.
fn compile_rule(
    env: &Arc<Env>,
    spec: &RuleSpec,
    signals: &[String],
    report: &mut impl FnMut(String),
) -> Option<Program> {
    if !(0.0..=1.0).contains(&spec.score) {
        report(format!("score must be in [0, 1], got {}", spec.score));
    }
    let program = match env.compile(&spec.when) {
        Ok(p) => p,
        Err(e) => {
            report(format!("bad CEL in `when`: {}", e.to_string().trim()));
            return None;
        }
    };
    let mut found = false;
    let mut problem = |message: String| {
        found = true;
        report(message)
    };
    for var in program.references().variables() {
        if !matches!(var, "signals" | "features" | "tenant" | "text_len" | "lang" | "obfuscation" | "model") {
            problem(format!("unknown variable `{var}`"));
        }
    }
    // A misspelt signal would read as a missing key at run time and never match.
    for name in SIGNAL_REF.captures_iter(&spec.when).map(|c| c[1].to_string()) {
        if !signals.contains(&name) {
            problem(format!("unknown signal `{name}`; defined: {}", signals.join(", ")));
        }
    }
    if !found {
        if let Some(message) = dry_run(env, &program, signals) {
            report(message);
        }
    }
    Some(program)
}

/// Runs a rule on an empty request (every signal 0, no features, no model): a type error shows
/// here; a missing feature or model field is expected and fine.
fn dry_run(env: &Arc<Env>, program: &Program, signals: &[String]) -> Option<String> {
    let zeros: BTreeMap<String, i64> = signals.iter().map(|n| (n.clone(), 0)).collect();
    let no_features = serde_json::Map::new();
    let none = Obfuscation::default();
    let input = RulesInput {
        text: "",
        lang: "und",
        obfuscation: &none,
        signals: &zeros,
        features: &no_features,
        tenant: None,
        model: None,
    };
    match program.execute(&context(env, &input)) {
        Ok(Value::Bool(_)) | Err(cel::ExecutionError::NoSuchKey(_)) => None,
        Ok(other) => Some(format!("`when` must evaluate to a bool, got {other:?}")),
        Err(e) => Some(format!("`when` fails on an empty request: {e}")),
    }
}

/// `signals.NAME` in a rule's source.
static SIGNAL_REF: std::sync::LazyLock<Regex> =
    std::sync::LazyLock::new(|| Regex::new(r"\bsignals\.([A-Za-z_][A-Za-z0-9_]*)").expect("valid regex"));
