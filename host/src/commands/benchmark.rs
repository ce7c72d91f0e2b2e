//! `host benchmark`: offline throughput of the serving engine, like vLLM's
//! `benchmark_throughput`. For each concurrency level, that many requests of
//! random prompt ids arrive at once and each generates exactly
//! `--output-len` tokens (end-of-sequence ignored; greedy unless
//! `--temperature` is set); the engine batches them continuously, as `host
//! serve` would. Each level runs `--warmup-runs` times (once by default)
//! before the run it measures.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kiln_kernels::cuda::DriverCall;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cli::BenchmarkArgs;
use crate::engine::penalties::Penalties;
use crate::engine::sampling::SamplingParams;
use crate::engine::service::{self, EngineConfig, EngineHandle, Event, GenerationParams, Request};
use crate::model::{resolve, synthetic, Model};
use crate::plugins::ArchitectureRegistry;
use crate::runtime::Roofline;
use crate::scheduler::SchedulerConfig;
use crate::server::metrics::Metrics;

/// Positions per KV-cache block.
const BLOCK_SIZE: usize = 16;

/// What one concurrency level measured.
#[derive(Debug, Serialize)]
struct LevelResult {
    concurrency: usize,
    input_len: usize,
    output_len: usize,
    wall_s: f64,
    output_tokens: usize,
    /// Generated tokens per second over the whole level.
    output_tok_per_s: f64,
    /// Prompt and generated tokens per second.
    total_tok_per_s: f64,
    mean_ttft_ms: f64,
    max_ttft_ms: f64,
    /// Mean time between a request's generated tokens after its first.
    mean_itl_ms: f64,
    /// Decode steps a second (1 / mean ITL) as a fraction of the memory
    /// roofline's steps a second, on a GPU.
    roofline_fraction: Option<f64>,
    /// Prompt tokens a second until every request had its first token.
    prefill_tok_per_s: f64,
    /// That rate's matrix-product arithmetic as a fraction of the device's
    /// measured bf16 GEMM rate, on a GPU.
    prefill_gemm_fraction: Option<f64>,
    /// Model steps the engine launched.
    steps: u64,
    /// The engine thread's own work per step (scheduling, launching, reading
    /// picks), in milliseconds.
    host_ms_per_step: f64,
    /// Of the host's work, the time inside the driver's calls per step
    /// (launches, uploads, graph replays: `Device::driver_seconds`), where a
    /// driver is called.
    driver_ms_per_step: Option<f64>,
    /// That time by kind of call (launch, gemm, upload, readback, copy,
    /// replay, capture, memory).
    driver_ms_per_step_by_call: Option<BTreeMap<&'static str, f64>>,
    /// The engine thread's wait for the device's picks per step: near zero
    /// with async scheduling, the host sets the pace.
    device_wait_ms_per_step: f64,
    /// Kernels (launches and GEMMs) the device ran per step, on a GPU
    /// backend: each pays a launch gap.
    kernels_per_step: Option<f64>,
    /// Bytes the device copied to the host per step (picks, and logits
    /// where a step brings them back), on a GPU backend.
    read_bytes_per_step: Option<f64>,
    /// Draft tokens verified, and kept, with `--speculative-config`.
    draft_tokens: u64,
    accepted_tokens: u64,
}

/// What the benchmark prints as JSON.
#[derive(Debug, Serialize)]
struct Report {
    device: String,
    /// The quantized products' arithmetic (`--precision`).
    precision: &'static str,
    /// The KV cache's element type (`--kv-cache-dtype`).
    kv_cache_dtype: &'static str,
    /// Every request's temperature (0: greedy), top-p and repetition
    /// penalty.
    temperature: f32,
    top_p: f32,
    repetition_penalty: f32,
    /// The decode-step memory roofline (on a GPU).
    roofline: Option<Roofline>,
    levels: Vec<LevelResult>,
}

/// One request's timings.
struct Timings {
    first_token: Duration,
    finished: Duration,
    tokens: usize,
}

/// Runs the benchmark and prints a table (or JSON with `--json`).
pub fn benchmark(args: &BenchmarkArgs) -> anyhow::Result<()> {
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        ..SamplingParams::default()
    };
    sampling
        .validate()
        .map_err(|e| anyhow::anyhow!("--temperature / --top-p: {e}"))?;
    let penalties = Penalties {
        repetition: args.repetition_penalty,
        ..Penalties::default()
    };
    penalties
        .validate()
        .map_err(|e| anyhow::anyhow!("--repetition-penalty: {e}"))?;
    if let Some(url) = &args.url {
        return super::online_benchmark::online_benchmark(args, url);
    }
    anyhow::ensure!(
        !args.concurrency.is_empty() && !args.concurrency.contains(&0),
        "--concurrency takes positive request counts, e.g. 1,16,64"
    );
    anyhow::ensure!(
        args.input_len > 0 && args.output_len > 0,
        "--input-len and --output-len must be at least 1"
    );
    let mut model = load(args)?;
    let tokenizer = Arc::new(
        model
            .tokenizer
            .take()
            .context("the model has no tokenizer; the serving engine needs one")?,
    );
    let vocab = u32::try_from(tokenizer.vocab_size()).context("vocabulary too large")?;
    let max_seq_len = model.config.max_seq_len as usize;
    let per_request = args.input_len + args.output_len;
    anyhow::ensure!(
        per_request <= max_seq_len,
        "--input-len + --output-len = {per_request} exceeds the model's maximum length {max_seq_len}"
    );
    let most = *args.concurrency.iter().max().expect("checked non-empty");
    let config = EngineConfig {
        // Room for every request of the largest level at once.
        num_blocks: most * per_request.div_ceil(BLOCK_SIZE) + 1,
        block_size: BLOCK_SIZE,
        scheduler: SchedulerConfig {
            max_batch_size: most,
            max_batch_tokens: args.max_batch_tokens,
            max_seq_len,
        },
        prefix_caching: false,
        async_scheduling: args.scheduling.enabled(),
        speculative: args.scheduling.speculative_config,
    };
    let device = model.backend.device_name();
    let roofline = model.backend.roofline()?;
    let kernels = model.backend.kernel_counter();
    let kernels_run = || kernels.as_ref().map(|k| (k.kernels_run(), k.bytes_read()));
    let driver_seconds = || kernels.as_ref().and_then(|k| k.driver_seconds());
    let metrics = Metrics::new("benchmark", config.block_size);
    let (engine, engine_thread) =
        service::spawn(model, tokenizer, Vec::new(), config, metrics.clone())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut prompts = |count: usize| -> Vec<Vec<u32>> {
        (0..count)
            .map(|_| {
                (0..args.input_len)
                    .map(|_| rng.random_range(0..vocab))
                    .collect()
            })
            .collect()
    };

    // First-use allocations and thread-pool start-up; each level then runs
    // `--warmup-runs` times unmeasured first.
    let params = |max_tokens| GenerationParams {
        sampling: sampling.clone(),
        penalties,
        ignore_eos: true,
        ..GenerationParams::greedy(max_tokens)
    };
    runtime.block_on(run_level(&engine, prompts(1), &params(2)))?;
    let mut results = Vec::new();
    for &concurrency in &args.concurrency {
        for _ in 0..args.warmup_runs.unwrap_or(1) {
            runtime.block_on(run_level(
                &engine,
                prompts(concurrency),
                &params(args.output_len),
            ))?;
        }
        let start = Instant::now();
        let before = metrics.engine_totals();
        let drafts_before = metrics.draft_totals();
        let kernels_before = kernels_run();
        let driver_before = driver_seconds();
        let timings = runtime.block_on(run_level(
            &engine,
            prompts(concurrency),
            &params(args.output_len),
        ))?;
        let wall = start.elapsed().as_secs_f64();
        let after = metrics.engine_totals();
        let mut result = summarize(concurrency, args, wall, &timings, roofline);
        let steps = after.0 - before.0;
        result.steps = steps;
        result.host_ms_per_step = (after.1 - before.1) * 1e3 / steps.max(1) as f64;
        result.device_wait_ms_per_step = (after.2 - before.2) * 1e3 / steps.max(1) as f64;
        let drafts = metrics.draft_totals();
        result.draft_tokens = drafts.0 - drafts_before.0;
        result.accepted_tokens = drafts.1 - drafts_before.1;
        let per_step = |n: u64| n as f64 / steps.max(1) as f64;
        if let (Some(after), Some(before)) = (driver_seconds(), driver_before) {
            let by_call: BTreeMap<&'static str, f64> = DriverCall::ALL
                .iter()
                .map(|&call| {
                    let seconds = after[call as usize] - before[call as usize];
                    (call.name(), seconds * 1e3 / steps.max(1) as f64)
                })
                .collect();
            result.driver_ms_per_step = Some(by_call.values().sum());
            result.driver_ms_per_step_by_call = Some(by_call);
        }
        if let (Some(after), Some(before)) = (kernels_run(), kernels_before) {
            result.kernels_per_step = Some(per_step(after.0 - before.0));
            result.read_bytes_per_step = Some(per_step(after.1 - before.1));
        }
        results.push(result);
    }
    // The model (and its device) is released on the engine thread, before
    // the process exits.
    drop(engine);
    engine_thread.join();
    let kv_cache_dtype = crate::runtime::KvCacheDtype::from(args.runtime.kv_cache_dtype).name();
    let text = if args.json {
        let report = Report {
            device,
            precision: args.runtime.precision.name(),
            kv_cache_dtype,
            temperature: args.temperature,
            top_p: args.top_p,
            repetition_penalty: args.repetition_penalty,
            roofline,
            levels: results,
        };
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        let mut text = format!(
            "device: {device}\nprecision: {}\nkv cache: {kv_cache_dtype}\nsampling: temperature {}, top-p {}, repetition penalty {}\n",
            args.runtime.precision.name(),
            args.temperature,
            args.top_p,
            args.repetition_penalty
        );
        if let Some(r) = roofline {
            text += &format!(
                "roofline: {:.3} MB of weights per decode step at {:.1} GB/s copy bandwidth: at most {:.1} steps/s\n\
                 prefill: {:.3} GFLOP of products per token at {:.1} TFLOP/s (bf16 GEMM): at most {:.0} tokens/s\n",
                r.weight_bytes_per_step as f64 / 1e6,
                r.copy_bytes_per_s / 1e9,
                r.steps_per_s(),
                r.product_flops_per_token / 1e9,
                r.gemm_flops_per_s / 1e12,
                r.prefill_tokens_per_s()
            );
        }
        text + &table(&results)
    };
    super::write_stdout(&text)
}

/// The model `--model` names, or random weights at `--shape`.
fn load(args: &BenchmarkArgs) -> anyhow::Result<Model> {
    let registry = ArchitectureRegistry::load(&args.plugins.custom_architectures)?;
    let options = super::load_options(&args.runtime)?;
    anyhow::ensure!(
        args.shape.is_some() || args.shape_dtype.is_none(),
        "--shape-dtype applies to --shape's random weights; --model's are stored as its checkpoint says"
    );
    anyhow::ensure!(
        args.shape.is_none() || options.quantization == crate::model::LoadQuantization::None,
        "--quantization applies to a checkpoint's weights; --shape's random weights take --shape-dtype (e.g. q8_0)"
    );
    Ok(match (&args.model, &args.shape) {
        (_, Some(shape)) => synthetic::load(
            &registry,
            shape,
            synthetic::shape_config(shape)?,
            args.shape_dtype.unwrap_or(synthetic::ShapeDtype::Bf16),
            &options,
        )?,
        (Some(model), None) => {
            let resolved = resolve(
                model,
                args.location.revision.as_deref(),
                args.location.weight_path.as_deref(),
            )?;
            crate::model::load(&registry, resolved, &options)?
        }
        (None, None) => anyhow::bail!("--model or --shape names what to benchmark"),
    })
}

/// Submits every prompt at once and waits for all of them to finish.
async fn run_level(
    engine: &EngineHandle,
    prompts: Vec<Vec<u32>>,
    params: &GenerationParams,
) -> anyhow::Result<Vec<Timings>> {
    let start = Instant::now();
    let (mut requests, mut receivers) = (Vec::new(), Vec::new());
    for (group, prompt) in (0u64..).zip(prompts) {
        let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
        requests.push(Request {
            prompt,
            params: params.clone(),
            events,
            arrived: start,
            group,
            constraint: None,
        });
        receivers.push(receiver);
    }
    // All at once: the level's requests arrive together, so its steps do
    // not depend on when the engine thread wakes.
    engine.submit_all(requests).map_err(anyhow::Error::msg)?;
    let waits = receivers.into_iter().map(|mut receiver| async move {
        let mut first_token = None;
        while let Some(event) = receiver.recv().await {
            match event {
                Event::Chunk { .. } => {
                    first_token.get_or_insert_with(|| start.elapsed());
                }
                Event::PromptLogprobs(_) => {}
                Event::Done {
                    completion_tokens, ..
                } => {
                    let finished = start.elapsed();
                    return Ok(Timings {
                        first_token: first_token.unwrap_or(finished),
                        finished,
                        tokens: completion_tokens,
                    });
                }
                Event::Error(message) => anyhow::bail!("a request failed: {message}"),
            }
        }
        anyhow::bail!("the engine stopped before a request finished")
    });
    futures_util::future::try_join_all(waits).await
}

fn summarize(
    concurrency: usize,
    args: &BenchmarkArgs,
    wall: f64,
    timings: &[Timings],
    roofline: Option<Roofline>,
) -> LevelResult {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let output_tokens: usize = timings.iter().map(|t| t.tokens).sum();
    let itls: Vec<f64> = timings
        .iter()
        .filter(|t| t.tokens > 1)
        .map(|t| ms(t.finished - t.first_token) / (t.tokens - 1) as f64)
        .collect();
    let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len().max(1) as f64;
    let ttfts: Vec<f64> = timings.iter().map(|t| ms(t.first_token)).collect();
    let max_ttft_ms = ttfts.iter().copied().fold(0.0, f64::max);
    let prefill_tok_per_s = (concurrency * args.input_len) as f64 / (max_ttft_ms / 1e3);
    LevelResult {
        concurrency,
        input_len: args.input_len,
        output_len: args.output_len,
        wall_s: wall,
        output_tokens,
        output_tok_per_s: output_tokens as f64 / wall,
        total_tok_per_s: (concurrency * args.input_len + output_tokens) as f64 / wall,
        mean_ttft_ms: mean(&ttfts),
        max_ttft_ms,
        mean_itl_ms: mean(&itls),
        roofline_fraction: roofline
            .filter(|_| !itls.is_empty())
            .map(|r| 1e3 / mean(&itls) / r.steps_per_s()),
        prefill_tok_per_s,
        prefill_gemm_fraction: roofline.map(|r| prefill_tok_per_s / r.prefill_tokens_per_s()),
        steps: 0,
        host_ms_per_step: 0.0,
        driver_ms_per_step: None,
        driver_ms_per_step_by_call: None,
        device_wait_ms_per_step: 0.0,
        kernels_per_step: None,
        read_bytes_per_step: None,
        draft_tokens: 0,
        accepted_tokens: 0,
    }
}

fn table(results: &[LevelResult]) -> String {
    let mut out = String::from(
        "concurrency  input  output  wall s  output tok/s  total tok/s  mean TTFT ms  max TTFT ms  mean ITL ms  of roofline  prefill tok/s  of GEMM rate  host ms/step  driver ms/step  wait ms/step  kernels/step  read B/step  drafts kept\n",
    );
    let percent = |f: Option<f64>| f.map_or("-".to_owned(), |f| format!("{:.0} %", f * 100.0));
    for r in results {
        out += &format!(
            "{:>11}  {:>5}  {:>6}  {:>6.2}  {:>12.1}  {:>11.1}  {:>12.1}  {:>11.1}  {:>11.2}  {:>11}  {:>13.1}  {:>12}  {:>12.3}  {:>14}  {:>12.3}  {:>12}  {:>11}  {:>11}\n",
            r.concurrency,
            r.input_len,
            r.output_len,
            r.wall_s,
            r.output_tok_per_s,
            r.total_tok_per_s,
            r.mean_ttft_ms,
            r.max_ttft_ms,
            r.mean_itl_ms,
            percent(r.roofline_fraction),
            r.prefill_tok_per_s,
            percent(r.prefill_gemm_fraction),
            r.host_ms_per_step,
            r.driver_ms_per_step
                .map_or("-".to_owned(), |d| format!("{d:.3}")),
            r.device_wait_ms_per_step,
            r.kernels_per_step
                .map_or("-".to_owned(), |k| format!("{k:.1}")),
            r.read_bytes_per_step
                .map_or("-".to_owned(), |b| format!("{b:.0}")),
            match r.draft_tokens {
                0 => "-".to_owned(),
                drafts => format!("{}/{drafts}", r.accepted_tokens),
            },
        );
    }
    for r in results {
        if let Some(by_call) = &r.driver_ms_per_step_by_call {
            let calls: Vec<String> = by_call
                .iter()
                .filter(|(_, &ms)| ms >= 0.0005)
                .map(|(call, ms)| format!("{call} {ms:.3}"))
                .collect();
            out += &format!(
                "driver ms/step at concurrency {}: {}\n",
                r.concurrency,
                calls.join(", ")
            );
        }
    }
    out
}
