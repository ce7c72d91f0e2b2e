//! The tensor-core products of GGUF-block matrices with batches of up to 64
//! rows (`qmatmul.cu`) on the kernel emulator, whose `mma_bf16_16816` models
//! the instruction's fragment layout: every format, against a dot product
//! in f64 over the CPU's decoding of the same bytes and x, both rounded to
//! bf16 as the kernel rounds them. Tiles cut by the matrix's rows and by
//! the rows of x, more than one tile of x rows, rows of several 128-column
//! stretches with a partial last one, and K split among blocks (their sums
//! added by `kiln_qmm_reduce`).

mod common;

use common::*;
use half::bf16;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::Ptr;
use kiln_kernels::cuda::{Device, LaunchConfig};
use kiln_kernels::quant::QuantType;

/// Rows of W and of x per block (`KILN_QMM_TILE`).
const TILE: usize = 64;
/// Columns per stretch (`KILN_QMM_K`).
const STRETCH: usize = 128;

fn round_bf16(v: f32) -> f32 {
    bf16::from_f32(v).to_f32()
}

/// `y [m, n] = x · Wᵀ` in f64, and per output the sum of the products'
/// magnitudes (what the tolerance scales with).
fn reference(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut y, mut size) = (vec![0f32; m * n], vec![0f32; m * n]);
    for i in 0..m {
        for r in 0..n {
            let products = (0..k).map(|j| f64::from(x[i * k + j]) * f64::from(w[r * k + j]));
            let (sum, abs) = products.fold((0f64, 0f64), |(s, a), p| (s + p, a + p.abs()));
            (y[i * n + r], size[i * n + r]) = (sum as f32, abs as f32);
        }
    }
    (y, size)
}

/// Runs `kiln_qmm_<name>` on W [n, k] in `ty` for `m` rows of x with K in
/// `splits` parts, against the reference.
#[allow(clippy::too_many_arguments)]
fn check(gpu: &Gpu, ty: QuantType, name: &str, n: usize, k: usize, m: usize, splits: usize) {
    let (packed, values) = random_blocks(ty, n, k, (n * k + m) as u64);
    let w_bf16: Vec<f32> = values.iter().map(|&v| round_bf16(v)).collect();
    let x: Vec<f32> = Rng::new(m as u64)
        .data(m * k, 1.0)
        .into_iter()
        .map(round_bf16)
        .collect();
    let x_bits: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    let (want, size) = reference(&w_bf16, &x, m, n, k);

    let stretches = k.div_ceil(STRETCH);
    let k_split = stretches.div_ceil(splits) * STRETCH;
    let z = k.div_ceil(k_split);
    let (w, xs, y) = (gpu.up(&packed), gpu.up(&x_bits), gpu.zeros(m * n * 4));
    let partials = gpu.zeros(z * m * n * 4);
    let mut config = LaunchConfig::linear(n.div_ceil(TILE) as u32, 128);
    config.grid = (n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, z as u32);
    let args = [
        Ptr(w),
        Ptr(xs),
        Ptr(y),
        Ptr(partials),
        int(m),
        int(n),
        int(k),
        int(k_split),
    ];
    let kernel = format!("kiln_qmm_{name}");
    gpu.dev.launch(gpu.f(&kernel), config, &args).unwrap();
    if z > 1 {
        let reduce = [Ptr(partials), Ptr(y), long(m * n), int(z)];
        gpu.run(
            "kiln_qmm_reduce",
            ((m * n).div_ceil(256) as u32, 1),
            256,
            &reduce,
        );
    }
    let got: Vec<f32> = gpu.down(y, m * n);
    for (i, ((g, w), s)) in got.iter().zip(&want).zip(&size).enumerate() {
        // f32 sums in another order; a weight whose f32 decoding differs
        // from the CPU's in the last bit may round to the neighbouring bf16.
        let tolerance = 3e-5 * s + 1e-2 * s / k as f32;
        assert!(
            (g - w).abs() <= tolerance,
            "{kernel} n={n} k={k} m={m} splits={splits}: y[{}, {}] = {g}, want {w} (±{tolerance:.2e})",
            i / n,
            i % n
        );
    }
}

#[test]
fn packed_blocks_on_tensor_cores_match_the_cpu_decoding() {
    let gpu = Gpu::new(&[sources::QMATMUL]);
    // 70 rows of W: a second tile cut short; k of 416 (Q8_0): three
    // stretches and a partial fourth of one block.
    for (ty, name, k) in [
        (QuantType::Q8_0, "q8_0", 32 * 13),
        (QuantType::Q4_0, "q4_0", 32 * 9),
        (QuantType::Q5_0, "q5_0", 32 * 9),
        (QuantType::Q4K, "q4_k", 256 * 3),
        (QuantType::Q5K, "q5_k", 256 * 3),
        (QuantType::Q6K, "q6_k", 256 * 2),
    ] {
        for (m, splits) in [(9, 1), (16, 2), (40, 1), (64, 3), (70, 2)] {
            check(&gpu, ty, name, 70, k, m, splits);
        }
    }
}
