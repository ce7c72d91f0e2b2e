//! [`Precision::FastResidual`](super::Precision::FastResidual): fast
//! products whose activations are carried as two 8-bit digits.
//!
//! The quantized activation rows are followed by their residuals (each
//! value minus its 8-bit quantization), quantized too, and the fast kernels
//! multiply all of them at once, decoding each weight block once for both; a
//! row's output is the sum of its two products. Each product is the fast
//! kernels' own, bit for bit whatever the number of rows, so the sums are
//! too: decode and prefill still agree exactly.

use super::job::Job;
use super::{quantize_acts, ActBlock, Isa};

/// The activation rows `x` (of `cols` values) quantized to blocks `A`; with
/// `residual`, followed by the rows of what that quantization left,
/// quantized the same way. Zero blocks pad the rows to a multiple of
/// `pad_rows`. Returns the blocks and the number a row.
pub(super) fn quantize_rows<A: ActBlock>(
    isa: Isa,
    x: &[f32],
    cols: usize,
    pad_rows: usize,
    residual: bool,
) -> (Vec<A>, usize) {
    if !residual {
        return quantize_acts::<A>(isa, x, cols, pad_rows);
    }
    let (mut blocks, per_row) = quantize_acts::<A>(isa, x, cols, 1);
    let mut left = x.to_vec();
    for (row, blocks) in left
        .chunks_exact_mut(cols)
        .zip(blocks.chunks_exact(per_row))
    {
        for (values, block) in row.chunks_mut(A::ELEMS).zip(blocks) {
            block.subtract_from(values);
        }
    }
    let (second, _) = quantize_acts::<A>(isa, &left, cols, 1);
    blocks.extend(second);
    let rows = 2 * (x.len() / cols);
    blocks.resize(rows.next_multiple_of(pad_rows) * per_row, A::default());
    (blocks, per_row)
}

/// Runs `job` for its `rows` weight rows into `y`; with `residual` (its
/// activations from [`quantize_rows`]), each output is the sum of the
/// products of an activation row and of its residual row.
pub(super) fn run<A: Sync>(job: &Job<A>, rows: usize, residual: bool, y: &mut [f32]) {
    if !residual {
        return job.run(rows, y);
    }
    let mut both = vec![0f32; 2 * y.len()];
    job.run(rows, &mut both);
    let (first, second) = both.split_at(y.len());
    for ((y, a), b) in y.iter_mut().zip(first).zip(second) {
        *y = a + b;
    }
}
