//! Start-up runs of the step shapes a server will see, where a shape's first
//! run costs far more than the next ([`Backend::warm_up_batches`]): the CUDA
//! driver times cuBLASLt's algorithms for every product of a new shape at its
//! first eager run (the five products of a Llama-3-8B prefill chunk, nine
//! algorithms each, cost its first 2,048-token prompt ~170 ms on the H200,
//! `bench/results/gpu-2026-12-04`). vLLM likewise runs its batch sizes at
//! start-up (profiling, then capturing CUDA graphs).
//!
//! Each warm-up step feeds token 0 at position 0 of every sequence, all in
//! cache block 0 (a decode batch: every sequence writes the same key and
//! value there and reads only them), or one prompt over the first blocks (a
//! prefill chunk: every position it reads it has written). The cache holds
//! nothing yet, the picks are dropped, and no sequence is scheduled, so
//! serving starts as if the steps never ran.

use std::time::{Duration, Instant};

use kiln_plugin_api::pipeline::{StepBatch, StepSequence};

use super::batch::{run_sampled_step, Pipeline, StepError};
use crate::runtime::sampling::RowSampling;
use crate::runtime::{Backend, KvCache};

/// What the warm-up ran besides the decode batches it was given.
#[derive(Clone, Copy, Debug)]
pub struct WarmUp {
    /// The prefill chunk run, in tokens (0: none).
    pub chunk_tokens: usize,
    /// How long it took.
    pub elapsed: Duration,
}

/// Runs once, greedily, a decode step of each size in `batches` and a
/// prefill chunk of `chunk_tokens` tokens (as many as the cache holds, at
/// most; none for 0), dropping what they pick.
pub fn warm_up(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    cache: &mut KvCache,
    batches: &[usize],
    chunk_tokens: usize,
) -> Result<WarmUp, StepError> {
    let start = Instant::now();
    let context = |what: String| move |e: StepError| StepError::Batch(format!("{what}: {e}"));
    let block_size = cache.layout().block_size.max(1);
    for &sequences in batches {
        let batch = step_batch(vec![1; sequences], block_size);
        run_greedy(backend, pipeline, cache, &batch)
            .map_err(context(format!("a decode step of {sequences} sequences")))?;
    }
    let chunk_tokens = chunk_tokens.min(cache.num_blocks() * block_size);
    if chunk_tokens > 0 {
        let batch = step_batch(vec![chunk_tokens], block_size);
        run_greedy(backend, pipeline, cache, &batch)
            .map_err(context(format!("a prefill chunk of {chunk_tokens} tokens")))?;
    }
    Ok(WarmUp {
        chunk_tokens,
        elapsed: start.elapsed(),
    })
}

/// Sequences of token 0 from position 0, `lengths[i]` tokens each, sequence
/// `i`'s positions in blocks 0, 1, ... of `block_size`.
fn step_batch(lengths: Vec<usize>, block_size: usize) -> StepBatch {
    StepBatch {
        sequences: lengths
            .into_iter()
            .map(|length| StepSequence {
                tokens: vec![0; length],
                start: 0,
                blocks: (0..length.div_ceil(block_size) as u32).collect(),
                wants_logits: true,
                token_types: Vec::new(),
            })
            .collect(),
        all_logits: false,
    }
}

fn run_greedy(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    cache: &mut KvCache,
    batch: &StepBatch,
) -> Result<(), StepError> {
    let rows = vec![RowSampling::greedy(); batch.sequences.len()];
    run_sampled_step(backend, pipeline, cache, batch, &rows).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_batches_share_block_zero_and_a_chunk_takes_the_first_blocks() {
        let decode = step_batch(vec![1; 3], 16);
        assert_eq!(decode.sequences.len(), 3);
        assert!(decode
            .sequences
            .iter()
            .all(|s| s.tokens == [0] && s.start == 0 && s.blocks == [0] && s.wants_logits));
        let chunk = step_batch(vec![40], 16);
        assert_eq!(chunk.sequences[0].tokens.len(), 40);
        assert_eq!(chunk.sequences[0].blocks, [0, 1, 2]);
    }
}
