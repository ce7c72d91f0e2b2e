//! The activation rows of the fast products quantized to 8-bit blocks:
//! [`BlockQ8`] for the 32-value formats, [`BlockQ8K`] for the K-quants,
//! [`BlockQ8x2`] for the AVX-512 kernels, the rows split over threads when
//! there are many.

use rayon::prelude::*;

use super::super::act::{quantize_run, BlockQ8, BlockQ8K};
#[cfg(target_arch = "x86_64")]
use super::super::avx512::BlockQ8x2;
use super::Isa;

/// An 8-bit activation block.
pub(super) trait ActBlock: Default + Copy + Send + Sync {
    const ELEMS: usize;
    fn quantize(isa: Isa, x: &[f32], out: &mut Self);
    /// Subtracts the block's values (scale times quant) from the values it
    /// was quantized from.
    fn subtract_from(&self, x: &mut [f32]);
}

/// Subtracts `scale(i) × qs[i]` from each `x[i]`: what quantizing `x` to
/// the quants `qs` left.
fn subtract_quants(x: &mut [f32], qs: &[i8], scale: impl Fn(usize) -> f32) {
    for (i, (x, &q)) in x.iter_mut().zip(qs).enumerate() {
        *x -= scale(i) * f32::from(q);
    }
}

/// Quantizes a run of `qs.len()` values (a multiple of 32) with the best
/// available code; all versions give identical results.
fn quantize_with(isa: Isa, x: &[f32], qs: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        // SAFETY: the caller checked that `isa` is available.
        return unsafe { super::super::avx2::quantize_run(x, qs) };
    }
    let _ = isa;
    quantize_run(x, qs)
}

impl ActBlock for BlockQ8 {
    const ELEMS: usize = 32;
    fn quantize(isa: Isa, x: &[f32], out: &mut Self) {
        let d = quantize_with(isa, x, &mut out.qs);
        out.finish(d);
    }
    fn subtract_from(&self, x: &mut [f32]) {
        subtract_quants(x, &self.qs, |_| self.d);
    }
}

impl ActBlock for BlockQ8K {
    const ELEMS: usize = 256;
    fn quantize(isa: Isa, x: &[f32], out: &mut Self) {
        let d = quantize_with(isa, x, &mut out.qs);
        out.finish(d);
    }
    fn subtract_from(&self, x: &mut [f32]) {
        subtract_quants(x, &self.qs, |_| self.d);
    }
}

#[cfg(target_arch = "x86_64")]
impl ActBlock for BlockQ8x2 {
    const ELEMS: usize = 64;
    fn quantize(isa: Isa, x: &[f32], out: &mut Self) {
        debug_assert!(isa >= Isa::Avx512);
        // SAFETY: these blocks are only made for the AVX-512 kernels, after
        // the caller checked that the CPU has AVX-512 (and so AVX2).
        unsafe { BlockQ8x2::quantize(x, out) }
    }
    fn subtract_from(&self, x: &mut [f32]) {
        subtract_quants(x, &self.qs, |i| self.d[i / 32]);
    }
}

/// Activations (`m * cols` values) at or above which quantizing them is split
/// over threads.
pub(super) const PAR_QUANTIZE_MIN: usize = 1 << 16;

/// Quantizes the `x.len() / cols` activation rows; returns the blocks and
/// the number per row (a row's last block may be partial). The rows are
/// followed by zero blocks up to a multiple of `pad_rows` rows.
pub(super) fn quantize_acts<B: ActBlock>(
    isa: Isa,
    x: &[f32],
    cols: usize,
    pad_rows: usize,
) -> (Vec<B>, usize) {
    let per_row = cols.div_ceil(B::ELEMS);
    let rows = x.len() / cols;
    let mut blocks = vec![B::default(); rows.next_multiple_of(pad_rows) * per_row];
    let quantize_row = |(x, out): (&[f32], &mut [B])| {
        for (x, b) in x.chunks(B::ELEMS).zip(out) {
            B::quantize(isa, x, b);
        }
    };
    let filled = &mut blocks[..rows * per_row];
    if x.len() >= PAR_QUANTIZE_MIN {
        x.par_chunks_exact(cols)
            .zip(filled.par_chunks_mut(per_row))
            .for_each(quantize_row);
    } else {
        x.chunks_exact(cols)
            .zip(filled.chunks_mut(per_row))
            .for_each(quantize_row);
    }
    (blocks, per_row)
}
