//! The decode matrix products of `gemv.cuh` on the kernel emulator: dense
//! bf16/f16/f32 rows (16-byte loads and the unaligned fallback) and GGUF
//! blocks read packed (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
//! Q6_K, IQ4_NL, IQ4_XS), against a dot product over the CPU's own decoding
//! of the same bytes; and the expansion of those blocks to bf16 for the GEMM
//! of larger batches, and rows of them read as an embedding table. Each
//! launch also runs as a group of matrices sharing x (as q, k and v do), one
//! output each, and a single row of x also through the format's `_m1`
//! kernel. The GGUF GEMVs with 8-bit activations (`_x8`) run on x quantized
//! by `kiln_quantize_x8`, itself checked to the bit against a quantizer
//! written here, and are compared with the dot product over that x's values.

mod common;

use common::*;
use half::bf16;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::DevicePtr;
use kiln_kernels::cuda::KernelArg::{self, Ptr};
use kiln_kernels::quant::QuantType;

/// Warps per block of the GEMV kernels.
const WARPS: u32 = 4;
/// The kernels' splits of a row among warps: name suffix, warps per row.
const SPLITS: [(&str, u32); 3] = [("", 1), ("_s2", 2), ("_s4", 4)];

/// The `KilnGemvGroup` argument: matrices (device pointer, rows), their
/// outputs and the gated activation (0: none).
fn group(matrices: &[(DevicePtr, usize)], outputs: &[DevicePtr], activation: u64) -> KernelArg {
    gemv_group(matrices, outputs, activation)
}

/// x as 8-bit blocks of 32, as `kiln_quantize_x8` should write them: every
/// quant (x / d rounded to nearest even, d = max|x| / 127 per block), then
/// each block's d and d·Σq as f32; and the values the quants stand for.
fn quantize_x8(x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let (mut quants, mut scales, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for block in x.chunks_exact(32) {
        let d = block.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<i8> = block
            .iter()
            .map(|v| (v * inverse).round_ties_even() as i8)
            .collect();
        let sum: i32 = q.iter().map(|&q| i32::from(q)).sum();
        quants.extend(q.iter().map(|&q| q as u8));
        scales.extend([d, d * sum as f32]);
        values.extend(q.iter().map(|&q| d * f32::from(q)));
    }
    quants.extend(bytes(&scales));
    (quants, values)
}

/// x on the device as the GEMV reads it (f32, or quantized by
/// `kiln_quantize_x8`), and the values the product should see.
fn device_x(gpu: &Gpu, x: &[f32], x8: bool, shifted: bool) -> (DevicePtr, Vec<f32>) {
    if shifted {
        // One float past an aligned allocation: rows off 16-byte boundaries.
        let padded = [&[0.0][..], x].concat();
        return (gpu.up(&padded) + 4, x.to_vec());
    }
    let xs = gpu.up(x);
    if !x8 {
        return (xs, x.to_vec());
    }
    let (want_bytes, values) = quantize_x8(x);
    let out = gpu.zeros(want_bytes.len());
    // Fewer warps than blocks: the kernel strides over the rest.
    let args = [Ptr(xs), Ptr(out), long(x.len() / 32)];
    gpu.run("kiln_quantize_x8", (1, 1), 64, &args);
    assert!(
        gpu.down::<u8>(out, want_bytes.len()) == want_bytes,
        "kiln_quantize_x8 of {} values",
        x.len()
    );
    (out, values)
}

/// A matrix `W [n, k]` as the kernels read it (`bytes`) and decoded to f32
/// (`values`).
struct Matrix<'a> {
    bytes: &'a [u8],
    values: &'a [f32],
    n: usize,
    k: usize,
}

/// Runs `kernel` on `w` for every batch size the kernels take, against
/// `reference_product` over its values, with its rows split into one, two or three
/// matrices of one launch, then gated (`check_gated`); with `x8`, on x
/// quantized to 8 bits.
fn check_gemv(gpu: &Gpu, kernel: &str, w: &Matrix, x8: bool) {
    let Matrix {
        bytes: w_bytes,
        values,
        n,
        k,
    } = *w;
    let row_bytes = w_bytes.len() / n;
    let mut rng = Rng::new(k as u64);
    for (m, parts) in [(1, vec![n]), (3, vec![5, n - 5]), (8, vec![n - 9, 4, 5])] {
        // Three rows of f32 x lie off 16-byte boundaries: the kernels' path
        // of scalar loads of x.
        let (xs, x) = device_x(gpu, &rng.data(m * k, 1.0), x8, !x8 && m == 3);
        let want = reference_product(values, &x, m, n, k);
        let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
        // A single row of x also runs the kernels made for it; every kernel
        // runs in each split of a row among warps. Each kernel gets fresh
        // outputs, so one cannot pass on another's results.
        let singles = if m == 1 {
            ["", "_m1"].as_slice()
        } else {
            &[""]
        };
        let variants = singles.iter().flat_map(|one| {
            SPLITS
                .iter()
                .map(move |&(suffix, split)| (format!("{kernel}{one}{suffix}"), split))
        });
        for (name, split) in variants {
            let (name, grid) = (name.as_str(), (n as u32).div_ceil(WARPS / split));
            // Each part is its own matrix and output.
            let (mut matrices, mut outputs, mut first) = (Vec::new(), Vec::new(), 0);
            for &rows in &parts {
                let bytes = &w_bytes[first * row_bytes..(first + rows) * row_bytes];
                matrices.push((gpu.up(bytes), rows));
                outputs.push(gpu.zeros(m * rows * 4));
                first += rows;
            }
            let args = [group(&matrices, &outputs, 0), Ptr(xs), int(m), int(k)];
            gpu.run(name, (grid, 1), 32 * WARPS, &args);
            // y [m, n] from the parts' [m, rows].
            let mut got = vec![0f32; m * n];
            let mut first = 0;
            for (&rows, &out) in parts.iter().zip(&outputs) {
                let part: Vec<f32> = gpu.down(out, m * rows);
                for i in 0..m {
                    got[i * n + first..i * n + first + rows]
                        .copy_from_slice(&part[i * rows..(i + 1) * rows]);
                }
                first += rows;
            }
            let what = format!("{name} m={m} k={k} parts {parts:?}");
            close(&got, &want, 2e-6 * scale * k as f32, &what);
        }
    }
    check_gated(gpu, kernel, w, x8);
}

/// `kiln_gated`'s activations by number, in f64: SiLU, GELU (erf), GELU
/// (tanh), ReLU.
fn activation(code: u64, x: f64) -> f64 {
    match code {
        1 => x / (1.0 + (-x).exp()),
        2 => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
        3 => 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044_715 * x * x * x)).tanh()),
        _ => x.max(0.0),
    }
}

/// The gated launch of `kernel` (a gated MLP's gate and up as the first and
/// second halves of W's rows, each its own matrix): act(gate)·up written to
/// the first output, nothing to the second, in every split (two rows a
/// block, eight warps for four a row), the activations taken in turn.
fn check_gated(gpu: &Gpu, kernel: &str, w: &Matrix, x8: bool) {
    let Matrix {
        bytes: w_bytes,
        values,
        n,
        k,
    } = *w;
    let half = n / 2;
    let row_bytes = w_bytes.len() / n;
    let gate = gpu.up(&w_bytes[..half * row_bytes]);
    let up = gpu.up(&w_bytes[half * row_bytes..2 * half * row_bytes]);
    let mut rng = Rng::new(k as u64 + 1);
    let mut code = 0;
    for m in [1, 3, 8] {
        let (xs, x) = device_x(gpu, &rng.data(m * k, 1.0), x8, !x8 && m == 3);
        let g = reference_product(&values[..half * k], &x, m, half, k);
        let u = reference_product(&values[half * k..2 * half * k], &x, m, half, k);
        let largest = |v: &[f32]| v.iter().fold(1f32, |a, v| a.max(v.abs()));
        let tolerance = 2e-6 * k as f32 * 2.5 * largest(&g) * largest(&u);
        let singles = if m == 1 {
            ["", "_m1"].as_slice()
        } else {
            &[""]
        };
        for one in singles {
            for &(suffix, split) in &SPLITS {
                code = code % 4 + 1;
                let name = format!("{kernel}{one}{suffix}");
                let warps = WARPS.max(2 * split);
                let grid = (2 * half as u32).div_ceil(warps / split);
                let outputs = [gpu.zeros(m * half * 4), gpu.zeros(m * half * 4)];
                let matrices = [(gate, half), (up, half)];
                let args = [group(&matrices, &outputs, code), Ptr(xs), int(m), int(k)];
                gpu.run(&name, (grid, 1), 32 * warps, &args);
                let want: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| (activation(code, g.into()) * f64::from(u)) as f32)
                    .collect();
                let what = format!("{name} gated by activation {code}, m={m} k={k}");
                close(
                    &gpu.down::<f32>(outputs[0], m * half),
                    &want,
                    tolerance,
                    &what,
                );
                let untouched = gpu.down::<f32>(outputs[1], m * half);
                assert!(
                    untouched.iter().all(|&v| v == 0.0),
                    "{what}: up's output written"
                );
            }
        }
    }
}

#[test]
fn dense_rows_match_the_reference() {
    let gpu = Gpu::new(&[sources::GEMV]);
    let n = 37; // not a multiple of the rows per block
                // Stretches of 256 columns (load8) and columns past them:
                // 520, two stretches; 2056, a full round of eight (the
                // one-row kernels); 2820, a round and three stretches more;
                // 37, no stretch (columns not a multiple of 4).
    for k in [520, 2056, 2820, 37] {
        let values = Rng::new(3).data(n * k, 1.0);
        for (kernel, stored, decoded) in dense_formats(&values) {
            let w = Matrix {
                bytes: &stored,
                values: &decoded,
                n,
                k,
            };
            check_gemv(&gpu, kernel, &w, false);
        }
    }
}

#[test]
fn gguf_blocks_are_read_packed_and_match_the_cpu_decoding() {
    let gpu = Gpu::new(&sources::GEMVS);
    let n = 13;
    // Rows shorter than one round of loads, and rows of several rounds
    // whose last is partial in every split (a round of a row's warps is
    // 256 blocks of 32 values at four warps a row, 64 K-quant blocks).
    for (ty, name, k) in [
        (QuantType::Q8_0, "q8_0", 32 * 9),
        (QuantType::Q8_0, "q8_0", 32 * 300),
        (QuantType::Q4_0, "q4_0", 32 * 9),
        (QuantType::Q4_0, "q4_0", 32 * 300),
        (QuantType::Q5_0, "q5_0", 32 * 9),
        (QuantType::Q5_0, "q5_0", 32 * 300),
        (QuantType::Q4_1, "q4_1", 32 * 9),
        (QuantType::Q4_1, "q4_1", 32 * 300),
        (QuantType::Q5_1, "q5_1", 32 * 9),
        (QuantType::Q5_1, "q5_1", 32 * 300),
        (QuantType::Q4K, "q4_k", 256 * 3),
        (QuantType::Q4K, "q4_k", 256 * 70),
        (QuantType::Q5K, "q5_k", 256 * 3),
        (QuantType::Q5K, "q5_k", 256 * 70),
        (QuantType::Q6K, "q6_k", 256 * 3),
        (QuantType::Q6K, "q6_k", 256 * 70),
        (QuantType::IQ4NL, "iq4_nl", 32 * 9),
        (QuantType::IQ4NL, "iq4_nl", 32 * 300),
        (QuantType::IQ4XS, "iq4_xs", 256 * 3),
        (QuantType::IQ4XS, "iq4_xs", 256 * 70),
        (QuantType::Q2K, "q2_k", 256 * 3),
        (QuantType::Q2K, "q2_k", 256 * 70),
        (QuantType::Q3K, "q3_k", 256 * 3),
        (QuantType::Q3K, "q3_k", 256 * 70),
    ] {
        let (packed, values) = random_blocks(ty, n, k, k as u64);
        let w = Matrix {
            bytes: &packed,
            values: &values,
            n,
            k,
        };
        check_gemv(&gpu, &format!("kiln_gemv_{name}"), &w, false);
        check_gemv(&gpu, &format!("kiln_gemv_{name}_x8"), &w, true);

        // The same blocks expanded to bf16 for the GEMM of larger batches,
        // by a grid with fewer threads than lane parts: the kernel strides
        // over the rest (the host caps a launch at 65,535 blocks).
        let blocks = n * k / ty.block_elems();
        let (w, out) = (gpu.up(&packed), gpu.zeros(n * k * 2));
        let args = [Ptr(w), Ptr(out), long(blocks)];
        gpu.run(&format!("kiln_dequant_{name}"), (2, 1), 64, &args);
        let got: Vec<f32> = gpu
            .down::<u16>(out, n * k)
            .into_iter()
            .map(|b| bf16::from_bits(b).to_f32())
            .collect();
        for (i, (g, v)) in got.iter().zip(&values).enumerate() {
            let want = bf16::from_f32(*v).to_f32();
            // One bf16 step apart at most (the f32 value may round either way).
            let step = want.abs().max(1e-30) / 128.0;
            assert!(
                (g - want).abs() <= step,
                "{name} value {i}: got {g}, want {want}"
            );
        }

        // Rows of the same blocks as an embedding table, one value at a
        // time (`value`): the CPU's decoding to the bit, a bad id zeros.
        let ids = [3i64, 0, 12, -1, 7];
        let (error, y) = (gpu.up(&[0i32]), gpu.zeros(ids.len() * k * 4));
        let args = [
            Ptr(w),
            Ptr(gpu.up(&ids)),
            Ptr(y),
            long(n),
            int(k),
            Ptr(error),
            row_norm(None),
        ];
        gpu.run(
            &format!("kiln_embedding_{name}"),
            (ids.len() as u32, 1),
            128,
            &args,
        );
        let row = |id: i64| match usize::try_from(id) {
            Ok(r) => values[r * k..(r + 1) * k].to_vec(),
            Err(_) => vec![0.0; k],
        };
        let want: Vec<f32> = ids.iter().flat_map(|&id| row(id)).collect();
        let got: Vec<f32> = gpu.down(y, want.len());
        assert!(bits(&got) == bits(&want), "{name}: embedding rows differ");
        assert_eq!(
            gpu.down::<i32>(error, 1),
            [1],
            "{name}: the bad id is flagged"
        );
    }
}

#[test]
fn activations_quantize_to_8_bits_per_block_of_32() {
    let gpu = Gpu::new(&[sources::GEMV]);
    let mut x = Rng::new(5).data(32 * 41, 3.0);
    // A block of zeros (d = 0), one of ties (d = 1: 2.5 and -3.5 round to
    // even, 2 and -4), one whose largest value is negative.
    x[32..64].fill(0.0);
    x[64..96].copy_from_slice(&[[127.0, 2.5, -3.5, 0.5].as_slice(), &[1.25; 28]].concat());
    x[96] = -9.0;
    let (_, values) = device_x(&gpu, &x, true, false);
    assert_eq!(values[32..64], [0.0; 32]);
    assert_eq!(values[64..68], [127.0, 2.0, -4.0, 0.0]);
    assert_eq!(values[96], -9.0);
    // Within half a step of each block's x.
    for (block, want) in values.chunks(32).zip(x.chunks(32)) {
        let step = want.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
        close(block, want, 0.5 * step * (1.0 + 1e-6), "8-bit x");
    }
}
