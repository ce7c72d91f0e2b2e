//! `y = x·wᵀ` with f16 or bf16 weights `w [n, k]`, read in place.
//!
//! Every output is one fixed computation, whatever rows of `x` are batched
//! with it and whatever the instruction set: eight lanes of fused
//! multiply-adds along `k` in order (lane `l` takes elements `l`, `l + 8`,
//! …), the eight lanes summed in order, then the `k mod 8` tail added one
//! element at a time, fused. So a prompt's rows in prefill and the same
//! rows in decode give the same bits, on every CPU.
//!
//! [`linear_half_fast`], `--precision fast`'s product, rounds the
//! activations to bf16 for bf16 weights on CPUs with AVX512_BF16 (as
//! llama.cpp does) and multiplies pairs (`half_weights_bf16`); its bits
//! still do not depend on the batch.

use crate::row_tasks::for_each_row_task;
use half::{bf16, f16};

/// A 16-bit float weight format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfFormat {
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
}

impl HalfFormat {
    #[inline]
    fn to_f32(self, bits: u16) -> f32 {
        match self {
            HalfFormat::F16 => f16::from_bits(bits).to_f32(),
            HalfFormat::BF16 => bf16::from_bits(bits).to_f32(),
        }
    }

    /// Converts little-endian 16-bit values (`2 × out.len()` bytes) to f32.
    pub fn convert(self, bytes: &[u8], out: &mut [f32]) {
        assert_eq!(bytes.len(), 2 * out.len(), "conversion sizes");
        let bits = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]));
        match self {
            HalfFormat::BF16 => {
                for (o, b) in out.iter_mut().zip(bits) {
                    *o = f32::from_bits(u32::from(b) << 16);
                }
            }
            HalfFormat::F16 => {
                for (o, b) in out.iter_mut().zip(bits) {
                    *o = self.to_f32(b);
                }
            }
        }
    }
}

/// Bytes of weights a tile holds: a tile stays in the core's L2 while every
/// row of `x` passes over it.
const TILE_BYTES: usize = 192 << 10;

/// The most weight rows in a tile (enough to amortize a pass over `x`).
const MAX_TILE_ROWS: usize = 64;

/// `y [m, n] = x [m, k] · wᵀ` with 16-bit `w [n, k]` (its little-endian
/// bytes). The weight rows are split in tasks over the thread pool, each
/// writing its own columns of `y`; each output is computed as the module
/// docs say.
pub fn linear_half(
    x: &[f32],
    w: &[u8],
    format: HalfFormat,
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    by_tasks_and_tiles(x, w, y, (m, k, n), |tile, outs, col| {
        multiply_tile(x, tile, format, outs, col, k)
    });
}

/// [`linear_half`] as `--precision fast` computes it: on CPUs with
/// AVX512_BF16, bf16 weights times the activations rounded to bf16, by
/// pairs (llama.cpp's arithmetic); otherwise, and for f16 weights,
/// [`linear_half`] itself.
pub fn linear_half_fast(
    x: &[f32],
    w: &[u8],
    format: HalfFormat,
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if format == HalfFormat::BF16 && super::half_weights_bf16::available() {
        use super::half_weights_bf16 as bf16_dots;
        // SAFETY (both): the CPU has the extensions.
        let xb = unsafe { bf16_dots::round_to_bf16(x) };
        return by_tasks_and_tiles(x, w, y, (m, k, n), |tile, outs, col| unsafe {
            bf16_dots::multiply_tile(&xb, tile, outs, col, k)
        });
    }
    linear_half(x, w, format, y, m, k, n)
}

/// `y [m, n]` from `x [m, k]` and 16-bit `w [n, k]`, the sizes checked:
/// the weight rows split in tasks over the thread pool, each task's rows in
/// tiles (`by_tiles`) that `tile_product` multiplies; zeros where `k` is 0.
fn by_tasks_and_tiles(
    x: &[f32],
    w: &[u8],
    y: &mut [f32],
    (m, k, n): (usize, usize, usize),
    tile_product: impl Fn(&[u8], &mut [&mut [f32]], usize) + Sync,
) {
    assert!(
        x.len() == m * k && w.len() == 2 * n * k && y.len() == m * n,
        "linear_half sizes"
    );
    if k == 0 {
        y.fill(0.0);
        return;
    }
    // Rows a multiple of 4: the register blocks' widths divide it.
    for_each_row_task(y, n, 2 * k, 4, |first, outs| {
        by_tiles(&w[2 * first * k..], outs, k, &tile_product)
    });
}

/// One task: `tile_product(tile, outs, col)` for the first `outs[i].len()`
/// weight rows of `w`, in tiles of equal size (starting at column `col`)
/// that each stay in L2 while every row of `x` passes.
fn by_tiles(
    w: &[u8],
    outs: &mut [&mut [f32]],
    k: usize,
    mut tile_product: impl FnMut(&[u8], &mut [&mut [f32]], usize),
) {
    let rows = outs[0].len();
    let most = (TILE_BYTES / (2 * k)).clamp(4, MAX_TILE_ROWS);
    let tile = rows.div_ceil(rows.div_ceil(most));
    for start in (0..rows).step_by(tile) {
        let count = tile.min(rows - start);
        tile_product(&w[2 * start * k..2 * (start + count) * k], outs, start);
    }
}

/// `outs[i][col + r] = x_i · tile_r` for a tile of 16-bit weight rows.
fn multiply_tile(
    x: &[f32],
    tile: &[u8],
    format: HalfFormat,
    outs: &mut [&mut [f32]],
    col: usize,
    k: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            // SAFETY: the CPU has AVX2, FMA and F16C.
            return unsafe {
                super::half_weights_avx2::multiply_tile(x, tile, format, outs, col, k)
            };
        }
    }
    multiply_tile_portable(x, tile, format, outs, col, k);
}

/// [`multiply_tile`] in plain Rust: the tile widened to f32, then four rows
/// of `x` at a time with each weight row (each load of the tile feeds four
/// products).
pub(super) fn multiply_tile_portable(
    x: &[f32],
    tile: &[u8],
    format: HalfFormat,
    outs: &mut [&mut [f32]],
    col: usize,
    k: usize,
) {
    let mut widened = vec![0f32; tile.len() / 2];
    format.convert(tile, &mut widened);
    let (m, rows) = (x.len() / k, widened.len() / k);
    let x_row = |i: usize| &x[i * k..(i + 1) * k];
    let w_row = |r: usize| &widened[r * k..(r + 1) * k];
    let mut i = 0;
    while i + 4 <= m {
        let xs: [&[f32]; 4] = std::array::from_fn(|j| x_row(i + j));
        for r in 0..rows {
            for (j, sum) in dots(xs, w_row(r)).into_iter().enumerate() {
                outs[i + j][col + r] = sum;
            }
        }
        i += 4;
    }
    for (i, out) in outs.iter_mut().enumerate().skip(i) {
        for r in 0..rows {
            out[col + r] = dots([x_row(i)], w_row(r))[0];
        }
    }
}

/// The dot products of each of `R` rows `a` with `b`, as the module docs
/// say, sharing the loads of `b`.
#[inline(always)]
fn dots<const R: usize>(a: [&[f32]; R], b: &[f32]) -> [f32; R] {
    let mut acc = [[0f32; 8]; R];
    let (b_chunks, b_tail) = b.as_chunks::<8>();
    for (c, bc) in b_chunks.iter().enumerate() {
        for i in 0..R {
            let ac = &a[i][8 * c..8 * c + 8];
            for l in 0..8 {
                acc[i][l] = ac[l].mul_add(bc[l], acc[i][l]);
            }
        }
    }
    let tail = b_chunks.len() * 8;
    std::array::from_fn(|i| {
        let mut sum = lane_sum(acc[i]);
        for (a, b) in a[i][tail..].iter().zip(b_tail) {
            sum = a.mul_add(*b, sum);
        }
        sum
    })
}

/// The eight lanes' sum, in lane order.
#[inline(always)]
pub(super) fn lane_sum(lanes: [f32; 8]) -> f32 {
    lanes.iter().fold(0.0, |sum, lane| sum + lane)
}

#[cfg(test)]
mod tests {
    use super::super::linear;
    use super::super::tests::data;
    use super::*;

    fn encode(w: &[f32], format: HalfFormat) -> Vec<u8> {
        w.iter()
            .flat_map(|&v| match format {
                HalfFormat::F16 => f16::from_f32(v).to_le_bytes(),
                HalfFormat::BF16 => bf16::from_f32(v).to_le_bytes(),
            })
            .collect()
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// The last two are big enough to be split in tasks over the pool.
    const SHAPES: [(usize, usize, usize); 9] = [
        (1, 1, 1),
        (3, 5, 7),
        (17, 64, 33),
        (64, 130, 65),
        (2, 8, 5),
        (9, 1000, 70),
        (6, 23, 200),
        (7, 1100, 300),
        (1, 4100, 300),
    ];

    /// Runs `check(m, k, n, format, x, w as bytes)` on every shape and format.
    fn for_each_case(check: impl Fn(usize, usize, usize, HalfFormat, &[f32], &[u8])) {
        for (m, k, n) in SHAPES {
            let x = data(m * k, 1);
            let w = data(n * k, 2);
            for format in [HalfFormat::F16, HalfFormat::BF16] {
                check(m, k, n, format, &x, &encode(&w, format));
            }
        }
    }

    #[test]
    fn products_agree_with_the_f32_product_of_the_widened_weights() {
        for_each_case(|m, k, n, format, x, bytes| {
            let mut widened = vec![0f32; n * k];
            format.convert(bytes, &mut widened);
            let mut expected = vec![0f32; m * n];
            linear(x, &widened, &mut expected, m, k, n);
            let mut y = vec![0f32; m * n];
            linear_half(x, bytes, format, &mut y, m, k, n);
            let tolerance = 1e-5 * (k as f32).max(1.0);
            for (a, b) in y.iter().zip(&expected) {
                assert!(
                    (a - b).abs() < tolerance,
                    "{format:?} {m}x{k}x{n}: {a} vs {b}"
                );
            }
        });
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_batched_and_on_every_instruction_set() {
        for_each_case(|m, k, n, format, x, bytes| {
            let mut batched = vec![0f32; m * n];
            linear_half(x, bytes, format, &mut batched, m, k, n);
            let mut portable = vec![0f32; m * n];
            let mut outs: Vec<&mut [f32]> = portable.chunks_exact_mut(n).collect();
            multiply_tile_portable(x, bytes, format, &mut outs, 0, k);
            assert!(
                same_bits(&batched, &portable),
                "{format:?} {m}x{k}x{n}: the portable kernel differs"
            );
            for i in 0..m {
                let mut alone = vec![0f32; n];
                linear_half(&x[i * k..(i + 1) * k], bytes, format, &mut alone, 1, k, n);
                assert!(
                    same_bits(&alone, &batched[i * n..(i + 1) * n]),
                    "{format:?} {m}x{k}x{n}: row {i} differs from its own product"
                );
            }
        });
    }

    /// `--precision fast`'s product: where the CPU multiplies bf16 pairs,
    /// that of the activations rounded to bf16 (within f32 rounding of
    /// the f64 product of the rounded values), the same bits for a row
    /// alone and batched; elsewhere, and for f16, the exact product.
    #[test]
    fn fast_products_round_the_activations_to_bf16_where_the_cpu_multiplies_pairs() {
        for_each_case(|m, k, n, format, x, bytes| {
            let mut fast = vec![0f32; m * n];
            linear_half_fast(x, bytes, format, &mut fast, m, k, n);
            let mut exact = vec![0f32; m * n];
            linear_half(x, bytes, format, &mut exact, m, k, n);
            #[cfg(target_arch = "x86_64")]
            let pairs = format == HalfFormat::BF16 && super::super::half_weights_bf16::available();
            #[cfg(not(target_arch = "x86_64"))]
            let pairs = false;
            if !pairs {
                assert!(same_bits(&fast, &exact), "{format:?} {m}x{k}x{n}");
                return;
            }
            let mut w = vec![0f32; n * k];
            format.convert(bytes, &mut w);
            let rounded: Vec<f64> = x
                .iter()
                .map(|&v| f64::from(bf16::from_f32(v).to_f32()))
                .collect();
            for i in 0..m {
                for r in 0..n {
                    let (xs, ws) = (&rounded[i * k..(i + 1) * k], &w[r * k..(r + 1) * k]);
                    let want: f64 = xs.iter().zip(ws).map(|(a, &b)| a * f64::from(b)).sum();
                    let scale: f64 = xs
                        .iter()
                        .zip(ws)
                        .map(|(a, &b)| (a * f64::from(b)).abs())
                        .sum();
                    let got = f64::from(fast[i * n + r]);
                    assert!(
                        (got - want).abs() <= 1e-6 * scale.max(1e-30) + 1e-30,
                        "{m}x{k}x{n} [{i}][{r}]: {got} vs {want}"
                    );
                }
                let mut alone = vec![0f32; n];
                linear_half_fast(&x[i * k..(i + 1) * k], bytes, format, &mut alone, 1, k, n);
                assert!(
                    same_bits(&alone, &fast[i * n..(i + 1) * n]),
                    "{m}x{k}x{n}: row {i} differs from its own product"
                );
            }
        });
    }
}
