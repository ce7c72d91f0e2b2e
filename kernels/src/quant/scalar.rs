//! Portable kernels, always compiled: the fallback on every CPU and the
//! reference every SIMD kernel is tested against. They are derived from
//! `QuantType::unpack`, so every format is covered in both precisions.
//!
//! Every kernel computes `out[r] = dot(row r of w, activations)` for the
//! `out.len()` rows in `w`; the caller guarantees whole rows and `cols > 0`.

use super::act::{BlockQ8, BlockQ8K};
use super::format::{Format, Unpacked, QK_K};

/// f32 dot product with eight independent partial sums (which the compiler
/// turns into SIMD on any target).
#[inline]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Exact kernel: each row's dot product with f32 activations, dequantizing
/// one block at a time into a stack buffer.
pub(crate) fn exact<F: Format>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let row_bytes = x.len() / F::ELEMS * F::BYTES;
    let mut u = Unpacked::default();
    let mut buf = [0f32; QK_K];
    let buf = &mut buf[..F::ELEMS];
    for (row, y) in w.chunks_exact(row_bytes).zip(out) {
        let mut acc = 0.0;
        for (block, xs) in row.chunks_exact(F::BYTES).zip(x.chunks_exact(F::ELEMS)) {
            F::TY.dequantize_block(block, &mut u, buf);
            acc += dot_f32(buf, xs);
        }
        *y = acc;
    }
}

/// Integer dot product of two runs of quants.
#[inline]
fn idot(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// Fast kernel for the 32-value formats, with Q8 activation blocks.
pub(crate) fn fast_q8<F: Format>(w: &[u8], acts: &[BlockQ8], out: &mut [f32]) {
    let mut u = Unpacked::default();
    for (row, y) in w.chunks_exact(acts.len() * F::BYTES).zip(out) {
        let mut acc = 0.0;
        for (block, a) in row.chunks_exact(F::BYTES).zip(acts) {
            F::TY.unpack(block, &mut u);
            let isum = idot(&u.q[..32], &a.qs);
            acc += a.d * (u.scale[0] * isum as f32 - u.offset[0] * a.sum as f32);
        }
        *y = acc;
    }
}

/// Fast kernel for the K-quants, with Q8_K activation blocks.
pub(crate) fn fast_q8k<F: Format>(w: &[u8], acts: &[BlockQ8K], out: &mut [f32]) {
    let sub = F::TY.sub_block();
    let mut u = Unpacked::default();
    for (row, y) in w.chunks_exact(acts.len() * F::BYTES).zip(out) {
        let mut acc = 0.0;
        for (block, a) in row.chunks_exact(F::BYTES).zip(acts) {
            F::TY.unpack(block, &mut u);
            let mut sum = 0.0;
            let runs = u.q.chunks_exact(sub).zip(a.qs.chunks_exact(sub));
            for (s, (q, x)) in runs.enumerate() {
                let bsum: i32 = a.bsums[s * sub / 16..(s + 1) * sub / 16]
                    .iter()
                    .map(|&b| i32::from(b))
                    .sum();
                sum += u.scale[s] * idot(q, x) as f32 - u.offset[s] * bsum as f32;
            }
            acc += a.d * sum;
        }
        *y = acc;
    }
}
