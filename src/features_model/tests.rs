use super::schema::{FeatureError, Schema};
use super::shap::{Node, Trees};
use serde_json::json;

/// Two trees over three features, with covers that add up as a training set's would.
fn trees() -> Trees {
    let split = |feature, threshold, yes, no, cover| Node::Split { feature, threshold, yes, no, missing: yes, cover };
    let leaf = |leaf, cover| Node::Leaf { leaf, cover };
    Trees {
        base_margin: -1.5,
        features: vec!["a".into(), "b".into(), "c".into()],
        trees: vec![
            // a < 0.5 ? (b < 2 ? 0.3 : -0.2) : (a < 3 ? 1.1 : (c < 1 ? 0.4 : 2.0))
            vec![
                split(0, 0.5, 1, 2, 100.0),
                split(1, 2.0, 3, 4, 60.0),
                split(0, 3.0, 5, 6, 40.0),
                leaf(0.3, 45.0),
                leaf(-0.2, 15.0),
                leaf(1.1, 25.0),
                split(2, 1.0, 7, 8, 15.0),
                leaf(0.4, 5.0),
                leaf(2.0, 10.0),
            ],
            // c < 1 ? -0.5 : (b < 2 ? 0.1 : 0.9)
            vec![
                split(2, 1.0, 1, 2, 100.0),
                leaf(-0.5, 30.0),
                split(1, 2.0, 3, 4, 70.0),
                leaf(0.1, 50.0),
                leaf(0.9, 20.0),
            ],
        ],
    }
}

/// E[f(x) | x_S] as TreeSHAP defines it: splits on a feature in `known` follow `x`, others
/// average their children weighted by cover.
fn expectation(nodes: &[Node], i: usize, x: &[f32], known: &[bool]) -> f64 {
    match &nodes[i] {
        Node::Leaf { leaf, .. } => *leaf,
        Node::Split { feature, threshold, yes, no, cover, .. } => {
            if known[*feature] {
                expectation(nodes, if x[*feature] < *threshold { *yes } else { *no }, x, known)
            } else {
                let c = |n: usize| match &nodes[n] {
                    Node::Leaf { cover, .. } | Node::Split { cover, .. } => *cover,
                };
                (c(*yes) * expectation(nodes, *yes, x, known) + c(*no) * expectation(nodes, *no, x, known)) / cover
            }
        }
    }
}

/// Shapley values by their definition: every subset, weighted |S|!(n-|S|-1)!/n!.
fn brute_force(t: &Trees, x: &[f32]) -> Vec<f64> {
    let n = x.len();
    let fact = |k: usize| (1..=k).product::<usize>() as f64;
    let v = |mask: usize| -> f64 {
        let known: Vec<bool> = (0..n).map(|j| mask & (1 << j) != 0).collect();
        t.trees.iter().map(|nodes| expectation(nodes, 0, x, &known)).sum()
    };
    (0..n)
        .map(|i| {
            (0..1usize << n)
                .filter(|m| m & (1 << i) == 0)
                .map(|m| {
                    let s = m.count_ones() as usize;
                    fact(s) * fact(n - s - 1) / fact(n) * (v(m | 1 << i) - v(m))
                })
                .sum()
        })
        .collect()
}

#[test]
fn tree_shap_equals_the_shapley_values_by_definition_and_adds_up_to_the_margin() {
    let t = trees();
    for x in [[0.0f32, 0.0, 0.0], [4.0, 1.0, 2.0], [1.0, 3.0, 0.5], [5.0, 5.0, 5.0], [0.2, 2.0, 1.0]] {
        let phi = t.shap(&x);
        let exact = brute_force(&t, &x);
        for (a, b) in phi.iter().zip(&exact) {
            assert!((a - b).abs() < 1e-9, "x {x:?}: TreeSHAP {phi:?}, by definition {exact:?}");
        }
        let sum = t.bias() + phi.iter().sum::<f64>();
        assert!((sum - t.margin(&x)).abs() < 1e-9, "local accuracy: {sum} vs {}", t.margin(&x));
    }
}

#[test]
fn trees_that_point_past_their_nodes_are_refused() {
    let bad = r#"{"base_margin":0,"features":["a"],"trees":[[{"feature":0,"threshold":1,"yes":1,"no":5,"missing":1,"cover":2},{"leaf":1,"cover":1}]]}"#;
    assert!(Trees::parse(bad).unwrap_err().contains("tree 0"));
}

const SCHEMA: &str = r#"
[[feature]]
name = "amount"
kind = "number"
unit = "currency units"
required = true

[[feature]]
name = "night"
kind = "bool"
required = true

[[feature]]
name = "distance_km"
kind = "number"
missing = 12.5
standardize = { mean = 10.0, std = 5.0 }
"#;

#[test]
fn the_schema_reads_numbers_bools_missing_values_and_standardises() {
    let s = Schema::parse(SCHEMA).unwrap();
    let row = |v: serde_json::Value| s.vector(v.as_object().unwrap());
    assert_eq!(row(json!({"amount": 20, "night": true, "distance_km": 20})), Ok(vec![20.0, 1.0, 2.0]));
    assert_eq!(row(json!({"amount": 20.5, "night": 0})), Ok(vec![20.5, 0.0, 0.5]), "missing: 12.5, standardised");
    assert_eq!(s.baseline(), vec![0.0, 0.0, 0.5]);
    assert!(s.applies(json!({"amount": 1}).as_object().unwrap()));
    assert!(!s.applies(json!({"country": "FR"}).as_object().unwrap()), "none of its features: not scored");
}

#[test]
fn the_schema_names_what_is_missing_or_unusable() {
    let s = Schema::parse(SCHEMA).unwrap();
    let row = |v: serde_json::Value| s.vector(v.as_object().unwrap());
    assert_eq!(row(json!({"distance_km": 3})), Err(FeatureError::Missing(vec!["amount".into(), "night".into()])));
    assert_eq!(row(json!({"amount": null, "night": true})), Err(FeatureError::Missing(vec!["amount".into()])));
    for (bad, name) in [
        (json!({"amount": "12", "night": true}), "amount"),
        (json!({"amount": 1e39, "night": true}), "amount"),
        (json!({"amount": 1, "night": 2}), "night"),
        (json!({"amount": 1, "night": "yes"}), "night"),
    ] {
        match row(bad.clone()) {
            Err(FeatureError::Invalid { name: n, message }) => assert_eq!(n, name, "{bad}: {message}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn schema_problems_name_the_feature() {
    let twice = "[[feature]]\nname = \"a\"\nkind = \"number\"\nrequired = true\n".repeat(2);
    assert!(Schema::parse(&twice).unwrap_err().contains("`a` is declared twice"));
    let optional = "[[feature]]\nname = \"b\"\nkind = \"number\"\n";
    assert!(Schema::parse(optional).unwrap_err().contains("`b`: an optional feature needs a finite `missing`"));
    let std0 =
        "[[feature]]\nname = \"c\"\nkind = \"number\"\nrequired = true\nstandardize = { mean = 0.0, std = 0.0 }\n";
    assert!(Schema::parse(std0).unwrap_err().contains("`c`: standardize"));
    assert!(Schema::parse("[[feature]]\nname = \"d\"\nkind = \"text\"\nrequired = true\n").is_err());
}
