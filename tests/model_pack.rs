//! `tiergate model pack` end to end on a tiny classifier (tests/data/pack, made by its
//! make_fixture.py; nothing is trained here): the packed directory loads, a server decides with it,
//! and what tiergate cannot serve is refused with a message that names it.

mod common;
use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/data/pack").join(name)
}

fn out_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-pack-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn pack(onnx: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .current_dir(repo())
        .args(["model", "pack", "--onnx"])
        .arg(onnx)
        .arg("--tokenizer")
        .arg(fixture("tokenizer.json"))
        .arg("--validation")
        .arg(fixture("validation.jsonl"))
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn refused(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn a_packed_classifier_is_served_and_decides() {
    let out = out_dir("ok");
    let run = pack(&fixture("classifier.onnx"), &out, &["--name", "tiny"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("packed tiny") && stdout.contains("60 validation rows"), "{stdout}");
    for f in ["model.json", "classifier.onnx", "tokenizer.json", "calibration.json", "ood.json", "MANIFEST.sha256"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    // The temperature was fitted (the fixture's logits are not calibrated at T = 1), and the card
    // carries the validation numbers.
    let calibration: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("calibration.json")).unwrap()).unwrap();
    let t = calibration["temperature"].as_f64().unwrap();
    assert!(t > 0.02 && t < 50.0 && (t - 1.0).abs() > 1e-3, "{calibration}");
    let card = std::fs::read_to_string(out.join("MODEL_CARD.md")).unwrap();
    assert!(card.contains("| served |") && card.contains("60 rows"), "{card}");
    let ood: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("ood.json")).unwrap()).unwrap();
    assert_eq!(ood["quantiles"].as_array().unwrap().len(), 101);

    // A server with the packed directory: the model decides, with its name, on both kinds.
    let mut config = config(&repo().join("policies"));
    config.model.dir = out.clone();
    let addr = start(config);
    let scam = classify_unhurried(addr, json!({"text": "urgent verify account password transfer now"})).await;
    let d = scam.json();
    assert_eq!(d["path"][0]["tier"], "cpu", "{d}");
    assert!(d["path"][0]["risk_score"].as_f64().unwrap() > 0.5, "{d}");
    let chat = classify_unhurried(addr, json!({"text": "see you at lunch tomorrow, thanks for the photos"})).await;
    assert!(chat.json()["path"][0]["risk_score"].as_f64().unwrap() < 0.5, "{}", chat.json());
    let ready = send(addr, "GET", "/readyz", &[], "").await.json();
    assert!(ready.to_string().contains("tiny"), "{ready}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn what_tiergate_cannot_serve_is_refused_before_anything_is_written() {
    // An extra input (token_type_ids, as many exports have).
    let out = out_dir("inputs");
    let err = refused(&pack(&fixture("with_token_type_ids.onnx"), &out, &[]));
    assert!(err.contains("token_type_ids") && err.contains("exactly `input_ids` and `attention_mask`"), "{err}");
    assert!(!out.exists(), "nothing is written for a refused model");
    // Classes in the wrong order, or more than two.
    let err = refused(&pack(&fixture("classifier.onnx"), &out, &["--labels", "risk,ok"]));
    assert!(err.contains("risk class \"risk\" first"), "{err}");
    let err = refused(&pack(&fixture("classifier.onnx"), &out, &["--labels", "ok,spam,risk"]));
    assert!(err.contains("3 classes"), "{err}");
    // A file that is not an ONNX model, and a validation row without a label.
    let err = refused(&pack(&fixture("tokenizer.json"), &out, &[]));
    assert!(err.contains("ONNX Runtime cannot load it"), "{err}");
    let bad = std::env::temp_dir().join(format!("tiergate-pack-bad-{}.jsonl", std::process::id()));
    std::fs::write(&bad, "{\"text\": \"hello\"}\n").unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["model", "pack", "--onnx"])
        .arg(fixture("classifier.onnx"))
        .arg("--tokenizer")
        .arg(fixture("tokenizer.json"))
        .arg("--validation")
        .arg(&bad)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = refused(&run);
    assert!(err.contains(":1: `label` must be 0, 1 or one of ok, risk"), "{err}");
    assert!(!out.exists());
    // An existing directory is not overwritten without --force.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep"), "x").unwrap();
    let err = refused(&pack(&fixture("classifier.onnx"), &out, &[]));
    assert!(err.contains("exists and is not empty"), "{err}");
    assert!(pack(&fixture("classifier.onnx"), &out, &["--force"]).status.success());
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_file(&bad);
}

/// Largest difference of a calibrated risk score between a text scored alone (batch of one,
/// unpadded) and inside one padded batch with texts of other lengths.
fn batch_drift(model_dir: &Path) -> f64 {
    use tiergate::tier::model::{ModelAssets, SessionOptions};
    let rows = std::fs::read_to_string(fixture("validation.jsonl")).unwrap();
    let texts: Vec<String> = rows
        .lines()
        .take(16)
        .enumerate()
        .map(|(i, l)| {
            let t = serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().to_string();
            if i % 2 == 0 {
                t.split(' ').take(2).collect::<Vec<_>>().join(" ")
            } else {
                t
            }
        })
        .collect();
    let env = tiergate::ort_lib::environment(None).unwrap();
    let options = SessionOptions::from(&tiergate::tier::ModelConfig { intra_threads: 1, ..Default::default() });
    let mut c = ModelAssets::load(model_dir).unwrap().classifier(env, options, None).unwrap();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let together = c.classify(&refs).unwrap();
    let alone = refs.iter().map(|t| c.classify(&[*t]).unwrap()[0].risk_score);
    alone.zip(&together).map(|(a, b)| (a - b.risk_score).abs()).fold(0.0, f64::max)
}

/// Batch invariance (issue 26): a static (QDQ) INT8 model, whose activation scales were fixed at
/// calibration, scores a text the same alone and among batch-mates (<= 1e-3; exactly here); a
/// dynamic INT8 one, whose scales are computed per call over the whole batch, does not — which is
/// why micro-batching is on only for a static model.
#[test]
fn a_static_int8_model_scores_a_text_the_same_alone_and_in_a_batch() {
    let dir = out_dir("static");
    let out = pack(&fixture("classifier_static_int8.onnx"), &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let drift = batch_drift(&dir);
    assert!(drift <= 1e-3, "static QDQ: alone vs in a batch differ by {drift}");

    let dir = out_dir("dynamic");
    let out = pack(&fixture("classifier_dynamic_int8.onnx"), &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let drift = batch_drift(&dir);
    assert!(drift > 1e-3, "dynamic INT8 moves with batch-mates, or this check could not fail: {drift}");
}

/// `[model.windows] parallel`: a long text taken alone while the other session is idle runs half
/// its windows there; with a static model the verdict is the one a single run gives (same score,
/// same riskiest window), and the split happened (counted), so this check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_text_on_two_sessions_scores_as_on_one() {
    use tiergate::tier::model::{ModelAssets, SessionOptions};
    use tiergate::tier::onnx::OnnxPool;
    use tiergate::tier::windows::Windows;
    use tiergate::tier::Prepared;
    let dir = out_dir("parallel");
    let out = pack(&fixture("classifier_static_int8.onnx"), &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows = std::fs::read_to_string(fixture("validation.jsonl")).unwrap();
    let words: Vec<String> = rows
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["text"].as_str().unwrap().to_string())
        .collect();
    let env = tiergate::ort_lib::environment(None).unwrap();
    let config = |parallel| tiergate::tier::ModelConfig {
        dir: dir.clone(),
        sessions: 2,
        intra_threads: 1,
        windows: Windows { parallel, ..Windows::default() },
        ..Default::default()
    };
    let mut one = ModelAssets::load_windows(&dir, config(false).windows)
        .unwrap()
        .classifier(env, SessionOptions::from(&config(false)), None)
        .unwrap();
    let pool = OnnxPool::start(env, &config(true), "parallel-test").unwrap();
    let far = || tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut windows_seen = Vec::new();
    for n in [3, 7, 12, 25, 60] {
        let text = words.iter().cycle().skip(n).take(n).cloned().collect::<Vec<_>>().join(" ");
        let alone = one.classify(&[text.as_str()]).unwrap().remove(0);
        let split = pool.classify(text.as_str().into(), Prepared::default(), far()).await.unwrap();
        assert_eq!(split.risk_score, alone.risk_score, "{n} texts");
        assert_eq!(split.window, alone.window, "{n} texts");
        assert_eq!(split.unread, alone.unread, "{n} texts");
        windows_seen.push(alone.window.map_or(1, |w| w.of));
    }
    let long = windows_seen.iter().filter(|&&w| w >= 2).count() as u64;
    assert!(long >= 2, "the texts must be long enough to have windows: {windows_seen:?}");
    assert_eq!(pool.texts_split(), long, "every text of two or more windows ran on both sessions: {windows_seen:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
