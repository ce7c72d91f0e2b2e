//! Describing a plugin and the architectures it registers (MAX's
//! `SupportedArchitecture`, in Rust).

use std::fmt;
use std::str::FromStr;

use abi_stable::std_types::RString;

use crate::abi::{ArchitectureDescriptor, EntryPoints};
use crate::adapters::{AdaptRequest, AdaptResponse};
use crate::config::{ArchConfig, ConfigRequest, GraphRequest};
use crate::error::{Error, Result};
use crate::graph::GraphIr;
use crate::pipeline::PipelineModel;
use crate::serving::{ServingDefaults, ServingFn, ServingRequest};

/// Declares a string-backed enumeration: canonical names in both directions,
/// so that the host and every plugin agree on the spelling that crosses the ABI.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The canonical name, as it crosses the ABI and appears in listings.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(text: &str) -> Result<Self> {
                match text {
                    $($text => Ok($name::$variant),)+
                    other => Err(Error::invalid(format!(
                        "unknown {} `{other}` (known: {})",
                        stringify!($name),
                        [$($text),+].join(", ")
                    ))),
                }
            }
        }
    };
}

named_enum! {
    /// What a model does.
    Task {
        /// Autoregressive text generation.
        TextGeneration => "text-generation",
        /// Sentence or token embeddings.
        Embeddings => "embeddings",
        /// A score or class logits per text or pair of texts: cross-encoder
        /// rerankers and classifiers (since 1.7).
        SequenceClassification => "sequence-classification",
    }
}

named_enum! {
    /// How a model's weights are stored in memory (the names follow MAX's).
    Encoding {
        /// 32-bit floats.
        Float32 => "float32",
        /// IEEE half precision.
        Float16 => "float16",
        /// bfloat16.
        BFloat16 => "bfloat16",
        /// GGUF Q8_0 blocks.
        Q8_0 => "q8_0",
        /// GGUF Q4_0 blocks.
        Q4_0 => "q4_0",
        /// GGUF Q4_1 blocks.
        Q4_1 => "q4_1",
        /// GGUF Q5_0 blocks.
        Q5_0 => "q5_0",
        /// GGUF Q5_1 blocks.
        Q5_1 => "q5_1",
        /// GGUF Q2_K super-blocks.
        Q2K => "q2_k",
        /// GGUF Q3_K super-blocks.
        Q3K => "q3_k",
        /// GGUF Q4_K super-blocks.
        Q4K => "q4_k",
        /// GGUF Q5_K super-blocks.
        Q5K => "q5_k",
        /// GGUF Q6_K super-blocks.
        Q6K => "q6_k",
        /// GGUF IQ4_NL blocks (since 1.9).
        Iq4Nl => "iq4_nl",
        /// GGUF IQ4_XS super-blocks (since 1.9).
        Iq4Xs => "iq4_xs",
    }
}

named_enum! {
    /// A checkpoint file format.
    WeightsFormat {
        /// Hugging Face safetensors (single or sharded).
        Safetensors => "safetensors",
        /// llama.cpp GGUF.
        Gguf => "gguf",
    }
}

/// Parses the architecture's Hugging Face config into its [`ArchConfig`].
pub type ConfigFn = dyn Fn(&ConfigRequest) -> Result<ArchConfig> + Send + Sync;

/// A weight adapter for one format (see [`crate::adapters`]).
pub use crate::adapters::WeightAdapterFn;

/// Builds the architecture's graph for a config (and, optionally, the adapted
/// checkpoint's weights).
pub type GraphFn = dyn Fn(&GraphRequest) -> Result<GraphIr> + Send + Sync;

/// What an architecture is, as listings show it and as the host matches models
/// against it: its names, task, encodings and preferred checkpoint format. The
/// same type describes an architecture on both sides of the boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchitectureInfo {
    /// The Hugging Face `architectures[0]` name, e.g. `LlamaForCausalLM`.
    pub name: String,
    /// Alternative names, e.g. GGUF's `general.architecture` (`llama`).
    pub aliases: Vec<String>,
    /// What the model does.
    pub task: Task,
    /// Encodings the architecture can run.
    pub supported_encodings: Vec<Encoding>,
    /// The encoding used when the user names none; one of `supported_encodings`.
    pub default_encoding: Encoding,
    /// The checkpoint format preferred when several are present.
    pub default_weights_format: WeightsFormat,
    /// Hugging Face repository ids known to work with this architecture.
    pub example_repo_ids: Vec<String>,
}

impl ArchitectureInfo {
    /// All names the architecture answers to: its name, then its aliases.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_str()).chain(self.aliases.iter().map(String::as_str))
    }

    /// Checks that the name is set and the default encoding is supported.
    pub fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::invalid("an architecture has an empty name"));
        }
        if !self.supported_encodings.contains(&self.default_encoding) {
            return Err(Error::invalid(format!(
                "architecture `{}`: default encoding `{}` is not among its supported encodings",
                self.name, self.default_encoding
            )));
        }
        Ok(())
    }

    /// The descriptor that carries this architecture across the boundary.
    pub fn to_descriptor(&self, index: u32, entry_points: EntryPoints) -> ArchitectureDescriptor {
        let strings = |items: &[String]| items.iter().map(|s| RString::from(s.as_str())).collect();
        ArchitectureDescriptor {
            name: self.name.as_str().into(),
            aliases: strings(&self.aliases),
            task: self.task.as_str().into(),
            supported_encodings: self
                .supported_encodings
                .iter()
                .map(|e| e.as_str().into())
                .collect(),
            default_encoding: self.default_encoding.as_str().into(),
            default_weights_format: self.default_weights_format.as_str().into(),
            example_repo_ids: strings(&self.example_repo_ids),
            index,
            entry_points,
        }
    }

    /// Reads a descriptor back, rejecting names this side does not know (a
    /// plugin built for a newer interface) and inconsistent encodings.
    pub fn from_descriptor(descriptor: &ArchitectureDescriptor) -> Result<Self> {
        let strings = |items: &[RString]| items.iter().map(|s| s.to_string()).collect();
        let info = Self {
            name: descriptor.name.to_string(),
            aliases: strings(&descriptor.aliases),
            task: descriptor.task.parse()?,
            supported_encodings: descriptor
                .supported_encodings
                .iter()
                .map(|e| e.parse())
                .collect::<Result<_>>()?,
            default_encoding: descriptor.default_encoding.parse()?,
            default_weights_format: descriptor.default_weights_format.parse()?,
            example_repo_ids: strings(&descriptor.example_repo_ids),
        };
        info.validate()?;
        Ok(info)
    }
}

/// One architecture a plugin registers: what it is, and its entry points.
/// Build it with [`SupportedArchitecture::new`] and the builder methods.
pub struct SupportedArchitecture {
    /// Names, task, encodings and formats.
    pub info: ArchitectureInfo,
    /// The config entry point; `None` reports "unsupported" to the host.
    pub config: Option<Box<ConfigFn>>,
    /// The graph entry point; `None` reports "unsupported" to the host.
    pub graph: Option<Box<GraphFn>>,
    /// Weight adapters by checkpoint format; a format without one keeps the
    /// checkpoint's names.
    pub weight_adapters: Vec<(WeightsFormat, Box<WeightAdapterFn>)>,
    /// The architecture's own pipeline model; `None` runs the host's
    /// [`DecoderPipeline`](crate::pipeline::DecoderPipeline).
    pub pipeline: Option<Box<dyn PipelineModel>>,
    /// What the server should know (since 1.1); `None` lets the host decide.
    pub serving: Option<Box<ServingFn>>,
    /// The other tasks the graph entry point builds for when a
    /// [`GraphRequest::task`] asks (since 1.8); a request for any other task
    /// is answered `unsupported` before the graph entry point is called.
    pub converts_to: Vec<Task>,
}

impl SupportedArchitecture {
    /// A new architecture with float32 weights from safetensors and no entry points.
    pub fn new(name: impl Into<String>, task: Task) -> Self {
        Self {
            info: ArchitectureInfo {
                name: name.into(),
                aliases: Vec::new(),
                task,
                supported_encodings: vec![Encoding::Float32],
                default_encoding: Encoding::Float32,
                default_weights_format: WeightsFormat::Safetensors,
                example_repo_ids: Vec::new(),
            },
            config: None,
            graph: None,
            weight_adapters: Vec::new(),
            pipeline: None,
            serving: None,
            converts_to: Vec::new(),
        }
    }

    /// Sets the alternative names (e.g. the GGUF architecture name).
    pub fn with_aliases<S: Into<String>>(mut self, aliases: impl IntoIterator<Item = S>) -> Self {
        self.info.aliases = aliases.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the supported encodings and the default one.
    pub fn with_encodings(
        mut self,
        default: Encoding,
        supported: impl IntoIterator<Item = Encoding>,
    ) -> Self {
        self.info.default_encoding = default;
        self.info.supported_encodings = supported.into_iter().collect();
        self
    }

    /// Sets the preferred checkpoint format.
    pub fn with_default_weights_format(mut self, format: WeightsFormat) -> Self {
        self.info.default_weights_format = format;
        self
    }

    /// Sets the example Hugging Face repository ids.
    pub fn with_example_repo_ids<S: Into<String>>(
        mut self,
        repos: impl IntoIterator<Item = S>,
    ) -> Self {
        self.info.example_repo_ids = repos.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the config entry point.
    pub fn with_config(
        mut self,
        config: impl Fn(&ConfigRequest) -> Result<ArchConfig> + Send + Sync + 'static,
    ) -> Self {
        self.config = Some(Box::new(config));
        self
    }

    /// Registers the weight adapter for checkpoints in `format`.
    pub fn with_weight_adapter(
        mut self,
        format: WeightsFormat,
        adapter: impl Fn(&AdaptRequest) -> Result<AdaptResponse> + Send + Sync + 'static,
    ) -> Self {
        self.weight_adapters.retain(|(f, _)| *f != format);
        self.weight_adapters.push((format, Box::new(adapter)));
        self
    }

    /// Sets the graph entry point.
    pub fn with_graph(
        mut self,
        graph: impl Fn(&GraphRequest) -> Result<GraphIr> + Send + Sync + 'static,
    ) -> Self {
        self.graph = Some(Box::new(graph));
        self
    }

    /// Replaces the default [`DecoderPipeline`](crate::pipeline::DecoderPipeline)
    /// with the architecture's own, for a graph that takes other inputs.
    pub fn with_pipeline(mut self, pipeline: impl PipelineModel + 'static) -> Self {
        self.pipeline = Some(Box::new(pipeline));
        self
    }

    /// Declares the other tasks its graph entry point builds for (since
    /// 1.8), reading [`GraphRequest::task`]: e.g. [`Task::Embeddings`] for a
    /// decoder whose graph gives hidden states when asked.
    pub fn converts_to(mut self, tasks: impl IntoIterator<Item = Task>) -> Self {
        self.converts_to = tasks.into_iter().collect();
        self
    }

    /// Whether a graph request for `task` (`None`: the architecture's own)
    /// may reach the graph entry point.
    pub fn builds_for(&self, task: Option<Task>) -> bool {
        task.is_none_or(|task| task == self.info.task || self.converts_to.contains(&task))
    }

    /// Sets the serving-defaults entry point (since 1.1), e.g. the tool-call
    /// parser the family's models need.
    pub fn with_serving_defaults(
        mut self,
        serving: impl Fn(&ServingRequest) -> Result<ServingDefaults> + Send + Sync + 'static,
    ) -> Self {
        self.serving = Some(Box::new(serving));
        self
    }
}

impl fmt::Debug for SupportedArchitecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SupportedArchitecture")
            .field("info", &self.info)
            .field("config", &self.config.is_some())
            .field("graph", &self.graph.is_some())
            .field(
                "weight_adapters",
                &self
                    .weight_adapters
                    .iter()
                    .map(|(f, _)| *f)
                    .collect::<Vec<_>>(),
            )
            .field("custom_pipeline", &self.pipeline.is_some())
            .field("serving_defaults", &self.serving.is_some())
            .field("converts_to", &self.converts_to)
            .finish()
    }
}

/// Everything a plugin provides: its name, version and architectures.
#[derive(Debug)]
pub struct Plugin {
    /// The plugin's name, shown in listings and in each of its log lines.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// The architectures it registers.
    pub architectures: Vec<SupportedArchitecture>,
}

impl Plugin {
    /// A plugin with no architectures yet.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            architectures: Vec::new(),
        }
    }

    /// Adds an architecture.
    pub fn with_architecture(mut self, architecture: SupportedArchitecture) -> Self {
        self.architectures.push(architecture);
        self
    }

    /// Checks what the host relies on: a name, at least one architecture, no
    /// name registered twice, and consistent encodings.
    pub fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::invalid("the plugin has an empty name"));
        }
        if self.architectures.is_empty() {
            return Err(Error::invalid(format!(
                "plugin `{}` registers no architectures",
                self.name
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for arch in &self.architectures {
            arch.info.validate()?;
            for name in arch.info.names() {
                if !seen.insert(name) {
                    return Err(Error::invalid(format!(
                        "plugin `{}` registers the name `{name}` twice",
                        self.name
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for encoding in Encoding::ALL {
            assert_eq!(encoding.as_str().parse::<Encoding>().unwrap(), *encoding);
        }
        for task in Task::ALL {
            assert_eq!(task.as_str().parse::<Task>().unwrap(), *task);
        }
        let err = "q9_9".parse::<Encoding>().unwrap_err().to_string();
        assert!(err.contains("unknown Encoding `q9_9`"), "{err}");
    }

    #[test]
    fn validation_catches_inconsistent_plugins() {
        let empty = Plugin::new("p", "1.0");
        assert!(empty
            .validate()
            .unwrap_err()
            .to_string()
            .contains("no architectures"));

        let bad_default = Plugin::new("p", "1.0").with_architecture(
            SupportedArchitecture::new("A", Task::TextGeneration)
                .with_encodings(Encoding::Q4K, [Encoding::Float32]),
        );
        let err = bad_default.validate().unwrap_err().to_string();
        assert!(err.contains("default encoding `q4_k`"), "{err}");

        let twice = Plugin::new("p", "1.0")
            .with_architecture(SupportedArchitecture::new("A", Task::TextGeneration))
            .with_architecture(
                SupportedArchitecture::new("B", Task::TextGeneration).with_aliases(["A"]),
            );
        assert!(twice
            .validate()
            .unwrap_err()
            .to_string()
            .contains("`A` twice"));
    }
}
