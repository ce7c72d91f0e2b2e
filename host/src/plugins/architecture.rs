//! The host's view of one registered architecture, and calls into it.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use kiln_plugin_api::abi::{self, ArchitectureDescriptor, EntryPoint, EntryPoints};
use kiln_plugin_api::adapters::{self, AdaptRequest, AdaptResponse};
use kiln_plugin_api::graph::GraphIr;
use kiln_plugin_api::pipeline::{
    PipelineDescription, PipelineRequest, PreparedStep, StepBatch, PIPELINE_PAYLOAD_VERSION,
};
use kiln_plugin_api::{
    ArchConfig, ArchitectureInfo, ConfigRequest, GraphRequest, ServingDefaults, ServingRequest,
};

use super::PluginLoadError;

/// Where a plugin comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PluginSource {
    /// Linked into the host.
    BuiltIn,
    /// Opened from a shared library.
    File(PathBuf),
}

impl fmt::Display for PluginSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PluginSource::BuiltIn => f.write_str("built-in"),
            PluginSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// The plugin an architecture belongs to.
#[derive(Debug)]
pub struct PluginIdentity {
    /// The plugin's name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// Where it was loaded from.
    pub source: PluginSource,
}

/// One architecture, as registered by a plugin.
#[derive(Clone, Debug)]
pub struct Architecture {
    /// Names, task, encodings and formats.
    pub info: ArchitectureInfo,
    /// The plugin that registered it.
    pub plugin: Arc<PluginIdentity>,
    index: u32,
    entry_points: EntryPoints,
}

/// An architecture entry point that failed (or panicked) inside the plugin.
#[derive(Debug, thiserror::Error)]
#[error("{architecture} ({plugin}): {entry}: {message}")]
pub struct EntryPointError {
    /// The architecture called.
    pub architecture: String,
    /// The plugin's name.
    pub plugin: String,
    /// The entry point.
    pub entry: &'static str,
    /// The failure's kind as the plugin reported it.
    pub kind: abi::PluginErrorKind,
    /// The message.
    pub message: String,
}

impl Architecture {
    pub(super) fn from_descriptor(
        descriptor: &ArchitectureDescriptor,
        plugin: &Arc<PluginIdentity>,
    ) -> Result<Self, PluginLoadError> {
        let info = ArchitectureInfo::from_descriptor(descriptor).map_err(|e| {
            PluginLoadError::BadDescriptor {
                source_name: plugin.source.to_string(),
                architecture: descriptor.name.to_string(),
                message: e.to_string(),
            }
        })?;
        Ok(Self {
            info,
            plugin: Arc::clone(plugin),
            index: descriptor.index,
            entry_points: descriptor.entry_points,
        })
    }

    /// Parses a Hugging Face config into the architecture's config.
    pub fn config(&self, request: &ConfigRequest) -> Result<ArchConfig, EntryPointError> {
        let request = serde_json::to_vec(request).expect("a ConfigRequest serializes");
        let response = self.call("config", self.entry_points.config, &request)?;
        serde_json::from_slice(&response).map_err(|e| {
            self.malformed(
                "config",
                format!("the plugin returned a malformed config: {e}"),
            )
        })
    }

    /// Maps a checkpoint's tensors onto module weights with the architecture's
    /// adapter for the format; without one, names are kept as they are.
    pub fn adapt_weights(&self, request: &AdaptRequest) -> Result<AdaptResponse, EntryPointError> {
        let bytes = serde_json::to_vec(request).expect("an AdaptRequest serializes");
        match self.call("adapt_weights", self.entry_points.adapt_weights, &bytes) {
            Ok(response) => serde_json::from_slice(&response).map_err(|e| {
                self.malformed(
                    "adapt_weights",
                    format!("the plugin returned a malformed adaptation: {e}"),
                )
            }),
            Err(e) if e.kind == abi::PluginErrorKind::Unsupported => {
                Ok(adapters::rename(request, |n| Some(n.to_owned())))
            }
            Err(e) => Err(e),
        }
    }

    /// Builds the architecture's graph.
    pub fn build_graph(&self, request: &GraphRequest) -> Result<GraphIr, EntryPointError> {
        let request = serde_json::to_vec(request).expect("a GraphRequest serializes");
        let response = self.call("build_graph", self.entry_points.build_graph, &request)?;
        GraphIr::from_bytes(&response).map_err(|e| {
            self.malformed(
                "build_graph",
                format!("the plugin returned an unreadable graph: {e}"),
            )
        })
    }

    /// Whether the architecture brings its own pipeline model; without one
    /// the host runs the default [`DecoderPipeline`](kiln_plugin_api::pipeline::DecoderPipeline).
    pub fn has_own_pipeline(&self) -> Result<bool, EntryPointError> {
        let request = serde_json::to_vec(&PipelineRequest::Describe).expect("a request serializes");
        let response = match self.call("pipeline", self.entry_points.pipeline, &request) {
            Ok(response) => response,
            Err(e) if e.kind == abi::PluginErrorKind::Unsupported => return Ok(false),
            Err(e) => return Err(e),
        };
        let description: PipelineDescription = serde_json::from_slice(&response).map_err(|e| {
            self.malformed(
                "pipeline",
                format!("the plugin returned a malformed description: {e}"),
            )
        })?;
        // Every older payload version is understood (the payload only grows).
        if !(1..=PIPELINE_PAYLOAD_VERSION).contains(&description.version) {
            return Err(self.malformed(
                "pipeline",
                format!(
                    "the plugin's pipeline speaks payload version {}, the host 1 to {PIPELINE_PAYLOAD_VERSION}",
                    description.version
                ),
            ));
        }
        Ok(true)
    }

    /// Asks the architecture's own pipeline model for one step's graph inputs.
    pub fn prepare_step(&self, batch: &StepBatch) -> Result<PreparedStep, EntryPointError> {
        let request = PipelineRequest::PrepareStep {
            version: PIPELINE_PAYLOAD_VERSION,
            batch: batch.clone(),
        };
        let request = serde_json::to_vec(&request).expect("a request serializes");
        let response = self.call("pipeline", self.entry_points.pipeline, &request)?;
        let step: PreparedStep = serde_json::from_slice(&response).map_err(|e| {
            self.malformed(
                "pipeline",
                format!("the plugin returned a malformed step: {e}"),
            )
        })?;
        step.validate(batch)
            .map_err(|e| self.malformed("pipeline", e.to_string()))?;
        Ok(step)
    }

    fn malformed(&self, entry: &'static str, message: String) -> EntryPointError {
        EntryPointError {
            architecture: self.info.name.clone(),
            plugin: self.plugin.name.clone(),
            entry,
            kind: abi::PluginErrorKind::Invalid,
            message,
        }
    }

    /// What the architecture says about serving its models (an entry point
    /// added in 1.1); `None` when its plugin predates the entry point or does
    /// not implement it.
    pub fn serving_defaults(
        &self,
        request: &ServingRequest,
    ) -> Result<Option<ServingDefaults>, EntryPointError> {
        const ENTRY: &str = "serving_defaults";
        let request = serde_json::to_vec(request).expect("a ServingRequest serializes");
        let response =
            (self.entry_points.named)(self.index, ENTRY.into(), request.as_slice().into())
                .into_result()
                .map_err(|error| self.failed(ENTRY, error));
        let response = match response {
            Ok(response) => response,
            Err(e) if e.kind == abi::PluginErrorKind::Unsupported => return Ok(None),
            Err(e) => return Err(e),
        };
        serde_json::from_slice(&response).map(Some).map_err(|e| {
            self.malformed(
                ENTRY,
                format!("the plugin returned malformed serving defaults: {e}"),
            )
        })
    }

    fn call(
        &self,
        entry: &'static str,
        function: EntryPoint,
        request: &[u8],
    ) -> Result<Vec<u8>, EntryPointError> {
        function(self.index, request.into())
            .into_result()
            .map(|bytes| bytes.into_vec())
            .map_err(|error| self.failed(entry, error))
    }

    fn failed(&self, entry: &'static str, error: abi::PluginError) -> EntryPointError {
        EntryPointError {
            architecture: self.info.name.clone(),
            plugin: self.plugin.name.clone(),
            entry,
            kind: error.kind,
            message: error.message.into_string(),
        }
    }
}
