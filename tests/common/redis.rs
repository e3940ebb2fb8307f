//! A real Redis server for tests: Debian bookworm's build (7.0), on 127.0.0.1 with a free port,
//! `--save '' --appendonly no` (nothing on disk: a restarted server starts empty, as a lost
//! Redis would).
//!
//! The binary comes from Debian's `redis-tools` package (the server is the same executable as
//! `redis-check-rdb`; Debian's `redis-server` package is only a symlink to it, which we make
//! ourselves) with the two libraries it needs that a base image lacks, `libjemalloc2` and
//! `liblzf1`: fetched once with `apt-get download` and unpacked with `dpkg-deb -x` (not
//! installed) into `$XDG_CACHE_HOME/tiergate/redis` (else `$HOME/.cache/tiergate/redis`), and
//! run with `LD_LIBRARY_PATH` on the unpacked libraries. `TIERGATE_REDIS_SERVER` names another
//! `redis-server` to use instead. Nothing is skipped: a failed fetch or start fails the test
//! with apt's output or the server's log. The server is killed on drop.
#![allow(dead_code)]

use super::service::Service;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Debian packages unpacked into the cache.
pub const PACKAGES: [&str; 3] = ["redis-tools", "libjemalloc2", "liblzf1"];

fn cache_dir() -> PathBuf {
    let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(xdg), _) if !xdg.is_empty() => PathBuf::from(xdg),
        (_, Some(home)) => PathBuf::from(home).join(".cache"),
        _ => panic!("redis: neither XDG_CACHE_HOME nor HOME is set, so there is no cache directory"),
    };
    base.join("tiergate").join("redis")
}

/// The server binary and the directory to put on `LD_LIBRARY_PATH`, fetched on first use.
pub fn binary() -> (PathBuf, Option<PathBuf>) {
    static BINARY: OnceLock<(PathBuf, Option<PathBuf>)> = OnceLock::new();
    BINARY
        .get_or_init(|| match std::env::var_os("TIERGATE_REDIS_SERVER") {
            Some(server) => (PathBuf::from(server), None),
            None => {
                let root = install();
                (root.join("usr/bin/redis-server"), Some(root.join("usr/lib/x86_64-linux-gnu")))
            }
        })
        .clone()
}

/// Unpacks [`PACKAGES`] into the cache once and returns the root they were unpacked into.
fn install() -> PathBuf {
    let dir = cache_dir();
    let root = dir.join("root");
    if root.join(".complete").is_file() {
        return root;
    }
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("redis: creating {dir:?}: {e}"));
    // Into a private directory first, then renamed: a concurrent test binary never sees half an
    // install.
    let partial = dir.join(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let debs = partial.join("debs");
    std::fs::create_dir_all(&debs).unwrap();
    if !run_apt(&debs, &["download"]) {
        // A fresh machine has no package lists yet.
        assert!(run_apt(&debs, &["update"]), "redis: `apt-get update` failed (see above)");
        assert!(run_apt(&debs, &["download"]), "redis: `apt-get download {}` failed (see above)", PACKAGES.join(" "));
    }
    for deb in std::fs::read_dir(&debs).unwrap() {
        let deb = deb.unwrap().path();
        let status = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial).status();
        let status = status.unwrap_or_else(|e| panic!("redis: cannot run dpkg-deb (Debian's dpkg is needed): {e}"));
        assert!(status.success(), "redis: `dpkg-deb -x {deb:?}` failed ({status})");
    }
    std::fs::remove_dir_all(&debs).unwrap();
    let server = partial.join("usr/bin/redis-server");
    assert!(partial.join("usr/bin/redis-check-rdb").is_file(), "redis: no redis-check-rdb in {partial:?}");
    std::os::unix::fs::symlink("redis-check-rdb", &server).unwrap();
    std::fs::write(partial.join(".complete"), PACKAGES.join("\n")).unwrap();
    if std::fs::rename(&partial, &root).is_err() {
        // Another process finished first; use its copy.
        let _ = std::fs::remove_dir_all(&partial);
    }
    assert!(root.join(".complete").is_file(), "redis: no complete install in {root:?}");
    root
}

/// `apt-get ARGS` (with [`PACKAGES`] for `download`) in `dir`; prints apt's output on failure.
fn run_apt(dir: &Path, args: &[&str]) -> bool {
    let mut apt = Command::new("apt-get");
    apt.current_dir(dir).args(args);
    if args == ["download"] {
        apt.args(PACKAGES);
    }
    let output = apt
        .output()
        .unwrap_or_else(|e| panic!("redis: cannot run apt-get (set TIERGATE_REDIS_SERVER to a redis-server): {e}"));
    if !output.status.success() {
        eprintln!("apt-get {args:?}: {}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    output.status.success()
}

/// A running (or stopped) Redis on a fixed loopback port.
pub struct Redis {
    service: Service,
}

impl Redis {
    /// Fetches the server if needed and starts it on a free port.
    pub fn start() -> Redis {
        let mut server = Redis { service: Service::new("redis") };
        server.restart();
        server
    }

    /// `redis://127.0.0.1:PORT`, for the client.
    pub fn url(&self) -> String {
        format!("redis://{}", self.service.addr())
    }

    /// Kills the server (SIGKILL: no shutdown, as a crash) and waits until the port refuses.
    pub fn stop(&mut self) {
        self.service.stop();
    }

    /// Starts the server (empty) on the same port and waits until it accepts.
    pub fn restart(&mut self) {
        let (server, libs) = binary();
        let mut command = Command::new(server);
        if let Some(libs) = libs {
            command.env("LD_LIBRARY_PATH", libs);
        }
        command.args(["--bind", "127.0.0.1", "--port", &self.service.port().to_string()]).args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ]);
        self.service.spawn(command);
    }

    /// Freezes (`STOP`) or resumes (`CONT`) the server, as a hung or overloaded Redis would.
    pub fn signal(&self, signal: &str) {
        self.service.signal(signal);
    }

    /// A client connection (blocking API), for reading the server's state in assertions.
    pub fn client(&self) -> ::redis::Connection {
        ::redis::Client::open(self.url()).unwrap().get_connection().expect("redis: test client connects")
    }

    /// Calls of `command` since start (or `CONFIG RESETSTAT`), from `INFO commandstats`
    /// (`cmdstat_evalsha:calls=N,...`); 0 when never called.
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = ::redis::cmd("INFO").arg("commandstats").query(&mut self.client()).unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
            .unwrap_or(0)
    }

    /// `total_connections_received` from `INFO stats`, asked over `conn` (a connection kept
    /// open by the caller, so that asking opens no new one).
    pub fn connections_received(conn: &mut ::redis::Connection) -> u64 {
        let info: String = ::redis::cmd("INFO").arg("stats").query(conn).unwrap();
        let value = info.lines().find_map(|l| l.strip_prefix("total_connections_received:"));
        value.expect("INFO stats has total_connections_received").trim().parse().unwrap()
    }

    /// Every command's call count from `INFO commandstats`, `(command, calls)`.
    pub fn all_command_calls(&self) -> Vec<(String, u64)> {
        let info: String = ::redis::cmd("INFO").arg("commandstats").query(&mut self.client()).unwrap();
        info.lines()
            .filter_map(|line| line.strip_prefix("cmdstat_"))
            .filter_map(|rest| {
                let (name, stats) = rest.split_once(":calls=")?;
                Some((name.to_string(), stats.split(',').next()?.parse().ok()?))
            })
            .collect()
    }
}
