//! AVX2 versions of `task`'s row kernels, and the widening of the
//! half-precision caches for its AVX2 build.
//!
//! The row kernels run the portable kernels' FMA chains in the same order,
//! so they compute bit for bit what those do; they hold their accumulators
//! in AVX2's 16 registers, where the portable code's (up to 24 vectors)
//! spill. The widening gives the values `half`'s slice conversions give
//! (widening f16 and bf16 to f32 is exact), by instructions that inline
//! into the caller, where the slice conversions are a call (and a
//! CPU-feature check) per head.

use std::arch::x86_64::*;
use std::ops::Range;

use half::{bf16, f16};

use super::task::{key_blocks, KeySource, KEYS, QUERIES_NARROW};

/// [`super::task::score`] on AVX2, with enough blocks a pass for 8 FMA
/// chains (one pass a block at four query vectors or more).
///
/// # Safety
/// As for [`score_blocks`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn score<const Q: usize>(
    q: &[&[f32]],
    kt: &[f32],
    d: usize,
    ranges: &[Range<usize>],
    scale: f32,
    scores: &mut [f32],
) {
    match Q {
        1 => score_blocks::<Q, 4>(q, kt, d, ranges, scale, scores),
        2 => score_blocks::<Q, 2>(q, kt, d, ranges, scale, scores),
        _ => score_blocks::<Q, 1>(q, kt, d, ranges, scale, scores),
    }
}

/// [`super::task::score`] on AVX2: `B` blocks of 16 keys per pass over the
/// head dimension, `2·B·Q` accumulators in registers.
///
/// # Safety
/// The CPU must have AVX2 and FMA. `q` holds `Q` vectors of at least `d`
/// values; `kt` covers every block the ranges touch (`[block][d][KEYS]`);
/// `scores` is `[Q, n_keys]` with every range inside `0..n_keys`.
#[target_feature(enable = "avx2,fma")]
unsafe fn score_blocks<const Q: usize, const B: usize>(
    q: &[&[f32]],
    kt: &[f32],
    d: usize,
    ranges: &[Range<usize>],
    scale: f32,
    scores: &mut [f32],
) {
    let n_keys = scores.len() / Q;
    let q: [&[f32]; Q] = std::array::from_fn(|i| &q[i][..d]);
    let Range {
        start: from,
        end: to,
    } = key_blocks(ranges);
    assert!(to * KEYS * d <= kt.len(), "transposed keys");
    assert!(
        ranges.iter().all(|r| r.end <= n_keys),
        "score ranges inside the row"
    );
    let scale = _mm256_set1_ps(scale);
    let mut block = from;
    while block < to {
        // The last pass may cover fewer blocks: its missing ones re-read
        // the first (their sums are never stored).
        let blocks = B.min(to - block);
        let k: [*const f32; B] = std::array::from_fn(|b| {
            kt.as_ptr()
                .add((block + if b < blocks { b } else { 0 }) * KEYS * d)
        });
        let mut acc = [[[_mm256_setzero_ps(); 2]; B]; Q];
        for c in 0..d {
            let x: [__m256; Q] = std::array::from_fn(|i| _mm256_set1_ps(*q[i].get_unchecked(c)));
            for b in 0..B {
                let keys = [
                    _mm256_loadu_ps(k[b].add(c * KEYS)),
                    _mm256_loadu_ps(k[b].add(c * KEYS + 8)),
                ];
                for i in 0..Q {
                    for h in 0..2 {
                        acc[i][b][h] = _mm256_fmadd_ps(x[i], keys[h], acc[i][b][h]);
                    }
                }
            }
        }
        let span = block * KEYS..(block + blocks) * KEYS;
        for (i, (range, acc)) in ranges.iter().zip(&acc).enumerate() {
            let row = &mut scores[i * n_keys..(i + 1) * n_keys];
            // Vector `t` of the pass holds keys `span.start + 8t ..`.
            for (t, &acc) in acc.iter().flatten().enumerate().take(2 * blocks) {
                store_scores(row, span.start + 8 * t, range, _mm256_mul_ps(scale, acc));
            }
        }
        block += blocks;
    }
}

/// [`super::task::weigh`] on AVX2 over values of `E`, key `j`'s row at
/// `v[row(j)..row(j) + d]`, with as many output vectors a pass as fit the
/// 16 registers beside the `H` weights.
///
/// # Safety
/// As for [`weigh_passes`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weigh<E: Load8, const H: usize>(
    p: &[f32],
    v: &[E],
    row: impl Fn(usize) -> usize,
    d: usize,
    local: &Range<usize>,
    out: &mut [f32],
) {
    match H {
        1 => weigh_passes::<E, H, 8>(p, v, row, d, local, out),
        2 => weigh_passes::<E, H, 4>(p, v, row, d, local, out),
        3 => weigh_passes::<E, H, 3>(p, v, row, d, local, out),
        _ => weigh_passes::<E, H, 2>(p, v, row, d, local, out),
    }
}

/// [`super::task::weigh`] on AVX2: `8·W` output elements of `H` heads per
/// pass over the keys, `H·W` accumulators in registers; the last `d % 8`
/// elements by the portable code's chain.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C. `p` is `[H, n_keys]`, `out` `[H,
/// d]`, `local` lies inside `0..n_keys` (rows outside `v` panic).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weigh_passes<E: Load8, const H: usize, const W: usize>(
    p: &[f32],
    v: &[E],
    row: impl Fn(usize) -> usize,
    d: usize,
    local: &Range<usize>,
    out: &mut [f32],
) {
    let n_keys = p.len() / H;
    assert!(local.end <= n_keys && out.len() >= H * d, "weigh sizes");
    let vectors = d / 8;
    let mut first = 0;
    while first < vectors {
        let width = W.min(vectors - first);
        let mut acc = [[_mm256_setzero_ps(); W]; H];
        for j in local.clone() {
            let at = row(j);
            assert!(at + d <= v.len(), "a value row inside the cache");
            let x = v.as_ptr().add(at + 8 * first);
            let w: [__m256; H] =
                std::array::from_fn(|h| _mm256_set1_ps(*p.get_unchecked(h * n_keys + j)));
            // A narrower last pass re-reads its first vector.
            let x: [__m256; W] =
                std::array::from_fn(|t| E::load8(x.add(8 * if t < width { t } else { 0 })));
            for (acc, &w) in acc.iter_mut().zip(&w) {
                for (a, &x) in acc.iter_mut().zip(&x) {
                    *a = _mm256_fmadd_ps(w, x, *a);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            let dst = out.as_mut_ptr().add(h * d + 8 * first);
            for (t, &a) in acc.iter().enumerate().take(width) {
                _mm256_storeu_ps(dst.add(8 * t), a);
            }
        }
        first += width;
    }
    for c in 8 * vectors..d {
        for h in 0..H {
            let mut a = 0f32;
            for j in local.clone() {
                a = p[h * n_keys + j].mul_add(v[row(j) + c].to_f32(), a);
            }
            out[h * d + c] = a;
        }
    }
}

/// [`super::task::score`] over keys read in place: key `j`'s head is
/// `k[heads[j]..heads[j] + d]`. Eight keys at a time, loaded eight numbers
/// at a time and transposed in registers, so each score is the portable FMA
/// chain over the head dimension in order. (Two groups of eight a pass, for
/// twice the chains in flight, spill the transposes out of AVX2's 16
/// registers and run no faster.)
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C. `q` holds `Q` vectors of at least
/// `d` values, `d` is a multiple of 8, `heads` holds `n_keys` offsets
/// (heads outside `k` panic); `scores` is `[Q, n_keys]` with every range
/// inside `0..n_keys`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn score_in_place<E: Load8, const Q: usize>(
    q: &[&[f32]],
    k: &[E],
    heads: &[usize],
    d: usize,
    ranges: &[Range<usize>],
    scale: f32,
    scores: &mut [f32],
) {
    let n_keys = scores.len() / Q;
    let q: [&[f32]; Q] = std::array::from_fn(|i| &q[i][..d]);
    assert!(
        d.is_multiple_of(8) && heads.len() >= n_keys && ranges.iter().all(|r| r.end <= n_keys),
        "score sizes"
    );
    let from = ranges.iter().map(|r| r.start).min().unwrap_or(0);
    let to = ranges.iter().map(|r| r.end).max().unwrap_or(0);
    let scale = _mm256_set1_ps(scale);
    for first in (from..to).step_by(8) {
        // Keys past `to` repeat the first (their sums are never stored).
        let rows: [*const E; 8] = std::array::from_fn(|l| {
            let at = heads[if first + l < to { first + l } else { first }];
            assert!(at + d <= k.len(), "a key inside the cache");
            k.as_ptr().add(at)
        });
        let mut acc = [_mm256_setzero_ps(); Q];
        for c in (0..d).step_by(8) {
            score_tile(&rows, c, &q, &mut acc);
        }
        for (i, (range, &acc)) in ranges.iter().zip(&acc).enumerate() {
            let row = &mut scores[i * n_keys..(i + 1) * n_keys];
            store_scores(row, first, range, _mm256_mul_ps(scale, acc));
        }
    }
}

/// Writes the scores of keys `first .. first + 8` (`scores`' lanes) to
/// `row` where they lie inside `range`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store_scores(row: &mut [f32], first: usize, range: &Range<usize>, scores: __m256) {
    let keys = first..first + 8;
    let live = keys.start.max(range.start)..keys.end.min(range.end);
    if live == keys {
        row[keys.clone()].copy_from_slice(&std::mem::transmute::<__m256, [f32; 8]>(scores));
    } else if !live.is_empty() {
        let lanes: [f32; 8] = std::mem::transmute(scores);
        row[live.clone()].copy_from_slice(&lanes[live.start - first..live.end - first]);
    }
}

/// [`score_in_place`]'s step: columns `c .. c + 8` of eight keys (`rows`)
/// transposed, each column's FMA into the `Q` vectors' sums.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn score_tile<E: Load8, const Q: usize>(
    rows: &[*const E; 8],
    c: usize,
    q: &[&[f32]; Q],
    acc: &mut [__m256; Q],
) {
    let columns = transpose8([
        E::load8(rows[0].add(c)),
        E::load8(rows[1].add(c)),
        E::load8(rows[2].add(c)),
        E::load8(rows[3].add(c)),
        E::load8(rows[4].add(c)),
        E::load8(rows[5].add(c)),
        E::load8(rows[6].add(c)),
        E::load8(rows[7].add(c)),
    ]);
    for (t, &column) in columns.iter().enumerate() {
        for (a, q) in acc.iter_mut().zip(q) {
            *a = _mm256_fmadd_ps(_mm256_set1_ps(*q.get_unchecked(c + t)), column, *a);
        }
    }
}

/// A task's keys and values read in place from a cache of `E` (f32, f16 or
/// bf16): each key's head at `heads[j]` in both.
pub(super) struct InPlace<'a, E> {
    pub k: &'a [E],
    pub v: &'a [E],
    pub heads: &'a [usize],
    pub d: usize,
}

impl<E: Load8> KeySource for InPlace<'_, E> {
    const QUERIES: usize = QUERIES_NARROW;

    #[inline(always)]
    fn score<const Q: usize>(
        &self,
        q: &[&[f32]],
        ranges: &[Range<usize>],
        scale: f32,
        scores: &mut [f32],
    ) {
        let (k, heads, d) = (self.k, self.heads, self.d);
        // SAFETY: an `InPlace` is made only on CPUs with AVX2, FMA and F16C,
        // for heads of a multiple of 8; the sizes are `score`'s.
        unsafe { score_in_place::<E, Q>(q, k, heads, d, ranges, scale, scores) }
    }

    #[inline(always)]
    fn weigh<const H: usize>(&self, p: &[f32], local: &Range<usize>, out: &mut [f32]) {
        // SAFETY: as for `score`; rows are checked against the cache.
        unsafe { weigh::<E, H>(p, self.v, |j| self.heads[j], self.d, local, out) };
    }
}

/// Numbers the AVX2 kernels read eight at a time, widened to f32.
pub(super) trait Load8: Copy {
    /// The eight numbers at `p`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C; `p` points to eight readable numbers.
    unsafe fn load8(p: *const Self) -> __m256;
    /// One number.
    fn to_f32(self) -> f32;
}

impl Load8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Load8 for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Load8 for bf16 {
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// The transpose of eight rows of eight: column `c` of the rows.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // Rows 2i and 2i + 1 interleaved, low and high pairs of each 128-bit
    // lane.
    let (t0, t1) = (
        _mm256_unpacklo_ps(r[0], r[1]),
        _mm256_unpackhi_ps(r[0], r[1]),
    );
    let (t2, t3) = (
        _mm256_unpacklo_ps(r[2], r[3]),
        _mm256_unpackhi_ps(r[2], r[3]),
    );
    let (t4, t5) = (
        _mm256_unpacklo_ps(r[4], r[5]),
        _mm256_unpackhi_ps(r[4], r[5]),
    );
    let (t6, t7) = (
        _mm256_unpacklo_ps(r[6], r[7]),
        _mm256_unpackhi_ps(r[6], r[7]),
    );
    // u[4g + m], 128-bit lane L: column 4L + m of rows 4g .. 4g + 4.
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    // Column c: rows 0..4 from u[c % 4] and rows 4..8 from u[4 + c % 4],
    // in 128-bit lane c / 4 of each.
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

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
        for (c, column) in transpose8(r).iter().enumerate() {
            _mm256_storeu_ps(out.as_mut_ptr().add(c * 16 + 8 * half), *column);
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

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i + seed) * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// `score::<Q, B>` against the portable `score::<Q>`, bit for bit, over
    /// ranges that start and end inside blocks and passes.
    fn check_score<const Q: usize, const B: usize>(d: usize) {
        let n_keys: usize = 150;
        let kt = data(n_keys.div_ceil(KEYS) * KEYS * d, 1);
        let q: Vec<Vec<f32>> = (0..Q).map(|i| data(d, 100 + i)).collect();
        let q: Vec<&[f32]> = q.iter().map(Vec::as_slice).collect();
        let ranges: Vec<Range<usize>> = (0..Q).map(|i| 3 + 7 * i..n_keys - 11 * i).collect();
        let (mut want, mut got) = (vec![0f32; Q * n_keys], vec![0f32; Q * n_keys]);
        super::super::task::score::<Q>(&q, &kt, d, &ranges, 0.3, &mut want);
        // SAFETY: the CPU has AVX2 and FMA; the sizes are `score`'s.
        unsafe { score_blocks::<Q, B>(&q, &kt, d, &ranges, 0.3, &mut got) };
        assert_eq!(got, want, "score Q={Q} B={B} d={d}");
    }

    /// `weigh::<H, W>` against the portable `weigh::<H>`, bit for bit, with
    /// heads whose size is no multiple of the pass (nor of 8).
    fn check_weigh<const H: usize, const W: usize>(d: usize) {
        let n_keys: usize = 70;
        let p = data(H * n_keys, 2);
        let v = data(n_keys * d, 3);
        let local = 5..n_keys - 3;
        let (mut want, mut got) = (vec![0f32; H * d], vec![0f32; H * d]);
        super::super::task::weigh::<H>(&p, &v, d, &local, &mut want);
        // SAFETY: the CPU has AVX2 and FMA; the sizes are `weigh`'s.
        unsafe { weigh_passes::<f32, H, W>(&p, &v, |j| j * d, d, &local, &mut got) };
        assert_eq!(got, want, "weigh H={H} W={W} d={d}");
    }

    /// The in-place kernels over an f16 cache whose keys lie out of order
    /// against the portable kernels over the widened (and, for the keys,
    /// transposed) copies, bit for bit.
    fn check_in_place<const Q: usize>(d: usize) {
        let n_keys: usize = 45;
        // Key `j`'s head at slot `(7 j + 3) mod 64` of a 64-row cache.
        let heads: Vec<usize> = (0..n_keys).map(|j| (7 * j + 3) % 64 * d).collect();
        let cache: Vec<f16> = data(64 * d, 4).iter().map(|&x| f16::from_f32(x)).collect();
        let widened: Vec<Vec<f32>> = heads
            .iter()
            .map(|&at| cache[at..at + d].iter().map(|x| x.to_f32()).collect())
            .collect();
        let mut kt = vec![0f32; n_keys.div_ceil(KEYS) * KEYS * d];
        for (j, key) in widened.iter().enumerate() {
            for (c, &x) in key.iter().enumerate() {
                kt[(j / KEYS * d + c) * KEYS + j % KEYS] = x;
            }
        }
        let q: Vec<Vec<f32>> = (0..Q).map(|i| data(d, 200 + i)).collect();
        let q: Vec<&[f32]> = q.iter().map(Vec::as_slice).collect();
        let ranges: Vec<Range<usize>> = (0..Q).map(|i| 2 * i..n_keys - 5 * i).collect();
        let (mut want, mut got) = (vec![0f32; Q * n_keys], vec![0f32; Q * n_keys]);
        super::super::task::score::<Q>(&q, &kt, d, &ranges, 0.7, &mut want);
        // SAFETY: the CPU has AVX2, FMA and F16C; `d` is a multiple of 8.
        unsafe { score_in_place::<f16, Q>(&q, &cache, &heads, d, &ranges, 0.7, &mut got) };
        assert_eq!(got, want, "score in place Q={Q} d={d}");

        let v: Vec<f32> = widened.concat();
        let p = data(Q * n_keys, 5);
        let local = 4..n_keys - 1;
        let (mut want, mut got) = (vec![0f32; Q * d], vec![0f32; Q * d]);
        super::super::task::weigh::<Q>(&p, &v, d, &local, &mut want);
        // SAFETY: as above; every head lies inside the cache.
        unsafe { weigh::<f16, Q>(&p, &cache, |j| heads[j], d, &local, &mut got) };
        assert_eq!(got, want, "weigh in place H={Q} d={d}");
    }

    #[test]
    fn in_place_kernels_compute_the_portable_bits() {
        if !has_avx2() || !is_x86_feature_detected!("fma") {
            return;
        }
        for d in [8, 64, 256] {
            check_in_place::<1>(d);
            check_in_place::<2>(d);
            check_in_place::<3>(d);
            check_in_place::<4>(d);
        }
    }

    #[test]
    fn row_kernels_compute_the_portable_bits() {
        if !has_avx2() || !is_x86_feature_detected!("fma") {
            return;
        }
        for d in [8, 20, 64, 256] {
            check_score::<1, 4>(d);
            check_score::<2, 2>(d);
            check_score::<3, 1>(d);
            check_score::<4, 1>(d);
            check_score::<3, 2>(d);
            check_weigh::<1, 8>(d);
            check_weigh::<2, 4>(d);
            check_weigh::<3, 3>(d);
            check_weigh::<4, 2>(d);
        }
    }
}
