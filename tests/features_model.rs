//! The bundled features model (models/features, trained by models/recipe/features/train.py on
//! synthetic card transactions) in a real server beside the real text model: its contributions
//! are XGBoost's own SHAP values (tests/data/features_reference.json, written by the recipe) and
//! add up to its margin; its risk combines with the text's verdict, both tiers in the path; a
//! request that lacks a required feature or carries an unusable value is a 422 naming it.

mod common;

use common::{classify_unhurried, config, path_steps, repo, send};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::OnceLock;

const ORDINARY: &str = "Payment for order 4417, thank you";

fn server() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let mut c = config(&repo().join("policies"));
        c.features_model = Some(tiergate::features_model::FeaturesModelConfig { dir: repo().join("models/features") });
        common::start(c)
    })
}

fn reference() -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("tests/data/features_reference.json")).unwrap();
    serde_json::from_str::<Value>(&text).unwrap()["rows"].as_array().unwrap().clone()
}

async fn explain(features: &Value) -> Value {
    let body = json!({"text": ORDINARY, "features": features}).to_string();
    let headers = [("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000")];
    let r = send(server(), "POST", "/v1/classify?explain=true", &headers, body).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[tokio::test]
async fn contributions_are_the_recipes_shap_values_and_add_up_to_the_margin() {
    let rows = reference();
    assert_eq!(rows.len(), 20);
    let trees = std::fs::read_to_string(repo().join("models/features/trees.json")).unwrap();
    let trees: Value = serde_json::from_str(&trees).unwrap();
    let names: Vec<&str> = trees["features"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    for row in rows {
        let d = explain(&row["features"]).await;
        let e = &d["explain"]["features_model"];
        assert_eq!(e["method"], "tree_shap", "{d}");
        let margin = e["margin"].as_f64().unwrap();
        assert!(
            (margin - row["margin"].as_f64().unwrap()).abs() < 1e-4,
            "margin {margin} vs the recipe's {}",
            row["margin"]
        );
        let contributions = e["features"].as_array().unwrap();
        let sum: f64 = contributions.iter().map(|c| c["contribution"].as_f64().unwrap()).sum();
        let bias = e["bias"].as_f64().unwrap();
        assert!((bias + sum - margin).abs() < 1e-4, "bias {bias} + Σ {sum} vs margin {margin}");
        assert!((bias - row["bias"].as_f64().unwrap()).abs() < 1e-4, "bias {bias} vs XGBoost's {}", row["bias"]);
        // The recipe's SHAP values are in the model's input order (trees.json's feature list).
        let reference = row["shap"].as_array().unwrap();
        assert_eq!(contributions.len(), reference.len());
        for c in contributions {
            let name = c["feature"].as_str().unwrap();
            let at = names.iter().position(|n| *n == name).unwrap_or_else(|| panic!("{name} not in the reference"));
            let (ours, xgb) = (c["contribution"].as_f64().unwrap(), reference[at].as_f64().unwrap());
            assert!((ours - xgb).abs() < 1e-4, "{name}: TreeSHAP {ours}, XGBoost {xgb}");
        }
    }
}

#[tokio::test]
async fn a_risky_transaction_raises_an_ordinary_text_and_the_path_shows_both_tiers() {
    let rows = reference();
    let by_margin = |r: &&Value| r["margin"].as_f64().unwrap();
    let riskiest = rows.iter().max_by(|a, b| by_margin(a).total_cmp(&by_margin(b))).unwrap();
    let safest = rows.iter().min_by(|a, b| by_margin(a).total_cmp(&by_margin(b))).unwrap();

    let d = classify_unhurried(server(), json!({"text": ORDINARY, "features": riskiest["features"]})).await.json();
    assert_eq!((d["action"].as_str(), d["tier"].as_str()), (Some("block"), Some("features")), "{d}");
    let steps = path_steps(&d);
    assert_eq!(steps.first().map(|s| s.0.as_str()), Some("cpu"), "the text was read first: {steps:?}");
    assert!(steps.contains(&("features".into(), "accepted".into())), "{steps:?}");
    let step = d["path"].as_array().unwrap().iter().find(|s| s["tier"] == "features").unwrap();
    assert!(step["risk_score"].as_f64().unwrap() > 0.99, "{step}");
    assert!(step["reason"].as_str().unwrap().contains("the higher stands"), "{step}");
    assert_eq!(d["model"], "risk-features-xgb-synccfd");

    let d = classify_unhurried(server(), json!({"text": ORDINARY, "features": safest["features"]})).await.json();
    assert_eq!((d["action"].as_str(), d["tier"].as_str()), (Some("allow"), Some("cpu")), "{d}");
    let step = d["path"].as_array().unwrap().iter().find(|s| s["tier"] == "features").expect("a features step");
    assert!(step["risk_score"].as_f64().unwrap() < 0.01, "{step}");
    assert!(step["reason"].as_str().unwrap().contains("stands"), "{step}");

    // No feature of the schema: not scored, no step.
    let d = classify_unhurried(server(), json!({"text": ORDINARY, "features": {"country": "FR"}})).await.json();
    assert!(path_steps(&d).iter().all(|s| s.0 != "features"), "{d}");
}

#[tokio::test]
async fn missing_required_and_unusable_features_are_422_naming_them() {
    let r =
        classify_unhurried(server(), json!({"text": ORDINARY, "features": {"amount": 12.5, "is_night": true}})).await;
    assert_eq!(r.status, 422);
    let e = &r.json()["error"];
    assert_eq!(e["field"], "features");
    let message = e["message"].as_str().unwrap();
    assert!(message.contains("missing: card_not_present, is_weekend"), "{message}");

    let complete = json!({"amount": 12.5, "card_not_present": false, "is_night": false, "is_weekend": true});
    for (field, value, says) in [
        ("amount", json!(1e39), "finite"),
        ("amount", json!("NaN"), "must be a number"),
        ("is_night", json!(0.5), "is a bool"),
        ("terminal_risk_7d", json!({"x": 1}), "must be a number"),
    ] {
        let mut features = complete.clone();
        features[field] = value.clone();
        let r = classify_unhurried(server(), json!({"text": ORDINARY, "features": features})).await;
        assert_eq!(r.status, 422, "{field} = {value}");
        let e = &r.json()["error"];
        assert_eq!(e["field"], format!("features.{field}"));
        assert!(e["message"].as_str().unwrap().contains(says), "{e}");
    }
    // JSON has no NaN: a literal one is malformed JSON, refused before any model reads it.
    let body = r#"{"text": "hi", "features": {"amount": NaN, "card_not_present": 0, "is_night": 0, "is_weekend": 0}}"#;
    let r = send(server(), "POST", "/v1/classify", &[("content-type", "application/json")], body).await;
    assert_eq!(r.status, 400);

    let d = classify_unhurried(server(), json!({"text": ORDINARY, "features": complete})).await;
    assert_eq!(d.status, 200, "the required four are enough: the rest take their missing values");
}

fn pack(validation: &std::path::Path, out: &std::path::Path, trees: bool) -> std::process::Output {
    let bundled = repo().join("models/features");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"));
    cmd.current_dir(repo()).args(["features-model", "pack", "--name", "team-model", "--schema"]);
    cmd.arg(bundled.join("schema.toml")).arg("--onnx").arg(bundled.join("model.onnx"));
    cmd.arg("--validation").arg(validation).arg("--out").arg(out);
    if trees {
        cmd.arg("--trees").arg(bundled.join("trees.json"));
    }
    cmd.output().unwrap()
}

#[tokio::test]
async fn a_teams_own_model_is_packed_from_schema_onnx_and_a_validation_csv() {
    let out = std::env::temp_dir().join(format!("tiergate-features-pack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = pack(&repo().join("tests/data/features_validation.csv"), &out, false);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let said = String::from_utf8_lossy(&run.stdout);
    assert!(said.contains("300 validation rows (60 risk)") && said.contains("AUC"), "{said}");
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!((manifest["name"].as_str(), manifest["output"].as_str()), (Some("team-model"), Some("margin")));
    assert!(manifest["validation"]["auc"].as_f64().unwrap() > 0.8, "{manifest}");
    assert!(std::fs::read_to_string(out.join("MODEL_CARD.md")).unwrap().contains("| `amount` | Number |"));

    // Served: without trees.json the contributions are occlusion, and it still decides.
    let mut c = config(&repo().join("policies"));
    c.features_model = Some(tiergate::features_model::FeaturesModelConfig { dir: out.clone() });
    let addr = common::start(c);
    let features = &reference()[0]["features"];
    let body = json!({"text": ORDINARY, "features": features}).to_string();
    let r = send(addr, "POST", "/v1/classify?explain=true", &[("content-type", "application/json")], body).await;
    let d = r.json();
    assert_eq!(d["explain"]["features_model"]["method"], "occlusion", "{d}");
    assert_eq!(d["model"], "team-model");

    // Refused, with what is wrong: a CSV without a required column; an --out that is not empty.
    let bad = out.with_extension("csv");
    let csv = std::fs::read_to_string(repo().join("tests/data/features_validation.csv")).unwrap();
    std::fs::write(&bad, csv.replacen("is_night", "night", 1)).unwrap();
    let run = pack(&bad, &out.with_extension("bad"), false);
    assert!(String::from_utf8_lossy(&run.stderr).contains("no column for required feature(s) is_night"), "{run:?}");
    let run = pack(&repo().join("tests/data/features_validation.csv"), &out, true);
    assert!(String::from_utf8_lossy(&run.stderr).contains("exists and is not empty"), "{run:?}");
}
