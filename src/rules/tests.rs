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

/// An English request of tenant `acme`, no features model, no campaign.
fn input<'a>(
    text: &'a str,
    signals: &'a BTreeMap<String, i64>,
    features: &'a serde_json::Map<String, serde_json::Value>,
    obfuscation: &'a Obfuscation,
    model: Option<ModelView>,
) -> RulesInput<'a> {
    RulesInput {
        text,
        lang: "eng",
        obfuscation,
        signals,
        features,
        tenant: Some("acme"),
        model,
        features_model: None,
        campaign: None,
    }
}

fn eval(p: &Policy, text: &str, features: serde_json::Value, model: Option<ModelView>) -> RuleVerdict {
    let features = features.as_object().cloned().unwrap_or_default();
    let signals = p.rules.count_signals(text);
    let obfuscation = Default::default();
    p.rules.evaluate(&input(text, &signals, &features, &obfuscation, model))
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
    for needle in ["signal `bad`", "rule `bad_cel`", "rule `bad_score`", "rule `typo_var`", "unknown variable `signal`"]
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
    let err =
        policy("[[rules]]\nname = \"a\"\nwhen = \"true\"\naction = \"block\"\nscore = 0.9\nsevrity = 1\n").unwrap_err();
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
        ("Send 0.5 BTC to this wallet address immediately or your files are published", Some("urgent_crypto_or_wire")),
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
    let input = RulesInput { tenant: None, ..input("invoice 4471", &signals, &features, &none_undone, None) };
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

#[test]
fn a_context_binds_what_its_class_reads_and_every_variable_can_be_read() {
    // One guard per variable, alone in its policy: the context binds only that variable, and the
    // guard must see it (an unbound variable would be an evaluation error, not a match).
    let reads = [
        ("signals", "signals.link > 0"),
        ("features", "features.amount > 100"),
        ("tenant", r#"tenant == "acme""#),
        ("text_len", "text_len > 10"),
        ("lang", r#"lang == "eng""#),
        ("obfuscation", "obfuscation.invisible_chars == 0"),
        ("model", "model.available && model.risk_score > 0.5"),
        ("features_model", "features_model.available && features_model.risk > 0.8"),
        ("campaign", "!campaign.available && campaign.count_1h == 0"),
        ("entity", "entity.found == 0"),
    ];
    assert_eq!(reads.map(|(v, _)| v), VARIABLES, "one case per variable, in order");
    let text = "pay at https://pay.example now";
    let (features, obfuscation) =
        (serde_json::json!({"amount": 250}).as_object().cloned().unwrap(), Default::default());
    for (var, when) in reads {
        let p = policy(&format!(
            "[signals.link]\npatterns = ['https?://\\S+']\n[[guards]]\nname = \"g\"\nwhen = '{when}'\naction = \"review\"\nscore = 0.5\n"
        ))
        .unwrap_or_else(|e| panic!("{var}: {e}"));
        assert_eq!(p.rules.guard_vars, Vars::of(var).unwrap(), "{var}: only what the guard reads is bound");
        let signals = p.rules.count_signals(text);
        let model = Some(ModelView { risk_score: 0.7, confidence: 0.7, ood_score: None });
        let input = RulesInput { features_model: Some(0.9), ..input(text, &signals, &features, &obfuscation, model) };
        let (guard, allow) = p.rules.guard_stage(&input);
        assert_eq!(guard.errors, vec![], "{var}");
        assert_eq!(guard.matched.map(|(name, _, _)| name).as_deref(), Some("g"), "{var}");
        assert_eq!(allow, ClassVerdict::default());
    }
}

#[test]
fn gift_card_codes_requested_raises_in_every_script_and_spares_warnings_and_presents() {
    let p = Policy::load_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap();
    let guard = |text: &str| {
        let c = crate::text::canonicalize(text);
        let signals = p.rules.count_signals(&c.text);
        let features = serde_json::Map::new();
        let input = input(&c.text, &signals, &features, &c.obfuscation, None);
        p.rules.guard(&input).matched.map(|(name, action, _)| (name, action))
    };
    let raised = Some(("gift_card_codes_requested".to_string(), Action::Review));
    for scam in [
        "I'm in a meeting, buy 4 Apple gift cards of $100 and send me photos of the back of the cards",
        "在嗎？幫我去7-11買GASH點數3000點，拍序號給我，明天還你",
        "帮我买两张京东卡，刮开后把卡密发我",
        "Compra dos tarjetas de regalo de Google Play y envíame los códigos",
    ] {
        assert_eq!(guard(scam), raised, "{scam}");
    }
    for ordinary in [
        "Never share gift card codes with anyone who calls you. Scammers ask for them.",
        "Got Mia an Amazon gift card for her birthday, the code is in the envelope",
        "Your Amazon order has shipped. Track it in the app.",
        "生日快乐！送你一张星巴克礼品卡，记得去店里用",
        "提醒：有人冒充主管要求大家购买礼品卡并拍照发回卡密，这是诈骗，请勿理会",
    ] {
        assert_eq!(guard(ordinary), None, "{ordinary}");
    }
}
