//! Matrix products. `matmul`: `c = a·b`; `linear`: `y = x·wᵀ` with `w` in the
//! PyTorch `[out, in]` layout, stored as f32, f16 or bf16.

mod half_weights;
#[cfg(target_arch = "x86_64")]
mod half_weights_avx2;
#[cfg(target_arch = "x86_64")]
mod half_weights_bf16;

pub use half_weights::{linear_half, linear_half_fast, HalfFormat};

use gemm::Parallelism;

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

    /// Deterministic values in [-1, 1).
    pub(super) fn data(len: usize, seed: u32) -> Vec<f32> {
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
        }
    }
}
