//! The tensor-core products of GGUF-block matrices with batches of up to 64
//! rows (`qmatmul.cu`) on the kernel emulator, whose `mma_bf16_16816` models
//! the instruction's fragment layout: every format, against a dot product
//! in f64 over the CPU's decoding of the same bytes and x, both rounded to
//! bf16 as the kernel rounds them. Tiles cut by the matrix's rows and by
//! the rows of x, more than one tile of x rows, rows of several 128-column
//! stretches with a partial last one, K split among blocks (their sums
//! added by each tile's last block), groups of matrices in one launch, a
//! gated MLP's activation, and outputs stored in half types; and dense bf16
//! matrices through the same kernel (`kiln_qmm_bf16`).

mod common;

use common::*;
use half::bf16;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::{self, Ptr};
use kiln_kernels::cuda::{Device, DevicePtr, LaunchConfig};
use kiln_kernels::quant::QuantType;

/// Rows of W and of x per block (`KILN_QMM_TILE`).
const TILE: usize = 64;
/// Rows of x per block of the `_m16` kernels, which the host takes up to
/// 16 rows of x.
const M16_TILE: usize = 16;
/// Columns per stretch (`KILN_QMM_K`).
const STRETCH: usize = 128;
/// Matrices a launch covers at most (`KILN_QMM_MAX_GROUP`).
const MAX_GROUP: usize = 4;

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

/// One launch's matrices: W [n, k] in `ty` of each `rows` entry, x [m, k],
/// their outputs, the reference of each, and the scratch.
struct Case {
    ty: Option<QuantType>,
    kernel: String,
    /// Rows of x per block: 16 (the `_m16` kernel) or 64.
    x_tile: usize,
    rows: Vec<usize>,
    k: usize,
    m: usize,
    w: Vec<DevicePtr>,
    x: DevicePtr,
    y: Vec<DevicePtr>,
    want: Vec<(Vec<f32>, Vec<f32>)>,
    partials: DevicePtr,
    counters: DevicePtr,
}

impl Case {
    /// `ty`: the GGUF format, or none for dense bf16.
    fn new(
        gpu: &Gpu,
        (ty, name): (Option<QuantType>, &str),
        rows: &[usize],
        k: usize,
        m: usize,
    ) -> Self {
        let x: Vec<f32> = Rng::new(m as u64)
            .data(m * k, 1.0)
            .into_iter()
            .map(round_bf16)
            .collect();
        let x_bits: Vec<u16> = x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
        let (mut w, mut y, mut want) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &n) in rows.iter().enumerate() {
            let seed = (n * k + m + i) as u64;
            let (stored, values) = match ty {
                Some(ty) => random_blocks(ty, n, k, seed),
                None => {
                    let values: Vec<f32> = Rng::new(seed).data(n * k, 1.0);
                    let bits = values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes());
                    (bits.collect(), values)
                }
            };
            let w_bf16: Vec<f32> = values.iter().map(|&v| round_bf16(v)).collect();
            want.push(reference(&w_bf16, &x, m, n, k));
            w.push(gpu.up(&stored));
            y.push(gpu.zeros(m * n * 4));
        }
        let tiles: usize = rows.iter().map(|n| n.div_ceil(TILE)).sum();
        // The host's choice: the `_m16` kernel up to 16 rows of x.
        let (kernel, x_tile) = match m <= M16_TILE {
            true => (format!("kiln_qmm_{name}_m16"), M16_TILE),
            false => (format!("kiln_qmm_{name}"), TILE),
        };
        Self {
            ty,
            kernel,
            x_tile,
            rows: rows.to_vec(),
            k,
            m,
            w,
            x: gpu.up(&x_bits),
            y,
            want,
            // Room for up to 8 splits.
            partials: gpu.zeros(8 * m * tiles * TILE * 4),
            counters: gpu.zeros(tiles * m.div_ceil(M16_TILE) * 4),
        }
    }

    /// The same product through the kernel of 64 rows of x a block.
    fn wide(mut self) -> Self {
        self.kernel = self.kernel.trim_end_matches("_m16").to_owned();
        self.x_tile = TILE;
        self
    }

    /// The `KilnQmmGroup` argument: every member, or (gated) the first two
    /// as gate and up.
    fn group(&self, activation: usize, out_type: usize) -> KernelArg {
        let mut words = vec![self.rows.len() as u64];
        let mut tiles_end = [0u64; MAX_GROUP];
        let (mut rows, mut w, mut y) = ([0u64; MAX_GROUP], [0u64; MAX_GROUP], [0u64; MAX_GROUP]);
        let mut tiles = 0;
        for (i, &n) in self.rows.iter().enumerate() {
            tiles += n.div_ceil(TILE) as u64;
            (tiles_end[i], rows[i], w[i], y[i]) = (tiles, n as u64, self.w[i], self.y[i]);
        }
        words.extend(tiles_end);
        words.extend(rows);
        words.extend(w);
        words.extend(y);
        words.extend([activation as u64, out_type as u64]);
        KernelArg::Struct(words)
    }

    /// Launches the product with K in `splits` parts (gated: the tiles of
    /// gate's rows, 32 a tile).
    fn run(&self, gpu: &Gpu, splits: usize, activation: usize, out_type: usize) {
        let stretches = self.k.div_ceil(STRETCH);
        let k_split = stretches.div_ceil(splits) * STRETCH;
        let tiles = match activation {
            0 => self.rows.iter().map(|n| n.div_ceil(TILE)).sum(),
            _ => self.rows[0].div_ceil(TILE / 2),
        };
        let mut config = LaunchConfig::linear(1, 128);
        config.grid = (
            tiles as u32,
            self.m.div_ceil(self.x_tile) as u32,
            self.k.div_ceil(k_split) as u32,
        );
        let args = [
            self.group(activation, out_type),
            Ptr(self.x),
            Ptr(self.partials),
            Ptr(self.counters),
            int(self.m),
            int(self.k),
            int(k_split),
        ];
        let launched = gpu.dev.launch(gpu.f(&self.kernel), config, &args);
        launched.unwrap_or_else(|e| panic!("{}: {e}", self.kernel));
        let counters: Vec<u32> = gpu.down(self.counters, tiles * self.m.div_ceil(self.x_tile));
        assert!(
            counters.iter().all(|&c| c == 0),
            "{}: counters left at zero",
            self.kernel
        );
    }

    /// Member `i`'s output against its reference.
    fn check(&self, gpu: &Gpu, i: usize, what: &str) -> Vec<f32> {
        let (want, size) = &self.want[i];
        let n = self.rows[i];
        let got: Vec<f32> = gpu.down(self.y[i], self.m * n);
        for (j, ((g, w), s)) in got.iter().zip(want).zip(size).enumerate() {
            // f32 sums in another order; a weight whose f32 decoding differs
            // from the CPU's in the last bit may round to the neighbouring
            // bf16.
            let tolerance = 3e-5 * s + 1e-2 * s / self.k as f32;
            assert!(
                (g - w).abs() <= tolerance,
                "{} {:?} {what}: member {i} y[{}, {}] = {g}, want {w} (±{tolerance:.2e})",
                self.kernel,
                self.ty,
                j / n,
                j % n
            );
        }
        got
    }
}

const FORMATS: [(Option<QuantType>, &str, usize); 13] = [
    (Some(QuantType::Q8_0), "q8_0", 32 * 13),
    (Some(QuantType::Q4_0), "q4_0", 32 * 9),
    (Some(QuantType::Q5_0), "q5_0", 32 * 9),
    (Some(QuantType::Q4K), "q4_k", 256 * 3),
    (Some(QuantType::Q5K), "q5_k", 256 * 3),
    (Some(QuantType::Q6K), "q6_k", 256 * 2),
    // Rows of 424: three stretches and 5 blocks of 8 of a fourth.
    (None, "bf16", 8 * 53),
    (Some(QuantType::IQ4NL), "iq4_nl", 32 * 9),
    (Some(QuantType::IQ4XS), "iq4_xs", 256 * 3),
    (Some(QuantType::Q2K), "q2_k", 256 * 3),
    (Some(QuantType::Q3K), "q3_k", 256 * 3),
    (Some(QuantType::Q4_1), "q4_1", 32 * 9),
    (Some(QuantType::Q5_1), "q5_1", 32 * 9),
];

#[test]
fn every_format_on_tensor_cores_matches_the_reference() {
    let gpu = Gpu::new(&[sources::QMATMUL]);
    // 70 rows of W: a second tile cut short; k of 416 (Q8_0): three
    // stretches and a partial fourth of one block.
    for (ty, name, k) in FORMATS {
        for (m, splits) in [(9, 1), (16, 2), (40, 1), (64, 3), (70, 2)] {
            let case = Case::new(&gpu, (ty, name), &[70], k, m);
            case.run(&gpu, splits, 0, 0);
            case.check(&gpu, 0, &format!("m={m} splits={splits}"));
        }
        // Few rows through the kernel of 64 rows of x a block too.
        let case = Case::new(&gpu, (ty, name), &[70], k, 9).wide();
        case.run(&gpu, 2, 0, 0);
        case.check(&gpu, 0, "m=9 splits=2, 64 rows of x a block");
    }
}

#[test]
fn a_group_of_matrices_is_one_launch() {
    let gpu = Gpu::new(&[sources::QMATMUL]);
    // q, k and v of unequal rows, none a whole number of tiles: each
    // member's tiles start at its own row 0 and write its own output.
    for (ty, name, k) in [FORMATS[0], FORMATS[3], FORMATS[6]] {
        for (m, splits) in [(12, 1), (33, 3), (70, 2)] {
            let case = Case::new(&gpu, (ty, name), &[100, 36, 36], k, m);
            case.run(&gpu, splits, 0, 0);
            for i in 0..3 {
                case.check(&gpu, i, &format!("group m={m} splits={splits}"));
            }
        }
    }
}

#[test]
fn a_gated_pair_writes_its_activation() {
    let gpu = Gpu::new(&[sources::QMATMUL]);
    let silu = |g: f32| g / (1.0 + (-g).exp());
    for (ty, name, k) in [FORMATS[1], FORMATS[4], FORMATS[6]] {
        for (m, splits) in [(10, 1), (64, 2)] {
            // Gate's and up's 72 rows: three tiles of 32 pairs, the last cut.
            let case = Case::new(&gpu, (ty, name), &[72, 72], k, m);
            case.run(&gpu, splits, 0, 0);
            let gate = case.check(&gpu, 0, "gate");
            let up = case.check(&gpu, 1, "up");
            let exact: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
            gpu.dev
                .upload(case.y[1], &bytes(&vec![7f32; m * 72]))
                .unwrap();
            case.run(&gpu, splits, 1, 0);
            let got: Vec<f32> = gpu.down(case.y[0], m * 72);
            for (j, (g, e)) in got.iter().zip(&exact).enumerate() {
                let what = format!("{name} silu(gate)·up m={m} splits={splits} at {j}");
                assert!(
                    (g - e).abs() <= 1e-6 * e.abs() + 1e-6,
                    "{what}: {g}, want {e}"
                );
            }
            let untouched: Vec<f32> = gpu.down(case.y[1], m * 72);
            assert!(
                untouched.iter().all(|&v| v == 7.0),
                "up's output is not written"
            );
            // Stored in a half type for the product that reads it: the f32
            // result rounded once.
            gpu.check_half_stores(case.y[0], &got, "gated qmm", |out_type| {
                case.run(&gpu, splits, 1, out_type)
            });
        }
    }
}
