//! `MANIFEST.sha256`: the sha256 of every file of a model directory that the loader reads, in
//! the format `sha256sum` writes and `sha256sum -c` checks (`<64 hex>  <file>` per line; a `*`
//! before the name, binary mode, is accepted).
//!
//! Why: `model.json` pins only the ONNX file's digest, but the tokenizer, the temperature
//! (`calibration.json`) and the OOD data (`ood.json`) change verdicts as much as the weights do:
//! a changed temperature silently moves every confidence across the cascade's thresholds. The
//! manifest is written by `models/recipe/build.sh` and updated by `tiergate calibrate --write`.

use anyhow::{bail, Context as _};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// The manifest's file name inside a model directory.
pub const MANIFEST: &str = "MANIFEST.sha256";

/// A model directory whose listed files all matched their digests.
#[derive(Debug, Clone)]
pub struct Verified {
    /// sha256 (lower-case hex) of `MANIFEST.sha256` itself: one digest that names every file.
    pub manifest_sha256: String,
    /// File name → its sha256 (lower-case hex), as listed and as read.
    pub files: BTreeMap<String, String>,
}

impl Verified {
    /// Errors unless every one of `needed` is listed: a file the loader reads but the manifest
    /// does not pin could be changed without anyone noticing.
    pub fn require(&self, dir: &Path, needed: &[&str]) -> anyhow::Result<()> {
        for name in needed {
            if !self.files.contains_key(*name) {
                bail!(
                    "{}: the model reads {name}, but the manifest does not list it; add its line \
                     (`sha256sum {name} >> {MANIFEST}` in the model directory)",
                    dir.join(MANIFEST).display()
                );
            }
        }
        Ok(())
    }
}

/// The sha256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Parses a manifest: `(file, digest)` pairs in file order. Errors name the line.
fn parse(path: &Path, text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let parsed = line.split_once(' ').and_then(|(hex, rest)| {
            let name = rest.strip_prefix(' ').or_else(|| rest.strip_prefix('*'))?;
            let ok = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && !name.is_empty();
            ok.then(|| (name.to_string(), hex.to_ascii_lowercase()))
        });
        let Some((name, hex)) = parsed else {
            bail!("{}:{}: expected `<64 hex digits>  <file>` (sha256sum format), got {line:?}", path.display(), i + 1);
        };
        if name.contains('/') || name == "." || name == ".." {
            bail!("{}:{}: {name:?}: only plain file names in the model directory may be listed", path.display(), i + 1);
        }
        entries.push((name, hex));
    }
    Ok(entries)
}

/// Reads `dir/MANIFEST.sha256` and checks every listed file against its digest.
///
/// Errors: the manifest missing or malformed; a listed file missing; a file whose sha256
/// differs (the error names the file, the expected and the actual digest).
pub fn verify(dir: &Path) -> anyhow::Result<Verified> {
    let path = dir.join(MANIFEST);
    let bytes = std::fs::read(&path).with_context(|| {
        format!("reading {}: every model directory needs one (see models/recipe/build.sh)", path.display())
    })?;
    let text = std::str::from_utf8(&bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
    let mut files = BTreeMap::new();
    for (name, expected) in parse(&path, text)? {
        let file = dir.join(&name);
        let content =
            std::fs::read(&file).with_context(|| format!("reading {} (listed in {MANIFEST})", file.display()))?;
        let actual = sha256_hex(&content);
        if actual != expected {
            bail!(
                "model file {} has sha256 {actual}, but {} expects {expected}: the file was changed after the \
                 manifest was written (refit with `tiergate calibrate --write`, or rebuild with models/recipe)",
                file.display(),
                path.display()
            );
        }
        files.insert(name, actual);
    }
    Ok(Verified { manifest_sha256: sha256_hex(&bytes), files })
}

/// Sets `file`'s line in the manifest beside it (appending one if it is not listed) to the
/// sha256 of its current content. Returns `false`, changing nothing, when the directory has no
/// manifest. The manifest is replaced by a rename, so a link to another copy is never written
/// through and a reader never sees half a file.
pub fn record(file: &Path) -> anyhow::Result<bool> {
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = file.file_name().and_then(|n| n.to_str()).context("the file needs a UTF-8 name")?;
    let path = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let digest = sha256_hex(&std::fs::read(file).with_context(|| format!("reading {}", file.display()))?);
    let mut entries = parse(&path, &text)?;
    match entries.iter_mut().find(|(n, _)| n == name) {
        Some(entry) => entry.1 = digest,
        None => entries.push((name.to_string(), digest)),
    }
    let out: String = entries.iter().map(|(n, d)| format!("{d}  {n}\n")).collect();
    let tmp = dir.join(format!(".{MANIFEST}.{}", std::process::id()));
    std::fs::write(&tmp, out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("tiergate-manifest-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn parses_sha256sum_lines_and_refuses_others() {
        let p = Path::new("M");
        let ok = format!("{}  a.json\n{} *b.onnx\n", "A".repeat(64), "0".repeat(64));
        let entries = parse(p, &ok).unwrap();
        assert_eq!(entries, vec![("a.json".into(), "a".repeat(64)), ("b.onnx".into(), "0".repeat(64))]);
        for bad in ["abc  a.json", &format!("{}  ../x", "0".repeat(64)), &format!("{}a.json", "0".repeat(64))] {
            assert!(parse(p, bad).unwrap_err().to_string().contains("M:1"), "{bad}");
        }
    }

    #[test]
    fn record_updates_a_line_and_verify_then_passes() {
        let dir = temp_dir("record");
        std::fs::write(dir.join("calibration.json"), "{\"temperature\": 1.5}").unwrap();
        std::fs::write(dir.join("x"), "x").unwrap();
        let listed = format!("{}  calibration.json\n{}  x\n", sha256_hex(b"old"), sha256_hex(b"x"));
        std::fs::write(dir.join(MANIFEST), listed).unwrap();
        let err = verify(&dir).unwrap_err().to_string();
        assert!(err.contains("calibration.json") && err.contains(&sha256_hex(b"old")), "{err}");
        assert!(record(&dir.join("calibration.json")).unwrap());
        let verified = verify(&dir).unwrap();
        assert_eq!(verified.files["calibration.json"], sha256_hex(b"{\"temperature\": 1.5}"));
        assert!(verified.require(&dir, &["calibration.json", "x"]).is_ok());
        assert!(verified.require(&dir, &["ood.json"]).unwrap_err().to_string().contains("ood.json"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn record_without_a_manifest_changes_nothing() {
        let dir = temp_dir("none");
        std::fs::write(dir.join("calibration.json"), "{}").unwrap();
        assert!(!record(&dir.join("calibration.json")).unwrap());
        assert!(!dir.join(MANIFEST).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
