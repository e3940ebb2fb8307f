//! Confidence calibration: temperature scaling, ECE and reliability bins.
//!
//! Temperature scaling (Guo, Pleiss, Sun, Weinberger, "On Calibration of Modern Neural
//! Networks", ICML 2017): one scalar `T > 0` divides the logits before the softmax; it is
//! fitted by minimising the negative log-likelihood on held-out data and leaves the argmax,
//! hence accuracy, unchanged. ECE (expected calibration error, Naeini et al. 2015, as used by
//! Guo et al.) is the bin-weighted mean |accuracy - confidence| over equal-width confidence bins.

use serde::{Deserialize, Serialize};

/// Softmax of `logits / temperature`, computed stably. Shape: `[classes]` -> `[classes]`.
pub fn softmax_t(logits: &[f32], temperature: f64) -> Vec<f64> {
    let scaled: Vec<f64> = logits.iter().map(|&z| z as f64 / temperature).collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scaled.iter().map(|z| (z - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// The log-odds `ln(p / (1 - p))` of a probability: the margin `(z1 - z0) / T` of a two-class
/// softmax at temperature `T` whose class-1 probability is `p` (so `T · logit(p)` recovers the
/// logit margin). `±inf` at 1 and 0.
pub fn logit(p: f64) -> f64 {
    (p / (1.0 - p)).ln()
}

/// A two-class probability read at another temperature: `p`, a class's probability under
/// `softmax(z / from)`, becomes its probability under `softmax(z / to)`, that is
/// `sigmoid(logit(p) · from / to)` (two classes' softmax depends only on the margin, which
/// `logit(p) · from` recovers). `p` itself when the temperatures are equal; 0 and 1 stay put.
pub fn retemper(p: f64, from: f64, to: f64) -> f64 {
    if from == to {
        return p;
    }
    1.0 / (1.0 + (-logit(p) * (from / to)).exp())
}

/// Mean negative log-likelihood of `labels` under `softmax(logits / T)`.
pub fn nll(logits: &[Vec<f32>], labels: &[usize], temperature: f64) -> f64 {
    let total: f64 = logits
        .iter()
        .zip(labels)
        .map(|(z, &y)| {
            let scaled: Vec<f64> = z.iter().map(|&v| v as f64 / temperature).collect();
            let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + scaled.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            lse - scaled[y]
        })
        .sum();
    total / logits.len().max(1) as f64
}

/// Fits the temperature by minimising NLL. NLL is convex in `1/T`, so a golden-section search
/// over `1/T` in [0.01, 100] (T in [0.01, 100]) finds the global minimum.
///
/// Shapes: `logits` is `[n][classes]`, `labels` is `[n]` with values `< classes`.
pub fn fit_temperature(logits: &[Vec<f32>], labels: &[usize]) -> f64 {
    let f = |beta: f64| nll(logits, labels, 1.0 / beta);
    let (mut lo, mut hi) = (0.01_f64, 100.0_f64);
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    let mut a = hi - phi * (hi - lo);
    let mut b = lo + phi * (hi - lo);
    let (mut fa, mut fb) = (f(a), f(b));
    for _ in 0..200 {
        if fa < fb {
            hi = b;
            b = a;
            fb = fa;
            a = hi - phi * (hi - lo);
            fa = f(a);
        } else {
            lo = a;
            a = b;
            fa = fb;
            b = lo + phi * (hi - lo);
            fb = f(b);
        }
        if hi - lo < 1e-9 {
            break;
        }
    }
    1.0 / ((lo + hi) / 2.0)
}

/// One equal-width confidence bin of a reliability diagram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReliabilityBin {
    pub lower: f64,
    pub upper: f64,
    pub count: usize,
    /// Mean confidence of the predictions in the bin (NaN-free: 0 when empty).
    pub mean_confidence: f64,
    /// Fraction of the bin's predictions that were correct.
    pub accuracy: f64,
}

/// Reliability bins over `[0, 1]`: `confidences[i]` is the probability of the predicted class,
/// `correct[i]` whether that prediction was right. A confidence of exactly 1.0 falls in the last bin.
pub fn reliability(confidences: &[f64], correct: &[bool], bins: usize) -> Vec<ReliabilityBin> {
    let bins = bins.max(1);
    let mut sums = vec![(0usize, 0f64, 0usize); bins];
    for (&c, &ok) in confidences.iter().zip(correct) {
        let i = ((c * bins as f64) as usize).min(bins - 1);
        sums[i].0 += 1;
        sums[i].1 += c;
        sums[i].2 += ok as usize;
    }
    sums.into_iter()
        .enumerate()
        .map(|(i, (count, conf, ok))| ReliabilityBin {
            lower: i as f64 / bins as f64,
            upper: (i + 1) as f64 / bins as f64,
            count,
            mean_confidence: if count > 0 { conf / count as f64 } else { 0.0 },
            accuracy: if count > 0 { ok as f64 / count as f64 } else { 0.0 },
        })
        .collect()
}

/// Expected calibration error over `bins` equal-width bins (15 in Guo et al.).
pub fn ece(confidences: &[f64], correct: &[bool], bins: usize) -> f64 {
    let n = confidences.len().max(1) as f64;
    reliability(confidences, correct, bins)
        .iter()
        .map(|b| b.count as f64 / n * (b.accuracy - b.mean_confidence).abs())
        .sum()
}

/// Confidence of the predicted class and whether it was right, for each example at temperature `T`.
pub fn confidences(logits: &[Vec<f32>], labels: &[usize], temperature: f64) -> (Vec<f64>, Vec<bool>) {
    logits
        .iter()
        .zip(labels)
        .map(|(z, &y)| {
            let p = softmax_t(z, temperature);
            let (pred, conf) =
                p.iter()
                    .cloned()
                    .enumerate()
                    .fold((0, f64::MIN), |best, (i, v)| if v > best.1 { (i, v) } else { best });
            (conf, pred == y)
        })
        .unzip()
}

/// The calibration file next to a model (`calibration.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalibrationFile {
    pub temperature: f64,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic test data without a dependency.
    struct Rng(u64);
    impl Rng {
        fn next_f64(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 11) as f64 / (1u64 << 53) as f64
        }
        fn normal(&mut self) -> f64 {
            let (u, v) = (self.next_f64().max(1e-12), self.next_f64());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
    }

    /// Labels drawn from softmax(z); the model reports z * T0, so the right temperature is T0.
    fn synthetic(t0: f64, n: usize, seed: u64) -> (Vec<Vec<f32>>, Vec<usize>) {
        let mut rng = Rng(seed);
        let mut logits = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..n {
            let z = [rng.normal() * 2.0, rng.normal() * 2.0];
            let p1 = softmax_t(&[z[0] as f32, z[1] as f32], 1.0)[1];
            labels.push((rng.next_f64() < p1) as usize);
            logits.push(vec![(z[0] * t0) as f32, (z[1] * t0) as f32]);
        }
        (logits, labels)
    }

    #[test]
    fn fitted_temperature_recovers_the_true_one() {
        for t0 in [0.5, 1.0, 1.37, 3.0] {
            let (logits, labels) = synthetic(t0, 20_000, 7);
            let t = fit_temperature(&logits, &labels);
            assert!((t - t0).abs() / t0 < 0.05, "true {t0}, fitted {t}");
        }
    }

    #[test]
    fn temperature_scaling_reduces_ece_of_an_overconfident_model() {
        let (logits, labels) = synthetic(3.0, 20_000, 11);
        let (c1, ok1) = confidences(&logits, &labels, 1.0);
        let t = fit_temperature(&logits, &labels);
        let (c2, ok2) = confidences(&logits, &labels, t);
        let (before, after) = (ece(&c1, &ok1, 15), ece(&c2, &ok2, 15));
        assert!(before > 0.05, "overconfident model should be miscalibrated: {before}");
        assert!(after < 0.02, "after scaling: {after}");
        assert_eq!(ok1, ok2, "temperature scaling must not change predictions");
    }

    #[test]
    fn ece_of_a_perfectly_calibrated_set_is_zero() {
        // In each bin, confidence c with exactly round(c * 20) of 20 predictions correct.
        let mut conf = Vec::new();
        let mut correct = Vec::new();
        for k in 10..=20 {
            let c = k as f64 / 20.0;
            for i in 0..20 {
                conf.push(c);
                correct.push(i < k);
            }
        }
        assert!(ece(&conf, &correct, 15) < 1e-12);
        // A maximally wrong set has ECE equal to its confidence.
        assert!((ece(&[0.9; 10], &[false; 10], 15) - 0.9).abs() < 1e-12);
    }

    #[test]
    fn reliability_bins_cover_the_unit_interval() {
        let bins = reliability(&[0.0, 0.5, 1.0], &[true, false, true], 15);
        assert_eq!(bins.len(), 15);
        assert_eq!(bins.iter().map(|b| b.count).sum::<usize>(), 3);
        assert_eq!(bins[14].count, 1, "1.0 belongs to the last bin");
        assert_eq!(bins[0].lower, 0.0);
        assert!((bins[14].upper - 1.0).abs() < 1e-12);
    }

    #[test]
    fn softmax_is_stable_for_large_logits() {
        let p = softmax_t(&[1000.0, 0.0], 1.0);
        assert!((p[0] - 1.0).abs() < 1e-12 && p[1] >= 0.0);
        let p = softmax_t(&[2.0, 0.0], 2.0);
        assert!((p[0] - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-12);
    }

    #[test]
    fn retemper_is_the_softmax_at_the_other_temperature() {
        let mut rng = Rng(3);
        for _ in 0..1000 {
            let z = [(rng.normal() * 4.0) as f32, (rng.normal() * 4.0) as f32];
            let (from, to) = (0.5 + rng.next_f64() * 3.0, 0.5 + rng.next_f64() * 3.0);
            let (p, want) = (softmax_t(&z, from)[1], softmax_t(&z, to)[1]);
            // Read from `p`, not the logits: exact up to what `1 - p` keeps of a large margin (a
            // margin of 28 leaves `1 - p` about 4e-13, known to 1e-16).
            assert!((retemper(p, from, to) - want).abs() < 1e-6, "{z:?} {from} -> {to}");
            // The margin is recovered to the precision `1 - p` keeps (an f64's epsilon / (1 - p)).
            if p.min(1.0 - p) > 1e-9 {
                assert!((from * logit(p) - (z[1] - z[0]) as f64).abs() < 1e-6, "{z:?} at {from}");
            }
        }
        assert_eq!(retemper(0.73, 1.2, 1.2), 0.73, "the same temperature changes nothing");
        assert_eq!((retemper(1.0, 1.0, 2.0), retemper(0.0, 1.0, 2.0)), (1.0, 0.0), "saturated scores stay put");
        assert_eq!(retemper(0.5, 1.0, 3.0), 0.5);
    }
}
