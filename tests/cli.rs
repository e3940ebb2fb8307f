//! The `tiergate` binary: check-policy, calibrate, and clear start-up errors.

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

    let dir = std::env::temp_dir().join(format!("tiergate-broken-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(repo().join("policies/routing.toml"), dir.join("routing.toml")).unwrap();
    std::fs::write(
        dir.join("rules.toml"),
        "[[rules]]\nname = \"oops\"\nwhen = \"signals.link >\"\naction = \"block\"\nscore = 0.9\n",
    )
    .unwrap();
    let out = tiergate().arg("check-policy").arg(&dir).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
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

#[test]
fn a_model_file_that_does_not_match_its_checksum_is_refused() {
    let dir = std::env::temp_dir().join(format!("tiergate-badsha-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(repo().join("models")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::os::unix::fs::symlink(&path, dir.join(path.file_name().unwrap())).unwrap();
        }
    }
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo().join("models/model.json")).unwrap()).unwrap();
    manifest["sha256"] = "0".repeat(64).into();
    std::fs::remove_file(dir.join("model.json")).unwrap();
    std::fs::write(dir.join("model.json"), manifest.to_string()).unwrap();
    let err = tiergate::tier::model::ModelAssets::load(&dir).err().expect("load must fail").to_string();
    assert!(err.contains("has sha256") && err.contains(&"0".repeat(64)), "{err}");
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
fn help_describes_every_command() {
    let out = tiergate().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["serve", "calibrate", "check-policy"] {
        assert!(text.contains(cmd), "{text}");
    }
}
