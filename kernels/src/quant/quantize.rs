//! Reference quantizers of weights: rows of f32 to GGUF blocks, exactly as
//! ggml's `quantize_row_*_ref` (what `llama-quantize` writes without an
//! importance matrix) and gguf-py compute them. The K-quants' searches are
//! in [`super::quantize_k`].

use half::f16;

use super::quantize_iq4::{iq4_nl_block, iq4_xs_block};
use super::quantize_k::{q2_k_block, q3_k_block, q4_k_block, q5_k_block, q6_k_block};
use super::{BlockQ8_0, QuantError, QuantType};

/// Values a block of the 32-value formats holds.
const QK: usize = 32;

/// Quantizes `src` to `ty` blocks in `dst`, as ggml's reference
/// quantizers do:
/// - Q8_0 ([`BlockQ8_0::quantize`]: `d = max|x| / 127`, quants rounded
///   halves away from zero);
/// - Q4_0 and Q5_0: the block's value of largest magnitude maps to −8
///   (−16), each quant `trunc(x/d + 8.5)` (`+ 16.5`) at most 15 (31);
/// - Q5_1: `d = (max − min) / 31`, quants `trunc((x − min)/d + 0.5)`;
/// - Q2_K to Q6_K: each sub-block's scale (and minimum) searched for the
///   least weighted error ([`super::quantize_k`]);
/// - IQ4_NL, IQ4_XS: indices into the non-linear table at the best of 16
///   trial scales a block ([`super::quantize_iq4`]).
///
/// `src.len()` must be a multiple of `ty.block_elems()` and `dst.len()`
/// `ty.row_bytes(src.len())`; other formats are
/// [`QuantError::NoQuantizer`].
pub fn quantize_row(ty: QuantType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let quantize_block: fn(&[f32], &mut [u8]) = match ty {
        QuantType::Q8_0 => q8_0_block,
        QuantType::Q4_0 => q4_0_block,
        QuantType::Q5_0 => q5_0_block,
        QuantType::Q5_1 => q5_1_block,
        QuantType::Q2K => q2_k_block,
        QuantType::Q3K => q3_k_block,
        QuantType::Q4K => q4_k_block,
        QuantType::Q5K => q5_k_block,
        QuantType::Q6K => q6_k_block,
        QuantType::IQ4NL => iq4_nl_block,
        QuantType::IQ4XS => iq4_xs_block,
        other => return Err(QuantError::NoQuantizer(other)),
    };
    let bytes = ty.row_bytes(src.len())?;
    if dst.len() != bytes {
        return Err(QuantError::WrongLength {
            what: "quantized row",
            expected: bytes,
            actual: dst.len(),
        });
    }
    for (x, block) in src
        .chunks_exact(ty.block_elems())
        .zip(dst.chunks_exact_mut(ty.block_bytes()))
    {
        quantize_block(x, block);
    }
    Ok(())
}

/// 32 values as a Q8_0 block's 34 bytes.
fn q8_0_block(x: &[f32], block: &mut [u8]) {
    let q = BlockQ8_0::quantize(x);
    block[..2].copy_from_slice(&q.d.to_le_bytes());
    for (b, &v) in block[2..].iter_mut().zip(&q.qs) {
        *b = v as u8;
    }
}

/// The first value of the largest magnitude in `x`, with its sign.
pub(super) fn signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The f16 scale `d` at the start of `block`, and `1/d` (0 for 0).
fn write_scale(d: f32, block: &mut [u8]) -> f32 {
    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// 32 values as a Q4_0 block's 18 bytes.
fn q4_0_block(x: &[f32], block: &mut [u8]) {
    let id = write_scale(signed_max(x) / -8.0, block);
    let quant = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    for (j, q) in block[2..].iter_mut().enumerate() {
        *q = quant(x[j]) | (quant(x[j + QK / 2]) << 4);
    }
}

/// 32 five-bit quants: low nibbles into `qs` (value j and j + 16 share a
/// byte), the fifth bits into the little-endian word `qh`.
fn pack_five_bits(quants: impl Fn(usize) -> u8, qh: &mut [u8], qs: &mut [u8]) {
    let mut high = 0u32;
    for (j, q) in qs.iter_mut().enumerate() {
        let (a, b) = (quants(j), quants(j + QK / 2));
        *q = (a & 0xF) | ((b & 0xF) << 4);
        high |= (u32::from(a >> 4) << j) | (u32::from(b >> 4) << (j + QK / 2));
    }
    qh.copy_from_slice(&high.to_le_bytes());
}

/// 32 values as a Q5_0 block's 22 bytes.
fn q5_0_block(x: &[f32], block: &mut [u8]) {
    let id = write_scale(signed_max(x) / -16.0, block);
    let (qh, qs) = block[2..].split_at_mut(4);
    pack_five_bits(|j| ((x[j] * id + 16.5) as i8).min(31) as u8, qh, qs);
}

/// 32 values as a Q5_1 block's 24 bytes.
fn q5_1_block(x: &[f32], block: &mut [u8]) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let id = write_scale((max - min) / 31.0, block);
    block[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
    let (qh, qs) = block[4..].split_at_mut(4);
    pack_five_bits(|j| ((x[j] - min) * id + 0.5) as u8, qh, qs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    #[test]
    fn q4_0_maps_the_largest_magnitude_to_minus_eight() {
        let mut x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.0) * 0.25).collect();
        x[5] = -4.0;
        let mut block = [0u8; 18];
        quantize_row(QuantType::Q4_0, &x, &mut block).unwrap();
        // max = 5.25 (value 31, the largest magnitude): d = −0.65625.
        assert_eq!(f16::from_le_bytes([block[0], block[1]]).to_f32(), -0.65625);
        let mut y = vec![0f32; 32];
        dequantize_row(QuantType::Q4_0, &block, &mut y).unwrap();
        assert_eq!(y[31], 5.25);
        // 0 sits at quant 8; −4.0 at trunc(−4/−0.65625 + 8.5) = 14.
        assert_eq!(y[10], 0.0);
        assert_eq!(y[5], (14.0 - 8.0) * -0.65625);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 0.65625 / 2.0 + 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn q8_0_weights_round_half_away_from_zero() {
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let mut out = [0u8; 34];
        quantize_row(QuantType::Q8_0, &x, &mut out).unwrap();
        assert_eq!(f16::from_le_bytes([out[0], out[1]]).to_f32(), 1.0);
        assert_eq!((out[2] as i8, out[3] as i8, out[4] as i8), (127, 3, -3));
        assert!(quantize_row(QuantType::Q8_0, &x, &mut out[..33]).is_err());
        assert!(quantize_row(QuantType::Q8_0, &x[..31], &mut out).is_err());
    }

    #[test]
    fn formats_without_a_quantizer_are_errors() {
        let mut out = [0u8; 20];
        assert_eq!(
            quantize_row(QuantType::Q4_1, &[0.0; 32], &mut out),
            Err(QuantError::NoQuantizer(QuantType::Q4_1))
        );
    }

    /// Smooth values with an outlier and a run of zeros: every quantizer's
    /// round trip stays within its format's error bound.
    #[test]
    fn round_trips_stay_within_a_step() {
        let x: Vec<f32> = (0..512)
            .map(|i| match i {
                77 => 9.0,
                300..=331 => 0.0,
                _ => (i as f32 * 0.61).sin() * (1.0 + (i / 64) as f32),
            })
            .collect();
        // The largest error allowed, as a fraction of a block's range.
        for (ty, bound) in [
            (QuantType::Q5_0, 1.0 / 31.0),
            (QuantType::Q5_1, 1.0 / 31.0),
            (QuantType::Q2K, 1.0 / 3.0),
            (QuantType::Q3K, 1.0 / 7.0),
            (QuantType::Q4K, 1.0 / 15.0),
            (QuantType::Q5K, 1.0 / 31.0),
            (QuantType::Q6K, 1.0 / 63.0),
            (QuantType::IQ4NL, 1.0 / 12.0),
            (QuantType::IQ4XS, 1.0 / 12.0),
        ] {
            let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
            quantize_row(ty, &x, &mut q).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y).unwrap();
            for (xs, ys) in x.chunks(ty.block_elems()).zip(y.chunks(ty.block_elems())) {
                let (lo, hi) = xs
                    .iter()
                    .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                for (a, b) in xs.iter().zip(ys) {
                    assert!(
                        (a - b).abs() <= bound * (hi - lo) * 1.01 + 1e-6,
                        "{ty}: {a} vs {b}"
                    );
                }
            }
            // Symmetric formats give a run of zeros back as zeros.
            if matches!(ty, QuantType::Q5_0 | QuantType::Q3K | QuantType::Q6K) {
                assert!(y[300..332].iter().all(|&v| v == 0.0), "{ty}");
            }
        }
    }
}
