//! Greedy's pick inside the decode GEMV of the logits (`gemv.cuh`'s
//! `KilnGemvArgmax`): for every row of x, the first largest logit (NaN as
//! -inf), as the sampler's greedy pick finds it over the logits the same
//! launch writes, in every split of a row among warps, one and several rows
//! of x, dense and packed matrices; ties across blocks go to the first
//! index, and the block counter is left at zero for the next launch.

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
/// Rows of the logits' matrix (a vocabulary): hundreds of blocks.
const VOCAB: usize = 600;
const K: usize = 256;

/// The `KilnGemvGroup` of one matrix `w` writing `y`, with greedy's pick
/// (`KilnGemvArgmax`: keys, counter, tokens).
fn group(w: DevicePtr, y: DevicePtr, picks: [DevicePtr; 3]) -> KernelArg {
    let mut words = vec![1u64, VOCAB as u64, 0, 0, 0, w, 0, 0, 0, y, 0, 0, 0];
    words.push(0); // no activation
    words.extend([0; 13]); // no rotation
    words.extend(picks);
    words.extend([0; 8]); // no norm folded in (`KilnGemvNorm`, `row_scales`)
    KernelArg::Struct(words)
}

/// The sampler's greedy pick of a row: its first largest value, NaN as
/// -inf (`first_largest_row` in sampling.cu, `adjusted_pick` on the host).
fn first_largest(row: &[f32]) -> u32 {
    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if key(v) > key(row[best]) {
            best = i;
        }
    }
    best as u32
}

/// W's rows with the cases a pick must get right: rows 7 and 412 equal
/// (far apart: different blocks) and scaled to give the largest logits
/// (for x of their signs), and a row of NaN (its logits NaN, which never
/// win).
fn logits_matrix(rng: &mut Rng) -> Vec<f32> {
    let mut w = rng.data(VOCAB * K, 0.5);
    let winner: Vec<f32> = w[7 * K..8 * K].iter().map(|v| 8.0 * v).collect();
    w[7 * K..8 * K].copy_from_slice(&winner);
    w[412 * K..413 * K].copy_from_slice(&winner);
    w[100 * K..101 * K].fill(f32::NAN);
    w
}

/// Runs `kernel` (every split, and `_m1` for a single row of x) on the
/// matrix at `w` with greedy's pick, twice on one counter, and checks each
/// row's pick against the logits the launch wrote; x's first row is
/// `winner_x` (the tied rows win there), the others random.
fn check_picks(gpu: &Gpu, kernel: &str, w: DevicePtr, winner_x: &[f32]) {
    let mut rng = Rng::new(3);
    let counter = gpu.zeros(4);
    for m in [1, 3, 8] {
        let mut x = winner_x.to_vec();
        x.extend(rng.data((m - 1) * K, 1.0));
        let xs = gpu.up(&x);
        let names: Vec<&str> = if m == 1 { vec!["", "_m1"] } else { vec![""] };
        for one in names {
            for (suffix, split) in SPLITS {
                let name = format!("{kernel}{one}{suffix}");
                for round in 0..2 {
                    let (y, keys, tokens) =
                        (gpu.zeros(m * VOCAB * 4), gpu.zeros(8 * 8), gpu.zeros(8 * 4));
                    let args = [
                        group(w, y, [keys, counter, tokens]),
                        Ptr(xs),
                        int(m),
                        int(K),
                    ];
                    let blocks = (VOCAB as u32).div_ceil(WARPS / split);
                    gpu.run(&name, (blocks, 1), 32 * WARPS, &args);
                    let logits: Vec<f32> = gpu.down(y, m * VOCAB);
                    let want: Vec<u32> = logits.chunks_exact(VOCAB).map(first_largest).collect();
                    let got: Vec<u32> = gpu.down(tokens, m);
                    let what = format!("{name} m={m} round {round}");
                    assert_eq!(got, want, "{what}: picks");
                    assert_eq!(
                        want[0], 7,
                        "{what}: the tied rows win row 0 of x at the first"
                    );
                    assert_eq!(
                        gpu.down::<u32>(counter, 1),
                        [0],
                        "{what}: the counter is left at zero"
                    );
                }
            }
        }
    }
}

/// x whose products with the scaled row are the largest: the row's signs.
fn winner_x(w: &[f32]) -> Vec<f32> {
    w[7 * K..8 * K].iter().map(|v| v.signum()).collect()
}

#[test]
fn the_bf16_gemv_of_the_logits_picks_each_rows_first_largest() {
    let gpu = Gpu::new(&[sources::GEMV]);
    let w = logits_matrix(&mut Rng::new(1));
    let bits: Vec<u16> = w.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
    check_picks(&gpu, "kiln_gemv_bf16", gpu.up(&bits), &winner_x(&w));
    check_picks(&gpu, "kiln_gemv_f32", gpu.up(&w), &winner_x(&w));
}

#[test]
fn a_packed_gemv_of_the_logits_picks_each_rows_first_largest() {
    let gpu = Gpu::new(&[sources::GEMV_Q8_0]);
    let (mut packed, mut values) = random_blocks(QuantType::Q8_0, VOCAB, K, 5);
    // Rows 7 and 412 the same blocks: tied logits far apart.
    let row_bytes = packed.len() / VOCAB;
    let row = packed[7 * row_bytes..8 * row_bytes].to_vec();
    packed[412 * row_bytes..413 * row_bytes].copy_from_slice(&row);
    let decoded = values[7 * K..8 * K].to_vec();
    values[412 * K..413 * K].copy_from_slice(&decoded);
    check_picks(&gpu, "kiln_gemv_q8_0", gpu.up(&packed), &winner_x(&values));
}
