//! Labels against a real server and its real audit store: `POST /v1/feedback` joins a label to
//! its decision by record id or request id (idempotent per record and source, an update
//! replacing a label, an unknown id a 404 naming it, hashed-text records counting as any), live
//! quality on `/metrics` reads back exact counts, a tenant's API key labels only its own
//! decisions, and in a fleet of two replicas (two processes) a label sent to either counts.

mod common;

use common::Sidecar;
use http::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use tiergate::audit::{AuditConfig, TextMode};
use tiergate::gateway::Sources;

use common::{BENIGN, PHISHING};
const TOKEN: &str = "feedback-admin-token";
const MIXED: [&str; 4] = [
    BENIGN,
    PHISHING,
    "Your parcel is held at customs: pay the 2.99 EUR fee at http://parcel-fee.example.top today.",
    "Can you send me the slides from this morning's meeting?",
];

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-feedback-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &Value) -> common::Reply {
    let mut all = vec![("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000")];
    all.extend_from_slice(headers);
    common::send(addr, "POST", path, &all, body.to_string()).await
}

async fn label(admin: SocketAddr, body: Value) -> common::Reply {
    let bearer = format!("Bearer {TOKEN}");
    post(admin, "/v1/feedback", &[("authorization", bearer.as_str())], &body).await
}

/// Every sample of `family` on `addr`'s `/metrics`: its labels and value.
async fn samples(addr: SocketAddr, family: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let text = common::send(addr, "GET", "/metrics", &[], "").await.body;
    let text = String::from_utf8_lossy(&text).into_owned();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&format!("{family}{{"))) {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        let labels = labels[family.len() + 1..labels.len() - 1]
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect();
        out.push((labels, value.parse().unwrap()));
    }
    out
}

/// `{tier/action/truth -> count}` from the `window="1h"` series of the by-tier family.
async fn by_tier(admin: SocketAddr) -> BTreeMap<(String, String, String), u64> {
    let mut counts = BTreeMap::new();
    for (l, v) in samples(admin, "tiergate_quality_labelled_by_tier").await {
        if l["window"] == "1h" && v > 0.0 {
            counts.insert((l["tier"].clone(), l["action"].clone(), l["truth"].clone()), v as u64);
        }
    }
    counts
}

/// [`by_tier`] once it equals `expected` (the quality refresh runs about once a second), or
/// what it is after 10 s.
async fn by_tier_once_it_is(
    admin: SocketAddr,
    expected: &BTreeMap<(String, String, String), u64>,
) -> BTreeMap<(String, String, String), u64> {
    let mut seen = BTreeMap::new();
    for _ in 0..100 {
        seen = by_tier(admin).await;
        if &seen == expected {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    seen
}

/// 200 decisions on a server with the hashed-text audit trail, 100 of them labelled (by record
/// id and by request id, with repeats, updates and unknown ids): the answers say what became of
/// each, and live quality counts exactly the labelled decisions by what decided them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_join_their_decisions_and_live_quality_counts_them_exactly() {
    let dir = scratch("exact");
    let mut config = common::config(&common::repo().join("policies"));
    config.audit = Some(AuditConfig { dir: dir.clone(), text: TextMode::Hash, ..AuditConfig::default() });
    config.feedback.refresh_interval_ms = 1_000;
    let (public, admin, _gateway) = common::start_with_admin(config, Sources::default(), Some(TOKEN));
    let mut decisions = Vec::new();
    for i in 0..200 {
        let id = format!("fb-{i}");
        let reply = post(public, "/v1/classify", &[("x-request-id", &id)], &json!({"text": MIXED[i % 4]})).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        let d = reply.json();
        let record_id = d["record_id"].as_str().expect("a decision names its audit record").to_string();
        decisions.push((
            id,
            record_id,
            d["tier"].as_str().unwrap().to_string(),
            d["action"].as_str().unwrap().to_string(),
        ));
    }
    let mut expected: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let truth = |i: usize| if i % 3 == 0 { "risk" } else { "ok" };
    // 80 by record id, one at a time; 20 by request id in one batch.
    for (i, (_, record_id, ..)) in decisions.iter().enumerate().take(80) {
        let reply = label(admin, json!({"record_id": record_id, "label": truth(i), "source": "analyst"})).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        assert_eq!(reply.json()["results"][0]["outcome"], "accepted");
    }
    let batch: Vec<Value> = (80..100)
        .map(|i| json!({"request_id": decisions[i].0, "label": truth(i), "source": "analyst", "reviewer": "ann"}))
        .collect();
    let reply = label(admin, Value::Array(batch)).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let results = reply.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 20);
    assert!(results.iter().all(|r| r["outcome"] == "accepted"), "{results:?}");
    assert_eq!(results[0]["record_id"], decisions[80].1.as_str(), "a request id finds its record");
    // Repeats change nothing; an update replaces the label (records 0..5 were `risk` at i % 3 == 0).
    let repeat = label(admin, json!({"record_id": decisions[1].1, "label": "ok", "source": "analyst"})).await;
    assert_eq!(repeat.json()["results"][0]["outcome"], "duplicate");
    let update = label(admin, json!({"record_id": decisions[3].1, "label": "ok", "source": "analyst"})).await;
    assert_eq!(update.json()["results"][0]["outcome"], "updated");
    let unknown =
        label(admin, json!({"record_id": "0190aaaa-0000-7000-8000-000000000000", "label": "ok", "source": "analyst"}))
            .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{:?}", unknown.body);
    let error = &unknown.json()["error"];
    assert_eq!((error["code"].as_str(), error["field"].as_str()), (Some("unknown_record"), Some("record_id")));
    assert!(error["message"].as_str().unwrap().contains("0190aaaa-0000-7000-8000-000000000000"), "{error}");
    let mixed = label(admin, json!([{"request_id": "never-sent", "label": "ok", "source": "analyst"}])).await;
    assert_eq!(mixed.json()["results"][0]["outcome"], "unknown", "in a batch an unknown id is an outcome");
    for (i, (_, _, tier, action)) in decisions.iter().enumerate().take(100) {
        let truth = if i == 3 { "ok" } else { truth(i) };
        *expected.entry((tier.clone(), action.clone(), truth.to_string())).or_default() += 1;
    }
    let seen = by_tier_once_it_is(admin, &expected).await;
    assert_eq!(seen, expected, "live quality counts each labelled decision once, by its final label");
    let outcomes: BTreeMap<String, f64> = samples(admin, "tiergate_feedback_labels_total")
        .await
        .into_iter()
        .filter(|(l, _)| l["source"] == "analyst")
        .map(|(l, v)| (l["outcome"].clone(), v))
        .collect();
    let want: BTreeMap<String, f64> = [("accepted", 100.0), ("duplicate", 1.0), ("updated", 1.0), ("unknown", 2.0)]
        .map(|(k, v)| (k.into(), v))
        .into();
    assert_eq!(outcomes, want);
    assert_eq!(expected.values().sum::<u64>(), 100);
    let actions: std::collections::BTreeSet<&String> = expected.keys().map(|(_, action, _)| action).collect();
    assert!(actions.len() >= 2, "the mix decides more than one way: {expected:?}");
    let model: u64 = expected.iter().filter(|((tier, ..), _)| tier == "cpu" || tier == "gpu").map(|(_, n)| n).sum();
    let ece_over = samples(admin, "tiergate_quality_model_labelled").await;
    let ece_over = ece_over.iter().find(|(l, _)| l["window"] == "1h").map(|(_, v)| *v as u64);
    assert_eq!(ece_over, Some(model), "the ECE is over the model tiers' labelled decisions");
}

/// Behind the proxy, the app gets the decision's record id in `x-tiergate-record-id` and labels
/// the decision by it (a review its analyst worked, a chargeback weeks later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_behind_the_proxy_labels_its_decision_by_the_record_id_header() {
    let app = common::app::start();
    let routes = format!(
        "[[routes]]\nname = \"pay\"\npath_prefix = \"/pay\"\nupstream = [\"{}\"]\n\
         [routes.screen]\ntext = [\"/note\"]\n",
        app.url()
    );
    let mut config = common::config_with_routes(&common::repo().join("policies"), &routes);
    config.audit = Some(AuditConfig { dir: scratch("proxy"), ..AuditConfig::default() });
    let (proxy, admin, _gateway) = common::start_with_admin(config, Sources::default(), Some(TOKEN));
    let reply = post(proxy, "/pay", &[], &json!({"note": BENIGN})).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let seen = app.requests().pop().expect("the allowed request reached the app");
    let record_id = seen.headers["x-tiergate-record-id"].to_str().unwrap().to_string();
    assert_eq!(record_id.len(), 36, "a UUID: {record_id}");
    let labelled = label(admin, json!({"record_id": record_id, "label": "risk", "source": "chargeback"})).await;
    assert_eq!(labelled.status, StatusCode::OK, "{:?}", labelled.body);
    let result = &labelled.json()["results"][0];
    assert_eq!(
        (result["outcome"].as_str(), result["request_id"].as_str()),
        (Some("accepted"), seen.headers["x-request-id"].to_str().ok())
    );
}

/// Bad labels are refused naming the field; the public listener takes labels only from a
/// tenant's API key, for that tenant's own decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_labels_only_its_own_decisions_and_bad_labels_name_their_field() {
    use sha2::Digest;
    let dir = scratch("tenants");
    let mut config = common::config(&common::repo().join("policies"));
    config.audit = Some(AuditConfig { dir, ..AuditConfig::default() });
    let hex = |key: &str| format!("{:x}", sha2::Sha256::digest(key.as_bytes()));
    config.tenants.api_keys = [(hex("key-pay"), "payments".to_string()), (hex("key-chat"), "chat".to_string())].into();
    config.tenants.known = [("payments", "standard"), ("chat", "standard")].map(|(t, c)| (t.into(), c.into())).into();
    config.tenants.classes.insert("standard".into(), Default::default());
    let (public, admin, _gateway) = common::start_with_admin(config, Sources::default(), Some(TOKEN));
    let decide = |key: &'static str| async move {
        let reply = post(public, "/v1/classify", &[("x-api-key", key)], &json!({"text": BENIGN})).await;
        reply.json()["record_id"].as_str().unwrap().to_string()
    };
    let (pay, chat) = (decide("key-pay").await, decide("key-chat").await);
    let body = |id: &str| json!({"record_id": id, "label": "risk", "source": "user_report"});
    let own = post(public, "/v1/feedback", &[("x-api-key", "key-pay")], &body(&pay)).await;
    assert_eq!((own.status, own.json()["results"][0]["outcome"].as_str()), (StatusCode::OK, Some("accepted")));
    let other = post(public, "/v1/feedback", &[("x-api-key", "key-pay")], &body(&chat)).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND, "another tenant's decision is not there for it");
    let anonymous = post(public, "/v1/feedback", &[], &body(&pay)).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let no_token = post(admin, "/v1/feedback", &[], &body(&chat)).await;
    assert_eq!(no_token.status, StatusCode::UNAUTHORIZED, "the admin listener's token guards labels");
    for (bad, field) in [
        (json!({"record_id": chat, "label": "maybe", "source": "analyst"}), "label"),
        (json!({"record_id": chat, "label": "ok", "source": "Analyst Team"}), "source"),
        (json!({"label": "ok", "source": "analyst"}), "record_id"),
        (json!([{"record_id": chat, "label": "ok", "source": "analyst", "note": "x".repeat(2001)}]), "labels[0].note"),
    ] {
        let reply = label(admin, bad).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{:?}", reply.body);
        assert_eq!(reply.json()["error"]["field"], field);
    }
    let wrong_method =
        common::send(admin, "GET", "/v1/feedback", &[("authorization", &format!("Bearer {TOKEN}"))], "").await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
}

/// A replica of a fleet of two processes, each with its own audit store, told of the other.
fn replica(name: &str, public: SocketAddr, admin: SocketAddr, peer_admin: SocketAddr) -> Sidecar {
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    let extra = format!(
        "[audit]\ndir = \"{}\"\n[feedback]\npeers = [\"http://{peer_admin}\"]\nrefresh_interval_ms = 1000\n",
        dir.join("audit").display()
    );
    let config = common::serve_config(public, admin, &common::repo().join("policies"), &extra)
        .replace("[admin]\n", &format!("[admin]\ntoken = \"{TOKEN}\"\n"));
    let path = dir.join("tiergate.toml");
    std::fs::write(&path, config).unwrap();
    Sidecar::serve(&path, public, admin)
}

/// Labels sent to either replica count where the decision was made: the replica that does not
/// hold the record forwards it to the one that does, which counts it in its live quality.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_fleet_a_label_sent_to_any_replica_counts_where_its_decision_was_made() {
    let (a_public, a_admin, b_public, b_admin) =
        (common::free_port(), common::free_port(), common::free_port(), common::free_port());
    let a = replica("fleet-a", a_public, a_admin, b_admin);
    let b = replica("fleet-b", b_public, b_admin, a_admin);
    let on_a = post(a.public, "/v1/classify", &[], &json!({"text": PHISHING})).await.json();
    let on_b = post(b.public, "/v1/classify", &[], &json!({"text": BENIGN})).await.json();
    let ids = [on_a["record_id"].as_str().unwrap(), on_b["record_id"].as_str().unwrap()];
    // Both labels go to replica b: one is its own, one is forwarded to a.
    let reply = label(
        b.admin,
        json!([{"record_id": ids[0], "label": "risk", "source": "chargeback"},
               {"record_id": ids[1], "label": "ok", "source": "chargeback"}]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let results = reply.json()["results"].clone();
    assert_eq!((results[0]["outcome"].as_str(), results[1]["outcome"].as_str()), (Some("accepted"), Some("accepted")));
    assert_eq!(results[0]["replica"], format!("http://{a_admin}/"), "answered by the replica that holds it");
    assert!(results[1].get("replica").is_none(), "b's own record");
    let again = label(a.admin, json!({"record_id": ids[1], "label": "ok", "source": "chargeback"})).await;
    assert_eq!(again.json()["results"][0]["outcome"], "duplicate", "sent to a, it reaches b's store");
    let unknown = label(a.admin, json!({"record_id": "nowhere", "label": "ok", "source": "analyst"})).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "unknown on every replica");
    let tier = |d: &Value| d["tier"].as_str().unwrap().to_string();
    let action = |d: &Value| d["action"].as_str().unwrap().to_string();
    let want_a: BTreeMap<_, _> = [((tier(&on_a), action(&on_a), "risk".to_string()), 1)].into();
    let want_b: BTreeMap<_, _> = [((tier(&on_b), action(&on_b), "ok".to_string()), 1)].into();
    let mut seen = (BTreeMap::new(), BTreeMap::new());
    for _ in 0..100 {
        seen = (by_tier(a.admin).await, by_tier(b.admin).await);
        if seen == (want_a.clone(), want_b.clone()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(seen, (want_a, want_b), "each replica counts the labels of its own decisions");
    drop(a);
    let down = label(b.admin, json!({"record_id": "somewhere-else", "label": "ok", "source": "analyst"})).await;
    assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE, "a peer that may hold it did not answer: retry, not 404");
}

/// `tiergate feedback import`: a chargeback CSV sent in batches to the admin listener; a file
/// with a bad row sends nothing and names the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_labels_import_in_bulk_and_a_bad_file_sends_nothing() {
    let dir = scratch("import");
    let mut config = common::config(&common::repo().join("policies"));
    config.audit = Some(AuditConfig { dir: dir.join("audit"), ..AuditConfig::default() });
    let (public, admin, _gateway) = common::start_with_admin(config, Sources::default(), Some(TOKEN));
    let mut ids = Vec::new();
    for (i, text) in MIXED.iter().enumerate() {
        let id = format!("imp-{i}");
        post(public, "/v1/classify", &[("x-request-id", &id)], &json!({"text": text})).await;
        ids.push(id);
    }
    let import = |file: PathBuf| {
        let admin = format!("http://{admin}");
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
                .args(["feedback", "import"])
                .arg(&file)
                .args(["--admin", &admin, "--batch", "2"])
                .env("TIERGATE_ADMIN_TOKEN", TOKEN)
                .output()
                .unwrap()
        })
    };
    let bad = dir.join("bad.csv");
    std::fs::write(&bad, format!("request_id,label\n{},risk\n{},fraud\n", ids[0], ids[1])).unwrap();
    let out = import(bad).await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3") && err.contains("label"), "{err}");
    let good = dir.join("chargebacks.csv");
    let rows: String = ids.iter().map(|id| format!("{id},risk,\"card, disputed\"\n")).collect();
    std::fs::write(&good, format!("request_id,label,note\n{rows}never-decided,risk,\n")).unwrap();
    let out = import(good.clone()).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("5 labels") && stdout.contains("4 accepted, 1 unknown"), "{stdout}");
    assert!(stdout.contains("never-decided"), "{stdout}");
    let again = import(good).await.unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("4 duplicate, 1 unknown"), "an import can be rerun");
}
