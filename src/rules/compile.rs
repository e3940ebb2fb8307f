//! Compiling rule specs into a [`RuleSet`]: every regex and CEL program is built, every rule
//! is checked (unknown variables and signals, scores, a dry run on an empty request), and every
//! problem is reported at once, located by the spec it came from.

use super::spec::{DefaultVerdict, RuleSpec, SignalSpec};
use super::{context, Rule, RuleSet, RulesInput, Signal, Vars, VARIABLES};
use crate::text::Obfuscation;
use cel::{Env, Program, Value};
use regex::{Regex, RegexSetBuilder};
use regex_syntax::hir::{Hir, HirKind, Look};
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
            let prefilter = RegexSetBuilder::new(
                signals.iter().flat_map(|s| s.patterns.iter().map(|p| prefilter_form(p.as_str()))),
            )
            .dfa_size_limit(PREFILTER_DFA_BYTES)
            .build()
            .ok();
            let rule_vars = Vars::of_rules(&rules);
            let guard_vars = Vars::of_rules(&guards).union(Vars::of_rules(&allowlist));
            let set = RuleSet { env, signals, prefilter, rules, guards, allowlist, rule_vars, guard_vars, default };
            (Some(set), problems)
        }
        _ => (None, problems),
    }
}

/// The prefilter's lazy DFA cache, per thread that searches with it (the regex crate's default is
/// 2 MiB). The bundled signals are many Unicode case-insensitive patterns: over a stream of varied
/// multilingual texts a 2 MiB cache fills, is cleared again and again, and the search gives up to
/// the PikeVM. `cargo bench --bench request_path -- text/stream_ml5/count_signals` over blind set
/// ml5's 777 messages: 1.4 ms per text at 2 MiB, 0.43 ms at 8, 55 µs at 16, 52 µs at 32
/// (docs/BENCHMARKS.md). The memory is only taken as states are built.
const PREFILTER_DFA_BYTES: usize = 16 << 20;

/// A signal pattern as the prefilter `RegexSet` runs it: without its word-boundary assertions
/// (`\b`, `\B`, `\b{start}`, ...). An assertion only removes matches, so this form matches
/// wherever the pattern does and the prefilter stays a superset (`RuleSet::count_signals` counts
/// with the exact patterns). Unicode word boundaries are what the regex crate's lazy DFA cannot
/// run on non-ASCII text: with them the set falls back to the PikeVM, the runtime's hottest
/// function under load in docs/BENCHMARKS.md's profile. A pattern regex-syntax cannot parse (it
/// compiled, so none) is kept as it is.
fn prefilter_form(pattern: &str) -> String {
    match regex_syntax::Parser::new().parse(pattern) {
        Ok(hir) => without_word_boundaries(hir).to_string(),
        Err(_) => pattern.to_string(),
    }
}

fn without_word_boundaries(hir: Hir) -> Hir {
    match hir.into_kind() {
        HirKind::Look(look)
            if !matches!(
                look,
                Look::Start | Look::End | Look::StartLF | Look::EndLF | Look::StartCRLF | Look::EndCRLF
            ) =>
        {
            Hir::empty()
        }
        HirKind::Look(look) => Hir::look(look),
        HirKind::Empty => Hir::empty(),
        HirKind::Literal(literal) => Hir::literal(literal.0),
        HirKind::Class(class) => Hir::class(class),
        HirKind::Repetition(mut repetition) => {
            repetition.sub = Box::new(without_word_boundaries(*repetition.sub));
            Hir::repetition(repetition)
        }
        HirKind::Capture(mut capture) => {
            capture.sub = Box::new(without_word_boundaries(*capture.sub));
            Hir::capture(capture)
        }
        HirKind::Concat(subs) => Hir::concat(subs.into_iter().map(without_word_boundaries).collect()),
        HirKind::Alternation(subs) => Hir::alternation(subs.into_iter().map(without_word_boundaries).collect()),
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
        if let Some((program, vars)) = compile_rule(env, &spec, signals, &mut report) {
            compiled.push(Rule { name: spec.name, program, vars, action: spec.action, score: spec.score });
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
) -> Option<(Program, Vars)> {
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
    let mut vars = Vars::default();
    for var in program.references().variables() {
        match Vars::of(var) {
            Some(v) => vars = vars.union(v),
            None => problem(format!("unknown variable `{var}`; defined: {}", VARIABLES.join(", "))),
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
    Some((program, vars))
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
        features_model: None,
        campaign: None,
    };
    let ctx = context(env, &input, Vars::ALL);
    let result = program.execute(&ctx);
    match result {
        Ok(Value::Bool(_)) | Err(cel::ExecutionError::NoSuchKey(_)) => None,
        Ok(other) => Some(format!("`when` must evaluate to a bool, got {other:?}")),
        Err(e) => Some(format!("`when` fails on an empty request: {e}")),
    }
}

/// `signals.NAME` in a rule's source.
static SIGNAL_REF: std::sync::LazyLock<Regex> =
    std::sync::LazyLock::new(|| Regex::new(r"\bsignals\.([A-Za-z_][A-Za-z0-9_]*)").expect("valid regex"));

#[cfg(test)]
mod prefilter_tests {
    use super::prefilter_form;
    use regex::Regex;

    #[test]
    fn the_prefilter_form_drops_word_boundaries_keeps_anchors_and_matches_wherever_the_pattern_does() {
        let patterns =
            [r"(?i)\b(?:password|otp)\b", r"\bhttps?://\S+", r"^\d{4}\B", r"(?i)\bcvv\b|密码", r"\b{start}gift"];
        let texts = [
            "Your OTP is 1234",
            "передайте password сейчас",
            "xpasswordy",
            "see http://a.b/c",
            "您的密码",
            "1234567",
            "12 34",
            "CVV: 123",
            "a giftcard",
        ];
        for pattern in patterns {
            let form = prefilter_form(pattern);
            assert!(!form.contains(r"\b") && !form.contains(r"\B"), "{pattern} -> {form}");
            let (exact, loose) = (Regex::new(pattern).unwrap(), Regex::new(&form).unwrap());
            for text in texts {
                assert!(!exact.is_match(text) || loose.is_match(text), "{pattern} -> {form} misses {text:?}");
            }
        }
        let anchored = Regex::new(&prefilter_form(r"^\d{4}\B")).unwrap();
        assert!(anchored.is_match("12345") && !anchored.is_match("x12345"), "the anchor still holds");
    }
}
