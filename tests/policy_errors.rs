//! One test per kind of policy error: `tiergate check-policy` exits 1 and names the file, the
//! line and the rule (or section / signal) in its message.

mod common;
use common::*;

/// Writes the bundled routing.toml plus `rules` as rules.toml; runs check-policy on it.
fn check(name: &str, rules: &str) -> (Option<i32>, String) {
    check_policy(&policies_with_rules(&format!("perr-{name}"), rules))
}

const SIGNAL: &str = "[signals.link]\npatterns = ['https?://\\S+']\n";

#[test]
fn bad_cel() {
    let (code, err) = check(
        "cel",
        &format!("{SIGNAL}[[rules]]\nname = \"r1\"\nwhen = \"signals.link > \"\naction = \"block\"\nscore = 0.9\n"),
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("rules.toml:3: rule `r1`: bad CEL"), "{err}");
}

#[test]
fn bad_regex() {
    let (code, err) = check("regex", "[signals.broken]\npatterns = ['(unclosed']\n");
    assert_eq!(code, Some(1));
    assert!(err.contains("rules.toml:1: signal `broken`: bad regex `(unclosed`"), "{err}");
}

#[test]
fn unknown_key() {
    let (code, err) = check(
        "key",
        &format!("{SIGNAL}[[rules]]\nname = \"r1\"\nwhen = \"true\"\naction = \"block\"\nscore = 0.9\nsevrity = 3\n"),
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("rules.toml") && err.contains("unknown field `sevrity`"), "{err}");
    assert!(err.contains("line 8"), "TOML errors carry the line: {err}");
}

#[test]
fn missing_reference() {
    let (code, err) = check(
        "ref",
        &format!("{SIGNAL}[[rules]]\nname = \"r1\"\nwhen = \"signals.lnk > 0\"\naction = \"block\"\nscore = 0.9\n"),
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("rules.toml:3: rule `r1`: unknown signal `lnk`; defined: link"), "{err}");
}

#[test]
fn out_of_range_threshold() {
    let (code, err) = check(
        "range",
        &format!("{SIGNAL}[[rules]]\nname = \"r1\"\nwhen = \"true\"\naction = \"block\"\nscore = 1.5\n"),
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("rules.toml:3: rule `r1`: score must be in [0, 1], got 1.5"), "{err}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let (code, err) = check(
        "many",
        "[signals.broken]\npatterns = ['(']\n[[rules]]\nname = \"a\"\nwhen = \"signals.nope > 0\"\naction = \"block\"\nscore = 2\n",
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("3 problem(s)"), "{err}");
}

#[test]
fn the_committed_json_schema_is_the_generated_one() {
    let committed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("docs/policy.schema.json")).unwrap()).unwrap();
    assert_eq!(
        committed,
        tiergate::policy::json_schema(),
        "regenerate: tiergate policy-schema > docs/policy.schema.json"
    );
    let props = committed["properties"].as_object().unwrap();
    for section in
        ["actions", "cascade", "default", "routing", "complexity", "cpu", "gpu", "prompt", "signals", "rules"]
    {
        assert!(props.contains_key(section), "{section} in the schema");
    }
    assert_eq!(committed["additionalProperties"], false, "unknown keys are errors for editors too");
}

#[test]
fn a_language_neighbour_must_stand_for_a_served_language() {
    let dir = std::env::temp_dir().join(format!("tiergate-perr-neighbour-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bundled = bundled_routing();
    let line =
        bundled.lines().find(|l| l.starts_with("language_neighbours")).expect("the bundled policy has neighbours");
    // Czech is not among the bundled model's languages.
    let routing = bundled.replace(line, "language_neighbours = { pol = \"ces\" }");
    std::fs::write(dir.join("routing.toml"), routing).unwrap();
    let (code, err) = check_policy(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("reads `pol` as `ces`, which is not in model_languages (eng, cmn,"), "{err}");
}

#[test]
fn a_file_that_does_not_parse_is_reported_alone() {
    // The bundled guards read signals that rules.toml defines: a syntax error there used to come
    // with one "unknown signal" problem per guard condition, burying it (42 problems for one).
    let dir = policies_with_rules("parse", "[signals.link\npatterns = ['https?://\\S+']\n");
    std::fs::copy(repo().join("policies/guards.toml"), dir.join("guards.toml")).unwrap();
    let (code, err) = check_policy(&dir);
    assert_eq!(code, Some(1));
    assert!(err.contains("1 problem(s)") && err.contains("rules.toml"), "{err}");
    assert!(!err.contains("unknown signal"), "{err}");
}

#[test]
fn a_confirm_band_must_lie_below_where_a_risk_verdict_stands() {
    let dir = std::env::temp_dir().join(format!("tiergate-perr-confirm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bundled = bundled_routing();
    let line = bundled.lines().find(|l| l.starts_with("accept_risk_below")).expect("the bundled policy sets it");
    let without = bundled.lines().filter(|l| !l.starts_with("confirm_")).collect::<Vec<_>>().join("\n");
    // At accept_risk_below a verdict stands unconfirmed: a band from there is an error.
    let at = line.split('=').nth(1).unwrap().trim();
    let routing = without.replace(line, &format!("{line}\nconfirm_from = {at}\nconfirm_at = 1.5"));
    std::fs::write(dir.join("routing.toml"), routing).unwrap();
    let (code, err) = check_policy(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("confirm_from ({at}) must be below")), "{err}");
    assert!(err.contains("confirm_at"), "both problems at once: {err}");
}
