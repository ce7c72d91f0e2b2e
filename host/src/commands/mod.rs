//! One module per `host` subcommand.

mod inspect;
mod inspect_graph;
mod list_architectures;

pub use inspect::inspect;
pub use inspect_graph::inspect_graph;
pub use list_architectures::list_architectures;

/// Writes a command's output; a closed pipe (`host … | head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
