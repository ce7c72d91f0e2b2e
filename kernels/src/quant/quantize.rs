//! Reference quantizers of weights: rows of f32 to GGUF blocks, exactly as
//! ggml's `quantize_row_*_ref` (what `llama-quantize` writes without an
//! importance matrix) and gguf-py compute them.

use half::f16;

use super::{BlockQ8_0, QuantError, QuantType};

/// Values a block of the 32-value formats holds.
const QK: usize = 32;

/// Quantizes `src` to `ty` blocks in `dst`: Q8_0 ([`BlockQ8_0::quantize`]:
/// `d = max|x| / 127`, quants rounded halves away from zero) or Q4_0
/// (ggml's `quantize_row_q4_0_ref`: the block's value of largest magnitude
/// maps to −8, `d = max / −8`, each quant `min(15, trunc(x/d + 8.5))`).
/// `src.len()` must be a multiple of 32 and `dst.len()`
/// `ty.row_bytes(src.len())`.
pub fn quantize_row(ty: QuantType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let quantize_block: fn(&[f32], &mut [u8]) = match ty {
        QuantType::Q8_0 => q8_0_block,
        QuantType::Q4_0 => q4_0_block,
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
        .chunks_exact(QK)
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

/// 32 values as a Q4_0 block's 18 bytes.
fn q4_0_block(x: &[f32], block: &mut [u8]) {
    // The first value of the largest magnitude, with its sign.
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let quant = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    for (j, q) in block[2..].iter_mut().enumerate() {
        *q = quant(x[j]) | (quant(x[j + QK / 2]) << 4);
    }
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
}
