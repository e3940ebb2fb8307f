//! The out-of-distribution score of a model's embedding (`ood.json`), and how it is fitted.
//!
//! `d = 1 - max_c cos(e, c)` over k-means centroids `c` of reference embeddings (the training
//! split's, in the recipe), turned into the empirical CDF of `d` over held-out embeddings (the
//! validation split's), interpolated linearly between its 101 quantiles (0 below the first, 1
//! above the last; as `ood.json` states). 0.5 is a typical in-domain input; 1.0 is farther than
//! every held-out input.

use anyhow::bail;
use serde::{Deserialize, Serialize};

/// `ood.json` (extra fields, such as `method` and `fitted_on`, are for people and kept by the
/// writers that add them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OodFile {
    /// Unit vectors, all of the embedding's length.
    pub centroids: Vec<Vec<f32>>,
    /// Ascending quantiles of `d` at probabilities `i / (len - 1)`.
    pub quantiles: Vec<f64>,
}

/// Scores embeddings against an [`OodFile`].
#[derive(Debug, Clone)]
pub struct OodScorer {
    pub(super) dim: usize,
    centroids: Vec<f32>,
    quantiles: Vec<f64>,
}

impl OodScorer {
    /// Errors: no centroids, centroids of different lengths (or not `dim`, when the model
    /// declares it), no quantiles.
    pub fn new(file: OodFile, dim: Option<usize>) -> anyhow::Result<OodScorer> {
        let dim = dim.or_else(|| file.centroids.first().map(Vec::len)).unwrap_or(0);
        if dim == 0 || file.centroids.iter().any(|c| c.len() != dim) || file.quantiles.is_empty() {
            bail!("centroids must all have length {dim} and quantiles must not be empty");
        }
        Ok(OodScorer { dim, centroids: file.centroids.concat(), quantiles: file.quantiles })
    }

    /// `embedding` must be L2-normalised, length `dim`.
    pub fn score(&self, embedding: &[f32]) -> f64 {
        ecdf(&self.quantiles, distance(&self.centroids, self.dim, embedding))
    }
}

/// `1 - max_c cos(e, c)` for unit vectors.
fn distance(centroids: &[f32], dim: usize, embedding: &[f32]) -> f64 {
    let best = centroids.chunks_exact(dim).map(|c| dot(c, embedding)).fold(f32::MIN, f32::max);
    1.0 - best as f64
}

/// `Σ a_i b_i` in eight running sums: one sum is a chain of dependent float additions the
/// compiler may not reorder, eight independent ones become one SIMD register (32 centroids x 384
/// dimensions per window: ~20 µs as one chain, a few µs as eight). The order of additions
/// differs from a sequential sum by float rounding only (~1e-7 here).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let (a8, b8) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    let mut sums = [0f32; LANES];
    for (x, y) in a8.zip(b8) {
        for i in 0..LANES {
            sums[i] += x[i] * y[i];
        }
    }
    sums.iter().sum::<f32>() + tail
}

/// The empirical CDF at `x` from ascending quantiles at probabilities `i / (n - 1)`.
fn ecdf(quantiles: &[f64], x: f64) -> f64 {
    let n = quantiles.len();
    let i = quantiles.partition_point(|&q| q <= x);
    if i == 0 {
        return 0.0;
    }
    if i == n || n == 1 {
        return 1.0;
    }
    let (lo, hi) = (quantiles[i - 1], quantiles[i]);
    let frac = if hi > lo { (x - lo) / (hi - lo) } else { 0.0 };
    ((i - 1) as f64 + frac) / (n - 1) as f64
}

/// Fits an [`OodFile`]: `k` centroids by spherical k-means (k-means++ seeding with a fixed seed,
/// then Lloyd's iterations on cosine similarity, Arthur & Vassilvitskii 2007) on `reference`, and
/// the 101 quantiles (linear interpolation, as numpy's default) of the held-out distances.
/// Embeddings must be L2-normalised and of one length; `k` is capped at `reference.len()`.
///
/// Errors: no reference or held-out embeddings, or embeddings of different lengths.
pub fn fit(reference: &[Vec<f32>], held_out: &[Vec<f32>], k: usize) -> anyhow::Result<OodFile> {
    let Some(dim) = reference.first().map(Vec::len).filter(|&d| d > 0) else {
        bail!("no reference embeddings to fit centroids on");
    };
    if held_out.is_empty() || reference.iter().chain(held_out).any(|e| e.len() != dim) {
        bail!("need held-out embeddings, all of length {dim}");
    }
    let k = k.clamp(1, reference.len());
    let mut rng = fastrand::Rng::with_seed(20261202);
    // k-means++: each next centroid drawn with probability proportional to its distance.
    let mut centroids: Vec<Vec<f32>> = vec![reference[rng.usize(..reference.len())].clone()];
    while centroids.len() < k {
        let flat = centroids.concat();
        let d: Vec<f64> = reference.iter().map(|e| distance(&flat, dim, e).max(0.0)).collect();
        let total: f64 = d.iter().sum();
        if total <= 0.0 {
            break; // every embedding sits on a centroid already
        }
        let mut pick = rng.f64() * total;
        let next = d.iter().position(|&x| {
            pick -= x;
            pick <= 0.0
        });
        centroids.push(reference[next.unwrap_or(reference.len() - 1)].clone());
    }
    for _ in 0..50 {
        let flat = centroids.concat();
        let mut sums = vec![vec![0f32; dim]; centroids.len()];
        for e in reference {
            let nearest = flat
                .chunks_exact(dim)
                .map(|c| c.iter().zip(e).map(|(a, b)| a * b).sum::<f32>())
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(0, |(i, _)| i);
            sums[nearest].iter_mut().zip(e).for_each(|(s, x)| *s += x);
        }
        let next: Vec<Vec<f32>> = sums
            .into_iter()
            .zip(&centroids)
            .map(|(s, old)| {
                let norm = s.iter().map(|x| x * x).sum::<f32>().sqrt();
                if norm > 0.0 {
                    s.iter().map(|x| x / norm).collect()
                } else {
                    old.clone()
                }
            })
            .collect();
        let moved = next.iter().zip(&centroids).any(|(a, b)| a.iter().zip(b).any(|(x, y)| (x - y).abs() > 1e-6));
        centroids = next;
        if !moved {
            break;
        }
    }
    let flat = centroids.concat();
    let mut d: Vec<f64> = held_out.iter().map(|e| distance(&flat, dim, e)).collect();
    d.sort_by(f64::total_cmp);
    let quantiles = (0..=100)
        .map(|i| {
            let pos = i as f64 / 100.0 * (d.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            d[lo] + (d[hi] - d[lo]) * (pos - lo as f64)
        })
        .collect();
    Ok(OodFile { centroids, quantiles })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_in_eight_sums_is_the_sequential_sum_up_to_rounding() {
        for n in [0, 1, 7, 8, 9, 384, 389] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0).collect();
            let sequential: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(x * y)).sum();
            assert!((f64::from(dot(&a, &b)) - sequential).abs() < 1e-4, "n = {n}");
        }
    }

    #[test]
    fn ecdf_interpolates_between_quantiles() {
        let q = [0.0, 0.1, 0.2, 0.4, 1.0];
        assert_eq!(ecdf(&q, -1.0), 0.0);
        assert_eq!(ecdf(&q, 0.1), 0.25);
        assert!((ecdf(&q, 0.3) - 0.625).abs() < 1e-12);
        assert_eq!(ecdf(&q, 1.0), 1.0);
        assert_eq!(ecdf(&q, 2.0), 1.0);
    }

    fn unit(v: &[f32]) -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter().map(|x| x / n).collect()
    }

    #[test]
    fn fit_finds_the_clusters_and_scores_the_held_out_half_as_typical() {
        // Two tight clusters around the x and y axes; a point on the z axis is far from both.
        let jitter = |i: usize| (i % 7) as f32 * 0.01;
        let data: Vec<Vec<f32>> = (0..200)
            .map(|i| if i % 2 == 0 { unit(&[1.0, jitter(i), 0.0]) } else { unit(&[jitter(i), 1.0, 0.0]) })
            .collect();
        let (reference, held) = data.split_at(100);
        let file = fit(reference, held, 2).unwrap();
        assert_eq!(file.centroids.len(), 2);
        assert_eq!(file.quantiles.len(), 101);
        assert!(file.quantiles.windows(2).all(|w| w[0] <= w[1]));
        let scorer = OodScorer::new(file, Some(3)).unwrap();
        assert!(scorer.score(&unit(&[1.0, 0.03, 0.0])) < 1.0);
        assert_eq!(scorer.score(&unit(&[0.0, 0.0, 1.0])), 1.0);
        // Bad input is an error, not a panic.
        assert!(fit(&[], held, 2).is_err());
        assert!(fit(reference, &[vec![1.0]], 2).is_err());
    }
}
