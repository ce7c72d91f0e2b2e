//! AMX products for the fast kernels of Q4_K and Q6_K: a tile product per
//! sub-block (32 values for Q4_K, unsigned quants; 16 for Q6_K, signed
//! quants − 32), the 16 × 16 sums times the weight rows' integer sub-block
//! scales added up per super-block (with, for Q4_K, the activation sums
//! times the rows' minimums), then scaled once per super-block exactly as
//! the AVX2 kernels scale their integer totals (`scale_q45k`,
//! `scale_q6k`), so the bits are theirs.

use std::arch::x86_64::*;

use super::super::super::act::BlockQ8K;
use super::super::super::aligned::grow;
use super::super::super::avx2::q6k_half;
use super::super::super::format::{f16_at, k4_scales_mins, QK_K};
use super::{block_sums, store_outputs, ActTile, AmxActs, AmxWeights, Sums, Tiles, BLOCK, LANES};

/// Lays out Q8_K activation rows (`act_len` super-blocks each, `cols`
/// values in all) as B tiles, one per sub-block of `SUB` (32 for Q4_K, 16
/// for Q6_K) values, with the rows' scales and the sub-block's quant sums.
pub(crate) fn pack_acts_k<const SUB: usize>(
    acts: &[BlockQ8K],
    act_len: usize,
    cols: usize,
) -> AmxActs {
    let m = acts.len() / act_len.max(1);
    let (blocks, per_super) = (cols / SUB, QK_K / SUB);
    let mut tiles = vec![ActTile::EMPTY; m.div_ceil(LANES) * blocks];
    for (i, row) in acts.chunks_exact(act_len).enumerate() {
        let (t, lane) = (i / LANES, i % LANES);
        for b in 0..blocks {
            let (a, k) = (&row[b / per_super], b % per_super);
            let qs = &a.qs[k * SUB..(k + 1) * SUB];
            let runs = &a.bsums[k * SUB / 16..(k + 1) * SUB / 16];
            let sum = runs.iter().map(|&s| f32::from(s)).sum();
            tiles[t * blocks + b].set_lane(lane, qs, a.d, sum);
        }
    }
    AmxActs {
        tiles,
        blocks,
        cols,
    }
}

/// Sizes `out` for `rows` weight rows of `cols` values in sub-blocks of
/// `sub`; returns the super-blocks a row.
fn prepare(out: &mut AmxWeights, rows: usize, cols: usize, sub: usize) -> usize {
    let groups = rows.div_ceil(LANES);
    let supers = cols / QK_K;
    out.cols = cols;
    grow(&mut out.q, groups * LANES * cols, 0);
    grow(&mut out.d, groups * cols / sub, [0.0; LANES]);
    grow(&mut out.m, groups * cols / sub, [0.0; LANES]);
    grow(&mut out.super_d, groups * supers, [0.0; LANES]);
    grow(&mut out.super_m, groups * supers, [0.0; LANES]);
    supers
}

/// Decodes whole Q4_K rows: unsigned quants 0..16, the sub-block scales
/// and minimums as integers, each super-block's scales.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_q4k(w: &[u8], cols: usize, out: &mut AmxWeights) {
    const BYTES: usize = 4 + 12 + QK_K / 2;
    let row_bytes = cols / QK_K * BYTES;
    let rows = w.len() / row_bytes.max(1);
    let supers = prepare(out, rows, cols, BLOCK);
    let blocks = cols / BLOCK;
    let low = _mm256_set1_epi8(0xF);
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        let (g, lane) = (r / LANES, r % LANES);
        for (k, b) in row.chunks_exact(BYTES).enumerate() {
            let q = &mut out.q[r * cols + k * QK_K..r * cols + (k + 1) * QK_K];
            // 32 bytes of quants hold two sub-blocks: low nibbles, then high.
            for (qs, q) in b[16..].chunks_exact(32).zip(q.chunks_exact_mut(64)) {
                let v = _mm256_loadu_si256(qs.as_ptr().cast());
                let (lo, hi) = q.split_at_mut(32);
                _mm256_storeu_si256(lo.as_mut_ptr().cast(), _mm256_and_si256(v, low));
                let v = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                _mm256_storeu_si256(hi.as_mut_ptr().cast(), v);
            }
            let (scales, mins) = k4_scales_mins(&b[4..16]);
            for sub in 0..QK_K / BLOCK {
                out.d[g * blocks + k * 8 + sub][lane] = f32::from(scales[sub]);
                out.m[g * blocks + k * 8 + sub][lane] = f32::from(mins[sub]);
            }
            out.super_d[g * supers + k][lane] = f16_at(b, 0);
            out.super_m[g * supers + k][lane] = f16_at(b, 2);
        }
    }
}

/// Decodes whole Q6_K rows: signed quants (−32..32), the sub-block scales
/// as integers, each super-block's scale.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_q6k(w: &[u8], cols: usize, out: &mut AmxWeights) {
    const BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    const SUB: usize = 16;
    let row_bytes = cols / QK_K * BYTES;
    let rows = w.len() / row_bytes.max(1);
    let supers = prepare(out, rows, cols, SUB);
    let blocks = cols / SUB;
    let offset = _mm256_set1_epi8(32);
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        let (g, lane) = (r / LANES, r % LANES);
        for (k, b) in row.chunks_exact(BYTES).enumerate() {
            let q = &mut out.q[r * cols + k * QK_K..r * cols + (k + 1) * QK_K];
            for h in 0..2 {
                let quarters = q6k_half(b, h);
                for (v, q) in quarters.iter().zip(q[128 * h..].chunks_exact_mut(32)) {
                    let v = _mm256_sub_epi8(*v, offset);
                    _mm256_storeu_si256(q.as_mut_ptr().cast(), v);
                }
            }
            for (sub, &scale) in b[192..208].iter().enumerate() {
                out.d[g * blocks + k * (QK_K / SUB) + sub][lane] = f32::from(scale as i8);
            }
            out.super_d[g * supers + k][lane] = f16_at(b, 208);
        }
    }
}

/// Q4_K rows decoded by [`decode_q4k`] times activation rows laid out by
/// [`pack_acts_k`] (sub-blocks of 32), as `amx::multiply` writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply_q4k(
    w: &AmxWeights,
    acts: &AmxActs,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    multiply_super::<32, false, true>(w, acts, outs, col0, n);
}

/// Q6_K rows decoded by [`decode_q6k`] times activation rows laid out by
/// [`pack_acts_k`] (sub-blocks of 16), as `amx::multiply` writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply_q6k(
    w: &AmxWeights,
    acts: &AmxActs,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    multiply_super::<16, true, false>(w, acts, outs, col0, n);
}

/// The K-quant products (see the module docs), sub-blocks of `SUB` values,
/// `SIGNED` weights or not, minimums if `MINS`: per super-block `acc =
/// fma(total, d_w·d_a, acc)`, then if `MINS` `acc = fma(−mins, dmin_w·d_a,
/// acc)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn multiply_super<const SUB: usize, const SIGNED: bool, const MINS: bool>(
    w: &AmxWeights,
    acts: &AmxActs,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    let blocks = acts.blocks;
    let per_super = QK_K / SUB;
    let supers = blocks / per_super;
    debug_assert_eq!(w.cols, blocks * SUB);
    let _tiles = Tiles::configure(SUB as u16);
    let mut sums = [Sums([0; LANES * LANES]), Sums([0; LANES * LANES])];
    for (t, act_tiles) in acts.tiles.chunks_exact(blocks).enumerate() {
        for g in 0..n.div_ceil(LANES) {
            let q = &w.q[g * LANES * w.cols..(g + 1) * LANES * w.cols];
            let mut acc = [_mm512_setzero_ps(); LANES];
            for k in 0..supers {
                let mut total = [_mm512_setzero_si512(); LANES];
                let mut mins = [_mm512_setzero_si512(); LANES];
                // Two sub-blocks in flight, on the two tile sets.
                for b in (k * per_super..(k + 1) * per_super).step_by(2) {
                    let a = q[b * SUB..].as_ptr();
                    block_sums::<SIGNED, 0>(a, w.cols, &act_tiles[b], &mut sums[0]);
                    let a = q[(b + 1) * SUB..].as_ptr();
                    block_sums::<SIGNED, 1>(a, w.cols, &act_tiles[b + 1], &mut sums[1]);
                    for (h, sums) in sums.iter().enumerate() {
                        let (tile, i) = (&act_tiles[b + h], g * blocks + b + h);
                        let bsum = _mm512_cvtps_epi32(_mm512_loadu_ps(tile.s.as_ptr()));
                        for j in 0..LANES {
                            let sum = _mm512_loadu_si512(sums.0[LANES * j..].as_ptr().cast());
                            let scale = _mm512_set1_epi32(w.d[i][j] as i32);
                            total[j] = _mm512_add_epi32(total[j], _mm512_mullo_epi32(sum, scale));
                            if MINS {
                                let min = _mm512_set1_epi32(w.m[i][j] as i32);
                                mins[j] = _mm512_add_epi32(mins[j], _mm512_mullo_epi32(bsum, min));
                            }
                        }
                    }
                }
                let d = _mm512_loadu_ps(act_tiles[k * per_super].d.as_ptr());
                let (wd, wm) = (&w.super_d[g * supers + k], &w.super_m[g * supers + k]);
                for j in 0..LANES {
                    acc[j] = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(total[j]),
                        _mm512_mul_ps(d, _mm512_set1_ps(wd[j])),
                        acc[j],
                    );
                    if MINS {
                        let neg = _mm512_sub_epi32(_mm512_setzero_si512(), mins[j]);
                        acc[j] = _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(neg),
                            _mm512_mul_ps(d, _mm512_set1_ps(wm[j])),
                            acc[j],
                        );
                    }
                }
            }
            store_outputs(&acc, outs, col0, n, t, g);
        }
    }
}
