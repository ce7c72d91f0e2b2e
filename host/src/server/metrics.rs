//! Prometheus metrics of the server (`GET /metrics`, text format).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::engine::service::EngineObserver;

/// Every metric, shared by the engine thread and the HTTP handlers.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    ttft: Histogram,
    itl: Histogram,
    latency: Histogram,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    requests: Counter,
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge<f64, AtomicU64>,
    prefix_hit_rate: Gauge<f64, AtomicU64>,
    preemptions: Counter,
    preemptions_seen: Arc<AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kiln");
        let metrics = Self {
            ttft: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            itl: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            latency: Histogram::new(exponential_buckets(0.01, 2.0, 16)),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            requests: Counter::default(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_usage: Gauge::default(),
            prefix_hit_rate: Gauge::default(),
            preemptions: Counter::default(),
            preemptions_seen: Arc::default(),
            registry: Arc::default(),
        };
        registry.register(
            "time_to_first_token_seconds",
            "Time from arrival to the first generated token",
            metrics.ttft.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "Time between consecutive tokens of a request",
            metrics.itl.clone(),
        );
        registry.register(
            "request_latency_seconds",
            "Time from arrival to the end of a request",
            metrics.latency.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of finished requests",
            metrics.prompt_tokens.clone(),
        );
        registry.register(
            "generation_tokens",
            "Generated tokens of finished requests",
            metrics.generation_tokens.clone(),
        );
        registry.register(
            "requests_finished",
            "Requests that ran to their end",
            metrics.requests.clone(),
        );
        registry.register(
            "num_requests_running",
            "Requests in the running batch",
            metrics.running.clone(),
        );
        registry.register(
            "num_requests_waiting",
            "Requests waiting to be scheduled",
            metrics.waiting.clone(),
        );
        registry.register(
            "kv_cache_usage_ratio",
            "Fraction of KV-cache blocks in use",
            metrics.kv_usage.clone(),
        );
        registry.register(
            "prefix_cache_hit_rate",
            "Fraction of looked-up prompt blocks found in the prefix cache",
            metrics.prefix_hit_rate.clone(),
        );
        registry.register(
            "num_preemptions",
            "Requests preempted because the KV cache was full",
            metrics.preemptions.clone(),
        );
        *metrics.registry.lock().unwrap_or_else(|p| p.into_inner()) = registry;
        metrics
    }
}

impl Metrics {
    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }
}

impl EngineObserver for Metrics {
    fn first_token(&self, ttft: f64) {
        self.ttft.observe(ttft);
    }

    fn next_token(&self, itl: f64) {
        self.itl.observe(itl);
    }

    fn finished(&self, latency: f64, prompt_tokens: usize, completion_tokens: usize) {
        self.latency.observe(latency);
        self.prompt_tokens.inc_by(prompt_tokens as u64);
        self.generation_tokens.inc_by(completion_tokens as u64);
        self.requests.inc();
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
        self.running.set(running as i64);
        self.waiting.set(waiting as i64);
        self.kv_usage.set(kv_usage);
        self.prefix_hit_rate.set(if prefix_queries == 0 {
            0.0
        } else {
            prefix_hits as f64 / prefix_queries as f64
        });
        let seen = self.preemptions_seen.swap(preemptions, Ordering::Relaxed);
        self.preemptions.inc_by(preemptions.saturating_sub(seen));
    }
}
