//! One sequence through a loaded model: prefill, then decode step by step,
//! with its own paged KV cache.

use kiln_kernels::dense::attention::CacheLayout;

use super::batch::{run_step, StepInput};
use crate::model::Model;
use crate::runtime::{KvCache, RuntimeError};

/// Positions per KV-cache block.
pub const BLOCK_SIZE: usize = 16;

/// A single sequence's state.
pub struct Generator<'m> {
    model: &'m Model,
    cache: KvCache,
    blocks: Vec<u32>,
    position: usize,
    capacity: usize,
}

impl<'m> Generator<'m> {
    /// A generator with room for `capacity` tokens (prompt and output).
    pub fn new(model: &'m Model, capacity: usize) -> Self {
        let kv = model.config.kv;
        let layout = CacheLayout {
            block_size: BLOCK_SIZE,
            num_kv_heads: kv.num_kv_heads as usize,
            head_dim: kv.head_dim as usize,
        };
        let blocks = capacity.div_ceil(BLOCK_SIZE).max(1);
        Self {
            model,
            cache: KvCache::new(kv.num_layers as usize, blocks, layout),
            blocks: (0..blocks as u32).collect(),
            position: 0,
            capacity,
        }
    }

    /// Tokens in the cache.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Feeds `tokens`; returns the logits of the last one, or of every one
    /// when `all_logits`.
    pub fn feed(
        &mut self,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let n = tokens.len();
        if n == 0 || self.position + n > self.capacity {
            return Err(RuntimeError::Input {
                name: "tokens".to_owned(),
                message: format!(
                    "{n} tokens at position {} exceed the capacity of {}",
                    self.position, self.capacity
                ),
            });
        }
        let step = StepInput {
            tokens,
            start: self.position,
            blocks: &self.blocks,
            wants_logits: true,
        };
        let mut logits = run_step(&self.model.executor, &mut self.cache, &[step], all_logits)?;
        self.position += n;
        Ok(logits.remove(0))
    }
}
