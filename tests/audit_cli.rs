//! `tiergate audit`: filters, JSON lines, `--count`, and clear errors, over a real store.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use tiergate::audit::store::Store;
use tiergate::audit::AuditRecord;

/// A record as the writer would write it, with the given fields.
fn record(id: &str, unix_ms: u64, tenant: &str, action: &str, tier: &str, kind: &str, rules: &[&str]) -> AuditRecord {
    serde_json::from_value(serde_json::json!({
        "request_id": id, "unix_ms": unix_ms, "kind": kind, "tenant": tenant, "route": null,
        "policy_version": "v1", "model": {"name": "m", "sha256": null}, "action": action,
        "label": "ok", "risk_score": 0.1, "ood_score": null, "tier": tier, "path": [], "rules": rules,
        "latency_us": 5, "lang": "eng", "text_chars": 3, "text": {"mode": "full", "value": "abc"}
    }))
    .unwrap()
}

/// A store with four records an hour apart from 2025-12-01T10:00:00Z, and one a minute old.
fn store(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-audit-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let t0 = 1_764_583_200_000; // 2025-12-01T10:00:00Z
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut s = Store::open(&dir).unwrap();
    s.insert(&[
        record("a", t0, "acme", "allow", "cpu", "classify", &[]),
        record("b", t0 + 3_600_000, "acme", "block", "rules", "screen", &["credential_link"]),
        record("c", t0 + 7_200_000, "other", "review", "guard", "screen", &["large_amount", "credential_link"]),
        record("d", t0 + 10_800_000, "other", "block", "rules", "stream_cut", &["credential_link"]),
        record("e", now - 60_000, "acme", "allow", "cpu", "shadow", &[]),
    ])
    .unwrap();
    dir
}

fn audit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiergate")).arg("audit").args(args).output().unwrap()
}

/// The request ids printed, in order.
fn ids(out: &Output) -> Vec<String> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<AuditRecord>(l).unwrap().request_id)
        .collect()
}

#[test]
fn filters_select_the_records_and_print_json_lines() {
    let dir = store("filters");
    let d = dir.to_str().unwrap();
    let q = |extra: &[&str]| ids(&audit(&[&["--dir", d], extra].concat()));
    assert_eq!(q(&[]), ["a", "b", "c", "d", "e"], "all, oldest first");
    assert_eq!(q(&["--request-id", "c"]), ["c"]);
    assert_eq!(q(&["--tenant", "acme"]), ["a", "b", "e"]);
    assert_eq!(q(&["--action", "block"]), ["b", "d"]);
    assert_eq!(q(&["--tier", "guard"]), ["c"]);
    assert_eq!(q(&["--kind", "screen"]), ["b", "c"]);
    assert_eq!(q(&["--rule", "credential_link"]), ["b", "c", "d"]);
    assert_eq!(q(&["--rule", "large_amount", "--action", "review"]), ["c"]);
    assert_eq!(q(&["--since", "2025-12-01T11:00:00Z", "--until", "2025-12-01T13:00:00Z"]), ["b", "c"]);
    assert_eq!(q(&["--since", "2025-12-01T12:00:00+01:00", "--limit", "2"]), ["b", "c"], "offsets count");
    assert_eq!(q(&["--since", "1h"]), ["e"], "a duration ago");
    assert_eq!(q(&["--until", "1h", "--tenant", "other"]), ["c", "d"]);
    let counted = audit(&["--dir", d, "--action", "block", "--count"]);
    assert_eq!(String::from_utf8_lossy(&counted.stdout).trim(), "2");
}

#[test]
fn errors_say_what_is_wrong() {
    let err = |args: &[&str]| {
        let out = audit(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = std::env::temp_dir().join("tiergate-audit-cli-nope");
    let e = err(&["--dir", missing.to_str().unwrap()]);
    assert!(e.contains("no audit directory") && e.contains("tiergate-audit-cli-nope"), "{e}");
    let empty = std::env::temp_dir().join(format!("tiergate-audit-cli-empty-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    assert!(err(&["--dir", empty.to_str().unwrap()]).contains("has no audit.db"));
    let dir = store("errors");
    let e = err(&["--dir", dir.to_str().unwrap(), "--since", "last tuesday"]);
    assert!(e.contains("--since: `last tuesday` is not an RFC 3339 time"), "{e}");
    let e = err(&["--dir", dir.to_str().unwrap(), "--since", "1h", "--until", "2h"]);
    assert!(e.contains("--since") && e.contains("must be before --until"), "{e}");
    for (flag, bad) in [("--kind", "bogus"), ("--action", "blocked"), ("--tier", "CPU")] {
        let out = audit(&["--dir", dir.to_str().unwrap(), flag, bad]);
        assert_eq!(out.status.code(), Some(2), "clap refuses {flag} {bad}");
    }
    let garbage = std::env::temp_dir().join(format!("tiergate-audit-cli-garbage-{}", std::process::id()));
    std::fs::create_dir_all(&garbage).unwrap();
    std::fs::write(garbage.join("audit.db"), b"not a database, not even close; ".repeat(200)).unwrap();
    let e = err(&["--dir", garbage.to_str().unwrap()]);
    assert!(e.contains("reading the audit store") && e.contains(&garbage.display().to_string()), "{e}");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["audit", "--dir", dir.to_str().unwrap(), "--count"])
        .stdout(full)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1) && e.contains("writing to stdout"),
        "a full disk is an error, not a panic: {e}"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_tiergate")).args(["audit", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--request-id") && help.contains("RFC 3339") && help.contains("--count"), "{help}");
}

#[test]
fn drift_reads_the_audit_store_leaving_out_shadow_and_unscreened_records() {
    let dir = store("drift");
    let mut unscreened =
        serde_json::to_value(record("u", 1_764_583_200_000, "acme", "unscreened", "unscreened", "screen", &[]))
            .unwrap();
    unscreened["label"] = serde_json::Value::Null;
    unscreened["risk_score"] = serde_json::Value::Null;
    Store::open(&dir).unwrap().insert(&[serde_json::from_value(unscreened).unwrap()]).unwrap();
    let reference = common::repo().join("models/reference.json");
    let drift = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tiergate"))
            .args(["drift", "--reference", reference.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = drift(&["--dir", dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // a-d count; e is a shadow record, u was forwarded unscreened (no score).
    assert!(text.starts_with("4 decisions from the audit store"), "{text}");
    // Every record is 3 chars long: far from the reference's text lengths.
    assert!(text.lines().any(|l| l.starts_with("text_chars") && l.ends_with("drift")), "{text}");
    let both = drift(&["--dir", dir.to_str().unwrap(), "--input", "x.jsonl"]);
    assert!(!both.status.success() && String::from_utf8_lossy(&both.stderr).contains("--dir"));
}
