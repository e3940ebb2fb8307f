//! The server's resources, read from /proc: its process tree, resident memory, CPU time (whole
//! and by thread name), and the CPU that the rest of the machine used meanwhile.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A process and its descendants, from /proc.
fn process_tree(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                // The comm field may hold spaces: the fields after the last ')' are fixed.
                if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
                    if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse::<u32>().ok()) {
                        parents.push((pid, ppid));
                    }
                }
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

fn status_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}

/// utime + stime of a process in seconds (clock ticks of 1/100 s, as on every Linux we run).
fn cpu_seconds(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_string();
            let f: Vec<&str> = rest.split_whitespace().collect();
            // After ')': state(0) ppid(1) ... utime(11) stime(12)
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(0.0)
}

/// Busy CPU seconds of the whole machine (all but idle and iowait), from /proc/stat.
fn machine_busy_seconds() -> f64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            let f: Vec<f64> = s.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
            let total: f64 = f.iter().take(8).sum();
            Some((total - f.get(3)? - f.get(4)?) / 100.0)
        })
        .unwrap_or(0.0)
}

fn tree_cpu(tree: &[u32]) -> f64 {
    tree.iter().map(|p| cpu_seconds(&p.to_string())).sum()
}

/// CPU seconds of the tree's threads, summed by thread name (`/proc/P/task/T/comm`).
fn thread_cpu(tree: &[u32]) -> BTreeMap<String, f64> {
    let mut by_name = BTreeMap::new();
    for pid in tree {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for task in tasks.flatten() {
            let tid = task.file_name().to_string_lossy().into_owned();
            let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) else { continue };
            *by_name.entry(name.trim().to_string()).or_insert(0.0) += cpu_seconds(&format!("{pid}/task/{tid}"));
        }
    }
    by_name
}

/// The server sampled over one run: CPU times at the start, resident memory every 200 ms.
pub(crate) struct ServerProbe {
    tree: Vec<u32>,
    server_cpu0: f64,
    threads0: BTreeMap<String, f64>,
    client_cpu0: f64,
    machine0: f64,
    wall0: std::time::Instant,
    stop: Arc<AtomicBool>,
    sampler: tokio::task::JoinHandle<u64>,
}

/// What the server (and this generator, and the machine) used over one run.
pub(crate) struct Usage {
    /// The server's processes; empty without `--pid`.
    pub(crate) tree: Vec<u32>,
    pub(crate) rss_peak_kb: u64,
    pub(crate) hwm_kb: u64,
    pub(crate) wall: f64,
    pub(crate) server_cpu: f64,
    /// CPU seconds by thread name at the start and at the end.
    pub(crate) threads0: BTreeMap<String, f64>,
    pub(crate) threads: BTreeMap<String, f64>,
    pub(crate) client_cpu: f64,
    pub(crate) machine: f64,
}

impl ServerProbe {
    /// Server sampling: RSS every 200 ms, CPU time at the start and end.
    pub(crate) fn start(pid: Option<u32>) -> ServerProbe {
        let tree = pid.map(process_tree).unwrap_or_default();
        let server_cpu0 = tree_cpu(&tree);
        let threads0 = thread_cpu(&tree);
        let client_cpu0 = cpu_seconds("self");
        let machine0 = machine_busy_seconds();
        let wall0 = std::time::Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (tree, stop) = (tree.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut peak = 0u64;
                while !stop.load(Ordering::Relaxed) && !tree.is_empty() {
                    peak = peak.max(tree.iter().map(|p| status_kb(*p, "VmRSS:")).sum());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                peak
            })
        };
        ServerProbe { tree, server_cpu0, threads0, client_cpu0, machine0, wall0, stop, sampler }
    }

    /// Stops the sampling and reads the end figures (call when every request is done).
    pub(crate) async fn finish(self) -> Usage {
        self.stop.store(true, Ordering::Relaxed);
        let rss_peak_kb = self.sampler.await.unwrap_or(0);
        let hwm_kb: u64 = self.tree.iter().map(|p| status_kb(*p, "VmHWM:")).sum();
        let wall = self.wall0.elapsed().as_secs_f64();
        let server_cpu = tree_cpu(&self.tree) - self.server_cpu0;
        let threads = thread_cpu(&self.tree);
        let client_cpu = cpu_seconds("self") - self.client_cpu0;
        let machine = machine_busy_seconds() - self.machine0;
        Usage {
            tree: self.tree,
            rss_peak_kb,
            hwm_kb,
            wall,
            server_cpu,
            threads0: self.threads0,
            threads,
            client_cpu,
            machine,
        }
    }
}
