//! The decode GEMVs of a group whose last matrix is in another GGUF format
//! (`kiln_gemv_<format>_<last>*`, `gemv_blocks`' LAST in `gemv.cuh`): the q
//! and k of llama.cpp's K-quant files with their v at more bits (Q4_K_M and
//! Q5_K_M: Q6_K; Q3_K_M: Q4_K or Q5_K; Q2_K: Q3_K or Q4_K), in one launch. On the kernel emulator against the f64 product of each matrix's
//! CPU decoding: every split of a row among warps, one row of x and eight,
//! the one-row kernels and x in 8 bits (`_x8`).

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

/// A group's matrices on the device: two in the first format (q and k),
/// the last in `last` (v); each one's pointer, rows and decoded values.
fn group_matrices(
    gpu: &Gpu,
    (first, last): (QuantType, QuantType),
    k: usize,
) -> Vec<(DevicePtr, usize, Vec<f32>)> {
    [(first, 5), (first, 7), (last, 6)]
        .into_iter()
        .enumerate()
        .map(|(i, (ty, rows))| {
            let (bytes, values) = random_blocks(ty, rows, k, (k + i) as u64);
            (gpu.up(&bytes), rows, values)
        })
        .collect()
}

/// x [m, k] quantized by `kiln_quantize_x8` on the device, and the values
/// its quants stand for (d · q per block of 32; the quantizer itself is
/// checked in cuda_gemv.rs).
fn x8(gpu: &Gpu, x: DevicePtr, len: usize) -> (DevicePtr, Vec<f32>) {
    let blocks = len / 32;
    let out = gpu.zeros(len + 8 * blocks);
    gpu.run(
        "kiln_quantize_x8",
        (1, 1),
        64,
        &[Ptr(x), Ptr(out), long(blocks)],
    );
    let quants: Vec<u8> = gpu.down(out, len);
    let scales: Vec<f32> = gpu.down(out + len as DevicePtr, 2 * blocks);
    let values = quants
        .iter()
        .enumerate()
        .map(|(j, &q)| scales[2 * (j / 32)] * f32::from(q as i8))
        .collect();
    (out, values)
}

/// Runs `name` over `matrices` as one launch on `x` (m rows), checking each matrix's output against its product with
/// `x_values`.
fn check(
    gpu: &Gpu,
    name: &str,
    split: u32,
    matrices: &[(DevicePtr, usize, Vec<f32>)],
    (x, x_values, m): (DevicePtr, &[f32], usize),
    k: usize,
) {
    let outputs: Vec<DevicePtr> = matrices
        .iter()
        .map(|(_, n, _)| gpu.zeros(4 * m * n))
        .collect();
    let shapes: Vec<(DevicePtr, usize)> = matrices.iter().map(|&(w, n, _)| (w, n)).collect();
    let args: [KernelArg; 4] = [gemv_group(&shapes, &outputs, 0), Ptr(x), int(m), int(k)];
    let rows: usize = matrices.iter().map(|(_, n, _)| n).sum();
    let config = LaunchConfig::linear((rows as u32).div_ceil(WARPS / split), 32 * WARPS);
    gpu.dev
        .launch(gpu.f(name), config, &args)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    for (i, ((_, n, values), &out)) in matrices.iter().zip(&outputs).enumerate() {
        let want = reference_product(values, x_values, m, *n, k);
        let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
        let got: Vec<f32> = gpu.down(out, m * n);
        let what = format!("{name} m={m} k={k} matrix {i}");
        close(&got, &want, 2e-6 * scale * k as f32, &what);
    }
}

#[test]
fn k_quant_groups_with_their_last_matrix_in_more_bits() {
    let gpu = Gpu::new(&[
        sources::GEMV,
        sources::GEMV_Q4_K_Q6_K,
        sources::GEMV_Q5_K_Q6_K,
        sources::GEMV_Q3_K_MIXED,
        sources::GEMV_Q2_K_MIXED,
    ]);
    use QuantType::{Q2K, Q3K, Q4K, Q5K, Q6K};
    let pairs = [
        (Q4K, Q6K, "q4_k_q6_k"),
        (Q5K, Q6K, "q5_k_q6_k"),
        (Q3K, Q4K, "q3_k_q4_k"),
        (Q3K, Q5K, "q3_k_q5_k"),
        (Q2K, Q3K, "q2_k_q3_k"),
        (Q2K, Q4K, "q2_k_q4_k"),
    ];
    for (first, last, formats) in pairs {
        // One round of a row's loads, and several with a partial last one.
        for k in [256 * 3, 256 * 19] {
            let kernel = format!("kiln_gemv_{formats}");
            let matrices = group_matrices(&gpu, (first, last), k);
            let mut rng = Rng::new(k as u64);
            for m in [1, 3, 8] {
                let x_values = rng.data(m * k, 1.0);
                let x = gpu.up(&x_values);
                let (quantized, quantized_values) = x8(&gpu, x, m * k);
                let singles: &[&str] = if m == 1 { &["", "_m1"] } else { &[""] };
                for one in singles {
                    for &(suffix, split) in &SPLITS {
                        let name = format!("{kernel}{one}{suffix}");
                        check(&gpu, &name, split, &matrices, (x, &x_values, m), k);
                        let name = format!("{kernel}_x8{one}{suffix}");
                        let x8 = (quantized, quantized_values.as_slice(), m);
                        check(&gpu, &name, split, &matrices, x8, k);
                    }
                }
            }
        }
    }
}
