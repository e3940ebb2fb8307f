//! The cascade loop from replayed tier verdicts: no model, no server, no clock tricks.

use super::cascade::{self, Assessment, Inputs, Recorded, Tiers};
use crate::action::Action;
use crate::breaker::CircuitState;
use crate::complexity::{Complexity, TextStats};
use crate::decision::{Decision, Outcome, TierName};
use crate::error::ApiError;
use crate::policy::Policy;
use crate::request::ClassifyRequest;
use crate::select::{CpuLoad, GpuLoad, GpuMemory, KvCache, LoadSnapshot};
use crate::text::LanguageCell;
use crate::tier::{ModelVerdict, TierError};
use crate::web::ServerConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

fn policy(extra: &str) -> Policy {
    let text = format!(
        r#"
        [actions]
        review_at = 0.3
        block_at = 0.8
        [cascade]
        escalate_below = 0.9
        accept_below = 0.7
        ood_above = 0.95
        [default]
        action = "review"
        score = 0.4
        [signals.credential]
        patterns = ["(?i)password"]
        [[rules]]
        name = "credential_request"
        when = "signals.credential > 0"
        action = "block"
        score = 0.9
        {extra}
        "#
    );
    Policy::from_sources(Path::new("p"), &[(PathBuf::from("p/routing.toml"), text)]).unwrap()
}

/// Load as routing sees it; `gpu`: whether a gpu tier exists.
fn snapshot(gpu: bool) -> LoadSnapshot {
    LoadSnapshot {
        tenant: Default::default(),
        confirm: false,
        cpu: CpuLoad { utilization: Some(0.2), queue_depth: 0, in_flight: 0, service_us: None, queue_wait_us: None },
        gpu: GpuLoad {
            unavailable: (!gpu).then(|| "no gpu tier configured".to_string()),
            memory: GpuMemory::FreeMb(40_000),
            utilization: None,
            in_flight: 0,
            p95_us: None,
            queue_wait_us: None,
            ewma_us: None,
            circuit: CircuitState::Closed,
            kv_cache: KvCache::NotExposed,
            was_below: Default::default(),
            endpoints_available: None,
        },
    }
}

fn verdict(risk_score: f64, ood: f64) -> ModelVerdict {
    ModelVerdict {
        risk_score,
        confidence: risk_score.max(1.0 - risk_score),
        ood_score: Some(ood),
        tokens: Some(12),
        queue_us: 0,
        infer_us: 0,
        batch_size: 1,
        endpoint: None,
        window: None,
        unread: false,
    }
}

async fn decide(
    policy: &Policy,
    text: &str,
    gpu: bool,
    cpu: Option<Result<ModelVerdict, TierError>>,
    gpu_answer: Option<Result<ModelVerdict, TierError>>,
) -> Result<Decision, ApiError> {
    replay(
        policy,
        request(text, serde_json::json!({}), None),
        snapshot(gpu),
        Recorded { cpu, gpu: gpu_answer, features: None, cpu_temperature: None, confirm: None },
    )
    .await
}

fn request(text: &str, features: serde_json::Value, tenant: Option<&str>) -> ClassifyRequest {
    let features = features.as_object().cloned().unwrap_or_default();
    let (deadline, limits) = (Duration::from_millis(200), ServerConfig::default());
    ClassifyRequest::new(text.into(), features, tenant.map(String::from), deadline, &limits).unwrap()
}

/// The cascade on `req` from recorded tier verdicts, for an English text of complexity 0.2.
async fn replay(
    policy: &Policy,
    req: ClassifyRequest,
    snapshot: LoadSnapshot,
    recorded: Recorded,
) -> Result<Decision, ApiError> {
    replay_in(policy, None, req, snapshot, recorded).await
}

/// [`replay`] in the named scenario of `policy`.
async fn replay_in(
    policy: &Policy,
    scenario: Option<&str>,
    req: ClassifyRequest,
    snapshot: LoadSnapshot,
    recorded: Recorded,
) -> Result<Decision, ApiError> {
    let scenario = policy.scenario(scenario).expect("the test's scenario is defined");
    let mut facts = policy.rules.read(&req.text);
    facts.lang = LanguageCell::known(facts.text.clone(), english());
    let assessment = Assessment {
        facts,
        stats: TextStats::default(),
        complexity: Complexity { score: 0.2, contributions: BTreeMap::new() },
        encoded: None,
        campaign: None,
    };
    let inputs = Inputs {
        policy,
        scenario,
        req: &req,
        snapshot: &snapshot,
        started: Instant::now(),
        features: recorded.features.as_ref(),
    };
    cascade::run(&inputs, assessment, &Tiers::Replay(&recorded)).await.map(|(d, _)| d)
}

fn english() -> crate::text::Language {
    crate::text::Language {
        code: "eng",
        guess: "eng",
        script: "Latn",
        confidence: 0.9,
        reliable: true,
        elsewhere: None,
    }
}

fn path(d: &Decision) -> Vec<(TierName, Outcome)> {
    d.path.iter().map(|s| (s.tier, s.outcome)).collect()
}

#[tokio::test]
async fn a_confident_cpu_verdict_stands() {
    let d = decide(&policy(""), "lunch at 1?", false, Some(Ok(verdict(0.02, 0.5))), None).await.unwrap();
    assert_eq!((d.tier, d.action, d.confidence), (TierName::Cpu, Action::Allow, Some(0.98)));
    assert_eq!(path(&d), [(TierName::Cpu, Outcome::Accepted)]);
}

#[tokio::test]
async fn an_unsure_cpu_verdict_escalates_and_the_gpu_verdict_stands() {
    let d = decide(&policy(""), "hmm", true, Some(Ok(verdict(0.2, 0.5))), Some(Ok(verdict(0.97, 0.5)))).await.unwrap();
    assert_eq!((d.tier, d.action), (TierName::Gpu, Action::Block));
    assert_eq!(path(&d), [(TierName::Cpu, Outcome::LowConfidence), (TierName::Gpu, Outcome::Accepted)]);
}

#[tokio::test]
async fn a_failed_escalation_keeps_a_cpu_verdict_that_stands_alone() {
    let timeout = Err(TierError::DeadlineExceeded { waited_us: 5 });
    let d = decide(&policy(""), "hmm", true, Some(Ok(verdict(0.2, 0.5))), Some(timeout.clone())).await.unwrap();
    assert_eq!(d.tier, TierName::Cpu, "0.8 confidence is above accept_below 0.7");
    let want = [
        (TierName::Cpu, Outcome::LowConfidence),
        (TierName::Gpu, Outcome::Timeout),
        (TierName::Cpu, Outcome::Accepted),
    ];
    assert_eq!(path(&d), want);
    // Below accept_below, the failed escalation leaves the decision to rules.
    let d = decide(&policy(""), "hmm", true, Some(Ok(verdict(0.35, 0.5))), Some(timeout)).await.unwrap();
    assert_eq!((d.tier, d.action), (TierName::Rules, Action::Review));
}

#[tokio::test]
async fn a_failed_cpu_tier_hands_over_to_an_eligible_gpu_tier_else_rules() {
    let shed = Err(TierError::Overloaded { capacity: 4 });
    let d = decide(&policy(""), "hmm", true, Some(shed.clone()), Some(Ok(verdict(0.01, 0.5)))).await.unwrap();
    assert_eq!(path(&d), [(TierName::Cpu, Outcome::Shed), (TierName::Gpu, Outcome::Accepted)]);
    let d = decide(&policy(""), "your password please", false, Some(shed), None).await.unwrap();
    assert_eq!(
        path(&d),
        [(TierName::Cpu, Outcome::Shed), (TierName::Gpu, Outcome::Skipped), (TierName::Rules, Outcome::Matched)]
    );
    assert_eq!((d.action, d.rule.as_deref()), (Action::Block, Some("credential_request")));
    assert!(d.overloaded, "rules decided because the cpu queue was full");
}

#[tokio::test]
async fn out_of_distribution_text_goes_to_rules_and_the_path_says_why() {
    let d = decide(&policy(""), "hola, comemos?", false, Some(Ok(verdict(0.01, 0.99))), None).await.unwrap();
    assert_eq!(
        path(&d),
        [
            (TierName::Cpu, Outcome::OutOfDistribution),
            (TierName::Gpu, Outcome::Skipped),
            (TierName::Rules, Outcome::Default)
        ]
    );
    assert_eq!(d.action, Action::Review, "the policy default");
    assert!(!d.overloaded, "rules decided because of the text, not of load");
    assert!(d.path[1].reason.as_deref().unwrap().starts_with("unavailable: no gpu tier configured"));
}

#[tokio::test]
async fn saturated_tiers_shed_when_the_policy_says_so() {
    let p = policy("[cpu]\nmax_queue_depth = 0\n[routing]\nwhen_saturated = \"shed\"\n");
    let mut busy = snapshot(false);
    busy.cpu.queue_depth = 1;
    let result = replay(&p, request("x", serde_json::json!({}), None), busy, Recorded::default()).await;
    assert!(matches!(result, Err(ApiError::Shed { retry_after_s: 1, .. })), "{result:?}");
}

const GUARDED: &str = r#"
[signals.link]
patterns = ['https?://\S+']
[[guards]]
name = "credential_link"
when = "signals.credential > 0 && signals.link > 0"
action = "block"
score = 0.95
[[guards]]
name = "large_amount"
when = "has(features.amount) && features.amount > 10000"
action = "review"
score = 0.6
[[allowlist]]
name = "internal_notice"
when = "tenant == 'it-desk'"
action = "allow"
score = 0.0
"#;

async fn decide_with(
    policy: &Policy,
    text: &str,
    features: serde_json::Value,
    tenant: Option<&str>,
    cpu: f64,
) -> Decision {
    let recorded = Recorded { cpu: Some(Ok(verdict(cpu, 0.5))), ..Default::default() };
    replay(policy, request(text, features, tenant), snapshot(false), recorded).await.unwrap()
}

#[tokio::test]
async fn a_guard_raises_a_confident_allow_and_the_path_names_it() {
    let p = policy(GUARDED);
    let d = decide_with(&p, "verify your password at https://x.top/login", serde_json::json!({}), None, 0.02).await;
    assert_eq!((d.action, d.tier, d.rule.as_deref()), (Action::Block, TierName::Guard, Some("credential_link")));
    assert_eq!(path(&d), [(TierName::Cpu, Outcome::Accepted), (TierName::Guard, Outcome::Raised)]);
    assert_eq!(d.risk_score, 0.95);
    assert_eq!(d.confidence, None, "a guard's score is declared, not calibrated");
    // The most severe guard wins; a guard never lowers: a block stays a block.
    let both = "password https://x.top";
    let d = decide_with(&p, both, serde_json::json!({"amount": 50000}), None, 0.02).await;
    assert_eq!(d.rule.as_deref(), Some("credential_link"));
    let d = decide_with(&p, "hello", serde_json::json!({"amount": 50000}), None, 0.97).await;
    assert_eq!((d.action, d.tier), (Action::Block, TierName::Cpu), "the model's block stands over a review guard");
}

#[tokio::test]
async fn the_allow_list_lowers_only_what_the_policy_lets_it() {
    let p = policy(GUARDED);
    let d = decide_with(&p, "weekly maintenance window", serde_json::json!({}), Some("it-desk"), 0.6).await;
    assert_eq!((d.action, d.rule.as_deref()), (Action::Allow, Some("internal_notice")), "lowers the model's review");
    assert_eq!(path(&d).last(), Some(&(TierName::Guard, Outcome::Lowered)));
    let phish = "password reset https://x.top";
    let d = decide_with(&p, phish, serde_json::json!({}), Some("it-desk"), 0.02).await;
    assert_eq!(d.action, Action::Block, "a guard's block is not lowered by default");
    let lenient = policy(&format!("{GUARDED}\n[safety]\nallowlist_overrides_guards = true\n"));
    let d = decide_with(&lenient, phish, serde_json::json!({}), Some("it-desk"), 0.02).await;
    assert_eq!(d.action, Action::Allow, "unless the policy says so");
}

#[tokio::test]
async fn a_guard_that_agrees_with_the_model_still_holds_against_the_allow_list() {
    // The model blocks on its own and the guard matches at the same action: nothing was raised,
    // but the guard still vouches for the block (issue 25, item 7).
    let p = policy(GUARDED);
    let phish = "password reset https://x.top";
    let d = decide_with(&p, phish, serde_json::json!({}), Some("it-desk"), 0.97).await;
    assert_eq!((d.action, d.tier), (Action::Block, TierName::Cpu), "{:?}", d.path);
    // A guard below the model's action is a floor of its own: the allow-list lowers the model's
    // block only as far as the matching review guard.
    let d = decide_with(&p, "wire it today", serde_json::json!({"amount": 50000}), Some("it-desk"), 0.97).await;
    assert_eq!((d.action, d.rule.as_deref()), (Action::Review, Some("internal_notice")), "{:?}", d.path);
    let lenient = policy(&format!("{GUARDED}\n[safety]\nallowlist_overrides_guards = true\n"));
    let d = decide_with(&lenient, phish, serde_json::json!({}), Some("it-desk"), 0.97).await;
    assert_eq!(d.action, Action::Allow, "unless the policy lets the allow-list override guards");
}

#[tokio::test]
async fn a_rule_that_fails_to_evaluate_is_never_skipped_in_silence() {
    // `amount` sent as a string: the guard's comparison fails at run time.
    let p = policy(GUARDED);
    let d = decide_with(&p, "hello there", serde_json::json!({"amount": "50000"}), None, 0.02).await;
    assert_eq!((d.action, d.rule.as_deref()), (Action::Review, Some("large_amount")), "on_rule_error = review");
    assert!(d.path.last().unwrap().reason.as_deref().unwrap().contains("failed to evaluate"));
    let ignore = policy(&format!("{GUARDED}\n[safety]\non_rule_error = \"allow\"\n"));
    let d = decide_with(&ignore, "hello there", serde_json::json!({"amount": "50000"}), None, 0.02).await;
    assert_eq!(d.action, Action::Allow);
}

#[tokio::test]
async fn a_nan_verdict_is_never_accepted() {
    let p = policy("");
    let mut nan = verdict(0.02, 0.5);
    nan.risk_score = f64::NAN;
    nan.confidence = f64::NAN;
    let d = decide(&p, "hello", false, Some(Ok(nan)), None).await.unwrap();
    assert_eq!(d.tier, TierName::Rules);
    assert_eq!(path(&d)[0], (TierName::Cpu, Outcome::Error));
    assert_eq!(d.action, Action::Review);
}

#[tokio::test]
async fn a_scenario_changes_the_action_for_the_same_verdict_and_chooses_its_rules() {
    let p = policy(
        "[scenarios.payments]\nblock_at = 0.6\n[scenarios.lenient]\nreview_at = 0.5\nblock_at = 0.95\nrules = []\n",
    );
    let req = |text: &str| request(text, serde_json::json!({}), None);
    // Confidence 0.7 is not below accept_below 0.7: the cpu verdict stands in every scenario.
    let stands = || Recorded { cpu: Some(Ok(verdict(0.7, 0.5))), ..Default::default() };
    let (plain, payments, lenient) = (
        replay_in(&p, None, req("a text"), snapshot(false), stands()).await.unwrap(),
        replay_in(&p, Some("payments"), req("a text"), snapshot(false), stands()).await.unwrap(),
        replay_in(&p, Some("lenient"), req("a text"), snapshot(false), stands()).await.unwrap(),
    );
    assert!([&plain, &payments, &lenient].iter().all(|d| d.tier == TierName::Cpu));
    let action = |d: &Decision| d.action;
    assert_eq!(action(&plain), Action::Review, "0.7: review_at 0.3 <= score < block_at 0.8");
    assert_eq!(action(&payments), Action::Block, "block_at 0.6 there");
    assert_eq!(action(&lenient), Action::Review, "review_at 0.5 there");
    // An unsure verdict goes to rules; none may decide in `lenient`, so the default does.
    let unsure = || Recorded { cpu: Some(Ok(verdict(0.6, 0.5))), ..Default::default() };
    let all = replay_in(&p, None, req("your password please"), snapshot(false), unsure()).await.unwrap();
    assert_eq!(
        (all.tier, all.rule.as_deref(), all.action),
        (TierName::Rules, Some("credential_request"), Action::Block)
    );
    let none = replay_in(&p, Some("lenient"), req("your password please"), snapshot(false), unsure()).await.unwrap();
    assert_eq!((none.tier, none.rule.as_deref(), none.action), (TierName::Rules, None, Action::Review));
}

#[tokio::test]
async fn a_policy_temperature_reads_the_recorded_cpu_verdict_at_its_own() {
    // Recorded at the model's temperature 1.0: risk 0.7 (confidence 0.7), a review as written.
    let recorded = || Recorded { cpu: Some(Ok(verdict(0.7, 0.5))), cpu_temperature: Some(1.0), ..Default::default() };
    let req = || request("a text", serde_json::json!({}), None);
    let plain = replay(&policy(""), req(), snapshot(false), recorded()).await.unwrap();
    assert_eq!((plain.risk_score, plain.action), (0.7, Action::Review));
    // At T = 0.5 the margin doubles: 0.7 -> 0.49 / (0.49 + 0.09), a block from the same verdict.
    let sharp = replay(&policy("[calibration]\ncpu_temperature = 0.5\n"), req(), snapshot(false), recorded()).await;
    let sharp = sharp.unwrap();
    assert!((sharp.risk_score - 0.49 / 0.58).abs() < 1e-12, "{}", sharp.risk_score);
    assert_eq!((sharp.tier, sharp.action), (TierName::Cpu, Action::Block));
    assert_eq!(sharp.confidence, Some(sharp.risk_score));
    // At T = 100 the verdict is unsure (confidence near 0.5): rules decide instead.
    let soft = replay(&policy("[calibration]\ncpu_temperature = 100\n"), req(), snapshot(false), recorded()).await;
    assert_eq!(soft.unwrap().tier, TierName::Rules);
}

/// Load with a confirm model loaded and no gpu tier.
fn with_confirm() -> LoadSnapshot {
    LoadSnapshot { confirm: true, ..snapshot(false) }
}

#[tokio::test]
async fn the_confirm_model_lets_an_unsure_risk_verdict_stand_or_leaves_it_to_the_rules() {
    let p = policy("");
    let mut p2 = policy("");
    p2.cascade.confirm_from = Some(0.6);
    let ask = |confirm: Option<Result<ModelVerdict, TierError>>| Recorded {
        cpu: Some(Ok(verdict(0.65, 0.5))),
        confirm,
        ..Default::default()
    };
    // Confirmed: the cpu verdict's own score decides (0.65: review by [actions], not block).
    let d = replay(&p2, request("hmm", serde_json::json!({}), None), with_confirm(), ask(Some(Ok(verdict(0.99, 0.5)))))
        .await
        .unwrap();
    assert_eq!((d.tier, d.risk_score, d.action), (TierName::Confirm, 0.65, Action::Review));
    assert_eq!(path(&d), [(TierName::Cpu, Outcome::LowConfidence), (TierName::Confirm, Outcome::Accepted)]);
    assert!(d.path[1].reason.as_deref().unwrap().contains("confirm_at 0.97"), "{:?}", d.path[1]);
    // Not confirmed: to the rules, which see the cpu verdict (not the confirm model's).
    let d = replay(&p2, request("hmm", serde_json::json!({}), None), with_confirm(), ask(Some(Ok(verdict(0.9, 0.5)))))
        .await
        .unwrap();
    let want = [
        (TierName::Cpu, Outcome::LowConfidence),
        (TierName::Confirm, Outcome::LowConfidence),
        (TierName::Gpu, Outcome::Skipped),
        (TierName::Rules, Outcome::Default),
    ];
    assert_eq!((d.tier, path(&d)), (TierName::Rules, want.to_vec()));
    // A confirm model that fails: the rules, as without one.
    let shed = Err(TierError::Overloaded { capacity: 1 });
    let d = replay(&p2, request("hmm", serde_json::json!({}), None), with_confirm(), ask(Some(shed))).await.unwrap();
    assert_eq!(d.path[1].tier, TierName::Confirm);
    assert_eq!((d.path[1].outcome, d.tier), (Outcome::Shed, TierName::Rules));
    // Below confirm_from, with no confirm model loaded, or without confirm_from: never asked.
    let low = Recorded { cpu: Some(Ok(verdict(0.55, 0.5))), ..Default::default() };
    let d = replay(&p2, request("hmm", serde_json::json!({}), None), with_confirm(), low).await.unwrap();
    assert!(d.path.iter().all(|s| s.tier != TierName::Confirm), "{:?}", path(&d));
    for (policy, load) in [(&p2, snapshot(false)), (&p, with_confirm())] {
        let d = replay(policy, request("hmm", serde_json::json!({}), None), load, ask(None)).await.unwrap();
        assert!(d.path.iter().all(|s| s.tier != TierName::Confirm), "{:?}", path(&d));
    }
}

#[tokio::test]
async fn an_eligible_gpu_tier_decides_before_any_confirm_model() {
    let mut p = policy("");
    p.cascade.confirm_from = Some(0.6);
    let recorded = Recorded {
        cpu: Some(Ok(verdict(0.65, 0.5))),
        gpu: Some(Ok(verdict(0.1, 0.5))),
        confirm: Some(Ok(verdict(0.99, 0.5))),
        ..Default::default()
    };
    let load = LoadSnapshot { confirm: true, ..snapshot(true) };
    let d = replay(&p, request("hmm", serde_json::json!({}), None), load, recorded).await.unwrap();
    assert_eq!(path(&d), [(TierName::Cpu, Outcome::LowConfidence), (TierName::Gpu, Outcome::Accepted)]);
}
