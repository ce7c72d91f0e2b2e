//! bf16 weights times activations rounded to bf16, by `vdpbf16ps`
//! (AVX512_BF16: AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids
//! and later): the fast products of bf16 checkpoints, llama.cpp's
//! arithmetic, twice the products an instruction of the f32 kernels.
//!
//! Each output is one sixteen-lane accumulator over its pairs of values in
//! order (the last 32 masked), summed by `_mm512_reduce_add_ps`: the same
//! operations whatever rows are computed with it, so a row's bits do not
//! depend on its batch (they do depend on the CPU having this extension).

use std::arch::x86_64::*;

/// Values a step of the kernels takes from a row: one 512-bit load of bf16.
const STEP: usize = 32;

/// Whether the CPU multiplies bf16 pairs (AVX512_BF16 with AVX512F/BW).
pub(super) fn available() -> bool {
    use std::arch::is_x86_feature_detected as has;
    has!("avx512f") && has!("avx512bw") && has!("avx512bf16")
}

/// The mask of the first `n` (at most 32) lanes of 16 bits.
#[inline(always)]
fn first_lanes(n: usize) -> __mmask32 {
    if n >= STEP {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

/// `x` rounded to bf16, to nearest even (`vcvtne2ps2bf16`).
///
/// # Safety
/// The CPU must have [`available`]'s extensions.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn round_to_bf16(x: &[f32]) -> Vec<u16> {
    let mut out = vec![0u16; x.len()];
    for (x, out) in x.chunks(STEP).zip(out.chunks_mut(STEP)) {
        let n = x.len();
        let low = _mm512_maskz_loadu_ps(first_lanes(n) as __mmask16, x.as_ptr());
        let high = _mm512_maskz_loadu_ps(
            (first_lanes(n) >> 16) as __mmask16,
            x.as_ptr().add(16.min(n)),
        );
        let pairs: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(high, low));
        _mm512_mask_storeu_epi16(out.as_mut_ptr().cast(), first_lanes(n), pairs);
    }
    out
}

/// Sixteen bf16 pairs at `p + at`, the first `mask`'s lanes loaded.
#[inline(always)]
unsafe fn load_pairs(p: *const u16, at: usize, mask: __mmask32) -> __m512bh {
    std::mem::transmute(_mm512_maskz_loadu_epi16(mask, p.add(at).cast()))
}

/// `R` rows of `xs` times `C` weight rows `ws`, each `k` bf16 long: one
/// accumulator an output. (Plain loops: closures would not inherit the
/// caller's target features, and their intrinsics would become calls.)
#[inline(always)]
unsafe fn block<const R: usize, const C: usize>(
    xs: [*const u16; R],
    ws: [*const u16; C],
    k: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let mut w = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); C];
    let mut at = 0;
    while at < k {
        let mask = first_lanes(k - at);
        for c in 0..C {
            w[c] = load_pairs(ws[c], at, mask);
        }
        for i in 0..R {
            let x = load_pairs(xs[i], at, mask);
            for c in 0..C {
                acc[i][c] = _mm512_dpbf16_ps(acc[i][c], x, w[c]);
            }
        }
        at += STEP;
    }
    let mut sums = [[0f32; C]; R];
    for i in 0..R {
        for c in 0..C {
            sums[i][c] = _mm512_reduce_add_ps(acc[i][c]);
        }
    }
    sums
}

/// `outs[i][col + r] = x_i · tile_r` for the bf16 rows `xb` (`outs.len()`
/// rows of `k`) and a tile of bf16 weight rows, in blocks of four by four.
///
/// # Safety
/// The CPU must have [`available`]'s extensions.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn multiply_tile(
    xb: &[u16],
    tile: &[u8],
    outs: &mut [&mut [f32]],
    col: usize,
    k: usize,
) {
    let (m, rows) = (outs.len(), tile.len() / (2 * k));
    // The blocks read through pointers: the sizes must hold.
    assert!(xb.len() == m * k && tile.len() == 2 * rows * k);
    let x_row = |i: usize| xb.as_ptr().add(i * k);
    let w_row = |r: usize| tile.as_ptr().add(2 * r * k).cast::<u16>();
    let mut i = 0;
    while i < m {
        let block_rows = if m - i >= 4 { 4 } else { 1 };
        let mut r = 0;
        while r < rows {
            let block_cols = if rows - r >= 4 { 4 } else { 1 };
            let mut put = |a: usize, c: usize, v: f32| outs[i + a][col + r + c] = v;
            match (block_rows, block_cols) {
                (4, 4) => {
                    let sums = block::<4, 4>(
                        std::array::from_fn(|a| x_row(i + a)),
                        std::array::from_fn(|c| w_row(r + c)),
                        k,
                    );
                    for (a, row) in sums.iter().enumerate() {
                        for (c, &v) in row.iter().enumerate() {
                            put(a, c, v);
                        }
                    }
                }
                (4, _) => {
                    let sums = block::<4, 1>(std::array::from_fn(|a| x_row(i + a)), [w_row(r)], k);
                    for (a, row) in sums.iter().enumerate() {
                        put(a, 0, row[0]);
                    }
                }
                (_, 4) => {
                    let sums = block::<1, 4>([x_row(i)], std::array::from_fn(|c| w_row(r + c)), k);
                    for (c, &v) in sums[0].iter().enumerate() {
                        put(0, c, v);
                    }
                }
                _ => put(0, 0, block::<1, 1>([x_row(i)], [w_row(r)], k)[0][0]),
            }
            r += block_cols;
        }
        i += block_rows;
    }
}
