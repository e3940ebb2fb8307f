//! Shared test harness: starts the real server (real model, real ONNX Runtime, real policy
//! files) on an ephemeral port in its own runtime thread, and a small HTTP client.
#![allow(dead_code)]

pub mod app;
pub mod browser;
pub mod llama;
pub mod openai_stub;
pub mod proxy;
pub mod python;
pub mod redis;
pub mod routes;
pub mod service;
pub mod tansu;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiergate::gateway::Sources;
use tiergate::{App, Config, Gateway};

/// A benign chat message the bundled policy allows.
pub const BENIGN: &str = "Are we still on for lunch tomorrow at noon? I booked the usual place.";
/// [`BENIGN`]'s variant with an e-mail address in it (which redacted audit text hides).
pub const BENIGN_WITH_EMAIL: &str = "Are we still on for lunch tomorrow at noon? Mail me at jan@example.org if not.";
/// A credential-phishing message the bundled policy blocks.
pub const PHISHING: &str =
    "Your account is locked. Send your password and PIN to http://secure-login.example.com/verify immediately.";

/// A loopback address for a child process (`tiergate serve`, Redis, the broker) to listen on.
///
/// Ports come from below Linux's ephemeral range (32768-60999), so nothing in this process that
/// binds port 0 (stubs, the in-process server, clients' source ports) can take one between this
/// call and the child's bind; with `bind(0)` here, a released port went to the next `bind(0)` and
/// two servers given one port made one exit at start, the test then seeing "connection refused".
/// Each call moves on to the next port, from an offset by process id, so that test binaries run
/// side by side start apart; a port some other program holds is skipped.
pub fn free_port() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() % 500 * 24;
    loop {
        let port = FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        if let Ok(listener) = std::net::TcpListener::bind(("127.0.0.1", port as u16)) {
            return listener.local_addr().unwrap();
        }
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Config pointing at the bundled model and the given policy directory, on an ephemeral port.
pub fn config(policies: &Path) -> Config {
    let mut c = Config::default();
    c.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.model.dir = repo().join("models");
    c.policies.dir = policies.to_path_buf();
    // Most tests read metrics, readiness details and explanations from the one listener they
    // start; the defaults (all on the admin listener only) are tested in classify.rs
    // (`the_public_listener_serves_no_evasion_oracle`).
    c.admin.public_metrics = true;
    c.admin.public_readyz_details = true;
    c.admin.public_explain = true;
    c
}

/// [`config`] with the `[[routes]]` and `[proxy]` of `routes` (TOML).
pub fn config_with_routes(policies: &Path, routes: &str) -> Config {
    let mut c = config(policies);
    let parsed = Config::parse(routes).unwrap_or_else(|e| panic!("test routes: {e}"));
    c.routes = parsed.routes;
    c.proxy = parsed.proxy;
    c
}

/// Starts a server for `config` on a dedicated thread and runtime (so it outlives any one
/// test's runtime) and returns its address.
pub fn start(config: Config) -> SocketAddr {
    start_with(config, Sources::default()).0
}

/// Like [`start`], with the given signal sources; also returns the gateway.
pub fn start_with(config: Config, sources: Sources) -> (SocketAddr, Arc<Gateway>) {
    let (addr, _, gateway) = start_with_admin(config, sources, None);
    (addr, gateway)
}

/// Starts the public and the admin listener (admin token `token`); returns both addresses.
pub fn start_with_admin(
    config: Config,
    sources: Sources,
    token: Option<&str>,
) -> (SocketAddr, SocketAddr, Arc<Gateway>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let token = token.map(str::to_string);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let gateway = Gateway::start(&config.gateway(), sources).expect("gateway starts with the bundled model");
            let listener = tokio::net::TcpListener::bind(config.server.listen).await.unwrap();
            let admin_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send((listener.local_addr().unwrap(), admin_listener.local_addr().unwrap(), Arc::clone(&gateway)))
                .unwrap();
            let mut config = config;
            config.admin.token = token;
            let (app, admin) = App::pair(gateway, &config.server, &config.admin, config.proxy().expect("valid routes"));
            tokio::spawn(tiergate::serve(admin_listener, Arc::new(admin), std::future::pending()));
            let app = Arc::new(app);
            tiergate::serve(listener, app, std::future::pending()).await.unwrap();
        });
    });
    rx.recv().expect("server started")
}

/// The server with the bundled policies, shared by every test in a binary.
pub fn default_server() -> SocketAddr {
    static ADDR: std::sync::OnceLock<SocketAddr> = std::sync::OnceLock::new();
    *ADDR.get_or_init(|| start(config(&repo().join("policies"))))
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Reply {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::builder().method(method).uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client.request(req.body(Full::new(body.into())).unwrap()).await.expect("request reaches the server");
    let (parts, body) = resp.into_parts();
    Reply { status: parts.status, headers: parts.headers, body: body.collect().await.unwrap().to_bytes() }
}

pub async fn classify(addr: SocketAddr, body: serde_json::Value) -> Reply {
    send(addr, "POST", "/v1/classify", &[("content-type", "application/json")], body.to_string()).await
}

/// [`classify`] with a deadline long enough that a loaded test machine never turns a model
/// verdict into a timeout: for tests about what is decided, not how fast.
pub async fn classify_unhurried(addr: SocketAddr, body: serde_json::Value) -> Reply {
    classify_within(addr, body, 5000).await
}

/// `POST /v1/classify` with `x-tiergate-deadline-ms: deadline_ms`.
pub async fn classify_within(addr: SocketAddr, body: serde_json::Value, deadline_ms: u64) -> Reply {
    let deadline = deadline_ms.to_string();
    let headers = [("content-type", "application/json"), ("x-tiergate-deadline-ms", deadline.as_str())];
    send(addr, "POST", "/v1/classify", &headers, body.to_string()).await
}

/// Labelled examples `{"text", "label"}` from a JSONL file under tests/data.
pub fn labelled(name: &str) -> Vec<(String, u8)> {
    let text = std::fs::read_to_string(repo().join("tests/data").join(name)).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["text"].as_str().unwrap().to_string(), v["label"].as_u64().unwrap() as u8)
        })
        .collect()
}

/// (tier, outcome) of each step of a decision's `path`.
pub fn path_steps(d: &serde_json::Value) -> Vec<(String, String)> {
    let path = d["path"].as_array().unwrap_or_else(|| panic!("no path: {d}"));
    path.iter().map(|s| (s["tier"].as_str().unwrap().into(), s["outcome"].as_str().unwrap().into())).collect()
}

/// The gateway's load snapshot now, under its live policy, as a decision would read it.
pub fn load_now(gateway: &Gateway) -> tiergate::select::LoadSnapshot {
    gateway.snapshot(tokio::time::Instant::now(), &gateway.policies.snapshot())
}

/// A copy of the bundled policies with `routing.toml` replaced, in a fresh temporary directory.
pub fn policies_with_routing(name: &str, routing: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(repo().join("policies/rules.toml"), dir.join("rules.toml")).unwrap();
    std::fs::copy(repo().join("policies/guards.toml"), dir.join("guards.toml")).unwrap();
    std::fs::write(dir.join("routing.toml"), routing).unwrap();
    dir
}

/// The bundled `policies/routing.toml`.
pub fn bundled_routing() -> String {
    std::fs::read_to_string(repo().join("policies/routing.toml")).unwrap()
}

/// A number the bundled routing.toml sets at the start of a line (`key = value`), so that a test's
/// precondition follows the bundled policy rather than a copy of its value.
pub fn bundled_routing_number(key: &str) -> f64 {
    let prefix = format!("{key} =");
    let routing = bundled_routing();
    let line =
        routing.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("the bundled policy sets {key}"));
    line[prefix.len()..].split('#').next().unwrap().trim().parse().unwrap()
}

/// [`policies_with_routing`] with the bundled routing.toml, each `(from, to)` of `edits` replaced
/// in turn (each must be there).
pub fn policies_with_edited_routing(name: &str, edits: &[(&str, &str)]) -> PathBuf {
    let mut routing = bundled_routing();
    for (from, to) in edits {
        assert!(routing.contains(from), "policies/routing.toml has no {from:?}");
        routing = routing.replace(from, to);
    }
    policies_with_routing(name, &routing)
}

/// The bundled policies with the cpu tier saturated at 50 % (so a [`FakeCpu`] at 95 % leaves no
/// model tier able to take a request) and, with `shed`, `when_saturated = "shed"` instead of
/// `"rules"`.
pub fn saturated_policies(name: &str, shed: bool) -> PathBuf {
    let cpu = ("max_utilization = 1.0", "max_utilization = 0.5");
    match shed {
        true => policies_with_edited_routing(name, &[cpu, ("when_saturated = \"rules\"", "when_saturated = \"shed\"")]),
        false => policies_with_edited_routing(name, &[cpu]),
    }
}

/// The bundled policies with `review_at = 0.0`: every model verdict is at least `review`.
pub fn reviewing_policies(name: &str) -> PathBuf {
    policies_with_edited_routing(name, &[("review_at = 0.3", "review_at = 0.0")])
}

/// A candidate policy that trusts no model verdict (`accept_below = 1.0`): rules decide
/// everything, and where none matches, `block` with `score`.
pub fn rules_only_candidate(name: &str, score: f64) -> PathBuf {
    let routing = format!(
        "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\naccept_below = 1.0\nood_above = 1.0\n\
         [default]\naction = \"block\"\nscore = {score}\n"
    );
    policies_with_routing(name, &routing)
}

/// A policy directory of the bundled routing.toml and `rules` as rules.toml (nothing else), in a
/// fresh temporary directory.
pub fn policies_with_rules(name: &str, rules: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(repo().join("policies/routing.toml"), dir.join("routing.toml")).unwrap();
    std::fs::write(dir.join("rules.toml"), rules).unwrap();
    dir
}

/// `tiergate check-policy DIR`: its exit code and what it wrote to stderr.
pub fn check_policy(dir: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .current_dir(repo())
        .arg("check-policy")
        .arg(dir)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A CPU-load source the test controls.
pub struct FakeCpu(pub std::sync::Mutex<f64>);

impl tiergate::readings::cpu::CpuSource for FakeCpu {
    fn sample(&self) -> Option<f64> {
        Some(*self.0.lock().unwrap())
    }
}

/// A GPU the test controls (a test double for a GPU on a CPU-only machine).
pub struct FakeGpu(pub std::sync::Mutex<tiergate::readings::gpu::GpuSample>);

impl FakeGpu {
    /// One device with `free_mb` of 80 GiB free.
    pub fn with_free_mb(free_mb: u64) -> FakeGpu {
        FakeGpu(std::sync::Mutex::new(Ok(vec![device(free_mb)])))
    }
    pub fn set_free_mb(&self, free_mb: u64) {
        *self.0.lock().unwrap() = Ok(vec![device(free_mb)]);
    }
}

fn device(free_mb: u64) -> tiergate::readings::gpu::GpuDevice {
    tiergate::readings::gpu::GpuDevice {
        ordinal: 0,
        free_bytes: free_mb << 20,
        total_bytes: 80 << 30,
        utilization: Some(0.3),
    }
}

impl tiergate::readings::gpu::GpuSource for FakeGpu {
    fn sample(&self) -> tiergate::readings::gpu::GpuSample {
        self.0.lock().unwrap().clone()
    }
}

/// Test config with fast signal sampling.
pub fn fast_config(policies: &Path) -> Config {
    let mut c = config(policies);
    c.readings.cpu_interval_ms = 20;
    c.readings.cpu_ewma_ms = 40;
    c.readings.gpu_interval_ms = 20;
    c
}

/// Polls `cond` every 20 ms for up to 5 s.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..250 {
        if cond() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A `tiergate serve` config (TOML): listeners on `public` and `admin`, the bundled model, the
/// policies in `policies` (not watched: reloads are the tests'), then the sections `extra`.
pub fn serve_config(public: SocketAddr, admin: SocketAddr, policies: &Path, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"{public}\"\n[admin]\nlisten = \"{admin}\"\n[model]\ndir = \"{}\"\n\
         [policies]\ndir = \"{}\"\nwatch = false\n{extra}",
        repo().join("models").display(),
        policies.display()
    )
}

/// The real tiergate binary serving `config/sidecar.example.toml` in front of `app_url`, on
/// free loopback ports; killed on drop (also when a test fails).
pub struct Sidecar {
    pub child: std::process::Child,
    pub public: SocketAddr,
    pub admin: SocketAddr,
    /// Its stderr, removed on drop.
    log: PathBuf,
}

impl Sidecar {
    /// Starts it and waits (at most 30 s) until the admin listener accepts.
    pub fn start(app_url: &str) -> Sidecar {
        let (public, admin) = (free_port(), free_port());
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"));
        command
            .args(["serve", "--config", "config/sidecar.example.toml"])
            .current_dir(repo())
            .env("APP_UPSTREAM", app_url)
            .env("TIERGATE_LISTEN", public.to_string())
            .env("TIERGATE_ADMIN_LISTEN", admin.to_string());
        Sidecar::spawn(command, public, admin)
    }

    /// `tiergate serve --config CONFIG`, whose config listens on `public` and `admin`; waits (at
    /// most 60 s) until the admin listener accepts.
    pub fn serve(config: &Path, public: SocketAddr, admin: SocketAddr) -> Sidecar {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"));
        command.args(["serve", "--config"]).arg(config);
        Sidecar::spawn(command, public, admin)
    }

    /// `tiergate serve` on free ports with [`serve_config`] of `policies` and `extra`, written
    /// into `dir` (created if missing) as `tiergate-PORT.toml`.
    pub fn serve_in(dir: &Path, policies: &Path, extra: &str) -> Sidecar {
        std::fs::create_dir_all(dir).unwrap();
        let (public, admin) = (free_port(), free_port());
        let path = dir.join(format!("tiergate-{}.toml", public.port()));
        std::fs::write(&path, serve_config(public, admin, policies, extra)).unwrap();
        Sidecar::serve(&path, public, admin)
    }

    /// [`Sidecar::serve_in`] `dir` with the bundled policies and the audit trail in `dir/audit`,
    /// with the further `[audit]` lines `audit`.
    pub fn audited(dir: &Path, audit: &str) -> Sidecar {
        let audit = format!("[audit]\ndir = \"{}\"\n{audit}\n", dir.join("audit").display());
        Sidecar::serve_in(dir, &repo().join("policies"), &audit)
    }

    /// The last `n` lines of [`Sidecar::log_text`], in order.
    fn log_tail(&self, n: usize) -> String {
        let said = self.log_text();
        let lines: Vec<&str> = said.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// What it has logged so far (stderr), terminal colours removed.
    pub fn log_text(&self) -> String {
        let raw = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // CSI: ESC [ ... final byte in @..~
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) && c != '[' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    fn spawn(mut command: std::process::Command, public: SocketAddr, admin: SocketAddr) -> Sidecar {
        // Its log goes to a file, so that a start that fails says why.
        let log = std::env::temp_dir().join(format!("tiergate-sidecar-{}-{}.log", std::process::id(), admin.port()));
        let stderr = std::fs::File::create(&log).map_or_else(|_| std::process::Stdio::null(), Into::into);
        let child = command.stderr(stderr).spawn().expect("the tiergate binary starts");
        let mut sidecar = Sidecar { child, public, admin, log };
        let up = std::time::Instant::now();
        while std::net::TcpStream::connect(admin).is_err() {
            if sidecar.child.try_wait().unwrap().is_some() {
                panic!("tiergate exited at start (public {public}, admin {admin}): {}", sidecar.log_tail(5));
            }
            assert!(up.elapsed() < std::time::Duration::from_secs(60), "tiergate did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        sidecar
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let exited = self.child.try_wait().ok().flatten();
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test says what the server said (and whether it had already exited): the log
        // is removed below, and a rare failure is otherwise gone with it.
        if std::thread::panicking() {
            let state = exited.map_or("was still running".to_string(), |s| format!("had exited: {s}"));
            eprintln!(
                "tiergate (public {}, admin {}) {state}; its last log lines:\n{}",
                self.public,
                self.admin,
                self.log_tail(20)
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}
