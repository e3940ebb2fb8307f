//! The rules engine: named text signals (regex match counts) and CEL rules over them, in three
//! classes:
//!
//! - `[[rules]]` decide when the models are unsure, overloaded, failing or out of time, the
//!   first match in order;
//! - `[[guards]]` are evaluated on every request, whoever decided; the most severe match can only
//!   raise the action (a hard rule a confident model cannot talk around);
//! - `[[allowlist]]` entries, explicitly named, may lower an action where the policy says so.
//!
//! This stage never fails and never waits: a rule whose evaluation errors (a missing feature, a
//! type mismatch) does not match, and the error is reported with the verdict so the caller can
//! count it and apply the policy's `on_rule_error`.
//!
//! Variables a rule sees (CEL, <https://github.com/google/cel-spec>):
//! - `signals`: map signal name -> int, the match count of every signal (zero included);
//! - `features`: the request's `features` object (JSON numbers: integers as `int`, others `double`);
//! - `tenant`: string (`""` when absent); `text_len`: int, bytes;
//! - `lang`: the text's language, ISO 639-3 (`"eng"`, `"fra"`, ...), `"und"` when unsure;
//! - `obfuscation`: map of what canonicalisation undid (int counts): `invisible_chars`,
//!   `smuggled_chars` (invisible characters that carried decoded text), `mixed_script_words`, `confusable_chars`, `defanged_links`, `html_entities`,
//!   `padded_han_chars` (Chinese characters padded apart with spaces or symbols, joined again),
//!   `split_chars` (characters split apart by one separator each, `s|e|n|d`, joined again);
//! - `model`: map with `available` (bool) and, when a model answered, `risk_score`,
//!   `confidence`, `ood_score` (double) — the unsure verdict that sent the request here;
//! - `features_model`: map with `available` (bool) and, when the features model scored the
//!   request's features, `risk` (double, calibrated).
//! - `campaign`, `entity`: the request's campaign and entity velocity ([`crate::campaign::cel`]).

mod compile;
mod read;
mod spec;

pub use compile::{compile, RuleClasses, RuleProblem, SpecRef};
pub use spec::{DefaultVerdict, RuleSpec, SignalSpec};

use crate::action::Action;
use crate::text::Obfuscation;
use cel::common::types::{CelInt, CelMap, CelMapKey};
use cel::common::value::Val;
use cel::objects::{Key, Map};
use cel::{Context, Env, Program, Value};
pub use read::TextFacts;
use regex::{Regex, RegexSet};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

struct Signal {
    name: String,
    patterns: Vec<Regex>,
}

struct Rule {
    name: String,
    program: Program,
    /// The variables its `when` reads.
    vars: Vars,
    action: Action,
    score: f64,
}

/// The variables a rule may read (the module doc), in one place: compiling checks a rule's
/// references against it, and a request's context binds only those its class reads.
const VARIABLES: [&str; 10] = [
    "signals",
    "features",
    "tenant",
    "text_len",
    "lang",
    "obfuscation",
    "model",
    "features_model",
    "campaign",
    "entity",
];

/// A set of [`VARIABLES`], one bit each in their order. Binding only what a class reads saves
/// converting the others into CEL values on every request (the unread campaign and entity maps
/// alone are ~60 values): `cargo bench --bench request_path -- rules/guards` (docs/BENCHMARKS.md).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Vars(u16);

impl Vars {
    const ALL: Vars = Vars((1 << VARIABLES.len()) - 1);

    /// The set of the one variable `name`; `None` for a name that is not a variable.
    fn of(name: &str) -> Option<Vars> {
        VARIABLES.iter().position(|v| *v == name).map(|i| Vars(1 << i))
    }

    fn of_rules(rules: &[Rule]) -> Vars {
        rules.iter().fold(Vars::default(), |all, r| all.union(r.vars))
    }

    fn union(self, other: Vars) -> Vars {
        Vars(self.0 | other.0)
    }

    fn has(self, name: &str) -> bool {
        Vars::of(name).is_some_and(|v| self.0 & v.0 != 0)
    }
}

/// A compiled rule set. Building the CEL `Env` once and sharing it keeps an evaluation near
/// a microsecond (a fresh default context per request costs ~15 µs; DESIGN.md).
pub struct RuleSet {
    env: Arc<Env>,
    signals: Vec<Signal>,
    /// Every signal pattern in one automaton, in signal order: one pass over the text says which
    /// patterns match at all, and only those are run again to count their matches (the pattern
    /// the `regex` crate's `RegexSet` documentation gives). `None` when the set would exceed the
    /// regex size limit; then every pattern is counted on its own.
    prefilter: Option<RegexSet>,
    rules: Vec<Rule>,
    guards: Vec<Rule>,
    allowlist: Vec<Rule>,
    /// What `rules` read; what guards and the allow-list read (one context serves both).
    rule_vars: Vars,
    guard_vars: Vars,
    default: DefaultVerdict,
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleSet").field("signals", &self.signals.len()).field("rules", &self.rules.len()).finish()
    }
}

/// The model's view, when a model tier answered before rules were consulted.
#[derive(Debug, Clone, Copy)]
pub struct ModelView {
    pub risk_score: f64,
    pub confidence: f64,
    /// Absent for backends without an embedding.
    pub ood_score: Option<f64>,
}

/// What the rules see of one request.
pub struct RulesInput<'a> {
    /// The canonical text (see [`crate::text::canonicalize`]).
    pub text: &'a str,
    /// ISO 639-3, or "und".
    pub lang: &'a str,
    /// What canonicalisation undid.
    pub obfuscation: &'a Obfuscation,
    /// Match counts of every signal over `text` ([`RuleSet::count_signals`], computed once per request).
    pub signals: &'a BTreeMap<String, i64>,
    pub features: &'a serde_json::Map<String, serde_json::Value>,
    pub tenant: Option<&'a str>,
    pub model: Option<ModelView>,
    /// The features model's calibrated risk, when it scored the request.
    pub features_model: Option<f64>,
    /// Campaign and entity velocity (`None`: campaigns off, or a text outside a request).
    pub campaign: Option<&'a crate::campaign::Velocity>,
}

/// The rules' verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleVerdict {
    /// The rule that matched; `None` when the policy's `[default]` applied.
    pub rule: Option<String>,
    pub action: Action,
    pub risk_score: f64,
    /// Signals with at least one match.
    pub signals: BTreeMap<String, i64>,
    /// Rules whose evaluation failed, with the error (they count as not matching).
    pub errors: Vec<(String, String)>,
}

/// What a guard or allow-list evaluation found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassVerdict {
    /// The matching entry (for guards: the most severe, the first among equals): name, action, score.
    pub matched: Option<(String, Action, f64)>,
    /// Entries whose evaluation failed, with the error.
    pub errors: Vec<(String, String)>,
}

impl RuleSet {
    /// Match counts of every signal over `text`, read with Traditional Chinese folded to
    /// Simplified and Chinese digit runs as ASCII digits ([`crate::text::han::fold`], as the
    /// patterns were when they compiled), so one pattern matches both scripts.
    pub fn count_signals(&self, text: &str) -> BTreeMap<String, i64> {
        let text = &*crate::text::han::fold(text);
        let matched = self.prefilter.as_ref().map(|set| set.matches(text));
        let mut index = 0..;
        self.signals
            .iter()
            .map(|s| {
                let count = (s.patterns.iter().zip(&mut index))
                    .filter(|(_, i)| matched.as_ref().is_none_or(|m| m.matched(*i)))
                    .map(|(p, _)| p.find_iter(text).count() as i64)
                    .sum();
                (s.name.clone(), count)
            })
            .collect()
    }

    /// Evaluates the rules in order; the first match decides, else the default applies.
    pub fn evaluate(&self, input: &RulesInput<'_>) -> RuleVerdict {
        self.evaluate_subset(input, None)
    }

    /// [`RuleSet::evaluate`] over the rules `only` allows (one flag per rule, in order, as a
    /// scenario's `rules` resolve; `None`: every rule).
    pub fn evaluate_subset(&self, input: &RulesInput<'_>, only: Option<&[bool]>) -> RuleVerdict {
        let ctx = context(&self.env, input, self.rule_vars);
        let mut errors = Vec::new();
        let mut decided = None;
        let allowed = |i: &usize| only.is_none_or(|mask| mask.get(*i).copied().unwrap_or(false));
        for rule in self.rules.iter().enumerate().filter(|(i, _)| allowed(i)).map(|(_, r)| r) {
            match rule.program.execute(&ctx) {
                Ok(Value::Bool(true)) => {
                    decided = Some(rule);
                    break;
                }
                Ok(Value::Bool(false)) => {}
                Ok(other) => errors.push((rule.name.clone(), format!("evaluated to {other:?}, not a bool"))),
                Err(e) => errors.push((rule.name.clone(), e.to_string())),
            }
        }
        let signals = input.signals.iter().filter(|(_, n)| **n > 0).map(|(k, n)| (k.clone(), *n)).collect();
        match decided {
            Some(rule) => RuleVerdict {
                rule: Some(rule.name.clone()),
                action: rule.action,
                risk_score: rule.score,
                signals,
                errors,
            },
            None => {
                RuleVerdict { rule: None, action: self.default.action, risk_score: self.default.score, signals, errors }
            }
        }
    }

    /// Every guard, on every request: the most severe match, which can only raise an action.
    pub fn guard(&self, input: &RulesInput<'_>) -> ClassVerdict {
        self.guard_stage(input).0
    }

    /// The guards' verdict and the allow-list's (its first match, which may lower an action),
    /// over one context: the stage that runs after the cascade on every request.
    pub fn guard_stage(&self, input: &RulesInput<'_>) -> (ClassVerdict, ClassVerdict) {
        let ctx = context(&self.env, input, self.guard_vars);
        let mut guard = ClassVerdict::default();
        for entry in &self.guards {
            if evaluate_entry(entry, &ctx, &mut guard.errors)
                && guard.matched.as_ref().is_none_or(|(_, action, _)| entry.action > *action)
            {
                guard.matched = Some((entry.name.clone(), entry.action, entry.score));
            }
        }
        let mut allow = ClassVerdict::default();
        for entry in &self.allowlist {
            if evaluate_entry(entry, &ctx, &mut allow.errors) {
                allow.matched = Some((entry.name.clone(), entry.action, entry.score));
                break;
            }
        }
        (guard, allow)
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    pub fn guard_count(&self) -> usize {
        self.guards.len()
    }

    /// The position of the `[[rules]]` entry named `name`, in evaluation order.
    pub fn rule_index(&self, name: &str) -> Option<usize> {
        self.rules.iter().position(|r| r.name == name)
    }

    /// Whether a `[[guards]]` entry is named `name`.
    pub fn is_guard(&self, name: &str) -> bool {
        self.guards.iter().any(|r| r.name == name)
    }
}

/// Whether `entry` matches in `ctx`; an evaluation error, or a value that is not a bool, is
/// pushed to `errors` and counts as no match.
fn evaluate_entry(entry: &Rule, ctx: &Context<'_, '_>, errors: &mut Vec<(String, String)>) -> bool {
    match entry.program.execute(ctx) {
        Ok(Value::Bool(matched)) => matched,
        Ok(other) => {
            errors.push((entry.name.clone(), format!("evaluated to {other:?}, not a bool")));
            false
        }
        Err(e) => {
            errors.push((entry.name.clone(), e.to_string()));
            false
        }
    }
}

/// The CEL variables of one request (see the module doc), those in `vars` only. `signals` is
/// built as CEL's own map over the request's names, borrowed, not copied: it has an entry per
/// signal and is read by most guards.
fn context<'a>(env: &Arc<Env>, input: &RulesInput<'a>, vars: Vars) -> Context<'a, 'a> {
    let mut ctx = Context::with_env(Arc::clone(env));
    let mut bind = |name: &'static str, value: &dyn Fn() -> Value| {
        if vars.has(name) {
            ctx.add_variable_from_value(name, value());
        }
    };
    bind("features", &|| json_object_to_cel(input.features));
    bind("tenant", &|| Value::from(input.tenant.unwrap_or("")));
    bind("text_len", &|| Value::Int(input.text.len() as i64));
    bind("lang", &|| Value::from(input.lang));
    bind("obfuscation", &|| {
        let o = input.obfuscation;
        cel_map([
            ("invisible_chars", Value::Int(o.invisible_chars as i64)),
            ("smuggled_chars", Value::Int(o.smuggled_chars as i64)),
            ("mixed_script_words", Value::Int(o.mixed_script_words as i64)),
            ("confusable_chars", Value::Int(o.confusable_chars as i64)),
            ("defanged_links", Value::Int(o.defanged_links as i64)),
            ("html_entities", Value::Int(o.html_entities as i64)),
            ("padded_han_chars", Value::Int(o.padded_han_chars as i64)),
            ("split_chars", Value::Int(o.split_chars as i64)),
        ])
    });
    bind("model", &|| {
        let available = std::iter::once(("available", Value::Bool(input.model.is_some())));
        let m = input.model.into_iter().flat_map(|m| {
            let ood = m.ood_score.map(|ood| ("ood_score", Value::Float(ood)));
            [("risk_score", Value::Float(m.risk_score)), ("confidence", Value::Float(m.confidence))]
                .into_iter()
                .chain(ood)
        });
        cel_map(available.chain(m))
    });
    bind("features_model", &|| {
        let available = std::iter::once(("available", Value::Bool(input.features_model.is_some())));
        cel_map(available.chain(input.features_model.map(|risk| ("risk", Value::Float(risk)))))
    });
    if vars.has("campaign") || vars.has("entity") {
        let (campaign, entity) = crate::campaign::cel::variables(input.campaign);
        bind("campaign", &|| campaign.clone());
        bind("entity", &|| entity.clone());
    }
    if vars.has("signals") {
        let signals = input
            .signals
            .iter()
            .map(|(name, count)| (CelMapKey::from(name.as_str()), Box::new(CelInt::from(*count)) as Box<dyn Val + 'a>));
        ctx.add_variable_as_val("signals", Box::new(CelMap::from(signals.collect::<HashMap<_, _>>())));
    }
    ctx
}

fn cel_map(entries: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Map(Map { map: Arc::new(entries.into_iter().map(|(k, v)| (Key::from(k), v)).collect()) })
}

/// JSON -> CEL with integers as `int` (CEL integer literals are `int`, so `features.amount > 10000`
/// must compare int with int; serde would give `uint`).
fn json_to_cel(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::List(Arc::new(a.iter().map(json_to_cel).collect())),
        serde_json::Value::Object(o) => json_object_to_cel(o),
    }
}

fn json_object_to_cel(o: &serde_json::Map<String, serde_json::Value>) -> Value {
    let map: HashMap<Key, Value> = o.iter().map(|(k, v)| (Key::from(k.as_str()), json_to_cel(v))).collect();
    Value::Map(Map { map: Arc::new(map) })
}

#[cfg(test)]
mod chinese_tests;

#[cfg(test)]
mod tests;
