//! A model ready to run: resolved, its checkpoint bound through the
//! architecture's weight adapter, its graph built, compiled and loaded.

pub mod resolve;
pub mod runner;
pub mod sanity;
pub mod synthetic;

use std::sync::Arc;

use kiln_plugin_api::graph::Device;
use kiln_plugin_api::{ArchConfig, ConfigRequest, GraphRequest, Task, WeightsFormat};

use crate::checkpoint::gguf::GgufValue;
use crate::checkpoint::quant_mix::ModelSizes;
use crate::checkpoint::quantize::quantize_matrices;
pub use crate::checkpoint::quantize::LoadQuantization;
use crate::checkpoint::{self, BoundWeights, Checkpoint, CheckpointError, TensorBytes};
use crate::compiler::{CompileCache, CompileError, CompileOutcome};
use crate::device::{self, DeviceChoice, DeviceError};
use crate::engine::batch::Pipeline;
use crate::plugins::{Architecture, ArchitectureRegistry, EntryPointError};
use crate::runtime::cuda::{
    AttentionBackend, CudaExecutor, CudaOptions, DenseGemvRows, DenseRows, GemvSplits, WeightDtype,
};
use crate::runtime::{Backend, Executor, KvCacheDtype, Precision, RuntimeError};
use crate::tokenizer::{tokenizer_from_gguf, GgufVocab, Tokenizer, TokenizerError};
pub use resolve::{resolve, ResolvedModel};
pub use runner::Runner;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `--model` did not resolve.
    #[error(transparent)]
    Resolve(#[from] resolve::ResolveError),
    /// The checkpoint could not be read or bound.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// No registered architecture matches.
    #[error("{0}\n  hint: `host list-architectures` shows what is registered; docs/writing-a-plugin.md explains how to add one")]
    UnknownArchitecture(String),
    /// The plugin rejected the config or failed.
    #[error(transparent)]
    Plugin(#[from] EntryPointError),
    /// The graph does not compile.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// The weights do not fit the graph.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The device could not be opened.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// An option the model cannot honour (e.g. a Q8_0 KV cache for heads
    /// that are not whole blocks).
    #[error("{0}")]
    Unsupported(String),
    /// The tokenizer could not be built.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The checkpoint declares sizes or values it cannot have, or (with
    /// `--check-weights`) a weight is not finite.
    #[error("{}: {message}", path.display())]
    Implausible {
        /// The checkpoint.
        path: std::path::PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// How to load a model.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// `--max-length`.
    pub max_length: Option<u32>,
    /// Exact or fast quantized arithmetic.
    pub precision: Precision,
    /// Where compiled programs are cached.
    pub compile_cache: CompileCache,
    /// Where the model runs.
    pub device: DeviceChoice,
    /// How weights are stored for products on a CUDA device (`--dtype`).
    pub dtype: WeightDtype,
    /// On a CUDA device, launch every kernel eagerly instead of replaying
    /// captured CUDA graphs (`--enforce-eager`).
    pub enforce_eager: bool,
    /// The KV cache's element type on a CUDA device (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// The attention kernels on a CUDA device (`--attention-backend`).
    pub attention_backend: AttentionBackend,
    /// Scan every weight for NaN and infinity before use (`--check-weights`).
    pub check_weights: bool,
    /// How the decode GEMV splits rows among warps on a CUDA device (`Auto`:
    /// `KILN_GEMV_SPLIT`, else timed on a GPU).
    pub gemv_splits: GemvSplits,
    /// Where dense bf16 products of 3 to 64 rows run on a CUDA device
    /// (`None`: `KILN_DENSE_ROWS`, else cuBLAS).
    pub dense_rows: Option<DenseRows>,
    /// What the model is run as (`--runner`).
    pub runner: Runner,
    /// How float matrices are quantized at load (`--quantization`).
    pub quantization: LoadQuantization,
}

/// A loaded model.
pub struct Model {
    /// Where it came from.
    pub resolved: ResolvedModel,
    /// Its architecture.
    pub architecture: Architecture,
    /// What it is run for: its architecture's own task, or embeddings for a
    /// decoder run with `--runner pooling`.
    pub task: Task,
    /// The Hugging Face shaped config it was built from.
    pub hf_config: serde_json::Value,
    /// The architecture's parsed config.
    pub config: ArchConfig,
    /// Checkpoint tensors the adapter did not use.
    pub unused_tensors: Vec<String>,
    /// How the program was obtained.
    pub compile: CompileOutcome,
    /// The compiled graph bound to the weights on its device.
    pub backend: Box<dyn Backend>,
    /// How each step's graph inputs are prepared.
    pub pipeline: Pipeline,
    /// The tokenizer, when the model has one.
    pub tokenizer: Option<Tokenizer>,
}

/// The checkpoint and the Hugging Face shaped config of a resolved model.
pub fn open_checkpoint(
    resolved: &ResolvedModel,
    bytes: TensorBytes,
) -> Result<(Checkpoint, serde_json::Value), ModelError> {
    let (checkpoint, config) = match resolved.format {
        WeightsFormat::Safetensors => {
            let dir = resolved
                .dir
                .as_deref()
                .expect("resolution requires a directory for safetensors");
            let checkpoint = checkpoint::open_safetensors(&resolved.weights, bytes)?;
            (checkpoint, resolve::read_config(dir)?)
        }
        WeightsFormat::Gguf => {
            let (checkpoint, gguf_config) = checkpoint::open_gguf(&resolved.weights, bytes)?;
            // A config.json beside the weights wins over the GGUF metadata.
            let config = match resolved
                .dir
                .as_deref()
                .filter(|d| d.join("config.json").is_file())
            {
                Some(dir) => resolve::read_config(dir)?,
                None => gguf_config,
            };
            (checkpoint, config)
        }
    };
    sanity::check_config(&config, &checkpoint).map_err(|message| ModelError::Implausible {
        path: resolved.weights.clone(),
        message,
    })?;
    Ok((checkpoint, config))
}

/// The registered architecture for a config: `architectures[0]`, else (for
/// GGUF) `general.architecture` as an alias.
pub fn find_architecture<'r>(
    registry: &'r ArchitectureRegistry,
    hf_config: &serde_json::Value,
    checkpoint: &Checkpoint,
) -> Result<&'r Architecture, ModelError> {
    let gguf = checkpoint
        .metadata
        .get("general.architecture")
        .and_then(GgufValue::as_str);
    find_registered(registry, hf_config, gguf)
}

/// The registered architecture named by `architectures[0]` of a config, else
/// by `alias`.
fn find_registered<'r>(
    registry: &'r ArchitectureRegistry,
    hf_config: &serde_json::Value,
    alias: Option<&str>,
) -> Result<&'r Architecture, ModelError> {
    let declared = hf_config
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(|a| a.as_str());
    // A base model's name (`Qwen3Model`, `MistralModel`: how embedding
    // checkpoints such as e5-mistral name theirs) finds its causal LM.
    let causal = declared.and_then(runner::causal_lm_of);
    for name in declared.into_iter().chain(causal.as_deref()).chain(alias) {
        if let Some(arch) = registry.get(name) {
            return Ok(arch);
        }
    }
    let known: Vec<&str> = registry
        .architectures()
        .iter()
        .map(|a| a.info.name.as_str())
        .collect();
    Err(ModelError::UnknownArchitecture(match declared.or(alias) {
        Some(name) => format!(
            "architecture `{name}` is not registered (registered: {})",
            known.join(", ")
        ),
        None => {
            "the model's config names no architecture (`architectures` in config.json)".to_owned()
        }
    }))
}

/// Binds the checkpoint to `arch`'s module names with its weight adapter.
pub fn bind_weights(
    arch: &Architecture,
    checkpoint: &Checkpoint,
    hf_config: &serde_json::Value,
) -> Result<BoundWeights, ModelError> {
    let adaptation = arch.adapt_weights(&checkpoint.adapt_request(hf_config))?;
    Ok(checkpoint.bind(&adaptation)?)
}

/// Resolves nothing: loads the model `resolved` points at.
pub fn load(
    registry: &ArchitectureRegistry,
    resolved: ResolvedModel,
    options: &LoadOptions,
) -> Result<Model, ModelError> {
    // The CPU backend streams the weights from host memory at every decode
    // step: best from huge pages. A CUDA backend copies them away, and
    // quantizing at load writes them anew (in huge pages).
    let bytes = if options.device.is_cuda() || options.quantization != LoadQuantization::None {
        TensorBytes::Mapped
    } else {
        TensorBytes::HugePages
    };
    let (checkpoint, hf_config) = open_checkpoint(&resolved, bytes)?;
    // The tokenizer is independent of the graph: build it on another core
    // (a 262k-token vocabulary takes a few hundred milliseconds).
    let (compiled, tokenizer) = std::thread::scope(|scope| {
        let tokenizer = scope.spawn(|| load_tokenizer(&resolved, &checkpoint));
        let compiled = find_architecture(registry, &hf_config, &checkpoint).and_then(|arch| {
            let config = arch.config(&ConfigRequest {
                hf_config: hf_config.clone(),
                max_length: options.max_length,
            })?;
            let mut bound = bind_weights(arch, &checkpoint, &hf_config)?;
            let sizes = ModelSizes::of(&hf_config);
            let quantized = quantize_matrices(&mut bound, options.quantization, sizes)?;
            if quantized.matrices > 0 {
                tracing::info!(
                    "quantized {} matrices ({:?}) at load: {:.1} MiB -> {:.1} MiB",
                    quantized.matrices,
                    options.quantization,
                    quantized.bytes.0 as f64 / (1 << 20) as f64,
                    quantized.bytes.1 as f64 / (1 << 20) as f64
                );
            }
            let options = &LoadOptions {
                runner: options.runner.for_checkpoint(&hf_config, &arch.info.name),
                ..options.clone()
            };
            if options.check_weights {
                sanity::check_weights(&bound.store).map_err(|message| ModelError::Implausible {
                    path: resolved.weights.clone(),
                    message,
                })?;
            }
            compile(arch.clone(), config, bound, checkpoint.format, options)
        });
        let tokenizer = tokenizer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (compiled, tokenizer)
    });
    Ok(Model::assemble(resolved, hf_config, compiled?, tokenizer?))
}

impl Model {
    /// A model from its parts.
    fn assemble(
        resolved: ResolvedModel,
        hf_config: serde_json::Value,
        compiled: Compiled,
        tokenizer: Option<Tokenizer>,
    ) -> Self {
        let Compiled {
            architecture,
            task,
            config,
            unused_tensors,
            compile,
            backend,
            pipeline,
        } = compiled;
        Model {
            resolved,
            architecture,
            task,
            hf_config,
            config,
            unused_tensors,
            compile,
            backend,
            pipeline,
            tokenizer,
        }
    }
}

/// Whether `graph` reads the paged KV cache (declares the ragged batch's
/// `block_tables`): a decoder, whatever it is run for.
fn reads_cache(graph: &kiln_plugin_api::graph::GraphIr) -> bool {
    graph
        .inputs
        .iter()
        .any(|input| input.name == "block_tables")
}

impl Model {
    /// Whether its graph reads a paged KV cache (a decoder's does, an
    /// encoder's does not).
    pub fn reads_cache(&self) -> bool {
        reads_cache(&self.backend.program().graph)
    }
}

/// What [`load`] builds from the checkpoint apart from the tokenizer.
struct Compiled {
    architecture: Architecture,
    task: Task,
    config: ArchConfig,
    unused_tensors: Vec<String>,
    compile: CompileOutcome,
    backend: Box<dyn Backend>,
    pipeline: Pipeline,
}

/// Builds `architecture`'s graph for `config` over `bound` weights, compiles
/// it and binds it to the device `options` name.
fn compile(
    architecture: Architecture,
    config: ArchConfig,
    bound: BoundWeights,
    format: WeightsFormat,
    options: &LoadOptions,
) -> Result<Compiled, ModelError> {
    let own = architecture.info.task;
    let task = options
        .runner
        .task(&architecture.info.name, own)
        .map_err(ModelError::Unsupported)?;
    let graph = architecture.build_graph(&GraphRequest {
        config: config.clone(),
        weights_format: Some(format),
        state_dict: Some(bound.state_dict.clone()),
        task: (task != own).then_some(task),
    })?;
    if task != own {
        runner::check_hidden_output(&graph, &config.model).map_err(ModelError::Unsupported)?;
    }
    let (program, compile) = options.compile_cache.get_or_compile(&graph, Device::Cpu)?;
    let program = Arc::new(program);
    let backend: Box<dyn Backend> =
        match device::open(options.device, options.compile_cache.kernels_dir())? {
            None => {
                let kv_dtype = options
                    .kv_cache_dtype
                    .on_host(options.precision)
                    .map_err(ModelError::Unsupported)?;
                kv_dtype
                    .check_head_dim(config.kv.head_dim as usize)
                    .map_err(ModelError::Unsupported)?;
                Box::new(
                    Executor::new(program, &bound.store, options.precision)?
                        .with_kv_dtype(kv_dtype),
                )
            }
            Some(gpu) => Box::new(CudaExecutor::new(
                program,
                &bound.store,
                gpu,
                options.device.to_string(),
                CudaOptions {
                    dtype: options.dtype,
                    precision: options.precision,
                    kv_cache_dtype: options.kv_cache_dtype,
                    graphs: !options.enforce_eager,
                    attention: options.attention_backend,
                    gemv_splits: match options.gemv_splits {
                        GemvSplits::Auto => {
                            GemvSplits::from_env().map_err(ModelError::Unsupported)?
                        }
                        chosen => chosen,
                    },
                    dense_rows: match options.dense_rows {
                        Some(chosen) => chosen,
                        None => DenseRows::from_env().map_err(ModelError::Unsupported)?,
                    },
                    dense_gemv_rows: DenseGemvRows::from_env().map_err(ModelError::Unsupported)?,
                    gpu: matches!(options.device, DeviceChoice::Cuda(_)),
                },
            )?),
        };
    let pipeline = Pipeline::for_architecture(&architecture, reads_cache(&graph))?;
    Ok(Compiled {
        architecture,
        task,
        config,
        unused_tensors: bound.unused,
        compile,
        backend,
        pipeline,
    })
}

/// The model's tokenizer: `tokenizer.json` (with `tokenizer_config.json`)
/// in its directory, else the tokenizer embedded in a GGUF file.
pub fn load_tokenizer(
    resolved: &ResolvedModel,
    checkpoint: &Checkpoint,
) -> Result<Option<Tokenizer>, TokenizerError> {
    if let Some(path) = resolved
        .dir
        .as_ref()
        .map(|d| d.join("tokenizer.json"))
        .filter(|p| p.is_file())
    {
        return Tokenizer::from_file(path).map(Some);
    }
    if checkpoint.format != WeightsFormat::Gguf
        || !checkpoint.metadata.contains_key("tokenizer.ggml.model")
    {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    let vocab = GgufVocab::from_metadata(&checkpoint.metadata)?;
    let tokenizer = tokenizer_from_gguf(&vocab)?;
    tracing::debug!(
        "built the tokenizer of {} tokens from the GGUF metadata in {:?}",
        vocab.tokens.len(),
        started.elapsed()
    );
    Ok(Some(tokenizer))
}
