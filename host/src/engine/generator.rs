//! One sequence through a loaded model: prefill, then decode step by step,
//! with its own paged KV cache.

use kiln_kernels::dense::attention::CacheLayout;

use crate::model::Model;
use crate::runtime::{KvCache, RuntimeError, Tensor};

/// Positions per KV-cache block.
pub const BLOCK_SIZE: usize = 16;

/// A single sequence's state.
pub struct Generator<'m> {
    model: &'m Model,
    cache: KvCache,
    blocks: Vec<i64>,
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
            blocks: (0..blocks as i64).collect(),
            position: 0,
            capacity,
        }
    }

    /// Tokens in the cache.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Feeds `tokens`; returns the logits of the last one, or of every one
    /// when `all_logits` (rows of the returned `[rows, vocab]` tensor).
    pub fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Tensor, RuntimeError> {
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
        let rows: Vec<i64> = if all_logits {
            (0..n as i64).collect()
        } else {
            vec![n as i64 - 1]
        };
        let inputs = vec![
            Tensor::i64(vec![n], tokens.iter().map(|&t| i64::from(t)).collect()),
            Tensor::i64(
                vec![n],
                (self.position..self.position + n)
                    .map(|p| p as i64)
                    .collect(),
            ),
            Tensor::i64(vec![2], vec![0, n as i64]),
            Tensor::i64(vec![1], vec![(self.position + n) as i64]),
            Tensor::i64(vec![1, self.blocks.len()], self.blocks.clone()),
            Tensor::i64(vec![rows.len()], rows),
        ];
        let logits = self
            .model
            .executor
            .run(inputs, Some(&mut self.cache))?
            .remove(0);
        self.position += n;
        Ok(logits)
    }
}
