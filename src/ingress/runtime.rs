//! The async runtime the server runs on, its threads at `[server] runtime_nice`.

use crate::web::ServerConfig;

/// A multi-thread tokio runtime (all drivers) whose threads, workers and blocking pool alike,
/// run at `server.runtime_nice` (see [`ServerConfig::runtime_nice`]). The thread that calls
/// `block_on`, and threads started before, keep their priority: start the model workers from
/// there.
///
/// Errors: what tokio's builder reports. A nice value the kernel refuses is logged, not fatal:
/// the server still runs, at the process's priority.
pub fn runtime(server: &ServerConfig) -> std::io::Result<tokio::runtime::Runtime> {
    let nice = server.runtime_nice;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if nice > 0 {
        builder.on_thread_start(move || lower_this_thread(nice));
    }
    builder.build()
}

/// Adds `nice` to the calling thread's nice value (Linux: `setpriority` on the thread id; a
/// thread's nice value is its own). Elsewhere a no-op.
fn lower_this_thread(nice: i32) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread's own id.
        let (tid, errno) = unsafe {
            let tid = libc::gettid() as libc::id_t;
            *libc::__errno_location() = 0;
            let current = libc::getpriority(libc::PRIO_PROCESS, tid);
            let errno = *libc::__errno_location();
            if errno == 0 && libc::setpriority(libc::PRIO_PROCESS, tid, (current + nice).min(19)) == 0 {
                return;
            }
            (tid, std::io::Error::last_os_error())
        };
        tracing::warn!(tid, nice, error = %errno, "could not lower the runtime thread's priority");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn this_thread_nice() -> i32 {
        // SAFETY: as above.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn runtime_threads_run_at_the_configured_nice_value_and_the_caller_keeps_its_own() {
        let before = this_thread_nice();
        let server = ServerConfig { runtime_nice: 7, ..ServerConfig::default() };
        let rt = runtime(&server).unwrap();
        let on_worker = rt.block_on(async { tokio::spawn(async { this_thread_nice() }).await.unwrap() });
        let on_blocking = rt.block_on(rt.spawn_blocking(this_thread_nice)).unwrap();
        assert_eq!(on_worker, (before + 7).min(19));
        assert_eq!(on_blocking, (before + 7).min(19));
        assert_eq!(this_thread_nice(), before, "the thread that built the runtime keeps its priority");
        let plain = runtime(&ServerConfig::default()).unwrap();
        assert_eq!(plain.block_on(async { tokio::spawn(async { this_thread_nice() }).await.unwrap() }), before);
    }
}
