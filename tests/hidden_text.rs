//! Issue 25, item 3: hidden characters never lower a decision. Every text of every check set in
//! tests/data goes through the real server (bundled model and policy) as written and again with
//! invisible characters inserted at generated places — Unicode Tag characters (single, or runs
//! spelling ASCII: "ASCII smuggling"), variation selectors (single, or runs encoding bytes), and
//! every other kind of invisible or format character — and the second action is never below the
//! first. Removing a plain invisible character gives the canonical text back exactly, and text
//! smuggled in tags or selectors is read and raises to the `hidden_text` guard, so this holds by
//! construction; the test keeps it so.

mod common;
use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::json;

/// Every check set in tests/data.
const CHECK_SETS: [&str; 7] = [
    "adversarial.jsonl",
    "adversarial_b.jsonl",
    "adversarial_c.jsonl",
    "adversarial_d.jsonl",
    "ood_short.jsonl",
    "test_sample.jsonl",
    "val_sample.jsonl",
];

/// One run of hidden characters of one kind.
fn hidden() -> impl Strategy<Value = String> {
    let tag = |s: String| s.chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap()).collect::<String>();
    let selector = |b: u8| char::from_u32(if b < 16 { 0xFE00 + b as u32 } else { 0xE0100 + b as u32 - 16 }).unwrap();
    prop_oneof![
        // Tag characters: one, a run spelling ASCII, the language and cancel tags.
        (0xE0000u32..=0xE007F).prop_map(|c| char::from_u32(c).unwrap().to_string()),
        "[ -~]{1,40}".prop_map(tag),
        "[ -~]{1,40}".prop_map(move |s| format!("\u{E0001}{}\u{E007F}", tag(s))),
        // Variation selectors: one, or a run encoding bytes (UTF-8 text or not).
        any::<u8>().prop_map(move |b| selector(b).to_string()),
        "\\PC{1,12}".prop_map(move |s: String| s.bytes().map(selector).collect::<String>()),
        prop::collection::vec(any::<u8>(), 2..16).prop_map(move |v| v.into_iter().map(selector).collect::<String>()),
        // Every other invisible or format character: zero-width and joiners, bidi controls and
        // isolates, soft hyphen, word joiner, BOM, invisible operators, interlinear annotation,
        // C0/C1 controls, combining grapheme joiner, Mongolian selectors, Hangul fillers.
        prop::sample::select(vec![
            '\u{200B}',
            '\u{200C}',
            '\u{200D}',
            '\u{200E}',
            '\u{200F}',
            '\u{202A}',
            '\u{202B}',
            '\u{202C}',
            '\u{202D}',
            '\u{202E}',
            '\u{2060}',
            '\u{2061}',
            '\u{2062}',
            '\u{2063}',
            '\u{2064}',
            '\u{2066}',
            '\u{2067}',
            '\u{2068}',
            '\u{2069}',
            '\u{206A}',
            '\u{206F}',
            '\u{FEFF}',
            '\u{00AD}',
            '\u{061C}',
            '\u{180E}',
            '\u{FFF9}',
            '\u{FFFA}',
            '\u{FFFB}',
            '\u{0000}',
            '\u{0007}',
            '\u{001B}',
            '\u{007F}',
            '\u{0080}',
            '\u{009F}',
            '\u{034F}',
            '\u{180B}',
            '\u{180C}',
            '\u{180D}',
            '\u{3164}',
            '\u{FFA0}',
            '\u{115F}',
            '\u{1160}',
            '\u{1D173}',
            '\u{1D17A}',
        ])
        .prop_map(|c| c.to_string()),
    ]
}

/// `text` with 1-3 runs of hidden characters inserted at character boundaries.
fn with_hidden(text: String) -> impl Strategy<Value = String> {
    let chars = text.chars().count();
    prop::collection::vec((0..=chars, hidden()), 1..=3).prop_map(move |inserts| {
        let mut out: Vec<String> = text.chars().map(String::from).collect();
        out.push(String::new());
        for (at, run) in inserts {
            out[at].insert_str(0, &run);
        }
        out.concat()
    })
}

fn rank(action: &str) -> u8 {
    match action {
        "allow" => 0,
        "review" => 1,
        "block" => 2,
        other => panic!("unknown action {other}"),
    }
}

async fn action(text: &str) -> String {
    let reply = classify_unhurried(default_server(), json!({"text": text})).await;
    assert_eq!(reply.status, 200, "{:?}", String::from_utf8_lossy(&reply.body));
    reply.json()["action"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_characters_anywhere_never_lower_an_action() {
    let mut runner = TestRunner::deterministic();
    let mut checked = 0;
    let mut lowered = Vec::new();
    for set in CHECK_SETS {
        for (text, _) in labelled(set) {
            let variant = with_hidden(text.clone()).new_tree(&mut runner).unwrap().current();
            if variant.len() > 16 * 1024 {
                continue; // over max_text_bytes: refused whole, tested elsewhere
            }
            let (before, after) = tokio::join!(action(&text), action(&variant));
            if rank(&after) < rank(&before) {
                lowered.push(format!("{set}: {before} -> {after}: {variant:?}"));
            }
            checked += 1;
        }
    }
    assert!(checked > 1000, "only {checked} texts checked");
    assert!(lowered.is_empty(), "{} of {checked} lowered:\n{}", lowered.len(), lowered.join("\n"));
}

#[tokio::test]
async fn a_phishing_text_written_in_tag_characters_is_blocked_after_any_opening() {
    let phish = "Your account is locked. Confirm your password at http://secure-login.example.top now";
    let tags: String = phish.chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap()).collect();
    let selectors: String = phish
        .bytes()
        .map(|b| char::from_u32(if b < 16 { 0xFE00 + b as u32 } else { 0xE0100 + b as u32 - 16 }).unwrap())
        .collect();
    for text in [format!("Hi! {tags}"), format!("Hi \u{1F44B}{tags}"), format!("Lunch? \u{1F354}{selectors}")] {
        let reply = classify_unhurried(default_server(), json!({"text": text})).await;
        let d = reply.json();
        assert_eq!(d["action"], "block", "the model reads the hidden text where it stood: {d}");
    }
    // Hidden text that says nothing risky is blocked all the same, by the guard: no person
    // writes in tag characters or selector runs, and what a model behind reads is not what the
    // person sees.
    let harmless = "see you at lunch";
    let tags: String = harmless.chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap()).collect();
    let d = classify_unhurried(default_server(), json!({"text": format!("Hi! {tags}")})).await.json();
    assert_eq!((d["action"].as_str(), d["rule"].as_str()), (Some("block"), Some("hidden_text")), "{d}");
}
