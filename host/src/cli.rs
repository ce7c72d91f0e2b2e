//! The `host` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::commands;
use crate::engine::speculative::NgramConfig;
pub use crate::model::synthetic::ShapeDtype;
use crate::plugins::{PluginLoadError, RegistryError};

/// Kiln: serve model architectures loaded as plugins.
#[derive(Debug, Parser)]
#[command(name = "host", version, about)]
pub struct Cli {
    /// More log detail (-v: debug, -vv: trace) and full error reports.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the architectures this host can run, built-in and custom.
    ListArchitectures(ListArchitecturesArgs),
    /// Print the graph an architecture builds for a config, optionally compiled.
    InspectGraph(InspectGraphArgs),
    /// Show a checkpoint's tensors and metadata, what the architecture
    /// expects, and how the weight adapter maps one onto the other.
    Inspect(InspectArgs),
    /// Generate text from one prompt, streamed to the terminal.
    Generate(GenerateArgs),
    /// Embed texts with an embedding model, one JSON line per text.
    Embed(EmbedArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(ServeArgs),
    /// Compare the model's logits with reference logits (e.g. from transformers).
    Verify(VerifyArgs),
    /// Measure the serving engine's offline throughput at several concurrency levels.
    Benchmark(BenchmarkArgs),
    /// Write a new plugin crate that starts from a built-in family and
    /// replaces one block, with a test and a fixture generator.
    NewPlugin(NewPluginArgs),
    /// Compile the CUDA kernels for GPU architectures into the kernel cache,
    /// without a GPU (for images and machines that should start warm).
    Precompile(commands::PrecompileArgs),
}

/// Options of `host new-plugin`.
#[derive(Debug, Args)]
pub struct NewPluginArgs {
    /// The crate's name (the architecture is `<Name>ForCausalLM`).
    pub name: String,

    /// The family to start from.
    #[arg(long, value_enum, default_value = "llama")]
    pub from: PluginTemplate,

    /// Where to write the crate (default: `./<name>`).
    #[arg(long)]
    pub dir: Option<PathBuf>,

    /// The Kiln checkout the crate depends on by path (default: the one this
    /// host was built from).
    #[arg(long)]
    pub kiln: Option<PathBuf>,
}

/// The families `host new-plugin` starts from.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum PluginTemplate {
    /// A Llama variant that replaces the MLP's activation.
    Llama,
}

/// Options of `host benchmark`.
#[derive(Debug, Args)]
pub struct BenchmarkArgs {
    /// A model directory, a `.gguf` file, or a Hugging Face id (`org/name`)
    /// in the local Hugging Face cache; with `--url`, the name the server
    /// serves.
    #[arg(long, required_unless_present = "shape", conflicts_with = "shape")]
    pub model: Option<String>,

    /// Load a running OpenAI-compatible server at this URL (e.g.
    /// `http://127.0.0.1:8000`) instead of a model in this process, like
    /// `vllm bench serve`.
    #[arg(long, conflicts_with = "shape")]
    pub url: Option<String>,

    /// With `--url`: how many requests.
    #[arg(long, default_value_t = 64)]
    pub num_prompts: usize,

    /// With `--url`: requests per second, arriving as a Poisson process
    /// (`inf`: all at once).
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,

    /// With `--url`: most requests in flight (default: no limit).
    #[arg(long)]
    pub max_concurrency: Option<usize>,

    /// With `--url`: prompts from a JSONL file's `prompt` fields (default:
    /// `--input-len` random words).
    #[arg(long)]
    pub dataset: Option<PathBuf>,

    #[command(flatten)]
    pub location: ModelLocation,

    /// Instead of `--model`: random weights at a shape, `llama3-8b`,
    /// `llama3.2-1b`, or a path to a Hugging Face `config.json`.
    #[arg(long)]
    pub shape: Option<String>,

    /// How `--shape`'s random weights are stored [default: bf16].
    #[arg(long, value_enum)]
    pub shape_dtype: Option<ShapeDtype>,

    #[command(flatten)]
    pub plugins: PluginArgs,

    #[command(flatten)]
    pub runtime: RuntimeArgs,

    /// Prompt tokens per request (random ids).
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,

    /// Tokens each request generates (end-of-sequence is ignored).
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,

    /// Concurrency levels: that many requests arrive at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub concurrency: Vec<usize>,

    /// Unmeasured runs of each concurrency level before the measured one, as
    /// the PyTorch baseline (`bench/gpu/torch_baseline.py`) warms up: a
    /// level's first run pays once for what the server keeps (CUDA graphs of
    /// its step shapes); 0 measures the first run [default: 1, not with
    /// `--url`]
    #[arg(long)]
    pub warmup_runs: Option<usize>,

    /// Sampling temperature of every request (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,

    /// Nucleus (top-p) cut of every request (1: none).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,

    /// Repetition penalty of every request (1: none): its picks then depend
    /// on the output so far.
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,

    /// Most tokens in one engine step (prefill chunks included).
    #[arg(long, default_value_t = 2048)]
    pub max_batch_tokens: usize,

    #[command(flatten)]
    pub scheduling: SchedulingArgs,

    /// Seed of the random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// How the serving engine overlaps the host's work with the device's.
#[derive(Debug, Args)]
pub struct SchedulingArgs {
    /// On CUDA: schedule and launch each step before reading the previous
    /// one's tokens, which the GPU feeds to it, so the host's work (text,
    /// stop checks, scheduling) runs while the GPU computes; a sequence that
    /// stops computes one token more, which is dropped (the default; vLLM's
    /// flag).
    #[arg(long, conflicts_with = "no_async_scheduling")]
    pub async_scheduling: bool,

    /// Read each step's tokens before scheduling the next.
    #[arg(long)]
    pub no_async_scheduling: bool,

    /// Speculative decoding, vLLM's JSON; only n-gram lookup, e.g.
    /// '{"method": "ngram", "num_speculative_tokens": 4,
    /// "prompt_lookup_max": 4, "prompt_lookup_min": 2}': greedy requests
    /// verify the tokens that followed an earlier occurrence of their last
    /// tokens, several a step (the output is unchanged). Steps then run one
    /// at a time (no async scheduling).
    #[arg(long, value_parser = NgramConfig::parse, conflicts_with = "async_scheduling")]
    pub speculative_config: Option<NgramConfig>,
}

impl SchedulingArgs {
    /// Whether async scheduling is on.
    pub fn enabled(&self) -> bool {
        !self.no_async_scheduling && self.speculative_config.is_none()
    }
}

/// Options of `host serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub load: LoadArgs,

    #[command(flatten)]
    pub scheduling: SchedulingArgs,

    /// Address to bind (loopback by default; use 0.0.0.0 to expose).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to bind.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Require `Authorization: Bearer <KEY>` on the API routes.
    #[arg(long, env = "KILN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// The model name clients send (default: --model as given).
    #[arg(long)]
    pub served_model_name: Option<String>,

    /// Requests running at once (vLLM's `--max-num-seqs` too).
    #[arg(long, visible_alias = "max-num-seqs", default_value_t = 32)]
    pub max_batch_size: usize,

    /// Tokens per step, prefill chunks plus decodes (vLLM's
    /// `--max-num-batched-tokens` too).
    #[arg(long, visible_alias = "max-num-batched-tokens", default_value_t = 2048)]
    pub max_batch_tokens: usize,

    /// A chat template to use instead of the model's: a file, or the
    /// template itself (vLLM's flag).
    #[arg(long)]
    pub chat_template: Option<String>,

    /// Memory for the KV cache on the CPU, e.g. `512MiB`, `2GiB` (default:
    /// a tenth of the memory available at start, no more than the batch's
    /// sequences at full length need, at least 256 MiB).
    #[arg(long, value_parser = parse_size)]
    pub kv_cache_memory: Option<u64>,

    /// Where default sampling parameters come from: `auto` (the model's
    /// generation_config.json: its sampling if it asks to sample, else
    /// greedy), `vllm` (none: temperature 1, no filters) or a directory
    /// with a generation_config.json (vLLM's flag).
    #[arg(long, default_value = "auto")]
    pub generation_config: crate::engine::defaults::GenerationConfig,

    /// On CUDA: the fraction of the device's memory this server may use;
    /// the KV cache takes what the weights and the largest step's
    /// activations leave of it (vLLM's flag).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,

    /// Positions per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,

    /// Do not share KV-cache blocks between requests with a common prefix.
    #[arg(long, conflicts_with = "enable_prefix_caching")]
    pub no_prefix_caching: bool,

    /// Share KV-cache blocks between requests with a common prefix (the
    /// default; vLLM's flag).
    #[arg(long)]
    pub enable_prefix_caching: bool,

    /// Most sequences one request may make (its prompts × `n`); more is
    /// refused with a 400.
    #[arg(long, default_value_t = 128)]
    pub max_seqs_per_request: usize,

    /// Read special-token text in chat message content (such as
    /// `<|im_end|>`) as special tokens. By default it is plain text, so a
    /// message cannot close its turn or forge another; only the chat
    /// template's own markers are special.
    #[arg(long)]
    pub allow_special_tokens_in_messages: bool,

    /// How the model writes tool calls (vLLM's flag): `hermes`
    /// (`<tool_call>` blocks: Qwen2.5, ChatML), `llama3_json` or
    /// `mistral`. Default: the parser the architecture's plugin names,
    /// else the chat template's markers; with neither, tool requests are
    /// refused with a 400.
    #[arg(long, value_enum)]
    pub tool_call_parser: Option<crate::server::tools::ToolFormat>,

    /// Return a reasoning model's thinking (`<think>` … `</think>`) apart
    /// from its answer, as the chat message's `reasoning_content` (vLLM's
    /// flag): `deepseek_r1` or `qwen3`. Structured output and required tool
    /// calls then constrain the answer only.
    #[arg(long, value_enum)]
    pub reasoning_parser: Option<crate::server::reasoning::ReasoningFormat>,

    /// Refuse to start unless a tool-call format is known (vLLM's flag).
    /// Kiln reads tool calls (`tool_choice: auto`) whenever a format is
    /// known, with or without it; vLLM needs it for `auto`.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,

    /// Origins a browser may call the API from (CORS), e.g.
    /// `https://app.example.com`, or `*` for any; repeat or separate with
    /// commas. Default: none (vLLM's flag).
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,

    /// Most open client connections; more are answered 503 and closed
    /// (lowered to what the descriptor limit allows).
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,

    /// Seconds a client has to send a request's headers (which also bounds
    /// an idle keep-alive connection), and again its body (408 after).
    #[arg(long, default_value_t = 30.0)]
    pub http_timeout: f64,

    /// Largest accepted request body, e.g. `4MiB`.
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    pub max_request_bytes: u64,
}

/// Which model to load, with which plugins, and how to run it (`serve`,
/// `generate`, `verify`, `benchmark`).
#[derive(Debug, Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub model: ModelArgs,

    #[command(flatten)]
    pub plugins: PluginArgs,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

/// How a model is run once loaded.
#[derive(Debug, Args)]
pub struct RuntimeArgs {
    /// Longest sequence, prompt plus output (default: the model's limit;
    /// vLLM's `--max-model-len` too).
    #[arg(long, visible_alias = "max-model-len")]
    pub max_length: Option<u32>,

    /// Where to run: `cpu`, `cuda`/`cuda:N` (`gpu`/`gpu:N` too), or
    /// `cuda-emulated` (the CUDA backend's kernels run on the CPU through the
    /// kernel emulator: slow, for testing). `host benchmark` also takes
    /// `cuda-null`: the CUDA backend over a device that runs nothing, which
    /// times the host's share of each step alone.
    #[arg(long, default_value = "cpu")]
    pub device: String,

    /// On CUDA: how weights are stored for matrix products. `auto` keeps
    /// bf16 and f16 as stored and GGUF blocks packed (every format Kiln
    /// reads), and turns f32 into bf16; `float32` stores everything as f32
    /// (matches the CPU backend).
    #[arg(long, value_enum, default_value_t = DtypeArg::Auto)]
    pub dtype: DtypeArg,

    /// The KV cache's element type (llama.cpp's `--cache-type-k/v`). `auto`
    /// is bf16 on CUDA (f32 with `--dtype float32`); on the CPU, f16 with
    /// `--precision fast` (llama.cpp's default, half the memory) and f32
    /// with `--precision exact`, which promises transformers' logits within
    /// 1e-4. `float16` and `q8_0` (ggml's Q8_0 blocks, 8.5 bits a number,
    /// for heads of a multiple of 32) are for the CPU only, `fp8` (E4M3, as
    /// vLLM's with its default scale of 1) for CUDA only.
    #[arg(long, value_enum, default_value_t = KvCacheDtypeArg::Auto)]
    pub kv_cache_dtype: KvCacheDtypeArg,

    /// On CUDA: which attention kernels run. `auto` runs prefill on tensor
    /// cores (flash attention over the bf16 or fp8 cache, head_dim 64, 96 or
    /// 128), decode rows too (head_dim 64, 128 or 256, at most 8 query heads a
    /// key/value head), and the portable kernels elsewhere;
    /// `portable` runs the portable CUDA-core kernels everywhere.
    #[arg(long, value_enum, default_value_t = AttentionBackendArg::Auto)]
    pub attention_backend: AttentionBackendArg,

    /// On CUDA: launch every kernel of every step instead of capturing a
    /// step's launches as a CUDA graph and replaying it (vLLM's flag).
    #[arg(long)]
    pub enforce_eager: bool,

    /// Arithmetic of quantized weights. On CUDA, `fast` gives the decode
    /// products of the GGUF matrices kept packed (up to 8 rows of x) 8-bit
    /// activations and integer dot products, as llama.cpp's MMVQ;
    /// `fast-residual` does the same but for the products it gives two
    /// digits, which keep f32 activations there. On CPUs with AVX512_BF16
    /// (Zen 4 and later, Sapphire Rapids), `fast` also multiplies bf16
    /// weights by activations rounded to bf16, in pairs, as llama.cpp does.
    #[arg(long, value_enum, default_value_t = PrecisionArg::Exact)]
    pub precision: PrecisionArg,

    /// Compile even if the compile cache has the graph.
    #[arg(long)]
    pub no_compile_cache: bool,

    /// Scan every weight for NaN and infinity at load, and refuse a model
    /// that has any (llama.cpp's `--check-tensors`).
    #[arg(long)]
    pub check_weights: bool,

    /// Quantize the checkpoint's float matrices at load (vLLM's flag):
    /// `q8_0` stores them as GGUF Q8_0 blocks, the bytes `llama-quantize`
    /// would write, read by the Q8_0 kernels on every device (about half
    /// of bf16's bytes a decode step); `q4_0` as Q4_0 blocks (4.5 bits a
    /// weight), the vocabulary's matrices (embeddings, LM head) as Q8_0;
    /// `q5_k_m`, `q4_k_m`, `q3_k_m`, `q2_k` and `iq4_xs` as llama.cpp's mixes of those names, the bytes
    /// `llama-quantize` writes without an importance matrix. Vectors (norms,
    /// biases) and routers of experts stay as stored. Not with `--shape`
    /// (use `--shape-dtype`).
    #[arg(long, value_enum, default_value_t = QuantizationArg::None)]
    pub quantization: QuantizationArg,

    /// What the model is run as (vLLM's flag): `pooling` runs a Llama,
    /// Mistral, Qwen2 or Qwen3 checkpoint as an embedding model (the final
    /// hidden state of each text's last token, pooled and normalized as its
    /// sentence-transformers files say: Qwen3-Embedding, gte-Qwen2,
    /// e5-mistral); `host embed` implies it.
    #[arg(long, value_enum, default_value_t = crate::model::Runner::Auto)]
    pub runner: crate::model::Runner,
}

/// Parses sizes like `4096`, `512MiB`, `2GiB`, `1.5GB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 512MiB, 2GiB)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024.0 * 1024.0,
        "gib" | "g" => 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        other => {
            return Err(format!(
                "unknown size unit `{other}` (use KiB, MiB, GiB, KB, MB or GB)"
            ))
        }
    };
    Ok((number * scale) as u64)
}

/// Arithmetic of quantized weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// Dequantize blocks and accumulate in f32 (matches transformers fp32).
    Exact,
    /// Quantize activations to 8 bits and use integer dot products (llama.cpp's way); bf16 weights on CPUs with AVX512_BF16 take activations rounded to bf16.
    Fast,
    /// As `fast`, but the products where 8 bits lose most, the attention projections (queries, keys, values, output) and a gated MLP's down projection, carry their activations as two 8-bit digits: on the real-model prompts, a KL divergence from exact precision 2.7x (SmolLM2) to 7x (Qwen2.5, Gemma 3) below `fast`'s and at or below llama.cpp's on every prompt, at most of `fast`'s speed.
    FastResidual,
}

/// `--quantization`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantizationArg {
    /// Weights as stored.
    None,
    /// Float matrices as GGUF Q8_0 blocks.
    #[value(name = "q8_0")]
    Q8_0,
    /// Float matrices as GGUF Q4_0 blocks (the vocabulary's as Q8_0).
    #[value(name = "q4_0")]
    Q4_0,
    /// llama.cpp's Q4_K_M mix: Q4_K, Q6_K for the LM head and half of the value and down projections (Q5_0 and Q8_0 for rows that are not multiples of 256).
    #[value(name = "q4_k_m")]
    Q4KM,
    /// llama.cpp's Q5_K_M mix: as q4_k_m with Q5_K (Q5_1 for rows that are not multiples of 256).
    #[value(name = "q5_k_m")]
    Q5KM,
    /// llama.cpp's Q3_K_M mix: Q3_K, Q6_K for the LM head, Q4_K (Q5_K early) for the output, value and down projections.
    #[value(name = "q3_k_m")]
    Q3KM,
    /// llama.cpp's Q2_K mix: Q2_K, Q6_K for the LM head, Q3_K (or Q4_K) for the output, value and down projections.
    #[value(name = "q2_k")]
    Q2K,
    /// llama.cpp's IQ4_XS mix: IQ4_XS (IQ4_NL for rows that are not multiples of 256), Q6_K for the LM head, Q5_K for the first eighth of the down projections (and the value projections where four query heads share a key/value head).
    #[value(name = "iq4_xs")]
    Iq4Xs,
}

impl From<QuantizationArg> for crate::model::LoadQuantization {
    fn from(arg: QuantizationArg) -> Self {
        match arg {
            QuantizationArg::None => Self::None,
            QuantizationArg::Q8_0 => Self::Q8_0,
            QuantizationArg::Q4_0 => Self::Q4_0,
            QuantizationArg::Q4KM => Self::Q4KM,
            QuantizationArg::Q5KM => Self::Q5KM,
            QuantizationArg::Q3KM => Self::Q3KM,
            QuantizationArg::Q2K => Self::Q2K,
            QuantizationArg::Iq4Xs => Self::IQ4XS,
        }
    }
}

/// `--dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DtypeArg {
    /// bf16/f16 as stored; GGUF blocks packed; f32 as bf16.
    Auto,
    /// Everything as f32.
    Float32,
    /// Everything as bf16.
    Bfloat16,
}

/// `--kv-cache-dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtypeArg {
    /// bf16, or f32 with `--dtype float32`.
    Auto,
    /// f32.
    Float32,
    /// bf16.
    Bfloat16,
    /// f16 (CPU only).
    Float16,
    /// Q8_0 blocks, 34 bytes per 32 numbers, as llama.cpp's `q8_0` (CPU
    /// only).
    #[value(name = "q8_0")]
    Q8_0,
    /// 8-bit floats (E4M3, vLLM's `fp8`/`fp8_e4m3` with a scale of 1:
    /// values saturate at ±448): a quarter of f32's bytes (CUDA only).
    #[value(name = "fp8", alias = "fp8_e4m3")]
    Fp8,
}

/// `--attention-backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttentionBackendArg {
    /// Tensor cores for prefill and decode where the kernels apply.
    Auto,
    /// The portable kernels everywhere.
    Portable,
}

impl From<AttentionBackendArg> for crate::runtime::cuda::AttentionBackend {
    fn from(value: AttentionBackendArg) -> Self {
        match value {
            AttentionBackendArg::Auto => Self::Auto,
            AttentionBackendArg::Portable => Self::Portable,
        }
    }
}

impl From<KvCacheDtypeArg> for crate::runtime::KvCacheDtype {
    fn from(value: KvCacheDtypeArg) -> Self {
        match value {
            KvCacheDtypeArg::Auto => Self::Auto,
            KvCacheDtypeArg::Float32 => Self::Float32,
            KvCacheDtypeArg::Bfloat16 => Self::BFloat16,
            KvCacheDtypeArg::Float16 => Self::Float16,
            KvCacheDtypeArg::Q8_0 => Self::Q8_0,
            KvCacheDtypeArg::Fp8 => Self::Fp8E4m3,
        }
    }
}

impl From<DtypeArg> for crate::runtime::cuda::WeightDtype {
    fn from(value: DtypeArg) -> Self {
        match value {
            DtypeArg::Auto => Self::Auto,
            DtypeArg::Float32 => Self::Float32,
            DtypeArg::Bfloat16 => Self::BFloat16,
        }
    }
}

impl PrecisionArg {
    /// The value as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PrecisionArg::Exact => "exact",
            PrecisionArg::Fast => "fast",
            PrecisionArg::FastResidual => "fast-residual",
        }
    }
}

impl From<PrecisionArg> for crate::runtime::Precision {
    fn from(value: PrecisionArg) -> Self {
        match value {
            PrecisionArg::Exact => crate::runtime::Precision::Exact,
            PrecisionArg::Fast => crate::runtime::Precision::Fast,
            PrecisionArg::FastResidual => crate::runtime::Precision::FastResidual,
        }
    }
}

/// How `host generate` prints its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Stream text to the terminal.
    Text,
    /// One JSON object at the end.
    Json,
}

/// Options of `host generate`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_ids"])))]
pub struct GenerateArgs {
    #[command(flatten)]
    pub load: LoadArgs,

    /// The prompt text.
    #[arg(long)]
    pub prompt: Option<String>,

    /// The prompt as token ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,

    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,

    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,

    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,

    /// Sampling temperature (0: greedy; default: the model's generation config, else greedy).
    #[arg(long)]
    pub temperature: Option<f32>,

    /// Nucleus sampling threshold.
    #[arg(long)]
    pub top_p: Option<f32>,

    /// Keep only the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,

    /// Drop tokens less likely than min_p × the most likely.
    #[arg(long)]
    pub min_p: Option<f32>,

    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,

    /// `text` streams the output; `json` prints `{"prompt_ids", "generated_ids", "text"}`.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,

    /// Write the prompt's teacher-forced logits, float32 [prompt_len, vocab], to this .npy file.
    #[arg(long, value_name = "PATH")]
    pub dump_logits: Option<PathBuf>,
}

/// Options of `host embed`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("texts").required(true).args(["text", "input"])))]
pub struct EmbedArgs {
    #[command(flatten)]
    pub load: LoadArgs,

    /// Texts to embed.
    pub text: Vec<String>,

    /// A file of texts to embed, one per line (`-`: standard input).
    #[arg(long, value_name = "PATH", conflicts_with = "text")]
    pub input: Option<PathBuf>,
}

/// Options of `host verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub load: LoadArgs,

    /// A reference directory: `<prompt>.ids.json`, `<prompt>.logits.npy` and
    /// optionally `<prompt>.greedy.json` per prompt, as written by
    /// `tests/real_models/gen_references.py`.
    #[arg(long, value_name = "DIR")]
    pub reference: PathBuf,

    /// Fail unless every logit lies within ATOL + RTOL·|reference| and the
    /// argmax agrees wherever the reference's top-2 margin exceeds twice that band.
    #[arg(long)]
    pub atol: Option<f64>,

    /// Relative part of the tolerance band (with --atol).
    #[arg(long, default_value_t = 0.0, requires = "atol")]
    pub rtol: f64,

    /// Fail if a prompt's mean KL(reference ‖ Kiln) per position exceeds this.
    #[arg(long)]
    pub max_mean_kl: Option<f64>,

    /// Fail if a prompt's top-1 agreement (a fraction, 0–1) is below this.
    #[arg(long)]
    pub min_top1: Option<f64>,

    /// Fail unless each greedy continuation in the reference is reproduced.
    #[arg(long)]
    pub greedy: bool,

    /// Compute the prompt's logits one token at a time, as decode steps do,
    /// instead of in one prefill (the two paths' kernels differ).
    #[arg(long)]
    pub decode: bool,

    /// Also write Kiln's ids, logits and greedy tokens to DIR as a reference
    /// directory, so that another run (another precision, device or
    /// `--decode`) can be verified against this one.
    #[arg(long, value_name = "DIR")]
    pub save: Option<PathBuf>,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options that locate a model.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A model directory, a `.gguf` file, or a Hugging Face id (`org/name`)
    /// in the local Hugging Face cache.
    #[arg(long)]
    pub model: String,

    #[command(flatten)]
    pub location: ModelLocation,
}

/// Where a model's files come from, besides its name.
#[derive(Debug, Args)]
pub struct ModelLocation {
    /// The revision of a Hugging Face id (branch, tag or commit).
    #[arg(long)]
    pub revision: Option<String>,

    /// Weights from elsewhere (e.g. a GGUF file next to a Hugging Face config).
    #[arg(long, value_name = "PATH")]
    pub weight_path: Option<PathBuf>,
}

/// Options of `host inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A model directory, a `.gguf` file, or a Hugging Face id (`org/name`)
    /// in the local Hugging Face cache.
    pub model: String,

    #[command(flatten)]
    pub location: ModelLocation,

    #[command(flatten)]
    pub plugins: PluginArgs,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Plugin options shared by every command that resolves architectures.
#[derive(Debug, Args)]
pub struct PluginArgs {
    /// A plugin library, or a directory of them, to load beside the built-ins
    /// (repeatable). A custom architecture overrides a built-in of the same name.
    #[arg(long = "custom-architectures", value_name = "PATH")]
    pub custom_architectures: Vec<PathBuf>,
}

/// Options of `host list-architectures`.
#[derive(Debug, Args)]
pub struct ListArchitecturesArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Options of `host inspect-graph`.
#[derive(Debug, Args)]
pub struct InspectGraphArgs {
    #[command(flatten)]
    pub plugins: PluginArgs,

    /// The architecture (a name or alias from `list-architectures`).
    #[arg(long)]
    pub architecture: String,

    /// The model's Hugging Face `config.json`.
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,

    /// Longest sequence to plan for (default: the model's limit).
    #[arg(long)]
    pub max_length: Option<u32>,

    /// Also compile the graph and print the kernel steps and what each pass did.
    #[arg(long)]
    pub compiled: bool,

    /// Compile even if the compile cache has the graph.
    #[arg(long)]
    pub no_compile_cache: bool,

    /// Scan every weight for NaN and infinity at load, and refuse a model
    /// that has any (llama.cpp's `--check-tensors`).
    #[arg(long)]
    pub check_weights: bool,
}

/// Runs the command line and returns the process exit code. Errors are printed
/// as `error: …` lines (their full detail with `-v`), never as panics.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    crate::logging::init(cli.verbose);
    let result = match &cli.command {
        Command::ListArchitectures(args) => commands::list_architectures(args),
        Command::InspectGraph(args) => commands::inspect_graph(args),
        Command::Inspect(args) => commands::inspect(args),
        Command::Generate(args) => commands::generate(args),
        Command::Embed(args) => commands::embed(args),
        Command::Serve(args) => commands::serve(args),
        Command::Verify(args) => commands::verify(args),
        Command::Benchmark(args) => commands::benchmark(args),
        Command::NewPlugin(args) => commands::new_plugin(args),
        Command::Precompile(args) => commands::precompile(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            report(&error, cli.verbose > 0);
            ExitCode::FAILURE
        }
    }
}

fn report(error: &anyhow::Error, verbose: bool) {
    eprintln!("error: {error:#}");
    if verbose {
        let detail = error
            .downcast_ref::<RegistryError>()
            .and_then(|e| match e {
                RegistryError::Load(load) => load.detail(),
                RegistryError::DuplicateName { .. } => None,
            })
            .or_else(|| {
                error
                    .downcast_ref::<PluginLoadError>()
                    .and_then(PluginLoadError::detail)
            });
        if let Some(detail) = detail {
            eprintln!("\ndetail:\n{detail}");
        }
    }
}
