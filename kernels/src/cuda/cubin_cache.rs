//! The disk cache of NVRTC's cubins: the real device reads a module's image
//! from it or compiles and stores it, and [`precompile`] fills it for an
//! architecture on a machine with NVRTC and no GPU, so a fresh GPU machine
//! (a container image, a lent machine) starts without compiling the
//! hand-written kernels.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::device::{compile_side_by_side, DeviceError, DeviceResult};
use super::nvrtc;
use super::sources::{self, Source};

/// Compiled modules of one architecture: `<dir>/<key>.cubin`, the key a hash
/// of what NVRTC compiles (the source with its headers inlined, the options,
/// the architecture and NVRTC's version).
#[derive(Clone, Debug)]
pub struct CubinCache {
    dir: PathBuf,
    arch: String,
}

impl CubinCache {
    /// The cache in `dir` of cubins for `arch` (`sm_90` etc.).
    pub fn new(dir: PathBuf, arch: &str) -> Self {
        Self {
            dir,
            arch: arch.to_owned(),
        }
    }

    /// Where the cache keeps the cubin of module `name`.
    pub fn path(&self, name: &str, source: &str) -> DeviceResult<PathBuf> {
        let (major, minor) = nvrtc::version()?;
        let mut hasher = Sha256::new();
        hasher.update(sources::inline_common_header(name, source).as_bytes());
        for option in nvrtc::OPTIONS {
            hasher.update(option.as_bytes());
        }
        hasher.update(self.arch.as_bytes());
        hasher.update(format!("nvrtc {major}.{minor}").as_bytes());
        let key: String = hasher.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(self.dir.join(format!("{key}.cubin")))
    }

    /// The cubin at `path` (the module's, [`CubinCache::path`]), else
    /// compiled by NVRTC and stored (a warm start compiles nothing).
    pub fn image(&self, path: &Path, name: &str, source: &str) -> DeviceResult<Vec<u8>> {
        if let Ok(image) = std::fs::read(path) {
            return Ok(image);
        }
        let image = nvrtc::compile(name, source, &self.arch, false)?.image;
        // The cache is an optimization: a failure to store is not an error.
        // Unique per process and call: two threads may compile one source.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = path.with_extension(format!("{}.{n}.tmp", std::process::id()));
        if std::fs::create_dir_all(&self.dir).is_ok() && std::fs::write(&partial, &image).is_ok() {
            let _ = std::fs::rename(&partial, path);
        }
        Ok(image)
    }
}

/// What [`precompile`] did with one module.
#[derive(Debug)]
pub struct Precompiled {
    /// The source's file name.
    pub name: &'static str,
    /// Its cubin was in the cache already.
    pub cached: bool,
    /// Where the cubin is, or why it could not be made.
    pub result: Result<PathBuf, DeviceError>,
}

/// Compiles `modules` (hand-written sources, [`sources::ALL`] for all) into
/// `cache` for its architecture, several at a time, skipping those it
/// holds; each module's outcome in the order of `modules`.
pub fn precompile(cache: &CubinCache, modules: &[Source]) -> Vec<Precompiled> {
    let outcomes: Vec<Mutex<Option<Precompiled>>> =
        modules.iter().map(|_| Mutex::new(None)).collect();
    let texts: Vec<(&str, &str)> = modules.iter().map(|s| (s.name, s.text)).collect();
    compile_side_by_side(&texts, |name, source| {
        let Some(index) = modules.iter().position(|s| s.name == name) else {
            return;
        };
        let path = cache.path(name, source);
        let cached = path.as_ref().is_ok_and(|p| p.exists());
        let result = match path {
            Ok(p) if !cached => cache.image(&p, name, source).map(|_| p),
            other => other,
        };
        let outcome = Precompiled {
            name: modules[index].name,
            cached,
            result,
        };
        *outcomes[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    });
    outcomes
        .into_iter()
        .filter_map(|o| o.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect()
}
