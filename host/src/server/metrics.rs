//! Prometheus metrics of the server (`GET /metrics`) under vLLM's names and
//! labels, which is what the Model Server Protocol readers (the Gateway API
//! Inference Extension, llm-d) route on: `vllm:num_requests_waiting`,
//! `vllm:kv_cache_usage_perc` and the rest, each labelled with
//! `model_name`, in the OpenMetrics text format.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::engine::service::{EngineObserver, FinishReason};

/// The content type of [`Metrics::render`]'s body.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Label sets: `model_name`, and `finished_reason` beside it.
type Labels = Vec<(&'static str, String)>;

/// How a histogram family makes the histogram of a new label set.
type HistogramMaker = fn() -> Histogram;

/// Every metric, shared by the engine thread and the HTTP handlers.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    model: Labels,
    /// Positions per KV-cache block: prefix-cache counts are in tokens.
    block_size: u64,
    ttft: Family<Labels, Histogram, HistogramMaker>,
    itl: Family<Labels, Histogram, HistogramMaker>,
    e2e: Family<Labels, Histogram, HistogramMaker>,
    queue: Family<Labels, Histogram, HistogramMaker>,
    prompt_tokens: Family<Labels, Counter>,
    generation_tokens: Family<Labels, Counter>,
    success: Family<Labels, Counter>,
    running: Family<Labels, Gauge>,
    waiting: Family<Labels, Gauge>,
    kv_usage: Family<Labels, Gauge<f64, AtomicU64>>,
    prefix_queries: Family<Labels, Counter>,
    prefix_hits: Family<Labels, Counter>,
    preemptions: Family<Labels, Counter>,
    steps: Family<Labels, Counter>,
    host_seconds: Family<Labels, Counter<f64, AtomicU64>>,
    device_wait_seconds: Family<Labels, Counter<f64, AtomicU64>>,
    spec_drafts: Family<Labels, Counter>,
    spec_draft_tokens: Family<Labels, Counter>,
    spec_accepted_tokens: Family<Labels, Counter>,
    /// The engine reports running totals: what was already counted.
    seen: Arc<[AtomicU64; 3]>,
}

/// Buckets from 1 ms (time to first token, inter-token latency, queue time).
fn millisecond_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// Buckets from 10 ms (whole requests).
fn request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

impl Metrics {
    /// The metrics of a server of `model_name` with KV-cache blocks of
    /// `block_size` positions.
    pub fn new(model_name: &str, block_size: usize) -> Self {
        let metrics = Self {
            registry: Arc::default(),
            model: vec![("model_name", model_name.to_owned())],
            block_size: block_size as u64,
            ttft: Family::new_with_constructor(millisecond_buckets),
            itl: Family::new_with_constructor(millisecond_buckets),
            e2e: Family::new_with_constructor(request_buckets),
            queue: Family::new_with_constructor(millisecond_buckets),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            success: Family::default(),
            running: Family::default(),
            waiting: Family::default(),
            kv_usage: Family::default(),
            prefix_queries: Family::default(),
            prefix_hits: Family::default(),
            preemptions: Family::default(),
            steps: Family::default(),
            host_seconds: Family::default(),
            device_wait_seconds: Family::default(),
            spec_drafts: Family::default(),
            spec_draft_tokens: Family::default(),
            spec_accepted_tokens: Family::default(),
            seen: Arc::default(),
        };
        let mut registry = Registry::default();
        let r = &mut registry;
        r.register(
            "vllm:num_requests_running",
            "Requests in the running batch",
            metrics.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting to be scheduled",
            metrics.waiting.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "Fraction of KV-cache blocks in use (1 is full)",
            metrics.kv_usage.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Prompt tokens of finished requests",
            metrics.prompt_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Generated tokens of finished requests",
            metrics.generation_tokens.clone(),
        );
        r.register(
            "vllm:request_success",
            "Requests that ran to their end, by finish reason",
            metrics.success.clone(),
        );
        r.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            metrics.prefix_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            metrics.prefix_hits.clone(),
        );
        r.register(
            "vllm:num_preemptions",
            "Requests preempted because the KV cache was full",
            metrics.preemptions.clone(),
        );
        r.register(
            "kiln:engine_steps",
            "Model steps the engine launched",
            metrics.steps.clone(),
        );
        r.register(
            "kiln:engine_host_seconds",
            "Engine-thread time on its own work: scheduling, launching, reading picks",
            metrics.host_seconds.clone(),
        );
        r.register(
            "kiln:engine_device_wait_seconds",
            "Engine-thread time waiting for the device's picks",
            metrics.device_wait_seconds.clone(),
        );
        r.register(
            "vllm:spec_decode_num_drafts",
            "Drafts verified (speculative decoding): one a sequence a drafted step",
            metrics.spec_drafts.clone(),
        );
        r.register(
            "vllm:spec_decode_num_draft_tokens",
            "Draft tokens verified (speculative decoding)",
            metrics.spec_draft_tokens.clone(),
        );
        r.register(
            "vllm:spec_decode_num_accepted_tokens",
            "Draft tokens the model's picks kept (speculative decoding)",
            metrics.spec_accepted_tokens.clone(),
        );
        r.register(
            "vllm:time_to_first_token_seconds",
            "Time from arrival to the first generated token",
            metrics.ttft.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive tokens of a request",
            metrics.itl.clone(),
        );
        r.register(
            "vllm:e2e_request_latency_seconds",
            "Time from arrival to the end of a request",
            metrics.e2e.clone(),
        );
        r.register(
            "vllm:request_queue_time_seconds",
            "Time from arrival to the first step that runs the request",
            metrics.queue.clone(),
        );
        *metrics.registry.lock().unwrap_or_else(|p| p.into_inner()) = registry;
        metrics
    }

    /// The metrics in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }

    /// Steps launched, and the engine thread's seconds on its own work and
    /// waiting for the device, so far.
    pub fn engine_totals(&self) -> (u64, f64, f64) {
        (
            self.steps.get_or_create(&self.model).get(),
            self.host_seconds.get_or_create(&self.model).get(),
            self.device_wait_seconds.get_or_create(&self.model).get(),
        )
    }

    /// Draft tokens verified and kept (speculative decoding), so far.
    pub fn draft_totals(&self) -> (u64, u64) {
        (
            self.spec_draft_tokens.get_or_create(&self.model).get(),
            self.spec_accepted_tokens.get_or_create(&self.model).get(),
        )
    }

    /// Adds to `counter` what `total` has beyond the total seen before.
    fn count_total(&self, counter: &Family<Labels, Counter>, slot: usize, total: u64) {
        let seen = self.seen[slot].swap(total, Ordering::Relaxed);
        counter
            .get_or_create(&self.model)
            .inc_by(total.saturating_sub(seen));
    }
}

impl EngineObserver for Metrics {
    fn scheduled(&self, queue_time: f64) {
        self.queue.get_or_create(&self.model).observe(queue_time);
    }

    fn first_token(&self, ttft: f64) {
        self.ttft.get_or_create(&self.model).observe(ttft);
    }

    fn next_token(&self, itl: f64) {
        self.itl.get_or_create(&self.model).observe(itl);
    }

    fn finished(
        &self,
        reason: FinishReason,
        latency: f64,
        prompt_tokens: usize,
        completion_tokens: usize,
    ) {
        self.e2e.get_or_create(&self.model).observe(latency);
        self.prompt_tokens
            .get_or_create(&self.model)
            .inc_by(prompt_tokens as u64);
        self.generation_tokens
            .get_or_create(&self.model)
            .inc_by(completion_tokens as u64);
        let mut labels = self.model.clone();
        labels.push(("finished_reason", reason.as_str().to_owned()));
        self.success.get_or_create(&labels).inc();
    }

    fn step_time(&self, host: f64, device_wait: f64, launched: bool) {
        if launched {
            self.steps.get_or_create(&self.model).inc();
        }
        self.host_seconds.get_or_create(&self.model).inc_by(host);
        self.device_wait_seconds
            .get_or_create(&self.model)
            .inc_by(device_wait);
    }

    fn speculated(&self, drafts: usize, accepted: usize) {
        self.spec_drafts.get_or_create(&self.model).inc();
        self.spec_draft_tokens
            .get_or_create(&self.model)
            .inc_by(drafts as u64);
        self.spec_accepted_tokens
            .get_or_create(&self.model)
            .inc_by(accepted as u64);
    }

    fn state(
        &self,
        running: usize,
        waiting: usize,
        kv_usage: f64,
        prefix_queries: u64,
        prefix_hits: u64,
        preemptions: u64,
    ) {
        self.running.get_or_create(&self.model).set(running as i64);
        self.waiting.get_or_create(&self.model).set(waiting as i64);
        self.kv_usage.get_or_create(&self.model).set(kv_usage);
        self.count_total(&self.prefix_queries, 0, prefix_queries * self.block_size);
        self.count_total(&self.prefix_hits, 1, prefix_hits * self.block_size);
        self.count_total(&self.preemptions, 2, preemptions);
    }
}
