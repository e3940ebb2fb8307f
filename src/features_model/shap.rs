//! Exact TreeSHAP for a tree ensemble: each feature's Shapley value for one row, in the
//! ensemble's margin (log-odds) units, so that `bias + Σ contributions = margin`.
//!
//! The polynomial-time algorithm of Lundberg, Erion & Lee, "Consistent Individualized Feature
//! Attribution for Tree Ensembles" (2018), Algorithm 2, as the `shap` package and XGBoost's
//! `pred_contribs` implement it (path extension/unwinding over the unique features of a root
//! to leaf path, conditional expectations weighted by each node's cover). The trees come from
//! `trees.json` beside the ONNX model (written by the recipe), because ONNX's tree operators do
//! not carry covers.

use serde::Deserialize;

/// One node of a tree; node `i` of a tree is at index `i`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Node {
    Leaf {
        leaf: f64,
        cover: f64,
    },
    /// `x[feature] < threshold` takes `yes` (as XGBoost); `missing` is never taken here (the
    /// schema fills every absent feature in).
    Split {
        feature: usize,
        threshold: f32,
        yes: usize,
        no: usize,
        #[allow(dead_code)]
        missing: usize,
        cover: f64,
    },
}

impl Node {
    fn cover(&self) -> f64 {
        match self {
            Node::Leaf { cover, .. } | Node::Split { cover, .. } => *cover,
        }
    }
}

/// `trees.json`: the ensemble whose margin is `base_margin + Σ leaf values`.
#[derive(Debug, Clone, Deserialize)]
pub struct Trees {
    pub base_margin: f64,
    /// Feature names, in input order (checked against the schema at load).
    pub features: Vec<String>,
    pub trees: Vec<Vec<Node>>,
}

#[derive(Debug, Clone, Copy)]
struct PathElem {
    feature: Option<usize>,
    zero: f64,
    one: f64,
    weight: f64,
}

impl Trees {
    /// Parses `trees.json` and checks every child and feature index.
    pub fn parse(text: &str) -> Result<Trees, String> {
        let trees: Trees = serde_json::from_str(text).map_err(|e| e.to_string())?;
        for (t, nodes) in trees.trees.iter().enumerate() {
            for node in nodes {
                if let Node::Split { feature, yes, no, .. } = node {
                    if *feature >= trees.features.len() || *yes >= nodes.len() || *no >= nodes.len() {
                        return Err(format!("tree {t}: a node refers past its tree or the feature list"));
                    }
                }
            }
            if nodes.is_empty() {
                return Err(format!("tree {t} has no nodes"));
            }
        }
        Ok(trees)
    }

    /// The margin for `x` (the ONNX model's output, computed from the trees: the load-time
    /// check that both describe the same ensemble).
    pub fn margin(&self, x: &[f32]) -> f64 {
        self.trees.iter().map(|nodes| leaf(nodes, x)).sum::<f64>() + self.base_margin
    }

    /// The expected margin over the training data (each tree's cover-weighted mean leaf, plus
    /// the base margin): the `bias` the contributions add up from.
    pub fn bias(&self) -> f64 {
        self.trees.iter().map(|nodes| mean_value(nodes, 0)).sum::<f64>() + self.base_margin
    }

    /// Each feature's Shapley value for `x` (length = number of features), margin units.
    pub fn shap(&self, x: &[f32]) -> Vec<f64> {
        let mut phi = vec![0.0; self.features.len()];
        for nodes in &self.trees {
            recurse(nodes, x, &mut phi, 0, &[], 1.0, 1.0, None);
        }
        phi
    }
}

fn leaf(nodes: &[Node], x: &[f32]) -> f64 {
    let mut i = 0;
    loop {
        match &nodes[i] {
            Node::Leaf { leaf, .. } => return *leaf,
            Node::Split { feature, threshold, yes, no, .. } => i = if x[*feature] < *threshold { *yes } else { *no },
        }
    }
}

fn mean_value(nodes: &[Node], i: usize) -> f64 {
    match &nodes[i] {
        Node::Leaf { leaf, .. } => *leaf,
        Node::Split { yes, no, cover, .. } => {
            (nodes[*yes].cover() * mean_value(nodes, *yes) + nodes[*no].cover() * mean_value(nodes, *no)) / cover
        }
    }
}

/// Algorithm 2's RECURSE: `parent` is the unique path so far; this node is reached with the
/// given zero/one fractions through a split on `feature`.
#[allow(clippy::too_many_arguments)]
fn recurse(
    nodes: &[Node],
    x: &[f32],
    phi: &mut [f64],
    node: usize,
    parent: &[PathElem],
    zero: f64,
    one: f64,
    feature: Option<usize>,
) {
    let mut path = parent.to_vec();
    extend(&mut path, zero, one, feature);
    match &nodes[node] {
        Node::Leaf { leaf, .. } => {
            for i in 1..path.len() {
                let w = unwound_sum(&path, i);
                let e = path[i];
                if let Some(f) = e.feature {
                    phi[f] += w * (e.one - e.zero) * leaf;
                }
            }
        }
        Node::Split { feature: f, threshold, yes, no, cover, .. } => {
            let (hot, cold) = if x[*f] < *threshold { (*yes, *no) } else { (*no, *yes) };
            let (hot_zero, cold_zero) = (nodes[hot].cover() / cover, nodes[cold].cover() / cover);
            let (mut incoming_zero, mut incoming_one) = (1.0, 1.0);
            // A feature split on before: undo that split, to redo it here.
            if let Some(k) = path.iter().position(|e| e.feature == Some(*f)) {
                (incoming_zero, incoming_one) = (path[k].zero, path[k].one);
                unwind(&mut path, k);
            }
            recurse(nodes, x, phi, hot, &path, hot_zero * incoming_zero, incoming_one, Some(*f));
            recurse(nodes, x, phi, cold, &path, cold_zero * incoming_zero, 0.0, Some(*f));
        }
    }
}

/// EXTEND: adds a feature to the path, updating the permutation weights.
fn extend(path: &mut Vec<PathElem>, zero: f64, one: f64, feature: Option<usize>) {
    let d = path.len();
    path.push(PathElem { feature, zero, one, weight: if d == 0 { 1.0 } else { 0.0 } });
    let n = (d + 1) as f64;
    for i in (0..d).rev() {
        path[i + 1].weight += one * path[i].weight * (i + 1) as f64 / n;
        path[i].weight = zero * path[i].weight * (d - i) as f64 / n;
    }
}

/// UNWIND: removes element `k` from the path, undoing its EXTEND.
fn unwind(path: &mut Vec<PathElem>, k: usize) {
    let d = path.len() - 1;
    let (one, zero) = (path[k].one, path[k].zero);
    let n = (d + 1) as f64;
    let mut next = path[d].weight;
    for i in (0..d).rev() {
        if one != 0.0 {
            let tmp = path[i].weight;
            path[i].weight = next * n / ((i + 1) as f64 * one);
            next = tmp - path[i].weight * zero * (d - i) as f64 / n;
        } else {
            path[i].weight = path[i].weight * n / (zero * (d - i) as f64);
        }
    }
    for i in k..d {
        path[i].feature = path[i + 1].feature;
        path[i].zero = path[i + 1].zero;
        path[i].one = path[i + 1].one;
    }
    path.pop();
}

/// The total permutation weight of the path with element `k` unwound (without changing it).
fn unwound_sum(path: &[PathElem], k: usize) -> f64 {
    let d = path.len() - 1;
    let (one, zero) = (path[k].one, path[k].zero);
    let n = (d + 1) as f64;
    let mut next = path[d].weight;
    let mut total = 0.0;
    for i in (0..d).rev() {
        if one != 0.0 {
            let tmp = next * n / ((i + 1) as f64 * one);
            total += tmp;
            next = path[i].weight - tmp * zero * ((d - i) as f64 / n);
        } else if zero != 0.0 {
            total += (path[i].weight / zero) / ((d - i) as f64 / n);
        }
    }
    total
}
