//! Matrix products. `matmul`: `c = a·b`; `linear`: `y = x·wᵀ` with `w` in the
//! PyTorch `[out, in]` layout, stored as f32, f16 or bf16.

use gemm::Parallelism;
use half::{bf16, f16};
use rayon::prelude::*;

fn parallelism(flops: usize) -> Parallelism {
    // Below ~1 MFLOP the threads cost more than they save.
    if flops < (1 << 20) || rayon::current_num_threads() == 1 {
        Parallelism::None
    } else {
        Parallelism::Rayon(rayon::current_num_threads())
    }
}

/// `c [m, n] = a [m, k] · b [k, n]`, all row-major.
pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(
        a.len() == m * k && b.len() == k * n && c.len() == m * n,
        "matmul sizes"
    );
    // `b` is row-major: column stride 1, row stride n.
    gemm_f32(a, b, (1, n as isize), c, m, k, n);
}

/// `y [m, n] = x [m, k] · wᵀ` with f32 `w [n, k]`.
pub fn linear(x: &[f32], w: &[f32], y: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(
        x.len() == m * k && w.len() == n * k && y.len() == m * n,
        "linear sizes"
    );
    // `w` read as the k×n matrix wᵀ: column stride k, row stride 1.
    gemm_f32(x, w, (k as isize, 1), y, m, k, n);
}

/// `dst [m, n] = lhs [m, k] · rhs`, with `lhs` and `dst` row-major and `rhs`
/// a k×n matrix addressed by `(column stride, row stride)`. The callers check
/// that the slices hold what the strides address.
fn gemm_f32(
    lhs: &[f32],
    rhs: &[f32],
    (rhs_cs, rhs_rs): (isize, isize),
    dst: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst.fill(0.0);
        return;
    }
    // SAFETY: lhs holds m×k, rhs k×n under its strides, dst m×n (asserted by the callers).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            lhs.as_ptr(),
            1,
            k as isize,
            rhs.as_ptr(),
            rhs_cs,
            rhs_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism(2 * m * n * k),
        );
    }
}

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

/// Rows of `w` converted per tile before a product.
const HALF_TILE_ROWS: usize = 64;

/// Rows of x multiplied with each row of a widened tile at once.
const HALF_X_ROWS: usize = 4;

/// `y [m, n] = x [m, k] · wᵀ` with 16-bit `w [n, k]` (its little-endian
/// bytes, read in place), computed from the 16-bit data: tiles of rows are
/// widened to f32 as they are used, never the whole matrix. Each output is
/// [`dot`]'s arithmetic, so a row's results do not depend on the rows
/// batched with it (nor on the instruction set).
pub fn linear_half(
    x: &[f32],
    w: &[u8],
    format: HalfFormat,
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    assert!(
        x.len() == m * k && w.len() == 2 * n * k && y.len() == m * n,
        "linear_half sizes"
    );
    if m == 0 || n == 0 {
        return;
    }
    // Work on tiles of output columns (weight rows); each writes its own columns of y.
    let tiles: Vec<(usize, Vec<f32>)> = (0..n)
        .step_by(HALF_TILE_ROWS)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|start| {
            let rows = HALF_TILE_ROWS.min(n - start);
            let mut tile = vec![0f32; rows * k];
            format.convert(&w[2 * start * k..2 * (start + rows) * k], &mut tile);
            let mut out = vec![0f32; m * rows];
            multiply_tile(x, &tile, &mut out, k);
            (start, out)
        })
        .collect();
    for (start, out) in tiles {
        let rows = out.len() / m;
        for i in 0..m {
            y[i * n + start..i * n + start + rows].copy_from_slice(&out[i * rows..(i + 1) * rows]);
        }
    }
}

/// `out [m, rows] = x [m, k] · tileᵀ`, compiled for the widest vector unit
/// the CPU has: the same arithmetic in each (eight-lane products and sums,
/// no fused multiply-add), more registers for the register tiles.
fn multiply_tile(x: &[f32], tile: &[f32], out: &mut [f32], k: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512vl")]
        unsafe fn avx512(x: &[f32], tile: &[f32], out: &mut [f32], k: usize) {
            tile_products(x, tile, out, k);
        }
        #[target_feature(enable = "avx2")]
        unsafe fn avx2(x: &[f32], tile: &[f32], out: &mut [f32], k: usize) {
            tile_products(x, tile, out, k);
        }
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512vl") {
            // SAFETY: the CPU has AVX-512F and VL.
            return unsafe { avx512(x, tile, out, k) };
        }
        if has!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { avx2(x, tile, out, k) };
        }
    }
    tile_products(x, tile, out, k);
}

/// [`multiply_tile`]'s work: four rows of x at a time with each row of the
/// tile (each load of the tile feeds four products), then what is left.
#[inline(always)]
fn tile_products(x: &[f32], tile: &[f32], out: &mut [f32], k: usize) {
    let (m, rows) = (x.len() / k, tile.len() / k);
    let x_row = |i: usize| &x[i * k..(i + 1) * k];
    let w_row = |r: usize| &tile[r * k..(r + 1) * k];
    let mut i = 0;
    while i + HALF_X_ROWS <= m {
        let xs: [&[f32]; HALF_X_ROWS] = std::array::from_fn(|j| x_row(i + j));
        for r in 0..rows {
            for (j, [sum]) in dots(xs, [w_row(r)]).into_iter().enumerate() {
                out[(i + j) * rows + r] = sum;
            }
        }
        i += HALF_X_ROWS;
    }
    for i in i..m {
        for r in 0..rows {
            out[i * rows + r] = dot(x_row(i), w_row(r));
        }
    }
}

/// Dot product with eight independent accumulators (vectorizes well).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dots([a], [b])[0][0]
}

/// The dot products of each of `R` rows `a` with each of `C` rows `b`,
/// each with [`dot`]'s arithmetic (eight accumulators, summed in order,
/// then the tail), sharing the loads: result `[i][j]` is `a[i] · b[j]`.
/// Called with C = 1 only; written over `[[[f32; 8]; C]; R]` because that
/// is the form LLVM keeps in vector registers here (the same loops over
/// `[[f32; 8]; R]` prefilled a SmolLM2-sized bf16 model at 135 tok/s
/// instead of 348; C = 2 and 4 spill).
#[inline(always)]
fn dots<const R: usize, const C: usize>(a: [&[f32]; R], b: [&[f32]; C]) -> [[f32; C]; R] {
    let mut acc = [[[0f32; 8]; C]; R];
    let len = b.first().map_or(0, |b| b.len());
    let a_chunks: [&[[f32; 8]]; R] = std::array::from_fn(|i| a[i][..len].as_chunks::<8>().0);
    let b_chunks: [&[[f32; 8]]; C] = std::array::from_fn(|j| b[j].as_chunks::<8>().0);
    let chunks = len / 8;
    for c in 0..chunks {
        for i in 0..R {
            let ac = &a_chunks[i][c];
            for j in 0..C {
                let bc = &b_chunks[j][c];
                for l in 0..8 {
                    acc[i][j][l] += ac[l] * bc[l];
                }
            }
        }
    }
    std::array::from_fn(|i| {
        std::array::from_fn(|j| {
            let mut sum: f32 = acc[i][j].iter().sum();
            for t in chunks * 8..len {
                sum += a[i][t] * b[j][t];
            }
            sum
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                    .sum::<f64>() as f32;
            }
        }
        c
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 16) % 1000) as f32
                    / 500.0
                    - 1.0
            })
            .collect()
    }

    #[test]
    fn matmul_and_linear_agree_with_a_naive_product() {
        for (m, k, n) in [(1, 1, 1), (3, 5, 7), (17, 64, 33), (64, 130, 65)] {
            let a = data(m * k, 1);
            let b = data(k * n, 2);
            let expected = naive(&a, &b, m, k, n);
            let mut c = vec![0f32; m * n];
            matmul(&a, &b, &mut c, m, k, n);
            for (x, y) in c.iter().zip(&expected) {
                assert!((x - y).abs() < 1e-4, "matmul {m}x{k}x{n}: {x} vs {y}");
            }
            // linear with w = bᵀ
            let w: Vec<f32> = (0..n * k).map(|idx| b[(idx % k) * n + idx / k]).collect();
            linear(&a, &w, &mut c, m, k, n);
            for (x, y) in c.iter().zip(&expected) {
                assert!((x - y).abs() < 1e-4, "linear {m}x{k}x{n}: {x} vs {y}");
            }
            for format in [HalfFormat::F16, HalfFormat::BF16] {
                let bits: Vec<u16> = w
                    .iter()
                    .map(|&v| match format {
                        HalfFormat::F16 => f16::from_f32(v).to_bits(),
                        HalfFormat::BF16 => bf16::from_f32(v).to_bits(),
                    })
                    .collect();
                let widened: Vec<f32> = bits.iter().map(|&b| format.to_f32(b)).collect();
                let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
                let mut expected_half = vec![0f32; m * n];
                linear(&a, &widened, &mut expected_half, m, k, n);
                linear_half(&a, &bytes, format, &mut c, m, k, n);
                for (x, y) in c.iter().zip(&expected_half) {
                    assert!((x - y).abs() < 1e-4, "{format:?} {m}x{k}x{n}: {x} vs {y}");
                }
                // A row's bits are those of the row alone (rows of x go
                // four at a time, the rest one at a time).
                for i in 0..m {
                    let mut alone = vec![0f32; n];
                    linear_half(&a[i * k..(i + 1) * k], &bytes, format, &mut alone, 1, k, n);
                    let batched = &c[i * n..(i + 1) * n];
                    let same = alone
                        .iter()
                        .zip(batched)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{format:?} {m}x{k}x{n}: row {i} differs from its own product"
                    );
                }
            }
        }
    }
}
