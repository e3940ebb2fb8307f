//! The two-sample Kolmogorov–Smirnov test: the statistic D (exact, from sorted samples) and its
//! asymptotic p-value from Kolmogorov's limiting distribution; and the total variation distance
//! between two categorical distributions (for the language, where KS is not defined: a
//! categorical has no order, and KS over an arbitrary order of the codes would change with it).

use std::collections::BTreeMap;

/// The two-sample KS statistic `D = sup_x |F_a(x) − F_b(x)|` of the empirical distribution
/// functions of `a` and `b`, in [0, 1]. Both slices must be sorted ascending (NaN-free; the
/// caller filters); ties are handled (both ECDFs step past a shared value together).
/// `None` when either sample is empty.
pub fn ks_statistic(a: &[f64], b: &[f64]) -> Option<f64> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let (mut i, mut j, mut d) = (0usize, 0usize, 0.0f64);
    while i < a.len() && j < b.len() {
        // The next distinct value of either sample: both ECDFs jump past every copy of it.
        let x = a[i].min(b[j]);
        while i < a.len() && a[i] <= x {
            i += 1;
        }
        while j < b.len() && b[j] <= x {
            j += 1;
        }
        d = d.max((i as f64 / na - j as f64 / nb).abs());
    }
    // Past the end of one sample its ECDF is 1; the other's only grows towards 1 from here, so
    // the largest gap left is at the current point, already counted.
    Some(d)
}

/// The asymptotic two-sided p-value of a two-sample KS statistic `d` for sample sizes `n` and
/// `m`: Kolmogorov's limiting distribution `Q(λ) = 2 Σ_{k≥1} (−1)^{k−1} e^{−2k²λ²}` at
/// `λ = d·√(nm/(n+m))` (scipy's `kstwobign.sf`). Accurate for large samples; conservative
/// enough for monitoring, not a substitute for the exact test on small ones.
pub fn ks_p_value(d: f64, n: usize, m: usize) -> f64 {
    if n == 0 || m == 0 {
        return 1.0;
    }
    let en = (n as f64 * m as f64) / (n as f64 + m as f64);
    kolmogorov_sf(d * en.sqrt())
}

/// `P(K > λ)` for the Kolmogorov distribution K.
fn kolmogorov_sf(lambda: f64) -> f64 {
    if lambda <= 0.0 {
        return 1.0;
    }
    if lambda < 0.3 {
        // The alternating series converges slowly here and the survival function is 1 to
        // within 1e-6 (Q(0.3) = 0.99999906).
        return 1.0 - kolmogorov_cdf_small(lambda);
    }
    let mut sum = 0.0;
    for k in 1..=100 {
        let k = k as f64;
        let term = (-2.0 * k * k * lambda * lambda).exp();
        sum += if k as u64 % 2 == 1 { term } else { -term };
        if term < 1e-16 {
            break;
        }
    }
    (2.0 * sum).clamp(0.0, 1.0)
}

/// `P(K ≤ λ)` by the dual series `√(2π)/λ Σ_{k≥1} e^{−(2k−1)²π²/(8λ²)}`, fast for small λ.
fn kolmogorov_cdf_small(lambda: f64) -> f64 {
    let pi = std::f64::consts::PI;
    let mut sum = 0.0;
    for k in 1..=20 {
        let odd = (2 * k - 1) as f64;
        sum += (-(odd * odd) * pi * pi / (8.0 * lambda * lambda)).exp();
    }
    ((2.0 * pi).sqrt() / lambda * sum).clamp(0.0, 1.0)
}

/// Total variation distance `½ Σ_c |p(c) − q(c)|` between two categorical distributions given
/// as counts per category, in [0, 1] (0: identical shares; 1: no category in common). For two
/// categories it equals the KS statistic under either order. `None` when either is empty.
pub fn total_variation(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Option<f64> {
    let (na, nb) = (a.values().sum::<u64>() as f64, b.values().sum::<u64>() as f64);
    if na == 0.0 || nb == 0.0 {
        return None;
    }
    let share = |m: &BTreeMap<String, u64>, k: &str, n: f64| m.get(k).copied().unwrap_or(0) as f64 / n;
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    Some(0.5 * keys.into_iter().map(|k| (share(a, k, na) - share(b, k, nb)).abs()).sum::<f64>())
}

#[cfg(test)]
mod tests;
