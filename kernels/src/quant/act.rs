//! 8-bit activation blocks for the fast (integer) dot products, and ggml's
//! Q8_0 block (the q8_0 KV cache's element; `quantize_row` writes weight
//! rows of them).

use half::f16;

use super::format::{QK, QK_K};

/// 32 activations quantized like Q8_0 (but with an f32 scale), and the
/// quants' sum (for the offsets and minimums of Q4_0/Q4_1/Q5_0/Q5_1), also
/// as `d · sum` (what the AVX2 kernels multiply by each weight block's
/// minimum or scale, taken once here, not once per weight row).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ8 {
    pub qs: [i8; QK],
    pub d: f32,
    pub sum: i32,
    pub ds: f32,
}

/// 256 activations quantized like ggml's Q8_K: f32 scale, quants, and the
/// sums of each run of 16 quants (for the K-quants' minimums and offsets).
/// Unlike ggml the scale is positive (`max|x| / 127`), which changes nothing
/// in the products. The quants start on a cache line, so that the AMX
/// kernels' 64-byte rows of them each touch one line.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
pub(crate) struct BlockQ8K {
    pub qs: [i8; QK_K],
    pub d: f32,
    pub bsums: [i16; 16],
}

impl Default for BlockQ8 {
    fn default() -> Self {
        Self {
            qs: [0; QK],
            d: 0.0,
            sum: 0,
            ds: 0.0,
        }
    }
}

impl Default for BlockQ8K {
    fn default() -> Self {
        Self {
            d: 0.0,
            qs: [0; QK_K],
            bsums: [0; 16],
        }
    }
}

/// Quantizes a run of activations symmetrically: `d = max|x| / 127`, quants
/// `x / d` rounded to nearest even (as the SIMD versions round). Returns `d`.
pub(crate) fn quantize_run(x: &[f32], qs: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

impl BlockQ8 {
    /// Sets the scale, and the sum from the quants.
    pub(crate) fn finish(&mut self, d: f32) {
        self.d = d;
        self.sum = self.qs.iter().map(|&q| i32::from(q)).sum();
        self.ds = d * self.sum as f32;
    }
}

impl BlockQ8K {
    /// Sets the scale, and the run sums from the quants.
    pub(crate) fn finish(&mut self, d: f32) {
        self.d = d;
        for (s, q16) in self.bsums.iter_mut().zip(self.qs.chunks_exact(16)) {
            *s = q16.iter().map(|&q| i16::from(q)).sum();
        }
    }
}

/// One GGUF Q8_0 block (ggml's `block_q8_0`, 34 bytes): an f16 scale and
/// 32 signed quants, value `i` being `d · qs[i]`. The q8_0 KV cache stores
/// keys and values as these.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    /// The scale.
    pub d: f16,
    /// The quants.
    pub qs: [i8; QK],
}

impl BlockQ8_0 {
    /// Quantizes 32 values exactly as ggml's `quantize_row_q8_0_ref` (and
    /// gguf-py) do: scale `d = max|x| / 127` stored as f16, quants
    /// `round(x / d)` (halves away from zero).
    ///
    /// # Panics
    /// If `x` does not hold exactly 32 values.
    pub fn quantize(x: &[f32]) -> Self {
        assert_eq!(x.len(), QK, "a Q8_0 block holds {QK} values");
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; QK];
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
        }
        Self {
            d: f16::from_f32(d),
            qs,
        }
    }

    /// `out[i] = d · qs[i]`, as ggml's `dequantize_row_q8_0`.
    pub fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, &q) in out.iter_mut().zip(&self.qs) {
            *y = f32::from(q) * d;
        }
    }
}

/// The activation rows of a multi-row kernel's call: `R` rows of the first
/// `blocks` blocks each, from `acts` (rows of `act_len` blocks one after
/// another).
#[inline(always)]
pub(super) fn rows_of<T, const R: usize>(acts: &[T], act_len: usize, blocks: usize) -> [&[T]; R] {
    std::array::from_fn(|i| &acts[i * act_len..i * act_len + blocks])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_round_trip_within_half_a_step() {
        let x: Vec<f32> = (0..256).map(|i| ((i * 7) % 13) as f32 - 6.5).collect();
        let mut b = BlockQ8K::default();
        let d = quantize_run(&x, &mut b.qs);
        b.finish(d);
        assert!((d * 127.0 - 6.5).abs() < 1e-5);
        for (q, v) in b.qs.iter().zip(&x) {
            assert!((f32::from(*q) * d - v).abs() <= d / 2.0 + 1e-6);
        }
        for (j, s) in b.bsums.iter().enumerate() {
            let expected: i16 = b.qs[j * 16..j * 16 + 16]
                .iter()
                .map(|&q| i16::from(q))
                .sum();
            assert_eq!(*s, expected);
        }
        let mut z = BlockQ8::default();
        let d = quantize_run(&[0.0; 32], &mut z.qs);
        z.finish(d);
        assert_eq!((z.d, z.sum), (0.0, 0));
    }
}
