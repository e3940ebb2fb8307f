//! [`RateMirror`]: the local fallback of the shared rate check, as one cell per key that mirrors
//! the shared GCRA cell instead of keeping an independent one.
//!
//! Why a mirror and not a separate local limiter: with two independent cells (the shared one in
//! Redis, a local one for outages) each refills while the other is in use, so a Redis that is
//! slow in alternating phases lets every phase start with a fresh burst in the cell it lands in,
//! and sustained traffic gets each cell's rate in its own phases — 1.5× the limit was measured
//! (issue 25, item 5). A mirror keeps one budget:
//!
//! - every answer from Redis carries the shared cell's theoretical arrival time (TAT), and the
//!   mirror takes it (it never moves back), so the fallback starts from the debt the fleet had
//!   built, not from a full burst;
//! - while Redis is out of reach the mirror decides locally, GCRA on that TAT, each admission
//!   charged at `replicas` emission intervals: this replica takes its share of the fleet's rate
//!   (the other replicas, equally blind, take theirs) and about its share of the remaining burst;
//! - admissions made locally are carried back on the next check that reaches Redis as a floor
//!   under the shared TAT (`gcra.lua`, ARGV[3]), so the shared cell does not refill for time the
//!   replica spent admitting on its own.
//!
//! Relative offsets, not timestamps, cross the wire (the script adds the floor to its own
//! `TIME`, the mirror adds the returned TAT offset to its own clock at the reply), so replicas'
//! clocks need not agree with Redis's; the transit time only makes the mirror's TAT later, the
//! side that refuses. The floor is this replica's charged TAT: with `replicas` > 1 it charges
//! `replicas` intervals per local admission, which overstates the fleet's use when the other
//! replicas were idle — by at most one burst, drained at the class's rate. That errs towards
//! refusing, which is the side an outage should err on.
//!
//! Keys are bounded by config (one per known tenant plus the unknown tenants' one), like
//! `LocalQuotas`, so the map needs no sweeping.

use super::emission_interval_us;
use crate::tenant::quota::Quota;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// One key's mirrored cell.
#[derive(Debug, Clone, Copy)]
struct Cell {
    /// The TAT as this replica knows it: the last one Redis returned, moved on by local
    /// admissions since.
    tat: Instant,
    /// Local admissions not yet carried to Redis.
    unsynced: u32,
}

/// What a shared check carries to Redis: the local TAT as a floor, and how many local
/// admissions that floor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Floor {
    /// Microseconds after the check's send time that the shared TAT must be at least; 0: no
    /// floor (nothing was admitted locally since the last answer, or its debt is paid).
    pub offset_us: u64,
    /// Local admissions this floor carries; acknowledged by [`RateMirror::answered`].
    pub carried: u32,
}

/// The mirrored cells of every key (see the module doc).
#[derive(Debug, Default)]
pub struct RateMirror {
    cells: Mutex<HashMap<String, Cell>>,
}

impl RateMirror {
    pub fn new() -> RateMirror {
        RateMirror::default()
    }

    /// The floor a check of `key` sent at `now` must carry.
    pub fn floor(&self, key: &str, now: Instant) -> Floor {
        let cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        match cells.get(key) {
            Some(cell) if cell.unsynced > 0 => {
                Floor { offset_us: cell.tat.saturating_duration_since(now).as_micros() as u64, carried: cell.unsynced }
            }
            _ => Floor::default(),
        }
    }

    /// Redis answered a check of `key` at `now` (the reply's arrival): the shared TAT is
    /// `tat_offset_us` after Redis's clock, and the check carried `carried` local admissions.
    pub fn answered(&self, key: &str, now: Instant, tat_offset_us: u64, carried: u32) {
        let shared = now + Duration::from_micros(tat_offset_us);
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        match cells.get_mut(key) {
            Some(cell) => {
                // Never back: local admissions made while this check was in flight are in the
                // mirror's TAT and not yet in the reply.
                cell.tat = cell.tat.max(shared);
                cell.unsynced = cell.unsynced.saturating_sub(carried);
            }
            None => {
                cells.insert(key.to_string(), Cell { tat: shared, unsynced: 0 });
            }
        }
    }

    /// Decides a check of `key` at `now` without Redis: GCRA on the mirrored TAT with the
    /// fleet's tolerance (`burst - 1` intervals), an admission charged at `replicas` intervals.
    /// `Err` holds the wait until one would conform.
    pub fn check_local(&self, key: &str, quota: Quota, replicas: u32, now: Instant) -> Result<(), Duration> {
        let interval = emission_interval_us(quota.per_second);
        let tolerance = Duration::from_micros(interval * u64::from(quota.burst.max(1) - 1));
        let charge = Duration::from_micros(interval * u64::from(replicas.max(1)));
        let mut cells = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        let cell = cells.entry(key.to_string()).or_insert(Cell { tat: now, unsynced: 0 });
        let tat = cell.tat.max(now);
        let allowed_at = tat.checked_sub(tolerance).unwrap_or(now);
        if allowed_at > now {
            return Err(allowed_at - now);
        }
        cell.tat = tat + charge;
        cell.unsynced = cell.unsynced.saturating_add(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUOTA: Quota = Quota { per_second: 20, burst: 20 };
    const T: Duration = Duration::from_millis(50);

    fn admitted(m: &RateMirror, key: &str, replicas: u32, now: Instant) -> usize {
        std::iter::from_fn(|| m.check_local(key, QUOTA, replicas, now).ok()).take(1000).count()
    }

    #[test]
    fn without_an_answer_the_local_cell_is_a_full_burst_at_the_replicas_share() {
        let m = RateMirror::new();
        let now = Instant::now();
        assert_eq!(admitted(&m, "a", 1, now), 20);
        let wait = m.check_local("a", QUOTA, 1, now).unwrap_err();
        assert_eq!(wait, T, "one interval to the next conforming request");
        // Four replicas: about a quarter of the burst each (1 + 19 intervals / 4 intervals).
        assert_eq!(admitted(&m, "b", 4, now), 5);
        assert_eq!(m.check_local("b", QUOTA, 4, now + 4 * T).map_err(|_| ()), Ok(()), "then one per 4 intervals");
    }

    #[test]
    fn the_fallback_starts_from_the_shared_debt_not_from_a_fresh_burst() {
        let m = RateMirror::new();
        let now = Instant::now();
        // Redis said the cell is full: its TAT is a whole tolerance (19 intervals) ahead.
        m.answered("a", now, (19 * T).as_micros() as u64, 0);
        assert_eq!(admitted(&m, "a", 1, now), 1, "one conforms at the tolerance's edge, no burst");
        assert_eq!(m.floor("a", now), Floor { offset_us: (20 * T).as_micros() as u64, carried: 1 });
        // A second later 20 intervals have drained: 20 more, not 20 plus a refilled burst.
        assert_eq!(admitted(&m, "a", 1, now + Duration::from_secs(1)), 20);
    }

    #[test]
    fn local_admissions_are_carried_until_an_answer_acknowledges_them() {
        let m = RateMirror::new();
        let now = Instant::now();
        assert_eq!(m.floor("a", now), Floor::default(), "nothing to carry before any local admission");
        for _ in 0..3 {
            m.check_local("a", QUOTA, 1, now).unwrap();
        }
        let floor = m.floor("a", now);
        assert_eq!(floor, Floor { offset_us: (3 * T).as_micros() as u64, carried: 3 });
        // An answer that did not carry them (sent before) keeps them; one that did clears them.
        m.answered("a", now, 0, 0);
        assert_eq!(m.floor("a", now).carried, 3);
        m.check_local("a", QUOTA, 1, now).unwrap();
        m.answered("a", now, (4 * T).as_micros() as u64, floor.carried);
        assert_eq!(m.floor("a", now).carried, 1, "the admission made in flight is still to carry");
        // An answer never moves the mirror back.
        m.answered("a", now, 0, 1);
        assert_eq!(admitted(&m, "a", 1, now), 16, "4 of the burst of 20 are spent");
    }
}
