//! The candidate policy directory `tiergate tune` writes: a copy of the live one in which only the
//! tuned values change, edited with `toml_edit` so that every comment and the layout stay, and
//! the unified diff (`similar`) of what changed.

use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use toml_edit::{DocumentMut, TableLike, Value};

/// One value to set: `key` in the table at `table` (`["actions"]`, `["scenarios", "payments"]`,
/// `["calibration"]`), to `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub table: Vec<String>,
    pub key: &'static str,
    pub value: f64,
}

/// The file a new `[calibration]` section goes into when no policy file has one.
const NEW_CALIBRATION: &str = "calibration.toml";

/// Copies `live` (its regular files) into `out`, which must not exist or be empty, with
/// `changes` applied to the policy files that define their tables; returns the unified diff of
/// every file that changed (a new `calibration.toml` against nothing). `comment` heads a new
/// section's file.
///
/// Errors: `out` holds files; a table no policy file defines (other than `[calibration]`, which
/// is then written into a new `calibration.toml`); unreadable or unwritable files.
pub fn candidate(live: &Path, out: &Path, changes: &[Change], comment: &str) -> anyhow::Result<String> {
    if out.read_dir().is_ok_and(|mut entries| entries.next().is_some()) {
        bail!("--out {} is not empty: the candidate is written into a new directory", out.display());
    }
    let mut files = read_dir(live)?;
    let mut docs: Vec<Option<DocumentMut>> = files
        .iter()
        .map(|(name, text)| name.ends_with(".toml").then(|| text.parse::<DocumentMut>().ok()).flatten())
        .collect();
    for change in changes {
        let path: Vec<&str> = change.table.iter().map(String::as_str).collect();
        let at = docs.iter().position(|d| d.as_ref().is_some_and(|d| table(d.as_table(), &path).is_some()));
        let at = match at {
            Some(at) => at,
            None if path == ["calibration"] => {
                anyhow::ensure!(
                    !files.iter().any(|(name, _)| name == NEW_CALIBRATION),
                    "{NEW_CALIBRATION} exists but defines no [calibration]"
                );
                files.push((NEW_CALIBRATION.into(), String::new()));
                docs.push(Some(format!("{comment}[calibration]\n").parse()?));
                docs.len() - 1
            }
            None => bail!("no policy file in {} defines [{}]", live.display(), path.join(".")),
        };
        let doc = docs[at].as_mut().expect("found above");
        let t = table_mut(doc.as_table_mut(), &path).expect("found above");
        set(t, change.key, change.value);
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut diff = String::new();
    for ((name, before), doc) in files.iter().zip(&docs) {
        let after = doc.as_ref().map_or_else(|| before.clone(), DocumentMut::to_string);
        if &after != before {
            let text = similar::TextDiff::from_lines(before.as_str(), after.as_str());
            let (a, b) = (live.join(name), out.join(name));
            diff += &text.unified_diff().header(&a.display().to_string(), &b.display().to_string()).to_string();
        }
        let path = out.join(name);
        std::fs::write(&path, &after).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(diff)
}

/// The regular files of `dir` (file name, text), by name. Policy files are text; another file
/// that is not UTF-8 is refused rather than copied half.
fn read_dir(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the policy directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).context("a file name that is not UTF-8")?.to_string();
            let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            Ok((name, text))
        })
        .collect()
}

fn table<'a>(root: &'a dyn TableLike, path: &[&str]) -> Option<&'a dyn TableLike> {
    match path.split_first() {
        None => Some(root),
        Some((first, rest)) => table(root.get(first)?.as_table_like()?, rest),
    }
}

fn table_mut<'a>(root: &'a mut dyn TableLike, path: &[&str]) -> Option<&'a mut dyn TableLike> {
    match path.split_first() {
        None => Some(root),
        Some((first, rest)) => table_mut(root.get_mut(first)?.as_table_like_mut()?, rest),
    }
}

/// Sets `key` to `value`, keeping the old value's surroundings (a trailing comment, the spacing);
/// the key itself, and the comment lines above it, are not touched; an equal value is left as
/// written.
fn set(t: &mut dyn TableLike, key: &str, value: f64) {
    let mut new = Value::from(value);
    match t.get_mut(key).and_then(|item| item.as_value_mut()) {
        // The same number stays as written (`0.30` is not rewritten as `0.3`).
        Some(old) if old.as_float().or(old.as_integer().map(|i| i as f64)) == Some(value) => {}
        Some(old) => {
            *new.decor_mut() = old.decor().clone();
            *old = new;
        }
        None => {
            t.insert(key, toml_edit::Item::Value(new));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tiergate-tune-write-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (n, t) in files {
            std::fs::write(d.join(n), t).unwrap();
        }
        d
    }

    #[test]
    fn only_the_tuned_values_change_and_comments_stay() {
        let routing = "# How scores become actions.\n[actions]\n# review from here\nreview_at = 0.3   # a person looks\nblock_at = 0.8\n";
        let scenarios = "[scenarios.payments]\ndescription = \"p\"\nblock_at = 0.82 # earlier\n[scenarios.chat]\n";
        let live = dir("live", &[("routing.toml", routing), ("scenarios.toml", scenarios), ("README", "x")]);
        let out = live.with_extension("out");
        let _ = std::fs::remove_dir_all(&out);
        let change =
            |table: &[&str], key, value| Change { table: table.iter().map(|s| s.to_string()).collect(), key, value };
        let changes = [
            change(&["actions"], "block_at", 0.57),
            change(&["scenarios", "payments"], "block_at", 0.6),
            change(&["scenarios", "chat"], "review_at", 0.4),
            change(&["calibration"], "cpu_temperature", 1.62),
        ];
        let diff = candidate(&live, &out, &changes, "# fitted\n").unwrap();
        let read = |n: &str| std::fs::read_to_string(out.join(n)).unwrap();
        assert_eq!(read("routing.toml"), routing.replace("block_at = 0.8", "block_at = 0.57"));
        assert_eq!(
            read("scenarios.toml"),
            "[scenarios.payments]\ndescription = \"p\"\nblock_at = 0.6 # earlier\n[scenarios.chat]\nreview_at = 0.4\n"
        );
        assert_eq!(read("calibration.toml"), "# fitted\n[calibration]\ncpu_temperature = 1.62\n");
        assert_eq!(read("README"), "x");
        assert!(diff.contains("-block_at = 0.8\n+block_at = 0.57\n"), "{diff}");
        assert!(diff.contains("+cpu_temperature = 1.62"), "{diff}");
        assert!(candidate(&live, &out, &changes, "").unwrap_err().to_string().contains("is not empty"));
        let missing =
            candidate(&live, &live.with_extension("x"), &[change(&["scenarios", "nope"], "block_at", 0.5)], "");
        assert!(missing.unwrap_err().to_string().contains("defines [scenarios.nope]"));
    }
}
