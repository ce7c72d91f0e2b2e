//! Architecture plugins: finding them, loading them through the stable ABI,
//! and the registry of the architectures they provide.

mod architecture;
mod builtin;
mod discovery;
mod error;
mod loader;
mod registry;

pub use architecture::{Architecture, EntryPointError, PluginSource};
pub use discovery::plugin_files;
pub use error::PluginLoadError;
pub use loader::{load_builtin_plugins, load_plugin_file, LoadedPlugin};
pub use registry::{ArchitectureRegistry, RegistryError};
