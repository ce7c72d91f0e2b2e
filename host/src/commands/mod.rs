//! One module per `host` subcommand.

mod generate;
mod inspect;
mod inspect_graph;
mod list_architectures;
mod serve;

pub use generate::generate;
pub use inspect::inspect;
pub use inspect_graph::inspect_graph;
pub use list_architectures::list_architectures;
pub use serve::serve;

/// Writes a command's output; a closed pipe (`host … | head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
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
