//! Shared by the bench targets: the messages they run, read from `tests/data`.

use std::path::Path;

/// The `text` of every line of `tests/data/<file>` for which `keep` holds, in the file's order.
/// `benches/e2e.sh`'s sets: short = `ood_short.jsonl` under 160 bytes, long =
/// `test_sample.jsonl` over 1500. Panics if the file cannot be read (a bench without its data
/// measures nothing).
pub fn texts(file: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["text"].as_str().map(str::to_string))
        .filter(|t| keep(t))
        .collect()
}
