//! The serving engine's stats line, logged every few seconds while it is
//! busy (as vLLM logs its own): requests running and waiting, prompt and
//! generation throughput, and KV-cache use.

use std::time::{Duration, Instant};

/// How often the line is logged while there is work.
const INTERVAL: Duration = Duration::from_secs(5);

/// Token counts since the last line.
pub struct StatsLine {
    since: Instant,
    prompt_tokens: u64,
    generated_tokens: u64,
}

impl Default for StatsLine {
    fn default() -> Self {
        Self {
            since: Instant::now(),
            prompt_tokens: 0,
            generated_tokens: 0,
        }
    }
}

impl StatsLine {
    /// Records a step that fed `prompt_tokens` prompt tokens and generated
    /// `generated_tokens`; logs the line when it is due.
    pub fn step(
        &mut self,
        prompt_tokens: usize,
        generated_tokens: usize,
        (running, waiting, kv_usage): (usize, usize, f64),
    ) {
        self.prompt_tokens += prompt_tokens as u64;
        self.generated_tokens += generated_tokens as u64;
        let elapsed = self.since.elapsed();
        if elapsed < INTERVAL {
            return;
        }
        let seconds = elapsed.as_secs_f64();
        tracing::info!(
            "running {running}, waiting {waiting}; prompt {:.1} tok/s, generation {:.1} tok/s; KV cache {:.1}% used",
            self.prompt_tokens as f64 / seconds,
            self.generated_tokens as f64 / seconds,
            100.0 * kv_usage
        );
        *self = Self::default();
    }
}
