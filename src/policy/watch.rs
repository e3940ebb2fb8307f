//! Reload triggers that watch the policy directory: file changes through `notify`, debounced.
//!
//! The directory is watched, not the files, so both an atomic rename (write a temporary file,
//! rename it over the old one) and an in-place write (truncate, then write) are seen. Events
//! are debounced: a reload runs once the directory has been quiet for `debounce`, so a
//! half-written file is usually never loaded; when it is, validation refuses it and the
//! completed write triggers the next reload.

use notify::{RecursiveMode, Watcher};
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;

/// Watches `dir` and calls `reload` (on a blocking thread) after each burst of changes.
/// Needs a tokio runtime. The watch stops when the returned watcher is dropped.
pub fn watch(
    dir: &Path,
    debounce: Duration,
    reload: impl Fn() + Send + Sync + 'static,
) -> notify::Result<notify::RecommendedWatcher> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    let reload = std::sync::Arc::new(reload);
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Debounce: wait until no event has arrived for `debounce`.
            loop {
                match tokio::time::timeout(debounce, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            let reload = std::sync::Arc::clone(&reload);
            let _ = tokio::task::spawn_blocking(move || reload()).await;
        }
    });
    Ok(watcher)
}
