//! The review console against a started tiergate with the audit trail and `[audit.review_text]`
//! on: in a real browser (headless Chromium over WebDriver: sign in, label five decisions with the
//! keyboard, watch the live panel change), and over plain HTTP (the review-text store keeps the
//! text of `review` decisions only; what the console refuses: other origins, missing CSRF tokens,
//! wrong tokens). Set `TIERGATE_SCREENSHOTS=docs/img` to save the browser's screenshots there.

mod common;

use common::browser::Browser;
use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::{Client, Locator};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiergate::audit::{review_text, AuditConfig, ReviewTextConfig};
use tiergate::gateway::Sources;
use tiergate::Gateway;

const TOKEN: &str = "console-test-admin-token-7f3a";
/// A scenario under which every model verdict is `review` (and guards may still block).
const TRIAGE: &str =
    "[scenarios.triage]\ndescription = \"every model verdict reviewed\"\nreview_at = 0.0\nblock_at = 1.0\n";

/// Benign messages, each reviewed under [`TRIAGE`], with the tenant that sends it.
const QUEUE: [(&str, &str); 7] = [
    ("Congratulations! You won a voucher, reply with your name to claim.", "shop-a"),
    ("Your parcel is waiting at the depot, pick it up before Friday.", "shop-b"),
    ("Hi, can you send me the slides from this morning's meeting?", "shop-a"),
    ("The invoice for March is attached, payment is due in 30 days.", "shop-b"),
    ("Reminder: the gym is closed on Monday for maintenance.", "shop-a"),
    ("Please confirm your new delivery address for order 4471.", "shop-a"),
    ("Thanks for the lovely dinner yesterday, see you next week!", "shop-b"),
];

struct Server {
    public: SocketAddr,
    admin: SocketAddr,
    gateway: Arc<Gateway>,
    /// `[audit] dir`.
    audit: PathBuf,
}

impl Server {
    /// tiergate with the bundled policies plus [`TRIAGE`], claimed tenants, the audit trail
    /// (flushed every 20 ms) and, with `keep_text`, `[audit.review_text]`; admin token [`TOKEN`].
    fn start(name: &str, keep_text: bool) -> Server {
        let dir = std::env::temp_dir().join(format!("tiergate-console-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("policies")).unwrap();
        for entry in std::fs::read_dir(common::repo().join("policies")).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.join("policies").join(path.file_name().unwrap())).unwrap();
        }
        std::fs::write(dir.join("policies/zz_test.toml"), TRIAGE).unwrap();
        let mut config = common::config(&dir.join("policies"));
        config.tenants.accept_claimed = true;
        // Live quality recomputed every second (and soon after labels), so that the panel has
        // numbers before the first label.
        config.feedback.refresh_interval_ms = 1000;
        let review_text = ReviewTextConfig { enabled: keep_text, ..ReviewTextConfig::default() };
        let audit = dir.join("audit");
        config.audit =
            Some(AuditConfig { dir: audit.clone(), flush_interval_ms: 20, review_text, ..AuditConfig::default() });
        let (public, admin, gateway) = common::start_with_admin(config, Sources::default(), Some(TOKEN));
        Server { public, admin, gateway, audit }
    }

    /// Decides `text` (for `tenant`, in `scenario`) and returns the decision.
    async fn decide(&self, text: &str, tenant: &str, scenario: Option<&str>) -> Value {
        let mut headers = vec![("content-type", "application/json"), ("x-tiergate-deadline-ms", "5000")];
        if let Some(s) = scenario {
            headers.push(("x-tiergate-scenario", s));
        }
        let body = json!({"text": text, "tenant": tenant}).to_string();
        let reply = common::send(self.public, "POST", "/v1/classify", &headers, body).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        reply.json()
    }

    /// Sends [`QUEUE`] under [`TRIAGE`] (each must be reviewed) and waits until the records are
    /// committed; returns the decisions in order.
    async fn seed_decisions(&self) -> Vec<Value> {
        let mut decisions = Vec::new();
        for (text, tenant) in QUEUE {
            let d = self.decide(text, tenant, Some("triage")).await;
            assert_eq!(d["action"], "review", "{text:?} under triage: {d}");
            decisions.push(d);
        }
        self.flush().await;
        decisions
    }

    /// [`Server::seed_decisions`]' record ids.
    async fn seed(&self) -> Vec<String> {
        let decisions = self.seed_decisions().await;
        decisions.iter().map(|d| d["record_id"].as_str().expect("decisions name their record").to_string()).collect()
    }

    async fn flush(&self) {
        let gateway = Arc::clone(&self.gateway);
        tokio::task::spawn_blocking(move || gateway.audit.as_ref().unwrap().flush()).await.unwrap();
    }

    /// `GET path` on the admin listener with the bearer token.
    async fn admin_get(&self, path: &str) -> common::Reply {
        let bearer = format!("Bearer {TOKEN}");
        common::send(self.admin, "GET", path, &[("authorization", &bearer)], "").await
    }

    fn origin(&self) -> String {
        format!("http://{}", self.admin)
    }
}

/// The value of `name=` in a `Set-Cookie` header of `reply`, as `name=value`.
fn cookie(reply: &common::Reply, name: &str) -> String {
    let set = reply.headers.get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>();
    let line =
        set.iter().find(|c| c.starts_with(&format!("{name}="))).unwrap_or_else(|| panic!("no {name} in {set:?}"));
    line.split(';').next().unwrap().to_string()
}

/// The `data-csrf` the console page renders for the session in `cookie`.
async fn csrf(server: &Server, cookie: &str) -> String {
    let page = common::send(server.admin, "GET", "/admin/console", &[("cookie", cookie)], "").await;
    let html = String::from_utf8(page.body.to_vec()).unwrap();
    let at = html.find("data-csrf=\"").expect("the console page, not the login form") + "data-csrf=\"".len();
    html[at..].split('"').next().unwrap().to_string()
}

/// Signs in over HTTP as `reviewer`; returns the session cookie (`name=value`).
async fn sign_in(server: &Server, reviewer: &str) -> String {
    let origin = server.origin();
    let headers = [("content-type", "application/x-www-form-urlencoded"), ("origin", origin.as_str())];
    let form = format!("reviewer={reviewer}&token={TOKEN}");
    let reply = common::send(server.admin, "POST", "/admin/console/login", &headers, form).await;
    assert_eq!(reply.status, 303, "{:?}", reply.body);
    assert_eq!(reply.headers["location"], "/admin/console");
    cookie(&reply, "tiergate_console")
}

// ---- the browser ----

/// Polls the page's `js` (an expression) every 50 ms until it returns `want`, for up to 30 s.
async fn wait_for(client: &Client, js: &str, want: &str) {
    let started = Instant::now();
    let mut last = Value::Null;
    while started.elapsed() < Duration::from_secs(30) {
        // An error (a page still loading) is one more try.
        last = client.execute(&format!("return String({js});"), vec![]).await.unwrap_or_else(|e| json!(e.to_string()));
        if last == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let page = client.source().await.unwrap_or_default();
    let body = page.split("</style>").last().unwrap_or_default();
    panic!("`{js}` is {last}, not {want:?}; the page:\n{}", &body[..body.len().min(3000)]);
}

fn text_of(id: &str) -> String {
    format!("(document.getElementById('{id}') || {{}}).textContent")
}

const SELECTED: &str = "(document.querySelector('#queue li.sel') || {dataset: {}}).dataset.recordId";

/// Presses and releases `key` where the page has focus.
async fn press(client: &Client, key: char) {
    let keys =
        KeyActions::new("keyboard".into()).then(KeyAction::Down { value: key }).then(KeyAction::Up { value: key });
    client.perform_actions(keys).await.unwrap();
}

/// Saves a screenshot as `name` in `$TIERGATE_SCREENSHOTS`, when that is set.
async fn screenshot(client: &Client, name: &str) {
    let Some(dir) = std::env::var_os("TIERGATE_SCREENSHOTS") else { return };
    let dir = common::repo().join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), client.screenshot().await.unwrap()).unwrap();
}

/// Signs in through the login form in the browser as `reviewer`.
async fn browser_sign_in(client: &Client, server: &Server, reviewer: &str) {
    client.goto(&format!("{}/admin/console", server.origin())).await.unwrap();
    client.find(Locator::Id("reviewer")).await.unwrap().send_keys(reviewer).await.unwrap();
    client.find(Locator::Id("token")).await.unwrap().send_keys(TOKEN).await.unwrap();
    client.find(Locator::Id("sign-in")).await.unwrap().click().await.unwrap();
}

/// The default `[feedback] windows`: the live table's columns.
const WINDOWS: [&str; 3] = ["1h", "24h", "7d"];

/// Waits until the live table shows `want` for `metric` in every window.
async fn wait_live(client: &Client, metric: &str, want: &str) {
    for window in WINDOWS {
        wait_for(client, &text_of(&format!("q-{metric}-{window}")), want).await;
    }
}

/// The ECE live quality must show for the labelled `decisions` (`truth` per decision): over the
/// model tiers' decisions, the confidence of the predicted label against whether it was right.
fn expected_ece(labelled: &[(&Value, &str)]) -> Option<f64> {
    let model: Vec<(f64, bool)> = labelled
        .iter()
        .filter(|(d, _)| d["tier"] == "cpu" || d["tier"] == "gpu")
        .map(|(d, truth)| {
            let p = d["risk_score"].as_f64().unwrap();
            (p.max(1.0 - p), (p >= 0.5) == (*truth == "risk"))
        })
        .collect();
    let (confidence, correct): (Vec<f64>, Vec<bool>) = model.into_iter().unzip();
    (!confidence.is_empty()).then(|| tiergate::calibrate::ece(&confidence, &correct, 10))
}

/// Runs `fetch(url, {method: POST, credentials: include, mode, headers, body})` in the page and
/// returns the response's status (0: an opaque answer to another origin's `no-cors` request).
async fn post_from_page(client: &Client, url: &str, mode: &str, headers: Value, body: &str) -> Value {
    let script = "const [url, mode, headers, body, done] = arguments;
        fetch(url, {method: 'POST', credentials: 'include', mode, headers, body})
          .then((r) => done(r.status), (e) => done('network error: ' + e));";
    client.execute_async(script, vec![json!(url), json!(mode), headers, json!(body)]).await.unwrap()
}

/// What the browser cannot do without the page's CSRF token (`record_id` stays unlabelled): a
/// script on the console's own origin that leaves the token out or forges it gets 403; a page
/// of another origin — the public listener: the same site on another port, so the `SameSite`
/// cookie goes with its request — gets nothing written (checked by the caller).
async fn refused_in_the_browser(client: &Client, server: &Server, record_id: &str) {
    let body = json!({"record_id": record_id, "label": "risk"}).to_string();
    let json_only = json!({"content-type": "application/json"});
    let status = post_from_page(client, "/admin/review/label", "same-origin", json_only, &body).await;
    assert_eq!(status, 403, "no CSRF token");
    let forged = json!({"content-type": "application/json", "x-tiergate-csrf": "0".repeat(64)});
    assert_eq!(post_from_page(client, "/admin/review/label", "same-origin", forged, &body).await, 403);
    client.goto(&format!("http://{}/healthz", server.public)).await.unwrap();
    let label = format!("{}/admin/review/label", server.origin());
    let simple = json!({"content-type": "text/plain"});
    assert_eq!(post_from_page(client, &label, "no-cors", simple, &body).await, 0, "sent, answer opaque");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_analyst_labels_five_decisions_with_the_keyboard_and_the_live_panel_follows() {
    let server = Server::start("browser", true);
    let decisions = server.seed_decisions().await;
    let ids: Vec<String> = decisions.iter().map(|d| d["record_id"].as_str().unwrap().to_string()).collect();
    let browser = Browser::start();
    let client = browser.session().await;
    // Tall enough for the screenshots to show an item's path below its attributions.
    client.set_window_size(1280, 1100).await.unwrap();
    browser_sign_in(&client, &server, "ana").await;
    wait_for(&client, &text_of("queue-count"), "7").await;
    // Live quality before any label: refreshed, nothing labelled.
    wait_live(&client, "labelled", "0").await;
    wait_live(&client, "review_precision", "-").await;
    wait_for(&client, &text_of("q-today"), "0").await;
    // The oldest first, selected, with its text (kept for review) and its word attributions.
    wait_for(&client, SELECTED, &ids[0]).await;
    wait_for(&client, "document.getElementById('item').dataset.recordId", &ids[0]).await;
    wait_for(&client, "document.getElementById('item').dataset.explained", "true").await;
    let shown = client.find(Locator::Css("#item p.words")).await.unwrap().text().await.unwrap();
    assert_eq!(shown, QUEUE[0].0);
    let attributions = client.find_all(Locator::Css("#item table.attr tr")).await.unwrap();
    assert!(!attributions.is_empty(), "the cpu tier's word attributions are shown");
    screenshot(&client, "console-item.png").await;

    // r, o, then j past the third, then r, o, r: five labels.
    let steps = [('r', 0, "risk"), ('o', 1, "ok"), ('r', 3, "risk"), ('o', 4, "ok"), ('r', 5, "risk")];
    for (n, (key, at, truth)) in steps.into_iter().enumerate() {
        if at == 3 {
            wait_for(&client, SELECTED, &ids[2]).await;
            press(&client, 'j').await;
        }
        wait_for(&client, SELECTED, &ids[at]).await;
        press(&client, key).await;
        wait_for(&client, &text_of("status"), &format!("Labelled {truth}: {} (accepted)", ids[at])).await;
        wait_for(&client, &text_of("queue-count"), &(QUEUE.len() - n - 1).to_string()).await;
    }
    // The live panel: the Feedback service's numbers over the five labelled reviews (3 risk,
    // 2 ok) in every window, then the day's labels, all the reviewer's.
    wait_live(&client, "labelled", "5").await;
    wait_live(&client, "review_precision", "60.0 %").await;
    wait_live(&client, "block_precision", "-").await;
    wait_live(&client, "false_block_rate", "0.0 %").await;
    wait_live(&client, "risk_allowed_rate", "0.0 %").await;
    let labelled: Vec<(&Value, &str)> = steps.iter().map(|(_, at, truth)| (&decisions[*at], *truth)).collect();
    for window in WINDOWS {
        let cell = format!("q-model_ece-{window}");
        let shown = client.execute(&format!("return {};", text_of(&cell)), vec![]).await.unwrap();
        match expected_ece(&labelled) {
            Some(ece) => {
                let shown: f64 = shown.as_str().unwrap().parse().unwrap();
                assert!((shown - ece).abs() <= 0.0005, "{cell}: {shown} shown, {ece} expected");
            }
            None => assert_eq!(shown, "-", "no model-tier decision labelled"),
        }
    }
    for (id, want) in [("q-today", "5"), ("q-risk", "3"), ("q-ok", "2"), ("q-mine", "5"), ("q-waiting", "2")] {
        wait_for(&client, &text_of(id), want).await;
    }
    wait_for(&client, "document.getElementById('item').dataset.recordId", &ids[6]).await;
    wait_for(&client, "document.getElementById('item').dataset.explained", "true").await;
    screenshot(&client, "console-queue.png").await;
    server_has_the_five_labels(&server, &ids, &steps).await;

    // A held key labels once: `o` and two auto-repeats of it label the selected decision, not
    // the one after it too. (chromedriver does not mark a repeated key-down as a repeat, so the
    // page gets the browser's events for a held key from a script.)
    let held = "for (const repeat of [false, true, true]) {
        document.body.dispatchEvent(new KeyboardEvent('keydown', {key: 'o', repeat, bubbles: true}));
    }";
    client.execute(held, vec![]).await.unwrap();
    wait_for(&client, &text_of("status"), &format!("Labelled ok: {} (accepted)", ids[6])).await;
    wait_for(&client, &text_of("q-waiting"), "1").await;
    let queue = server.admin_get("/admin/review/queue").await.json();
    assert_eq!((queue["waiting"].as_u64(), queue["items"][0]["record_id"].as_str()), (Some(1), Some(ids[2].as_str())));
    refused_in_the_browser(&client, &server, &ids[2]).await;
    client.close().await.unwrap();
    let after = server.admin_get("/admin/review/queue").await.json();
    assert_eq!(after["waiting"], 1, "the refused requests labelled nothing");
}

/// The server agrees with the page: two wait, the five labels from analyst `ana` on the right
/// records with the right truth, counted in the metrics.
async fn server_has_the_five_labels(server: &Server, ids: &[String], steps: &[(char, usize, &str)]) {
    let queue = server.admin_get("/admin/review/queue").await.json();
    assert_eq!(queue["waiting"], 2);
    let left: Vec<&str> = queue["items"].as_array().unwrap().iter().map(|i| i["record_id"].as_str().unwrap()).collect();
    assert_eq!(left, [ids[2].as_str(), ids[6].as_str()]);
    let conn = tiergate::audit::store::Store::open_read_only(&server.audit).unwrap();
    let mut labels: Vec<(String, String, String, Option<String>)> =
        tiergate::feedback::store::labels(&conn, 0, u64::MAX)
            .unwrap()
            .into_iter()
            .map(|l| (l.record_id, l.truth.as_str().to_string(), l.source, l.reviewer))
            .collect();
    labels.sort();
    let mut want: Vec<_> = steps
        .iter()
        .map(|(_, at, truth)| (ids[*at].clone(), truth.to_string(), "analyst".to_string(), Some("ana".to_string())))
        .collect();
    want.sort();
    assert_eq!(labels, want);
    let metrics = String::from_utf8(server.admin_get("/metrics").await.body.to_vec()).unwrap();
    let lines = [
        "tiergate_feedback_labels_total{source=\"analyst\",outcome=\"accepted\"} 5",
        "tiergate_quality_labelled_by_scenario{window=\"1h\",scenario=\"triage\",action=\"review\",truth=\"risk\"} 3",
        "tiergate_quality_labelled_by_scenario{window=\"1h\",scenario=\"triage\",action=\"review\",truth=\"ok\"} 2",
    ];
    for line in lines {
        assert!(metrics.lines().any(|l| l == line), "{line} not in\n{metrics}");
    }
}

// ---- over HTTP ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_of_review_decisions_only_is_kept_and_shown() {
    let server = Server::start("kept", true);
    let review = server.decide(QUEUE[0].0, "shop-a", Some("triage")).await;
    let allow = server.decide(common::BENIGN, "shop-a", None).await;
    let block = server.decide(common::PHISHING, "shop-a", None).await;
    let actions = [&review, &allow, &block].map(|d| d["action"].as_str().unwrap().to_string());
    assert_eq!(actions, ["review", "allow", "block"]);
    server.flush().await;
    let id = |d: &Value| d["record_id"].as_str().unwrap().to_string();
    assert_eq!(review_text::read(&server.audit, &id(&review)).unwrap().as_deref(), Some(QUEUE[0].0));
    assert_eq!(review_text::read(&server.audit, &id(&allow)).unwrap(), None);
    assert_eq!(review_text::read(&server.audit, &id(&block)).unwrap(), None);
    let conn = rusqlite::Connection::open(server.audit.join(review_text::DB_FILE)).unwrap();
    let kept: i64 = conn.query_row("SELECT COUNT(*) FROM review_text", [], |r| r.get(0)).unwrap();
    assert_eq!(kept, 1, "one text kept: the review decision's");

    // The console shows the kept text with its attributions, and only the keyed hash otherwise.
    let item = server.admin_get(&format!("/admin/review/item?record_id={}", id(&review))).await.json();
    assert_eq!((item["text"]["kept"].as_bool(), item["text"]["value"].as_str()), (Some(true), Some(QUEUE[0].0)));
    assert_eq!((item["explainable"].as_bool(), item.get("attributions")), (Some(true), None), "{item}");
    let item = server.admin_get(&format!("/admin/review/item?record_id={}&explain=true", id(&review))).await.json();
    let words: Vec<&str> =
        item["attributions"].as_array().unwrap().iter().map(|a| a["word"].as_str().unwrap()).collect();
    assert!(!words.is_empty() && words.iter().all(|w| QUEUE[0].0.contains(w)), "{item}");
    let item = server.admin_get(&format!("/admin/review/item?record_id={}", id(&allow))).await.json();
    assert_eq!((item["text"]["kept"].as_bool(), item["text"]["mode"].as_str()), (Some(false), Some("hash")));
    assert_eq!(item["text"]["value"].as_str().unwrap().len(), 64, "{item}");
    assert_eq!(item["explainable"], false);

    // Off (the default): nothing is kept, not even a file.
    let off = Server::start("not-kept", false);
    let review = off.decide(QUEUE[0].0, "shop-a", Some("triage")).await;
    off.flush().await;
    assert!(!off.audit.join(review_text::DB_FILE).exists());
    let item = off.admin_get(&format!("/admin/review/item?record_id={}", id(&review))).await.json();
    assert_eq!(item["text"]["kept"], false, "{item}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_oldest_first_and_filtered_by_tenant_scenario_rule_and_language() {
    let server = Server::start("filters", true);
    let ids = server.seed().await;
    server.decide(common::BENIGN, "shop-a", None).await;
    let listed = |q: &Value| -> Vec<String> {
        q["items"].as_array().unwrap().iter().map(|i| i["record_id"].as_str().unwrap().to_string()).collect()
    };
    let all = server.admin_get("/admin/review/queue").await.json();
    assert_eq!((all["waiting"].as_u64(), listed(&all)), (Some(7), ids.clone()), "reviews only, oldest first");
    let shop_b: Vec<String> =
        ids.iter().zip(QUEUE).filter(|(_, (_, t))| *t == "shop-b").map(|(id, _)| id.clone()).collect();
    assert_eq!(listed(&server.admin_get("/admin/review/queue?tenant=shop-b").await.json()), shop_b);
    assert_eq!(listed(&server.admin_get("/admin/review/queue?scenario=triage").await.json()), ids);
    let lang = all["items"][0]["lang"].as_str().unwrap().to_string();
    let in_lang: Vec<String> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["lang"] == lang.as_str())
        .map(|i| i["record_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed(&server.admin_get(&format!("/admin/review/queue?lang={lang}")).await.json()), in_lang);
    let none = server.admin_get("/admin/review/queue?scenario=payments").await.json();
    assert_eq!((none["waiting"].as_u64(), listed(&none).len()), (Some(0), 0));
    // A text in a language the model does not read goes to the rules whatever the model: here
    // the rule for a foreign request with a link decides it, and only it is listed under that rule.
    let foreign = server
        .decide(
            "Gratulacje! Wygrałeś bon podarunkowy, odbierz go tutaj: http://bon-nagroda.example/odbierz",
            "shop-a",
            Some("triage"),
        )
        .await;
    server.flush().await;
    let by_rule = server.admin_get("/admin/review/queue?rule=foreign_payment_or_credential_request").await.json();
    assert_eq!(listed(&by_rule), [foreign["record_id"].as_str().unwrap().to_string()], "{foreign}");
    assert_eq!(server.admin_get("/admin/review/queue?rule=no_such_rule").await.json()["waiting"], 0);
    let bad = server.admin_get("/admin/review/queue?colour=red").await;
    assert_eq!((bad.status.as_u16(), bad.json()["error"]["field"].as_str()), (422, Some("colour")));
    let long = server.admin_get(&format!("/admin/review/queue?tenant={}", "x".repeat(129))).await;
    assert_eq!((long.status.as_u16(), long.json()["error"]["field"].as_str()), (422, Some("tenant")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_other_origins_missing_csrf_tokens_and_wrong_tokens() {
    let server = Server::start("refuses", true);
    let ids = server.seed().await;
    let origin = server.origin();
    let form = [("content-type", "application/x-www-form-urlencoded"), ("origin", origin.as_str())];

    // The public listener does not serve the console, with or without the token.
    let public = common::send(server.public, "GET", "/admin/console", &[], "").await;
    assert_eq!(public.status, 404);
    let bearer = format!("Bearer {TOKEN}");
    let public = common::send(server.public, "GET", "/admin/review/queue", &[("authorization", &bearer)], "").await;
    assert_eq!(public.status, 404);
    // No session: the login form; reads need the session or the bearer token.
    let page = common::send(server.admin, "GET", "/admin/console", &[], "").await;
    assert_eq!(page.status, 200);
    assert!(String::from_utf8_lossy(&page.body).contains("id=\"token\""));
    assert_eq!(common::send(server.admin, "GET", "/admin/review/queue", &[], "").await.status, 401);
    assert_eq!(server.admin_get("/admin/review/queue").await.status, 200);

    // Sign-in: a wrong token, another origin, a name that is markup.
    let wrong = common::send(server.admin, "POST", "/admin/console/login", &form, "reviewer=ana&token=nope").await;
    assert_eq!(wrong.status, 401);
    assert!(String::from_utf8_lossy(&wrong.body).contains("That is not the admin token."));
    let evil = [("content-type", "application/x-www-form-urlencoded"), ("origin", "http://evil.example")];
    let other =
        common::send(server.admin, "POST", "/admin/console/login", &evil, format!("reviewer=ana&token={TOKEN}")).await;
    assert_eq!(other.status, 403);
    assert!(other.headers.get("set-cookie").is_none());
    let markup =
        common::send(server.admin, "POST", "/admin/console/login", &form, "reviewer=%3Cb%3Ex%3C%2Fb%3E&token=x").await;
    assert_eq!(markup.status, 422);
    let html = String::from_utf8_lossy(&markup.body);
    assert!(html.contains("value=\"&lt;b&gt;x&lt;/b&gt;\"") && !html.contains("<b>x</b>"), "{html}");

    let session = sign_in(&server, "ana").await;
    let page = common::send(server.admin, "GET", "/admin/console", &[("cookie", &session)], "").await;
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.starts_with("default-src 'none'; script-src 'nonce-") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    let token = csrf(&server, &session).await;
    let body = json!({"record_id": ids[0], "label": "risk"}).to_string();
    let post = |headers: Vec<(&'static str, String)>, body: String| {
        let addr = server.admin;
        async move {
            let mut h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            h.push(("content-type", "application/json"));
            common::send(addr, "POST", "/admin/review/label", &h, body).await
        }
    };
    let full = || vec![("cookie", session.clone()), ("origin", origin.clone()), ("x-tiergate-csrf", token.clone())];
    let without = |name: &str| full().into_iter().filter(|(k, _)| *k != name).collect::<Vec<_>>();
    assert_eq!(post(without("x-tiergate-csrf"), body.clone()).await.status, 403);
    assert_eq!(post(without("origin"), body.clone()).await.status, 403);
    let mut cross = without("origin");
    cross.push(("origin", "http://evil.example".into()));
    assert_eq!(post(cross, body.clone()).await.status, 403);
    let mut forged = without("x-tiergate-csrf");
    forged.push(("x-tiergate-csrf", "0".repeat(64)));
    assert_eq!(post(forged, body.clone()).await.status, 403);
    let bearer = vec![("authorization", format!("Bearer {TOKEN}")), ("origin", origin.clone())];
    assert_eq!(post(bearer, body.clone()).await.status, 401, "labels come from a session, not the API token");
    assert_eq!(server.admin_get("/admin/review/queue").await.json()["waiting"], 7, "nothing refused was written");

    let ok = post(full(), body.clone()).await;
    assert_eq!((ok.status.as_u16(), ok.json()["results"][0]["outcome"].as_str()), (200, Some("accepted")));
    assert_eq!(post(full(), body).await.json()["results"][0]["outcome"], "duplicate");
    let unknown = post(full(), json!({"record_id": "no-such-record", "label": "ok"}).to_string()).await;
    assert_eq!((unknown.status.as_u16(), unknown.json()["error"]["field"].as_str()), (404, Some("record_id")));
    let bad = post(full(), json!({"record_id": ids[1], "label": "maybe"}).to_string()).await;
    assert_eq!((bad.status.as_u16(), bad.json()["error"]["field"].as_str()), (422, Some("label")));
    let extra = post(full(), json!({"record_id": ids[1], "label": "ok", "source": "chargeback"}).to_string()).await;
    assert_eq!((extra.status.as_u16(), extra.json()["error"]["field"].as_str()), (422, Some("source")));
    assert_eq!(server.admin_get("/admin/review/queue").await.json()["waiting"], 6);
    // The session opens the console only: the rest of /admin still wants the bearer token.
    let policy = common::send(server.admin, "GET", "/admin/policy", &[("cookie", &session)], "").await;
    assert_eq!(policy.status, 401);
}

/// The harness on its own: the fetched browser reads a page tiergate serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fetched_browser_reads_a_page_tiergate_serves() {
    let addr = common::default_server();
    let browser = Browser::start();
    let client = browser.session().await;
    client.goto(&format!("http://{addr}/healthz")).await.unwrap();
    let body = client.find(Locator::Css("body")).await.unwrap().text().await.unwrap();
    assert_eq!(body, r#"{"status":"ok"}"#);
    client.close().await.unwrap();
}
