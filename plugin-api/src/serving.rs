//! What an architecture tells the server about serving it (added in 1.1):
//! today the format its models write tool calls in. A host asks once, after
//! loading the model; a plugin built before 1.1 has no such entry point and
//! the host falls back to reading the chat template.

use serde::{Deserialize, Serialize};

use crate::config::ArchConfig;
use crate::error::Result;

/// The question: the parsed config of the model being served and its chat
/// template (the source text), when it has one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServingRequest {
    /// The architecture's config, as its `config` entry point returned it.
    pub config: ArchConfig,
    /// The chat template source, if any.
    #[serde(default)]
    pub chat_template: Option<String>,
}

/// The answer. Every field is optional, so that later versions add fields
/// without breaking either side.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServingDefaults {
    /// The tool-call parser for the model's output, by vLLM's
    /// `--tool-call-parser` names: `hermes` (`<tool_call>` JSON blocks:
    /// Qwen2.5, Hermes), `llama3_json` (Llama 3.1+), `mistral`
    /// (`[TOOL_CALLS]`). `None`: let the host read the chat template.
    pub tool_call_parser: Option<String>,
}

impl ServingDefaults {
    /// Defaults naming a tool-call parser.
    pub fn with_tool_call_parser(parser: impl Into<String>) -> Self {
        Self {
            tool_call_parser: Some(parser.into()),
        }
    }
}

/// An architecture's serving-defaults entry point.
pub type ServingFn = dyn Fn(&ServingRequest) -> Result<ServingDefaults> + Send + Sync;
