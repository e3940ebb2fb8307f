//! `TierGateLayer`: the example app (examples/tiergate_layer.rs) run as a process and spoken to
//! over HTTP, and the layer in-process around a service of the test's own.
//!
//! `cargo test --test layer` does not build examples (plain `cargo test` does), so the test
//! builds the example itself when it is missing or may be stale.

mod common;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tiergate::decision::Decision;
use tiergate::gateway::Sources;
use tiergate::metrics::RouteLabels;
use tiergate::proxy::config::ScreenConfig;
use tiergate::proxy::layer::TierGateLayer;
use tiergate::web::BoxBody;
use tiergate::Gateway;
use tower::{ServiceBuilder, ServiceExt};

use common::{BENIGN, PHISHING};

/// The example binary, next to this test's: tests run from `<target>/<profile>/deps/`. Built
/// first when it is missing or may be older than its sources: plain `cargo test` builds
/// examples, but `cargo test --test layer` does not, and a stale binary would test old code.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).expect("the test runs from <target>/<profile>/deps");
    let binary = profile_dir.join("examples").join(format!("tiergate_layer{}", std::env::consts::EXE_SUFFIX));
    let repo = common::repo();
    // Any source newer than the binary may have changed it; cargo then decides (a no-op when it
    // is fresh after all). Cargo releases its build lock while tests run, so this cannot wait
    // on the cargo that started the test.
    let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
    let newest = newest_source(&[repo.join("examples/tiergate_layer.rs"), repo.join("src"), repo.join("Cargo.toml")]);
    if built.is_none_or(|built| built < newest) {
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "--example", "tiergate_layer", "--target-dir"]).arg(profile_dir.parent().unwrap());
        if profile_dir.ends_with("release") {
            build.arg("--release");
        }
        let status = build.current_dir(&repo).status().expect("cargo runs");
        assert!(status.success(), "building the example failed: {build:?}");
    }
    assert!(binary.is_file(), "no {} after building it", binary.display());
    binary
}

/// The latest modification time of the files at or under `paths`.
fn newest_source(paths: &[PathBuf]) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    let mut todo = paths.to_vec();
    while let Some(path) = todo.pop() {
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if meta.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if let Ok(modified) = meta.modified() {
            newest = newest.max(modified);
        }
    }
    newest
}

/// The example process, killed when the test ends (a failed assertion included).
struct Example {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the example on a free port (it prints the address it bound) from the repository root,
/// where it finds config/tiergate.toml and with it the bundled model and policies.
fn start_example() -> Example {
    let mut child = Command::new(example_binary())
        .args(["--listen", "127.0.0.1:0"])
        .current_dir(common::repo())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the example starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if let Some(addr) = line.strip_prefix("listening on ") {
                let _ = tx.send(addr.parse::<SocketAddr>().expect("an address after `listening on`"));
            }
        }
    });
    // Owned by the guard before waiting, so that a timeout kills it too.
    let mut example = Example { child, addr: SocketAddr::from(([127, 0, 0, 1], 0)) };
    example.addr = rx.recv_timeout(Duration::from_secs(60)).expect("the example prints `listening on ADDR`");
    example
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_app_screens_before_its_handler() {
    let example = start_example();
    let addr = example.addr;

    // Benign: the handler runs and sees the decision, both as the extension and the headers. The
    // client forges decision headers; the handler must see only the layer's.
    let body = json!({"message": BENIGN, "user": "u1"}).to_string();
    let headers = [
        JSON,
        ("x-tiergate-action", "allow"),
        ("x-tiergate-rule", "forged_rule"),
        ("x-tiergate-screen-error", "forged"),
    ];
    let reply = common::send(addr, "POST", "/anything", &headers, body.clone()).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["ok"], true);
    assert_eq!(answer["action"], "allow", "the handler got the Decision: {answer}");
    assert_eq!(answer["x-tiergate-action header"], "allow");
    assert_eq!(answer["body_bytes"], body.len(), "the body reached the handler whole after screening");
    let seen = answer["tiergate_headers"].as_object().unwrap();
    assert_eq!(seen["x-tiergate-action"], json!(["allow"]), "one value, the layer's: {answer}");
    assert_ne!(seen.get("x-tiergate-rule"), Some(&json!(["forged_rule"])), "a forged rule reached the handler");
    assert!(!seen.contains_key("x-tiergate-screen-error"), "a forged header reached the handler: {answer}");
    assert_eq!(seen["x-tiergate-tier"], json!([answer["tier"].as_str().unwrap()]));

    // Phishing, with a forged `allow`: 403 with the decision; the handler never answers.
    let body = json!({"message": PHISHING}).to_string();
    let headers = [JSON, ("x-tiergate-action", "allow")];
    let reply = common::send(addr, "POST", "/anything", &headers, body).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{:?}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["error"]["code"], "blocked", "{answer}");
    assert_eq!(answer["decision"]["action"], "block", "{answer}");
    assert!(answer.get("ok").is_none(), "the handler ran for a blocked request: {answer}");

    // Malformed JSON cannot be screened: refused (fail-closed), not passed to the handler.
    let reply = common::send(addr, "POST", "/anything", &[JSON], r#"{"message": "unterminated"#).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{:?}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["error"]["code"], "malformed_json", "{answer}");
    assert!(answer.get("ok").is_none(), "{answer}");
}

/// The handler of the in-process test: echoes the action it was given.
async fn echo_action(req: Request<BoxBody>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let action = req.extensions().get::<Decision>().map(|d| d.action.as_str()).unwrap_or("none");
    Ok(Response::new(Full::new(Bytes::from(action))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_in_process_counts_what_it_forwards_and_refuses_unknown_policies() {
    let config = common::config(&common::repo().join("policies"));
    let gateway = Gateway::start(&config.gateway(), Sources::default()).expect("gateway starts with the bundled model");
    let screen: ScreenConfig = toml::from_str(r#"text = ["query:q"]"#).unwrap();
    let layer = TierGateLayer::new(Arc::clone(&gateway), config.server.clone(), "inproc", &screen).unwrap();
    // Any request body type: here a buffered one, not hyper's `Incoming`.
    let service = ServiceBuilder::new().layer(layer).service(tower::service_fn(echo_action));
    let request = |text: &str| {
        let query = form_urlencoded::Serializer::new(String::new()).append_pair("q", text).finish();
        Request::get(format!("/?{query}")).body(Full::new(Bytes::new())).unwrap()
    };
    let response = service.clone().oneshot(request(BENIGN)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "allow");
    let response = service.clone().oneshot(request(PHISHING)).await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["code"], "blocked");
    // A policy directory the gateway never loaded is refused, not quietly replaced by the live one.
    let elsewhere: ScreenConfig = toml::from_str("text = [\"query:q\"]\npolicy = \"/nonexistent/policies\"").unwrap();
    let refused = TierGateLayer::new(Arc::clone(&gateway), config.server.clone(), "x", &elsewhere).err().unwrap();
    assert!(refused.contains("/nonexistent/policies"), "{refused}");
    let count =
        |outcome| gateway.metrics.proxy_requests.get_or_create(&RouteLabels { route: "inproc".into(), outcome }).get();
    assert_eq!((count("forwarded"), count("blocked")), (1, 1));
}
