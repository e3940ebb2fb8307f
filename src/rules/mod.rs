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
//!   `padded_han_chars` (Chinese characters padded apart with spaces or symbols, joined again);
//! - `model`: map with `available` (bool) and, when a model answered, `risk_score`,
//!   `confidence`, `ood_score` (double) — the unsure verdict that sent the request here;
//! - `campaign`, `entity`: the request's campaign and entity velocity ([`crate::campaign::cel`]).

mod compile;
mod read;
mod spec;

pub use compile::{compile, RuleClasses, RuleProblem, SpecRef};
pub use spec::{DefaultVerdict, RuleSpec, SignalSpec};

use crate::action::Action;
use crate::text::Obfuscation;
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
    action: Action,
    score: f64,
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
        let ctx = context(&self.env, input);
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
        let ctx = context(&self.env, input);
        let mut verdict = ClassVerdict::default();
        for guard in &self.guards {
            match guard.program.execute(&ctx) {
                Ok(Value::Bool(true)) => {
                    if verdict.matched.as_ref().is_none_or(|(_, action, _)| guard.action > *action) {
                        verdict.matched = Some((guard.name.clone(), guard.action, guard.score));
                    }
                }
                Ok(Value::Bool(false)) => {}
                Ok(other) => verdict.errors.push((guard.name.clone(), format!("evaluated to {other:?}, not a bool"))),
                Err(e) => verdict.errors.push((guard.name.clone(), e.to_string())),
            }
        }
        verdict
    }

    /// The first allow-list entry that matches, if any.
    pub fn allowlisted(&self, input: &RulesInput<'_>) -> ClassVerdict {
        let ctx = context(&self.env, input);
        let mut verdict = ClassVerdict::default();
        for entry in &self.allowlist {
            match entry.program.execute(&ctx) {
                Ok(Value::Bool(true)) => {
                    verdict.matched = Some((entry.name.clone(), entry.action, entry.score));
                    break;
                }
                Ok(Value::Bool(false)) => {}
                Ok(other) => verdict.errors.push((entry.name.clone(), format!("evaluated to {other:?}, not a bool"))),
                Err(e) => verdict.errors.push((entry.name.clone(), e.to_string())),
            }
        }
        verdict
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

/// The CEL variables of one request (see the module doc).
fn context<'a>(env: &Arc<Env>, input: &RulesInput<'_>) -> Context<'a, 'a> {
    let mut ctx = Context::with_env(Arc::clone(env));
    let signal_map: HashMap<Key, Value> =
        input.signals.iter().map(|(k, v)| (Key::from(k.as_str()), Value::Int(*v))).collect();
    ctx.add_variable_from_value("signals", Value::Map(Map { map: Arc::new(signal_map) }));
    ctx.add_variable_from_value("features", json_object_to_cel(input.features));
    ctx.add_variable_from_value("tenant", Value::from(input.tenant.unwrap_or("")));
    ctx.add_variable_from_value("text_len", Value::Int(input.text.len() as i64));
    ctx.add_variable_from_value("lang", Value::from(input.lang));
    let o = input.obfuscation;
    let counts = [
        ("invisible_chars", o.invisible_chars),
        ("smuggled_chars", o.smuggled_chars),
        ("mixed_script_words", o.mixed_script_words),
        ("confusable_chars", o.confusable_chars),
        ("defanged_links", o.defanged_links),
        ("html_entities", o.html_entities),
        ("padded_han_chars", o.padded_han_chars),
    ];
    let counts: HashMap<Key, Value> = counts.iter().map(|(k, v)| (Key::from(*k), Value::Int(*v as i64))).collect();
    ctx.add_variable_from_value("obfuscation", Value::Map(Map { map: Arc::new(counts) }));
    let mut model: HashMap<Key, Value> = HashMap::new();
    model.insert(Key::from("available"), Value::Bool(input.model.is_some()));
    if let Some(m) = input.model {
        model.insert(Key::from("risk_score"), Value::Float(m.risk_score));
        model.insert(Key::from("confidence"), Value::Float(m.confidence));
        if let Some(ood) = m.ood_score {
            model.insert(Key::from("ood_score"), Value::Float(ood));
        }
    }
    ctx.add_variable_from_value("model", Value::Map(Map { map: Arc::new(model) }));
    let (campaign, entity) = crate::campaign::cel::variables(input.campaign);
    ctx.add_variable_from_value("campaign", campaign);
    ctx.add_variable_from_value("entity", entity);
    ctx
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
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::path::{Path, PathBuf};

    pub(super) fn policy(text: &str) -> Result<Policy, crate::policy::PolicyError> {
        let base = r#"
            [actions]
            review_at = 0.3
            block_at = 0.8
            [cascade]
            accept_below = 0.9
            ood_above = 0.99
            [default]
            action = "allow"
            score = 0.1
        "#;
        Policy::from_sources(
            Path::new("p"),
            &[(PathBuf::from("p/base.toml"), base.to_string()), (PathBuf::from("p/rules.toml"), text.to_string())],
        )
    }

    fn eval(p: &Policy, text: &str, features: serde_json::Value, model: Option<ModelView>) -> RuleVerdict {
        let features = features.as_object().cloned().unwrap_or_default();
        let signals = p.rules.count_signals(text);
        let obfuscation = Default::default();
        let input = RulesInput {
            text,
            lang: "eng",
            obfuscation: &obfuscation,
            signals: &signals,
            features: &features,
            tenant: Some("acme"),
            model,
            campaign: None,
        };
        p.rules.evaluate(&input)
    }

    pub(super) const RULES: &str = r#"
        [signals.link]
        patterns = ['https?://\S+']
        [signals.otp]
        patterns = ['(?i)\b(one[- ]time code|otp|verification code)\b']
        [[rules]]
        name = "otp_with_link"
        when = "signals.otp > 0 && signals.link > 0"
        action = "block"
        score = 0.95
        [[rules]]
        name = "large_foreign_transfer"
        when = 'has(features.amount) && features.amount > 10000 && features.country != "US"'
        action = "review"
        score = 0.6
        [[rules]]
        name = "model_leaning_risky"
        when = "model.available && model.risk_score > 0.6"
        action = "review"
        score = 0.65
    "#;

    #[test]
    fn first_matching_rule_decides_and_signals_are_counted() {
        let p = policy(RULES).unwrap();
        let v = eval(&p, "Send your OTP to http://x.io now http://y.io", serde_json::json!({}), None);
        assert_eq!(v.rule.as_deref(), Some("otp_with_link"));
        assert_eq!(v.action, Action::Block);
        assert_eq!(v.risk_score, 0.95);
        assert_eq!(v.signals.get("link"), Some(&2));
        assert_eq!(v.signals.get("otp"), Some(&1));
    }

    #[test]
    fn features_compare_as_numbers_and_strings() {
        let p = policy(RULES).unwrap();
        let v = eval(&p, "transfer", serde_json::json!({"amount": 12000, "country": "FR"}), None);
        assert_eq!(v.rule.as_deref(), Some("large_foreign_transfer"));
        let v = eval(&p, "transfer", serde_json::json!({"amount": 12000, "country": "US"}), None);
        assert_eq!(v.rule, None);
        let v = eval(&p, "transfer", serde_json::json!({"amount": 9000.5, "country": "FR"}), None);
        assert_eq!(v.rule, None, "{v:?}");
        assert!(v.errors.is_empty(), "a double compares with an int literal: {v:?}");
        let v = eval(&p, "transfer", serde_json::json!({"amount": 10000.5, "country": "FR"}), None);
        assert_eq!(v.rule.as_deref(), Some("large_foreign_transfer"), "{v:?}");
    }

    #[test]
    fn missing_feature_is_no_match_not_a_failure() {
        let p = policy(
            r#"
            [[rules]]
            name = "needs_amount"
            when = "features.amount > 5"
            action = "block"
            score = 0.9
        "#,
        )
        .unwrap();
        let v = eval(&p, "hello", serde_json::json!({}), None);
        assert_eq!(v.rule, None);
        assert_eq!(v.action, Action::Allow);
        assert_eq!(v.risk_score, 0.1);
        assert_eq!(v.errors.len(), 1);
        assert_eq!(v.errors[0].0, "needs_amount");
    }

    #[test]
    fn model_view_is_visible_only_when_a_model_answered() {
        let p = policy(RULES).unwrap();
        let m = ModelView { risk_score: 0.7, confidence: 0.7, ood_score: Some(0.2) };
        assert_eq!(eval(&p, "hi", serde_json::json!({}), Some(m)).rule.as_deref(), Some("model_leaning_risky"));
        let v = eval(&p, "hi", serde_json::json!({}), None);
        assert_eq!(v.rule, None);
        assert!(v.errors.is_empty(), "short-circuit keeps a missing model from erroring: {v:?}");
    }

    #[test]
    fn every_problem_is_reported_with_file_and_rule() {
        let err = policy(
            r#"
            [signals.bad]
            patterns = ['(unclosed']
            [[rules]]
            name = "bad_cel"
            when = "signals.x >"
            action = "block"
            score = 0.9
            [[rules]]
            name = "bad_score"
            when = "true"
            action = "block"
            score = 1.5
            [[rules]]
            name = "typo_var"
            when = "signal.link > 0"
            action = "block"
            score = 0.9
        "#,
        )
        .unwrap_err();
        let text = err.to_string();
        assert_eq!(err.0.len(), 4, "{text}");
        for needle in
            ["signal `bad`", "rule `bad_cel`", "rule `bad_score`", "rule `typo_var`", "unknown variable `signal`"]
        {
            assert!(text.contains(needle), "missing {needle} in {text}");
        }
        assert!(err.0.iter().all(|p| p.file == Path::new("p/rules.toml")));
    }

    #[test]
    fn misspelt_signals_and_type_errors_are_caught_at_load() {
        let err = policy(
            r#"
            [signals.gift_card]
            patterns = ['gift ?cards?']
            [[rules]]
            name = "typo"
            when = "signals.giftcard > 0"
            action = "block"
            score = 0.9
            [[rules]]
            name = "type_error"
            when = 'signals.gift_card > "x"'
            action = "block"
            score = 0.9
            [[rules]]
            name = "not_a_bool"
            when = "signals.gift_card + 1"
            action = "block"
            score = 0.9
            [[rules]]
            name = "fine_missing_feature"
            when = "features.amount > 5 && model.risk_score > 0.5"
            action = "block"
            score = 0.9
        "#,
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("rule `typo`: unknown signal `giftcard`; defined: gift_card"), "{text}");
        assert!(text.contains("rule `type_error`: `when` fails on an empty request"), "{text}");
        assert!(text.contains("rule `not_a_bool`: `when` must evaluate to a bool"), "{text}");
        assert!(!text.contains("fine_missing_feature"), "{text}");
        assert_eq!(err.0.len(), 3, "{text}");
    }

    #[test]
    fn unknown_keys_and_out_of_range_thresholds_are_errors() {
        let err = policy("[[rules]]\nname = \"a\"\nwhen = \"true\"\naction = \"block\"\nscore = 0.9\nsevrity = 1\n")
            .unwrap_err();
        assert!(err.to_string().contains("sevrity"), "{err}");
        let err = Policy::from_sources(
            Path::new("p"),
            &[(PathBuf::from("p/a.toml"), "[actions]\nreview_at = 0.9\nblock_at = 0.5\n[cascade]\naccept_below = 2\nood_above = 0.5\n[default]\naction = \"allow\"\nscore = 0\n".into())],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("review_at (0.9) must not exceed block_at (0.5)"), "{text}");
        assert!(text.contains("cascade.accept_below: must be in [0, 1], got 2"), "{text}");
        let err = Policy::from_sources(
            Path::new("p"),
            &[(PathBuf::from("p/a.toml"), "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\naccept_below = 0.9\naccept_risk_below = 1.5\nood_above = 0.5\n[default]\naction = \"allow\"\nscore = 0\n".into())],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("cascade.accept_risk_below: must be in [0, 1], got 1.5"), "{text}");
    }

    #[test]
    fn bundled_policy_is_valid_and_its_rules_fire() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let p = Policy::load_dir(&dir).unwrap();
        let none = serde_json::json!({});
        let cases = [
            (
                "Your account is locked. Verify your password at http://secure-bank.example.top/login",
                Some("credential_phishing"),
            ),
            ("Your code is 482911. Do not share it with anyone. https://bank.example/help", None),
            ("Pay the fine today with 3 Google Play cards of $100 each", Some("gift_card_payment")),
            (
                "Send 0.5 BTC to this wallet address immediately or your files are published",
                Some("urgent_crypto_or_wire"),
            ),
            ("Congratulations, you have won! Claim your prize at bit.ly/abc123", Some("prize_bait")),
            ("rent for march, thanks!", None),
        ];
        for (text, rule) in cases {
            assert_eq!(eval(&p, text, none.clone(), None).rule.as_deref(), rule, "{text}");
        }
        let features =
            serde_json::json!({"amount": 25000, "country": "NG", "home_country": "DE"}).as_object().cloned().unwrap();
        let signals = p.rules.count_signals("invoice 4471");
        let none_undone = Obfuscation::default();
        let input = RulesInput {
            text: "invoice 4471",
            lang: "eng",
            obfuscation: &none_undone,
            signals: &signals,
            features: &features,
            tenant: None,
            model: None,
            campaign: None,
        };
        let guard = p.rules.guard(&input).matched.map(|(name, _, _)| name);
        assert_eq!(
            guard.as_deref(),
            Some("large_cross_border_payment"),
            "a guard now: it applies to confident verdicts too"
        );
        let unsure = ModelView { risk_score: 0.62, confidence: 0.62, ood_score: Some(0.3) };
        assert_eq!(eval(&p, "see you at 5", none, Some(unsure)).rule.as_deref(), Some("model_leaning_risky"));
    }

    #[test]
    fn prefiltered_signal_counts_equal_counting_every_pattern() {
        let p = Policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
        assert!(p.rules.prefilter.is_some(), "the bundled signals fit one RegexSet");
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        let mut texts = 0;
        let mut nonzero = 0;
        for file in [
            "test_sample.jsonl",
            "adversarial.jsonl",
            "adversarial_b.jsonl",
            "adversarial_c.jsonl",
            "adversarial_d.jsonl",
            "ood_short.jsonl",
        ] {
            for line in std::fs::read_to_string(data.join(file)).unwrap().lines() {
                let row: serde_json::Value = serde_json::from_str(line).unwrap();
                let text = row["text"].as_str().unwrap();
                let folded = crate::text::han::fold(text);
                let every: BTreeMap<String, i64> = (p.rules.signals.iter())
                    .map(|s| (s.name.clone(), s.patterns.iter().map(|r| r.find_iter(&folded).count() as i64).sum()))
                    .collect();
                let counted = p.rules.count_signals(text);
                assert_eq!(counted, every, "{text}");
                texts += 1;
                nonzero += counted.values().filter(|&&n| n > 0).count();
            }
        }
        assert!(texts > 100 && nonzero > 100, "{texts} texts, {nonzero} signals that matched");
    }

    #[test]
    fn version_is_a_content_hash() {
        let a = policy(RULES).unwrap();
        let b = policy(RULES).unwrap();
        let c = policy(&RULES.replace("0.95", "0.96")).unwrap();
        assert_eq!(a.version, b.version);
        assert_ne!(a.version, c.version);
        assert_eq!(a.version.len(), 12);
    }
}
