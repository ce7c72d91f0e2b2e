//! The fast kernels' products over many activation rows on CPUs with
//! AVX-512 VNNI and no AMX (AMD Zen 4 and 5): weight rows decoded once per
//! tile as the AMX kernels decode them
//! ([`decode_weights`](super::amx::decode_weights): per group of 16 rows
//! and block of 32, eight 64-byte vectors, vector `k` holding bytes
//! `4k..4k + 4` of each row's block in its 32-bit lanes), then for every
//! activation row eight `vpdpbusd` a block, the row's four bytes broadcast
//! against the vector: lane `r` accumulates weight row `r`'s block sum, no
//! horizontal additions. The sums are the exact integers the other fast
//! kernels take, scaled in the same order (`fast`), so a product's bits do
//! not depend on the kernel.
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones. Q4_1's and Q5_1's
//! weights are unsigned (0..32) and the activations signed; the other
//! formats' weights are signed (quants less their offset), so the
//! activations go in biased by 128 (`a + 128`, unsigned) and each block
//! sum starts from `−128 · Σw`, which takes the bias back out exactly.
//!
//! Safety: as the parent module's kernels.

use std::arch::x86_64::*;

use super::super::act::BlockQ8K;
use super::super::aligned::grow;
use super::super::format::{f16_at, iq4xs_scales, marker, Format, IQ4_VALUES, QK_K};
use super::amx::{store_outputs, transpose_rows, Int8Weights};
use super::fast::{BlockQ8x2, LANES};
use super::quant_offset;

/// Values in a block.
const BLOCK: usize = 32;
/// Bytes of a block's decoded weights for a group of 16 rows.
const GROUP_BLOCK: usize = BLOCK * LANES;

/// `outs[i][col0 + r]` = weight row `r` of `w` (`n` rows) times activation
/// row `i` of `acts` (`act_len` pairs of blocks a row, the rows padded with
/// zero blocks to a multiple of 16; a row of `outs` for each unpadded row):
/// [`amx::multiply`](super::amx::multiply)'s contract and bits.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply<F: Format>(
    w: &Int8Weights,
    acts: &[BlockQ8x2],
    act_len: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    let blocks = w.cols / BLOCK;
    let signed = quant_offset(F::TY) != 0;
    let q = w.q.all_bytes();
    // One tile of activation rows at a time, biased by 128 for signed
    // weights (each row's blocks in order, 32 bytes each).
    let mut tile = vec![0u8; LANES * blocks * BLOCK];
    for (t, outs) in outs.chunks_mut(LANES).enumerate() {
        let rows = outs.len();
        let acts = &acts[t * LANES * act_len..];
        let bias = _mm512_set1_epi8(if signed { -128 } else { 0 });
        for i in 0..rows {
            let row = &acts[i * act_len..(i + 1) * act_len];
            copy_biased(
                row.iter().map(|a| &a.qs[..]),
                &mut tile[i * blocks * BLOCK..(i + 1) * blocks * BLOCK],
                bias,
            );
        }
        for g in 0..n.div_ceil(LANES) {
            let mut acc = [_mm512_setzero_ps(); LANES];
            let first = g * blocks;
            for b in 0..blocks {
                let at = (first + b) * GROUP_BLOCK;
                let wk: [__m512i; 8] =
                    std::array::from_fn(|k| _mm512_load_si512(q[at + 64 * k..].as_ptr().cast()));
                // Signed weights: −128 · Σw per row, the bias taken out.
                let start = if signed {
                    let mut sum = _mm512_setzero_si512();
                    for wk in &wk {
                        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(-128), *wk);
                    }
                    _mm512_sub_epi32(_mm512_setzero_si512(), sum)
                } else {
                    _mm512_setzero_si512()
                };
                let wd = _mm512_loadu_ps(w.d[first + b].as_ptr());
                let wm = _mm512_loadu_ps(w.m[first + b].as_ptr());
                let h = b % 2;
                for (i, acc) in acc.iter_mut().enumerate().take(rows) {
                    let x = &tile[(i * blocks + b) * BLOCK..][..BLOCK];
                    let word = |k: usize| {
                        _mm512_set1_epi32(i32::from_le_bytes([
                            x[4 * k],
                            x[4 * k + 1],
                            x[4 * k + 2],
                            x[4 * k + 3],
                        ]))
                    };
                    // Two chains of four, so that one does not wait on the
                    // other (the integer sum is the same in any order).
                    let mut sums = [start, _mm512_setzero_si512()];
                    for k in 0..8 {
                        sums[k / 4] = if signed {
                            _mm512_dpbusd_epi32(sums[k / 4], word(k), wk[k])
                        } else {
                            _mm512_dpbusd_epi32(sums[k / 4], wk[k], word(k))
                        };
                    }
                    let sum = _mm512_add_epi32(sums[0], sums[1]);
                    // As `amx::scale_sums` and the `fast` kernels.
                    let a = &acts[i * act_len + b / 2];
                    let scale = _mm512_mul_ps(wd, _mm512_set1_ps(a.d[h]));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, *acc);
                    if F::TY.has_min() {
                        *acc = _mm512_fmadd_ps(wm, _mm512_set1_ps(a.s[h]), *acc);
                    }
                }
            }
            store_outputs(&acc, outs, col0 + g * LANES, n - g * LANES);
        }
    }
}

/// Copies an activation row's quants (`runs`, each a multiple of 64 bytes)
/// into `out` as long as it lasts, each byte XORed with `bias` (0x80 turns a
/// signed byte `a` into the unsigned `a + 128`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn copy_biased<'a>(runs: impl Iterator<Item = &'a [i8]>, out: &mut [u8], bias: __m512i) {
    let mut out = out.chunks_mut(64);
    for run in runs {
        for (v, out) in run.chunks_exact(64).zip(&mut out) {
            let v = _mm512_xor_si512(_mm512_loadu_si512(v.as_ptr().cast()), bias);
            let mask = if out.len() == 64 {
                u64::MAX
            } else {
                (1u64 << out.len()) - 1
            };
            // SAFETY: the mask keeps the store inside `out`.
            _mm512_mask_storeu_epi8(out.as_mut_ptr().cast(), mask, v);
        }
    }
}

/// Decodes whole IQ4_XS rows (of `cols` values) into `out`: the table
/// values of each sub-block of 32 as signed bytes, laid out as the 32-value
/// formats' blocks are ([`decode_weights`](super::amx::decode_weights)),
/// with per group and super-block the rows' `d`, and per sub-block their
/// scales less 32.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_iq4xs(w: &[u8], cols: usize, out: &mut Int8Weights) {
    let bytes = marker::IQ4XS::BYTES;
    let row_bytes = cols / QK_K * bytes;
    let rows = w.len() / row_bytes.max(1);
    let (groups, supers, blocks) = (rows.div_ceil(LANES), cols / QK_K, cols / BLOCK);
    out.cols = cols;
    out.q.bytes(groups * blocks * GROUP_BLOCK);
    grow(&mut out.rows, LANES * cols, 0);
    grow(&mut out.d, groups * supers, [0.0; LANES]);
    grow(&mut out.sub_scales, groups * supers * 8, [0; LANES]);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4_VALUES.as_ptr().cast()));
    let low = _mm256_set1_epi8(0xF);
    for (g, group) in w.chunks(LANES * row_bytes).enumerate() {
        for (j, row) in group.chunks_exact(row_bytes).enumerate() {
            let values = &mut out.rows[j * cols..(j + 1) * cols];
            for (k, b) in row.chunks_exact(bytes).enumerate() {
                for (s, sc) in iq4xs_scales(b).into_iter().enumerate() {
                    let packed = _mm_loadu_si128(b[8 + 16 * s..][..16].as_ptr().cast());
                    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed);
                    let v = _mm256_shuffle_epi8(table, _mm256_and_si256(both, low));
                    let at = &mut values[k * QK_K + 32 * s..][..32];
                    _mm256_storeu_si256(at.as_mut_ptr().cast(), v);
                    out.sub_scales[(g * supers + k) * 8 + s][j] = i32::from(sc);
                }
                out.d[g * supers + k][j] = f16_at(b, 0);
            }
        }
        let group_q = &mut out.q.bytes((g + 1) * blocks * GROUP_BLOCK)[g * blocks * GROUP_BLOCK..];
        transpose_rows(&out.rows, cols, group_q, |c| c * 2 * GROUP_BLOCK);
    }
}

/// `outs[i][col0 + r]` = IQ4_XS weight row `r` of `w` (decoded by
/// [`decode_iq4xs`], `n` rows) times activation row `i` of `acts` (`act_len`
/// super-blocks a row, padded as for [`multiply`]): per super-block the
/// exact integer total `Σ_j (sc_j − 32)·Σ v·a` of the AVX2 kernels
/// (`avx2::fast_iq4xs`), then `fma(total, d·d_a, acc)`, so the bits are
/// theirs. The activations go in biased by 128; the bias comes back out
/// as `−128·Σ_j (sc_j − 32)·Σw` a lane, once per super-block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply_iq4xs(
    w: &Int8Weights,
    acts: &[BlockQ8K],
    act_len: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    let (supers, blocks) = (w.cols / QK_K, w.cols / BLOCK);
    let q = w.q.all_bytes();
    let mut tile = vec![0u8; LANES * w.cols];
    for (t, outs) in outs.chunks_mut(LANES).enumerate() {
        let rows = outs.len();
        let acts = &acts[t * LANES * act_len..];
        for i in 0..rows {
            let row = &acts[i * act_len..i * act_len + supers];
            let bias = _mm512_set1_epi8(-128);
            copy_biased(
                row.iter().map(|a| &a.qs[..]),
                &mut tile[i * w.cols..(i + 1) * w.cols],
                bias,
            );
        }
        for g in 0..n.div_ceil(LANES) {
            let mut acc = [_mm512_setzero_ps(); LANES];
            for k in 0..supers {
                let at = g * supers + k;
                let scales: [__m512i; 8] = std::array::from_fn(|s| {
                    _mm512_loadu_si512(w.sub_scales[at * 8 + s].as_ptr().cast())
                });
                let block = |s: usize| (g * blocks + 8 * k + s) * GROUP_BLOCK;
                // −128 · Σ_j sc_j · Σw_j, a lane per row.
                let mut bias = _mm512_setzero_si512();
                for (s, sc) in scales.iter().enumerate() {
                    let mut sum = _mm512_setzero_si512();
                    for c in 0..8 {
                        let wk = _mm512_load_si512(q[block(s) + 64 * c..].as_ptr().cast());
                        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(-128), wk);
                    }
                    bias = _mm512_sub_epi32(bias, _mm512_mullo_epi32(sum, *sc));
                }
                let wd = _mm512_loadu_ps(w.d[at].as_ptr());
                for (i, acc) in acc.iter_mut().enumerate().take(rows) {
                    let x = &tile[i * w.cols + k * QK_K..][..QK_K];
                    let mut total = bias;
                    for (s, sc) in scales.iter().enumerate() {
                        let x = &x[BLOCK * s..][..BLOCK];
                        let mut sums = [_mm512_setzero_si512(); 2];
                        for c in 0..8 {
                            let wk = _mm512_load_si512(q[block(s) + 64 * c..].as_ptr().cast());
                            let word = i32::from_le_bytes([
                                x[4 * c],
                                x[4 * c + 1],
                                x[4 * c + 2],
                                x[4 * c + 3],
                            ]);
                            sums[c / 4] =
                                _mm512_dpbusd_epi32(sums[c / 4], _mm512_set1_epi32(word), wk);
                        }
                        let dot = _mm512_add_epi32(sums[0], sums[1]);
                        total = _mm512_add_epi32(total, _mm512_mullo_epi32(dot, *sc));
                    }
                    let a = &acts[i * act_len + k];
                    let scale = _mm512_mul_ps(wd, _mm512_set1_ps(a.d));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), scale, *acc);
                }
            }
            store_outputs(&acc, outs, col0 + g * LANES, n - g * LANES);
        }
    }
}
