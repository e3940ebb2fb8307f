//! A real browser for tests: Debian bookworm's headless Chromium, driven over WebDriver by its
//! `chromedriver` on 127.0.0.1 with a free port, through the `fantoccini` client.
//!
//! The packages `chromium`, `chromium-common` and `chromium-driver`, and those of their shared
//! libraries this machine lacks, are fetched once with `apt-get download` and unpacked with
//! `dpkg-deb -x` (not installed) into `$XDG_CACHE_HOME/tiergate/chromium` (else
//! `$HOME/.cache/tiergate/chromium`), as [`super::redis`] fetches Redis. The missing libraries
//! are found by walking `apt-cache depends` from the three packages through the `lib*` packages
//! not installed here (first of each set of alternatives); `ldd` then checks that both binaries
//! find every library with `LD_LIBRARY_PATH` on the unpacked ones, and the fetch fails naming
//! any that is still missing. `TIERGATE_CHROMEDRIVER` and `TIERGATE_CHROMIUM` (both) name a
//! driver and a browser to use instead. Nothing is skipped: a failed fetch or start fails the
//! test with apt's output or the driver's log.
//!
//! The driver runs in a process group of its own, with the browsers it starts; the group is
//! killed on drop, so a failed test leaves no browser behind.
#![allow(dead_code)]

use super::service::Service;
use fantoccini::{Client, ClientBuilder};
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The packages fetched whatever this machine has; their missing libraries come with them.
pub const PACKAGES: [&str; 3] = ["chromium", "chromium-common", "chromium-driver"];

/// The browser's flags: no display (`--headless=new`), no setuid sandbox (tests may run as root
/// or in containers without user namespaces), software rendering, `/tmp` rather than a small
/// `/dev/shm`, and a fixed window for screenshots of a stable size.
pub const FLAGS: [&str; 6] = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--window-size=1280,860",
    "--lang=en-US",
];

fn cache_dir() -> PathBuf {
    let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(xdg), _) if !xdg.is_empty() => PathBuf::from(xdg),
        (_, Some(home)) => PathBuf::from(home).join(".cache"),
        _ => panic!("chromium: neither XDG_CACHE_HOME nor HOME is set, so there is no cache directory"),
    };
    base.join("tiergate").join("chromium")
}

/// Where the driver and the browser are, and the directories to put on `LD_LIBRARY_PATH`.
#[derive(Clone, Debug)]
pub struct Install {
    pub driver: PathBuf,
    pub browser: PathBuf,
    pub libs: Vec<PathBuf>,
}

impl Install {
    /// `LD_LIBRARY_PATH`'s value: the unpacked library directories.
    fn library_path(&self) -> String {
        self.libs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":")
    }
}

/// The driver and the browser, fetched on first use.
pub fn install() -> Install {
    static INSTALL: OnceLock<Install> = OnceLock::new();
    INSTALL
        .get_or_init(|| match (std::env::var_os("TIERGATE_CHROMEDRIVER"), std::env::var_os("TIERGATE_CHROMIUM")) {
            (Some(driver), Some(browser)) => Install { driver: driver.into(), browser: browser.into(), libs: vec![] },
            (None, None) => unpacked(&fetch()),
            _ => panic!("chromium: set both TIERGATE_CHROMEDRIVER and TIERGATE_CHROMIUM, or neither"),
        })
        .clone()
}

fn unpacked(root: &Path) -> Install {
    let lib = root.join("usr/lib/x86_64-linux-gnu");
    Install {
        driver: root.join("usr/bin/chromedriver"),
        // The real executable: `usr/bin/chromium` is a shell wrapper reading /etc/chromium.d.
        browser: root.join("usr/lib/chromium/chromium"),
        libs: vec![lib.clone(), lib.join("pulseaudio")],
    }
}

/// Unpacks [`PACKAGES`] and their missing libraries into the cache once; returns the root.
fn fetch() -> PathBuf {
    let dir = cache_dir();
    let root = dir.join("root");
    if root.join(".complete").is_file() {
        return root;
    }
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("chromium: creating {dir:?}: {e}"));
    // Into a private directory first, then renamed: a concurrent test binary never sees half an
    // install.
    let partial = dir.join(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let debs = partial.join("debs");
    std::fs::create_dir_all(&debs).unwrap();
    if !apt(&debs, "apt-cache", &["show", PACKAGES[0]]).0 {
        // A fresh machine has no package lists yet.
        assert!(apt(&debs, "apt-get", &["update"]).0, "chromium: `apt-get update` failed (see above)");
    }
    let packages = packages_to_fetch(&debs);
    let mut args = vec!["download"];
    args.extend(packages.iter().map(String::as_str));
    assert!(apt(&debs, "apt-get", &args).0, "chromium: `apt-get {}` failed (see above)", args.join(" "));
    for deb in std::fs::read_dir(&debs).unwrap() {
        let deb = deb.unwrap().path();
        let status = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial).status();
        let status = status.unwrap_or_else(|e| panic!("chromium: cannot run dpkg-deb (Debian's dpkg is needed): {e}"));
        assert!(status.success(), "chromium: `dpkg-deb -x {deb:?}` failed ({status})");
    }
    std::fs::remove_dir_all(&debs).unwrap();
    check_libraries(&unpacked(&partial));
    let list: Vec<&str> = packages.iter().map(String::as_str).collect();
    std::fs::write(partial.join(".complete"), list.join("\n")).unwrap();
    if std::fs::rename(&partial, &root).is_err() {
        // Another process finished first; use its copy.
        let _ = std::fs::remove_dir_all(&partial);
    }
    assert!(root.join(".complete").is_file(), "chromium: no complete install in {root:?}");
    root
}

/// [`PACKAGES`] and the `lib*` packages among their dependencies (transitively) that are not
/// installed here. Of alternatives (`|Depends: a` then `Depends: b`), the first is taken.
fn packages_to_fetch(dir: &Path) -> Vec<String> {
    let mut wanted: Vec<String> = PACKAGES.iter().map(|p| p.to_string()).collect();
    let mut seen: BTreeSet<String> = wanted.iter().cloned().collect();
    let mut todo = wanted.clone();
    while let Some(package) = todo.pop() {
        let (ok, out) = apt(dir, "apt-cache", &["depends", "--no-recommends", "--no-suggests", &package]);
        assert!(ok, "chromium: `apt-cache depends {package}` failed (see above)");
        for dep in first_alternatives(&out) {
            if dep.starts_with("lib") && seen.insert(dep.clone()) && !installed(&dep) {
                wanted.push(dep.clone());
                todo.push(dep);
            }
        }
    }
    wanted
}

/// The `Depends`/`PreDepends` of `apt-cache depends` output, the first of each set of
/// alternatives, virtual packages (`<name>`) left out.
fn first_alternatives(out: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut in_alternatives = false;
    for line in out.lines() {
        let line = line.trim();
        let (alternative, rest) = match line.strip_prefix('|') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let Some(name) = rest.strip_prefix("Depends: ").or_else(|| rest.strip_prefix("PreDepends: ")) else {
            continue;
        };
        if !in_alternatives && !name.starts_with('<') {
            deps.push(name.trim().to_string());
        }
        in_alternatives = alternative;
    }
    deps
}

fn installed(package: &str) -> bool {
    let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", package]).output();
    out.is_ok_and(|o| o.status.success() && o.stdout == b"install ok installed")
}

/// Fails naming every library that `ldd` finds missing for the driver or the browser.
fn check_libraries(install: &Install) {
    for binary in [&install.driver, &install.browser] {
        let out = Command::new("ldd")
            .arg(binary)
            .env("LD_LIBRARY_PATH", install.library_path())
            .output()
            .unwrap_or_else(|e| panic!("chromium: cannot run ldd: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        let missing: Vec<&str> = text.lines().filter(|l| l.contains("not found")).map(str::trim).collect();
        assert!(missing.is_empty(), "chromium: {binary:?} still lacks libraries after the fetch: {missing:?}");
    }
}

/// Runs `program args` in `dir`: whether it succeeded, and its stdout; prints stderr on failure.
fn apt(dir: &Path, program: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(program).current_dir(dir).args(args).output().unwrap_or_else(|e| {
        panic!("chromium: cannot run {program} (set TIERGATE_CHROMEDRIVER and TIERGATE_CHROMIUM): {e}")
    });
    if !output.status.success() {
        eprintln!("{program} {args:?}: {}\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    }
    (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A running `chromedriver` on a loopback port; its browsers are started per [`Browser::session`].
pub struct Browser {
    service: Service,
    install: Install,
    /// Profiles of the sessions started, removed on drop.
    profiles: std::sync::Mutex<Vec<PathBuf>>,
}

impl Browser {
    /// Fetches the driver and the browser if needed and starts the driver on a free port.
    pub fn start() -> Browser {
        let install = install();
        let mut service = Service::new("chromedriver");
        let mut command = Command::new(&install.driver);
        command
            .arg(format!("--port={}", service.port()))
            .arg("--allowed-ips=127.0.0.1")
            .env("LD_LIBRARY_PATH", install.library_path())
            // Its own group, so that drop kills the browsers with it.
            .process_group(0);
        service.spawn(command);
        Browser { service, install, profiles: Default::default() }
    }

    /// The driver's URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.service.addr())
    }

    /// A new headless browser (with a fresh profile: no cookies) and its WebDriver client.
    pub async fn session(&self) -> Client {
        let profile =
            std::env::temp_dir().join(format!("tiergate-chromium-{}-{}", std::process::id(), fastrand::u64(..)));
        self.profiles.lock().unwrap().push(profile.clone());
        let mut args: Vec<String> = FLAGS.iter().map(|f| f.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let options = serde_json::json!({"binary": self.install.browser, "args": args});
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("goog:chromeOptions".into(), options);
        // Plain HTTP to a loopback driver: no TLS connector (and no system TLS library) needed.
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector).capabilities(capabilities).connect(&self.url()).await.unwrap_or_else(|e| {
            panic!("chromium: no WebDriver session ({e}); driver log:\n{}", self.service.log_tail())
        })
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(pid) = self.service.pid() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
        }
        for profile in self.profiles.lock().unwrap().drain(..) {
            let _ = std::fs::remove_dir_all(profile);
        }
    }
}
