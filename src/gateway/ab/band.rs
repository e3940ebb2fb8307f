//! The A/B rollback decision as pure functions of windowed counts and a clock reading: a
//! request's sticky key and which arm it falls in, the outcome counts of each arm over a sliding
//! window, whether the candidate's block, fallback or error rate is outside its band around the
//! live policy's (absolute, or relative to the live rate), and whether it has been outside for
//! long enough to roll back. No locks, no clock: the runtime ([`super::Ab`]) feeds them and acts
//! on the answer.

use crate::decision::Arm;
use crate::gateway::Sticky;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;

/// The sticky key of a request under `sticky`, from its `authenticated` tenant (a name a
/// configured source vouches for: an API key, the trusted front proxy's header; never the
/// client's own claim) and, under `sticky = "header"`, the key header's value within that
/// tenant. `None` (the live policy decides) without an authenticated tenant.
///
/// Why the identity and not a keyed hash of a client-sent key: the response names its arm (and
/// its policy version), so a client that may send any key finds one in the arm it wants in
/// about 1/share tries, secret or not. Only a key the client cannot mint keeps it from choosing;
/// within its own tenant a caller may spread its users over the arms (the header), which only
/// moves its own traffic. Tenant names are 1 to 64 of `[A-Za-z0-9._-]`, so the separator
/// (a newline) cannot be forged from the tenant side.
pub fn sticky_key(sticky: Sticky, authenticated: Option<&str>, header: Option<&[u8]>) -> Option<String> {
    let tenant = authenticated?;
    match sticky {
        Sticky::Tenant => Some(tenant.to_string()),
        Sticky::Header => Some(format!("{tenant}\n{}", String::from_utf8_lossy(header?))),
    }
}

/// The arm of a sticky key ([`sticky_key`]): the first 8 bytes
/// of its SHA-256 as a fraction of 2^64, in the candidate's `share` when below it. The same key
/// always lands in the same arm, in every replica and after restarts; raising the share only
/// moves keys from live to candidate.
pub fn arm_of(key: &str, share: f64) -> Arm {
    let digest = Sha256::digest(key.as_bytes());
    let head = u64::from_be_bytes(digest[..8].try_into().unwrap_or_default());
    if (head as f64) / 18_446_744_073_709_551_616.0 < share {
        Arm::Candidate
    } else {
        Arm::Live
    }
}

/// The rates a band is kept on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Measure {
    /// Decisions whose action is `block`.
    Block,
    /// Decisions rules made because no model verdict stood (tier `rules`).
    Fallback,
    /// Requests answered with a server error (shed, internal) instead of a decision.
    Error,
}

impl Measure {
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::Block => "block",
            Measure::Fallback => "fallback",
            Measure::Error => "error",
        }
    }
}

/// What one request of an arm came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A decision: whether it blocks, whether rules made it.
    Decided { block: bool, fallback: bool },
    /// A server error instead of a decision.
    Error,
}

/// One arm's outcomes over a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Requests: decisions and errors.
    pub requests: u64,
    pub blocks: u64,
    pub fallbacks: u64,
    pub errors: u64,
}

impl Counts {
    fn add(&mut self, outcome: Outcome) {
        self.requests += 1;
        match outcome {
            Outcome::Decided { block, fallback } => {
                self.blocks += block as u64;
                self.fallbacks += fallback as u64;
            }
            Outcome::Error => self.errors += 1,
        }
    }

    /// Takes an expired bucket's counts back out of a running total (which holds them).
    fn remove(&mut self, other: &Counts) {
        self.requests -= other.requests;
        self.blocks -= other.blocks;
        self.fallbacks -= other.fallbacks;
        self.errors -= other.errors;
    }

    /// The share of requests with `measure`, [0, 1]; 0 without requests.
    pub fn rate(&self, measure: Measure) -> f64 {
        let n = match measure {
            Measure::Block => self.blocks,
            Measure::Fallback => self.fallbacks,
            Measure::Error => self.errors,
        };
        if self.requests == 0 {
            0.0
        } else {
            n as f64 / self.requests as f64
        }
    }
}

/// Both arms' counts over the last `span_s` whole seconds, in one bucket per second.
#[derive(Debug, Clone)]
pub struct Window {
    span_s: u64,
    /// (second, live, candidate), oldest first.
    buckets: VecDeque<(u64, Counts, Counts)>,
    /// (live, candidate) summed over `buckets`, kept as they come and go: reading the totals on
    /// every request costs O(1), not O(span).
    sum: (Counts, Counts),
}

impl Window {
    pub fn new(span_s: u64) -> Window {
        Window { span_s: span_s.max(1), buckets: VecDeque::new(), sum: Default::default() }
    }

    /// Counts `outcome` for `arm` at `now_ms` (any monotonic origin); drops buckets out of the span.
    pub fn record(&mut self, now_ms: u64, arm: Arm, outcome: Outcome) {
        let second = now_ms / 1000;
        self.expire(second);
        if self.buckets.back().is_none_or(|(s, _, _)| *s != second) {
            self.buckets.push_back((second, Counts::default(), Counts::default()));
        }
        if let Some((_, live, candidate)) = self.buckets.back_mut() {
            match arm {
                Arm::Live => live.add(outcome),
                Arm::Candidate => candidate.add(outcome),
            }
        }
        match arm {
            Arm::Live => self.sum.0.add(outcome),
            Arm::Candidate => self.sum.1.add(outcome),
        }
    }

    /// (live, candidate) over the span ending at `now_ms`.
    pub fn totals(&mut self, now_ms: u64) -> (Counts, Counts) {
        self.expire(now_ms / 1000);
        self.sum
    }

    pub fn clear(&mut self) {
        self.buckets.clear();
        self.sum = Default::default();
    }

    fn expire(&mut self, second: u64) {
        while self.buckets.front().is_some_and(|(s, _, _)| *s + self.span_s <= second) {
            if let Some((_, live, candidate)) = self.buckets.pop_front() {
                self.sum.0.remove(&live);
                self.sum.1.remove(&candidate);
            }
        }
    }
}

/// How far each candidate rate may be from the live one, and the samples both arms need in the
/// window before the difference means anything.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bands {
    /// Absolute bands: largest allowed |candidate - live|, [0, 1].
    pub block: f64,
    pub fallback: f64,
    pub error: f64,
    /// Relative bands: largest allowed |candidate - live| as a share of the live rate (0.5:
    /// half of it); 0: none. An absolute band alone misses a rate that collapses (0.12 -> 0.03
    /// is inside 0.1) or multiplies while small.
    pub block_relative: f64,
    pub fallback_relative: f64,
    pub error_relative: f64,
    pub min_samples: u64,
}

/// How many standard errors a difference must span before a relative band judges it: small
/// live rates over small windows differ by chance by more than any useful share of themselves
/// (1 % over 200 requests is 2 blocks; 4 would be +100 %). Three standard errors of the
/// two-proportion test: about 1 in 370 for a candidate as good as the live policy, per check.
pub const RELATIVE_MIN_Z: f64 = 3.0;

/// Which band a rate left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BandKind {
    /// `|candidate - live| > band`.
    Absolute,
    /// `|candidate - live| > band × live`, beyond chance ([`RELATIVE_MIN_Z`]).
    Relative,
}

/// A rate outside its band.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Breach {
    pub measure: Measure,
    pub live_rate: f64,
    pub candidate_rate: f64,
    /// The band it left: a rate difference (absolute) or a share of the live rate (relative).
    pub band: f64,
    pub band_kind: BandKind,
    /// Requests of each arm in the window.
    pub live_samples: u64,
    pub candidate_samples: u64,
}

/// What the window says about the candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// An arm has fewer than `min_samples` requests in the window: no judgement either way.
    TooFewSamples,
    InBand,
    /// The first measure (block, fallback, error) whose candidate rate is out of its band.
    OutOfBand(Breach),
}

/// The two-proportion z statistic of `live` and `candidate` for `measure` (pooled standard
/// error); 0 when both rates are 0 or both 1 (no spread, no difference).
pub fn z_score(live: &Counts, candidate: &Counts, measure: Measure) -> f64 {
    let (l, c) = (live.rate(measure), candidate.rate(measure));
    let (nl, nc) = (live.requests as f64, candidate.requests as f64);
    if nl == 0.0 || nc == 0.0 {
        return 0.0;
    }
    let pooled = (l * nl + c * nc) / (nl + nc);
    let se = (pooled * (1.0 - pooled) * (1.0 / nl + 1.0 / nc)).sqrt();
    if se > 0.0 {
        (c - l).abs() / se
    } else {
        0.0
    }
}

/// Compares the candidate's rates with the live ones, once both arms have `min_samples`: out of
/// band when, for a measure, `|candidate - live| > band` (absolute), or when
/// `|candidate - live| > relative × live` and the difference is beyond chance
/// (`z >` [`RELATIVE_MIN_Z`]). A relative band over a live rate of 0 is crossed by any
/// difference beyond chance.
pub fn check(live: &Counts, candidate: &Counts, bands: &Bands) -> Check {
    if live.requests < bands.min_samples || candidate.requests < bands.min_samples {
        return Check::TooFewSamples;
    }
    let measures = [
        (Measure::Block, bands.block, bands.block_relative),
        (Measure::Fallback, bands.fallback, bands.fallback_relative),
        (Measure::Error, bands.error, bands.error_relative),
    ];
    for (measure, band, relative) in measures {
        let (l, c) = (live.rate(measure), candidate.rate(measure));
        let breach = |band, band_kind| {
            Check::OutOfBand(Breach {
                measure,
                live_rate: l,
                candidate_rate: c,
                band,
                band_kind,
                live_samples: live.requests,
                candidate_samples: candidate.requests,
            })
        };
        if (c - l).abs() > band {
            return breach(band, BandKind::Absolute);
        }
        if relative > 0.0 && (c - l).abs() > relative * l && z_score(live, candidate, measure) > RELATIVE_MIN_Z {
            return breach(relative, BandKind::Relative);
        }
    }
    Check::InBand
}

/// Whether to roll back now. `since_ms`: when the candidate was first seen out of band without
/// coming back in since (`None`: in band). Returns the new `since_ms` and `true` once it has been
/// out of band for `hold_ms` (0: at the first breach). Too few samples keeps the clock as it is:
/// a quiet minute neither proves the candidate good nor restarts its count.
pub fn hold(since_ms: Option<u64>, check: &Check, now_ms: u64, hold_ms: u64) -> (Option<u64>, bool) {
    match check {
        Check::InBand => (None, false),
        Check::TooFewSamples => (since_ms, false),
        Check::OutOfBand(_) => {
            let since = since_ms.unwrap_or(now_ms);
            (Some(since), now_ms.saturating_sub(since) >= hold_ms)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BANDS: Bands = Bands {
        block: 0.1,
        fallback: 0.15,
        error: 0.05,
        block_relative: 0.0,
        fallback_relative: 0.0,
        error_relative: 0.0,
        min_samples: 10,
    };

    fn counts(requests: u64, blocks: u64, fallbacks: u64, errors: u64) -> Counts {
        Counts { requests, blocks, fallbacks, errors }
    }

    #[test]
    fn a_key_always_lands_in_the_same_arm_and_the_share_is_kept() {
        assert_eq!(arm_of("tenant-a", 0.5), arm_of("tenant-a", 0.5));
        assert_eq!(arm_of("anything", 0.0), Arm::Live);
        assert_eq!(arm_of("anything", 1.0), Arm::Candidate);
        let candidates = (0..10_000).filter(|i| arm_of(&format!("key-{i}"), 0.3) == Arm::Candidate).count();
        assert!((2_800..=3_200).contains(&candidates), "{candidates} of 10000 at share 0.3");
        // Raising the share only moves keys into the candidate.
        let moved_out = (0..2_000).filter(|i| {
            let k = format!("key-{i}");
            arm_of(&k, 0.2) == Arm::Candidate && arm_of(&k, 0.4) == Arm::Live
        });
        assert_eq!(moved_out.count(), 0);
    }

    #[test]
    fn too_few_samples_judge_nothing() {
        assert_eq!(check(&counts(9, 0, 0, 0), &counts(100, 100, 0, 0), &BANDS), Check::TooFewSamples);
        assert_eq!(check(&counts(100, 0, 0, 0), &counts(9, 9, 0, 0), &BANDS), Check::TooFewSamples);
    }

    #[test]
    fn each_rate_is_held_to_its_own_band_in_both_directions() {
        let live = counts(100, 10, 20, 1);
        assert_eq!(check(&live, &counts(50, 9, 10, 0), &BANDS), Check::InBand, "block 0.18 vs 0.1: within 0.1");
        let Check::OutOfBand(b) = check(&live, &counts(50, 11, 10, 0), &BANDS) else { panic!("block 0.22") };
        assert_eq!((b.measure, b.live_rate, b.candidate_rate, b.band), (Measure::Block, 0.1, 0.22, 0.1));
        assert_eq!(b.band_kind, BandKind::Absolute);
        assert_eq!((b.live_samples, b.candidate_samples), (100, 50));
        let Check::OutOfBand(b) = check(&live, &counts(50, 5, 0, 0), &BANDS) else { panic!("fallback 0") };
        assert_eq!(b.measure, Measure::Fallback, "a candidate too far below is out of band too");
        let Check::OutOfBand(b) = check(&live, &counts(50, 5, 10, 4), &BANDS) else { panic!("errors 0.08") };
        assert_eq!((b.measure, b.candidate_rate), (Measure::Error, 0.08));
    }

    #[test]
    fn a_relative_band_catches_a_collapse_the_absolute_band_misses() {
        // Issue 25's case: block rate 0.12 -> 0.03, inside an absolute band of 0.1.
        let live = counts(1000, 120, 0, 0);
        let collapsed = counts(1000, 30, 0, 0);
        assert_eq!(check(&live, &collapsed, &BANDS), Check::InBand, "absolute only: inside 0.1");
        let bands = Bands { block_relative: 0.5, ..BANDS };
        let Check::OutOfBand(b) = check(&live, &collapsed, &bands) else { panic!("-75 % of the live rate") };
        assert_eq!((b.measure, b.band_kind, b.band), (Measure::Block, BandKind::Relative, 0.5));
        assert_eq!((b.live_rate, b.candidate_rate), (0.12, 0.03));
        // Up as well as down: 0.02 -> 0.06 (+200 %, inside 0.1 absolute).
        let Check::OutOfBand(b) = check(&counts(1000, 20, 0, 0), &counts(1000, 60, 0, 0), &bands) else {
            panic!("+200 %")
        };
        assert_eq!(b.band_kind, BandKind::Relative);
        // Within the share: 0.12 -> 0.09 (-25 %).
        assert_eq!(check(&live, &counts(1000, 90, 0, 0), &bands), Check::InBand);
        // Each measure has its own relative band; 0 turns it off.
        let errors = Bands { error_relative: 0.5, ..BANDS };
        let Check::OutOfBand(b) = check(&counts(1000, 0, 0, 0), &counts(1000, 0, 0, 30), &errors) else {
            panic!("errors from none to 0.03 is inside 0.05 absolute, not relative to 0")
        };
        assert_eq!((b.measure, b.band_kind), (Measure::Error, BandKind::Relative));
        assert_eq!(check(&counts(1000, 0, 0, 0), &counts(1000, 0, 0, 30), &BANDS), Check::InBand);
    }

    #[test]
    fn a_relative_band_ignores_differences_within_chance() {
        let bands = Bands { block_relative: 0.5, min_samples: 200, ..BANDS };
        // 1 % vs 2 % over 200 requests each: +100 %, but 2 vs 4 blocks is chance (z ~ 0.8).
        let (live, candidate) = (counts(200, 2, 0, 0), counts(200, 4, 0, 0));
        assert!(z_score(&live, &candidate, Measure::Block) < 1.0);
        assert_eq!(check(&live, &candidate, &bands), Check::InBand);
        // The same rates over 20,000 requests each are a real change (z ~ 8).
        let (live, candidate) = (counts(20_000, 200, 0, 0), counts(20_000, 400, 0, 0));
        assert!(z_score(&live, &candidate, Measure::Block) > 8.0);
        let Check::OutOfBand(b) = check(&live, &candidate, &bands) else { panic!("+100 % over 20,000") };
        assert_eq!(b.band_kind, BandKind::Relative);
        // No spread, no difference: both 0 or both 1.
        assert_eq!(z_score(&counts(50, 0, 0, 0), &counts(50, 0, 0, 0), Measure::Block), 0.0);
        assert_eq!(z_score(&counts(50, 50, 0, 0), &counts(50, 50, 0, 0), Measure::Block), 0.0);
    }

    #[test]
    fn the_sticky_key_needs_an_authenticated_tenant() {
        assert_eq!(sticky_key(Sticky::Tenant, None, Some(b"x")), None, "no tenant, no key: live");
        assert_eq!(sticky_key(Sticky::Header, None, Some(b"user-1")), None, "a header alone picks nothing");
        assert_eq!(sticky_key(Sticky::Tenant, Some("acme"), Some(b"x")).as_deref(), Some("acme"));
        assert_eq!(sticky_key(Sticky::Header, Some("acme"), None), None);
        let key = sticky_key(Sticky::Header, Some("acme"), Some(b"user-1"));
        assert_eq!(key.as_deref(), Some("acme\nuser-1"), "the header counts within its tenant");
        assert_ne!(sticky_key(Sticky::Header, Some("other"), Some(b"user-1")), key);
    }

    #[test]
    fn rollback_waits_for_the_breach_to_last_and_forgets_it_once_back_in_band() {
        let out = Check::OutOfBand(Breach {
            measure: Measure::Block,
            live_rate: 0.1,
            candidate_rate: 1.0,
            band: 0.1,
            band_kind: BandKind::Absolute,
            live_samples: 10,
            candidate_samples: 10,
        });
        assert_eq!(hold(None, &out, 1_000, 5_000), (Some(1_000), false));
        assert_eq!(hold(Some(1_000), &Check::TooFewSamples, 3_000, 5_000), (Some(1_000), false));
        assert_eq!(hold(Some(1_000), &out, 5_999, 5_000), (Some(1_000), false));
        assert_eq!(hold(Some(1_000), &out, 6_000, 5_000), (Some(1_000), true));
        assert_eq!(hold(Some(1_000), &Check::InBand, 6_000, 5_000), (None, false));
        assert_eq!(hold(None, &out, 7_000, 0), (Some(7_000), true), "hold 0: the first breach rolls back");
    }

    #[test]
    fn the_window_forgets_what_is_older_than_its_span() {
        let mut w = Window::new(10);
        let block = Outcome::Decided { block: true, fallback: false };
        w.record(0, Arm::Candidate, block);
        w.record(500, Arm::Live, Outcome::Decided { block: false, fallback: true });
        w.record(9_999, Arm::Candidate, Outcome::Error);
        assert_eq!(w.totals(9_999), (counts(1, 0, 1, 0), counts(2, 1, 0, 1)));
        assert_eq!(w.totals(10_000), (counts(0, 0, 0, 0), counts(1, 0, 0, 1)), "second 0 is out at 10 s");
        w.record(25_000, Arm::Live, block);
        assert_eq!(w.totals(25_000), (counts(1, 1, 0, 0), Counts::default()));
        w.clear();
        assert_eq!(w.totals(25_000), (Counts::default(), Counts::default()));
    }

    proptest::proptest! {
        /// The running totals equal the buckets summed afresh, whatever the order of records,
        /// reads and gaps.
        #[test]
        fn running_totals_equal_the_buckets_summed(
            span_s in 1u64..20,
            steps in proptest::collection::vec((0u64..3_000, 0u8..4, proptest::bool::ANY), 1..200),
        ) {
            let mut w = Window::new(span_s);
            let mut now_ms = 0;
            for (gap_ms, what, read) in steps {
                now_ms += gap_ms;
                let arm = if what % 2 == 0 { Arm::Live } else { Arm::Candidate };
                let outcome = if what < 2 { Outcome::Error } else { Outcome::Decided { block: read, fallback: !read } };
                w.record(now_ms, arm, outcome);
                if read {
                    let totals = w.totals(now_ms);
                    let (mut live, mut candidate) = (Counts::default(), Counts::default());
                    for (_, l, c) in &w.buckets {
                        for (sum, one) in [(&mut live, l), (&mut candidate, c)] {
                            sum.requests += one.requests;
                            sum.blocks += one.blocks;
                            sum.fallbacks += one.fallbacks;
                            sum.errors += one.errors;
                        }
                    }
                    proptest::prop_assert_eq!(totals, (live, candidate));
                }
            }
        }
    }
}
