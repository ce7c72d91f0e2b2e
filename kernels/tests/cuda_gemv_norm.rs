//! A residual add and the RMS norm after it folded into the decode GEMVs
//! around them (`gemv.cuh`'s `KilnGemvNorm` and `row_scales`), on the
//! kernel emulator: the producing GEMV writes residual + W·x, that times
//! (offset + w), and each row of x's 1 / rms (its last block, the counter
//! left at zero for the next launch); the consuming GEMV multiplies each row
//! of x's sums by its scale, before the gated activation too. Dense bf16
//! and packed Q8_0 rows, every split of a row among warps, one and several
//! rows of x; against sums in f64 over the CPU's decoding of the weights.
//! Chained, the two give what `kiln_add_rms_norm` and a plain GEMV give.

mod common;

use common::*;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::DevicePtr;
use kiln_kernels::cuda::KernelArg::{self, Ptr};
use kiln_kernels::quant::QuantType;

/// Warps per block of the GEMV kernels.
const WARPS: u32 = 4;
/// The kernels' splits of a row among warps: name suffix, warps per row.
const SPLITS: [(&str, u32); 3] = [("", 1), ("_s2", 2), ("_s4", 4)];
/// Rows of the producer's matrix (the hidden size): 130 to 520 blocks.
const N: usize = 520;
const K: usize = 256;
const EPS: f32 = 1e-5;

/// A producer's `KilnGemvNorm`: its buffers, offset and `EPS`.
struct Norm {
    residual: DevicePtr,
    sum: DevicePtr,
    gain: DevicePtr,
    partials: DevicePtr,
    counter: DevicePtr,
    scales: DevicePtr,
    offset: f32,
}

impl Norm {
    /// Its 7 words, as `KilnGemvNorm` lays them out.
    fn words(&self) -> [u64; 7] {
        let floats = u64::from(self.offset.to_bits()) | u64::from(EPS.to_bits()) << 32;
        [
            self.residual,
            self.sum,
            self.gain,
            self.partials,
            self.counter,
            self.scales,
            floats,
        ]
    }
}

/// `gemv_group`'s words with a folded norm's (`KilnGemvNorm`: 7 words) and
/// the row scales in place of its zeros.
fn group(
    matrices: &[(DevicePtr, usize)],
    outputs: &[DevicePtr],
    activation: u64,
    (norm, row_scales): ([u64; 7], DevicePtr),
) -> KernelArg {
    let KernelArg::Struct(mut words) = gemv_group(matrices, outputs, activation) else {
        unreachable!("gemv_group gives a struct")
    };
    words.truncate(words.len() - 8);
    words.extend(norm);
    words.push(row_scales);
    KernelArg::Struct(words)
}

/// Each kernel of `kernel` for `m` rows of x: the `_m1` kernels too for one
/// row, each in every split.
fn variants(kernel: &str, m: usize) -> Vec<(String, u32)> {
    let singles: &[&str] = if m == 1 { &["", "_m1"] } else { &[""] };
    let mut all = Vec::new();
    for one in singles {
        for (suffix, split) in SPLITS {
            all.push((format!("{kernel}{one}{suffix}"), split));
        }
    }
    all
}

fn largest(v: &[f32]) -> f32 {
    v.iter().fold(1f32, |a, v| a.max(v.abs()))
}

/// The producer: `kernel` over W (`bytes`, decoded `values`, [N, K]) with a
/// residual add and norm after it, twice on one counter each.
fn check_producer(gpu: &Gpu, kernel: &str, bytes: &[u8], values: &[f32]) {
    let mut rng = Rng::new(11);
    let w = gpu.up(bytes);
    let counter = gpu.zeros(4);
    for m in [1, 3, 8] {
        let x = rng.data(m * K, 1.0);
        let residual = rng.data(m * N, 2.0);
        let gain = rng.data(N, 1.0);
        let product = reference_product(values, &x, m, N, K);
        let sum: Vec<f32> = residual.iter().zip(&product).map(|(r, p)| r + p).collect();
        let tolerance = 2e-6 * largest(&product) * K as f32;
        let (xs, residual_at, gain_at) = (gpu.up(&x), gpu.up(&residual), gpu.up(&gain));
        for (v, (name, split)) in variants(kernel, m).into_iter().enumerate() {
            // Gemma's 1 + w in every other launch.
            let offset = (v % 2) as f32;
            let normed: Vec<f32> = sum
                .iter()
                .enumerate()
                .map(|(at, s)| s * (offset + gain[at % N]))
                .collect();
            let scales: Vec<f32> = sum
                .chunks_exact(N)
                .map(|row| {
                    let squares: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
                    (1.0 / (squares / N as f64 + f64::from(EPS)).sqrt()) as f32
                })
                .collect();
            let blocks = (N as u32).div_ceil(WARPS / split);
            for round in 0..2 {
                let (out, sum_at) = (gpu.zeros(m * N * 4), gpu.zeros(m * N * 4));
                let (partials, scales_at) = (gpu.zeros(blocks as usize * m * 4), gpu.zeros(32));
                let norm = Norm {
                    residual: residual_at,
                    sum: sum_at,
                    gain: gain_at,
                    partials,
                    counter,
                    scales: scales_at,
                    offset,
                }
                .words();
                let args = [
                    group(&[(w, N)], &[out], 0, (norm, 0)),
                    Ptr(xs),
                    int(m),
                    int(K),
                ];
                gpu.run(&name, (blocks, 1), 32 * WARPS, &args);
                let what = format!("{name} m={m} offset {offset} round {round}");
                close(
                    &gpu.down(sum_at, m * N),
                    &sum,
                    tolerance,
                    &format!("{what}: sum"),
                );
                let normed_tolerance = tolerance * (offset + largest(&gain));
                let got: Vec<f32> = gpu.down(out, m * N);
                close(&got, &normed, normed_tolerance, &format!("{what}: h · g"));
                let got: Vec<f32> = gpu.down(scales_at, m);
                let relative: Vec<f32> = got.iter().zip(&scales).map(|(g, s)| g / s).collect();
                close(&relative, &vec![1.0; m], 1e-5, &format!("{what}: scales"));
                assert_eq!(gpu.down::<u32>(counter, 1), [0], "{what}: counter");
            }
        }
    }
}

/// The consumer: `kernel` over W with each row of x's sums scaled, alone and
/// as a gated MLP's gate and up (W's halves), the activation of the scaled
/// sums.
fn check_consumer(gpu: &Gpu, kernel: &str, bytes: &[u8], values: &[f32]) {
    let mut rng = Rng::new(12);
    let half = N / 2;
    let row_bytes = bytes.len() / N;
    let (w, gate, up) = (
        gpu.up(bytes),
        gpu.up(&bytes[..half * row_bytes]),
        gpu.up(&bytes[half * row_bytes..]),
    );
    for m in [1, 3, 8] {
        let x = rng.data(m * K, 1.0);
        let scales: Vec<f32> = (0..m).map(|i| 0.25 + i as f32 * 0.5).collect();
        let scale_rows = |v: Vec<f32>, cols: usize| -> Vec<f32> {
            let at = |i: usize| scales[i / cols];
            v.iter().enumerate().map(|(i, &v)| v * at(i)).collect()
        };
        let product = scale_rows(reference_product(values, &x, m, N, K), N);
        let g = scale_rows(reference_product(&values[..half * K], &x, m, half, K), half);
        let u = scale_rows(reference_product(&values[half * K..], &x, m, half, K), half);
        let silu = |v: f32| v / (1.0 + (-v).exp());
        let gated: Vec<f32> = g.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
        let (xs, scales_at) = (gpu.up(&x), gpu.up(&scales));
        let tolerance = 2e-6 * largest(&product) * K as f32;
        let gated_tolerance = 2e-6 * K as f32 * 2.5 * largest(&g) * largest(&u);
        for (name, split) in variants(kernel, m) {
            let what = format!("{name} m={m}");
            let scaled = ([0; 7], scales_at);
            let out = gpu.zeros(m * N * 4);
            let args = [group(&[(w, N)], &[out], 0, scaled), Ptr(xs), int(m), int(K)];
            gpu.run(
                &name,
                ((N as u32).div_ceil(WARPS / split), 1),
                32 * WARPS,
                &args,
            );
            close(&gpu.down(out, m * N), &product, tolerance, &what);
            // Gated: two rows a block, eight warps for four a row.
            let warps = WARPS.max(2 * split);
            let outputs = [gpu.zeros(m * half * 4), gpu.zeros(m * half * 4)];
            let matrices = [(gate, half), (up, half)];
            let args = [
                group(&matrices, &outputs, 1, scaled),
                Ptr(xs),
                int(m),
                int(K),
            ];
            gpu.run(
                &name,
                ((N as u32).div_ceil(warps / split), 1),
                32 * warps,
                &args,
            );
            let got: Vec<f32> = gpu.down(outputs[0], m * half);
            close(&got, &gated, gated_tolerance, &format!("{what} gated"));
        }
    }
}

/// A random bf16 W [N, K]: its bytes and values.
fn bf16_matrix(seed: u64) -> (Vec<u8>, Vec<f32>) {
    let (bits, values) = bf16s(&Rng::new(seed).data(N * K, 0.5));
    (bytes(&bits), values)
}

#[test]
fn the_bf16_gemv_adds_the_residual_and_takes_the_norms_parts() {
    let (w, values) = bf16_matrix(1);
    check_producer(&Gpu::new(&[sources::GEMV]), "kiln_gemv_bf16", &w, &values);
}

#[test]
fn the_bf16_gemv_scales_its_rows_of_x() {
    let (w, values) = bf16_matrix(2);
    check_consumer(&Gpu::new(&[sources::GEMV]), "kiln_gemv_bf16", &w, &values);
}

#[test]
fn a_packed_gemv_adds_the_residual_and_scales_its_rows_of_x() {
    let gpu = Gpu::new(&[sources::GEMV_Q8_0]);
    let (packed, values) = random_blocks(QuantType::Q8_0, N, K, 3);
    check_producer(&gpu, "kiln_gemv_q8_0", &packed, &values);
    check_consumer(&gpu, "kiln_gemv_q8_0", &packed, &values);
}

/// Producer then consumer, as a decode step chains them, against the add +
/// norm kernel (norm.cu) and a plain GEMV of its output.
#[test]
fn folded_the_norm_gives_what_its_own_launch_gives() {
    let gpu = Gpu::new(&[sources::GEMV, sources::NORM]);
    let mut rng = Rng::new(4);
    let (first, _) = bf16s(&rng.data(N * K, 0.5));
    let (second, _) = bf16s(&rng.data(K * N, 0.5));
    let (w1, w2) = (gpu.up(&first), gpu.up(&second));
    let (x, residual, gain) = (rng.data(K, 1.0), rng.data(N, 2.0), rng.data(N, 1.0));
    let (xs, residual_at, gain_at) = (gpu.up(&x), gpu.up(&residual), gpu.up(&gain));
    // Unfused: W1·x, then the add + norm kernel, then W2 of its output.
    let (a, h, normed, y) = (
        gpu.zeros(N * 4),
        gpu.zeros(N * 4),
        gpu.zeros(N * 4),
        gpu.zeros(K * 4),
    );
    // W [rows, k] times one row of x, with a folded norm's words and row
    // scales (`group`'s last argument).
    let one_row = |(w, rows, k): (DevicePtr, usize, usize), x, out, fold: ([u64; 7], DevicePtr)| {
        let args = [group(&[(w, rows)], &[out], 0, fold), Ptr(x), int(1), int(k)];
        let grid = ((rows as u32).div_ceil(WARPS), 1);
        gpu.run("kiln_gemv_bf16_m1", grid, 32 * WARPS, &args);
    };
    let unfolded = ([0; 7], 0);
    one_row((w1, N, K), xs, a, unfolded);
    let norm_args = [
        Ptr(residual_at),
        Ptr(a),
        Ptr(gain_at),
        Ptr(h),
        Ptr(normed),
        int(N),
        KernelArg::F32(EPS),
        KernelArg::F32(0.0),
        int(0),
    ];
    gpu.run("kiln_add_rms_norm", (1, 1), 256, &norm_args);
    one_row((w2, K, N), normed, y, unfolded);
    // Folded: W1 writes h, h · g and s; W2 scales by s.
    let (h_folded, g_folded, y_folded) = (gpu.zeros(N * 4), gpu.zeros(N * 4), gpu.zeros(K * 4));
    let n_blocks = N.div_ceil(WARPS as usize);
    let (partials, counter, scales) = (gpu.zeros(n_blocks * 4), gpu.zeros(4), gpu.zeros(4));
    let norm = Norm {
        residual: residual_at,
        sum: h_folded,
        gain: gain_at,
        partials,
        counter,
        scales,
        offset: 0.0,
    };
    one_row((w1, N, K), xs, g_folded, (norm.words(), 0));
    one_row((w2, K, N), g_folded, y_folded, ([0; 7], scales));
    let pairs = [
        ("the residual stream", h, h_folded, N, 1e-6),
        ("the consumer's products", y, y_folded, K, 2e-6),
    ];
    for (what, unfused, folded, len, tolerance) in pairs {
        let want: Vec<f32> = gpu.down(unfused, len);
        close(
            &gpu.down(folded, len),
            &want,
            tolerance * largest(&want),
            what,
        );
    }
}
