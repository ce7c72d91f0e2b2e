//! `host serve`: load the model, start the engine, serve the OpenAI API until
//! SIGINT/SIGTERM.

use std::sync::Arc;

use anyhow::Context;

use crate::cli::ServeArgs;
use crate::embedding::service::EmbedderThread;
use crate::embedding::Embedder;
use crate::engine::batch::worst_case_inputs;
use crate::engine::defaults::generation_defaults_from;
use crate::engine::service::{self, EngineConfig, EngineHandle, EngineThread};
use crate::engine::structured::Grammars;
use crate::scheduler::SchedulerConfig;
use crate::server::metrics::Metrics;
use crate::server::openai::Limits;
use crate::server::tools::ToolFormat;
use crate::server::{self, router, AppState, Served};
use kiln_plugin_api::Task;

/// The smallest KV cache (in tokens) serve starts with, unless the model's
/// context is shorter.
const MIN_CACHE_TOKENS: usize = 256;

/// Runs the server.
pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    if let Some(key) = &args.api_key {
        anyhow::ensure!(
            !key.is_empty() && key.trim() == key,
            "--api-key (or KILN_API_KEY) is empty or begins or ends with whitespace: HTTP drops that \
             whitespace from the Authorization header, so no client could send this key"
        );
    }
    let started = std::time::Instant::now();
    let mut model = super::load_model(&args.load)?;
    tracing::info!("{}", describe(&model, started.elapsed()));
    let tokenizer = Arc::new(model.tokenizer.take().context("the model has no tokenizer (tokenizer.json or GGUF tokenizer metadata); it cannot be served")?);
    // `--chat-template` is a file or the template itself.
    let given_template = match &args.chat_template {
        Some(given) if std::path::Path::new(given).is_file() => Some(
            std::fs::read_to_string(given)
                .with_context(|| format!("reading --chat-template {given}"))?,
        ),
        given => given.clone(),
    };
    let chat_template = match &given_template {
        None => tokenizer.chat_template()?,
        Some(source) => Some(
            tokenizer
                .chat_template_from(source)
                .context("--chat-template")?,
        ),
    };
    let template_source = given_template
        .as_deref()
        .or(tokenizer.chat_template_source());
    let encoder = model.task != Task::TextGeneration;
    let tool_format = if encoder {
        None
    } else {
        tool_format(&model, args, template_source)?
    };
    let defaults = generation_defaults_from(&model, &args.generation_config);
    let vocab_size = model
        .hf_config
        .get("vocab_size")
        .and_then(|v| v.as_u64())
        .map_or(tokenizer.vocab_size(), |v| v as usize);
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_model_name(&args.load.model.model));
    let metrics = Metrics::new(&model_name, args.block_size);
    let (served, worker, max_model_len) = if encoder {
        let embedder = Embedder::new(model, args.max_batch_tokens).map_err(anyhow::Error::msg)?;
        tracing::info!(
            "{}, at most {} tokens per text",
            embedder.head(),
            embedder.max_tokens()
        );
        let max_tokens = embedder.max_tokens();
        let (handle, thread) = crate::embedding::service::spawn(embedder);
        (
            Served::Embedder(handle),
            Worker::Embedder(thread),
            max_tokens,
        )
    } else {
        let (engine, thread, max_model_len) =
            start_engine(model, args, &tokenizer, &defaults.eos_token_ids, &metrics)?;
        (
            Served::Generator(engine),
            Worker::Engine(thread),
            max_model_len,
        )
    };
    let max_prompt_bytes = max_model_len
        .saturating_mul(tokenizer.longest_token_bytes())
        .saturating_mul(2);
    let grammars = Grammars::new(
        tokenizer.clone(),
        defaults.eos_token_ids.clone(),
        vocab_size,
    );
    let reasoning = match args.reasoning_parser {
        Some(format) if !encoder => {
            tracing::info!("chats' thinking is returned apart ({format:?} reasoning parser)");
            Some(format)
        }
        Some(_) => anyhow::bail!("--reasoning-parser: an encoder model does not generate"),
        None => None,
    };
    let state = Arc::new(AppState {
        served,
        tokenizer,
        chat_template,
        model_name: model_name.clone(),
        vocab_size,
        limits: Limits {
            max_model_len,
            max_tokens: max_model_len,
            max_n: 16,
            vocab_size,
            max_seqs_per_request: args.max_seqs_per_request,
            // Twice the longest token per position: no text beyond it fits
            // (the margin covers normalizers that shorten text).
            max_prompt_bytes,
            allow_special_tokens_in_messages: args.allow_special_tokens_in_messages,
        },
        defaults: defaults.sampling,
        api_key: args.api_key.clone(),
        metrics,
        grammars,
        tool_format,
        reasoning,
    });
    let timeout = std::time::Duration::from_secs_f64(args.http_timeout);
    let app = router(
        state,
        args.max_request_bytes as usize,
        timeout,
        &args.allowed_origins,
    )
    .map_err(anyhow::Error::msg)?;
    // Each connection is a descriptor; keep some for the model, the
    // runtime and logging.
    let descriptors = server::raise_descriptor_limit();
    let max_connections = args
        .max_connections
        .min(descriptors.saturating_sub(64).max(1) as usize);
    if max_connections < args.max_connections {
        tracing::warn!(
            "--max-connections {} lowered to {max_connections}: the process may open {descriptors} descriptors",
            args.max_connections
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let served = runtime.block_on(async {
        let address = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .with_context(|| format!("cannot listen on {address}"))?;
        tracing::info!(
            "serving `{model_name}` on http://{}",
            listener.local_addr()?
        );
        server::serve(listener, app, (max_connections, timeout), shutdown_signal()).await?;
        Ok(())
    });
    // Requests still in flight hold engine handles: dropping the runtime
    // drops them, and the engine then stops and releases the device.
    drop(runtime);
    worker.join();
    tracing::info!("stopped");
    served
}

/// Sizes the KV cache (what the weights and the largest step leave of the
/// GPU, or `--kv-cache-memory` on the CPU) and starts the generation engine.
/// Returns it with the longest context the cache serves.
fn start_engine(
    model: crate::model::Model,
    args: &ServeArgs,
    tokenizer: &Arc<crate::tokenizer::Tokenizer>,
    eos: &[u32],
    metrics: &Metrics,
) -> anyhow::Result<(EngineHandle, EngineThread, usize)> {
    let kv = model.config.kv;
    let values_per_layer = args.block_size * kv.num_kv_heads as usize * kv.head_dim as usize;
    let bytes_per_block =
        kv.num_layers as u64 * 2 * model.backend.kv_bytes(values_per_layer) as u64;
    let max_model_len = model.config.max_seq_len as usize;
    // On a GPU the cache takes what the weights and the largest step leave
    // of --gpu-memory-utilization; on the CPU, --kv-cache-memory.
    anyhow::ensure!(
        args.http_timeout > 0.0 && args.http_timeout.is_finite(),
        "--http-timeout must be a positive number of seconds, got {}",
        args.http_timeout
    );
    anyhow::ensure!(
        args.gpu_memory_utilization > 0.0 && args.gpu_memory_utilization <= 1.0,
        "--gpu-memory-utilization must be in (0, 1], got {}",
        args.gpu_memory_utilization
    );
    // A drafted sequence feeds each of its tokens as a step sequence of its
    // own (`Batch::step_batch`).
    let rows_per_sequence = 1 + args
        .scheduling
        .speculative_config
        .map_or(0, |ngram| ngram.num_speculative_tokens);
    let worst_case = worst_case_inputs(
        &model.pipeline,
        args.max_batch_tokens,
        args.max_batch_size.saturating_mul(rows_per_sequence),
        max_model_len.div_ceil(args.block_size),
    )?;
    let kv_memory = match model
        .backend
        .reserve(worst_case, args.gpu_memory_utilization)?
    {
        Some(bytes) => {
            tracing::info!(
                "{}: {:.0} MiB left for the KV cache at --gpu-memory-utilization {}",
                model.backend.device_name(),
                bytes as f64 / (1 << 20) as f64,
                args.gpu_memory_utilization
            );
            bytes as u64
        }
        None => match args.kv_cache_memory {
            Some(bytes) => bytes,
            None => {
                let full = bytes_per_block
                    * max_model_len.div_ceil(args.block_size) as u64
                    * args.max_batch_size as u64;
                let bytes = (available_memory() / 10).min(full).max(256 << 20);
                tracing::info!(
                    "KV cache: {:.0} MiB on the CPU (a tenth of the available memory, at most what {} sequences of {max_model_len} tokens need; --kv-cache-memory sets it)",
                    bytes as f64 / (1 << 20) as f64,
                    args.max_batch_size
                );
                bytes
            }
        },
    };
    let num_blocks = (kv_memory / bytes_per_block.max(1)) as usize;
    let cache_tokens = num_blocks * args.block_size;
    anyhow::ensure!(
        cache_tokens >= max_model_len.min(MIN_CACHE_TOKENS),
        "the KV cache ({kv_memory} bytes) holds {cache_tokens} tokens; give it room for at least {} (--kv-cache-memory on the CPU, --gpu-memory-utilization on a GPU)",
        max_model_len.min(MIN_CACHE_TOKENS)
    );
    // A request can never be longer than the cache: the served context is
    // what the cache holds, and /v1/models says so.
    let model_len = max_model_len;
    let max_model_len = model_len.min(cache_tokens);
    if max_model_len < model_len {
        tracing::warn!(
            "the KV cache holds {cache_tokens} tokens, fewer than the model's context of {model_len}: serving a context of {max_model_len} (more cache memory serves more)"
        );
    }
    anyhow::ensure!(
        args.max_batch_size > 0 && args.max_batch_tokens > 0,
        "--max-batch-size and --max-batch-tokens must be at least 1"
    );
    tracing::info!(
        "KV cache: {num_blocks} blocks of {} positions ({} tokens, {:.0} MiB); max length {max_model_len}; prefix caching {}",
        args.block_size,
        num_blocks * args.block_size,
        kv_memory as f64 / (1 << 20) as f64,
        if args.no_prefix_caching { "off" } else { "on" }
    );
    if let Some(ngram) = args.scheduling.speculative_config {
        tracing::info!(
            "speculative decoding: n-gram lookup of {} to {} tokens, up to {} drafts a step; async scheduling off",
            ngram.prompt_lookup_min,
            ngram.prompt_lookup_max,
            ngram.num_speculative_tokens
        );
    }
    let config = EngineConfig {
        num_blocks,
        block_size: args.block_size,
        scheduler: SchedulerConfig {
            max_batch_size: args.max_batch_size,
            max_batch_tokens: args.max_batch_tokens,
            max_seq_len: max_model_len,
        },
        prefix_caching: !args.no_prefix_caching,
        async_scheduling: args.scheduling.enabled(),
        speculative: args.scheduling.speculative_config,
    };
    let (engine, thread) = service::spawn(
        model,
        tokenizer.clone(),
        eos.to_vec(),
        config,
        metrics.clone(),
    )?;
    Ok((engine, thread, max_model_len))
}

/// The thread that runs the model.
enum Worker {
    Engine(EngineThread),
    Embedder(EmbedderThread),
}

impl Worker {
    /// Waits for it to stop (every handle dropped).
    fn join(self) {
        match self {
            Worker::Engine(thread) => thread.join(),
            Worker::Embedder(thread) => thread.join(),
        }
    }
}

/// Memory available to new allocations (`MemAvailable`), or 4 GiB where
/// the system does not say.
fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(4 << 30, |kib| kib * 1024)
}

/// One line on the loaded model: what, how big, how stored, where, and how
/// long loading and compiling took.
fn describe(model: &crate::model::Model, elapsed: std::time::Duration) -> String {
    let weights = &model.backend.program().graph.weights;
    let parameters: u64 = weights
        .iter()
        .map(|w| w.shape.iter().product::<u64>())
        .sum();
    let mut encodings: Vec<(String, u64)> = Vec::new();
    for w in weights {
        let name = format!("{:?}", w.encoding).to_lowercase();
        let count = w.shape.iter().product::<u64>();
        match encodings.iter_mut().find(|(e, _)| *e == name) {
            Some((_, n)) => *n += count,
            None => encodings.push((name, count)),
        }
    }
    encodings.sort_by_key(|e| std::cmp::Reverse(e.1));
    let stored: Vec<String> = encodings
        .iter()
        .map(|(e, n)| format!("{e} {:.0}%", 100.0 * *n as f64 / parameters.max(1) as f64))
        .collect();
    let compile = match model.compile {
        crate::compiler::CompileOutcome::Compiled(t) => {
            format!("compiled in {:.2} s", t.as_secs_f64())
        }
        crate::compiler::CompileOutcome::Cached(t) => {
            format!("compiled graph from the cache in {:.2} s", t.as_secs_f64())
        }
    };
    format!(
        "loaded {} as {} ({:.1}M parameters; {}) on {} in {:.1} s ({compile})",
        model.resolved.weights.display(),
        model.architecture.info.name,
        parameters as f64 / 1e6,
        stored.join(", "),
        model.backend.device_name(),
        elapsed.as_secs_f64(),
    )
}

/// Resolves on SIGINT or SIGTERM; in-flight requests then finish.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

/// The name `/v1/models` shows without `--served-model-name`: a Hugging
/// Face id as given, a local model by its file or directory name (never the
/// absolute path, which says more about the machine than the model).
fn default_model_name(model: &str) -> String {
    let path = std::path::Path::new(model);
    match path.file_name() {
        Some(name) if path.exists() => name.to_string_lossy().into_owned(),
        _ => model.to_owned(),
    }
}

/// The format tool calls are read in (see [`ToolFormat::resolve`]), logged;
/// with `--enable-auto-tool-choice` (vLLM's flag) a model whose format
/// nothing names is refused at start instead of refusing tool requests.
fn tool_format(
    model: &crate::model::Model,
    args: &ServeArgs,
    template: Option<&str>,
) -> anyhow::Result<Option<ToolFormat>> {
    // The plugin is asked only when the flag does not decide.
    let named = match args.tool_call_parser {
        Some(_) => None,
        None => model
            .architecture
            .serving_defaults(&kiln_plugin_api::ServingRequest {
                config: model.config.clone(),
                chat_template: template.map(str::to_owned),
            })?,
    };
    let plugin_parser = named.as_ref().and_then(|d| d.tool_call_parser.as_deref());
    match ToolFormat::resolve(args.tool_call_parser, plugin_parser, template) {
        Some((format, source)) => {
            tracing::info!("tool calls are read in the {format:?} format (from {source})");
            Ok(Some(format))
        }
        None if args.enable_auto_tool_choice => anyhow::bail!(
            "--enable-auto-tool-choice needs a tool-call format, and neither the architecture \
             nor the chat template names one: add --tool-call-parser hermes|llama3_json|mistral"
        ),
        None => {
            tracing::info!(
                "no tool-call format: neither the architecture nor the chat template names one, \
                 so requests with tools are refused (--tool-call-parser sets one)"
            );
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_local_model_is_named_by_its_file_not_its_path() {
        let file = tempfile::NamedTempFile::with_suffix(".gguf").unwrap();
        let path = file.path().to_str().unwrap();
        let name = file.path().file_name().unwrap().to_str().unwrap();
        assert_eq!(super::default_model_name(path), name);
        assert_eq!(super::default_model_name("org/model"), "org/model");
    }
}
