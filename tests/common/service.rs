//! A server process a test runs on a fixed loopback port (Redis, the Tansu broker): spawned with
//! its output in a log file, waited for until the port accepts (a panic with the log's tail if
//! it exits first or takes over 30 s), killed with SIGKILL as a crash would and waited for until
//! the port refuses, frozen and resumed with SIGSTOP / SIGCONT. Killed on drop.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Service {
    /// For messages: `redis`, `tansu`.
    name: &'static str,
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Service {
    /// A stopped service on a free loopback port, logging to a file in the temp directory.
    pub fn new(name: &'static str) -> Service {
        let port = super::free_port().port();
        let log = std::env::temp_dir().join(format!("tiergate-{name}-{}-{port}.log", std::process::id()));
        Service { name, child: None, port, log }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The running process's id, if one runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Stops what runs, spawns `command` (which must listen on [`Service::port`]) and waits
    /// until the port accepts; returns the time from spawn to accepting.
    pub fn spawn(&mut self, mut command: Command) -> Duration {
        self.stop();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let started = Instant::now();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: cannot start {:?}: {e}", self.name, command.get_program()));
        self.child = Some(child);
        while TcpStream::connect(self.addr()).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("{} exited ({status}) before accepting; log:\n{}", self.name, self.log_tail());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{}: no listener within 30 s:\n{}",
                self.name,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let startup = started.elapsed();
        eprintln!("{} {} up {startup:?} after spawn (log {:?})", self.name, self.addr(), self.log);
        startup
    }

    /// Kills the process (SIGKILL: no shutdown, as a crash) and waits until the port refuses.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let down = Instant::now();
        while TcpStream::connect(self.addr()).is_ok() {
            assert!(
                down.elapsed() < Duration::from_secs(10),
                "{}: port {} still accepts after kill",
                self.name,
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Freezes (`STOP`) or resumes (`CONT`) the process: it keeps its connections and data but
    /// answers nothing while frozen, as a hung server would.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap_or_else(|| panic!("{} is running", self.name)).id();
        let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// The last 4 KiB of the log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&text[text.len().saturating_sub(4096)..]).into_owned()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
