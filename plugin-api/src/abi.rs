//! The stable binary interface between the host and a plugin.
//!
//! This is the only module that touches `abi_stable`; plugin authors never use
//! it directly (the [`export_plugin!`](crate::export_plugin) macro does). Only
//! `StableAbi` data crosses: strings, vectors, plain enums and `extern "C"`
//! function pointers. Rich data (configs, weight maps, graphs, pipeline steps)
//! crosses as serialized payloads, so the interface stays small while what
//! flows through it grows.
//!
//! # Versioning policy: old plugins keep loading
//!
//! The interface version is this crate's version ([`INTERFACE_VERSION`]),
//! `major.minor.patch`. A host loads a plugin built against the same major
//! and the same or an older minor: a plugin built against 1.0 loads in every
//! 1.x host, until a deliberate major break. A plugin built against a newer
//! minor than the host's is refused with both versions named (it may rely on
//! what the host does not have).
//!
//! The types below are frozen for the major version: `abi_stable` checks at
//! load time that the plugin's layouts are the host's, and it refuses a
//! plugin whose tables have fewer fields than the host's, so no table can
//! grow. What a minor release adds arrives instead the way ONNX Runtime's C
//! API adds functions, through lookups that an older peer answers with "I do
//! not have that":
//!
//! - new architecture entry points go through [`EntryPoints::named`]: the
//!   host calls it with the entry point's name, and a plugin built before
//!   that name existed answers [`PluginErrorKind::Unsupported`], on which the
//!   host falls back to what it did before (e.g. 1.1's `serving_defaults`:
//!   without it the host reads the tool-call format from the chat template);
//! - new host services go through [`HostServices::service`] the same way;
//! - payloads grow compatibly: a new field is optional on the side that reads
//!   it (`#[serde(default)]`), unknown fields are ignored, and the graph IR
//!   and pipeline payloads carry their own versions, of which a host reads
//!   every one up to its own.
//!
//! Any other change is a major bump. `tests/abi_fingerprint.rs` fails when
//! this file changes within a major version, and the end-to-end tests
//! load a plugin built against a frozen copy of the previous release
//! (`tests/fixtures/compat/`) into the current host.

pub use crate::version::{Compatibility, InterfaceVersion, INTERFACE_VERSION};

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings,
    sabi_types::VersionStrings,
    std_types::{RResult, RSlice, RStr, RString, RVec},
    StableAbi,
};

/// The root-module name every Kiln plugin exports; anything else is not a Kiln plugin.
pub const ROOT_MODULE_NAME: &str = "kiln_plugin";

/// The root module a plugin exports: one function that describes the plugin.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginRootRef)))]
#[sabi(missing_field(panic))]
pub struct PluginRoot {
    /// Hands the plugin the host's services and returns what it provides.
    /// The host calls it once, before anything else.
    #[sabi(last_prefix_field)]
    pub load: extern "C" fn(HostServices) -> RResult<PluginManifest, PluginError>,
}

impl RootModule for PluginRootRef {
    declare_root_module_statics! {PluginRootRef}
    const BASE_NAME: &'static str = ROOT_MODULE_NAME;
    const NAME: &'static str = ROOT_MODULE_NAME;
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// What the host offers a plugin.
#[repr(C)]
#[derive(StableAbi, Clone, Copy)]
pub struct HostServices {
    /// Receives the plugin's log records; the host adds the plugin's name.
    pub log: extern "C" fn(plugin: RStr<'_>, level: LogLevel, target: RStr<'_>, message: RStr<'_>),
    /// The most verbose level the host will print; plugins skip formatting the rest.
    pub max_log_level: LogLevel,
    /// True when the plugin was opened from a shared library (it then has its own
    /// copy of the standard library, its panic hook and its logger), false for a
    /// built-in linked into the host.
    pub dynamically_loaded: bool,
    /// Services added after 1.0, by name, each taking and returning a
    /// serialized payload; a host that predates a name answers
    /// [`PluginErrorKind::Unsupported`]. 1.0 has `interface_version` (no
    /// request; the host's [`INTERFACE_VERSION`] as UTF-8).
    pub service:
        extern "C" fn(name: RStr<'_>, request: RSlice<'_, u8>) -> RResult<RVec<u8>, PluginError>,
}

/// Log levels, most severe first.
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Logging disabled.
    Off = 0,
    /// Errors.
    Error = 1,
    /// Warnings.
    Warn = 2,
    /// Progress a user wants to see.
    Info = 3,
    /// Detail for debugging.
    Debug = 4,
    /// Everything.
    Trace = 5,
}

/// What a plugin provides, returned by [`PluginRoot::load`].
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct PluginManifest {
    /// The plugin's name, shown in listings and log lines.
    pub name: RString,
    /// The plugin's own version.
    pub version: RString,
    /// The Rust crate that defines the plugin (used to attribute log records of
    /// built-in plugins, which share the host's logger).
    pub crate_name: RString,
    /// The architectures the plugin registers.
    pub architectures: RVec<ArchitectureDescriptor>,
}

/// One architecture as it crosses the boundary. Enumerations travel as their
/// canonical strings (see [`crate::Task`], [`crate::Encoding`],
/// [`crate::WeightsFormat`]) so that a value unknown to the host is reported,
/// not misread.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct ArchitectureDescriptor {
    /// The Hugging Face `architectures[0]` name, e.g. `LlamaForCausalLM`.
    pub name: RString,
    /// Other names, e.g. the GGUF `general.architecture` value `llama`.
    pub aliases: RVec<RString>,
    /// What the model does, e.g. `text-generation`.
    pub task: RString,
    /// Weight encodings the architecture can run, e.g. `bfloat16`, `q4_k`.
    pub supported_encodings: RVec<RString>,
    /// The encoding used when the user names none.
    pub default_encoding: RString,
    /// The checkpoint format preferred when several are available.
    pub default_weights_format: RString,
    /// Hugging Face repository ids known to work.
    pub example_repo_ids: RVec<RString>,
    /// Index of this architecture in its plugin; passed back to every entry point.
    pub index: u32,
    /// The calls the host makes for this architecture.
    pub entry_points: EntryPoints,
}

/// An architecture's entry points. Each takes the architecture's index and a
/// serialized request and returns a serialized response (JSON for now; every
/// payload type documents its own shape and version). An entry point the
/// plugin does not implement returns [`PluginErrorKind::Unsupported`].
/// Entry points added after 1.0 are reached through [`EntryPoints::named`].
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
#[allow(clippy::type_complexity)]
pub struct EntryPoints {
    /// Hugging Face config in, the parsed architecture config out
    /// ([`crate::ConfigRequest`] → [`crate::ArchConfig`]).
    pub config: extern "C" fn(u32, RSlice<'_, u8>) -> RResult<RVec<u8>, PluginError>,
    /// Checkpoint tensor list in, the mapping onto the module's names out.
    pub adapt_weights: extern "C" fn(u32, RSlice<'_, u8>) -> RResult<RVec<u8>, PluginError>,
    /// Architecture config in, the serialized graph IR out.
    pub build_graph: extern "C" fn(u32, RSlice<'_, u8>) -> RResult<RVec<u8>, PluginError>,
    /// Pipeline description: how a batch becomes graph inputs.
    pub pipeline: extern "C" fn(u32, RSlice<'_, u8>) -> RResult<RVec<u8>, PluginError>,
    /// Entry points added after 1.0, by name (e.g. 1.1's `serving_defaults`),
    /// with the same serialized request and response; a plugin that predates
    /// the name answers [`PluginErrorKind::Unsupported`].
    pub named: extern "C" fn(u32, RStr<'_>, RSlice<'_, u8>) -> RResult<RVec<u8>, PluginError>,
}

/// The signature shared by every architecture entry point (spelled out in
/// [`EntryPoints`] because the layout derive reads function types literally).
pub type EntryPoint =
    extern "C" fn(architecture: u32, request: RSlice<'_, u8>) -> RResult<RVec<u8>, PluginError>;

/// An error returned across the boundary.
#[repr(C)]
#[derive(StableAbi, Clone, Debug)]
pub struct PluginError {
    /// What kind of failure.
    pub kind: PluginErrorKind,
    /// A human-readable message.
    pub message: RString,
}

/// Kinds of [`PluginError`].
#[repr(u8)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginErrorKind {
    /// The request was malformed or rejected by the plugin.
    Invalid = 0,
    /// The plugin does not implement this entry point.
    Unsupported = 1,
    /// The plugin's code panicked; the message carries the panic message.
    Panicked = 2,
    /// Any other failure inside the plugin.
    Internal = 3,
}
