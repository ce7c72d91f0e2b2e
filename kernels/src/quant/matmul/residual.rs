//! [`Precision::FastResidual`](super::Precision::FastResidual): fast
//! products whose activations are carried as two 8-bit digits.
//!
//! The quantized activation rows are followed by their residuals (each
//! value minus its 8-bit quantization), quantized too, and the fast kernels
//! multiply all of them at once, decoding each weight block once for both; a
//! row's output is the sum of its two products. Each product is the fast
//! kernels' own, bit for bit whatever the number of rows, so the sums are
//! too: decode and prefill still agree exactly.

use rayon::prelude::*;

use super::acts::{quantize_acts, ActBlock, PAR_QUANTIZE_MIN};
use super::job::Job;
use super::Isa;

/// Output values the sum of the two products takes at a time.
const SUM_CHUNK: usize = 4096;

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
    let per_row = cols.div_ceil(A::ELEMS);
    let rows = x.len() / cols;
    let mut blocks = vec![A::default(); (2 * rows).next_multiple_of(pad_rows) * per_row];
    let (first, second) = blocks[..2 * rows * per_row].split_at_mut(rows * per_row);
    let both_digits = |left: &mut Vec<f32>,
                       ((x, first), second): ((&[f32], &mut [A]), &mut [A])| {
        left.clear();
        left.extend_from_slice(x);
        for ((values, first), second) in left.chunks_mut(A::ELEMS).zip(first).zip(second) {
            A::quantize(isa, values, first);
            first.subtract_from(values);
            A::quantize(isa, values, second);
        }
    };
    if x.len() >= PAR_QUANTIZE_MIN {
        x.par_chunks_exact(cols)
            .zip(first.par_chunks_mut(per_row))
            .zip(second.par_chunks_mut(per_row))
            .for_each_init(Vec::new, both_digits);
    } else {
        let mut left = Vec::new();
        x.chunks_exact(cols)
            .zip(first.chunks_mut(per_row))
            .zip(second.chunks_mut(per_row))
            .for_each(|row| both_digits(&mut left, row));
    }
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
    y.par_chunks_mut(SUM_CHUNK)
        .zip(
            first
                .par_chunks(SUM_CHUNK)
                .zip(second.par_chunks(SUM_CHUNK)),
        )
        .for_each(|(y, (a, b))| {
            for ((y, a), b) in y.iter_mut().zip(a).zip(b) {
                *y = a + b;
            }
        });
}
