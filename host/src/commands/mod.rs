//! One module per `host` subcommand.

use crate::cli::{ModelArgs, PluginArgs, RuntimeArgs};
use crate::compiler::CompileCache;
use crate::model::{self, resolve, LoadOptions, Model};
use crate::plugins::ArchitectureRegistry;

mod generate;
mod inspect;
mod inspect_graph;
mod list_architectures;
mod serve;
mod verify;

pub use generate::generate;
pub use inspect::inspect;
pub use inspect_graph::inspect_graph;
pub use list_architectures::list_architectures;
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

/// Loads the model that `model` names with the plugins and runtime options given.
fn load_model(
    model: &ModelArgs,
    plugins: &PluginArgs,
    runtime: &RuntimeArgs,
) -> anyhow::Result<Model> {
    check_device(&runtime.device)?;
    let registry = ArchitectureRegistry::load(&plugins.custom_architectures)?;
    let resolved = resolve(
        &model.model,
        model.location.revision.as_deref(),
        model.location.weight_path.as_deref(),
    )?;
    let options = LoadOptions {
        max_length: runtime.max_length,
        precision: runtime.precision.into(),
        compile_cache: if runtime.no_compile_cache {
            CompileCache::disabled()
        } else {
            CompileCache::from_env()
        },
    };
    Ok(model::load(&registry, resolved, &options)?)
}

/// Accepts `cpu`; a GPU is refused in one clear line (the CUDA backend is
/// not part of this build yet).
fn check_device(device: &str) -> anyhow::Result<()> {
    match device {
        "cpu" => Ok(()),
        gpu if gpu == "gpu" || gpu.starts_with("gpu:") => {
            anyhow::bail!("--device {gpu}: this build has no GPU backend yet; use --device cpu")
        }
        other => anyhow::bail!("--device {other}: expected cpu, gpu or gpu:N"),
    }
}
