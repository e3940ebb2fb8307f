//! The in-process campaign store: the same bands and windows as the Redis script
//! (`campaign.lua`; counted here in finer buckets, with exact distinct sources), for a replica alone — without `[tenants.redis]`, and as the fallback while
//! Redis is out of reach (every lookup also updates it, so the fallback starts warm with this
//! replica's own traffic).
//!
//! Bounded: at most `max_subjects` campaigns and entities (the least recently seen tenth evicted
//! when full) and, per subject, the last [`MAX_SOURCES`] distinct sources, counted exactly
//! (a distinct count saturates there: a guard threshold above it needs Redis's HyperLogLog).

use super::{Counts, Observation};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// The bucketed sliding windows, `(bucket width s, buckets)`: 1 min, 1 h, 24 h.
pub const WINDOWS: [(u64, usize); 3] = [(10, 6), (300, 12), (3600, 24)];
/// How long a band or a subject is kept after it was last seen, seconds (25 h, as the script's bands).
pub const KEEP_S: u64 = 90_000;
/// Distinct sources remembered per subject.
pub const MAX_SOURCES: usize = 512;

/// The in-process store; cheap to share behind an `Arc`.
pub struct LocalStore {
    inner: Mutex<Inner>,
    max_subjects: usize,
}

#[derive(Default)]
struct Inner {
    /// Band hash -> (campaign id, last seen s).
    bands: HashMap<u64, (String, u64)>,
    subjects: HashMap<String, Subject>,
}

struct Subject {
    first_seen: u64,
    last_seen: u64,
    /// Per window: (bucket index, requests) for its buckets, newest last.
    buckets: [VecDeque<(u64, u64)>; 3],
    /// Source hash -> last seen s.
    sources: HashMap<u64, u64>,
}

impl LocalStore {
    /// A store of at most `max_subjects` campaigns and entities together.
    pub fn new(max_subjects: usize) -> LocalStore {
        LocalStore { inner: Mutex::new(Inner::default()), max_subjects: max_subjects.max(1) }
    }

    /// Finds or registers the campaign of `bands` (the first band already registered decides,
    /// else `candidate`), then counts one request from `source` at `now_s` (Unix seconds) for it
    /// and for each of `entities` (keys as the Redis store writes them).
    pub fn observe(&self, now_s: u64, bands: &[u64], candidate: &str, source: u64, entities: &[String]) -> Observation {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let live = |(_, seen): &&(String, u64)| now_s.saturating_sub(*seen) < KEEP_S;
        let id = bands.iter().find_map(|b| inner.bands.get(b).filter(live).map(|(id, _)| id.clone()));
        let id = id.unwrap_or_else(|| candidate.to_string());
        if inner.bands.len() + bands.len() > self.max_subjects * bands.len().max(1) {
            inner.bands.retain(|_, (_, seen)| now_s.saturating_sub(*seen) < 3600);
        }
        for b in bands {
            let entry = inner.bands.entry(*b).or_insert_with(|| (id.clone(), now_s));
            if entry.0 == id || now_s.saturating_sub(entry.1) >= KEEP_S {
                *entry = (id.clone(), now_s);
            }
        }
        let campaign = inner.track(&format!("campaign:{id}"), now_s, source, self.max_subjects);
        let entities = entities.iter().map(|e| inner.track(&format!("entity:{e}"), now_s, source, self.max_subjects));
        let entities = entities.collect();
        Observation { campaign_id: id, campaign, entities }
    }

    /// Subjects held now (for the metrics).
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).subjects.len()
    }

    /// Whether no subject is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    fn track(&mut self, key: &str, now_s: u64, source: u64, max_subjects: usize) -> Counts {
        if !self.subjects.contains_key(key) && self.subjects.len() >= max_subjects {
            self.evict(max_subjects / 10 + 1);
        }
        let subject = self.subjects.entry(key.to_string()).or_insert_with(|| Subject {
            first_seen: now_s,
            last_seen: now_s,
            buckets: Default::default(),
            sources: HashMap::new(),
        });
        if now_s.saturating_sub(subject.last_seen) >= KEEP_S {
            subject.first_seen = now_s;
        }
        subject.last_seen = subject.last_seen.max(now_s);
        subject.count(now_s, source)
    }

    /// Drops the `n` least recently seen subjects.
    fn evict(&mut self, n: usize) {
        let mut seen: Vec<u64> = self.subjects.values().map(|s| s.last_seen).collect();
        let n = n.min(seen.len());
        if n == 0 {
            return;
        }
        let (_, cut, _) = seen.select_nth_unstable(n - 1);
        let cut = *cut;
        let mut left = n;
        self.subjects.retain(|_, s| {
            let drop = left > 0 && s.last_seen <= cut;
            left -= usize::from(drop);
            !drop
        });
    }
}

impl Subject {
    /// Counts one request from `source` at `now_s` and reads every window.
    fn count(&mut self, now_s: u64, source: u64) -> Counts {
        let mut requests = [0u64; 3];
        for (w, (width, n)) in WINDOWS.iter().enumerate() {
            let bucket = now_s / width;
            let ring = &mut self.buckets[w];
            match ring.back_mut() {
                Some((b, count)) if *b == bucket => *count += 1,
                _ => ring.push_back((bucket, 1)),
            }
            while ring.front().is_some_and(|(b, _)| *b + (*n as u64) <= bucket) {
                ring.pop_front();
            }
            requests[w] = ring.iter().map(|(_, c)| c).sum();
        }
        if self.sources.len() >= MAX_SOURCES && !self.sources.contains_key(&source) {
            // Forget the sources gone longest; a saturated subject keeps its newest sources.
            self.sources.retain(|_, seen| now_s.saturating_sub(*seen) < 86_400);
        }
        if self.sources.len() < MAX_SOURCES || self.sources.contains_key(&source) {
            self.sources.insert(source, now_s);
        }
        let mut sources = [0u64; 3];
        for seen in self.sources.values() {
            for (w, (width, n)) in WINDOWS.iter().enumerate() {
                // The same span as the buckets: from the start of the oldest bucket counted.
                let start = (now_s / width + 1).saturating_sub(*n as u64) * width;
                sources[w] += u64::from(*seen >= start);
            }
        }
        Counts {
            count_1m: requests[0],
            count_1h: requests[1],
            count_24h: requests[2],
            sources_1m: sources[0],
            sources_1h: sources[1],
            sources_24h: sources[2],
            first_seen_s: now_s.saturating_sub(self.first_seen),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_joins_on_any_registered_band_and_counts_distinct_sources() {
        let store = LocalStore::new(100);
        let first = store.observe(1_000, &[1, 2, 3], "c1", 10, &[]);
        assert_eq!(first.campaign_id, "c1");
        // Shares only band 3: joins c1, and registers its new bands 4 and 5 to c1.
        let second = store.observe(1_001, &[9, 8, 3], "c9", 11, &[]);
        assert_eq!(second.campaign_id, "c1");
        let third = store.observe(1_002, &[9, 7, 6], "c6", 10, &[]);
        assert_eq!(third.campaign_id, "c1", "band 9 was registered to c1 by the second");
        assert_eq!((third.campaign.count_1m, third.campaign.sources_1h), (3, 2));
        assert_eq!(third.campaign.first_seen_s, 2);
        let other = store.observe(1_003, &[100, 101], "c100", 10, &[]);
        assert_eq!((other.campaign_id.as_str(), other.campaign.count_1h), ("c100", 1));
    }

    #[test]
    fn windows_slide_and_entities_count_on_their_own() {
        let store = LocalStore::new(100);
        let e = vec!["iban:abc".to_string()];
        store.observe(0, &[1], "c1", 1, &e);
        let later = store.observe(120, &[2], "c2", 2, &e);
        assert_eq!((later.entities[0].count_1m, later.entities[0].count_1h), (1, 2));
        assert_eq!((later.entities[0].sources_1m, later.entities[0].sources_1h), (1, 2));
        let day = store.observe(2 * 3600, &[3], "c3", 3, &e);
        assert_eq!((day.entities[0].count_1h, day.entities[0].count_24h, day.entities[0].sources_24h), (1, 3, 3));
        assert_eq!(day.entities[0].first_seen_s, 7200);
    }

    #[test]
    fn subjects_and_sources_stay_bounded() {
        let store = LocalStore::new(50);
        for i in 0..500u64 {
            store.observe(i, &[i + 1_000_000], &format!("c{i}"), i, &[]);
        }
        assert!(store.len() <= 50, "{}", store.len());
        for s in 0..(2 * MAX_SOURCES as u64) {
            store.observe(600, &[7], "c7", s, &[]);
        }
        let o = store.observe(600, &[7], "c7", 0, &[]);
        assert_eq!(o.campaign.sources_1h, MAX_SOURCES as u64);
    }
}
