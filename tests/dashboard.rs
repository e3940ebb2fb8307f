//! deploy/grafana/tiergate.json: every panel's PromQL parses (crate `promql-parser`), and every
//! metric it names is exported by a running tiergate's `/metrics`. The tiergate runs with what
//! makes each family appear: a gpu tier (the onnx backend on the CPU provider, a test-double GPU
//! reading), a routing policy that escalates every cpu verdict and accepts none (escalations,
//! then fallbacks to the rules), a proxied route, a drift reference, and a policy reload.

mod common;

use common::routes::screened_route;
use common::{config_with_routes, policies_with_routing, repo, send, start_with_admin, FakeCpu, FakeGpu};
use promql_parser::parser::Expr;
use promql_parser::util::{walk_expr, ExprVisitor};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use tiergate::gateway::Sources;
use tiergate::tier::Provider;

/// Grafana's variables, replaced by what Grafana would put there before PromQL sees the query.
const VARIABLES: [(&str, &str); 1] = [("$__rate_interval", "5m")];

/// Every `expr` of every panel (rows nest panels too), with the panel's title.
fn queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/tiergate.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = stack.pop() {
        stack.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default().to_string();
            out.push((title, target["expr"].as_str().expect("every target has an expr").to_string()));
        }
    }
    out
}

/// Metric names a query reads.
#[derive(Default)]
struct Names(BTreeSet<String>);

impl ExprVisitor for Names {
    type Error = ();
    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, ()> {
        let selector = match expr {
            Expr::VectorSelector(vs) => Some(vs),
            Expr::MatrixSelector(ms) => Some(&ms.vs),
            _ => None,
        };
        self.0.extend(selector.and_then(|vs| vs.name.clone()));
        Ok(true)
    }
}

#[test]
fn every_panel_query_parses_and_names_metrics() {
    let queries = queries();
    assert!(queries.len() >= 20, "{} queries", queries.len());
    for (title, expr) in queries {
        let expr = VARIABLES.iter().fold(expr, |e, (var, value)| e.replace(var, value));
        let ast = promql_parser::parser::parse(&expr).unwrap_or_else(|e| panic!("panel {title:?}: {expr}: {e}"));
        let mut names = Names::default();
        walk_expr(&mut names, &ast).unwrap();
        assert!(!names.0.is_empty(), "panel {title:?} reads no metric: {expr}");
    }
}

const ROUTING: &str = "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\nescalate_below = 0.99999\n\
    accept_below = 0.99999\nood_above = 1.0\n[default]\naction = \"allow\"\nscore = 0.2\n[gpu]\n\
    min_free_memory_mb = 2048\nmax_in_flight = 8\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_names_is_exported() {
    let app = common::app::start();
    let routes = screened_route("chat", "/echo", &app.url(), &[]);
    let mut c = config_with_routes(&policies_with_routing("dashboard", ROUTING), &routes);
    c.gpu.backend = "onnx".into();
    c.gpu.onnx.dir = repo().join("models");
    c.gpu.onnx.provider = Provider::Cpu;
    c.gpu.onnx.intra_threads = 1;
    c.readings.gpu_interval_ms = 20;
    c.drift.interval_ms = 50;
    c.drift.min_window = 1;
    let audit = std::env::temp_dir().join(format!("tiergate-dashboard-audit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&audit);
    c.audit = Some(tiergate::audit::AuditConfig { dir: audit, ..Default::default() });
    let sources =
        Sources { cpu: Arc::new(FakeCpu(Mutex::new(0.1))) as _, gpu: Arc::new(FakeGpu::with_free_mb(40_000)) as _ };
    let (public, admin, _) = start_with_admin(c, sources, None);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let phish =
        r#"{"text": "Your account is locked. Confirm your password at http://secure-login.example.top/verify"}"#;
    let json = [("content-type", "application/json")];
    let decided = send(public, "POST", "/v1/classify", &json, phish).await;
    assert_eq!(decided.status, 200);
    // A label, so that live quality has series (it refreshes within a second of labels).
    let record_id = decided.json()["record_id"].as_str().unwrap().to_string();
    let label = format!(r#"{{"record_id": "{record_id}", "label": "risk", "source": "analyst"}}"#);
    assert_eq!(send(admin, "POST", "/v1/feedback", &json, label).await.status, 200);
    assert_eq!(send(public, "POST", "/echo", &json, r#"{"text": "see you at 6"}"#).await.status, 200);
    send(admin, "POST", "/admin/reload", &[], "").await;
    let mut body = bytes::Bytes::new();
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        body = send(admin, "GET", "/metrics", &[], "").await.body;
        if String::from_utf8_lossy(&body).contains("tiergate_quality_model_ece{") {
            break;
        }
    }
    let exported: BTreeSet<String> = String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();
    let mut missing = Vec::new();
    for (title, expr) in queries() {
        let expr = VARIABLES.iter().fold(expr, |e, (var, value)| e.replace(var, value));
        let mut names = Names::default();
        walk_expr(&mut names, &promql_parser::parser::parse(&expr).unwrap()).unwrap();
        for name in names.0 {
            if !exported.contains(&name) {
                missing.push(format!("{name} (panel {title:?})"));
            }
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}\nexported: {exported:?}");
}
