//! `[scenarios.NAME]`: named variants of a policy that a `/v1/classify` request chooses
//! (`x-tiergate-scenario` header or `scenario` field), each with its own action thresholds,
//! deadline and set of `[[rules]]`.
//!
//! A scenario changes how a verdict becomes an action and which rules may decide, never the
//! models, the routing or the guards: guards and the allow-list are the policy's hard limits and
//! apply in every scenario. A request that names no scenario is decided by the policy as written.
//! Everything here is checked at load (thresholds in [0, 1] and in order, the deadline within
//! the server's `[server] max_deadline_ms`, every rule name known), so a bad scenario file is
//! refused whole and the last good policy keeps serving.

use super::sections::ActionThresholds;
use super::PolicyProblem;
use crate::rules::RuleSet;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest scenario name, bytes; names are `[a-z0-9_-]`.
pub const MAX_SCENARIO_BYTES: usize = 64;

/// `[scenarios.NAME]` as written. Every key is optional; what is left out is the policy's own.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSpec {
    #[serde(default)]
    pub description: Option<String>,
    /// `risk_score >= review_at` gives at least `review`, [0, 1]; default `[actions] review_at`.
    #[serde(default)]
    pub review_at: Option<f64>,
    /// `risk_score >= block_at` gives `block`, [0, 1]; default `[actions] block_at`.
    #[serde(default)]
    pub block_at: Option<f64>,
    /// The decision's time budget, ms, 1..=`[server] max_deadline_ms`: it replaces the server's
    /// default deadline, and a request's `x-tiergate-deadline-ms` may only shorten it.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Names of the `[[rules]]` that may decide in this scenario, applied in the policy's order;
    /// unset: every rule. Guards and the allow-list always apply.
    #[serde(default)]
    pub rules: Option<Vec<String>>,
}

/// A scenario, resolved against its policy.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub actions: ActionThresholds,
    /// `None`: the request's own deadline.
    pub deadline: Option<Duration>,
    /// Per `[[rules]]` entry, in order, whether it may decide; `None`: every rule.
    pub rules: Option<Vec<bool>>,
}

impl Scenario {
    /// The deadline a request gets in this scenario: the scenario's, shortened by the client's
    /// own when it asked for one (`requested`), else the request's deadline unchanged.
    pub fn deadline_for(&self, request: Duration, requested: bool) -> Duration {
        match self.deadline {
            Some(d) if requested => d.min(request),
            Some(d) => d,
            None => request,
        }
    }
}

/// What a policy is checked against that the policy files do not say: the server's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `[server] max_deadline_ms`: the longest deadline a scenario may set.
    pub max_deadline_ms: u64,
}

impl Default for Limits {
    /// The server's default `max_deadline_ms` (10 s, `web::ServerConfig`).
    fn default() -> Self {
        Limits { max_deadline_ms: 10_000 }
    }
}

/// A request named a scenario the policy does not define.
#[derive(Debug, Clone, PartialEq)]
pub struct UnknownScenario {
    pub name: String,
    /// Every scenario the policy defines, sorted.
    pub known: Vec<String>,
}

/// Whether `name` is a well-formed scenario name: 1..=[`MAX_SCENARIO_BYTES`] of `[a-z0-9_-]`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SCENARIO_BYTES
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Resolves every scenario against the policy's `[actions]` and compiled rules; each problem
/// names the file and the key (`scenarios.payments.block_at`).
pub(super) fn resolve(
    specs: &[(PathBuf, String, ScenarioSpec)],
    actions: &ActionThresholds,
    rules: &RuleSet,
    limits: &Limits,
    problems: &mut Vec<PolicyProblem>,
) -> BTreeMap<String, Scenario> {
    let mut out = BTreeMap::new();
    for (file, name, spec) in specs {
        let before = problems.len();
        let mut at = |key: &str, message: String| {
            let item = if key.is_empty() { format!("scenarios.{name}") } else { format!("scenarios.{name}.{key}") };
            problems.push(PolicyProblem::in_file(file, Some(item), message));
        };
        if !valid_name(name) {
            at("", format!("a scenario name is 1 to {MAX_SCENARIO_BYTES} of a-z, 0-9, `_`, `-`"));
        }
        let review_at = spec.review_at.unwrap_or(actions.review_at);
        let block_at = spec.block_at.unwrap_or(actions.block_at);
        for (key, value) in [("review_at", review_at), ("block_at", block_at)] {
            if !(0.0..=1.0).contains(&value) {
                at(key, format!("must be in [0, 1], got {value}"));
            }
        }
        if review_at > block_at {
            at("review_at", format!("review_at ({review_at}) must not exceed block_at ({block_at})"));
        }
        if let Some(ms) = spec.deadline_ms.filter(|ms| !(1..=limits.max_deadline_ms).contains(ms)) {
            at(
                "deadline_ms",
                format!("must be from 1 to {} (server.max_deadline_ms), got {ms}", limits.max_deadline_ms),
            );
        }
        let mask = spec.rules.as_ref().map(|names| {
            let mut mask = vec![false; rules.rule_count()];
            for rule in names {
                match rules.rule_index(rule) {
                    Some(i) => mask[i] = true,
                    None if rules.is_guard(rule) => {
                        at("rules", format!("`{rule}` is a guard; guards apply in every scenario"))
                    }
                    None => at("rules", format!("unknown rule `{rule}`; rules are named in [[rules]] `name`")),
                }
            }
            mask
        });
        if problems.len() == before {
            let scenario = Scenario {
                name: name.clone(),
                actions: ActionThresholds { review_at, block_at },
                deadline: spec.deadline_ms.map(Duration::from_millis),
                rules: mask,
            };
            out.insert(name.clone(), scenario);
        }
    }
    out
}

/// Adds one file's scenarios to those gathered so far; a name defined twice is a problem.
pub(super) fn merge(
    into: &mut Vec<(PathBuf, String, ScenarioSpec)>,
    path: &Path,
    scenarios: BTreeMap<String, ScenarioSpec>,
    problems: &mut Vec<PolicyProblem>,
) {
    for (name, spec) in scenarios {
        if let Some((first, _, _)) = into.iter().find(|(_, n, _)| *n == name) {
            let message = format!("already defined in {}", first.display());
            problems.push(PolicyProblem::in_file(path, Some(format!("[scenarios.{name}]")), message));
        } else {
            into.push((path.to_path_buf(), name, spec));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;
    use std::path::Path;

    const BASE: &str = r#"
        [actions]
        review_at = 0.3
        block_at = 0.8
        [cascade]
        accept_below = 0.9
        ood_above = 0.99
        [default]
        action = "review"
        score = 0.4
        [signals.link]
        patterns = ['https?://\S+']
        [[rules]]
        name = "any_link"
        when = "signals.link > 0"
        action = "block"
        score = 0.9
        [[rules]]
        name = "model_leaning_risky"
        when = "model.available && model.risk_score >= 0.5"
        action = "review"
        score = 0.6
        [[guards]]
        name = "long_text"
        when = "text_len > 100000"
        action = "review"
        score = 0.5
    "#;

    fn load(scenarios: &str, limits: &Limits) -> Result<Policy, crate::policy::PolicyError> {
        let files = [
            (PathBuf::from("p/base.toml"), BASE.to_string()),
            (PathBuf::from("p/scenarios.toml"), scenarios.to_string()),
        ];
        Policy::from_sources_within(Path::new("p"), &files, limits)
    }

    fn problems(scenarios: &str) -> Vec<String> {
        load(scenarios, &Limits { max_deadline_ms: 1000 }).unwrap_err().0.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_scenario_takes_its_own_thresholds_deadline_and_rules_and_inherits_the_rest() {
        let p = load(
            "[scenarios.payments]\nblock_at = 0.82\ndeadline_ms = 150\nrules = [\"model_leaning_risky\"]\n\
             [scenarios.plain]\n",
            &Limits::default(),
        )
        .unwrap();
        let pay = &p.scenarios["payments"];
        assert_eq!((pay.actions.review_at, pay.actions.block_at), (0.3, 0.82), "review_at inherited");
        assert_eq!(pay.deadline, Some(Duration::from_millis(150)));
        assert_eq!(pay.rules, Some(vec![false, true]), "in the policy's rule order");
        let plain = &p.scenarios["plain"];
        assert_eq!((plain.actions.block_at, plain.deadline, plain.rules.clone()), (0.8, None, None));
        assert_eq!(p.scenario(Some("payments")).unwrap().map(|s| s.name.as_str()), Some("payments"));
        assert!(p.scenario(None).unwrap().is_none(), "no scenario: the policy as written");
        let unknown = p.scenario(Some("chat")).unwrap_err();
        assert_eq!(unknown, UnknownScenario { name: "chat".into(), known: vec!["payments".into(), "plain".into()] });
    }

    #[test]
    fn every_bad_key_is_a_load_error_naming_it() {
        let all = problems(
            "[scenarios.a]\nblock_at = 1.5\n[scenarios.b]\nreview_at = 0.9\nblock_at = 0.5\n\
             [scenarios.c]\ndeadline_ms = 5000\n[scenarios.d]\ndeadline_ms = 0\n\
             [scenarios.e]\nrules = [\"no_such_rule\", \"long_text\"]\n[scenarios.Bad]\n",
        );
        let expect = [
            "p/scenarios.toml: scenarios.a.block_at: must be in [0, 1], got 1.5",
            "p/scenarios.toml: scenarios.b.review_at: review_at (0.9) must not exceed block_at (0.5)",
            "p/scenarios.toml: scenarios.c.deadline_ms: must be from 1 to 1000 (server.max_deadline_ms), got 5000",
            "p/scenarios.toml: scenarios.d.deadline_ms: must be from 1 to 1000 (server.max_deadline_ms), got 0",
            "p/scenarios.toml: scenarios.e.rules: unknown rule `no_such_rule`; rules are named in [[rules]] `name`",
            "p/scenarios.toml: scenarios.e.rules: `long_text` is a guard; guards apply in every scenario",
            "p/scenarios.toml: scenarios.Bad: a scenario name is 1 to 64 of a-z, 0-9, `_`, `-`",
        ];
        for e in expect {
            assert!(all.iter().any(|p| p == e), "missing {e:?} in {all:#?}");
        }
        let unknown_key = problems("[scenarios.a]\nblock = 0.5\n");
        assert!(unknown_key[0].contains("unknown field `block`"), "{unknown_key:?}");
    }

    #[test]
    fn a_scenario_defined_in_two_files_is_refused() {
        let files = [
            (PathBuf::from("p/base.toml"), format!("{BASE}\n[scenarios.a]\n")),
            (PathBuf::from("p/more.toml"), "[scenarios.a]\nblock_at = 0.9\n".to_string()),
        ];
        let e = Policy::from_sources(Path::new("p"), &files).unwrap_err();
        assert_eq!(e.0[0].to_string(), "p/more.toml: [scenarios.a]: already defined in p/base.toml");
    }

    #[test]
    fn the_clients_deadline_only_shortens_the_scenarios() {
        let s = Scenario {
            name: "s".into(),
            actions: ActionThresholds { review_at: 0.3, block_at: 0.8 },
            deadline: Some(Duration::from_millis(150)),
            rules: None,
        };
        let ms = Duration::from_millis;
        assert_eq!(s.deadline_for(ms(200), false), ms(150), "the server default is replaced");
        assert_eq!(s.deadline_for(ms(100), true), ms(100), "a shorter client deadline stands");
        assert_eq!(s.deadline_for(ms(900), true), ms(150), "a longer one is capped");
        let open = Scenario { deadline: None, ..s };
        assert_eq!(open.deadline_for(ms(900), true), ms(900));
    }
}
