//! Opening plugin libraries and calling their root module.
//!
//! Every plugin, built-in or not, goes through the same root module: the
//! built-ins are linked in and hand over their root directly, the others are
//! opened with `abi_stable` after a pre-flight that turns the common mistakes
//! into one-line errors.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::std_types::{RResult, RSlice, RStr, RVec};
use kiln_plugin_api::abi::{
    Compatibility, HostServices, InterfaceVersion, PluginError, PluginErrorKind, PluginRootRef,
    INTERFACE_VERSION, ROOT_MODULE_NAME,
};

use super::architecture::PluginIdentity;
use super::{builtin, Architecture, PluginLoadError, PluginSource};
use crate::logging;

/// A loaded plugin and the architectures it registered.
#[derive(Debug)]
pub struct LoadedPlugin {
    /// Name, version and source.
    pub identity: Arc<PluginIdentity>,
    /// Its architectures, in the plugin's order.
    pub architectures: Vec<Architecture>,
}

/// Loads the plugins linked into the host.
pub fn load_builtin_plugins() -> Result<Vec<LoadedPlugin>, PluginLoadError> {
    builtin::roots()
        .into_iter()
        .map(|root| load_root(root, PluginSource::BuiltIn))
        .collect()
}

/// Opens a plugin library, checks that it is a Kiln plugin built against a
/// compatible interface, and loads it.
pub fn load_plugin_file(path: &Path) -> Result<LoadedPlugin, PluginLoadError> {
    check_is_shared_library(path)?;
    let header = lib_header_from_path(path).map_err(|e| open_error(path, e))?;

    let consts = header.root_mod_consts();
    if consts.name().as_str() != ROOT_MODULE_NAME {
        return Err(PluginLoadError::NotAPlugin {
            path: path.to_owned(),
            reason: format!("it is an abi_stable library for `{}`", consts.name()),
        });
    }

    check_interface_version(path, header.version_strings().version.as_str())?;

    let root = header
        .init_root_module::<PluginRootRef>()
        .map_err(|e| open_error(path, e))?;
    load_root(root, PluginSource::File(path.to_owned()))
}

/// Applies the versioning policy (see `kiln_plugin_api::abi`): the same major,
/// and a minor no newer than the host's.
fn check_interface_version(path: &Path, plugin_version: &str) -> Result<(), PluginLoadError> {
    let host_version = InterfaceVersion::current();
    let compatibility = InterfaceVersion::parse(plugin_version)
        .map_or(Compatibility::OtherMajor, |v| host_version.compare(&v));
    match compatibility {
        Compatibility::Loads => Ok(()),
        Compatibility::PluginNewer => Err(PluginLoadError::NewerInterface {
            path: path.to_owned(),
            plugin_version: plugin_version.to_owned(),
            host_version: host_version.to_string(),
        }),
        Compatibility::OtherMajor => Err(PluginLoadError::IncompatibleVersion {
            path: path.to_owned(),
            plugin_version: plugin_version.to_owned(),
            host_version: host_version.to_string(),
            compatible: host_version.compatible_range(),
        }),
    }
}

/// The services handed to a plugin's `load`.
fn host_services(source: &PluginSource) -> HostServices {
    HostServices {
        log: logging::plugin_log,
        max_log_level: logging::max_plugin_level(),
        dynamically_loaded: *source != PluginSource::BuiltIn,
        service: host_service,
    }
}

/// The host services reached by name (`HostServices::service`).
extern "C" fn host_service(
    name: RStr<'_>,
    _request: RSlice<'_, u8>,
) -> RResult<RVec<u8>, PluginError> {
    match name.as_str() {
        "interface_version" => RResult::ROk(INTERFACE_VERSION.as_bytes().to_vec().into()),
        other => RResult::RErr(PluginError {
            kind: PluginErrorKind::Unsupported,
            message: format!(
                "this host (kiln-plugin-api {INTERFACE_VERSION}) has no service `{other}`"
            )
            .into(),
        }),
    }
}

/// Calls a plugin's `load` and converts what it describes.
pub(super) fn load_root(
    root: PluginRootRef,
    source: PluginSource,
) -> Result<LoadedPlugin, PluginLoadError> {
    let manifest = root.load()(host_services(&source))
        .into_result()
        .map_err(|e| PluginLoadError::PluginFailed {
            source_name: source.to_string(),
            message: e.message.into_string(),
        })?;
    if source == PluginSource::BuiltIn {
        logging::attribute_crate_to_plugin(&manifest.crate_name, &manifest.name);
    }
    let identity = Arc::new(PluginIdentity {
        name: manifest.name.to_string(),
        version: manifest.version.to_string(),
        source,
    });
    let architectures = manifest
        .architectures
        .iter()
        .map(|descriptor| Architecture::from_descriptor(descriptor, &identity))
        .collect::<Result<Vec<_>, _>>()?;
    tracing::debug!(
        "loaded plugin `{}` {} from {} ({} architectures)",
        identity.name,
        identity.version,
        identity.source,
        architectures.len()
    );
    Ok(LoadedPlugin {
        identity,
        architectures,
    })
}

/// Rejects files that are not shared libraries before the dynamic loader sees
/// them (its messages for such files are cryptic).
fn check_is_shared_library(path: &Path) -> Result<(), PluginLoadError> {
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => {
            PluginLoadError::NotFound(path.to_owned(), super::error::rust_library_hint(path))
        }
        _ => PluginLoadError::Unreadable {
            path: path.to_owned(),
            source,
        },
    })?;
    let is_library = file.read_exact(&mut magic).is_ok()
        && (magic == *b"\x7fELF"                                    // Linux, BSD
            || magic[..2] == *b"MZ"                                 // Windows
            || matches!(u32::from_le_bytes(magic), 0xfeedfacf | 0xcafebabe)); // macOS
    if is_library {
        Ok(())
    } else {
        Err(PluginLoadError::NotASharedLibrary(
            path.to_owned(),
            super::error::rust_library_hint(path),
        ))
    }
}

/// Maps `abi_stable`'s errors (some thousands of lines long) to short ones.
fn open_error(path: &Path, error: LibraryError) -> PluginLoadError {
    let path = path.to_owned();
    match error {
        LibraryError::OpenError { err, .. } => PluginLoadError::OpenFailed {
            path,
            reason: err.to_string(),
        },
        LibraryError::GetSymbolError { .. } => PluginLoadError::NotAPlugin {
            path,
            reason: "it exports no plugin root module".to_owned(),
        },
        LibraryError::InvalidAbiHeader(found) => PluginLoadError::NotAPlugin {
            path,
            reason: format!(
                "it was built with an incompatible abi_stable (ABI header {}.{})",
                found.abi_major, found.abi_minor
            ),
        },
        LibraryError::IncompatibleVersionNumber { actual_version, .. } => {
            match check_interface_version(&path, &actual_version.to_string()) {
                Err(error) => error,
                Ok(()) => PluginLoadError::Other {
                    summary: format!("abi_stable refused interface version {actual_version}"),
                    detail: String::new(),
                    path,
                },
            }
        }
        LibraryError::AbiInstability(report) => {
            let detail = report.to_string();
            let summary = detail
                .lines()
                .filter_map(|line| line.trim().strip_prefix("Error:"))
                .map(str::trim)
                .take(3)
                .collect::<Vec<_>>()
                .join("; ");
            let summary = if summary.is_empty() {
                "the type layouts differ".to_owned()
            } else {
                summary
            };
            PluginLoadError::LayoutMismatch {
                path,
                summary,
                detail,
            }
        }
        other => {
            let detail = other.to_string();
            let summary = detail
                .lines()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("unknown error")
                .trim()
                .to_owned();
            PluginLoadError::Other {
                path,
                summary,
                detail,
            }
        }
    }
}
