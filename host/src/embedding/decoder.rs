//! A decoder run as an embedding model (`--runner pooling`): its attention
//! reads keys and values from a paged cache, so each step's texts are laid
//! out in a cache the embedder keeps, each from position 0 on blocks of its
//! own (nothing is kept between steps).

use std::sync::Mutex;

use kiln_kernels::dense::attention::CacheLayout;
use kiln_plugin_api::pipeline::{StepBatch, StepSequence};

use super::EncoderText;
use crate::engine::batch::{run_step, StepError};
use crate::engine::generator::BLOCK_SIZE;
use crate::model::Model;
use crate::runtime::KvCache;

/// The most texts in one step: with `batch_tokens` tokens, they need at
/// most `batch_tokens / BLOCK_SIZE + MAX_TEXTS` blocks (each text's last
/// block partly filled).
pub(super) const MAX_TEXTS: usize = 64;

/// The cache of a step of up to `batch_tokens` tokens over up to
/// [`MAX_TEXTS`] texts.
pub(super) struct DecoderCache {
    cache: Mutex<KvCache>,
}

impl DecoderCache {
    /// A cache on `model`'s device for steps of `batch_tokens` tokens.
    pub(super) fn new(model: &Model, batch_tokens: usize) -> Result<Self, StepError> {
        let kv = model.config.kv;
        let layout = CacheLayout {
            block_size: BLOCK_SIZE,
            num_kv_heads: kv.num_kv_heads as usize,
            head_dim: kv.head_dim as usize,
        };
        let blocks = batch_tokens.div_ceil(BLOCK_SIZE) + MAX_TEXTS;
        let cache = model
            .backend
            .new_kv_cache(kv.num_layers as usize, blocks, layout)?;
        Ok(Self {
            cache: Mutex::new(cache),
        })
    }

    /// One step over `texts` (at most [`MAX_TEXTS`], of at most the cache's
    /// tokens): each text's final hidden states, every token's with
    /// `all_rows`, else its last token's.
    pub(super) fn run(
        &self,
        model: &Model,
        texts: &[EncoderText],
        all_rows: bool,
    ) -> Result<Vec<Vec<Vec<f32>>>, StepError> {
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next_block = 0u32;
        let sequences = texts
            .iter()
            .map(|text| {
                let blocks = text.tokens.len().div_ceil(BLOCK_SIZE) as u32;
                let first = next_block;
                next_block += blocks;
                StepSequence {
                    tokens: text.tokens.clone(),
                    start: 0,
                    blocks: (first..next_block).collect(),
                    wants_logits: true,
                    token_types: Vec::new(),
                }
            })
            .collect();
        if next_block as usize > cache.num_blocks() {
            return Err(StepError::Batch(format!(
                "{} texts need {next_block} cache blocks, the embedder has {}",
                texts.len(),
                cache.num_blocks()
            )));
        }
        let batch = StepBatch {
            sequences,
            all_logits: all_rows,
        };
        run_step(model.backend.as_ref(), &model.pipeline, &mut cache, &batch)
    }
}
