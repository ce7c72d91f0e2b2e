//! The exact kernels' decoding of Q2_K, Q3_K, Q4_K, Q6_K and IQ4_XS: each super-block of 256
//! values as four quarters of 64 ([`ExactWeights`]), fed to every
//! activation row through [`ExactSums::add`] like the 32-value formats, so
//! the single-row and multi-row kernels give the same bits.
//!
//! A quarter's quants are widened byte → i32 straight from memory
//! (`vpmovzxbd`), unpacked with shifts and masks, converted to f32 and
//! scaled with one FMA: Q2_K and Q4_K `d·sc·q − dmin·m`, Q6_K `d·sc·q −
//! 32·d·sc` (which is `d·sc·(q − 32)` rounded once, as ggml computes it),
//! Q3_K likewise with 4. IQ4_XS's
//! indices pick their weights from the sub-block's table of 16, `d·(sc −
//! 32)` times each value (`vpermps`, which reads an index's low four bits).
//!
//! Safety: as the parent module's kernels.

use std::arch::x86_64::*;

use super::super::format::{
    f16_at, iq4xs_scales, k4_scales_mins, marker, q3k_scales_words, Format, IQ4_VALUES, QK_K,
};
use super::exact::{ExactRows, ExactSums, ExactWeights};

/// The 16 bytes at `b[at..at + 16]` widened to 16 unsigned i32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn widen16(b: &[u8], at: usize) -> __m512i {
    let bytes: &[u8; 16] = b[at..at + 16].try_into().expect("16 bytes");
    _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes.as_ptr().cast()))
}

/// `q · scale − offset` for 16 small non-negative integers `q`, rounded once.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scaled(q: __m512i, scale: f32, offset: f32) -> __m512 {
    _mm512_fmsub_ps(
        _mm512_cvtepi32_ps(q),
        _mm512_set1_ps(scale),
        _mm512_set1_ps(offset),
    )
}

/// The super-block formats: the per-block scales, and one quarter decoded.
trait Quarters: Format {
    /// Each run of weights' (scale, offset), as [`scaled`] takes them.
    type Scales;
    /// The scales of block `b` (scalar code).
    fn scales(b: &[u8]) -> Self::Scales;
    /// Values `64 · quarter .. 64 · quarter + 64` of block `b`.
    unsafe fn quarter(b: &[u8], scales: &Self::Scales, quarter: usize) -> ExactWeights;
}

impl Quarters for marker::Q4K {
    /// Per sub-block of 32: `d·sc` and `dmin·m`.
    type Scales = [(f32, f32); 8];

    #[inline(always)]
    fn scales(b: &[u8]) -> [(f32, f32); 8] {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let (sc, mn) = k4_scales_mins(&b[4..16]);
        // Loops, not `array::from_fn`: its closure would not inline here.
        let mut scales = [(0.0, 0.0); 8];
        for (s, (&sc, &mn)) in scales.iter_mut().zip(sc.iter().zip(&mn)) {
            *s = (d * f32::from(sc), dmin * f32::from(mn));
        }
        scales
    }

    /// Bytes `16 + 32·quarter ..` hold sub-block `2·quarter` in their low
    /// nibbles and sub-block `2·quarter + 1` in their high ones.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn quarter(b: &[u8], scales: &[(f32, f32); 8], quarter: usize) -> ExactWeights {
        let at = 16 + 32 * quarter;
        let bytes = [widen16(b, at), widen16(b, at + 16)];
        let low = _mm512_set1_epi32(0xF);
        let (lo, hi) = (scales[2 * quarter], scales[2 * quarter + 1]);
        ExactWeights {
            w: [
                scaled(_mm512_and_si512(bytes[0], low), lo.0, lo.1),
                scaled(_mm512_and_si512(bytes[1], low), lo.0, lo.1),
                scaled(_mm512_srli_epi32::<4>(bytes[0]), hi.0, hi.1),
                scaled(_mm512_srli_epi32::<4>(bytes[1]), hi.0, hi.1),
            ],
        }
    }
}

impl Quarters for marker::IQ4XS {
    /// Per sub-block of 32: `d·(sc − 32)`.
    type Scales = [f32; 8];

    #[inline(always)]
    fn scales(b: &[u8]) -> [f32; 8] {
        let d = f16_at(b, 0);
        let mut scales = [0.0; 8];
        for (s, &sc) in scales.iter_mut().zip(&iq4xs_scales(b)) {
            *s = d * f32::from(sc);
        }
        scales
    }

    /// Bytes `8 + 32·quarter ..` hold sub-block `2·quarter` (16 bytes: its
    /// first 16 values in the low nibbles, the next 16 in the high ones),
    /// then sub-block `2·quarter + 1`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn quarter(b: &[u8], scales: &[f32; 8], quarter: usize) -> ExactWeights {
        let values = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            IQ4_VALUES.as_ptr().cast(),
        )));
        let mut w = [_mm512_setzero_ps(); 4];
        for s in 0..2 {
            let table = _mm512_mul_ps(values, _mm512_set1_ps(scales[2 * quarter + s]));
            let bytes = widen16(b, 8 + 32 * quarter + 16 * s);
            w[2 * s] = _mm512_permutexvar_ps(bytes, table);
            w[2 * s + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(bytes), table);
        }
        ExactWeights { w }
    }
}

impl Quarters for marker::Q6K {
    /// Per run of 16: `d·sc`.
    type Scales = [f32; 16];

    #[inline(always)]
    fn scales(b: &[u8]) -> [f32; 16] {
        let d = f16_at(b, 208);
        let mut scales = [0.0; 16];
        for (s, &sc) in scales.iter_mut().zip(&b[192..208]) {
            *s = d * f32::from(sc as i8);
        }
        scales
    }

    /// Half `h = quarter / 2` of the block takes low bits from `ql =
    /// b[64h..64h + 64]` and high bits from `qh = b[128 + 32h..][..32]`:
    /// its value `l` (of 128) is nibble `l / 64` of `ql[l % 64]` joined
    /// with bits `2·(l / 32)..` of `qh[l % 32]`, scaled by `sc[8h + l / 16]`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn quarter(b: &[u8], scales: &[f32; 16], quarter: usize) -> ExactWeights {
        let (half, upper) = (quarter / 2, quarter % 2);
        let (ql, qh) = (64 * half, 128 + 32 * half);
        let low = _mm512_set1_epi32(0xF);
        let top = _mm512_set1_epi32(0x30);
        let nibble_shift = _mm_cvtsi32_si128(4 * upper as i32);
        let mut w = [_mm512_setzero_ps(); 4];
        for (k, w) in w.iter_mut().enumerate() {
            let nibbles = _mm512_srl_epi32(widen16(b, ql + 16 * k), nibble_shift);
            // Bits 2·(2·upper + k / 2) of qh, moved to bits 4 and 5.
            let high = _mm512_slli_epi32::<4>(widen16(b, qh + 16 * (k % 2)));
            let high_shift = _mm_cvtsi32_si128(2 * (2 * upper + k / 2) as i32);
            let q = _mm512_or_si512(
                _mm512_and_si512(nibbles, low),
                _mm512_and_si512(_mm512_srl_epi32(high, high_shift), top),
            );
            let scale = scales[4 * quarter + k];
            *w = scaled(q, scale, 32.0 * scale);
        }
        ExactWeights { w }
    }
}

/// Plane `k / 2 + 2·(quarter % 2)` of Q2_K's or Q3_K's quants, values `16·k
/// ..` of `quarter`: two bits of each of the 16 bytes at `16·(k % 2)` of
/// the half's 32 quant bytes (from `at`), widened, the plane's index.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn plane(b: &[u8], at: usize, quarter: usize, k: usize) -> (__m512i, usize) {
    let plane = 2 * (quarter % 2) + k / 2;
    let bytes = widen16(b, at + 32 * (quarter / 2) + 16 * (k % 2));
    let shift = _mm_cvtsi32_si128(2 * plane as i32);
    let two_bits = _mm512_and_si512(_mm512_srl_epi32(bytes, shift), _mm512_set1_epi32(3));
    (two_bits, 4 * (quarter / 2) + plane)
}

impl Quarters for marker::Q2K {
    /// Per run of 16: `d·sc` and `dmin·m`.
    type Scales = [(f32, f32); 16];

    #[inline(always)]
    fn scales(b: &[u8]) -> [(f32, f32); 16] {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let mut scales = [(0.0, 0.0); 16];
        for (s, &sc) in scales.iter_mut().zip(&b[..16]) {
            *s = (d * f32::from(sc & 0xF), dmin * f32::from(sc >> 4));
        }
        scales
    }

    /// The quants at `b[16..80]`, four 2-bit planes a 32-byte half.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn quarter(b: &[u8], scales: &[(f32, f32); 16], quarter: usize) -> ExactWeights {
        let mut w = [_mm512_setzero_ps(); 4];
        for (k, w) in w.iter_mut().enumerate() {
            let (q, _) = plane(b, 16, quarter, k);
            let (scale, min) = scales[4 * quarter + k];
            *w = scaled(q, scale, min);
        }
        ExactWeights { w }
    }
}

impl Quarters for marker::Q3K {
    /// Per run of 16: `d·(sc − 32)`.
    type Scales = [f32; 16];

    #[inline(always)]
    fn scales(b: &[u8]) -> [f32; 16] {
        let d = f16_at(b, 108);
        let words = q3k_scales_words(&b[96..108]);
        let mut scales = [0.0; 16];
        for (j, s) in scales.iter_mut().enumerate() {
            let sc = (words[j / 4] >> (8 * (j % 4))) as u8;
            *s = d * f32::from(sc as i8 - 32);
        }
        scales
    }

    /// The low two bits as Q2_K's (at `b[32..96]`), the third from bit
    /// `plane` of the mask bytes `b[..32]`: `q = low + 4·bit`, the weight
    /// `(q − 4)·scale`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn quarter(b: &[u8], scales: &[f32; 16], quarter: usize) -> ExactWeights {
        let mut w = [_mm512_setzero_ps(); 4];
        for (k, w) in w.iter_mut().enumerate() {
            let (low, plane) = plane(b, 32, quarter, k);
            let mask = widen16(b, 16 * (k % 2));
            let bit = _mm512_srl_epi32(mask, _mm_cvtsi32_si128(plane as i32));
            let high = _mm512_slli_epi32::<2>(_mm512_and_si512(bit, _mm512_set1_epi32(1)));
            let scale = scales[4 * quarter + k];
            *w = scaled(_mm512_or_si512(low, high), scale, 4.0 * scale);
        }
        ExactWeights { w }
    }
}

impl<F: Quarters> ExactRows for F {
    type Setup = ();
    const BLOCK_BYTES: usize = F::BYTES;
    const BLOCK_VALUES: usize = QK_K;

    unsafe fn setup() {}

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn rows<const R: usize>(
        row: &[u8],
        xs: &[&[f32]; R],
        _: &(),
        sums_io: &mut [ExactSums; R],
    ) {
        // A local copy, so the sums live in registers through the loop.
        let mut sums = *sums_io;
        for (i, b) in row.chunks_exact(F::BYTES).enumerate() {
            let scales = F::scales(b);
            for quarter in 0..4 {
                let w = F::quarter(b, &scales, quarter);
                let first = QK_K * i + 64 * quarter;
                for (s, x) in sums.iter_mut().zip(xs) {
                    *s = s.add(&w, &x[first..first + 64]);
                }
            }
        }
        *sums_io = sums;
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
    unsafe fn decode_row(row: &[u8], _: &(), out: &mut [f32]) {
        for (b, out) in row.chunks_exact(F::BYTES).zip(out.chunks_exact_mut(QK_K)) {
            let scales = F::scales(b);
            for (quarter, out) in out.chunks_exact_mut(64).enumerate() {
                F::quarter(b, &scales, quarter).store(out);
            }
        }
    }
}
