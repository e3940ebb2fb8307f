//! Overflow pacing: the rules' answers for requests the saturated model tiers had no room for
//! (`Decision::overloaded`, "overflow") are released at most `[admission]
//! overflow_per_model_answer` times the model's own answer rate, by GCRA (the generic cell rate
//! algorithm, ITU-T I.371) with a burst tolerance of `overflow_burst_ms`.
//!
//! Why: an overflow answer costs the async runtime about as much CPU as a model answer's
//! non-model part, and it comes back at once. A closed-loop client (a retry storm: every
//! connection sends again as soon as it is answered) then turns the cheap path into thousands
//! of answers per second whose CPU comes out of the model workers' share (docs/BENCHMARKS.md
//! "A retry storm": the model kept 0.47x of its light-load rate at 256 connections). Pacing the
//! overflow to a multiple of what the model answers holds such clients to that multiple, so the
//! model keeps its share; an open-loop overload whose excess stays under the multiple is never
//! delayed (its answers conform to the GCRA). A paced answer is never refused: it waits for its
//! slot, but at most half the time left to its deadline (a saturated runtime wakes a sleeper
//! late; the other half absorbs it), and a request with under [`MIN_REMAINING`] left not at all.
//!
//! The model's rate is its capacity as last seen busy: the peak, decaying with time constant
//! [`PEAK_DECAY`], of an EWMA (weight [`EWMA_WEIGHT`] per [`RATE_WINDOW`]) of the model steps the
//! decisions report (a cpu or gpu step with a score, not reused from the verdict cache). A peak,
//! because routing by load readings sends whole stretches of requests past the cpu tier while
//! its utilisation reading is high (docs/policies.md `max_utilization`), and the model idles
//! through the end of such a stretch: its answer rate then is not what it can do. Windows are
//! closed by the decisions when due; one that spans a quiet spell is dropped (idle time says
//! nothing of capacity). Until the first window closes nothing is paced; `overflow_min_rps` is
//! the floor after.

#[cfg(doc)]
use crate::decision::Decision;
use crate::decision::{Step, TierName};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How often the model's answer rate is re-estimated.
pub const RATE_WINDOW: Duration = Duration::from_millis(100);
/// The EWMA weight of the newest window's rate (a time constant of ~0.3 s at 100 ms windows).
pub const EWMA_WEIGHT: f64 = 0.3;
/// The time constant with which the peak rate decays toward the EWMA.
pub const PEAK_DECAY: Duration = Duration::from_secs(10);
/// Time left before the deadline that a paced answer keeps for the rules and the response.
const DEADLINE_MARGIN: Duration = Duration::from_millis(2);
/// A request with less time left than this is not paced: a saturated runtime wakes a sleeping
/// task several ms late, so a short wait would make the answer late rather than paced.
const MIN_REMAINING: Duration = Duration::from_millis(20);
/// How far past the burst tolerance the GCRA's clock may run ahead of now.
const MAX_BACKLOG: Duration = Duration::from_secs(1);

/// The `[admission]` keys of overflow pacing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverflowConfig {
    /// Overflow answers released per model answer (0: pacing off).
    pub per_model_answer: f64,
    /// GCRA burst tolerance, in ms of the paced rate.
    pub burst_ms: u64,
    /// The paced rate's floor, answers per second.
    pub min_rps: f64,
}

/// GCRA's step for one arrival at `now`: `tat` is the theoretical arrival time so far,
/// `interval` the emission interval (1 / rate), `tolerance` the burst tolerance. Returns how
/// long the arrival waits (zero: it conforms) and the new `tat`.
pub fn gcra(tat: Instant, now: Instant, interval: Duration, tolerance: Duration) -> (Duration, Instant) {
    let tat = tat.max(now);
    let wait = tat.saturating_duration_since(now).saturating_sub(tolerance);
    (wait, tat + interval)
}

/// The model's answer rate, answers/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Capacity {
    /// EWMA of the windows' rates.
    pub ewma: f64,
    /// Its peak, decaying with [`PEAK_DECAY`]: what pacing uses.
    pub peak: f64,
}

/// The estimate after one more window of `count` answers in `elapsed` (the first window sets
/// both).
pub fn capacity(prev: Option<Capacity>, count: u64, elapsed: Duration) -> Capacity {
    let now = count as f64 / elapsed.as_secs_f64().max(1e-9);
    let Some(p) = prev else { return Capacity { ewma: now, peak: now } };
    let ewma = p.ewma + EWMA_WEIGHT * (now - p.ewma);
    let decay = (-elapsed.as_secs_f64() / PEAK_DECAY.as_secs_f64()).exp();
    Capacity { ewma, peak: ewma.max(ewma + (p.peak - ewma) * decay) }
}

struct State {
    tat: Instant,
    window_start: Instant,
    window_count: u64,
    rate: Option<Capacity>,
}

/// Paces overflow answers (see the module docs); one per gateway.
pub struct OverflowPacer {
    config: OverflowConfig,
    model_answers: AtomicU64,
    state: Mutex<State>,
    paced: Counter,
    waited: Histogram,
}

impl OverflowPacer {
    pub fn new(config: OverflowConfig, registry: &mut Registry) -> OverflowPacer {
        let paced = Counter::default();
        let waited = Histogram::new(exponential_buckets(1e-3, 2.0, 12));
        registry.register(
            "overflow_paced",
            "Overflow answers (rules in place of the saturated model tiers) that waited for their GCRA slot",
            paced.clone(),
        );
        registry.register(
            "overflow_wait_seconds",
            "How long each paced overflow answer waited, measured (planned: at most half the time left to its deadline)",
            waited.clone(),
        );
        let now = Instant::now();
        OverflowPacer {
            config,
            model_answers: AtomicU64::new(0),
            state: Mutex::new(State { tat: now, window_start: now, window_count: 0, rate: None }),
            paced,
            waited,
        }
    }

    /// Counts a decision's model steps (its `path`) and, when the rules answered for want of
    /// model capacity (`overloaded`, [`Decision::overloaded`]), waits for its slot: at most half
    /// the time left to `deadline`, and not at all with less than [`MIN_REMAINING`] left. Returns
    /// the time actually waited (what `tiergate_overflow_wait_seconds` records).
    pub async fn pace(&self, path: &[Step], overloaded: bool, deadline: Instant) -> Duration {
        let ran = path
            .iter()
            .filter(|s| matches!(s.tier, TierName::Cpu | TierName::Gpu) && s.risk_score.is_some() && !s.cached)
            .count() as u64;
        if ran > 0 {
            self.model_answers.fetch_add(ran, Ordering::Relaxed);
        }
        if self.config.per_model_answer <= 0.0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let remaining = deadline.saturating_duration_since(now);
        // At most half the time left (less the margin): the other half absorbs the late wake-up
        // of a busy runtime, so a paced answer is not a late one.
        let cap =
            if remaining < MIN_REMAINING { Duration::ZERO } else { (remaining / 2).saturating_sub(DEADLINE_MARGIN) };
        let planned = self.wait(overloaded, now).min(cap);
        if planned.is_zero() {
            return Duration::ZERO;
        }
        tokio::time::sleep(planned).await;
        let waited = now.elapsed();
        self.paced.inc();
        self.waited.observe(waited.as_secs_f64());
        waited
    }

    /// Closes the rate window when due; for an overflow answer (`overloaded`), its GCRA wait.
    fn wait(&self, overloaded: bool, now: Instant) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.measure(&mut state, now);
        if overloaded {
            self.slot(&mut state, now)
        } else {
            Duration::ZERO
        }
    }

    /// Closes the rate window when it is due. Every decision comes here, so under load a window
    /// spans ~[`RATE_WINDOW`]; one much longer spans a quiet spell, which says nothing of the
    /// model's capacity: it restarts the window and keeps the rate.
    fn measure(&self, s: &mut State, now: Instant) {
        let elapsed = now.saturating_duration_since(s.window_start);
        if elapsed < RATE_WINDOW {
            return;
        }
        let total = self.model_answers.load(Ordering::Relaxed);
        if elapsed <= 2 * RATE_WINDOW {
            s.rate = Some(capacity(s.rate, total - s.window_count, elapsed));
        }
        (s.window_start, s.window_count) = (now, total);
    }

    /// The wait of an overflow answer arriving at `now`, and the GCRA state advanced past it.
    fn slot(&self, s: &mut State, now: Instant) -> Duration {
        // No estimate yet (the first window of load): nothing to pace against. Pacing at the
        // floor then would push the GCRA's clock seconds ahead before the first estimate lands.
        let Some(model) = s.rate else { return Duration::ZERO };
        let rate = (self.config.per_model_answer * model.peak).max(self.config.min_rps);
        let interval = Duration::from_secs_f64(1.0 / rate);
        let tolerance = Duration::from_millis(self.config.burst_ms);
        let (wait, tat) = gcra(s.tat, now, interval, tolerance);
        // The backlog remembered is bounded: answers released at their deadline must not bind
        // the pacer to a future that a changed model rate no longer justifies.
        s.tat = tat.min(now + tolerance + MAX_BACKLOG);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcra_lets_a_burst_through_then_spaces_arrivals_by_the_interval() {
        let (t0, i, tol) = (Instant::now(), Duration::from_millis(10), Duration::from_millis(30));
        let mut tat = t0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            let (w, next) = gcra(tat, t0, i, tol);
            waits.push(w.as_millis());
            tat = next;
        }
        // Four conform (tat - now <= 30 ms), then each waits one interval more.
        assert_eq!(waits, [0, 0, 0, 0, 10, 20]);
        // An arrival after the backlog drained conforms again.
        let (w, _) = gcra(tat, t0 + Duration::from_millis(100), i, tol);
        assert_eq!(w, Duration::ZERO);
    }

    #[test]
    fn arrivals_at_the_rate_never_wait() {
        let (t0, i) = (Instant::now(), Duration::from_millis(5));
        let mut tat = t0;
        for k in 0..1000 {
            let (w, next) = gcra(tat, t0 + i * k, i, Duration::ZERO);
            assert_eq!(w, Duration::ZERO, "arrival {k}");
            tat = next;
        }
    }

    fn pacer(per_model_answer: f64) -> OverflowPacer {
        let config = OverflowConfig { per_model_answer, burst_ms: 0, min_rps: 10.0 };
        OverflowPacer::new(config, &mut Registry::default())
    }

    /// Gives `p` its first rate estimate: `n` model answers in one window.
    async fn first_window(p: &OverflowPacer, n: usize) {
        for _ in 0..n {
            p.pace(&[model_step()], false, Instant::now()).await;
        }
        tokio::time::advance(RATE_WINDOW).await;
    }

    fn model_step() -> Step {
        let mut s = Step::new(TierName::Cpu, crate::decision::Outcome::Accepted, 0);
        s.risk_score = Some(0.1);
        s
    }

    #[tokio::test(start_paused = true)]
    async fn overflow_waits_for_its_slot_but_never_past_its_deadline() {
        let p = pacer(0.5);
        // Before the first estimate, nothing is paced.
        let soon = Instant::now() + Duration::from_millis(250);
        let waits = futures_util::future::join_all((0..5).map(|_| p.pace(&[], true, soon))).await;
        assert!(waits.iter().all(Duration::is_zero), "{waits:?}");
        // One model answer in the first window: 10/s, paced at max(0.5 x 10, the floor 10/s).
        first_window(&p, 1).await;
        let deadline = Instant::now() + Duration::from_millis(500);
        // Five at once: one conforms, the rest are spaced 100 ms apart until half the time left
        // (less the margin: 248 ms) caps the wait.
        let waits = futures_util::future::join_all((0..5).map(|_| p.pace(&[], true, deadline))).await;
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 100, 200, 248, 248]);
        assert_eq!(p.paced.get(), 4);
        // With under MIN_REMAINING left, no wait at all.
        let close = Instant::now() + Duration::from_millis(15);
        assert_eq!(p.pace(&[], true, close).await, Duration::ZERO);
        // Answers the model gave, or rules that answered for another reason, never wait.
        assert_eq!(p.pace(&[model_step()], false, deadline).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_paced_rate_follows_the_model_and_zero_turns_pacing_off() {
        let p = pacer(2.0);
        // 50 model answers per 100 ms window: 500/s, so overflow at 2 x 500 = 1,000/s (1 ms
        // apart). A quiet second in between changes nothing.
        for round in 0..3 {
            for _ in 0..50 {
                p.pace(&[model_step()], false, Instant::now()).await;
            }
            let gap = if round == 1 { Duration::from_secs(1) } else { RATE_WINDOW };
            tokio::time::advance(gap).await;
        }
        let far = Instant::now() + Duration::from_secs(5);
        let waits = futures_util::future::join_all((0..3).map(|_| p.pace(&[], true, far))).await;
        let ms: Vec<f64> = waits.iter().map(|w| w.as_secs_f64() * 1e3).collect();
        assert!(ms[0] == 0.0 && (ms[1] - 1.0).abs() < 0.05 && (ms[2] - 2.0).abs() < 0.1, "{ms:?}");
        let off = pacer(0.0);
        for _ in 0..20 {
            assert_eq!(off.pace(&[], true, far).await, Duration::ZERO);
        }
    }

    #[test]
    fn the_capacity_keeps_its_peak_through_an_idle_stretch_and_follows_a_lasting_change() {
        let w = Duration::from_millis(100);
        let busy = capacity(None, 40, w);
        assert_eq!(busy, Capacity { ewma: 400.0, peak: 400.0 });
        // A second with the model idle (routing sent the requests past it): the EWMA falls,
        // the peak stays within ~10 % of what the model did.
        let idle = (0..10).fold(busy, |c, _| capacity(Some(c), 0, w));
        assert!(idle.ewma < 20.0 && idle.peak > 355.0, "{idle:?}");
        // A minute at 200/s: the model is slower now, and the peak says so.
        let slower = (0..600).fold(idle, |c, _| capacity(Some(c), 20, w));
        assert!((slower.peak - 200.0).abs() < 1.0, "{slower:?}");
    }
}
