//! The feedback loop end to end against a real server, a real SQLite store and the real
//! `tiergate report` binary: 200 decisions (`POST /v1/classify`, hashed audit text), 100 of them
//! labelled through `POST /v1/feedback` on the admin listener — by record id and by request id,
//! in batches and one by one, with repeats (counted once), changed labels, a second source and
//! unknown ids — then the exact counts read back from the report's JSON block and from the live
//! quality gauges on `/metrics`, every plot present and drawn, and a window with nothing in it.
//!
//! With `TIERGATE_SCREENSHOTS=DIR` the report page is also kept as `DIR/report.html`.

mod common;

use common::Reply;
use http::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tiergate::gateway::Sources;

const DECISIONS: usize = 200;
const LABELLED: usize = 100;
const REVIEWERS: [&str; 3] = ["ana", "bo", "o'brien <qa>"];
const UNKNOWN_RECORD: &str = "00000000-0000-7000-8000-000000000000";

/// One decision the test asked for, what it was told, and the truth its label ends up with.
struct Sent {
    record_id: String,
    request_id: String,
    tier: String,
    action: String,
    scenario: Option<&'static str>,
    tenant: Option<&'static str>,
    /// The data set's label.
    truth: &'static str,
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The config both the server and `tiergate report` read: the audit trail (text hashed, the
/// default), tenants in two classes, the bundled model and policies.
fn write_config(dir: &Path) -> PathBuf {
    let repo = common::repo();
    let text = format!(
        "[model]\ndir = \"{}\"\n[policies]\ndir = \"{}\"\nwatch = false\n[audit]\ndir = \"{}\"\ntext = \"hash\"\n\
         [feedback]\nrefresh_interval_ms = 1000\n[tenants]\naccept_claimed = true\n[tenants.known]\nacme = \"gold\"\nglobex = \"standard\"\n\
         [tenants.classes.gold]\n[tenants.classes.standard]\n",
        repo.join("models").display(),
        repo.join("policies").display(),
        dir.join("audit").display()
    );
    let path = dir.join("tiergate.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Every third text of a multilingual labelled set: (text, "risk" | "ok").
fn texts() -> Vec<(String, &'static str)> {
    let raw = std::fs::read_to_string(common::repo().join("tests/data/blind_ml.jsonl")).unwrap();
    raw.lines()
        .step_by(3)
        .take(DECISIONS)
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let truth = if v["label"] == "risk" { "risk" } else { "ok" };
            (v["text"].as_str().unwrap().to_string(), truth)
        })
        .collect()
}

async fn decide(addr: SocketAddr) -> Vec<Sent> {
    let mut sent = Vec::new();
    for (i, (text, truth)) in texts().into_iter().enumerate() {
        let tenant = [Some("acme"), Some("globex"), None][i % 3];
        let scenario = (i % 5 == 4).then_some("payments");
        let mut body = json!({"text": text});
        if let Some(t) = tenant {
            body["tenant"] = t.into();
        }
        if let Some(s) = scenario {
            body["scenario"] = s.into();
        }
        let request_id = format!("report-{i}");
        let headers = [
            ("content-type", "application/json"),
            ("x-request-id", request_id.as_str()),
            ("x-tiergate-deadline-ms", "5000"),
        ];
        let reply = common::send(addr, "POST", "/v1/classify", &headers, body.to_string()).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
        let d = reply.json();
        sent.push(Sent {
            record_id: d["record_id"].as_str().expect("a record id with the audit trail on").to_string(),
            request_id,
            tier: d["tier"].as_str().unwrap().to_string(),
            action: d["action"].as_str().unwrap().to_string(),
            scenario,
            tenant,
            truth,
        });
    }
    sent
}

async fn feedback(admin: SocketAddr, body: Value) -> Reply {
    common::send(admin, "POST", "/v1/feedback", &[("content-type", "application/json")], body.to_string()).await
}

fn outcomes(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    reply.json()["results"].as_array().unwrap().iter().map(|r| r["outcome"].as_str().unwrap().to_string()).collect()
}

fn flipped(truth: &str) -> &'static str {
    if truth == "risk" {
        "ok"
    } else {
        "risk"
    }
}

/// Labels decisions 0..100 (0..80 by record id in batches with a reviewer each, 80..100 by
/// request id one at a time), then repeats 0..10, changes 10..15, adds a chargeback to 20..25 and
/// names unknown records. Returns the truth that counts for each labelled decision.
async fn label(admin: SocketAddr, sent: &[Sent]) -> Vec<&'static str> {
    let analyst = |i: usize, truth: &str| json!({"record_id": sent[i].record_id, "label": truth, "source": "analyst", "reviewer": REVIEWERS[i % 3]});
    for batch in (0..80).collect::<Vec<_>>().chunks(20) {
        let body: Vec<Value> = batch.iter().map(|&i| analyst(i, sent[i].truth)).collect();
        assert_eq!(outcomes(&feedback(admin, json!(body)).await), vec!["accepted"; 20]);
    }
    for s in &sent[80..LABELLED] {
        let reply = feedback(admin, json!({"request_id": s.request_id, "label": s.truth, "source": "analyst"})).await;
        assert_eq!(outcomes(&reply), vec!["accepted"]);
        assert_eq!(reply.json()["results"][0]["record_id"], s.record_id.as_str(), "found by its request id");
    }
    let repeats: Vec<Value> = (0..10).map(|i| analyst(i, sent[i].truth)).collect();
    assert_eq!(outcomes(&feedback(admin, json!(repeats)).await), vec!["duplicate"; 10]);
    let changes: Vec<Value> = (10..15).map(|i| analyst(i, flipped(sent[i].truth))).collect();
    assert_eq!(outcomes(&feedback(admin, json!(changes)).await), vec!["updated"; 5]);
    let chargebacks: Vec<Value> =
        (20..25).map(|i| json!({"record_id": sent[i].record_id, "label": "risk", "source": "chargeback"})).collect();
    assert_eq!(outcomes(&feedback(admin, json!(chargebacks)).await), vec!["accepted"; 5]);
    let missing = feedback(admin, json!({"record_id": UNKNOWN_RECORD, "label": "risk", "source": "analyst"})).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{:?}", missing.body);
    assert!(String::from_utf8_lossy(&missing.body).contains(UNKNOWN_RECORD), "{:?}", missing.body);
    let mixed = json!([
        {"record_id": UNKNOWN_RECORD, "label": "ok", "source": "analyst"},
        {"request_id": "no-such-request", "label": "ok", "source": "analyst"},
        analyst(0, sent[0].truth),
    ]);
    assert_eq!(outcomes(&feedback(admin, mixed).await), vec!["unknown", "unknown", "duplicate"]);
    (0..LABELLED)
        .map(|i| match i {
            10..15 => flipped(sent[i].truth),
            20..25 => "risk",
            _ => sent[i].truth,
        })
        .collect()
}

type Table = BTreeMap<String, BTreeMap<(String, String), u64>>;

/// Labelled decisions by `value`, action and truth.
fn expect(sent: &[Sent], truths: &[&str], value: impl Fn(usize) -> String) -> Table {
    let mut t = Table::new();
    for (i, truth) in truths.iter().enumerate() {
        *t.entry(value(i)).or_default().entry((sent[i].action.clone(), truth.to_string())).or_default() += 1;
    }
    t
}

/// A dimension's rows of the report's JSON, as [`expect`] counts them.
fn table(report: &Value, dimension: &str) -> Table {
    let mut t = Table::new();
    for row in report["rates"][dimension].as_array().unwrap_or_else(|| panic!("no rates.{dimension}")) {
        let cells = t.entry(row["value"].as_str().unwrap().to_string()).or_default();
        for (action, truths) in row["actions"].as_object().unwrap() {
            for truth in ["risk", "ok"] {
                let n = truths[truth].as_u64().unwrap();
                if n > 0 {
                    cells.insert((action.clone(), truth.to_string()), n);
                }
            }
        }
    }
    t
}

/// Runs `tiergate report ARGS`; (success, stderr).
fn report(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .current_dir(common::repo())
        .env_remove("TIERGATE_CONFIG")
        .arg("report")
        .args(args)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The page's JSON block.
fn data(html: &str) -> Value {
    let start = html.find("<script type=\"application/json\" id=\"report-data\">").expect("the data block");
    let json = &html[start..];
    let json = &json[json.find('>').unwrap() + 1..json.find("</script>").unwrap()];
    serde_json::from_str(json).unwrap()
}

/// The `<figure id="plot-ID">` element of the page.
fn figure<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html.find(&format!("<figure id=\"plot-{id}\"")).unwrap_or_else(|| panic!("no figure {id}"));
    let end = start + html[start..].find("</figure>").unwrap();
    &html[start..end]
}

/// Each plot is an SVG with at least `min` of its data element.
fn assert_plots(html: &str) {
    let plots = [
        ("reliability", "<circle", 1),
        ("pr", "<polyline", 1),
        ("confusion-kind", "<rect", 1 + 6),
        ("confusion-lang", "<rect", 1 + 6),
        ("review-load", "<rect", 2),
        ("drift", "<circle", 1),
    ];
    for (id, element, min) in plots {
        let f = figure(html, id);
        assert!(f.contains("<svg") && !f.contains("data-empty"), "plot {id} is not drawn: {f:.400}");
        assert!(f.matches(element).count() >= min, "plot {id} has fewer than {min} {element}: {f:.2000}");
    }
    let pr = figure(html, "pr");
    assert!(pr.contains("review_at 0.30") && pr.contains("block_at 0.80"), "today's thresholds marked: {pr:.3000}");
    let kind = figure(html, "confusion-kind");
    assert!(kind.contains(&format!("classify (n = {LABELLED})")), "one panel of every labelled decision: {kind:.3000}");
}

/// `tiergate_quality_labelled_by_tier{window="1h"}` as a table, from the admin listener.
async fn live_by_tier(admin: SocketAddr) -> Table {
    let text = String::from_utf8(common::send(admin, "GET", "/metrics", &[], "").await.body.to_vec()).unwrap();
    let mut t = Table::new();
    for line in text.lines().filter(|l| l.starts_with("tiergate_quality_labelled_by_tier{")) {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        let label = |name: &str| {
            let at = labels.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            labels[at..at + labels[at..].find('"').unwrap()].to_string()
        };
        let n: u64 = value.parse().unwrap();
        if label("window") == "1h" && n > 0 {
            t.entry(label("tier")).or_default().insert((label("action"), label("truth")), n);
        }
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_read_back_exactly_from_the_report_and_the_live_gauges() {
    let dir = scratch("loop");
    let config_path = write_config(&dir);
    let mut config = tiergate::Config::load(&config_path).unwrap();
    config.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let (addr, admin, gateway) = common::start_with_admin(config, Sources::default(), None);
    let sent = decide(addr).await;
    let truths = label(admin, &sent).await;
    let audit = gateway.audit.clone().unwrap();
    tokio::task::spawn_blocking(move || audit.flush()).await.unwrap();

    let by_tier = expect(&sent, &truths, |i| sent[i].tier.clone());
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut live = live_by_tier(admin).await;
    while live != by_tier && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        live = live_by_tier(admin).await;
    }
    assert_eq!(live, by_tier, "the live gauges count each labelled decision once, with the truth that counts");

    let out = dir.join("report.html");
    let config_arg = config_path.to_str().unwrap();
    let (ok, stderr) = report(&["--config", config_arg, "--since", "1h", "--out", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let html = std::fs::read_to_string(&out).unwrap();
    if let Some(keep) = std::env::var_os("TIERGATE_SCREENSHOTS") {
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::copy(&out, Path::new(&keep).join("report.html")).unwrap();
    }
    let r = data(&html);
    check_summary(&r, &sent, &truths);
    assert_eq!(table(&r, "tier"), by_tier);
    assert_eq!(table(&r, "scenario"), expect(&sent, &truths, |i| sent[i].scenario.unwrap_or("default").into()));
    assert_eq!(table(&r, "tenant"), expect(&sent, &truths, |i| sent[i].tenant.unwrap_or("none").into()));
    // As live quality classes them: no tenant is the default class.
    let class = |i: usize| match sent[i].tenant {
        Some("acme") => "gold",
        Some(_) => "standard",
        None => "default",
    };
    let class = |i: usize| class(i).to_string();
    assert_eq!(table(&r, "tenant_class"), expect(&sent, &truths, class));
    assert_eq!(table(&r, "kind"), expect(&sent, &truths, |_| "classify".into()));
    let version = r["thresholds"]["version"].as_str().unwrap().to_string();
    assert_eq!(table(&r, "policy_version"), expect(&sent, &truths, |_| version.clone()));
    check_labels(&r, &sent, &truths);
    assert_plots(&html);
    assert!(html.contains("o&#x27;brien &lt;qa&gt;") || html.contains("o'brien &lt;qa&gt;"), "escaped reviewer");
    assert!(!html.contains("<qa>"), "no raw markup from the store");
    check_refusals(&config_path, &out);
    check_empty_window(&config_path, &dir);
}

fn check_summary(r: &Value, sent: &[Sent], truths: &[&str]) {
    let s = &r["summary"];
    assert_eq!(s["decisions"], DECISIONS as u64);
    assert_eq!(s["by_kind"], json!({"classify": DECISIONS}));
    let mut by_action = BTreeMap::<String, u64>::new();
    sent.iter().for_each(|d| *by_action.entry(d.action.clone()).or_default() += 1);
    assert_eq!(s["by_action"], json!(by_action));
    let reviews_labelled = sent[..LABELLED].iter().filter(|d| d.action == "review").count();
    assert_eq!(s["reviews_labelled"], reviews_labelled as u64);
    assert_eq!(s["labelled"], LABELLED as u64, "repeats, a second source and changes count once");
    let risk = truths.iter().filter(|t| **t == "risk").count() as u64;
    assert_eq!(s["labelled_truth"], json!({"risk": risk, "ok": LABELLED as u64 - risk}));
    assert_eq!(s["labels"], LABELLED as u64 + 5, "one label per decision and source");
    assert_eq!(s["reviewers"], 3);
    let timeline_reviews: u64 = r["timeline"].as_array().unwrap().iter().map(|b| b["reviews"].as_u64().unwrap()).sum();
    assert_eq!(timeline_reviews, by_action.get("review").copied().unwrap_or(0));
    let model_tier = (0..LABELLED).filter(|&i| matches!(sent[i].tier.as_str(), "cpu" | "gpu")).count() as u64;
    assert_eq!(r["calibration"]["decisions"], model_tier);
    assert_eq!(r["pr"]["decisions"], model_tier);
    assert!(r["calibration"]["ece"].as_f64().is_some_and(|e| (0.0..=1.0).contains(&e)), "{}", r["calibration"]);
    let thresholds = &r["thresholds"];
    assert_eq!((thresholds["review_at"].as_f64(), thresholds["block_at"].as_f64()), (Some(0.3), Some(0.8)));
    assert!(r["pr"]["at"].as_array().unwrap().iter().any(|a| a["scope"] == "all" && a["name"] == "block_at"));
}

/// Per source and per reviewer every label counts, with its own truth.
fn check_labels(r: &Value, sent: &[Sent], truths: &[&str]) {
    let analyst_truth = |i: usize| if (20..25).contains(&i) { sent[i].truth } else { truths[i] };
    let mut by_source = expect(sent, &(0..LABELLED).map(analyst_truth).collect::<Vec<_>>(), |_| "analyst".into());
    let mut by_reviewer = expect(sent, &(0..LABELLED).map(analyst_truth).collect::<Vec<_>>(), |i| {
        if i < 80 { REVIEWERS[i % 3] } else { "none" }.to_string()
    });
    for s in &sent[20..25] {
        let cell = (s.action.clone(), "risk".to_string());
        *by_source.entry("chargeback".into()).or_default().entry(cell.clone()).or_default() += 1;
        *by_reviewer.entry("none".into()).or_default().entry(cell).or_default() += 1;
    }
    assert_eq!(table(r, "source"), by_source);
    assert_eq!(table(r, "reviewer"), by_reviewer);
    let lang_total: u64 =
        r["rates"]["lang"].as_array().unwrap().iter().map(|row| row["labelled"].as_u64().unwrap()).sum();
    assert_eq!(lang_total, LABELLED as u64);
    assert!(r["rates"]["lang"].as_array().unwrap().len() > 3, "several languages: {}", r["rates"]["lang"]);
}

/// An existing page is kept without `--force`; a bad time names its flag; `--help` says what
/// the page holds.
fn check_refusals(config: &Path, out: &Path) {
    let (config, out) = (config.to_str().unwrap(), out.to_str().unwrap());
    let help = Command::new(env!("CARGO_BIN_EXE_tiergate")).args(["report", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for words in ["review precision (reviewed ∧ risk ÷ reviewed", "not when their labels", "--since <SINCE>"] {
        assert!(help.contains(words), "--help lacks {words:?}: {help}");
    }
    let (ok, stderr) = report(&["--config", config, "--out", out]);
    assert!(!ok && stderr.contains("exists: give --force"), "{stderr}");
    let (ok, stderr) = report(&["--config", config, "--out", out, "--force", "--since", "yesterday"]);
    assert!(!ok && stderr.contains("--since: `yesterday` is not"), "{stderr}");
    let (ok, stderr) = report(&["--audit-dir", "/no/such/dir", "--out", out, "--force"]);
    assert!(!ok && stderr.contains("no audit directory /no/such/dir"), "{stderr}");
}

/// A window without decisions is still a valid page, saying nothing was labelled.
fn check_empty_window(config: &Path, dir: &Path) {
    let out = dir.join("empty.html");
    let args = ["--since", "2000-01-01T00:00:00Z", "--until", "2000-01-02T00:00:00Z"];
    let (ok, stderr) =
        report(&[&["--config", config.to_str().unwrap(), "--out", out.to_str().unwrap()], &args[..]].concat());
    assert!(ok, "{stderr}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    assert!(html.contains("id=\"nothing-labelled\""), "{html:.3000}");
    let r = data(&html);
    assert_eq!((r["summary"]["decisions"].as_u64(), r["summary"]["labelled"].as_u64()), (Some(0), Some(0)));
    assert_eq!(r["timeline"].as_array().unwrap().len(), 24, "hourly buckets over a day");
    for id in ["reliability", "pr", "confusion-kind", "confusion-lang", "review-load", "drift"] {
        assert!(figure(&html, id).contains("data-empty=\"true\""), "{id}");
    }
}
