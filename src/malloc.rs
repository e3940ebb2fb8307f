//! glibc malloc tuning for a long-running server.
//!
//! glibc gives threads their own heap arenas, up to 8 per core; tiergate's threads (tokio
//! workers, the blocking pool, whose threads come and go, ONNX Runtime's workers) end up
//! spreading freed memory over many arenas that are rarely returned to the kernel, so resident
//! memory creeps up for tens of minutes after start. Measured with `benches/soak.sh` (30 min at
//! 100 requests/s with faults every minute, docs/BENCHMARKS.md "Soak"): +9.9 % RSS from minute 1
//! to minute 30 with glibc's default, flat from minute 5 (and ~20 MiB lower) with
//! `MALLOC_ARENA_MAX=2`. One arena per core bounds the spread while threads on different cores
//! still rarely contend for one.

/// Caps glibc's malloc arenas at the number of available cores, unless `MALLOC_ARENA_MAX` is set
/// (then glibc already applied the operator's choice). Call first in `main`, before threads
/// start: arenas that exist already are kept. No-op on other C libraries.
pub fn bound_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
        // SAFETY: mallopt only changes allocator parameters; called before other threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cores as libc::c_int);
        }
    }
}
