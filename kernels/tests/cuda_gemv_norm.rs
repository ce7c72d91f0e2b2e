//! The one-row decode GEMVs that compute x's RMS norm themselves (`_norm`,
//! `KilnGemvNorm` in `gemv.cu`): every block normalizes a (+ b, the residual
//! add) into its shared memory and multiplies that, block 0 writes a + b.
//! Checked on the kernel emulator, whose dynamic shared memory starts as
//! NaN bytes, against the norm and product in f64: dense bf16/f16/f32 rows
//! and GGUF blocks, every split of a row among warps, with and without the
//! residual add, Gemma's offset weight, a group of two matrices, and a
//! gated pair.

mod common;

use common::*;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::{self, Ptr};
use kiln_kernels::cuda::{Device, DevicePtr, LaunchConfig};
use kiln_kernels::quant::QuantType;

/// Warps per block of the GEMV kernels.
const WARPS: u32 = 4;
/// The kernels' splits of a row among warps: name suffix, warps per row.
const SPLITS: [(&str, u32); 3] = [("", 1), ("_s2", 2), ("_s4", 4)];
const EPS: f32 = 1e-5;

/// The norm's inputs on the device: a, b (0: none), where the sum goes, the
/// weight, and its offset.
struct Norm {
    a: DevicePtr,
    b: DevicePtr,
    sum: DevicePtr,
    weight: DevicePtr,
    offset: f32,
}

/// The `KilnGemvGroup` of `matrices` writing `outputs` (gated by
/// `activation` when nonzero), x's norm computed by the launch.
fn group(
    matrices: &[(DevicePtr, usize)],
    outputs: &[DevicePtr],
    activation: u64,
    norm: &Norm,
) -> KernelArg {
    let floats = u64::from(EPS.to_bits()) | u64::from(norm.offset.to_bits()) << 32;
    let words = [norm.a, norm.b, norm.sum, norm.weight, floats];
    gemv_group(matrices, outputs, activation, words)
}

/// Runs `name` (a `_norm` kernel) on `grid` blocks of `warps` warps with
/// k floats of dynamic shared memory.
fn launch(gpu: &Gpu, name: &str, grid: u32, warps: u32, args: &[KernelArg], k: usize) {
    let config = LaunchConfig {
        shared_bytes: (4 * k) as u32,
        ..LaunchConfig::linear(grid, 32 * warps)
    };
    gpu.dev
        .launch(gpu.f(name), config, args)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
}

/// A matrix `W [n, k]` as the kernels read it and decoded to f32.
struct Matrix<'a> {
    bytes: &'a [u8],
    values: &'a [f32],
    n: usize,
    k: usize,
}

/// `kernel`'s `_norm` kernels (every split) on `w`, its rows as two
/// matrices of one launch, then gate and up of a gated pair: with and
/// without the residual add, with offset 0 and 1.
fn check(gpu: &Gpu, kernel: &str, w: &Matrix) {
    let Matrix {
        bytes,
        values,
        n,
        k,
    } = *w;
    let row_bytes = bytes.len() / n;
    let mut rng = Rng::new(k as u64);
    for (residual, offset) in [(true, 0.0), (false, 1.0)] {
        let a = rng.data(k, 2.0);
        let b = rng.data(k, 1.0);
        let weight = rng.data(k, 1.0);
        let h: Vec<f32> = match residual {
            true => a.iter().zip(&b).map(|(a, b)| a + b).collect(),
            false => a.clone(),
        };
        let x = rms_norm(&h, &weight, offset, EPS);
        let want = reference_product(values, &x, 1, n, k);
        let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
        for &(suffix, split) in &SPLITS {
            let name = format!("{kernel}_m1{suffix}_norm");
            let what = format!("{name} residual {residual} offset {offset} k={k}");
            let sum = if residual { gpu.zeros(4 * k) } else { 0 };
            let norm = Norm {
                a: gpu.up(&a),
                b: if residual { gpu.up(&b) } else { 0 },
                sum,
                weight: gpu.up(&weight),
                offset,
            };
            // Two matrices: rows n - 5 and 5.
            let parts = [n - 5, 5];
            let first = gpu.up(&bytes[..parts[0] * row_bytes]);
            let second = gpu.up(&bytes[parts[0] * row_bytes..]);
            let outputs = [gpu.zeros(4 * parts[0]), gpu.zeros(4 * parts[1])];
            let matrices = [(first, parts[0]), (second, parts[1])];
            // x is not read: a null pointer would fault if it were.
            let args = [group(&matrices, &outputs, 0, &norm), Ptr(0), int(1), int(k)];
            let grid = (n as u32).div_ceil(WARPS / split);
            launch(gpu, &name, grid, WARPS, &args, k);
            let got = [
                gpu.down::<f32>(outputs[0], parts[0]),
                gpu.down(outputs[1], parts[1]),
            ]
            .concat();
            close(&got, &want, 2e-6 * scale * k as f32, &what);
            if residual {
                let written: Vec<f32> = gpu.down(sum, k);
                assert!(bits(&written) == bits(&h), "{what}: a + b as written");
            }

            // Gate and up, the halves of W's rows: act(gate)·up (SiLU).
            let half = n / 2;
            let gate = gpu.up(&bytes[..half * row_bytes]);
            let up = gpu.up(&bytes[half * row_bytes..2 * half * row_bytes]);
            let outputs = [gpu.zeros(4 * half), gpu.zeros(4 * half)];
            let args = [
                group(&[(gate, half), (up, half)], &outputs, 1, &norm),
                Ptr(0),
                int(1),
                int(k),
            ];
            let warps = WARPS.max(2 * split);
            launch(
                gpu,
                &name,
                (2 * half as u32).div_ceil(warps / split),
                warps,
                &args,
                k,
            );
            let silu = |v: f32| f64::from(v) / (1.0 + (-f64::from(v)).exp());
            let gated: Vec<f32> = (0..half)
                .map(|r| (silu(want[r]) * f64::from(want[half + r])) as f32)
                .collect();
            let tolerance = 2e-6 * k as f32 * 2.5 * scale * scale;
            close(
                &gpu.down::<f32>(outputs[0], half),
                &gated,
                tolerance,
                &format!("{what} gated"),
            );
        }
    }
}

#[test]
fn dense_rows_take_the_norm_of_x() {
    let gpu = Gpu::new(&[sources::GEMV]);
    let n = 37;
    // 520: a partial round of the norm's loads and of the row's; 4096: the
    // most a launch takes (KILN_GEMV_NORM_VALUES).
    for k in [520, 4096] {
        let values = Rng::new(3).data(n * k, 1.0);
        for (kernel, stored, decoded) in dense_formats(&values) {
            let w = Matrix {
                bytes: &stored,
                values: &decoded,
                n,
                k,
            };
            check(&gpu, kernel, &w);
        }
    }
}

#[test]
fn gguf_blocks_take_the_norm_of_x() {
    let gpu = Gpu::new(&[sources::GEMV]);
    let n = 13;
    for (ty, name, k) in [
        (QuantType::Q8_0, "q8_0", 32 * 77),
        (QuantType::Q4_0, "q4_0", 32 * 9),
        (QuantType::Q5_0, "q5_0", 32 * 9),
        (QuantType::Q4K, "q4_k", 256 * 3),
        (QuantType::Q5K, "q5_k", 256 * 3),
        (QuantType::Q6K, "q6_k", 256 * 9),
    ] {
        let (packed, values) = random_blocks(ty, n, k, k as u64);
        let w = Matrix {
            bytes: &packed,
            values: &values,
            n,
            k,
        };
        check(&gpu, &format!("kiln_gemv_{name}"), &w);
    }
}
