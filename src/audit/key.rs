//! The HMAC key for `[audit] text = "hash"`: from `audit.key`, `audit.key_file`, the
//! environment variable `TIERGATE_AUDIT_KEY`, or generated once and kept in the data directory.

use super::config::AuditConfig;
use anyhow::{bail, Context as _};
use std::io::Write as _;
use std::path::Path;

/// The environment variable read when neither `audit.key` nor `audit.key_file` is set.
pub const KEY_ENV: &str = "TIERGATE_AUDIT_KEY";
/// The generated key's file name inside `audit.dir`.
pub const KEY_FILE: &str = "hmac.key";
/// The shortest key accepted, bytes.
pub const MIN_KEY_BYTES: usize = 16;

/// The key's bytes (the text as given, surrounding whitespace removed).
///
/// Errors name the key at fault: a key shorter than [`MIN_KEY_BYTES`], a `key_file` that cannot
/// be read, a generated key that cannot be written.
pub fn load(config: &AuditConfig) -> anyhow::Result<Vec<u8>> {
    let (key, from) = if let Some(key) = &config.key {
        (key.trim().to_string(), "`audit.key`".to_string())
    } else if let Some(path) = &config.key_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("`audit.key_file`: reading the audit HMAC key from {}", path.display()))?;
        (text.trim().to_string(), format!("`audit.key_file` {}", path.display()))
    } else if let Some(key) = std::env::var(KEY_ENV).ok().filter(|k| !k.trim().is_empty()) {
        (key.trim().to_string(), KEY_ENV.to_string())
    } else {
        let path = config.dir.join(KEY_FILE);
        (generated(&path)?, path.display().to_string())
    };
    if key.len() < MIN_KEY_BYTES {
        bail!("the audit HMAC key from {from} has {} bytes; it needs at least {MIN_KEY_BYTES}", key.len());
    }
    Ok(key.into_bytes())
}

/// The key kept at `path`, created (32 random bytes as hex, mode 0600) if there is none.
fn generated(path: &Path) -> anyhow::Result<String> {
    if path.exists() {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        return Ok(text.trim().to_string());
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for the audit HMAC key: {e}"))?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).with_context(|| format!("creating the audit HMAC key {}", path.display()))?;
    file.write_all(hex.as_bytes()).and_then(|()| file.sync_all())?;
    tracing::warn!(
        path = %path.display(),
        "generated an audit HMAC key: keep it (and back it up) to match record hashes with texts later"
    );
    Ok(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_is_kept_and_reused_and_short_keys_are_refused() {
        let dir = std::env::temp_dir().join(format!("tiergate-audit-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = AuditConfig { dir: dir.clone(), ..AuditConfig::default() };
        if std::env::var(KEY_ENV).is_err() {
            let first = load(&config).unwrap();
            assert_eq!(first.len(), 64);
            assert_eq!(load(&config).unwrap(), first, "the kept key is read back, not replaced");
        }
        let short = AuditConfig { key: Some("short".into()), ..config.clone() };
        assert!(load(&short).unwrap_err().to_string().contains("`audit.key` has 5 bytes"));
        let missing = AuditConfig { key_file: Some(dir.join("nope")), ..config };
        assert!(format!("{:#}", load(&missing).unwrap_err()).contains("`audit.key_file`"));
    }
}
