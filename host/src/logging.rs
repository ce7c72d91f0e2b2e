//! The host's logger, and the two ways plugin log records reach it: the
//! `HostServices::log` callback for plugins opened from shared libraries (they
//! have their own copy of the `log` crate), and a `log` bridge for built-in
//! plugins linked into the host. Either way each line names the plugin.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{OnceLock, RwLock};

use abi_stable::std_types::RStr;
use kiln_plugin_api::abi::LogLevel;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;

/// Installs the host's logger: `info` by default, `debug` with `-v`, `trace`
/// with `-vv`; the `KILN_LOG` environment variable (`RUST_LOG` syntax) wins.
pub fn init(verbosity: u8) {
    let default = match verbosity {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("KILN_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // Fails only when a logger is already installed (tests), which is fine.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    if log::set_boxed_logger(Box::new(LogBridge)).is_ok() {
        log::set_max_level(kiln_plugin_api::from_abi_level(max_plugin_level()));
    }
}

/// The most verbose level the host prints, as plugins receive it.
pub fn max_plugin_level() -> LogLevel {
    match LevelFilter::current() {
        LevelFilter::OFF => LogLevel::Off,
        LevelFilter::ERROR => LogLevel::Error,
        LevelFilter::WARN => LogLevel::Warn,
        LevelFilter::INFO => LogLevel::Info,
        LevelFilter::DEBUG => LogLevel::Debug,
        _ => LogLevel::Trace,
    }
}

/// The host callback behind `HostServices::log`.
pub extern "C" fn plugin_log(
    plugin: RStr<'_>,
    level: LogLevel,
    _target: RStr<'_>,
    message: RStr<'_>,
) {
    emit(level, plugin.as_str(), message.as_str());
}

fn emit(level: LogLevel, origin: &str, message: &str) {
    match level {
        LogLevel::Off => {}
        LogLevel::Error => tracing::error!("[{origin}] {message}"),
        LogLevel::Warn => tracing::warn!("[{origin}] {message}"),
        LogLevel::Info => tracing::info!("[{origin}] {message}"),
        LogLevel::Debug => tracing::debug!("[{origin}] {message}"),
        LogLevel::Trace => tracing::trace!("[{origin}] {message}"),
    }
}

/// Crate names of built-in plugins, mapped to the plugin names their log
/// records are shown under.
fn builtin_crates() -> &'static RwLock<HashMap<String, String>> {
    static CRATES: OnceLock<RwLock<HashMap<String, String>>> = OnceLock::new();
    CRATES.get_or_init(Default::default)
}

/// Shows `log` records from `crate_name` as coming from plugin `plugin`.
pub fn attribute_crate_to_plugin(crate_name: &str, plugin: &str) {
    builtin_crates()
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(crate_name.to_owned(), plugin.to_owned());
}

/// Forwards `log` records (built-in plugins, dependencies) to `tracing`.
struct LogBridge;

impl log::Log for LogBridge {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        kiln_plugin_api::to_abi_level(metadata.level()) <= max_plugin_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let target = record.target();
        let crate_name = target.split("::").next().unwrap_or(target);
        let crates = builtin_crates()
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let origin = crates.get(crate_name).map_or(target, String::as_str);
        emit(
            kiln_plugin_api::to_abi_level(record.level()),
            origin,
            &record.args().to_string(),
        );
    }

    fn flush(&self) {}
}
