//! # kiln-plugin-api
//!
//! The one crate a Kiln architecture plugin depends on. A plugin *describes*
//! architectures (their names, encodings, config parsing, and later their
//! weight adapters and graphs); the host *executes* them.
//!
//! ```ignore
//! use kiln_plugin_api::{Encoding, Plugin, SupportedArchitecture, Task};
//!
//! fn plugin() -> Plugin {
//!     Plugin::new("my-arch", env!("CARGO_PKG_VERSION")).with_architecture(
//!         SupportedArchitecture::new("MyForCausalLM", Task::TextGeneration)
//!             .with_encodings(Encoding::Float32, [Encoding::Float32, Encoding::BFloat16]),
//!     )
//! }
//!
//! kiln_plugin_api::export_plugin!(plugin);
//! ```
//!
//! Log with the re-exported [`log`] crate (`kiln_plugin_api::log::info!`); the
//! records reach the host's logger with the plugin's name. A panic in plugin
//! code becomes an error the host reports; it never crosses the boundary.
//! See `docs/writing-a-plugin.md` in the Kiln repository for a walk-through.

pub mod abi;
pub mod adapters;
mod architecture;
mod config;
mod error;
mod export;
pub mod graph;
pub mod nn;
pub mod pipeline;
pub mod serving;
mod version;

pub use architecture::{
    ArchitectureInfo, ConfigFn, Encoding, GraphFn, Plugin, SupportedArchitecture, Task,
    WeightsFormat,
};
pub use config::{ArchConfig, ConfigRequest, GraphRequest, HfConfig, KvCacheParams};
pub use error::{Error, ErrorKind, Result};
pub use export::{from_abi_level, to_abi_level};
pub use log;
pub use serving::{ServingDefaults, ServingRequest};

/// Items the export macros expand to; not part of the authoring API.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::{Entry, PluginRuntime};
    pub use abi_stable::library::{
        __call_root_module_loader as call_root_module_loader, CheckTypeLayout, LibHeader,
        RootModuleResult,
    };
    pub use abi_stable::std_types::{RResult, RSlice, RStr, RVec};
}
