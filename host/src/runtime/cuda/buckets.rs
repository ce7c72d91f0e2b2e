//! Decode steps padded to a few shapes, so that a few CUDA graphs cover every
//! decode step (vLLM's capture sizes). A plain decode step of `B` sequences
//! (one new token each, every row's logits) runs at the batch bucket of `B`
//! (1, 2, 4, 8, then multiples of 8) with its block tables padded to the next
//! power of two wide. A padding sequence has context length 0: its one row
//! sits at position -1, the KV-cache write skips it and attention gives it
//! zeros (see `attention.cu`); its logits are computed and never read.

use kiln_plugin_api::graph::GraphIr;

use crate::runtime::tensor::Tensor;

/// The decoder's step inputs, in order (`RaggedBatch::inputs`).
const DECODER_INPUTS: [&str; 6] = [
    "tokens",
    "positions",
    "row_offsets",
    "context_lens",
    "block_tables",
    "logit_rows",
];

/// Batch sizes up to this go to buckets of 1, 2, 4 and 8; above it, to
/// multiples of it.
const SMALL_BATCH: usize = 8;

/// The batch size a decode batch of `b` sequences runs at.
pub fn batch_bucket(b: usize) -> usize {
    if b <= SMALL_BATCH {
        b.next_power_of_two()
    } else {
        b.div_ceil(SMALL_BATCH) * SMALL_BATCH
    }
}

/// Every bucket up to the one of `max` sequences, smallest first.
pub fn batch_buckets(max: usize) -> Vec<usize> {
    let last = batch_bucket(max.max(1));
    let mut buckets = vec![1];
    while let Some(&b) = buckets.last().filter(|&&b| b < last) {
        buckets.push(batch_bucket(b + 1));
    }
    buckets
}

/// Whether `graph` takes the decoder's inputs and returns one output of
/// logits rows, so that its decode steps can be padded.
pub fn paddable(graph: &GraphIr) -> bool {
    let names: Vec<&str> = graph.inputs.iter().map(|i| i.name.as_str()).collect();
    names == DECODER_INPUTS && graph.outputs.len() == 1
}

/// Whether the decoder's step `inputs` are a plain decode step: as many
/// tokens as sequences and logit rows, one row each.
pub fn is_decode_step(inputs: &[Tensor]) -> bool {
    let [tokens, _, offsets, contexts, _, logit_rows] = inputs else {
        return false;
    };
    let Some(&batch) = contexts.shape.first() else {
        return false;
    };
    batch > 0
        && tokens.shape == [batch]
        && logit_rows.shape == [batch]
        && offsets
            .as_i64()
            .iter()
            .enumerate()
            .all(|(i, &o)| o == i as i64)
        && logit_rows
            .as_i64()
            .iter()
            .enumerate()
            .all(|(i, &r)| r == i as i64)
}

/// `inputs` padded to the bucket's shape when they are a plain decode step
/// (as many tokens as sequences and logit rows, one row each); `None` when
/// they are something else or already at the bucket's shape.
pub fn pad_decode_step(inputs: &[Tensor]) -> Option<Vec<Tensor>> {
    if !is_decode_step(inputs) {
        return None;
    }
    let [tokens, positions, _, contexts, tables, _] = inputs else {
        return None;
    };
    let batch = contexts.shape.first().copied()?;
    let width = tables.shape.get(1).copied()?;
    let (padded_batch, padded_width) = (batch_bucket(batch), width.max(1).next_power_of_two());
    if (padded_batch, padded_width) == (batch, width) {
        return None;
    }
    let rows = |values: &[i64], fill: i64| {
        let mut v = values.to_vec();
        v.resize(padded_batch, fill);
        Tensor::i64(vec![padded_batch], v)
    };
    let mut table = vec![0i64; padded_batch * padded_width];
    for (b, row) in tables.as_i64().chunks_exact(width).enumerate() {
        table[b * padded_width..b * padded_width + width].copy_from_slice(row);
    }
    let counting = |n: usize| (0..n as i64).collect::<Vec<_>>();
    Some(vec![
        rows(tokens.as_i64(), 0),
        rows(positions.as_i64(), 0),
        Tensor::i64(vec![padded_batch + 1], counting(padded_batch + 1)),
        rows(contexts.as_i64(), 0),
        Tensor::i64(vec![padded_batch, padded_width], table),
        Tensor::i64(vec![padded_batch], counting(padded_batch)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_then_multiples_of_eight() {
        let buckets: Vec<usize> = [1, 2, 3, 5, 8, 9, 16, 17, 63].map(batch_bucket).to_vec();
        assert_eq!(buckets, [1, 2, 4, 8, 8, 16, 16, 24, 64]);
    }

    #[test]
    fn every_bucket_up_to_the_largest_batch() {
        assert_eq!(batch_buckets(0), [1]);
        assert_eq!(batch_buckets(1), [1]);
        assert_eq!(batch_buckets(3), [1, 2, 4]);
        assert_eq!(batch_buckets(20), [1, 2, 4, 8, 16, 24]);
        let all = batch_buckets(256);
        assert_eq!(all.len(), 4 + 31);
        assert!(all.iter().all(|&b| batch_bucket(b) == b));
    }

    fn step(batch: usize, width: usize, fed: &[usize]) -> Vec<Tensor> {
        let tokens: usize = fed.iter().sum();
        let mut offsets = vec![0i64];
        fed.iter()
            .for_each(|&f| offsets.push(offsets.last().unwrap() + f as i64));
        vec![
            Tensor::i64(vec![tokens], (0..tokens as i64).map(|t| t + 100).collect()),
            Tensor::i64(vec![tokens], vec![5; tokens]),
            Tensor::i64(vec![batch + 1], offsets),
            Tensor::i64(vec![batch], vec![6; batch]),
            Tensor::i64(vec![batch, width], (1..=(batch * width) as i64).collect()),
            Tensor::i64(vec![batch], (0..batch as i64).collect()),
        ]
    }

    #[test]
    fn a_decode_step_is_padded_with_empty_sequences() {
        let padded = pad_decode_step(&step(3, 3, &[1, 1, 1])).unwrap();
        assert_eq!(padded[0].as_i64(), [100, 101, 102, 0]);
        assert_eq!(padded[1].as_i64(), [5, 5, 5, 0]);
        assert_eq!(padded[2].as_i64(), [0, 1, 2, 3, 4]);
        assert_eq!(padded[3].as_i64(), [6, 6, 6, 0]);
        assert_eq!(padded[4].shape, [4, 4]);
        assert_eq!(
            padded[4].as_i64(),
            [1, 2, 3, 0, 4, 5, 6, 0, 7, 8, 9, 0, 0, 0, 0, 0]
        );
        assert_eq!(padded[5].as_i64(), [0, 1, 2, 3]);
        // Already at a bucket's shape, or not a plain decode step.
        assert!(pad_decode_step(&step(4, 4, &[1, 1, 1, 1])).is_none());
        assert!(pad_decode_step(&step(2, 2, &[3, 1])).is_none());
    }
}
