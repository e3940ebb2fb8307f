//! A policy's own cpu temperature (`[calibration] cpu_temperature`): every cpu verdict is read at
//! it, exactly `sigmoid(logit(p) · T_model / T)` of the model's score `p`; a shadow candidate
//! replays the live run's verdict at its own temperature, and an `[ab]` candidate decides its
//! share at its own, the verdict cache on (a verdict cached under one temperature is never served
//! at another). `/readyz` and `/admin/policy` show it; a bad value is refused naming the key.

mod common;
use common::*;
use serde_json::{json, Value};
use std::net::SocketAddr;
use tiergate::decision::{Arm, Decision, TierName};
use tiergate::gateway::ab::band::arm_of;
use tiergate::gateway::Sources;

/// The policy temperature the tests set (the bundled model's own is in models/calibration.json).
const T: f64 = 2.5;

/// The bundled policies plus a `calibration.toml` of `[calibration] cpu_temperature = t`.
fn with_temperature(name: &str, t: &str) -> std::path::PathBuf {
    let dir = policies_with_routing(name, &bundled_routing());
    std::fs::copy(repo().join("policies/scenarios.toml"), dir.join("scenarios.toml")).unwrap();
    std::fs::write(dir.join("calibration.toml"), format!("[calibration]\ncpu_temperature = {t}\n")).unwrap();
    dir
}

/// The model's risk score `p` (at `model_t`) read at `t`, spelt out here rather than taken from
/// tiergate: for two classes `softmax(z / t)[1] = sigmoid((z1 - z0) / t)` and
/// `z1 - z0 = model_t · ln(p / (1 - p))`.
fn at_temperature(p: f64, model_t: f64, t: f64) -> f64 {
    let margin = model_t * (p / (1.0 - p)).ln();
    1.0 / (1.0 + (-margin / t).exp())
}

/// Texts of the test sample the cpu tier reads (English, short).
fn texts() -> Vec<String> {
    let mut texts: Vec<String> = labelled("test_sample.jsonl").into_iter().map(|(t, _)| t).take(10).collect();
    texts.extend([BENIGN.to_string(), PHISHING.to_string()]);
    texts
}

fn cpu_step(d: &Decision) -> Option<f64> {
    d.path.first().filter(|s| s.tier == TierName::Cpu).and_then(|s| s.risk_score)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_temperature_reads_the_cpu_verdict_at_it_and_a_shadow_replay_at_its_own() {
    let mut c = config(&with_temperature("calibration-live", &T.to_string()));
    c.shadow.dir = Some(repo().join("policies"));
    c.shadow.share = 1.0;
    let server = c.server.clone();
    let (_, admin, gateway) = start_with_admin(c, Sources::default(), None);
    let model_t = gateway.cpu.info().temperature;
    let bundled: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("models/calibration.json")).unwrap()).unwrap();
    assert_eq!(model_t, bundled["temperature"].as_f64().unwrap(), "models/calibration.json");
    assert_ne!(model_t, T, "the policy's temperature must differ from the model's for this test to tell them apart");

    let mut read = 0;
    for (i, text) in texts().into_iter().enumerate() {
        let req = tiergate::ClassifyRequest::new(
            text.clone(),
            Default::default(),
            None,
            std::time::Duration::from_secs(5),
            &server,
        )
        .unwrap();
        let (live, shadow) = gateway.compare(req, format!("t-{i}")).await.unwrap();
        let shadow = shadow.expect("the shadow decides every request at share 1");
        let (Some(at_t), Some(at_model)) = (cpu_step(&live), cpu_step(&shadow)) else { continue };
        read += 1;
        // The shadow replays the live run's recorded verdict: at the model's temperature, its own.
        let want = at_temperature(at_model, model_t, T);
        assert!((at_t - want).abs() < 1e-12, "{text:?}: live {at_t}, model {at_model}, formula {want}");
        let confidence = live.path[0].confidence.unwrap();
        assert!((confidence - want.max(1.0 - want)).abs() < 1e-12, "{text:?}: confidence {confidence}");
        if live.tier == TierName::Cpu {
            let actions = &gateway.policies.snapshot().actions;
            assert_eq!((live.risk_score, live.action), (at_t, actions.action_for(at_t)), "{text:?}");
        }
    }
    assert!(read >= 8, "the cpu tier read most of the texts: {read}");

    let ready = send(admin, "GET", "/readyz", &[], "").await.json();
    let cpu = &ready["tiers"]["cpu"];
    assert_eq!((cpu["temperature"].as_f64(), cpu["temperature_from"].as_str()), (Some(T), Some("policy")), "{ready}");
    assert_eq!(ready["model"]["temperature"], json!(model_t), "the model's own, beside it");
    let status = send(admin, "GET", "/admin/policy", &[], "").await.json();
    assert_eq!((&status["cpu_temperature"], &status["shadow"]["status"]["cpu_temperature"]), (&json!(T), &Value::Null));
}

#[test]
fn a_bad_policy_temperature_is_refused_naming_the_key() {
    for (bad, shown) in [("0", "0"), ("-1.3", "-1.3"), ("nan", "NaN"), ("inf", "inf")] {
        let (code, err) = check_policy(&with_temperature("calibration-bad", bad));
        assert_eq!(code, Some(1), "{bad}: {err}");
        let want = format!("calibration.toml: calibration.cpu_temperature: must be a finite number > 0, got {shown}");
        assert!(err.contains(&want), "{bad}: {err}");
    }
    let dir = with_temperature("calibration-key", "1.3");
    std::fs::write(dir.join("calibration.toml"), "[calibration]\ntemperature = 1.3\n").unwrap();
    let (code, err) = check_policy(&dir);
    assert!(code == Some(1) && err.contains("unknown field `temperature`"), "{err}");
    let (code, err) = check_policy(&with_temperature("calibration-good", "1.3"));
    assert_eq!(code, Some(0), "{err}");
}

/// The API key of tenant `acme` (its SHA-256 is in the config), as in tests/ab.rs.
const API_KEY: &str = "ab-test-key";

/// `tiergate serve` with the bundled policies live, `candidate` on half of acme's keys (sticky by
/// `x-ab-key`, never rolled back here) and the verdict cache on.
fn serve_ab(name: &str, candidate: &std::path::Path) -> Sidecar {
    let dir = std::env::temp_dir().join(format!("tiergate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let extra = format!(
        "[ab]\ndir = \"{}\"\nshare = 0.5\nsticky = \"header\"\nkey_header = \"x-ab-key\"\n\
         [cache]\nenabled = true\n\
         [tenants]\n[tenants.known]\nacme = \"default\"\n\
         [tenants.api_keys]\n\"2f92845518aab11b622f37edb67bcca73d8aabb6d1771b11ff2cde5c159c2840\" = \"acme\"\n",
        candidate.display(),
    );
    Sidecar::serve_in(&dir, &repo().join("policies"), &extra)
}

/// A key of acme's in `arm`.
fn key_in(arm: Arm) -> String {
    (0..100).map(|i| format!("k-{i}")).find(|k| arm_of(&format!("acme\n{k}"), 0.5) == arm).unwrap()
}

async fn classify_as(addr: SocketAddr, key: &str, text: &str) -> Value {
    let headers = [
        ("content-type", "application/json"),
        ("x-tiergate-deadline-ms", "5000"),
        ("x-api-key", API_KEY),
        ("x-ab-key", key),
    ];
    let reply = send(addr, "POST", "/v1/classify", &headers, json!({"text": text}).to_string()).await;
    assert_eq!(reply.status, http::StatusCode::OK);
    reply.json()
}

/// The cpu step's risk score and whether it was reused from the verdict cache.
fn cpu_of(d: &Value) -> Option<(f64, bool)> {
    let step = &d["path"][0];
    (step["tier"] == "cpu").then(|| (step["risk_score"].as_f64().unwrap(), step["cached"] == json!(true)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ab_candidate_decides_at_its_own_temperature_cached_or_not() {
    let candidate = with_temperature("calibration-ab", &T.to_string());
    let server = serve_ab("calibration-ab-serve", &candidate);
    let (live_key, candidate_key) = (key_in(Arm::Live), key_in(Arm::Candidate));
    let model_t = send(server.admin, "GET", "/readyz", &[], "").await.json()["model"]["temperature"].as_f64().unwrap();
    let ab = send(server.admin, "GET", "/admin/policy", &[], "").await.json()["ab"].clone();
    assert_eq!(ab["candidate"]["cpu_temperature"], json!(T), "{ab}");

    let (mut read, mut reused) = (0, 0);
    for text in texts() {
        let mut seen = Vec::new();
        // Twice per arm: the second is the verdict cache's (the arm is in its key).
        for key in [&live_key, &candidate_key, &live_key, &candidate_key] {
            let d = classify_as(server.public, key, &text).await;
            let arm = if key == &live_key { "live" } else { "candidate" };
            assert_eq!(d["arm"], arm, "{d}");
            seen.push(cpu_of(&d));
        }
        let [Some((live, _)), Some((cand, _)), Some((live2, cached_live)), Some((cand2, cached_cand))] = seen[..]
        else {
            continue;
        };
        read += 1;
        reused += usize::from(cached_live && cached_cand);
        let want = at_temperature(live, model_t, T);
        assert!((cand - want).abs() < 1e-12, "{text:?}: candidate {cand}, live {live}, formula {want}");
        assert_eq!((live2, cand2), (live, cand), "{text:?}: a reused verdict is read at its arm's temperature");
    }
    assert!(read >= 8 && reused >= 8, "read by the cpu tier: {read}, reused from the cache: {reused}");
    drop(server);
}
