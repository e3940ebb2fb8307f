//! Finding (or fetching) the ONNX Runtime shared library.
//!
//! `ort` is built with `load-dynamic` (the crate's own binary download reaches a CDN that
//! these machines cannot), so the library is loaded at run time. Search order:
//! 1. the path in config (`model.onnxruntime`), 2. `ORT_DYLIB_PATH`,
//! 3. the cache (`$TIERGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/tiergate`, else `~/.cache/tiergate`),
//! 4. fetched into that cache from the PyPI wheel `onnxruntime==1.32.0` with
//!    `python3 -m pip download` (the wheel ships `onnxruntime/capi/libonnxruntime.so.1.32.0`).
//!
//! A library from the cache (3, 4) is loaded only when its sha256 equals the value pinned for
//! this platform ([`PINNED_SHA256`]): the cache is an ordinary user directory, and the library
//! runs with tiergate's privileges. Paths the operator names (1, 2) are trusted as they are.

use ort::environment::Environment;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The ONNX Runtime release `ort` 2.0.0-rc.15 with `api-31` is built against.
pub const ORT_VERSION: &str = "1.32.0";
const LIB_NAME: &str = "libonnxruntime.so.1.32.0";

/// sha256 of `libonnxruntime.so.1.32.0` as extracted from the `onnxruntime==1.32.0` wheel, per
/// `(std::env::consts::ARCH, OS)`. Source: the Dockerfile's `ORT_LIB_SHA256_AMD64` (the manylinux
/// x86_64 wheel); update both with [`ORT_VERSION`]. A platform not listed cannot use the cache:
/// tiergate refuses and asks for `ORT_DYLIB_PATH` (fail closed).
pub const PINNED_SHA256: &[(&str, &str, &str)] =
    &[("x86_64", "linux", "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f")];

static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();

/// Loads ONNX Runtime once per process and returns its environment (sessions are built from it).
/// Later calls return the first result, whatever `explicit` they pass.
///
/// Errors say exactly what to set when the library can be neither found nor fetched.
pub fn environment(explicit: Option<&Path>) -> Result<&'static Environment, String> {
    ENVIRONMENT
        .get_or_init(|| {
            let path = locate(explicit)?;
            tracing::debug!(path = %path.display(), "loading ONNX Runtime");
            ort::init_from(&path)
                .map_err(|e| format!("loading ONNX Runtime from {}: {e}", path.display()))?
                .with_name("tiergate")
                .build()
                .map_err(|e| format!("creating the ONNX Runtime environment: {e}"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn locate(explicit: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return existing(p, "model.onnxruntime in the config");
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        return existing(Path::new(&p), "ORT_DYLIB_PATH");
    }
    let Some(pinned) = pinned_sha256(std::env::consts::ARCH, std::env::consts::OS) else {
        return Err(format!(
            "no sha256 of ONNX Runtime {ORT_VERSION} is pinned for {}-{}, so tiergate will not fetch or load one \
             from its cache; set ORT_DYLIB_PATH to a {LIB_NAME} you trust (or model.onnxruntime in the config)",
            std::env::consts::ARCH,
            std::env::consts::OS
        ));
    };
    let dir = cache_dir()?.join(format!("onnxruntime-{ORT_VERSION}"));
    let cached = dir.join(LIB_NAME);
    if cached.is_file() {
        // Checked on every start, not once at download: the cache is writable by whoever runs
        // tiergate, and hashing the library (~35 MB) costs well under a second once per process.
        verify_library(&cached, pinned)?;
        return Ok(cached);
    }
    fetch_into(&dir, pinned).map_err(|e| {
        format!(
            "ONNX Runtime {ORT_VERSION} not found and could not be fetched ({e}). \
             Set ORT_DYLIB_PATH to a {LIB_NAME} (it ships in the PyPI wheel onnxruntime=={ORT_VERSION}, \
             under onnxruntime/capi/), or install python3 with pip so tiergate can fetch it into {}",
            dir.display()
        )
    })?;
    Ok(cached)
}

/// The pinned sha256 of the library for a platform (`std::env::consts::{ARCH, OS}`).
fn pinned_sha256(arch: &str, os: &str) -> Option<&'static str> {
    PINNED_SHA256.iter().find(|(a, o, _)| *a == arch && *o == os).map(|(_, _, sha)| *sha)
}

/// Errors unless the sha256 of the file at `path` is `expected` (lower-case hex); the error
/// names the file, both digests and the way out (`ORT_DYLIB_PATH`).
pub fn verify_library(path: &Path, expected: &str) -> Result<(), String> {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let actual = format!("{:x}", Sha256::digest(&bytes));
    if actual == expected {
        return Ok(());
    }
    Err(format!(
        "refusing to load ONNX Runtime from {}: its sha256 is {actual}, but tiergate pins {expected} for \
         {LIB_NAME} from the onnxruntime=={ORT_VERSION} wheel. Delete the file to fetch it again, or set \
         ORT_DYLIB_PATH to a library you trust",
        path.display()
    ))
}

fn existing(p: &Path, source: &str) -> Result<PathBuf, String> {
    if p.is_file() {
        Ok(p.to_path_buf())
    } else {
        Err(format!("{source} points at {}, which is not a file", p.display()))
    }
}

/// Where fetched runtime files live: `$TIERGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/tiergate`,
/// else `$HOME/.cache/tiergate` (empty values count as unset).
///
/// Errors when none is set, rather than falling back to a shared temporary directory, where
/// another user could plant the library tiergate then loads.
pub fn cache_dir() -> Result<PathBuf, String> {
    cache_dir_from(|name| std::env::var_os(name))
}

fn cache_dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf, String> {
    let var = |name| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("TIERGATE_CACHE_DIR") {
        return Ok(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Ok(d.join("tiergate"));
    }
    match var("HOME") {
        Some(home) => Ok(home.join(".cache").join("tiergate")),
        None => Err("no cache directory for ONNX Runtime: HOME, XDG_CACHE_HOME and TIERGATE_CACHE_DIR are all \
                     unset; set one of them, or set ORT_DYLIB_PATH to the library"
            .into()),
    }
}

/// Downloads the wheel with pip and extracts the one library file. Extraction goes to a
/// per-process temporary name and is renamed into place, so concurrent fetches (parallel
/// test binaries) never see a half-written library.
fn fetch_into(dir: &Path, pinned: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let tmp = dir.join(format!(".download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    tracing::info!(version = ORT_VERSION, dir = %dir.display(), "fetching ONNX Runtime from the PyPI wheel");
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"])
        .arg(format!("onnxruntime=={ORT_VERSION}"))
        .arg("-d")
        .arg(&tmp)
        .status()
        .map_err(|e| format!("running python3 -m pip: {e}"))?;
    if !status.success() {
        return Err(format!("pip download exited with {status}"));
    }
    // Python's zipfile is always there when pip is; it spares us a zip dependency.
    let script = format!(
        "import glob,sys,zipfile\n\
         w=glob.glob(sys.argv[1]+'/onnxruntime-*.whl')[0]\n\
         z=zipfile.ZipFile(w)\n\
         n=[m for m in z.namelist() if m.endswith('/{LIB_NAME}')][0]\n\
         open(sys.argv[2],'wb').write(z.read(n))\n"
    );
    let part = tmp.join(LIB_NAME);
    let status = Command::new("python3")
        .args(["-c", &script])
        .arg(&tmp)
        .arg(&part)
        .status()
        .map_err(|e| format!("running python3: {e}"))?;
    if !status.success() {
        return Err(format!("extracting {LIB_NAME} from the wheel failed ({status})"));
    }
    // Checked before the rename: a library that fails the check never enters the cache.
    if let Err(e) = verify_library(&part, pinned) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    std::fs::rename(&part, dir.join(LIB_NAME)).map_err(|e| format!("moving the library into place: {e}"))?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_is_loaded_only_with_the_pinned_sha256() {
        let path = std::env::temp_dir().join(format!("tiergate-ortlib-{}.so", std::process::id()));
        std::fs::write(&path, b"not really a library").unwrap();
        let wrong = "0".repeat(64);
        let actual = {
            use sha2::{Digest, Sha256};
            format!("{:x}", Sha256::digest(b"not really a library"))
        };
        assert!(verify_library(&path, &actual).is_ok());
        let err = verify_library(&path, &wrong).unwrap_err();
        assert!(err.contains(&actual) && err.contains(&wrong), "{err}");
        assert!(err.contains(&path.display().to_string()) && err.contains("ORT_DYLIB_PATH"), "{err}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn the_dockerfile_pin_is_the_one_checked_and_other_platforms_fail_closed() {
        let dockerfile = include_str!("../Dockerfile");
        let pinned = pinned_sha256("x86_64", "linux").unwrap();
        assert!(dockerfile.contains(&format!("ORT_LIB_SHA256_AMD64={pinned}")));
        assert_eq!(pinned_sha256("riscv64", "linux"), None);
    }

    #[test]
    fn no_home_no_cache_directory() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).into())
        };
        assert_eq!(cache_dir_from(env(&[("HOME", "/h")])).unwrap(), PathBuf::from("/h/.cache/tiergate"));
        assert_eq!(
            cache_dir_from(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")])).unwrap(),
            PathBuf::from("/x/tiergate")
        );
        let err = cache_dir_from(env(&[("HOME", "")])).unwrap_err();
        assert!(err.contains("HOME") && err.contains("XDG_CACHE_HOME"), "{err}");
    }
}
