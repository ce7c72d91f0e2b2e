//! The plugin side of the boundary: the state behind a plugin's root module,
//! the panic guard around every call, log forwarding, and the macros that
//! export a plugin.
//!
//! Authors use only the macros: [`export_plugin!`](crate::export_plugin) in a
//! plugin's `cdylib` crate, or [`declare_plugin!`](crate::declare_plugin) in a
//! library that others link in (the host's built-ins, a family base crate).

use std::any::Any;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RResult, RSlice, RVec};

use crate::abi::{
    self, EntryPoints, HostServices, LogLevel, PluginManifest, PluginRoot, PluginRootRef,
};
use crate::adapters::AdaptRequest;
use crate::architecture::{Plugin, SupportedArchitecture};
use crate::config::{ConfigRequest, GraphRequest};
use crate::error::{Error, Result};
use crate::serving::ServingRequest;

/// The entry points a plugin can be asked for, by name.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum Entry {
    Config,
    AdaptWeights,
    BuildGraph,
    Pipeline,
    ServingDefaults,
}

impl Entry {
    /// The entry points added after 1.0, reached by name through
    /// [`EntryPoints::named`].
    const NAMED: [Entry; 1] = [Entry::ServingDefaults];

    fn name(self) -> &'static str {
        match self {
            Entry::Config => "config",
            Entry::AdaptWeights => "adapt_weights",
            Entry::BuildGraph => "build_graph",
            Entry::Pipeline => "pipeline",
            Entry::ServingDefaults => "serving_defaults",
        }
    }
}

/// One plugin's state: how to define it, and the definition once loaded.
/// The export macros create one per plugin crate as a `static`.
#[doc(hidden)]
pub struct PluginRuntime {
    define: fn() -> Plugin,
    crate_name: &'static str,
    plugin: OnceLock<Plugin>,
    root: OnceLock<PluginRootRef>,
}

impl PluginRuntime {
    /// A runtime that will call `define` when the host loads the plugin.
    pub const fn new(define: fn() -> Plugin, crate_name: &'static str) -> Self {
        Self {
            define,
            crate_name,
            plugin: OnceLock::new(),
            root: OnceLock::new(),
        }
    }

    /// The plugin's root module, built once.
    pub fn root(
        &'static self,
        load: extern "C" fn(HostServices) -> RResult<PluginManifest, abi::PluginError>,
    ) -> PluginRootRef {
        *self
            .root
            .get_or_init(|| PluginRoot { load }.leak_into_prefix())
    }

    /// The body of the root module's `load`: defines the plugin (once), wires
    /// logging and panics to the host, and describes the architectures.
    pub fn load(
        &'static self,
        host: HostServices,
        entry_points: EntryPoints,
    ) -> RResult<PluginManifest, abi::PluginError> {
        if host.dynamically_loaded {
            install_panic_hook();
            forward_logs_to_host(self, host);
            if let RResult::ROk(version) =
                (host.service)("interface_version".into(), (&[][..]).into())
            {
                log::debug!(
                    "built against kiln-plugin-api {}, loaded by a host with {}",
                    abi::INTERFACE_VERSION,
                    String::from_utf8_lossy(&version)
                );
            }
        }
        guarded("load", || {
            let plugin = match self.plugin.get() {
                Some(plugin) => plugin,
                None => {
                    let defined = (self.define)();
                    let plugin = self.plugin.get_or_init(|| defined);
                    flush_early_logs();
                    plugin.validate()?;
                    plugin
                }
            };
            Ok(manifest(plugin, self.crate_name, entry_points))
        })
    }

    /// Runs an entry point reached by name ([`EntryPoints::named`]); a name
    /// this plugin's interface version does not have is `Unsupported`.
    pub fn call_named(
        &self,
        name: &str,
        architecture: u32,
        request: RSlice<'_, u8>,
    ) -> RResult<RVec<u8>, abi::PluginError> {
        match Entry::NAMED.into_iter().find(|entry| entry.name() == name) {
            Some(entry) => self.call(entry, architecture, request),
            None => RResult::RErr(
                Error::unsupported(format!(
                    "this plugin, built against kiln-plugin-api {}, has no entry point `{name}`",
                    abi::INTERFACE_VERSION
                ))
                .into(),
            ),
        }
    }

    /// Runs an architecture entry point under the panic guard.
    pub fn call(
        &self,
        entry: Entry,
        architecture: u32,
        request: RSlice<'_, u8>,
    ) -> RResult<RVec<u8>, abi::PluginError> {
        guarded(entry.name(), || {
            let plugin = self
                .plugin
                .get()
                .ok_or_else(|| Error::internal("the plugin was called before it was loaded"))?;
            let arch = usize::try_from(architecture)
                .ok()
                .and_then(|index| plugin.architectures.get(index))
                .ok_or_else(|| {
                    Error::invalid(format!("plugin has no architecture #{architecture}"))
                })?;
            dispatch(entry, arch, request.as_slice()).map(RVec::from)
        })
    }
}

fn dispatch(entry: Entry, arch: &SupportedArchitecture, request: &[u8]) -> Result<Vec<u8>> {
    let unsupported = || {
        Error::unsupported(format!(
            "architecture `{}` does not implement `{}`",
            arch.info.name,
            entry.name()
        ))
    };
    match entry {
        Entry::Config => {
            let config = arch.config.as_ref().ok_or_else(unsupported)?;
            let request: ConfigRequest = serde_json::from_slice(request)
                .map_err(|e| Error::invalid(format!("malformed config request: {e}")))?;
            let response = config(&request)?;
            serde_json::to_vec(&response)
                .map_err(|e| Error::internal(format!("cannot serialize the config: {e}")))
        }
        Entry::BuildGraph => {
            let build = arch.graph.as_ref().ok_or_else(unsupported)?;
            let request: GraphRequest = serde_json::from_slice(request)
                .map_err(|e| Error::invalid(format!("malformed graph request: {e}")))?;
            if let Some(task) = request.task.filter(|&task| !arch.builds_for(Some(task))) {
                return Err(Error::unsupported(format!(
                    "architecture `{}` ({}) cannot be run for {task}",
                    arch.info.name, arch.info.task
                )));
            }
            Ok(build(&request)?.to_bytes())
        }
        Entry::AdaptWeights => {
            let request: AdaptRequest = serde_json::from_slice(request)
                .map_err(|e| Error::invalid(format!("malformed adaptation request: {e}")))?;
            let adapter = arch
                .weight_adapters
                .iter()
                .find(|(format, _)| *format == request.format)
                .map(|(_, adapter)| adapter)
                .ok_or_else(|| {
                    Error::unsupported(format!(
                        "architecture `{}` has no weight adapter for {}",
                        arch.info.name, request.format
                    ))
                })?;
            serde_json::to_vec(&adapter(&request)?)
                .map_err(|e| Error::internal(format!("cannot serialize the adaptation: {e}")))
        }
        Entry::Pipeline => {
            let pipeline = arch.pipeline.as_deref().ok_or_else(unsupported)?;
            crate::pipeline::serve(pipeline, request)
        }
        Entry::ServingDefaults => {
            let serving = arch.serving.as_ref().ok_or_else(unsupported)?;
            let request: ServingRequest = serde_json::from_slice(request)
                .map_err(|e| Error::invalid(format!("malformed serving request: {e}")))?;
            serde_json::to_vec(&serving(&request)?)
                .map_err(|e| Error::internal(format!("cannot serialize the serving defaults: {e}")))
        }
    }
}

fn manifest(plugin: &Plugin, crate_name: &str, entry_points: EntryPoints) -> PluginManifest {
    let architectures = plugin
        .architectures
        .iter()
        .enumerate()
        .map(|(index, arch)| {
            let index = u32::try_from(index).expect("fewer than 2^32 architectures");
            arch.info.to_descriptor(index, entry_points)
        })
        .collect();
    PluginManifest {
        name: plugin.name.as_str().into(),
        version: plugin.version.as_str().into(),
        crate_name: crate_name.into(),
        architectures,
    }
}

thread_local! {
    /// Where the last panic on this thread happened, recorded by the plugin's
    /// panic hook (only installed when the plugin has its own standard library).
    static LAST_PANIC_LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs plugin code so that no panic unwinds into the host: a panic becomes a
/// [`abi::PluginErrorKind::Panicked`] error carrying its message.
fn guarded<T>(entry: &str, body: impl FnOnce() -> Result<T>) -> RResult<T, abi::PluginError> {
    LAST_PANIC_LOCATION.with(|slot| slot.borrow_mut().take());
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(error)) => RResult::RErr(error.into()),
        Err(payload) => {
            let location = LAST_PANIC_LOCATION
                .with(|slot| slot.borrow_mut().take())
                .map(|at| format!(" (at {at})"))
                .unwrap_or_default();
            RResult::RErr(abi::PluginError {
                kind: abi::PluginErrorKind::Panicked,
                message: format!("`{entry}` panicked: {}{location}", panic_message(&*payload))
                    .into(),
            })
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic payload that is not a string)")
}

/// In a dynamically loaded plugin, replaces the plugin's own panic hook (which
/// would print to stderr) with one that records where the panic happened; the
/// message reaches the host as an error.
fn install_panic_hook() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        std::panic::set_hook(Box::new(|info| {
            if let Some(location) = info.location() {
                let at = format!(
                    "{}:{}:{}",
                    location.file(),
                    location.line(),
                    location.column()
                );
                LAST_PANIC_LOCATION.with(|slot| *slot.borrow_mut() = Some(at));
            }
        }));
    });
}

/// Sends a dynamically loaded plugin's `log` records to the host, named after
/// the plugin. Records logged while the plugin defines itself (before its name
/// is known) are held back and sent right after.
struct HostLogger {
    runtime: &'static PluginRuntime,
    host: HostServices,
    early: Mutex<Vec<(LogLevel, String, String)>>,
}

impl HostLogger {
    fn send(&self, plugin: &str, level: LogLevel, target: &str, message: &str) {
        (self.host.log)(plugin.into(), level, target.into(), message.into());
    }
}

impl log::Log for HostLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        to_abi_level(metadata.level()) <= self.host.max_log_level
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = to_abi_level(record.level());
        let message = record.args().to_string();
        match self.runtime.plugin.get() {
            Some(plugin) => self.send(&plugin.name, level, record.target(), &message),
            None => lock(&self.early).push((level, record.target().to_owned(), message)),
        }
    }

    fn flush(&self) {
        if let Some(plugin) = self.runtime.plugin.get() {
            for (level, target, message) in lock(&self.early).drain(..) {
                self.send(&plugin.name, level, &target, &message);
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn forward_logs_to_host(runtime: &'static PluginRuntime, host: HostServices) {
    let logger = HostLogger {
        runtime,
        host,
        early: Mutex::new(Vec::new()),
    };
    // Fails only if this library's logger is already set (a second load of
    // the same file), in which case logs already reach the host.
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(from_abi_level(host.max_log_level));
    }
}

/// Sends the records held back while the plugin defined itself.
fn flush_early_logs() {
    log::logger().flush();
}

/// Converts a `log` level to the ABI's.
pub fn to_abi_level(level: log::Level) -> LogLevel {
    match level {
        log::Level::Error => LogLevel::Error,
        log::Level::Warn => LogLevel::Warn,
        log::Level::Info => LogLevel::Info,
        log::Level::Debug => LogLevel::Debug,
        log::Level::Trace => LogLevel::Trace,
    }
}

/// Converts the ABI's level to a `log` level filter.
pub fn from_abi_level(level: LogLevel) -> log::LevelFilter {
    match level {
        LogLevel::Off => log::LevelFilter::Off,
        LogLevel::Error => log::LevelFilter::Error,
        LogLevel::Warn => log::LevelFilter::Warn,
        LogLevel::Info => log::LevelFilter::Info,
        LogLevel::Debug => log::LevelFilter::Debug,
        LogLevel::Trace => log::LevelFilter::Trace,
    }
}

/// Defines `pub fn kiln_plugin_root() -> PluginRootRef` for the plugin that
/// `$define` (a `fn() -> Plugin`) describes, without exporting a library
/// symbol. Use it in a crate that is linked into something else: the host's
/// built-in plugins, or a family crate other plugins build on. A `cdylib` that
/// the host opens uses [`export_plugin!`](crate::export_plugin) instead.
#[macro_export]
macro_rules! declare_plugin {
    ($define:path) => {
        /// This crate's Kiln plugin root module.
        pub fn kiln_plugin_root() -> $crate::abi::PluginRootRef {
            use $crate::__private::{Entry, PluginRuntime, RResult, RSlice, RStr, RVec};
            use $crate::abi::{EntryPoints, HostServices, PluginError, PluginManifest};

            static RUNTIME: PluginRuntime = PluginRuntime::new($define, env!("CARGO_CRATE_NAME"));

            extern "C" fn load(host: HostServices) -> RResult<PluginManifest, PluginError> {
                RUNTIME.load(
                    host,
                    EntryPoints {
                        config,
                        adapt_weights,
                        build_graph,
                        pipeline,
                        named,
                    },
                )
            }
            extern "C" fn config(
                arch: u32,
                request: RSlice<'_, u8>,
            ) -> RResult<RVec<u8>, PluginError> {
                RUNTIME.call(Entry::Config, arch, request)
            }
            extern "C" fn adapt_weights(
                arch: u32,
                request: RSlice<'_, u8>,
            ) -> RResult<RVec<u8>, PluginError> {
                RUNTIME.call(Entry::AdaptWeights, arch, request)
            }
            extern "C" fn build_graph(
                arch: u32,
                request: RSlice<'_, u8>,
            ) -> RResult<RVec<u8>, PluginError> {
                RUNTIME.call(Entry::BuildGraph, arch, request)
            }
            extern "C" fn pipeline(
                arch: u32,
                request: RSlice<'_, u8>,
            ) -> RResult<RVec<u8>, PluginError> {
                RUNTIME.call(Entry::Pipeline, arch, request)
            }
            extern "C" fn named(
                arch: u32,
                name: RStr<'_>,
                request: RSlice<'_, u8>,
            ) -> RResult<RVec<u8>, PluginError> {
                RUNTIME.call_named(name.as_str(), arch, request)
            }

            RUNTIME.root(load)
        }
    };
}

/// Exports the plugin that `$define` (a `fn() -> Plugin`) describes from a
/// `cdylib`, so that `host --custom-architectures lib<name>.so` can load it.
///
/// ```ignore
/// fn plugin() -> kiln_plugin_api::Plugin { /* … */ }
/// kiln_plugin_api::export_plugin!(plugin);
/// ```
///
/// The exported symbol has a fixed name, so a crate that uses this macro must
/// not be linked into another plugin or the host: put reusable code in a
/// library crate that uses [`declare_plugin!`](crate::declare_plugin), and
/// export it from a thin `cdylib` with `export_plugin!(root = path::kiln_plugin_root)`.
#[macro_export]
macro_rules! export_plugin {
    (root = $root:path) => {
        #[doc(hidden)]
        #[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
        pub static KILN_PLUGIN_LIB_HEADER: $crate::__private::LibHeader = {
            extern "C" fn load_root_module() -> $crate::__private::RootModuleResult {
                $crate::__private::call_root_module_loader($root)
            }
            // SAFETY: the constructor returns the `PluginRootRef` named here.
            unsafe {
                $crate::__private::LibHeader::from_constructor::<$crate::abi::PluginRootRef>(
                    load_root_module,
                    $crate::__private::CheckTypeLayout::Yes,
                )
            }
        };
    };
    ($define:path) => {
        $crate::declare_plugin!($define);
        $crate::export_plugin!(root = kiln_plugin_root);
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_symbol_is_the_one_abi_stable_looks_up() {
        // `export_plugin!` spells this name out (an `export_name` must be a literal).
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }

    #[test]
    fn panics_become_errors_with_their_message() {
        let result: RResult<(), _> = guarded("config", || panic!("boom {}", 42));
        let error = result.unwrap_err();
        assert_eq!(error.kind, abi::PluginErrorKind::Panicked);
        assert!(
            error.message.starts_with("`config` panicked: boom 42"),
            "{}",
            error.message
        );

        let result: RResult<(), _> = guarded("config", || Err(Error::invalid("bad input")));
        let error = result.unwrap_err();
        assert_eq!(
            (error.kind, error.message.as_str()),
            (abi::PluginErrorKind::Invalid, "bad input")
        );
    }
}
