//! The persistent compile cache: compiled programs stored on disk, keyed by a
//! hash of the graph, the device and the compiler version, so that a second
//! start skips compilation.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_plugin_api::graph::{Device, GraphIr};
use sha2::{Digest, Sha256};

use super::{compile, CompileError, Program, COMPILER_VERSION};

/// A directory of compiled programs.
#[derive(Clone, Debug)]
pub struct CompileCache {
    dir: Option<PathBuf>,
}

/// How a program was obtained, and how long it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileOutcome {
    /// Compiled now (and stored, if the cache is enabled).
    Compiled(Duration),
    /// Read from the cache.
    Cached(Duration),
}

impl CompileCache {
    /// The default cache: `$KILN_CACHE_DIR/compile`, else
    /// `$XDG_CACHE_HOME/kiln/compile`, else `~/.cache/kiln/compile`.
    pub fn from_env() -> Self {
        let base = std::env::var_os("KILN_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("kiln")))
            .or_else(|| {
                std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("kiln"))
            });
        Self {
            dir: base.map(|b| b.join("compile")),
        }
    }

    /// A cache in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Some(dir.into()),
        }
    }

    /// Where compiled GPU kernels are cached: `kernels` beside the program
    /// cache (a temporary directory when caching is off).
    pub fn kernels_dir(&self) -> PathBuf {
        self.dir.as_deref().and_then(Path::parent).map_or_else(
            || std::env::temp_dir().join("kiln-kernels"),
            |d| d.join("kernels"),
        )
    }

    /// No caching: always compile.
    pub fn disabled() -> Self {
        Self { dir: None }
    }

    /// The cache key of a graph on a device.
    pub fn key(ir: &GraphIr, device: Device) -> String {
        let mut hasher = Sha256::new();
        hasher.update(COMPILER_VERSION.to_le_bytes());
        hasher.update(device.to_string().as_bytes());
        hasher.update(ir.to_bytes());
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(format!("{key}.json")))
    }

    /// The compiled program for `ir`: from the cache when present and
    /// readable, otherwise compiled and stored. A corrupt or unwritable cache
    /// entry is logged and ignored, never fatal.
    pub fn get_or_compile(
        &self,
        ir: &GraphIr,
        device: Device,
    ) -> Result<(Program, CompileOutcome), CompileError> {
        let start = Instant::now();
        let path = self.path(&Self::key(ir, device));
        if let Some(program) = path.as_deref().and_then(read_entry) {
            return Ok((program, CompileOutcome::Cached(start.elapsed())));
        }
        let program = compile(ir)?;
        let elapsed = start.elapsed();
        if let Some(path) = path {
            if let Err(e) = write_entry(&path, &program) {
                tracing::warn!(
                    "cannot write the compile cache entry {}: {e}",
                    path.display()
                );
            }
        }
        Ok((program, CompileOutcome::Compiled(elapsed)))
    }
}

fn read_entry(path: &Path) -> Option<Program> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(program) => Some(program),
        Err(e) => {
            tracing::warn!(
                "ignoring the unreadable compile cache entry {}: {e}",
                path.display()
            );
            None
        }
    }
}

fn write_entry(path: &Path, program: &Program) -> std::io::Result<()> {
    let dir = path.parent().expect("entries live in a directory");
    std::fs::create_dir_all(dir)?;
    // Write then rename, so a concurrent reader never sees half an entry.
    let temporary = dir.join(format!(".{}.tmp", std::process::id()));
    std::fs::write(
        &temporary,
        serde_json::to_vec(program).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(temporary, path)
}
