//! Helpers for the unit tests of several modules.

use std::future::Future;
use std::time::Duration;

/// Runs `work` to completion on a single-threaded tokio runtime (timers enabled) in its own
/// thread. `Err(())` if it has not finished after 30 s: a runtime thread that blocked on work
/// meant for the blocking pool hangs instead of failing, and this turns the hang into an error.
pub fn on_current_thread_runtime(work: impl Future<Output = ()> + Send + 'static) -> Result<(), ()> {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(work);
        let _ = done_tx.send(());
    });
    done_rx.recv_timeout(Duration::from_secs(30)).map_err(|_| ())
}
