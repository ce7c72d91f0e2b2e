//! `host benchmark --url`: an online load generator in the shape of `vllm
//! bench serve`, for any OpenAI-compatible server. Requests (random word
//! prompts, or a JSONL file's `prompt`s) stream from `/v1/completions` at a
//! Poisson `--request-rate` under `--max-concurrency`; each one's time to
//! first token, time per output token, inter-token latencies and end to end
//! latency are measured from its server-sent events. Greedy unless
//! `--temperature` (and `--top-p`) say otherwise.

use std::io::BufRead;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::cli::BenchmarkArgs;

/// What one request measured.
#[derive(Clone, Debug, Default)]
struct Measured {
    ttft: f64,
    itls: Vec<f64>,
    e2e: f64,
    output_tokens: usize,
    error: Option<String>,
}

/// A counting semaphore for `--max-concurrency`.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn take(&self) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
    }

    fn give(&self) {
        *self.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.freed.notify_one();
    }
}

/// The prompts: a JSONL file's `prompt` fields, or random words.
fn prompts(args: &BenchmarkArgs, count: usize) -> anyhow::Result<Vec<String>> {
    if let Some(path) = &args.dataset {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --dataset {}", path.display()))?;
        let prompts: Vec<String> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .and_then(|v| v.get("prompt")?.as_str().map(str::to_owned))
                    .with_context(|| format!("--dataset line without a string `prompt`: {l}"))
            })
            .collect::<Result<_, _>>()?;
        anyhow::ensure!(
            !prompts.is_empty(),
            "--dataset {} has no prompts",
            path.display()
        );
        return Ok(prompts.iter().cycle().take(count).cloned().collect());
    }
    const WORDS: [&str; 12] = [
        "river", "stone", "light", "garden", "music", "winter", "city", "paper", "ocean", "market",
        "silver", "forest",
    ];
    let mut rng = StdRng::seed_from_u64(args.seed);
    Ok((0..count)
        .map(|_| {
            (0..args.input_len)
                .map(|_| WORDS[rng.random_range(0..WORDS.len())])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect())
}

/// Streams one completion of `body` (a request without its prompt) for
/// `prompt` and measures it.
fn request(url: &str, mut body: Value, prompt: String) -> Measured {
    let start = Instant::now();
    body["prompt"] = Value::String(prompt);
    let response = match ureq::post(&format!("{url}/v1/completions")).send_json(body) {
        Ok(response) => response,
        Err(e) => {
            return Measured {
                error: Some(e.to_string()),
                ..Measured::default()
            }
        }
    };
    let mut measured = Measured::default();
    let mut times = Vec::new();
    let mut usage = None;
    for line in std::io::BufReader::new(response.into_reader()).lines() {
        let Ok(line) = line else { break };
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(tokens) = chunk["usage"]["completion_tokens"].as_u64() {
            usage = Some(tokens as usize);
        }
        let text = chunk["choices"][0]["text"].as_str().unwrap_or_default();
        if !text.is_empty() {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    measured.e2e = start.elapsed().as_secs_f64();
    match times.first() {
        Some(&first) => measured.ttft = first,
        None => measured.error = Some("no tokens came back".into()),
    }
    measured.itls = times.windows(2).map(|w| w[1] - w[0]).collect();
    measured.output_tokens = usage.unwrap_or(times.len());
    measured
}

/// Mean, median and 99th percentile in milliseconds.
fn summary(mut values: Vec<f64>) -> Value {
    if values.is_empty() {
        return json!({"mean": null, "median": null, "p99": null});
    }
    values.sort_by(f64::total_cmp);
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize] * 1e3;
    json!({"mean": values.iter().sum::<f64>() / values.len() as f64 * 1e3, "median": at(0.5), "p99": at(0.99)})
}

/// Runs the load against `--url` and prints the results.
pub fn online_benchmark(args: &BenchmarkArgs, url: &str) -> anyhow::Result<()> {
    let model = args
        .model
        .clone()
        .context("--url needs --model: the name the server serves")?;
    anyhow::ensure!(
        args.num_prompts > 0 && args.output_len > 0,
        "--num-prompts and --output-len must be at least 1"
    );
    anyhow::ensure!(
        args.request_rate > 0.0,
        "--request-rate must be positive (inf: all at once)"
    );
    anyhow::ensure!(
        args.warmup_runs.is_none(),
        "--warmup-runs repeats the levels `host benchmark` runs itself; with --url, warm the server up by a run of its own"
    );
    let scheduling = &args.scheduling;
    anyhow::ensure!(
        !scheduling.async_scheduling
            && !scheduling.no_async_scheduling
            && scheduling.speculative_config.is_none(),
        "--async-scheduling, --no-async-scheduling and --speculative-config set up the engine `host benchmark` runs itself; with --url the server's own settings apply"
    );
    let url = url.trim_end_matches('/').to_owned();
    // Every request but its prompt, with the benchmark's sampling.
    let mut body = json!({"model": model, "max_tokens": args.output_len, "stream": true,
        "temperature": args.temperature, "top_p": args.top_p, "ignore_eos": true,
        "stream_options": {"include_usage": true}});
    // vLLM's extra field, sent only when set (other servers may not know it).
    if args.repetition_penalty != 1.0 {
        body["repetition_penalty"] = json!(args.repetition_penalty);
    }
    let prompts = prompts(args, args.num_prompts)?;
    let slots = Arc::new(Slots {
        free: Mutex::new(args.max_concurrency.unwrap_or(usize::MAX).max(1)),
        freed: Condvar::new(),
    });
    let progress = indicatif::ProgressBar::new(prompts.len() as u64);
    let mut rng = StdRng::seed_from_u64(args.seed);
    let start = Instant::now();
    let mut workers = Vec::new();
    for prompt in prompts {
        if args.request_rate.is_finite() {
            // Poisson arrivals: exponential gaps of mean 1 / rate.
            let gap = -(1.0 - rng.random::<f64>()).ln() / args.request_rate;
            std::thread::sleep(Duration::from_secs_f64(gap));
        }
        slots.take();
        let (slots, progress) = (slots.clone(), progress.clone());
        let (url, body) = (url.clone(), body.clone());
        workers.push(std::thread::spawn(move || {
            let measured = request(&url, body, prompt);
            slots.give();
            progress.inc(1);
            measured
        }));
    }
    let results: Vec<Measured> = workers
        .into_iter()
        .map(|w| w.join().unwrap_or_default())
        .collect();
    progress.finish_and_clear();
    let duration = start.elapsed().as_secs_f64();
    let (ok, failed): (Vec<_>, Vec<_>) = results.into_iter().partition(|m| m.error.is_none());
    let output_tokens: usize = ok.iter().map(|m| m.output_tokens).sum();
    let tpot = ok
        .iter()
        .filter(|m| m.output_tokens > 1)
        .map(|m| (m.e2e - m.ttft) / (m.output_tokens - 1) as f64)
        .collect();
    let report = json!({
        "url": url, "model": model, "temperature": args.temperature, "top_p": args.top_p,
        "repetition_penalty": args.repetition_penalty,
        "completed": ok.len(), "failed": failed.len(),
        "errors": failed.iter().filter_map(|m| m.error.clone()).take(5).collect::<Vec<_>>(),
        "duration_s": duration, "output_tokens": output_tokens,
        "request_throughput": ok.len() as f64 / duration,
        "output_throughput": output_tokens as f64 / duration,
        "ttft_ms": summary(ok.iter().map(|m| m.ttft).collect()),
        "tpot_ms": summary(tpot),
        "itl_ms": summary(ok.iter().flat_map(|m| m.itls.clone()).collect()),
        "e2e_ms": summary(ok.iter().map(|m| m.e2e).collect()),
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "{url} ({model}): {} requests in {duration:.2} s, {} failed",
        ok.len(),
        failed.len()
    );
    println!(
        "output {:.1} tok/s, {:.2} requests/s",
        report["output_throughput"].as_f64().unwrap_or(0.0),
        report["request_throughput"].as_f64().unwrap_or(0.0)
    );
    println!("{:<6} {:>10} {:>10} {:>10}", "ms", "mean", "median", "p99");
    for name in ["ttft", "tpot", "itl", "e2e"] {
        let s = &report[format!("{name}_ms")];
        let cell = |k: &str| s[k].as_f64().map_or("-".to_owned(), |v| format!("{v:.1}"));
        println!(
            "{name:<6} {:>10} {:>10} {:>10}",
            cell("mean"),
            cell("median"),
            cell("p99")
        );
    }
    Ok(())
}
