//! Known values from scipy 1.x: `scipy.stats.ks_2samp(a, b).statistic` and
//! `scipy.stats.kstwobign.sf(λ)`, computed with the same inputs.

use super::*;

fn sorted(v: &[f64]) -> Vec<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn statistic_matches_scipy_ks_2samp() {
    let a = sorted(&[0.1, 0.4, 0.4, 0.7, 1.3, 2.0, 2.0, 3.5]);
    let b = sorted(&[0.2, 0.4, 1.0, 1.1, 1.3, 2.5, 4.0]);
    assert!(close(ks_statistic(&a, &b).unwrap(), 0.2142857142857143, 1e-12));
    // Integers with many ties inside and across the samples.
    let a = sorted(&[3., 1., 4., 1., 5., 9., 2., 6., 5., 3., 5., 8., 9., 7., 9., 3., 2., 3., 8., 4.]);
    let b = sorted(&[2., 7., 1., 8., 2., 8., 1., 8., 2., 8., 4., 5., 9., 0., 4., 5.]);
    assert!(close(ks_statistic(&a, &b).unwrap(), 0.175, 1e-12));
    let a: Vec<f64> = (0..40).map(|i| 0.05 * i as f64).collect();
    let b: Vec<f64> = (0..30).map(|i| 0.05 * i as f64 + 0.5).collect();
    assert!(close(ks_statistic(&a, &b).unwrap(), 0.25, 1e-12));
}

#[test]
fn statistic_is_symmetric_zero_for_equal_and_one_for_disjoint_samples() {
    let a = sorted(&[1.0, 2.0, 2.0, 3.0]);
    let b = sorted(&[0.5, 2.0, 9.0]);
    assert_eq!(ks_statistic(&a, &b), ks_statistic(&b, &a));
    assert_eq!(ks_statistic(&a, &a), Some(0.0));
    assert_eq!(ks_statistic(&[1.0, 2.0], &[3.0, 4.0]), Some(1.0));
    assert_eq!(ks_statistic(&[], &a), None);
}

#[test]
fn p_value_follows_the_kolmogorov_distribution() {
    // scipy.stats.kstwobign.sf(λ)
    for (lambda, sf) in [
        (0.2, 0.999999999999495),
        (0.5, 0.9639452436648751),
        (1.0, 0.26999967167735456),
        (1.36, 0.049485876755377876),
        (2.0, 0.0006709252557796953),
    ] {
        assert!(close(kolmogorov_sf(lambda), sf, 1e-9), "λ = {lambda}: {} vs {sf}", kolmogorov_sf(lambda));
    }
    // λ = D·√(nm/(n+m)): D = 0.33667 with n = 200, m = 150 → 7.2859e-9 (scipy).
    let p = ks_p_value(0.33666666666666667, 200, 150);
    assert!(close(p / 7.285869789004987e-09, 1.0, 1e-6), "{p}");
    assert_eq!(ks_p_value(0.0, 10, 10), 1.0);
}

#[test]
fn total_variation_of_language_shares() {
    let counts = |v: &[(&str, u64)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect::<BTreeMap<_, _>>();
    let a = counts(&[("eng", 80), ("und", 20)]);
    let b = counts(&[("eng", 50), ("und", 30), ("fra", 20)]);
    // ½ (|0.8 − 0.5| + |0.2 − 0.3| + |0 − 0.2|) = 0.3
    assert!(close(total_variation(&a, &b).unwrap(), 0.3, 1e-12));
    assert_eq!(total_variation(&a, &a), Some(0.0));
    assert_eq!(total_variation(&a, &counts(&[("rus", 3)])), Some(1.0));
    assert_eq!(total_variation(&a, &BTreeMap::new()), None);
}
