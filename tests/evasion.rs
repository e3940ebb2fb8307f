//! Decisions a fraudster cannot talk around, end to end with the bundled policy and the real
//! model: text past the model's first window, look-alike characters of every kind, defanged
//! links, other languages, a guard over a confident model, a rule that fails to evaluate.
//! Assertions rest on what the pipeline guarantees (canonical text, windows, language routing,
//! guards), not on a particular model score.

mod common;
use common::*;
use serde_json::{json, Value};

async fn decide(text: &str, features: Value) -> Value {
    let reply = classify_unhurried(default_server(), json!({"text": text, "features": features})).await;
    assert_eq!(reply.status, 200, "{:?}", String::from_utf8_lossy(&reply.body));
    reply.json()
}

const BENIGN: &str = "Thanks again for hosting the team on Friday. The walk along the river was lovely, the \
    food at the harbour place was better than last year, and everyone agreed the quiz should become a \
    tradition. Photos are in the shared album; Priya has the ones from the boat. Next quarter we will \
    try the hills north of town if the weather holds, and Sam offered to book the minibus again. ";

#[tokio::test]
async fn a_request_after_a_long_benign_paragraph_is_read_and_never_allowed() {
    let text = format!(
        "{}{}Finally, IT asks everyone to confirm your password today at http://staff-portal.example.top/verify",
        BENIGN, BENIGN
    );
    let d = decide(&text, json!({})).await;
    let cpu = &d["path"][0];
    assert_eq!(cpu["tier"], "cpu");
    assert!(cpu["window"]["of"].as_u64().unwrap() >= 2, "the text was read in several windows: {d}");
    assert_ne!(d["action"], "allow", "{d}");
}

#[tokio::test]
async fn look_alike_characters_of_every_kind_are_seen_through() {
    let kinds = [
        ("cyrillic letters", "Your Apple ID is locked. Confirm your pаsswоrd at http://appleid.example.top now"),
        ("zero-width space", "Your account is locked. Confirm your pass\u{200B}word at http://appleid.example.top now"),
        ("soft hyphen", "Your account is locked. Confirm your pass\u{00AD}word at http://appleid.example.top now"),
        ("fullwidth", "Your account is locked. Confirm your ｐａｓｓｗｏｒｄ at http://appleid.example.top now"),
        ("greek letters", "Your account is locked. Cοnfirm yοur passwοrd at http://appleid.example.top now"),
    ];
    for (kind, text) in kinds {
        let d = decide(text, json!({})).await;
        assert_eq!(d["action"], "block", "{kind}: {d}");
        // Seen through: the obfuscation guard, the model, or the credential rule (which reads the
        // canonical text's signals; it decides where the model's verdict is below accept_risk_below).
        assert!(
            d["rule"] == "obfuscated_request" || d["tier"] == "cpu" || d["rule"] == "credential_phishing",
            "{kind}: the obfuscation guard, the model or the credential rule blocks it: {d}"
        );
    }
}

#[tokio::test]
async fn letters_split_apart_are_read_joined() {
    let text =
        "Mum I lost my phone, this is my new number. Please send me 500 pounds today for rent, I will pay you back.";
    let joined = decide(text, json!({})).await;
    for sep in ['|', '_', '.', '/', '~'] {
        let split = text.chars().map(String::from).collect::<Vec<_>>().join(&sep.to_string());
        let d = decide(&split, json!({})).await;
        // The model reads the joined text: the same verdict as the plain text, never an allow.
        assert_eq!(d["path"][0]["risk_score"], joined["path"][0]["risk_score"], "{sep:?}: {d}");
        assert_ne!(d["action"], "allow", "{sep:?}: {d}");
    }
}

#[tokio::test]
async fn defanged_links_count_as_links() {
    let d = decide(
        "Urgent: your mailbox is suspended. Re-enter your password at hxxps://mail-verify[.]top/login",
        json!({}),
    )
    .await;
    assert_ne!(d["action"], "allow", "{d}");
    // The guard sees the restored link: a request for a password with a link is never allowed.
    let quiet = decide("Please re-enter your password at hxxps://mail-verify[.]top/login", json!({})).await;
    assert_ne!(quiet["action"], "allow", "{quiet}");
}

#[tokio::test]
async fn other_languages_never_get_a_cpu_verdict() {
    // Languages outside the bundled model's `model_languages` (Dutch, Polish, Czech; Swahili and
    // Hausa, which whatlang reads as Javanese, the guess it also gives informal Indonesian).
    for text in [
        "Habari, hii ni namba yangu mpya. Nitumie elfu hamsini leo tafadhali, nitakurudishia kesho.",
        "Sannu, wannan sabuwar lambata ce. Aiko min kudi yanzu.",
        "Uw pakket ligt klaar in ons depot. Betaal de verzendkosten van 1,99 euro hier: https://pakket-volgen.example.top",
        "Cześć Marto, zjemy razem obiad w czwartek? Czekam na ciebie o drugiej w naszej ulubionej restauracji.",
        "Vážený zákazníku, váš účet byl zablokován. Potvrďte prosím své údaje okamžitě na http://banka.example.top",
    ] {
        let d = decide(text, json!({})).await;
        assert_eq!(path_steps(&d)[0], ("cpu".into(), "language".into()), "{d}");
        assert_ne!(d["tier"], "cpu", "{d}");
        assert!(d["path"][0]["reason"].as_str().unwrap().contains("not one the model reads"), "{d}");
    }
    // A foreign fee request with a link: a person looks (never allowed); an invitation is never blocked.
    let scam = decide(
        "Uw pakket ligt klaar. Betaal de verzendkosten van 1,99 euro hier: https://pakket.example.top",
        json!({}),
    )
    .await;
    assert_ne!(scam["action"], "allow", "{scam}");
    let lunch = decide(
        "Cześć Marto, zjemy razem obiad w czwartek? Czekam na ciebie o drugiej w naszej ulubionej restauracji.",
        json!({}),
    )
    .await;
    assert_ne!(lunch["action"], "block", "{lunch}");
}

#[tokio::test]
async fn a_guard_overrules_a_confident_allow() {
    // An ordinary message with a large cross-border payment attached: whatever the model says of the
    // words, the guard asks for a person.
    let d = decide(
        "Invoice 2231 settled, thanks for the quick turnaround!",
        json!({"amount": 50000, "country": "NG", "home_country": "DE"}),
    )
    .await;
    assert_ne!(d["action"], "allow", "{d}");
    let raised =
        d["path"].as_array().unwrap().iter().any(|s| s["tier"] == "guard" && s["rule"] == "large_cross_border_payment");
    let model_flagged = d["path"][0]["risk_score"].as_f64().unwrap_or(0.0) >= 0.3;
    assert!(raised || model_flagged, "{d}");
}

#[tokio::test]
async fn a_rule_that_fails_to_evaluate_raises_to_review() {
    // `amount` sent as a string: the guard's comparison fails; the decision is at least review.
    let d = decide("Invoice 2231 settled, thanks!", json!({"amount": "50000", "country": "NG", "home_country": "DE"}))
        .await;
    assert_ne!(d["action"], "allow", "{d}");
    let failed = d["path"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["reason"].as_str().is_some_and(|r| r.contains("failed to evaluate")));
    assert!(failed || d["action"] == "block", "the path says a rule failed: {d}");
}

#[tokio::test]
async fn explain_names_the_words_that_drove_the_score() {
    let text = "Your parcel is held at customs. Pay the release fee today at http://parcel-release.example.top/pay";
    let reply = send(
        default_server(),
        "POST",
        "/v1/classify?explain=true",
        &[("content-type", "application/json")],
        json!({"text": text}).to_string(),
    )
    .await;
    let d = reply.json();
    let attributions = d["explain"]["attributions"].as_array().expect("attributions with explain=true");
    assert!(!attributions.is_empty() && attributions.len() <= 12, "{d}");
    let deltas: Vec<f64> = attributions.iter().map(|a| a["delta"].as_f64().unwrap().abs()).collect();
    assert!(deltas.windows(2).all(|w| w[0] >= w[1]), "largest effect first: {deltas:?}");
    for a in attributions {
        assert!(text.contains(a["word"].as_str().unwrap()), "{a}");
    }
    // Each delta is the score with the word minus without it, so it is bounded by the score range.
    assert!(deltas.iter().all(|d| *d <= 1.0));
}
