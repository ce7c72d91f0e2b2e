//! One model step for a ragged batch: the scheduler's plan becomes the
//! graph's batch inputs, and the logits come back per sequence.

use crate::runtime::{Executor, KvCache, RuntimeError, Tensor};

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct StepInput<'a> {
    /// Tokens to feed.
    pub tokens: &'a [u32],
    /// Position of the first one.
    pub start: usize,
    /// The sequence's cache blocks.
    pub blocks: &'a [u32],
    /// Return logits: of the last fed token, or of every fed token with
    /// `all_logits`.
    pub wants_logits: bool,
}

/// Runs one step. Returns, for each sequence that wants logits, in order,
/// its logits rows (one row, or one per fed token when `all_logits`).
pub fn run_step(
    executor: &Executor,
    cache: &mut KvCache,
    seqs: &[StepInput<'_>],
    all_logits: bool,
) -> Result<Vec<Vec<Vec<f32>>>, RuntimeError> {
    let tokens: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    let width = seqs
        .iter()
        .map(|s| s.blocks.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut ids = Vec::with_capacity(tokens);
    let mut positions = Vec::with_capacity(tokens);
    let mut offsets = vec![0i64];
    let mut context = Vec::with_capacity(seqs.len());
    let mut tables = Vec::with_capacity(seqs.len() * width);
    let mut rows = Vec::new();
    let mut rows_per_seq = Vec::new();
    for seq in seqs {
        let first_row = ids.len() as i64;
        ids.extend(seq.tokens.iter().map(|&t| i64::from(t)));
        positions.extend((seq.start..seq.start + seq.tokens.len()).map(|p| p as i64));
        offsets.push(ids.len() as i64);
        context.push((seq.start + seq.tokens.len()) as i64);
        tables.extend(seq.blocks.iter().map(|&b| i64::from(b)));
        tables.extend(std::iter::repeat_n(0, width - seq.blocks.len()));
        if seq.wants_logits {
            let wanted: Vec<i64> = if all_logits {
                (first_row..ids.len() as i64).collect()
            } else {
                vec![ids.len() as i64 - 1]
            };
            rows_per_seq.push(wanted.len());
            rows.extend(wanted);
        }
    }
    let batch = seqs.len();
    let inputs = vec![
        Tensor::i64(vec![tokens], ids),
        Tensor::i64(vec![tokens], positions),
        Tensor::i64(vec![batch + 1], offsets),
        Tensor::i64(vec![batch], context),
        Tensor::i64(vec![batch, width], tables),
        Tensor::i64(vec![rows.len()], rows),
    ];
    let logits = executor.run(inputs, Some(cache))?.remove(0);
    let vocab = logits.shape.get(1).copied().unwrap_or(0);
    let mut all_rows = logits.as_f32().chunks(vocab.max(1)).map(<[f32]>::to_vec);
    Ok(rows_per_seq
        .into_iter()
        .map(|n| all_rows.by_ref().take(n).collect())
        .collect())
}
