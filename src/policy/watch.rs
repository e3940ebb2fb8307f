//! Reload triggers that watch the policy directory: file changes through `notify`, debounced,
//! backed by a periodic fingerprint check.
//!
//! The directory is watched, not the files, so both an atomic rename (write a temporary file,
//! rename it over the old one) and an in-place write (truncate, then write) are seen. Events
//! are debounced: a reload runs once the directory has been quiet for `debounce`, so a
//! half-written file is usually never loaded; when it is, validation refuses it and the
//! completed write triggers the next reload. A directory deleted and recreated, or swapped for
//! another one (blue/green), takes a `notify` watch with it; so every `poll` the directory's
//! fingerprint (its identity, and each policy file's name, size and mtime) is compared with the
//! last one, the watch is re-armed on the new directory, and a change triggers a reload.

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;

/// The watch; it stops when this is dropped.
pub struct Watch {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches `dir` and calls `reload` (on a blocking thread) after each burst of changes.
/// Needs a tokio runtime.
pub fn watch(
    dir: &Path,
    debounce: Duration,
    poll: Duration,
    reload: impl Fn() + Send + Sync + 'static,
) -> notify::Result<Watch> {
    watch_with(dir, debounce, poll, reload, fingerprint)
}

/// [`watch`] with the fingerprint function as a parameter, so tests can see where it runs.
fn watch_with(
    dir: &Path,
    debounce: Duration,
    poll: Duration,
    reload: impl Fn() + Send + Sync + 'static,
    fingerprint: fn(&Path) -> Fingerprint,
) -> notify::Result<Watch> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let dir = dir.to_path_buf();
    let mut watcher = Some(arm(&dir, tx.clone())?);
    let reload = std::sync::Arc::new(reload);
    let task = tokio::spawn(async move {
        let mut last = fingerprint_off_runtime(&dir, fingerprint).await;
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = rx.recv() => {
                    if event.is_none() {
                        return;
                    }
                    // Debounce: wait until no event has arrived for `debounce`.
                    while let Ok(Some(())) = tokio::time::timeout(debounce, rx.recv()).await {}
                }
                _ = tick.tick() => {
                    let now = fingerprint_off_runtime(&dir, fingerprint).await;
                    if now == last {
                        continue;
                    }
                    if now.as_ref().map(|f| f.identity) != last.as_ref().map(|f| f.identity) {
                        // The directory was replaced: watch the new one.
                        watcher = arm(&dir, tx.clone()).map_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the policy directory; polling only")).ok();
                    }
                }
            }
            last = fingerprint_off_runtime(&dir, fingerprint).await;
            let reload = std::sync::Arc::clone(&reload);
            let _ = tokio::task::spawn_blocking(move || reload()).await;
            let _ = &watcher; // kept alive by the task
        }
    });
    Ok(Watch { task })
}

fn arm(dir: &Path, tx: mpsc::UnboundedSender<()>) -> notify::Result<RecommendedWatcher> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

/// What changes when the policy on disk changes.
#[derive(Debug, PartialEq)]
struct Fingerprint {
    /// (device, inode) of the directory: a recreated or swapped directory has a new one.
    identity: Option<(u64, u64)>,
    /// Path, inode, size and mtime of each policy file (of its target, for a symlink).
    files: Vec<(PathBuf, u64, u64, Option<std::time::SystemTime>)>,
}

/// [`fingerprint`] on tokio's blocking pool: it stats every policy file, and a slow or hung
/// filesystem must not stall a runtime thread that serves requests. `None` if the task failed.
async fn fingerprint_off_runtime(dir: &Path, fingerprint: fn(&Path) -> Fingerprint) -> Option<Fingerprint> {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || fingerprint(&dir)).await.ok()
}

fn fingerprint(dir: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    let identity = std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()));
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
                // `fs::metadata` follows symlinks: a Kubernetes ConfigMap mount swaps the target
                // behind `rules.toml -> ..data/rules.toml` and never touches the link itself.
                .filter_map(|e| {
                    std::fs::metadata(e.path()).ok().map(|m| (e.path(), m.ino(), m.len(), m.modified().ok()))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    Fingerprint { identity, files }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swapped_symlink_target_changes_the_fingerprint() {
        // The layout kubelet gives a ConfigMap volume: files are links into `..data`, itself a
        // link to a timestamped directory that an update replaces.
        let dir = std::env::temp_dir().join(format!("tiergate-fingerprint-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (version, content) in [("v1", "a = 1\n"), ("v2", "a = 22\n")] {
            std::fs::create_dir_all(dir.join(version)).unwrap();
            std::fs::write(dir.join(version).join("rules.toml"), content).unwrap();
        }
        std::os::unix::fs::symlink("v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/rules.toml", dir.join("rules.toml")).unwrap();
        let before = fingerprint(&dir);
        std::os::unix::fs::symlink("v2", dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        assert_ne!(fingerprint(&dir), before);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The fingerprint of [`watch_once_blocked`]'s runs waits for this signal the first time.
    static GATE: std::sync::Mutex<Option<std::sync::mpsc::Receiver<()>>> = std::sync::Mutex::new(None);

    fn fingerprint_after_gate(dir: &Path) -> Fingerprint {
        if let Some(gate) = GATE.lock().unwrap().take() {
            gate.recv().unwrap();
        }
        fingerprint(dir)
    }

    #[test]
    fn the_fingerprint_poll_runs_off_the_runtime_thread() {
        // Its first run blocks until a task on the same single-threaded runtime has run: run on
        // the runtime thread, it would wait forever and the reload below would never come.
        let dir = std::env::temp_dir().join(format!("tiergate-watch-offload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (gate_tx, gate_rx) = std::sync::mpsc::channel();
        *GATE.lock().unwrap() = Some(gate_rx);
        let watched = dir.clone();
        let outcome = crate::test_support::on_current_thread_runtime(async move {
            let (reloaded_tx, mut reloaded) = mpsc::unbounded_channel();
            let ms = Duration::from_millis(10);
            let _watch = watch_with(
                &watched,
                ms,
                ms,
                move || {
                    let _ = reloaded_tx.send(());
                },
                fingerprint_after_gate,
            )
            .unwrap();
            tokio::spawn(async move { gate_tx.send(()).unwrap() });
            tokio::time::sleep(Duration::from_millis(50)).await;
            std::fs::write(watched.join("rules.toml"), "a = 1\n").unwrap();
            reloaded.recv().await.unwrap();
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(outcome.is_ok(), "the fingerprint poll blocked the runtime thread");
    }
}
