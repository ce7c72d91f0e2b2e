//! `kiln_batched_matmul` (`kernels/cuda/matmul.cu`) on the kernel emulator
//! against a plain triple loop: sizes that are not multiples of the 16 × 16
//! tile, several batches, and either operand repeated for every batch.

use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::{Device, KernelArg::Ptr, LaunchConfig};

mod common;
use common::*;

/// `a [batches or 1, m, k] · b [batches or 1, k, n]` by definition.
fn reference(
    a: &[f32],
    b: &[f32],
    dims: (usize, usize, usize, usize),
    shared: (bool, bool),
) -> Vec<f32> {
    let (batches, m, k, n) = dims;
    let mut c = vec![0f32; batches * m * n];
    for z in 0..batches {
        let a_at = if shared.0 { 0 } else { z * m * k };
        let b_at = if shared.1 { 0 } else { z * k * n };
        for i in 0..m {
            for j in 0..n {
                c[(z * m + i) * n + j] = (0..k)
                    .map(|p| a[a_at + i * k + p] * b[b_at + p * n + j])
                    .sum();
            }
        }
    }
    c
}

#[test]
fn batched_products_match_the_definition() {
    let gpu = Gpu::new(&[sources::MATMUL]);
    let mut rng = Rng::new(5);
    // (batches, m, k, n), (a shared, b shared)
    let cases = [
        ((1, 1, 1, 1), (false, false)),
        ((3, 5, 17, 9), (false, false)),
        ((4, 33, 20, 18), (false, true)),
        ((2, 16, 32, 16), (true, false)),
    ];
    for (dims, shared) in cases {
        let (batches, m, k, n) = dims;
        let a = rng.data(if shared.0 { 1 } else { batches } * m * k, 1.0);
        let b = rng.data(if shared.1 { 1 } else { batches } * k * n, 1.0);
        let out = gpu.zeros(batches * m * n * 4);
        let stride = |is_shared: bool, size: usize| long(if is_shared { 0 } else { size });
        let config = LaunchConfig::new(
            (n.div_ceil(16) as u32, m.div_ceil(16) as u32, batches as u32),
            (16, 16, 1),
        );
        let args = [
            Ptr(gpu.up(&a)),
            Ptr(gpu.up(&b)),
            Ptr(out),
            int(m),
            int(n),
            int(k),
            stride(shared.0, m * k),
            stride(shared.1, k * n),
        ];
        gpu.dev
            .launch(gpu.f("kiln_batched_matmul"), config, &args)
            .unwrap();
        gpu.check(
            out,
            &reference(&a, &b, dims, shared),
            &format!("{dims:?} {shared:?}"),
        );
    }
}
