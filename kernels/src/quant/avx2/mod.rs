//! AVX2 + FMA + F16C kernels (x86_64).
//!
//! Safety: every function here may only run on a CPU with AVX2, FMA and F16C
//! ([`Isa::Avx2`](super::Isa::Avx2) available). Loads go through slices, so
//! they stay in bounds.
//!
//! The kernels have the portable kernels' contract (see `scalar`). They
//! stream one row at a time (interleaving rows defeats the hardware
//! prefetchers). The fast kernels (8-bit activations, here) alternate two
//! accumulators over the blocks so that consecutive blocks do not wait on
//! each other; for several activation rows, [`fast_32_multi`],
//! [`fast_q45k_multi`] and [`fast_k16_multi`] (Q2_K, Q3_K, Q6_K) decode
//! each block once for up to 8 of them, giving the single-row kernels' bits. The exact kernels (f32
//! activations) dequantize each weight to f32 and sum in four chains
//! (`panel`): one to three activation rows as the weights are read
//! (`exact_32`, `exact_k`), more from tiles of weights dequantized once
//! (`panel`).

use std::arch::x86_64::*;

use super::act::{rows_of, BlockQ8, BlockQ8K};
use super::format::{k4_scales_mins_words, Format};
use super::prefetch::rows_prefetched;
use super::QuantType;

// ---------------------------------------------------------------- helpers

/// The little-endian f16 at `at`, converted with F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16_at(bytes: &[u8], at: usize) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(f16_splat_bits(bytes, at)))
}

/// The little-endian f16 at `at` converted with F16C, in all eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16_splat(bytes: &[u8], at: usize) -> __m256 {
    _mm256_cvtph_ps(f16_splat_bits(bytes, at))
}

/// The 16 bits at `at` in every 16-bit lane. A broadcast, so the register
/// depends on nothing before it: inserting them into a register made
/// LLVM merge into one an FMA chain was using (a false dependency that
/// serialized the exact kernels' blocks).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn f16_splat_bits(bytes: &[u8], at: usize) -> __m128i {
    _mm_set1_epi16(i16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// A Q4_K/Q5_K block's eight 6-bit scales (low half) and eight minimums
/// (high half), widened to 16-bit lanes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn k4_scales_mins_i16(block: &[u8]) -> __m256i {
    let sm = k4_scales_mins_words(&block[4..16]);
    _mm256_cvtepu8_epi16(_mm_setr_epi32(
        sm[0] as i32,
        sm[1] as i32,
        sm[2] as i32,
        sm[3] as i32,
    ))
}

/// Sum of the eight lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Loads 32 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load32(bytes: &[u8]) -> __m256i {
    debug_assert!(bytes.len() >= 32);
    _mm256_loadu_si256(bytes.as_ptr().cast())
}

/// Loads 32 signed bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load32_i8(q: &[i8]) -> __m256i {
    debug_assert!(q.len() >= 32);
    _mm256_loadu_si256(q.as_ptr().cast())
}

/// Loads eight f32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8(x: &[f32]) -> __m256 {
    debug_assert!(x.len() >= 8);
    _mm256_loadu_ps(x.as_ptr())
}

/// Expands 16 bytes of packed nibbles to 32 bytes: the low nibbles (values
/// 0..16 of a block) then the high nibbles (values 16..32).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles32(bytes: &[u8]) -> __m256i {
    debug_assert!(bytes.len() >= 16);
    let v = _mm_loadu_si128(bytes.as_ptr().cast());
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(v), v);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
}

/// Spreads the 32 bits of `bits` over 32 bytes: byte `i` is 0xFF when bit
/// `i` is set, else 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn bits32(bits: u32) -> __m256i {
    let pick = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), pick);
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1))
}

/// The 32-bit little-endian word at `at`.
#[inline]
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Sums of adjacent products of unsigned bytes `u` and signed bytes `s`,
/// as eight i32 (each the sum of four products).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mul_sum_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Runs the row kernel `$k::<F>` (`fn(row, acts) -> f32`) over every row.
macro_rules! by_rows {
    ($k:ident::<$f:ty>, $w:expr, $blocks:expr, $acts:expr, $out:expr) => {{
        let (w, out): (&[u8], &mut [f32]) = ($w, $out);
        let row_bytes = $blocks * <$f as Format>::BYTES;
        for (row, y) in rows_prefetched(w, row_bytes).zip(out) {
            *y = $k::<$f>(row, $acts);
        }
    }};
}

mod exact;
mod exact_32;
mod exact_k;
mod iq4;
mod k16;
mod panel;

pub(crate) use exact_32::{exact_32, exact_32_multi};
pub(crate) use exact_k::{exact_k, exact_k_multi};
use iq4::iq4_values;
pub(crate) use iq4::{fast_iq4xs, fast_iq4xs_multi};
pub(crate) use k16::{fast_k16, fast_k16_multi};
pub(crate) use panel::{decode_rows, pack_acts, panel_multiply};

/// Folds `step(state, block, activations)` over a row's blocks with two
/// independent states, for even and odd blocks.
#[inline(always)]
fn fold2<A, S: Copy>(
    row: &[u8],
    bytes: usize,
    acts: &[A],
    init: S,
    mut step: impl FnMut(S, &[u8], &A) -> S,
) -> [S; 2] {
    let mut s = [init; 2];
    let (w2, a2) = (row.chunks_exact(2 * bytes), acts.chunks_exact(2));
    let (w_tail, a_tail) = (w2.remainder(), a2.remainder());
    for (w, a) in w2.zip(a2) {
        s[0] = step(s[0], &w[..bytes], &a[0]);
        s[1] = step(s[1], &w[bytes..], &a[1]);
    }
    if let (Some(a), true) = (a_tail.first(), w_tail.len() == bytes) {
        s[0] = step(s[0], w_tail, a);
    }
    s
}

/// The 32 quants of a Q4_0/Q4_1/Q5_0/Q5_1 block as unsigned bytes (0..16 or
/// 0..32, before the offset of Q4_0/Q5_0).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn unsigned_quants<F: Format>(b: &[u8]) -> __m256i {
    match F::TY {
        QuantType::Q4_0 => nibbles32(&b[2..]),
        QuantType::Q4_1 => nibbles32(&b[4..]),
        QuantType::Q5_0 => {
            let high = _mm256_and_si256(bits32(u32_at(b, 2)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles32(&b[6..]), high)
        }
        _ => {
            let high = _mm256_and_si256(bits32(u32_at(b, 4)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles32(&b[8..]), high)
        }
    }
}

/// The offset subtracted from [`unsigned_quants`] (0 for the formats with a
/// minimum instead).
const fn quant_offset(ty: QuantType) -> i8 {
    match ty {
        QuantType::Q4_0 => 8,
        QuantType::Q5_0 => 16,
        _ => 0,
    }
}

/// The 32 bytes of Q5_K high bits (zeros for Q4_K).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q5k_high_bits<F: Format>(b: &[u8]) -> __m256i {
    if F::TY == QuantType::Q5K {
        load32(&b[16..48])
    } else {
        _mm256_setzero_si256()
    }
}

/// The unsigned quants of the two sub-blocks (low then high nibbles) in
/// 32-byte group `p` of a Q4_K/Q5_K block. For Q5_K, `qh` holds the high bits
/// of this group in bits 0 and 1 of each byte, and is shifted for the next.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q45k_group<F: Format>(b: &[u8], p: usize, qh: &mut __m256i) -> (__m256i, __m256i) {
    let mask = _mm256_set1_epi8(0xF);
    let bit4 = _mm256_set1_epi8(0x10);
    let five = F::TY == QuantType::Q5K;
    let bits = load32(&b[if five { 48 } else { 16 } + 32 * p..]);
    let mut low = _mm256_and_si256(bits, mask);
    let mut high = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), mask);
    if five {
        low = _mm256_or_si256(low, _mm256_and_si256(_mm256_slli_epi16::<4>(*qh), bit4));
        high = _mm256_or_si256(high, _mm256_and_si256(_mm256_slli_epi16::<3>(*qh), bit4));
        *qh = _mm256_srli_epi16::<2>(*qh);
    }
    (low, high)
}

/// The four 32-byte vectors of unsigned 6-bit Q6_K quants (0..64) for the
/// 128 values of half `h` of a block: values 0..32, 32..64, 64..96, 96..128.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn q6k_half(b: &[u8], h: usize) -> [__m256i; 4] {
    let ([q0, q1], [q2, q3]) = (q6k_quarter(b, 2 * h), q6k_quarter(b, 2 * h + 1));
    [q0, q1, q2, q3]
}

/// The two 32-byte vectors of unsigned 6-bit Q6_K quants (0..64) for the 64
/// values of quarter `p` of a block: values `64·p .. 64·p + 32`, and the
/// next 32. Half `p / 2` takes its low four bits from the 64 bytes at
/// `64·(p / 2)` (the first quarter the low nibbles, the second the high)
/// and its top two from the 32 bytes at `128 + 32·(p / 2)` (bits `2·k`
/// for the half's `k`-th 32 values).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) unsafe fn q6k_quarter(b: &[u8], p: usize) -> [__m256i; 2] {
    let h = p / 2;
    let (ql, qh) = (&b[64 * h..], &b[128 + 32 * h..]);
    let mask = _mm256_set1_epi8(0xF);
    let top = _mm256_set1_epi8(0x30);
    let (l0, l1, hb) = (load32(ql), load32(&ql[32..]), load32(qh));
    // The low bits, and the top two moved to bits 4 and 5.
    let (l0, l1, t0, t1) = if p.is_multiple_of(2) {
        (
            l0,
            l1,
            _mm256_slli_epi16::<4>(hb),
            _mm256_slli_epi16::<2>(hb),
        )
    } else {
        let (h0, h1) = (_mm256_srli_epi16::<4>(l0), _mm256_srli_epi16::<4>(l1));
        (h0, h1, hb, _mm256_srli_epi16::<2>(hb))
    };
    [
        _mm256_or_si256(_mm256_and_si256(l0, mask), _mm256_and_si256(t0, top)),
        _mm256_or_si256(_mm256_and_si256(l1, mask), _mm256_and_si256(t1, top)),
    ]
}

// ------------------------------------------------- fast (8-bit activations)

/// Whether a 32-value format's quants are signed bytes once decoded
/// ([`signed_quants`]: Q8_0, IQ4_NL) rather than unsigned ones with an
/// offset or minimum ([`unsigned_quants`]).
const fn signed_32(ty: QuantType) -> bool {
    matches!(ty, QuantType::Q8_0 | QuantType::IQ4NL)
}

/// The 32 signed quants of a Q8_0 or IQ4_NL block (IQ4_NL's indices looked
/// up in its table).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn signed_quants<F: Format>(b: &[u8]) -> __m256i {
    if F::TY == QuantType::IQ4NL {
        iq4_values(nibbles32(&b[2..]))
    } else {
        load32(&b[2..])
    }
}

/// Q8_0 and IQ4_NL with Q8 activations: signed quants times the
/// activations, times the two scales.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_signed_32<F: Format>(w: &[u8], acts: &[BlockQ8], out: &mut [f32]) {
    by_rows!(fast_signed_32_row::<F>, w, acts.len(), acts, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_signed_32_row<F: Format>(row: &[u8], acts: &[BlockQ8]) -> f32 {
    let acc = fold2(row, F::BYTES, acts, _mm256_setzero_ps(), |acc, b, a| {
        let q = signed_quants::<F>(b);
        let x = load32_i8(&a.qs);
        // maddubs needs an unsigned operand: |q| times x with q's sign.
        let p = mul_sum_u8_i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q));
        let d = _mm256_set1_ps(f16_at(b, 0) * a.d);
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc)
    });
    hsum(_mm256_add_ps(acc[0], acc[1]))
}

/// Q4_0, Q4_1, Q5_0 and Q5_1 with Q8 activations: unsigned quants times the
/// activations, then the offset (-8 or -16) or the minimum through the
/// activation block's sum.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_32<F: Format>(w: &[u8], acts: &[BlockQ8], out: &mut [f32]) {
    by_rows!(fast_32_row::<F>, w, acts.len(), acts, out);
}

/// A Q4_0/Q4_1/Q5_0/Q5_1 block decoded for [`fast_32`]: the unsigned
/// quants, the scale, and the factor of the activation sum (the minimum, or
/// the scale).
#[derive(Clone, Copy)]
struct Fast32Weights {
    q: __m256i,
    d: f32,
    c: f32,
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_32_weights<F: Format>(b: &[u8]) -> Fast32Weights {
    let d = f16_at(b, 0);
    Fast32Weights {
        q: unsigned_quants::<F>(b),
        d,
        c: if F::TY.has_min() { f16_at(b, 2) } else { d },
    }
}

/// [`fast_32`]'s step: adds a decoded block times an activation block to
/// the state (Σ scale × products, Σ (scale or minimum) × activation sum).
/// The single-row and multi-row kernels both go through it, so they agree
/// bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_32_add((acc, corr): (__m256, f32), w: &Fast32Weights, a: &BlockQ8) -> (__m256, f32) {
    let p = mul_sum_u8_i8(w.q, load32_i8(&a.qs));
    let acc = _mm256_fmadd_ps(_mm256_set1_ps(w.d * a.d), _mm256_cvtepi32_ps(p), acc);
    (acc, w.c.mul_add(a.ds, corr))
}

/// [`fast_32`]'s result from the states of the even and odd blocks.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_32_finish<F: Format>(even: (__m256, f32), odd: (__m256, f32)) -> f32 {
    let k = if F::TY.has_min() {
        1.0
    } else {
        -f32::from(quant_offset(F::TY))
    };
    hsum(_mm256_add_ps(even.0, odd.0)) + k * (even.1 + odd.1)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_32_row<F: Format>(row: &[u8], acts: &[BlockQ8]) -> f32 {
    let [even, odd] = fold2(
        row,
        F::BYTES,
        acts,
        (_mm256_setzero_ps(), 0f32),
        |state, b, a| fast_32_add(state, &fast_32_weights::<F>(b), a),
    );
    fast_32_finish::<F>(even, odd)
}

/// [`fast_32`] (or [`fast_signed_32`] for Q8_0 and IQ4_NL) over `R` (at most 8) activation
/// rows at once: each weight block is decoded once for the `R` rows. `acts` holds the `R` rows of
/// `act_len` blocks one after another, `out` the `R` output rows of
/// `n = out.len() / R` values: `out[i * n + r]` is weight row `r` times
/// activation row `i`, bit for bit what [`fast_32`] gives.
///
/// The even and odd blocks' sums are independent, so they are taken one
/// after the other. The activation-side numbers of [`fast_32_add`] (the
/// scale, and the scale times the quants' sum) are laid out with one lane
/// per activation row, so that the scale products and the sums of the
/// activation sums take one vector operation for all `R` rows: lane `i`
/// computes exactly what the single-row kernel computes for row `i`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_32_multi<F: Format, const R: usize>(
    w: &[u8],
    acts: &[BlockQ8],
    act_len: usize,
    out: &mut [f32],
) {
    const { assert!(R <= 8) };
    let n = out.len() / R;
    let Some(row_bytes) = w.len().checked_div(n) else {
        return;
    };
    let blocks = (row_bytes / F::BYTES).min(act_len);
    let rows_acts = rows_of::<_, R>(acts, act_len, blocks);
    // Per block: the rows' scales, and scales times sums (unused for Q8_0).
    let mut scales = vec![[0f32; 8]; blocks];
    let mut sums = vec![[0f32; 8]; blocks];
    for (j, (d, ds)) in scales.iter_mut().zip(&mut sums).enumerate() {
        for (i, a) in rows_acts.iter().enumerate() {
            let a = &a[j];
            d[i] = a.d;
            ds[i] = a.ds;
        }
    }
    for (r, row) in rows_prefetched(w, row_bytes).enumerate() {
        // [even, odd] blocks: the products' sums per row, and the sums of
        // the activation sums (a lane per row).
        let mut acc = [[_mm256_setzero_ps(); R]; 2];
        let mut corr = [_mm256_setzero_ps(); 2];
        for (parity, (acc, corr)) in acc.iter_mut().zip(&mut corr).enumerate() {
            let mut j = parity;
            while j < blocks {
                let b = &row[j * F::BYTES..(j + 1) * F::BYTES];
                let wt = if signed_32(F::TY) {
                    // As `fast_signed_32_row`: `q` holds the signed quants.
                    let d = f16_at(b, 0);
                    Fast32Weights {
                        q: signed_quants::<F>(b),
                        d,
                        c: d,
                    }
                } else {
                    fast_32_weights::<F>(b)
                };
                let dd = _mm256_mul_ps(_mm256_set1_ps(wt.d), load8(&scales[j]));
                if !signed_32(F::TY) {
                    *corr = _mm256_fmadd_ps(_mm256_set1_ps(wt.c), load8(&sums[j]), *corr);
                }
                let abs = _mm256_sign_epi8(wt.q, wt.q);
                for (i, (acc, a)) in acc.iter_mut().zip(&rows_acts).enumerate() {
                    let x = load32_i8(&a[j].qs);
                    let p = if signed_32(F::TY) {
                        mul_sum_u8_i8(abs, _mm256_sign_epi8(x, wt.q))
                    } else {
                        mul_sum_u8_i8(wt.q, x)
                    };
                    let d = _mm256_permutevar8x32_ps(dd, _mm256_set1_epi32(i as i32));
                    *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
                }
                j += 2;
            }
        }
        let mut c = [[0f32; 8]; 2];
        for (c, v) in c.iter_mut().zip(&corr) {
            _mm256_storeu_ps(c.as_mut_ptr(), *v);
        }
        for i in 0..R {
            out[i * n + r] = if signed_32(F::TY) {
                // As `fast_signed_32_row`.
                hsum(_mm256_add_ps(acc[0][i], acc[1][i]))
            } else {
                fast_32_finish::<F>((acc[0][i], c[0][i]), (acc[1][i], c[1][i]))
            };
        }
    }
}

/// Q4_K and Q5_K with Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_q45k<F: Format>(w: &[u8], acts: &[BlockQ8K], out: &mut [f32]) {
    by_rows!(fast_q45k_row::<F>, w, acts.len(), acts, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn fast_q45k_row<F: Format>(row: &[u8], acts: &[BlockQ8K]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in row.chunks_exact(F::BYTES).zip(acts) {
        let sm = k4_scales_mins_i16(b);
        // Minimums times the sums of each 32 activations.
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().cast());
        let pair_sums = _mm_hadd_epi16(
            _mm256_castsi256_si128(bsums),
            _mm256_extracti128_si256::<1>(bsums),
        );
        let mins = _mm_madd_epi16(_mm256_extracti128_si256::<1>(sm), pair_sums);
        // Scales times the quants' products.
        let scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
        let mut qh = q5k_high_bits::<F>(b);
        let mut sumi = _mm256_setzero_si256();
        for p in 0..4 {
            let (low, high) = q45k_group::<F>(b, p, &mut qh);
            let pl = _mm256_maddubs_epi16(low, load32_i8(&a.qs[64 * p..]));
            let ph = _mm256_maddubs_epi16(high, load32_i8(&a.qs[64 * p + 32..]));
            let pl = _mm256_madd_epi16(pl, _mm256_shuffle_epi8(scales, scale_pick(2 * p)));
            let ph = _mm256_madd_epi16(ph, _mm256_shuffle_epi8(scales, scale_pick(2 * p + 1)));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = scale_q45k(acc, hsum_i32(sumi), sum128_i32(mins), b, a.d);
    }
    acc
}

/// Adds a K-quant super-block's product to `acc` from its exact integer
/// totals (the contract of the fast Q4_K/Q5_K kernels, AMX's included):
/// `sum` = Σ scale·(quants·activations) and `mins` = Σ minimum·(sums of 32
/// activations) over its sub-blocks; `b` the weight block, `d` the
/// activations' scale.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_q45k(acc: f32, sum: i32, mins: i32, b: &[u8], d: f32) -> f32 {
    let acc = (sum as f32).mul_add(f16_at(b, 0) * d, acc);
    (-(mins as f32)).mul_add(f16_at(b, 2) * d, acc)
}

/// Sum of the 8 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    sum128_i32(_mm_add_epi32(
        _mm256_castsi256_si128(v),
        _mm256_extracti128_si256::<1>(v),
    ))
}

/// Sum of the 4 lanes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sum128_i32(v: __m128i) -> i32 {
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
    let v = _mm_add_epi32(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
    _mm_cvtsi128_si32(v)
}

/// [`fast_q45k`] over `R` (2, 4, 6 or 8) activation rows at once: each
/// weight block is decoded once for the `R` rows. `acts` holds the `R` rows
/// of `act_len` blocks one after another, `out` the `R` output rows of
/// `n = out.len() / R` values: `out[i * n + r]` is weight row `r` times
/// activation row `i`, bit for bit what [`fast_q45k`] gives.
///
/// The integer totals of a block do not depend on the order of their
/// additions, and each activation row then takes the single-row kernel's
/// floating-point steps (`scale_q45k`); the minimums' sums of two
/// activation rows share a vector (four lanes each).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fast_q45k_multi<F: Format, const R: usize>(
    w: &[u8],
    acts: &[BlockQ8K],
    act_len: usize,
    out: &mut [f32],
) {
    const { assert!(R <= 8 && R.is_multiple_of(2)) };
    let n = out.len() / R;
    let Some(row_bytes) = w.len().checked_div(n) else {
        return;
    };
    let blocks = (row_bytes / F::BYTES).min(act_len);
    let rows_acts = rows_of::<_, R>(acts, act_len, blocks);
    // Per block and activation row: the sums of each 32 activations (as
    // `fast_q45k_row` forms them).
    let mut pair_sums = vec![[0i16; 8]; blocks * R];
    for j in 0..blocks {
        for (i, a) in rows_acts.iter().enumerate() {
            let bsums = _mm256_loadu_si256(a[j].bsums.as_ptr().cast());
            let sums = _mm_hadd_epi16(
                _mm256_castsi256_si128(bsums),
                _mm256_extracti128_si256::<1>(bsums),
            );
            _mm_storeu_si128(pair_sums[j * R + i].as_mut_ptr().cast(), sums);
        }
    }
    for (r, row) in rows_prefetched(w, row_bytes).enumerate() {
        let mut acc = [0f32; R];
        for (j, b) in row.chunks_exact(F::BYTES).take(blocks).enumerate() {
            let sm = k4_scales_mins_i16(b);
            // Minimums times the sums of each 32 activations, activation
            // rows 2k and 2k + 1 in the low and high halves.
            let mins_w = _mm256_broadcastsi128_si256(_mm256_extracti128_si256::<1>(sm));
            let mut mins = [0i32; R];
            for k in 0..R / 2 {
                let at = j * R + 2 * k;
                let sums = _mm256_loadu_si256(pair_sums[at..at + 2].as_ptr().cast());
                let m = _mm256_madd_epi16(mins_w, sums);
                mins[2 * k] = sum128_i32(_mm256_castsi256_si128(m));
                mins[2 * k + 1] = sum128_i32(_mm256_extracti128_si256::<1>(m));
            }
            // Scales times the quants' products: the block's quants and
            // scales are decoded once, then each activation row's sum.
            let sc = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sm));
            let mut qh = q5k_high_bits::<F>(b);
            let mut quants = [_mm256_setzero_si256(); 8];
            let mut picks = [_mm256_setzero_si256(); 8];
            for p in 0..4 {
                (quants[2 * p], quants[2 * p + 1]) = q45k_group::<F>(b, p, &mut qh);
                picks[2 * p] = _mm256_shuffle_epi8(sc, scale_pick(2 * p));
                picks[2 * p + 1] = _mm256_shuffle_epi8(sc, scale_pick(2 * p + 1));
            }
            for (i, (acc, a)) in acc.iter_mut().zip(&rows_acts).enumerate() {
                let qs = &a[j].qs;
                let mut sumi = _mm256_setzero_si256();
                for p in 0..4 {
                    let pl = _mm256_maddubs_epi16(quants[2 * p], load32_i8(&qs[64 * p..]));
                    let ph = _mm256_maddubs_epi16(quants[2 * p + 1], load32_i8(&qs[64 * p + 32..]));
                    let pl = _mm256_madd_epi16(pl, picks[2 * p]);
                    let ph = _mm256_madd_epi16(ph, picks[2 * p + 1]);
                    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
                }
                *acc = scale_q45k(*acc, hsum_i32(sumi), mins[i], b, a[j].d);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            out[i * n + r] = *acc;
        }
    }
}

/// A shuffle that broadcasts 16-bit lane `j` (of each 128-bit half).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_pick(j: usize) -> __m256i {
    let j = j as i16;
    _mm256_set1_epi16(((2 * j + 1) << 8) | (2 * j))
}

// ------------------------------------------------- activation quantization

/// [`quantize_run`](super::act::quantize_run) for a multiple of 32 values,
/// with identical results.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_run(x: &[f32], qs: &mut [i8]) -> f32 {
    debug_assert!(x.len().is_multiple_of(32) && qs.len() == x.len());
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut max = _mm256_setzero_ps();
    for x8 in x.chunks_exact(8) {
        max = _mm256_max_ps(max, _mm256_and_ps(load8(x8), abs));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps::<1>(max));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    // packs interleave the 128-bit lanes; this permutation restores order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (x32, q32) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)) {
        let lo = _mm256_packs_epi32(
            scale_round(load8(x32), id),
            scale_round(load8(&x32[8..]), id),
        );
        let hi = _mm256_packs_epi32(
            scale_round(load8(&x32[16..]), id),
            scale_round(load8(&x32[24..]), id),
        );
        let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(lo, hi), order);
        _mm256_storeu_si256(q32.as_mut_ptr().cast(), bytes);
    }
    d
}

/// `v * id` rounded to the nearest integer, ties to even.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scale_round(v: __m256, id: __m256) -> __m256i {
    let v = _mm256_mul_ps(v, id);
    _mm256_cvtps_epi32(_mm256_round_ps::<
        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
    >(v))
}
