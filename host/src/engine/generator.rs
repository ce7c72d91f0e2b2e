//! One sequence through a loaded model: prefill, then decode step by step,
//! with its own paged KV cache.

use kiln_kernels::dense::attention::CacheLayout;

use kiln_plugin_api::pipeline::{StepBatch, StepSequence};

use super::batch::{run_step, StepError};
use crate::model::Model;
use crate::runtime::KvCache;

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
    /// A generator with room for `capacity` tokens (prompt and output), its
    /// KV cache on the model's device.
    pub fn new(model: &'m Model, capacity: usize) -> Result<Self, StepError> {
        let kv = model.config.kv;
        let layout = CacheLayout {
            block_size: BLOCK_SIZE,
            num_kv_heads: kv.num_kv_heads as usize,
            head_dim: kv.head_dim as usize,
        };
        let blocks = capacity.div_ceil(BLOCK_SIZE).max(1);
        Ok(Self {
            model,
            cache: model
                .backend
                .new_kv_cache(kv.num_layers as usize, blocks, layout)?,
            blocks: (0..blocks as u32).collect(),
            position: 0,
            capacity,
        })
    }

    /// Tokens in the cache.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Feeds `tokens`; returns the logits of the last one, or of every one
    /// when `all_logits`.
    pub fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<Vec<f32>>, StepError> {
        let n = tokens.len();
        if n == 0 || self.position + n > self.capacity {
            return Err(StepError::Batch(format!(
                "{n} tokens at position {} exceed the capacity of {}",
                self.position, self.capacity
            )));
        }
        let step = StepBatch {
            sequences: vec![StepSequence {
                tokens: tokens.to_vec(),
                start: self.position,
                blocks: self.blocks.clone(),
                wants_logits: true,
                token_types: Vec::new(),
            }],
            all_logits,
        };
        let mut logits = run_step(
            self.model.backend.as_ref(),
            &self.model.pipeline,
            &mut self.cache,
            &step,
        )?;
        self.position += n;
        Ok(logits.remove(0))
    }
}
