//! One module per `host` subcommand.

use crate::cli::{LoadArgs, RuntimeArgs};
use crate::compiler::CompileCache;
use crate::model::{self, resolve, LoadOptions, Model};
use crate::plugins::ArchitectureRegistry;

mod benchmark;
mod embed;
mod generate;
mod inspect;
mod inspect_graph;
mod list_architectures;
mod new_plugin;
mod online_benchmark;
mod precompile;
mod serve;
mod verify;

pub use benchmark::benchmark;
pub use embed::embed;
pub use generate::generate;
pub use inspect::inspect;
pub use inspect_graph::inspect_graph;
pub use list_architectures::list_architectures;
pub use new_plugin::new_plugin;
pub use precompile::{precompile, PrecompileArgs};
pub use serve::serve;
pub use verify::verify;

/// Writes a command's output; a closed pipe (`host … | head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Loads the model `args` names with its plugins and runtime options.
fn load_model(args: &LoadArgs) -> anyhow::Result<Model> {
    load_model_as(args, args.runtime.runner)
}

/// [`load_model`], run as `runner` says.
fn load_model_as(args: &LoadArgs, runner: crate::model::Runner) -> anyhow::Result<Model> {
    let LoadArgs {
        model,
        plugins,
        runtime,
    } = args;
    let options = LoadOptions {
        runner,
        ..load_options(runtime)?
    };
    anyhow::ensure!(
        options.device != crate::device::DeviceChoice::CudaNull,
        "--device cuda-null runs no kernels, so its outputs mean nothing: only `host benchmark` \
         takes it (to time the host's share of a step)"
    );
    let registry = ArchitectureRegistry::load(&plugins.custom_architectures)?;
    let resolved = resolve(
        &model.model,
        model.location.revision.as_deref(),
        model.location.weight_path.as_deref(),
    )?;
    Ok(model::load(&registry, resolved, &options)?)
}

/// How `runtime` says a model is loaded.
fn load_options(runtime: &RuntimeArgs) -> anyhow::Result<LoadOptions> {
    let device: crate::device::DeviceChoice = runtime.device.parse()?;
    let kv_cache_dtype: crate::runtime::KvCacheDtype = runtime.kv_cache_dtype.into();
    if let Some(refused) = kv_cache_dtype.unsupported_on(device.is_cuda()) {
        anyhow::bail!(refused);
    }
    let precision: crate::runtime::Precision = runtime.precision.into();
    Ok(LoadOptions {
        max_length: runtime.max_length,
        precision,
        compile_cache: if runtime.no_compile_cache {
            CompileCache::disabled()
        } else {
            CompileCache::from_env()
        },
        device,
        dtype: runtime.dtype.into(),
        enforce_eager: runtime.enforce_eager,
        kv_cache_dtype,
        attention_backend: runtime.attention_backend.into(),
        check_weights: runtime.check_weights,
        gemv_splits: Default::default(),
        dense_rows: None,
        runner: runtime.runner,
        quantization: runtime.quantization.into(),
    })
}
