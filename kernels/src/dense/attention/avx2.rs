//! AVX2 widening of the half-precision caches for `task`'s AVX2 build: the
//! same values `half`'s slice conversions give (widening f16 and bf16 to
//! f32 is exact), by instructions that inline into the caller, where the
//! slice conversions are a call (and a CPU-feature check) per head.

use std::arch::x86_64::*;

/// `dst` = the f16 (or, with `BF16`, bf16) values `bits`, widened, eight at a
/// time.
///
/// # Safety
/// The CPU must have AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn widen_16bit<const BF16: bool>(bits: &[u16], dst: &mut [f32]) {
    assert_eq!(bits.len(), dst.len(), "widen sizes");
    let (whole, tail) = bits.as_chunks::<8>();
    let (out, out_tail) = dst.as_chunks_mut::<8>();
    for (h, o) in whole.iter().zip(out) {
        let h = _mm_loadu_si128(h.as_ptr().cast());
        let wide = if BF16 {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        } else {
            _mm256_cvtph_ps(h)
        };
        _mm256_storeu_ps(o.as_mut_ptr(), wide);
    }
    for (&h, o) in tail.iter().zip(out_tail) {
        *o = super::widen_half::<BF16>(h);
    }
}

/// Writes the transpose of the 16 × 8 block at column `first` of `rows` (16
/// rows of `stride` floats) to `out` (`[8][16]`: row `c` holds column
/// `first + c` of the 16 rows), as two 8 × 8 transposes.
///
/// # Safety
/// The CPU must have AVX2; `rows` holds 16 rows of `stride ≥ first + 8`
/// floats and `out` 128 floats.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn transpose16x8(rows: &[f32], stride: usize, first: usize, out: &mut [f32]) {
    assert!(
        rows.len() >= 15 * stride + first + 8 && out.len() >= 128,
        "transpose sizes"
    );
    for half in 0..2 {
        let r: [__m256; 8] = std::array::from_fn(|i| {
            _mm256_loadu_ps(rows.as_ptr().add((8 * half + i) * stride + first))
        });
        // Rows 2i and 2i + 1 interleaved, low and high pairs of each 128-bit
        // lane.
        let t: [__m256; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_ps(a, b)
            } else {
                _mm256_unpackhi_ps(a, b)
            }
        });
        // u[4g + m], 128-bit lane L: column 4L + m of rows 4g .. 4g + 4.
        let u: [__m256; 8] = std::array::from_fn(|i| {
            let (base, m) = (i & !3, i & 3);
            let (a, b) = (t[base + (m >> 1)], t[base + 2 + (m >> 1)]);
            if m & 1 == 0 {
                _mm256_shuffle_ps::<0x44>(a, b)
            } else {
                _mm256_shuffle_ps::<0xEE>(a, b)
            }
        });
        // Column c: rows 0..4 from u[c % 4] and rows 4..8 from u[4 + c % 4],
        // in 128-bit lane c / 4 of each.
        for c in 0..8 {
            let (lo, hi) = (u[c % 4], u[4 + c % 4]);
            let column = if c < 4 {
                _mm256_permute2f128_ps::<0x20>(lo, hi)
            } else {
                _mm256_permute2f128_ps::<0x31>(lo, hi)
            };
            _mm256_storeu_ps(out.as_mut_ptr().add(c * 16 + 8 * half), column);
        }
    }
}

#[cfg(test)]
mod tests {
    use half::slice::HalfFloatSliceExt;
    use half::{bf16, f16};

    use super::*;

    fn has_avx2() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
    }

    /// On any CPU with AVX2 (an AVX-512 one runs the AVX-512 code in the
    /// attention tests, so these kernels are tested here directly).
    #[test]
    fn transposes_and_widens_as_the_portable_code() {
        if !has_avx2() {
            return;
        }
        let stride = 21;
        let rows: Vec<f32> = (0..16 * stride).map(|i| i as f32 * 0.5 - 7.0).collect();
        for first in [0, 5, 13] {
            let mut out = vec![0f32; 128];
            // SAFETY: the CPU has AVX2; 16 rows of 21 ≥ first + 8 floats.
            unsafe { transpose16x8(&rows, stride, first, &mut out) };
            for c in 0..8 {
                for lane in 0..16 {
                    assert_eq!(out[c * 16 + lane], rows[lane * stride + first + c]);
                }
            }
        }
        let values: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.37).collect();
        let (f16s, bf16s) = (
            values.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(),
            values
                .iter()
                .map(|&v| bf16::from_f32(v))
                .collect::<Vec<_>>(),
        );
        let (mut want, mut got) = (vec![0f32; 37], vec![0f32; 37]);
        f16s.convert_to_f32_slice(&mut want);
        // SAFETY: the CPU has AVX2 and F16C; equal lengths.
        unsafe { widen_16bit::<false>(f16s.reinterpret_cast(), &mut got) };
        assert_eq!(got, want);
        bf16s.convert_to_f32_slice(&mut want);
        unsafe { widen_16bit::<true>(bf16s.reinterpret_cast(), &mut got) };
        assert_eq!(got, want);
    }
}
