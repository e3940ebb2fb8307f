//! Python packages for tests, installed from PyPI once per cache with
//! `pip install --target` into `$XDG_CACHE_HOME/tiergate/<dir>` (else
//! `$HOME/.cache/tiergate/<dir>`). `TIERGATE_PYTHON` names the interpreter (default `python3`,
//! 3.10 or later). Nothing is skipped: a failed install fails the test and says why.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The interpreter the tests run.
pub fn python() -> String {
    std::env::var("TIERGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn cache_dir(dir: &str) -> PathBuf {
    let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(xdg), _) if !xdg.is_empty() => PathBuf::from(xdg),
        (_, Some(home)) => PathBuf::from(home).join(".cache"),
        _ => panic!("python test packages: neither XDG_CACHE_HOME nor HOME is set, so there is no cache directory"),
    };
    base.join("tiergate").join(dir)
}

/// Installs `packages` (pinned `name==version` specs; with their dependencies when `deps`)
/// into the cache directory `dir`, once, and returns the directory to put on `sys.path`.
/// Panics with pip's output on failure.
pub fn install(dir: &str, packages: &[&str], deps: bool) -> PathBuf {
    let dir = cache_dir(dir);
    let tag = packages.join("-").replace("==", "-");
    let site = dir.join(format!("site-{tag}"));
    if site.join(".complete").is_file() {
        return site;
    }
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {dir:?}: {e}"));
    // Into a private directory first, then renamed: a concurrent test binary never sees half an
    // install.
    let partial = dir.join(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let mut pip = Command::new(python());
    pip.args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--target"]).arg(&partial);
    if !deps {
        pip.arg("--no-deps");
    }
    let output = pip
        .args(packages)
        .output()
        .unwrap_or_else(|e| panic!("python test packages: cannot run `{} -m pip`: {e}", python()));
    assert!(
        output.status.success(),
        "python test packages: `pip install {}` failed ({}):\n{}",
        packages.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(partial.join(".complete"), packages.join("\n")).unwrap();
    if std::fs::rename(&partial, &site).is_err() {
        // Another process finished first; use its copy.
        let _ = std::fs::remove_dir_all(&partial);
    }
    assert!(site.join(".complete").is_file(), "python test packages: no complete install in {site:?}");
    site
}
