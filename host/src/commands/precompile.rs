//! `host precompile`: the hand-written CUDA kernels compiled by NVRTC for
//! chosen architectures into the kernel cache, on a machine without a GPU,
//! so that a fresh GPU machine (a container image, a lent machine) loads
//! them instead of compiling them at start. Kernels generated for a model
//! are compiled when it loads, as before.

use anyhow::bail;
use clap::Args;
use kiln_kernels::cuda::cubin_cache::{self, CubinCache};
use kiln_kernels::cuda::{nvrtc, sources};

use crate::compiler::CompileCache;

/// Options of `host precompile`.
#[derive(Debug, Args)]
pub struct PrecompileArgs {
    /// A GPU architecture to compile for, as NVRTC names it (the names the
    /// CUDA backend uses for compute capabilities 8.0 to 12.x: sm_90 for an
    /// H100 or H200); repeatable.
    #[arg(long = "arch", required = true, value_parser = clap::builder::PossibleValuesParser::new(nvrtc::ARCHS))]
    pub archs: Vec<String>,
}

/// Compiles every hand-written module for each architecture into the cache
/// the CUDA backend reads (`$KILN_CACHE_DIR/kernels/nvrtc`, else under
/// `$XDG_CACHE_HOME/kiln` or `~/.cache/kiln`), one line a module.
pub fn precompile(args: &PrecompileArgs) -> anyhow::Result<()> {
    if !nvrtc::available() {
        bail!(
            "NVRTC could not be loaded: pip install nvidia-cuda-nvrtc==13.0.88 and put its \
             nvidia/cu13/lib folder on LD_LIBRARY_PATH"
        );
    }
    let (major, minor) = nvrtc::version()?;
    let dir = CompileCache::from_env().kernels_dir().join("nvrtc");
    println!("NVRTC {major}.{minor}, cache {}", dir.display());
    let mut failed = 0;
    for arch in &args.archs {
        let started = std::time::Instant::now();
        let cache = CubinCache::new(dir.clone(), arch);
        for module in cubin_cache::precompile(&cache, &sources::ALL) {
            match module.result {
                Ok(path) => {
                    let how = if module.cached { "cached" } else { "compiled" };
                    println!("{arch} {:<24} {how} {}", module.name, path.display());
                }
                Err(error) => {
                    failed += 1;
                    println!("{arch} {:<24} failed: {error}", module.name);
                }
            }
        }
        println!("{arch}: {:.1} s", started.elapsed().as_secs_f64());
    }
    if failed > 0 {
        bail!("{failed} modules did not compile");
    }
    Ok(())
}
