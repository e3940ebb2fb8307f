//! The live window: the newest decisions' signals in a ring buffer, pushed on the request path
//! (a mutex held for one `VecDeque` push) and read by the drift task.

use super::compare::Observation;
use crate::text::LanguageCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// One decision's signals as the request path leaves them.
#[derive(Debug, Clone)]
pub struct Entry {
    pub at: Instant,
    pub risk_score: f64,
    pub ood_score: Option<f64>,
    pub text_chars: u64,
    /// Read by the drift task: the cpu worker has usually detected the language already; for a
    /// decision that skipped the cpu tier the task detects it, off the request path. The cell
    /// holds the canonical text until then, so the window's memory is bounded by
    /// `window × server.max_text_bytes`.
    pub lang: LanguageCell,
}

impl Entry {
    /// The entry as the comparison reads it (detects the language if no one did).
    pub fn observation(&self) -> Observation {
        Observation {
            risk_score: self.risk_score,
            ood_score: self.ood_score,
            text_chars: self.text_chars,
            lang: Some(self.lang.get().code.to_string()),
        }
    }
}

/// The newest `capacity` entries, oldest first.
#[derive(Debug)]
pub struct Window {
    entries: VecDeque<Entry>,
    capacity: usize,
}

impl Window {
    /// An empty window of at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Window {
        let capacity = capacity.max(1);
        Window { entries: VecDeque::with_capacity(capacity.min(1 << 16)), capacity }
    }

    /// Adds the newest entry, dropping the oldest when full.
    pub fn push(&mut self, entry: Entry) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    /// Drops entries older than `max_age` at `now` and returns a copy of the rest (cheap: the
    /// language cells are shared, not copied).
    pub fn current(&mut self, now: Instant, max_age: Duration) -> Vec<Entry> {
        while self.entries.front().is_some_and(|e| now.saturating_duration_since(e.at) > max_age) {
            self.entries.pop_front();
        }
        self.entries.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn entry(at: Instant, chars: u64) -> Entry {
        let lang = LanguageCell::new(Arc::from("hello"));
        Entry { at, risk_score: 0.5, ood_score: None, text_chars: chars, lang }
    }

    #[test]
    fn keeps_the_newest_capacity_entries_and_drops_old_ones() {
        let t0 = Instant::now();
        let mut w = Window::new(3);
        for i in 0..5 {
            w.push(entry(t0 + Duration::from_secs(i), i));
        }
        let chars = |v: Vec<Entry>| v.iter().map(|e| e.text_chars).collect::<Vec<_>>();
        assert_eq!(chars(w.current(t0 + Duration::from_secs(4), Duration::from_secs(60))), [2, 3, 4]);
        // At t0 + 10 s with a 7 s age limit, only the entries from t0 + 3 s on are left.
        assert_eq!(chars(w.current(t0 + Duration::from_secs(10), Duration::from_secs(7))), [3, 4]);
        assert!(w.current(t0 + Duration::from_secs(100), Duration::from_secs(7)).is_empty());
    }
}
