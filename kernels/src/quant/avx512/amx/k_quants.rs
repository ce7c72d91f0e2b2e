//! AMX products for the fast kernels of Q4_K and Q6_K, a super-block (256
//! values) at a time.
//!
//! The contract (the AVX2 kernels', `scale_q45k` and `scale_k16`) scales
//! exact integer totals per super-block: `I = Σ sc·Σ q·a` over the
//! sub-blocks, `sc` their integer scales, and for Q4_K `M = Σ m·Σ a`, `m`
//! their integer minimums. Here the weights are decoded already multiplied
//! by their sub-block scale, `w = sc·q` (Q4_K, 0..=945) or `sc·(q − 32)`
//! (Q6_K, −4064..=4096), and split into two bytes, `w = 2^s·hi + lo` with
//! `lo` in `0..2^s`: then `I = 2^s·Σ hi·a + Σ lo·a`, two tile products
//! accumulated over the whole super-block (4 × 64 values), stored once
//! (`|I| ≤ 256 · 4096 · 127 < 2^31`). `M` comes from the activations' sums
//! per 16 values times the minimums as 16-bit pairs (`vpdpwssd`'s
//! arithmetic). The same integers, then the same floating-point steps, give
//! the AVX2 kernels' bits.

use std::arch::asm;
use std::arch::x86_64::*;

use super::super::super::act::BlockQ8K;
use super::super::super::aligned::grow;
use super::super::super::avx2::q6k_half;
use super::super::super::format::{f16_at, k4_scales_mins, QK_K};
use super::{pipelined, transpose_rows, Int8Weights, Pipeline, Sums, Tiles, LANES, TILE_ROW};

/// Bytes of B tiles a group of 16 rows has per super-block: `hi` and `lo`
/// tiles (1 KiB each) for each 64 values.
const SUPER_TILES: usize = 2 * QK_K * LANES;

/// Q4_K: `hi` holds `w >> 4` (0..=59), `lo` `w & 15`.
const Q4K_SHIFT: u32 = 4;
/// Q6_K: `hi` holds `w >> 6` (−64..=64, signed), `lo` `w & 63`.
const Q6K_SHIFT: u32 = 6;

/// Sizes `out` for `rows` weight rows of `cols` values; returns the
/// super-blocks a row.
fn prepare(out: &mut Int8Weights, rows: usize, cols: usize) -> usize {
    let groups = rows.div_ceil(LANES);
    let supers = cols / QK_K;
    out.cols = cols;
    out.q.bytes(groups * supers * SUPER_TILES);
    grow(&mut out.rows, 2 * LANES * cols, 0);
    grow(&mut out.d, groups * supers, [0.0; LANES]);
    grow(&mut out.m, groups * supers, [0.0; LANES]);
    supers
}

/// Lays out the `hi` and `lo` bytes of a group's 16 rows (in `out.rows`,
/// `hi` rows first) as its B tiles: super-block k's 64 values kk as the
/// `hi` tile at `((g · supers + k) · 4 + kk) · 2 KiB`, then the `lo` tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn place_group(out: &mut Int8Weights, g: usize, supers: usize) {
    let cols = out.cols;
    let (hi, lo) = out.rows.split_at(LANES * cols);
    let q = &mut out.q.bytes((g + 1) * supers * SUPER_TILES)[g * supers * SUPER_TILES..];
    transpose_rows(hi, cols, q, |c| c * 2 * TILE_ROW * LANES);
    transpose_rows(lo, cols, q, |c| (2 * c + 1) * TILE_ROW * LANES);
}

/// Splits 32 weights `w` (16-bit, `w = 2^SHIFT·hi + lo`) into their bytes
/// at `hi[..32]` and `lo[..32]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn split<const SHIFT: u32>(w: __m512i, hi: &mut [u8], lo: &mut [u8]) {
    let low = _mm512_set1_epi16((1 << SHIFT) - 1);
    let h = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<SHIFT>(w));
    let l = _mm512_cvtepi16_epi8(_mm512_and_si512(w, low));
    _mm256_storeu_si256(hi[..32].as_mut_ptr().cast(), h);
    _mm256_storeu_si256(lo[..32].as_mut_ptr().cast(), l);
}

/// Decodes whole Q4_K rows: `sc·q` split in two bytes, each super-block's
/// scales, the sub-block minimums as pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_q4k(w: &[u8], cols: usize, out: &mut Int8Weights) {
    const BYTES: usize = 4 + 12 + QK_K / 2;
    let row_bytes = cols / QK_K * BYTES;
    let rows = w.len() / row_bytes.max(1);
    let supers = prepare(out, rows, cols);
    grow(
        &mut out.min_pairs,
        rows.div_ceil(LANES) * supers * 8,
        [0; LANES],
    );
    let low = _mm256_set1_epi8(0xF);
    for (g, group) in w.chunks(LANES * row_bytes).enumerate() {
        for (j, row) in group.chunks_exact(row_bytes).enumerate() {
            let (hi, lo) = out.rows.split_at_mut(LANES * cols);
            let (hi, lo) = (&mut hi[j * cols..], &mut lo[j * cols..]);
            for (k, b) in row.chunks_exact(BYTES).enumerate() {
                let (scales, mins) = k4_scales_mins(&b[4..16]);
                // 32 bytes of quants hold two sub-blocks: low nibbles, then
                // high.
                for (c, qs) in b[16..].chunks_exact(32).enumerate() {
                    let v = _mm256_loadu_si256(qs.as_ptr().cast());
                    let halves = [
                        _mm256_and_si256(v, low),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
                    ];
                    for (h, q) in halves.into_iter().enumerate() {
                        let sub = 2 * c + h;
                        let sc = _mm512_set1_epi16(i16::from(scales[sub]));
                        let w = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(q), sc);
                        let at = k * QK_K + sub * 32;
                        split::<Q4K_SHIFT>(w, &mut hi[at..], &mut lo[at..]);
                    }
                }
                for (sub, &m) in mins.iter().enumerate() {
                    out.min_pairs[(g * supers + k) * 8 + sub][j] = u32::from(m) * 0x1_0001;
                }
                out.d[g * supers + k][j] = f16_at(b, 0);
                out.m[g * supers + k][j] = f16_at(b, 2);
            }
        }
        place_group(out, g, supers);
    }
}

/// Decodes whole Q6_K rows: `sc·(q − 32)` split in two bytes, each
/// super-block's scale.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_q6k(w: &[u8], cols: usize, out: &mut Int8Weights) {
    const BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    let row_bytes = cols / QK_K * BYTES;
    let rows = w.len() / row_bytes.max(1);
    let supers = prepare(out, rows, cols);
    let offset = _mm256_set1_epi8(32);
    for (g, group) in w.chunks(LANES * row_bytes).enumerate() {
        for (j, row) in group.chunks_exact(row_bytes).enumerate() {
            let (hi, lo) = out.rows.split_at_mut(LANES * cols);
            let (hi, lo) = (&mut hi[j * cols..], &mut lo[j * cols..]);
            for (k, b) in row.chunks_exact(BYTES).enumerate() {
                let scales = &b[192..208];
                for h in 0..2 {
                    for (quarter, v) in q6k_half(b, h).into_iter().enumerate() {
                        // 32 values: two sub-blocks of 16.
                        let at = 128 * h + 32 * quarter;
                        let (s0, s1) = (scales[at / 16] as i8, scales[at / 16 + 1] as i8);
                        let sc = _mm512_inserti64x4::<1>(
                            _mm512_set1_epi16(i16::from(s0)),
                            _mm256_set1_epi16(i16::from(s1)),
                        );
                        let q = _mm512_cvtepi8_epi16(_mm256_sub_epi8(v, offset));
                        let w = _mm512_mullo_epi16(q, sc);
                        let at = k * QK_K + at;
                        split::<Q6K_SHIFT>(w, &mut hi[at..], &mut lo[at..]);
                    }
                }
                out.d[g * supers + k][j] = f16_at(b, 208);
            }
        }
        place_group(out, g, supers);
    }
}

/// Q4_K rows decoded by [`decode_q4k`] times Q8_K activation rows, as
/// `amx::multiply` writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply_q4k(
    w: &Int8Weights,
    acts: &[BlockQ8K],
    act_len: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    multiply_super::<false, true>(w, acts, act_len, outs, col0, n);
}

/// Q6_K rows decoded by [`decode_q6k`] times Q8_K activation rows, as
/// `amx::multiply` writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply_q6k(
    w: &Int8Weights,
    acts: &[BlockQ8K],
    act_len: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    multiply_super::<true, false>(w, acts, act_len, outs, col0, n);
}

/// Starts a super-block's `hi` and `lo` sums (in tmm3 and tmm4) of 16
/// activation rows (A tiles from `a`, rows `stride` bytes apart) times 16
/// weight rows (the B tiles at `b`); [`store_super_sums`] stores them.
/// `SIGNED_HI`: the `hi` bytes are signed.
#[inline(always)]
unsafe fn super_sums<const SIGNED_HI: bool>(a: *const i8, stride: usize, b: *const u8) {
    // SAFETY (caller): tiles configured (`Tiles`); `a` has 16 rows of 256
    // bytes at `stride`, `b` the super-block's 8 B tiles.
    asm!("tilezero tmm3", "tilezero tmm4", options(nostack));
    // Two sets of A and B tiles (tmm0–2, tmm5–7), so that the next loads
    // need not wait for the products reading the last ones.
    for kk in 0..QK_K / TILE_ROW {
        macro_rules! product {
            ($hi:literal, $a:literal, $b_hi:literal, $b_lo:literal) => {
                asm!(
                    concat!("tileloadd ", $a, ", [{a} + {stride} * 1]"),
                    concat!("tileloadd ", $b_hi, ", [{b} + {row} * 1]"),
                    concat!("tileloadd ", $b_lo, ", [{b} + {row} * 1 + 1024]"),
                    concat!($hi, " tmm3, ", $a, ", ", $b_hi),
                    concat!("tdpbsud tmm4, ", $a, ", ", $b_lo),
                    a = in(reg) a.add(kk * TILE_ROW),
                    stride = in(reg) stride,
                    b = in(reg) b.add(kk * 2 * TILE_ROW * LANES),
                    row = in(reg) TILE_ROW,
                    options(nostack),
                )
            };
        }
        match (SIGNED_HI, kk % 2) {
            (true, 0) => product!("tdpbssd", "tmm0", "tmm1", "tmm2"),
            (true, _) => product!("tdpbssd", "tmm5", "tmm6", "tmm7"),
            (false, 0) => product!("tdpbsud", "tmm0", "tmm1", "tmm2"),
            (false, _) => product!("tdpbsud", "tmm5", "tmm6", "tmm7"),
        }
    }
}

/// Stores the `hi` and `lo` sums [`super_sums`] started into `c`.
#[inline(always)]
unsafe fn store_super_sums(c: &mut [Sums; 2]) {
    asm!(
        "tilestored [{hi} + {row} * 1], tmm3",
        "tilestored [{lo} + {row} * 1], tmm4",
        hi = in(reg) c[0].0.as_mut_ptr(),
        lo = in(reg) c[1].0.as_mut_ptr(),
        row = in(reg) TILE_ROW,
        options(nostack),
    );
}

/// The K-quant products (see the module docs): `SIGNED_HI` for Q6_K's
/// signed `hi` bytes, `MINS` for Q4_K's minimums. Per super-block `acc =
/// fma(I, d_w·d_a, acc)`, then if `MINS` `acc = fma(−M, dmin_w·d_a, acc)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn multiply_super<const SIGNED_HI: bool, const MINS: bool>(
    w: &Int8Weights,
    acts: &[BlockQ8K],
    act_len: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    let supers = w.cols / QK_K;
    let shift = _mm512_set1_epi32(if MINS { Q4K_SHIFT } else { Q6K_SHIFT } as i32);
    let tile = (16, TILE_ROW as u16);
    let _tiles = Tiles::configure(&[tile; 8]);
    let stride = act_len * size_of::<BlockQ8K>();
    // A group's B tiles, and its first super-block's index into the scales.
    let group = |g: usize| {
        let q = &w.q.all_bytes()[g * supers * SUPER_TILES..][..supers * SUPER_TILES];
        (q, g * supers)
    };
    let start = |acts: &[BlockQ8K], (q, _): (&[u8], usize), k: usize| {
        let b = q[k * SUPER_TILES..].as_ptr();
        super_sums::<SIGNED_HI>(acts[k].qs.as_ptr(), stride, b)
    };
    let scale = |acc: &mut [__m512; LANES],
                 sums: &[Sums; 2],
                 acts: &[BlockQ8K],
                 group: (&[u8], usize),
                 k: usize| {
        let at = group.1 + k;
        let [hi, lo] = sums;
        let wd = _mm512_loadu_ps(w.d[at].as_ptr());
        let wm = _mm512_loadu_ps(w.m[at].as_ptr());
        let pairs = if MINS {
            &w.min_pairs[at * 8..][..8]
        } else {
            &[]
        };
        for (i, acc) in acc.iter_mut().enumerate() {
            let a = &acts[i * act_len + k];
            let total = _mm512_add_epi32(_mm512_sllv_epi32(hi.row(i), shift), lo.row(i));
            let d = _mm512_set1_ps(a.d);
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_mul_ps(wd, d), *acc);
            if MINS {
                let mut mins = _mm512_setzero_si512();
                for (sub, pair) in pairs.iter().enumerate() {
                    // The sums of values 32·sub.. and 32·sub + 16..
                    let bsums = a.bsums.as_ptr().add(2 * sub).cast::<i32>();
                    let bsums = _mm512_set1_epi32(bsums.read_unaligned());
                    let pair = _mm512_loadu_si512(pair.as_ptr().cast());
                    mins = _mm512_dpwssd_epi32(mins, bsums, pair);
                }
                let neg = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_setzero_si512(), mins));
                *acc = _mm512_fmadd_ps(neg, _mm512_mul_ps(wm, d), *acc);
            }
        }
    };
    let sums = &mut [[Sums::ZERO, Sums::ZERO], [Sums::ZERO, Sums::ZERO]];
    let pipeline = Pipeline {
        acts,
        act_len,
        outs,
        col0,
        n,
        steps: supers,
    };
    pipelined(
        pipeline,
        sums,
        group,
        start,
        |_, c| store_super_sums(c),
        scale,
    );
}
