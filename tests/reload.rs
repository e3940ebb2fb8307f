//! Hot reload: file changes (atomic rename and in-place writes), the admin listener, SIGHUP;
//! a broken edit changes nothing but the error report; no request fails or is decided by a
//! policy other than the one it names.

mod common;
use common::*;
use serde_json::json;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiergate::gateway::Sources;
use tiergate::policy::Policy;

const RULES: &str = r#"
[signals.link]
patterns = ['https?://\S+']
[[rules]]
name = "link"
when = "signals.link > 0"
action = "review"
score = 0.7
"#;

/// A routing policy under which every request is decided by rules (no verdict is trusted),
/// and a request matching no rule gets `action`: so the action tells which version decided.
fn routing(action: &str, score: f64) -> String {
    format!(
        "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\naccept_below = 1.0\nood_above = 1.0\n\
         [default]\naction = \"{action}\"\nscore = {score}\n"
    )
}

const BROKEN: &str = "[actions]\nreview_at = 0.3\nblock_at = 0.8\n[cascade]\naccept_below = 2.0\nood_above = 1.0\n[default]\naction = \"allow\"\nscore = 0.1\n";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tiergate-reload-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The version a policy directory with these files would have.
fn version_of(routing: &str) -> String {
    let dir = scratch(&format!("v{}", routing.len()));
    std::fs::write(dir.join("routing.toml"), routing).unwrap();
    std::fs::write(dir.join("rules.toml"), RULES).unwrap();
    Policy::load_dir(&dir).unwrap().version
}

fn write_atomic(dir: &Path, text: &str) {
    let tmp = dir.join("routing.toml.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join("routing.toml")).unwrap();
}

fn write_in_place(dir: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("routing.toml")).unwrap(); // truncates
    let (a, b) = text.split_at(text.len() / 2);
    f.write_all(a.as_bytes()).unwrap();
    f.flush().unwrap();
    std::thread::sleep(Duration::from_millis(5)); // a watcher may see the half-written file
    f.write_all(b.as_bytes()).unwrap();
}

fn policy_dir_with(name: &str, routing: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::write(dir.join("rules.toml"), RULES).unwrap();
    write_atomic(&dir, routing);
    dir
}

fn server(dir: &Path, token: Option<&str>) -> (std::net::SocketAddr, std::net::SocketAddr) {
    let mut c = config(dir);
    c.policies.debounce_ms = 50;
    let (addr, admin, _) = start_with_admin(c, Sources::default(), token);
    (addr, admin)
}

#[tokio::test]
async fn reload_under_load_never_fails_a_request_nor_mixes_versions() {
    let versions: Vec<(String, &str, String)> = [("allow", 0.1), ("review", 0.45), ("block", 0.9), ("review", 0.5)]
        .iter()
        .map(|(a, s)| (routing(a, *s), *a, version_of(&routing(a, *s))))
        .collect();
    let expected: HashMap<String, String> = versions.iter().map(|(_, a, v)| (v.clone(), a.to_string())).collect();
    let dir = policy_dir_with("load", &versions[0].0);
    let (addr, _) = server(&dir, None);

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = classify(addr, json!({"text": "hello there, see you at lunch"})).await;
                    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                    let d = r.json();
                    seen.lock()
                        .unwrap()
                        .push((d["policy_version"].as_str().unwrap().into(), d["action"].as_str().unwrap().into()));
                }
            })
        })
        .collect();

    let writer_dir = dir.clone();
    let texts: Vec<String> = versions.iter().take(3).map(|(t, _, _)| t.clone()).collect();
    tokio::task::spawn_blocking(move || {
        for i in 0..32 {
            let text = if i % 4 == 3 { BROKEN.to_string() } else { texts[i % 4].clone() };
            if i % 2 == 0 {
                write_atomic(&writer_dir, &text)
            } else {
                write_in_place(&writer_dir, &text)
            }
            std::thread::sleep(Duration::from_millis(60));
        }
    })
    .await
    .unwrap();

    // The last edit, to a version not served yet: within a second, responses carry it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    write_atomic(&dir, &versions[3].0);
    let edited = Instant::now();
    loop {
        let d = classify(addr, json!({"text": "hello there, see you at lunch"})).await.json();
        if d["policy_version"] == versions[3].2.as_str() {
            break;
        }
        assert!(edited.elapsed() < Duration::from_secs(1), "new version not served within a second: {d}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("new policy_version served {} ms after the edit", edited.elapsed().as_millis());
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let seen = seen.lock().unwrap();
    assert!(seen.len() > 50, "the clients kept sending ({} decisions)", seen.len());
    let mut per_version: HashMap<&str, usize> = HashMap::new();
    for (version, action) in seen.iter() {
        let want = expected.get(version).unwrap_or_else(|| panic!("decision names unknown version {version}"));
        assert_eq!(action, want, "a decision by {version} must use its default action");
        *per_version.entry(version).or_default() += 1;
    }
    assert!(per_version.len() >= 2, "several versions served during the run: {per_version:?}");
}

#[tokio::test]
async fn a_broken_edit_changes_nothing_but_the_error_report() {
    let good = routing("review", 0.45);
    let dir = policy_dir_with("broken", &good);
    let (addr, admin) = server(&dir, None);
    let before = classify(addr, json!({"text": "hello"})).await.json()["policy_version"].clone();
    write_in_place(&dir, BROKEN);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let d = classify(addr, json!({"text": "hello"})).await.json();
    assert_eq!(d["policy_version"], before, "the last good policy keeps serving");
    let status = send(admin, "GET", "/admin/policy", &[], "").await.json();
    assert_eq!(status["version"], before);
    let errors = status["last_error"].as_array().expect("the refused edit is reported");
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap().contains("routing.toml")
                && e.as_str().unwrap().contains("cascade.accept_below")),
        "{status}"
    );
    assert!(status["reloads_failed"].as_u64().unwrap() >= 1);
    let metrics = String::from_utf8_lossy(&send(addr, "GET", "/metrics", &[], "").await.body).to_string();
    assert!(metrics.contains("tiergate_policy_reloads_total{trigger=\"file\",result=\"refused\"}"), "{metrics}");
    // Fixing the file clears the error.
    write_atomic(&dir, &routing("block", 0.9));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let status = send(admin, "GET", "/admin/policy", &[], "").await.json();
    assert!(status["last_error"].is_null(), "{status}");
    assert_eq!(status["version"], version_of(&routing("block", 0.9)).as_str());
}

#[tokio::test]
async fn admin_reload_needs_the_token_and_reports_problems() {
    let dir = policy_dir_with("admin", &routing("review", 0.45));
    let mut c = config(&dir);
    c.policies.watch = false; // only the admin endpoint reloads here
    let (addr, admin, _) = start_with_admin(c, Sources::default(), Some("s3cret"));
    let bearer = ("authorization", "Bearer s3cret");

    assert_eq!(send(admin, "GET", "/admin/policy", &[], "").await.status, 401);
    assert_eq!(send(admin, "GET", "/admin/policy", &[("authorization", "Bearer nope")], "").await.status, 401);
    for wrong in ["Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer"] {
        assert_eq!(send(admin, "GET", "/admin/policy", &[("authorization", wrong)], "").await.status, 401, "{wrong}");
    }
    // The scheme is case-insensitive (RFC 9110 §11.1).
    for right in ["bearer s3cret", "BEARER s3cret", "Bearer  s3cret "] {
        assert_eq!(send(admin, "GET", "/admin/policy", &[("authorization", right)], "").await.status, 200, "{right}");
    }
    assert_eq!(send(addr, "GET", "/admin/policy", &[bearer], "").await.status, 404, "never on the public listener");
    assert_eq!(send(addr, "POST", "/admin/reload", &[bearer], "").await.status, 404);

    write_atomic(&dir, BROKEN);
    let r = send(admin, "POST", "/admin/reload", &[bearer], "").await;
    assert_eq!(r.status, 422);
    let e = r.json();
    assert_eq!(e["error"]["code"], "policy_invalid");
    assert!(e["error"]["problems"][0].as_str().unwrap().contains("routing.toml"), "{e}");

    write_atomic(&dir, &routing("block", 0.9));
    let r = send(admin, "POST", "/admin/reload", &[bearer], "").await.json();
    assert_eq!(r["status"], "reloaded");
    assert_eq!(r["version"], version_of(&routing("block", 0.9)).as_str());
    let d = classify(addr, json!({"text": "hello"})).await.json();
    assert_eq!(d["policy_version"], r["version"]);
    assert_eq!(d["action"], "block");
    let r = send(admin, "POST", "/admin/reload", &[bearer], "").await.json();
    assert_eq!(r["status"], "unchanged");
}

#[test]
fn sighup_reloads_the_running_binary() {
    let dir = policy_dir_with("sighup", &routing("review", 0.45));
    let config = scratch("sighup-config").join("tiergate.toml"); // not in the policy directory
    let (public, admin) = (common::free_port(), common::free_port());
    std::fs::write(&config, serve_config(public, admin, &dir, "")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tiergate"))
        .args(["serve", "--config"])
        .arg(&config)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let version =
        |addr| rt.block_on(async move { send(addr, "GET", "/admin/policy", &[], "").await.json()["version"].clone() });
    let up = Instant::now();
    while std::net::TcpStream::connect(admin).is_err() {
        assert!(up.elapsed() < Duration::from_secs(30), "server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = version(admin);
    write_atomic(&dir, &routing("block", 0.9));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(version(admin), before, "watch = false: no reload without a trigger");
    let status = std::process::Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let sent = Instant::now();
    while version(admin) == before {
        assert!(sent.elapsed() < Duration::from_secs(2), "SIGHUP did not reload");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(version(admin), version_of(&routing("block", 0.9)).as_str());
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let exit = child.wait().unwrap();
    assert!(exit.success(), "graceful shutdown on SIGTERM exits 0: {exit:?}");
}

#[tokio::test]
async fn the_watch_survives_the_directory_being_recreated_or_swapped() {
    let dir = policy_dir_with("recreate", &routing("review", 0.45));
    let (addr, admin) = server(&dir, None);
    let version = |want: String| async move {
        let started = Instant::now();
        loop {
            let d = classify(addr, json!({"text": "hello"})).await.json();
            if d["policy_version"] == want.as_str() {
                return started.elapsed();
            }
            assert!(started.elapsed() < Duration::from_secs(4), "still {} (want {want})", d["policy_version"]);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // Deleted and recreated: the old watch is gone with the directory.
    std::fs::remove_dir_all(&dir).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rules.toml"), RULES).unwrap();
    write_atomic(&dir, &routing("block", 0.9));
    version(version_of(&routing("block", 0.9))).await;
    // A later in-place edit of the recreated directory is seen too.
    write_in_place(&dir, &routing("allow", 0.1));
    version(version_of(&routing("allow", 0.1))).await;
    // Blue/green: a new directory renamed over the old path.
    let next = scratch("recreate-next");
    std::fs::write(next.join("rules.toml"), RULES).unwrap();
    std::fs::write(next.join("routing.toml"), routing("review", 0.5)).unwrap();
    let old = scratch("recreate-old");
    std::fs::remove_dir_all(&old).unwrap();
    std::fs::rename(&dir, &old).unwrap();
    std::fs::rename(&next, &dir).unwrap();
    version(version_of(&routing("review", 0.5))).await;
    write_in_place(&dir, &routing("block", 0.9));
    let took = version(version_of(&routing("block", 0.9))).await;
    eprintln!("edit after a directory swap served after {} ms", took.as_millis());
    let status = send(admin, "GET", "/admin/policy", &[], "").await.json();
    assert!(status["last_error"].is_null(), "{status}");
}
