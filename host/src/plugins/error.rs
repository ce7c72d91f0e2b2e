//! Why a plugin could not be loaded, in one or two lines each.

use std::path::PathBuf;

/// `": it was built as a Rust library ..."` when `path` is a Rust library
/// archive, or names a shared library whose crate built one instead.
pub(super) fn rust_library_hint(path: &std::path::Path) -> String {
    let rlib = path.with_extension("rlib");
    if path.extension().is_some_and(|e| e == "rlib") || rlib.is_file() {
        format!(
            ": the crate was built as a Rust library ({}); set `crate-type = [\"cdylib\"]` under `[lib]` in its Cargo.toml",
            rlib.file_name().unwrap_or_default().to_string_lossy()
        )
    } else {
        String::new()
    }
}

/// A plugin path or file that could not be loaded. The `Display` text is short;
/// [`PluginLoadError::detail`] holds the long diagnostics shown with `-v`.
#[derive(Debug, thiserror::Error)]
pub enum PluginLoadError {
    /// The path does not exist (the hint names a Rust library built in its
    /// place, if there is one).
    #[error("plugin path {} does not exist{}", .0.display(), .1)]
    NotFound(PathBuf, String),

    /// The path could not be read.
    #[error("cannot read plugin path {}: {source}", path.display())]
    Unreadable {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A directory given as a plugin path holds no shared libraries.
    #[error("plugin directory {} contains no .{} files", .0.display(), std::env::consts::DLL_EXTENSION)]
    EmptyDirectory(PathBuf),

    /// The file is not a shared library at all (the hint says when it is a
    /// Rust library archive).
    #[error("{} is not a shared library{}", .0.display(), .1)]
    NotASharedLibrary(PathBuf, String),

    /// The dynamic loader refused the library (a missing dependency, wrong machine, …).
    #[error("cannot open shared library {}: {reason}", path.display())]
    OpenFailed {
        /// The library.
        path: PathBuf,
        /// What the dynamic loader said.
        reason: String,
    },

    /// A shared library without a Kiln plugin root module.
    #[error("{} is not a Kiln plugin ({reason}): end the plugin's src/lib.rs with `kiln_plugin_api::export_plugin!(plugin);` (docs/writing-a-plugin.md)", path.display())]
    NotAPlugin {
        /// The library.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },

    /// The plugin was built against another major version of kiln-plugin-api.
    #[error("{} was built against kiln-plugin-api {plugin_version}, but this host uses {host_version} and loads plugins built against {compatible}: rebuild the plugin against kiln-plugin-api {host_version}", path.display())]
    IncompatibleVersion {
        /// The library.
        path: PathBuf,
        /// The plugin's interface version.
        plugin_version: String,
        /// The host's interface version.
        host_version: String,
        /// The range of versions the host loads.
        compatible: String,
    },

    /// The plugin was built against a newer minor version than the host's.
    #[error("{} was built against kiln-plugin-api {plugin_version}, newer than this host's {host_version}: upgrade the host, or rebuild the plugin against kiln-plugin-api {host_version}", path.display())]
    NewerInterface {
        /// The library.
        path: PathBuf,
        /// The plugin's interface version.
        plugin_version: String,
        /// The host's interface version.
        host_version: String,
    },

    /// Versions agree but the layouts of the interface types differ.
    #[error("{} does not match this host's plugin interface: {summary}\n  hint: rebuild the plugin against the same kiln-plugin-api; run with -v for the full layout report", path.display())]
    LayoutMismatch {
        /// The library.
        path: PathBuf,
        /// The first lines of the layout checker's report.
        summary: String,
        /// The full report.
        detail: String,
    },

    /// The plugin's own code failed or panicked while describing itself.
    #[error("plugin {source_name} failed to load: {message}")]
    PluginFailed {
        /// Where the plugin comes from (a path, or `built-in`).
        source_name: String,
        /// The plugin's error message (a panic's message included).
        message: String,
    },

    /// The plugin described an architecture the host cannot understand.
    #[error("plugin {source_name}: architecture `{architecture}`: {message}")]
    BadDescriptor {
        /// Where the plugin comes from.
        source_name: String,
        /// The architecture.
        architecture: String,
        /// What is wrong.
        message: String,
    },

    /// Any other failure of the ABI layer.
    #[error("cannot load plugin {}: {summary}", path.display())]
    Other {
        /// The library.
        path: PathBuf,
        /// The first line of the ABI layer's message.
        summary: String,
        /// Its full message.
        detail: String,
    },
}

impl PluginLoadError {
    /// Long diagnostics behind the short message, if any (shown with `-v`).
    pub fn detail(&self) -> Option<&str> {
        match self {
            PluginLoadError::LayoutMismatch { detail, .. }
            | PluginLoadError::Other { detail, .. } => Some(detail),
            _ => None,
        }
    }
}
