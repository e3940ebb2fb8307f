//! The `tiergate` binary: check-policy, calibrate, explain in a scenario, and clear start-up errors.

mod common;
use common::repo;
use std::process::Command;

fn tiergate() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tiergate"));
    c.current_dir(repo());
    c
}

#[test]
fn check_policy_accepts_the_bundled_policy_and_rejects_a_broken_one() {
    let out = tiergate().args(["check-policy", "policies"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("is valid: version "));

    let dir = common::policies_with_rules(
        "broken",
        "[[rules]]\nname = \"oops\"\nwhen = \"signals.link >\"\naction = \"block\"\nscore = 0.9\n",
    );
    let (code, err) = common::check_policy(&dir);
    assert_eq!(code, Some(1));
    assert!(err.contains("rules.toml") && err.contains("rule `oops`") && err.contains("bad CEL"), "{err}");
}

#[test]
fn a_missing_onnxruntime_library_is_a_clear_error() {
    let out = tiergate()
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ORT_DYLIB_PATH points at /nonexistent/libonnxruntime.so, which is not a file"), "{err}");
}

/// A fresh directory of links to the bundled model's files, except `copied`, which are copies.
fn model_dir_copy(tag: &str, copied: &[&str]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(repo().join("models")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        if copied.iter().any(|c| std::ffi::OsStr::new(c) == name) {
            std::fs::copy(&path, dir.join(name)).unwrap();
        } else if path.is_file() {
            std::os::unix::fs::symlink(&path, dir.join(name)).unwrap();
        }
    }
    dir
}

#[test]
fn a_model_file_that_does_not_match_its_checksum_is_refused() {
    let dir = model_dir_copy("badsha", &["MANIFEST.sha256"]);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo().join("models/model.json")).unwrap()).unwrap();
    manifest["sha256"] = "0".repeat(64).into();
    std::fs::remove_file(dir.join("model.json")).unwrap();
    std::fs::write(dir.join("model.json"), manifest.to_string()).unwrap();
    // Re-pinned in MANIFEST.sha256, so the check that fails is model.json's pin of the ONNX file.
    assert!(tiergate::tier::manifest::record(&dir.join("model.json")).unwrap());
    let err = tiergate::tier::model::ModelAssets::load(&dir).err().expect("load must fail").to_string();
    assert!(err.contains("has sha256") && err.contains(&"0".repeat(64)), "{err}");
}

#[test]
fn the_bundled_model_matches_its_manifest_and_one_changed_byte_is_refused() {
    let bundled = tiergate::tier::model::ModelAssets::load(&repo().join("models")).unwrap();
    assert_eq!(bundled.info.manifest_sha256.len(), 64);
    for file in ["tokenizer.json", "calibration.json"] {
        let dir = model_dir_copy(&format!("onebyte-{}", &file[..3]), &[file]);
        let mut bytes = std::fs::read(dir.join(file)).unwrap();
        // A digit of the temperature / of a token id: still valid JSON, a different model.
        let at = bytes.iter().rposition(|b| b.is_ascii_digit()).unwrap();
        bytes[at] = if bytes[at] == b'9' { b'8' } else { bytes[at] + 1 };
        std::fs::write(dir.join(file), bytes).unwrap();
        let err = tiergate::tier::model::ModelAssets::load(&dir).err().expect("load must fail").to_string();
        let listed = std::fs::read_to_string(repo().join("models/MANIFEST.sha256")).unwrap();
        let expected = listed.lines().find(|l| l.ends_with(file)).unwrap().split(' ').next().unwrap().to_string();
        assert!(err.contains(file) && err.contains(&expected) && err.contains("has sha256"), "{err}");
    }
}

#[test]
fn a_model_file_the_manifest_does_not_list_is_refused() {
    let dir = model_dir_copy("unlisted", &["MANIFEST.sha256"]);
    let listed = std::fs::read_to_string(dir.join("MANIFEST.sha256")).unwrap();
    let without: String = listed.lines().filter(|l| !l.ends_with("ood.json")).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("MANIFEST.sha256"), without).unwrap();
    let err = tiergate::tier::model::ModelAssets::load(&dir).err().expect("load must fail").to_string();
    assert!(err.contains("ood.json") && err.contains("does not list"), "{err}");
}

#[test]
fn calibrate_fits_a_temperature_that_lowers_nll() {
    let out = tiergate().args(["calibrate", "--input", "tests/data/val_sample.jsonl"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // Rows: name, T, accuracy, NLL, ECE.
    let row = |name: &str| -> Vec<f64> {
        let line = stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} row in\n{stdout}"));
        line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect()
    };
    let (uncal, current, fitted) = (row("uncalibrated"), row("current"), row("fitted"));
    assert_eq!(uncal[0], 1.0);
    assert!(fitted[2] <= current[2] + 1e-4 && fitted[2] <= uncal[2] + 1e-4, "fitted T minimises NLL:\n{stdout}");
    assert_eq!(uncal[1], fitted[1], "temperature does not change accuracy");
    assert!(stdout.contains("reliability at fitted T"), "{stdout}");
}

#[test]
fn calibrate_refuses_to_write_a_temperature_from_one_label() {
    let dir = std::env::temp_dir().join(format!("tiergate-cal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("one_label.jsonl");
    std::fs::write(&input, "{\"text\": \"win a prize now\", \"label\": 1}\n{\"text\": \"free money\", \"label\": 1}\n")
        .unwrap();
    let out_file = dir.join("calibration.json");
    let out = tiergate().arg("calibrate").arg("--input").arg(&input).arg("--write").arg(&out_file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only one label"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out_file.exists(), "nothing written");
}

#[test]
fn calibrate_write_updates_the_manifest_so_the_model_still_loads() {
    let dir = model_dir_copy("calwrite", &["MANIFEST.sha256", "calibration.json"]);
    let input = dir.join("rows.jsonl");
    // The whole set (300 rows), so that the model gets some wrong: on rows it gets all right the
    // fit runs to the edge of its range and `calibrate` rightly refuses to write (round 9 reads the
    // first 80 without a mistake).
    let rows = std::fs::read_to_string(repo().join("tests/data/val_sample.jsonl")).unwrap();
    std::fs::write(&input, rows).unwrap();
    let cal = dir.join("calibration.json");
    let out = tiergate()
        .args(["calibrate", "--force", "--input"])
        .arg(&input)
        .arg("--models")
        .arg(&dir)
        .arg("--write")
        .arg(&cal)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("MANIFEST.sha256"), "{stdout}");
    assert_ne!(std::fs::read(&cal).unwrap(), std::fs::read(repo().join("models/calibration.json")).unwrap());
    let assets = tiergate::tier::model::ModelAssets::load(&dir).expect("the rewritten model loads");
    let bundled = tiergate::tier::model::ModelAssets::load(&repo().join("models")).unwrap();
    assert_ne!(assets.info.manifest_sha256, bundled.info.manifest_sha256);
}

#[test]
fn help_describes_every_command() {
    let out = tiergate().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["serve", "calibrate", "check-policy"] {
        assert!(text.contains(cmd), "{text}");
    }
}

/// `tiergate drift` on audit records: records that repeat the reference's own text lengths read
/// KS 0 on that signal; the same records with texts ten times longer read KS > 0.1 and are
/// flagged; ten records are too few to call drift; `--plot` writes an SVG.
#[test]
fn drift_reports_ks_per_signal_from_audit_records_and_plots() {
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo().join("models/reference.json")).unwrap()).unwrap();
    let s = &reference["samples"];
    let dir = std::env::temp_dir().join(format!("tiergate-drift-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rows = s["text_chars"].as_array().unwrap().len();
    let records = |scale: f64, step: usize, count: usize| -> std::path::PathBuf {
        let path = dir.join(format!("records-{scale}-{step}-{count}.jsonl"));
        // The reference keeps each signal sorted: row i is every signal's i-th smallest value.
        let lines: Vec<String> = (0..rows)
            .step_by(step)
            .take(count)
            .map(|i| {
                serde_json::json!({
                    "request_id": format!("r{i}"), "unix_ms": 1_764_633_600_000u64 + i as u64, "kind": "classify",
                    "risk_score": s["risk_score"][i], "ood_score": s["ood_score"][i],
                    "text_chars": (s["text_chars"][i].as_f64().unwrap() * scale) as u64, "lang": "eng",
                })
                .to_string()
            })
            .collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        path
    };
    let svg = dir.join("drift.svg");
    let run = |path: &std::path::Path, plot: bool| -> String {
        let mut c = tiergate();
        c.args(["drift", "--input"]).arg(path);
        if plot {
            c.arg("--plot").arg(&svg);
        }
        let out = c.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let row = |out: &str, signal: &str| out.lines().find(|l| l.starts_with(signal)).unwrap().to_string();
    let same = run(&records(1.0, 1, rows), false);
    assert!(row(&same, "text_chars").contains(" 0.0000"), "{same}");
    assert!(!row(&same, "text_chars").contains("drift"), "{same}");
    let longer = run(&records(10.0, 1, rows), true);
    assert!(row(&longer, "text_chars").contains("> 0.1: drift"), "{longer}");
    // Ten decisions spread over the lower 54 % of the reference: KS about 0.46, yet ten are too
    // few to tell that from chance (p ≈ 0.03).
    let few = run(&records(1.0, rows * 6 / 100, 10), false);
    assert!(few.starts_with("10 decisions"), "{few}");
    assert!(row(&few, "text_chars").contains("too few to tell"), "{few}");
    for signal in ["risk_score", "ood_score", "text_chars"] {
        assert!(!row(&few, signal).contains(": drift"), "{few}");
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    // --since after every record: nothing left to compare.
    let out =
        tiergate().args(["drift", "--since", "9999999999999", "--input"]).arg(records(1.0, 1, rows)).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("0 decisions"), "{out:?}");
}

#[test]
fn explain_decides_in_the_named_scenario_and_refuses_an_unknown_one() {
    let text = "Are we still on for lunch tomorrow at noon?";
    let out = tiergate()
        .args(["explain", "--text", text, "--scenario", "payments", "--policies", "policies"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let decision: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decision["scenario"], "payments", "{decision}");

    let out =
        tiergate().args(["explain", "--text", text, "--scenario", "chat", "--policies", "policies"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown scenario `chat`; known: content_review, payments"), "{err}");
}

/// `tiergate drift reference` with a config whose `[audit]` (and `[audit.kafka]`) name a store:
/// the command opens no audit trail — no directory made, no second writer or shipper of a live
/// server's store.
#[test]
fn drift_reference_leaves_the_audit_store_alone() {
    let dir = std::env::temp_dir().join(format!("tiergate-drift-ref-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let audit = dir.join("audit");
    let config = format!(
        "[model]\ndir = \"{}\"\n[policies]\ndir = \"{}\"\nwatch = false\n[audit]\ndir = \"{}\"\n\
         [audit.kafka]\nbrokers = [\"127.0.0.1:1\"]\n",
        repo().join("models").display(),
        repo().join("policies").display(),
        audit.display()
    );
    std::fs::write(dir.join("tiergate.toml"), config).unwrap();
    let rows = ["Are we still on for lunch tomorrow?", "Send your password to http://evil.example/login now."];
    let data: String = rows.iter().map(|t| format!("{}\n", serde_json::json!({"text": t, "label": 0}))).collect();
    std::fs::write(dir.join("val.jsonl"), data).unwrap();
    let out = tiergate()
        .args(["drift", "reference", "--data"])
        .arg(dir.join("val.jsonl"))
        .arg("--out")
        .arg(dir.join("reference.json"))
        .arg("--config")
        .arg(dir.join("tiergate.toml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("reference.json").exists());
    assert!(!audit.exists(), "drift reference opened the audit store as a writer");
}
