//! A tenant's fair share of the gpu tier: how many of its requests are on the gpu tier now
//! (this replica), and a slot taken only while under its share.
//!
//! The count is a plain atomic per limit key (each known tenant, and one for all unknown
//! tenants), so checking it is a load and taking a slot one compare-and-swap: no lock on the
//! request path, and a tenant at its share never waits — routing sends it down the cascade.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Requests of one limit key on the gpu tier now.
#[derive(Debug, Default)]
pub struct GpuSlots(AtomicUsize);

impl GpuSlots {
    /// Requests holding a slot now.
    pub fn in_flight(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Takes a slot if fewer than `max` are held (checked and taken atomically, so two requests
    /// racing for the last slot cannot both get it); `None` at the share. The slot is given back
    /// when the returned guard drops.
    pub fn try_acquire(self: &Arc<Self>, max: usize) -> Option<GpuSlot> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| GpuSlot(Arc::clone(self)))
    }
}

/// A held gpu slot; dropping it gives the slot back (also when the call is cancelled).
#[derive(Debug)]
pub struct GpuSlot(Arc<GpuSlots>);

impl Drop for GpuSlot {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many gpu-tier requests one tenant may hold: `share` of `max_in_flight` (the policy's
/// `[gpu] max_in_flight`), rounded up, at least 1, so every class can use the tier.
pub fn fair_share_slots(share: f64, max_in_flight: usize) -> usize {
    ((share * max_in_flight as f64).ceil() as usize).clamp(1, max_in_flight.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_taken_up_to_the_share_and_given_back_on_drop() {
        let slots = Arc::new(GpuSlots::default());
        let a = slots.try_acquire(2).unwrap();
        let b = slots.try_acquire(2).unwrap();
        assert!(slots.try_acquire(2).is_none(), "at its share");
        assert_eq!(slots.in_flight(), 2);
        drop(a);
        assert_eq!(slots.in_flight(), 1);
        let _c = slots.try_acquire(2).expect("a slot came back");
        drop(b);
        assert_eq!(slots.in_flight(), 1);
    }

    #[test]
    fn racing_threads_never_exceed_the_share() {
        let slots = Arc::new(GpuSlots::default());
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (slots, peak) = (Arc::clone(&slots), Arc::clone(&peak));
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if let Some(_slot) = slots.try_acquire(3) {
                            peak.fetch_max(slots.in_flight(), Ordering::AcqRel);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(peak.load(Ordering::Acquire) <= 3);
        assert_eq!(slots.in_flight(), 0);
    }

    #[test]
    fn fair_share_rounds_up_and_keeps_one_slot() {
        assert_eq!(fair_share_slots(0.25, 16), 4);
        assert_eq!(fair_share_slots(0.1, 16), 2);
        assert_eq!(fair_share_slots(0.01, 16), 1);
        assert_eq!(fair_share_slots(1.0, 16), 16);
        assert_eq!(fair_share_slots(0.5, 0), 1);
    }
}
