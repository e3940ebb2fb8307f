//! Finding (or fetching) the ONNX Runtime shared library.
//!
//! `ort` is built with `load-dynamic` (the crate's own binary download reaches a CDN that
//! these machines cannot), so the library is loaded at run time. Search order:
//! 1. the path in config (`model.onnxruntime`), 2. `ORT_DYLIB_PATH`,
//! 3. the cache (`$TIERGATE_CACHE_DIR`, else `$XDG_CACHE_HOME/tiergate`, else `~/.cache/tiergate`),
//! 4. fetched into that cache from the PyPI wheel `onnxruntime==1.32.0` with
//!    `python3 -m pip download` (the wheel ships `onnxruntime/capi/libonnxruntime.so.1.32.0`).

use ort::environment::Environment;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The ONNX Runtime release `ort` 2.0.0-rc.15 with `api-31` is built against.
pub const ORT_VERSION: &str = "1.32.0";
const LIB_NAME: &str = "libonnxruntime.so.1.32.0";

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
    let dir = cache_dir().join(format!("onnxruntime-{ORT_VERSION}"));
    let cached = dir.join(LIB_NAME);
    if cached.is_file() {
        return Ok(cached);
    }
    fetch_into(&dir).map_err(|e| {
        format!(
            "ONNX Runtime {ORT_VERSION} not found and could not be fetched ({e}). \
             Set ORT_DYLIB_PATH to a {LIB_NAME} (it ships in the PyPI wheel onnxruntime=={ORT_VERSION}, \
             under onnxruntime/capi/), or install python3 with pip so tiergate can fetch it into {}",
            dir.display()
        )
    })?;
    Ok(cached)
}

fn existing(p: &Path, source: &str) -> Result<PathBuf, String> {
    if p.is_file() {
        Ok(p.to_path_buf())
    } else {
        Err(format!("{source} points at {}, which is not a file", p.display()))
    }
}

/// Where fetched runtime files live.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TIERGATE_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("tiergate");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("tiergate")
}

/// Downloads the wheel with pip and extracts the one library file. Extraction goes to a
/// per-process temporary name and is renamed into place, so concurrent fetches (parallel
/// test binaries) never see a half-written library.
fn fetch_into(dir: &Path) -> Result<(), String> {
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
    std::fs::rename(&part, dir.join(LIB_NAME)).map_err(|e| format!("moving the library into place: {e}"))?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
