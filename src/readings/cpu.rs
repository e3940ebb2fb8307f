//! Machine CPU utilisation from `/proc/stat` (Linux; `proc(5)`).
//!
//! Utilisation over an interval is `1 - Δ(idle + iowait) / Δ(all jiffies)` of the aggregate
//! `cpu` line. Reading the file costs ~20 µs (DESIGN.md), so it is sampled in the background.

/// Where utilisation samples come from: the real `/proc/stat`, or a test double.
pub trait CpuSource: Send + Sync + 'static {
    /// Utilisation in [0, 1] since the previous call; `None` when unknown (first call, no procfs).
    fn sample(&self) -> Option<f64>;
}

/// Reads `/proc/stat`.
#[derive(Default)]
pub struct ProcStat {
    last: std::sync::Mutex<Option<(u64, u64)>>,
}

impl CpuSource for ProcStat {
    fn sample(&self) -> Option<f64> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let (busy, total) = parse_cpu_line(text.lines().next()?)?;
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let previous = last.replace((busy, total));
        let (b0, t0) = previous?;
        let dt = total.checked_sub(t0).filter(|&d| d > 0)?;
        Some((busy.saturating_sub(b0) as f64 / dt as f64).clamp(0.0, 1.0))
    }
}

/// `(busy, total)` jiffies from the aggregate `cpu ...` line.
fn parse_cpu_line(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
    if values.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest is already counted in user).
    let total: u64 = values.iter().take(8).sum();
    let idle = values[3] + values.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_aggregate_line() {
        assert_eq!(parse_cpu_line("cpu  100 0 50 800 50 0 0 0 0 0"), Some((150, 1000)));
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4"), None);
        assert_eq!(parse_cpu_line("cpu 1 2"), None);
    }

    #[test]
    fn real_proc_stat_gives_a_utilisation_on_the_second_sample() {
        let s = ProcStat::default();
        assert_eq!(s.sample(), None);
        std::thread::sleep(std::time::Duration::from_millis(30));
        let u = s.sample().expect("procfs is present on Linux");
        assert!((0.0..=1.0).contains(&u));
    }
}
