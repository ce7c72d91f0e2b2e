//! The hand-written CUDA kernels (`kernels/cuda/*.cu`) run on the kernel
//! emulator against the CPU kernels of `dense`: norms (with a fused residual
//! add) and softmax, rotary embeddings, embeddings, gathers, strided copies
//! and bit-exact f32 ↔ bf16/f16 conversions (paged attention is in
//! `cuda_attention.rs`). Also the
//! emulator itself: its GEMM, capture and replay semantics, the divergent
//! barrier error, barriers that really interleave threads, bounds checks,
//! misaligned loads and stores, launch sizes a GPU refuses.

use std::fmt::Debug;

use half::{bf16, f16};
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::{self, Ptr, F32};
use kiln_kernels::cuda::{Device, DevicePtr, Gemm, GemmType};
use kiln_kernels::cuda::{LaunchConfig, WeightLayout};
use kiln_kernels::dense::{norm, rope};

mod common;
use common::*;

#[test]
fn norms_and_softmax_match_the_cpu() {
    let gpu = Gpu::new(&[sources::NORM]);
    let (mut rng, rows) = (Rng::new(1), 3);
    for block in [32, 256] {
        for cols in [1usize, 33, 200, 1000] {
            let what = format!("block {block}, {cols} columns");
            let x = rng.data(rows * cols, 3.0);
            let (w, beta) = (rng.data(cols, 1.0), rng.data(cols, 1.0));
            let (xp, wp, bp) = (gpu.up(&x), gpu.up(&w), gpu.up(&beta));
            let y = gpu.zeros(rows * cols * 4);
            let grid = (rows as u32, 1);
            let mut want = vec![0f32; rows * cols];
            // The norm of x, and of a + b = x (with a + b written too).
            let b = rng.data(rows * cols, 1.0);
            let a: Vec<f32> = x.iter().zip(&b).map(|(x, b)| x - b).collect();
            check_rms_norms(&gpu, "", [&x, &a, &b], &w, block, &what);
            let args = [Ptr(xp), Ptr(wp), Ptr(bp), Ptr(y), int(cols), F32(1e-5)];
            gpu.run("kiln_layer_norm", grid, block, &args);
            norm::layer_norm_rows(&x, &w, &beta, 1e-5, &mut want);
            gpu.check(y, &want, &format!("layer_norm, {what}"));
            for log in [0, 1] {
                let args = [Ptr(xp), Ptr(y), int(cols), int(1), int(log)];
                gpu.run("kiln_softmax", grid, block, &args);
                want.copy_from_slice(&x);
                match log {
                    0 => norm::softmax_rows(&mut want, cols),
                    _ => norm::log_softmax_rows(&mut want, cols),
                }
                gpu.check(y, &want, &format!("softmax log={log}, {what}"));
            }
        }
    }
}

/// `kiln_rms_norm{suffix}` of `x` and `kiln_add_rms_norm{suffix}` of
/// `a + b` (rows of `w.len()` values), both with weight offsets 0 and 1, on
/// blocks of `block` threads, against the CPU; the sum written too. Stored
/// in bf16 or f16 (for products that read x in that type), the norm is the
/// f32 result rounded to nearest even, and the sum still f32.
fn check_rms_norms(
    gpu: &Gpu,
    suffix: &str,
    [x, a, b]: [&[f32]; 3],
    w: &[f32],
    block: u32,
    what: &str,
) {
    let (cols, rows) = (w.len(), x.len() / w.len());
    let sum: Vec<f32> = a.iter().zip(b).map(|(a, b)| a + b).collect();
    let (xp, ap, bp, wp) = (gpu.up(x), gpu.up(a), gpu.up(b), gpu.up(w));
    let (xs, y) = (gpu.zeros(rows * cols * 4), gpu.zeros(rows * cols * 4));
    let grid = (rows as u32, 1);
    let mut want = vec![0f32; rows * cols];
    // `kernel` (arguments by out_type) run storing f32, checked against
    // `want`, then storing each half type: the f32 result rounded.
    let check =
        |kernel: String, args: &dyn Fn(usize) -> Vec<KernelArg>, want: &[f32], what: &str| {
            let what = format!("{kernel}, {what}");
            gpu.check_stores(y, want, &what, |t| gpu.run(&kernel, grid, block, &args(t)));
        };
    for offset in [0.0, 1.0] {
        let what = format!("weight offset {offset}, {what}");
        let tail = |out_type| [F32(1e-6), F32(offset), int(out_type)];
        let plain =
            |out_type| [&[Ptr(xp), Ptr(wp), Ptr(y), int(cols)][..], &tail(out_type)].concat();
        norm::rms_norm_rows(x, w, offset, 1e-6, &mut want);
        check(format!("kiln_rms_norm{suffix}"), &plain, &want, &what);
        let operands = [Ptr(ap), Ptr(bp), Ptr(wp), Ptr(xs), Ptr(y), int(cols)];
        let fused = |out_type| [&operands[..], &tail(out_type)].concat();
        norm::rms_norm_rows(&sum, w, offset, 1e-6, &mut want);
        check(format!("kiln_add_rms_norm{suffix}"), &fused, &want, &what);
        gpu.check(xs, &sum, &format!("add_rms_norm{suffix} sum, {what}"));
    }
}

/// The RMS norms that hold a row in registers (`_chunks`: two 16-byte
/// chunks a thread): rows that fill every chunk, leave the second partial,
/// or use one chunk of one thread.
#[test]
fn chunked_rms_norms_match_the_cpu() {
    let gpu = Gpu::new(&[sources::NORM]);
    let (mut rng, rows) = (Rng::new(2), 3);
    for (block, cols) in [(32, 4usize), (32, 200), (128, 1000), (256, 2048)] {
        let (a, b) = (rng.data(rows * cols, 3.0), rng.data(rows * cols, 1.0));
        let w = rng.data(cols, 1.0);
        let what = format!("block {block}, {cols} columns");
        check_rms_norms(&gpu, "_chunks", [&a, &a, &b], &w, block, &what);
    }
}

#[test]
fn rope_matches_the_cpu() {
    let gpu = Gpu::new(&[sources::ROPE]);
    // Half a head of 8: cos and sin once per token in shared memory; of 300
    // (past KILN_ROPE_MAX_HALF): per pair.
    for half in [8, 300] {
        rope_case(&gpu, half);
    }
}

fn rope_case(gpu: &Gpu, half: usize) {
    let heads = 5;
    let positions: Vec<i64> = vec![7, 8, 9, 300];
    let freq = |i: usize| 10000f32.powf(-(i as f32) / half as f32);
    let inv_freq: Vec<f32> = (0..half).map(freq).collect();
    let x = Rng::new(2).data(positions.len() * heads * 2 * half, 1.0);
    let (xp, pp, fp) = (gpu.up(&x), gpu.up(&positions), gpu.up(&inv_freq));
    let y = gpu.zeros(x.len() * 4);
    for interleaved in [0, 1] {
        for scale in [1.0, 0.75] {
            let args = [Ptr(xp), Ptr(pp), Ptr(fp), Ptr(y), int(heads), int(half)];
            let args = [&args[..], &[int(interleaved), F32(scale)]].concat();
            let alone = [
                &args[..],
                &[Ptr(0), Ptr(0), int(0), int(0), head_norms(None)],
            ]
            .concat();
            let alone_into = |out| {
                let mut a = alone.clone();
                a[3] = Ptr(out);
                a
            };
            // 32 threads for 5 · half (head, pair)s: the stride loop runs
            // several times; with three blocks a row, each takes every
            // third stretch.
            let mut want = x.clone();
            let pairs = interleaved == 1;
            rope::rope(&mut want, &positions, &inv_freq, heads, pairs, scale);
            for blocks in [1, 3] {
                let y = gpu.zeros(x.len() * 4);
                gpu.run(
                    "kiln_rope",
                    (positions.len() as u32, blocks),
                    32,
                    &alone_into(y),
                );
                let what = format!(
                    "half {half}, interleaved {pairs}, scale {scale}, {blocks} blocks a row"
                );
                gpu.check(y, &want, &what);
            }
            let what = format!("half {half}, interleaved {pairs}, scale {scale}");
            gpu.run("kiln_rope", (positions.len() as u32, 1), 32, &alone);
            // With a second tensor of 2 heads (k with q) in the same launch.
            let x2 = Rng::new(3).data(positions.len() * 2 * 2 * half, 1.0);
            let (x2p, y2) = (gpu.up(&x2), gpu.zeros(x2.len() * 4));
            let tail = [Ptr(x2p), Ptr(y2), int(2), int(0), head_norms(None)];
            let paired = [&args[..], &tail].concat();
            gpu.run("kiln_rope", (positions.len() as u32, 1), 32, &paired);
            let mut want2 = x2.clone();
            rope::rope(&mut want2, &positions, &inv_freq, 2, pairs, scale);
            gpu.check(y, &want, &format!("{what}, paired: first"));
            gpu.check(y2, &want2, &format!("{what}, paired: second"));
            // Both read from one stacked row a token (x's heads, x2's, then
            // three values more), as q and k from their stacked product.
            let (w1, w2) = (heads * 2 * half, 2 * 2 * half);
            let stride = w1 + w2 + 3;
            let mut stacked = vec![0.0; positions.len() * stride];
            for t in 0..positions.len() {
                stacked[t * stride..][..w1].copy_from_slice(&x[t * w1..][..w1]);
                stacked[t * stride + w1..][..w2].copy_from_slice(&x2[t * w2..][..w2]);
            }
            let sp = gpu.up(&stacked);
            let (ys, y2s) = (gpu.zeros(x.len() * 4), gpu.zeros(x2.len() * 4));
            let mut strided = paired.clone();
            strided[0] = Ptr(sp);
            strided[3] = Ptr(ys);
            strided[8] = Ptr(sp + (w1 * 4) as u64);
            strided[9] = Ptr(y2s);
            strided[11] = int(stride);
            gpu.run("kiln_rope", (positions.len() as u32, 2), 32, &strided);
            gpu.check(ys, &want, &format!("{what}, stacked rows: first"));
            gpu.check(y2s, &want2, &format!("{what}, stacked rows: second"));
        }
    }
}

/// Rows of 37 (within a thread's eight values of a block of 32 threads) and
/// of 300 (two passes, the last partial).
#[test]
fn embedding_reads_rows_and_flags_bad_ids() {
    let gpu = Gpu::new(&[sources::DATA]);
    for cols in [37usize, 300] {
        embedding_case(&gpu, 6, cols);
    }
}

fn embedding_case(gpu: &Gpu, rows: usize, cols: usize) {
    let table = Rng::new(3).data(rows * cols, 2.0);
    let (as_bf16, bf16_values) = round(&table, BF16);
    let (as_f16, f16_values) = round(&table, F16);
    let tables: [(&str, DevicePtr, Vec<f32>); 3] = [
        ("kiln_embedding_f32", gpu.up(&table), table.clone()),
        ("kiln_embedding_bf16", gpu.up(&as_bf16), bf16_values),
        ("kiln_embedding_f16", gpu.up(&as_f16), f16_values),
    ];
    // An embedding id is never wrapped: -1 is out of range.
    for (ids, bad) in [(vec![5i64, 0, 3, 3], 0), (vec![2, 6, -1, 1], 1)] {
        for (name, tp, values) in &tables {
            let (error, y) = (gpu.up(&[0i32]), gpu.up(&vec![f32::NAN; ids.len() * cols]));
            let ptrs = [Ptr(*tp), Ptr(gpu.up(&ids)), Ptr(y)];
            let tail = [long(rows), int(cols), Ptr(error), row_norm(None)];
            let args = [&ptrs[..], &tail].concat();
            gpu.run(name, (ids.len() as u32, 1), 32, &args);
            let row = |id: i64| match usize::try_from(id) {
                Ok(r) if r < rows => values[r * cols..(r + 1) * cols].to_vec(),
                _ => vec![0.0; cols],
            };
            let want: Vec<f32> = ids.iter().flat_map(|&id| row(id)).collect();
            let got: Vec<f32> = gpu.down(y, want.len());
            assert!(
                bits(&got) == bits(&want),
                "{name} {ids:?}, {cols} columns: {got:?}"
            );
            assert_eq!(gpu.down::<i32>(error, 1), [bad], "{name} {ids:?}");
        }
    }
}

#[test]
fn gather_picks_along_a_middle_axis() {
    let gpu = Gpu::new(&[sources::DATA]);
    let (outer, axis, inner) = (2usize, 5usize, 3usize);
    let x: Vec<u32> = (1000..1000 + (outer * axis * inner) as u32).collect();
    let xp = gpu.up(&x);
    // -2 counts from the end; 5 is past the axis.
    for (ids, bad) in [(vec![4i64, 0, -2, 2], 0), (vec![1, 5], 1)] {
        let total = outer * ids.len() * inner;
        let (error, y) = (gpu.up(&[0i32]), gpu.up(&vec![u32::MAX; total]));
        let sizes = [long(outer), long(ids.len()), long(axis), long(inner)];
        let ptrs = [Ptr(xp), Ptr(gpu.up(&ids)), Ptr(y)];
        let args = [&ptrs[..], &sizes, &[Ptr(error)]].concat();
        gpu.run("kiln_gather_b4", (2, 1), 8, &args);
        let mut want = vec![];
        for o in 0..outer {
            for &id in &ids {
                let id = usize::try_from(if id < 0 { id + axis as i64 } else { id });
                match id.ok().filter(|&i| i < axis) {
                    Some(i) => want.extend_from_slice(&x[(o * axis + i) * inner..][..inner]),
                    None => want.extend(vec![0; inner]),
                }
            }
        }
        assert_eq!(gpu.down::<u32>(y, total), want, "{ids:?}");
        assert_eq!(gpu.down::<i32>(error, 1), [bad], "{ids:?}");
    }
}

/// `struct KilnStrided` as C lays it out: `int rank` padded to 8 bytes, then
/// shape, in_stride and out_stride (8 × i64 each), in_offset, out_offset, count.
fn strided(shape: &[i64], in_stride: &[i64], out_stride: &[i64], offsets: (i64, i64)) -> KernelArg {
    let mut words = vec![shape.len() as u64];
    for list in [shape, in_stride, out_stride] {
        let mut padded = [0i64; 8];
        padded[..list.len()].copy_from_slice(list);
        words.extend(padded.map(|v| v as u64));
    }
    words.extend([offsets.0, offsets.1, shape.iter().product()].map(|v| v as u64));
    assert_eq!(words.len() * 8, 224);
    KernelArg::Struct(words)
}

fn copy_strided<T: Elem + PartialEq + Debug>(gpu: &Gpu, name: &str, make: fn(usize) -> T) {
    // Permutation: y [4, 2, 3] = x [2, 3, 4] with axes (2, 0, 1).
    let x: Vec<T> = (0..24).map(make).collect();
    let (xp, y) = (gpu.up(&x), gpu.zeros(24 * T::SIZE));
    let s = strided(&[4, 2, 3], &[1, 12, 4], &[6, 3, 1], (0, 0));
    gpu.run(name, (2, 1), 8, &[Ptr(xp), Ptr(y), s]);
    let mut want = vec![];
    for a in 0..4 {
        for b in 0..2 {
            want.extend((0..3).map(|c| x[b * 12 + c * 4 + a]));
        }
    }
    assert_eq!(gpu.down::<T>(y, 24), want, "{name}: permute");
    // Slice x [5, 10][1.., 1..;2] into y [2 + 4·5] at offset 2.
    let x: Vec<T> = (0..50).map(make).collect();
    let (xp, y) = (gpu.up(&x), gpu.up(&[make(99), make(98)].repeat(11)));
    let s = strided(&[4, 5], &[10, 2], &[5, 1], (11, 2));
    gpu.run(name, (1, 1), 32, &[Ptr(xp), Ptr(y), s]);
    let mut want = vec![make(99), make(98)];
    for r in 1..5 {
        want.extend((0..5).map(|c| x[r * 10 + 1 + 2 * c]));
    }
    assert_eq!(gpu.down::<T>(y, 22), want, "{name}: slice");
}

#[test]
fn strided_copies_permute_and_slice() {
    let gpu = Gpu::new(&[sources::DATA]);
    copy_strided(&gpu, "kiln_copy_strided_b4", |i| {
        0x1000_0001u32.wrapping_mul(i as u32)
    });
    copy_strided(&gpu, "kiln_copy_strided_b8", |i| {
        (i as i64) << 40 | i as i64
    });
    copy_strided(&gpu, "kiln_copy_strided_b1", |i| (i * 37) as u8);
}

/// A stacked product's output [3, 40 + 8 + 24] of u32 (10, 2 and 6 units of
/// 16 bytes a row) split to its three members' outputs, by blocks of fewer
/// threads than a row's units (threads stride over the rest).
#[test]
fn a_stacked_output_splits_into_its_members_columns() {
    let gpu = Gpu::new(&[sources::DATA]);
    let (rows, widths) = (3, [40, 8, 24]);
    let cols: usize = widths.iter().sum();
    let x: Vec<u32> = (0..rows * cols)
        .map(|i| 0x0100_0003u32.wrapping_mul(i as u32 + 1))
        .collect();
    let outs: Vec<DevicePtr> = widths.iter().map(|w| gpu.zeros(rows * w * 4)).collect();
    let mut words = vec![3u64, 0, 10, 12, 18, 0];
    words.extend(&outs);
    words.push(0);
    gpu.run(
        "kiln_split_columns",
        (1, rows as u32),
        4,
        &[Ptr(gpu.up(&x)), KernelArg::Struct(words)],
    );
    let mut first = 0;
    for (out, width) in outs.into_iter().zip(widths) {
        let want: Vec<u32> = (0..rows)
            .flat_map(|r| x[r * cols + first..r * cols + first + width].to_vec())
            .collect();
        assert_eq!(
            gpu.down::<u32>(out, rows * width),
            want,
            "member of {width} columns"
        );
        first += width;
    }
}

/// A 16-bit float format through the `half` crate: (f32 → bits, bits → f32).
type Half = (fn(f32) -> u16, fn(u16) -> f32);
const BF16: Half = (
    |v| bf16::from_f32(v).to_bits(),
    |b| bf16::from_bits(b).to_f32(),
);
const F16: Half = (
    |v| f16::from_f32(v).to_bits(),
    |b| f16::from_bits(b).to_f32(),
);

/// `values` rounded to a format: the bits and their values.
fn round(values: &[f32], (to, from): Half) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = values.iter().map(|&v| to(v)).collect();
    let rounded = bits.iter().map(|&b| from(b)).collect();
    (bits, rounded)
}

/// Specials (as bits: ±0, 1, ±inf, NaNs, f32 extremes and subnormals, the f16
/// overflow edge 65504 / 65519.996 / 65520, f16's subnormal edges), then every
/// 29th f16 and 37th bf16 value with the midpoint to its neighbour and the
/// floats either side of it, both signs, then random bit patterns.
fn conversion_inputs() -> Vec<f32> {
    let specials = [
        0x00000000, 0x80000000, 0x3f800000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
        0x7f800001, 0x7f7fffff, 0xff7fffff, 0x00800000, 0x00000001, 0x807fffff, 0x477fe000,
        0x477fefff, 0x477ff000, 0x47800000, 0x501502f9, 0xf149f2ca, 0x33800000, 0x33000000,
        0x33000001, 0x38800000, 0x387fc000,
    ];
    let mut v: Vec<f32> = specials.map(f32::from_bits).to_vec();
    for ((_, from), last, step) in [(F16, 0x7bff, 29), (BF16, 0x7f7f, 37)] {
        for bits in (0..last).step_by(step) {
            let (a, b) = (from(bits), from(bits + 1));
            let mid = a + (b - a) / 2.0;
            for x in [a, mid, mid.next_up(), mid.next_down()] {
                v.extend([x, -x]);
            }
        }
    }
    let mut rng = Rng::new(4);
    v.extend((0..1500).map(|_| f32::from_bits(rng.u32())));
    v
}

#[test]
fn conversions_round_like_the_half_crate() {
    let gpu = Gpu::new(&[sources::DATA]);
    let x = conversion_inputs();
    let (n, xp) = (x.len(), gpu.up(&x));
    let narrow = [
        ("kiln_f32_to_bf16", BF16, 0x7f80),
        ("kiln_f32_to_f16", F16, 0x7c00),
    ];
    for (name, (to, _), nan_above) in narrow {
        let y = gpu.zeros(n * 2);
        gpu.run(name, (4, 1), 128, &[Ptr(xp), Ptr(y), long(n)]);
        for (&v, got) in x.iter().zip(gpu.down::<u16>(y, n)) {
            let (bits, want) = (v.to_bits(), to(v));
            let nan = got & 0x7fff > nan_above;
            let ok = if v.is_nan() { nan } else { got == want };
            assert!(ok, "{name}({v:e} = {bits:#x}): {got:#x}, want {want:#x}");
        }
    }
    // Back, for every 16-bit pattern.
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let ap = gpu.up(&all);
    for (name, (_, from)) in [("kiln_bf16_to_f32", BF16), ("kiln_f16_to_f32", F16)] {
        let y = gpu.zeros(all.len() * 4);
        gpu.run(name, (8, 1), 256, &[Ptr(ap), Ptr(y), long(all.len())]);
        for (&b, got) in all.iter().zip(gpu.down::<f32>(y, all.len())) {
            let want = from(b);
            let same = got.to_bits() == want.to_bits();
            let ok = if want.is_nan() { got.is_nan() } else { same };
            assert!(ok, "{name}({b:#06x}) = {got:e}, want {want:e}");
        }
    }
}

#[test]
fn gemm_matches_a_naive_product() {
    let gpu = Gpu::new(&[]);
    let (m, n, k) = (3, 5, 17);
    let mut rng = Rng::new(5);
    for ty in [GemmType::F32, GemmType::BF16, GemmType::F16] {
        // Values rounded to the element type: the naive product uses exactly
        // what the device sees.
        let mut operand = |len: usize| -> (Vec<f32>, DevicePtr) {
            let v = rng.data(len, 1.0);
            let (bits, rounded) = match ty {
                GemmType::F32 => return (v.clone(), gpu.up(&v)),
                GemmType::BF16 => round(&v, BF16),
                GemmType::F16 => round(&v, F16),
            };
            (rounded, gpu.up(&bits))
        };
        // y in f32, and in the operands' half type (rounded results).
        let outputs = match ty {
            GemmType::F32 => [(GemmType::F32, None), (GemmType::F32, None)],
            GemmType::BF16 => [(GemmType::F32, None), (ty, Some(BF16))],
            GemmType::F16 => [(GemmType::F32, None), (ty, Some(F16))],
        };
        for (layout, (y_type, half)) in [WeightLayout::OutIn, WeightLayout::InOut]
            .into_iter()
            .flat_map(|layout| outputs.map(|output| (layout, output)))
        {
            let ((x, xp), (w, wp)) = (operand(m * k), operand(n * k));
            let y = gpu.zeros(m * n * 4);
            let gemm = Gemm {
                m,
                n,
                k,
                ty,
                x: xp,
                w: wp,
                layout,
                y,
                y_type,
            };
            gpu.dev.gemm(&gemm).unwrap();
            let weight = |j: usize, p: usize| match layout {
                WeightLayout::OutIn => w[j * k + p],
                WeightLayout::InOut => w[p * n + j],
            };
            let term =
                |i: usize, j: usize, p: usize| f64::from(x[i * k + p]) * f64::from(weight(j, p));
            let dot = |i: usize, j: usize| (0..k).map(|p| term(i, j, p)).sum::<f64>();
            let want: Vec<f32> = (0..m * n).map(|e| dot(e / n, e % n) as f32).collect();
            let what = format!("{ty:?} {layout:?} into {y_type:?}");
            match half {
                None => gpu.check(y, &want, &what),
                Some((_, from)) => {
                    // Within half a unit of the half type's last place.
                    let half_ulp = if y_type == GemmType::BF16 {
                        0.5f32.powi(8)
                    } else {
                        0.5f32.powi(11)
                    };
                    for (e, b) in gpu.down::<u16>(y, m * n).into_iter().enumerate() {
                        let (got, want) = (from(b), want[e]);
                        let ok = (got - want).abs() <= want.abs() * half_ulp + 1e-6;
                        assert!(ok, "{what}: {got} at {e}, want {want}");
                    }
                }
            }
        }
    }
}

#[test]
fn replay_reuses_captured_arguments_but_reads_current_memory() {
    let gpu = Gpu::new(&[sources::NORM]);
    let (rows, cols) = (2, 40);
    let mut rng = Rng::new(6);
    let (x, w) = (rng.data(rows * cols, 2.0), rng.data(cols, 1.0));
    let (xp, wp, y) = (gpu.up(&x), gpu.up(&w), gpu.zeros(rows * cols * 4));
    let reference = |x: &[f32], offset: f32| {
        let mut out = vec![0f32; x.len()];
        norm::rms_norm_rows(x, &w, offset, 1e-6, &mut out);
        out
    };
    let (dev, f) = (&gpu.dev, gpu.f("kiln_rms_norm"));
    let config = LaunchConfig::linear(rows as u32, 64);
    let mut args = vec![
        Ptr(xp),
        Ptr(wp),
        Ptr(y),
        int(cols),
        F32(1e-6),
        F32(0.0),
        int(0),
    ];
    dev.begin_capture().unwrap();
    dev.launch(f, config, &args).unwrap();
    let download = dev.download(y, &mut [0u8; 4]);
    assert!(download.is_err(), "a download cannot be captured");
    let graph = dev.end_capture().unwrap();
    let zeros = vec![0.0; rows * cols];
    gpu.check(y, &zeros, "capture must not run the launch");

    // The host would pass Gemma's offset now: the graph keeps offset 0.
    args[5] = F32(1.0);
    dev.replay(graph).unwrap();
    gpu.check(y, &reference(&x, 0.0), "replay");
    dev.launch(f, config, &args).unwrap();
    gpu.check(y, &reference(&x, 1.0), "fresh launch");

    // Device memory written between replays is what the replay reads.
    let x2 = rng.data(rows * cols, 2.0);
    dev.upload(xp, &bytes(&x2)).unwrap();
    dev.replay(graph).unwrap();
    gpu.check(y, &reference(&x2, 0.0), "replay, new input");
}

#[test]
fn a_readback_holds_the_bytes_of_its_place_in_the_stream() {
    let gpu = Gpu::new(&[sources::NORM]);
    let dev = &gpu.dev;
    let (a, b) = (gpu.up(&[1.0f32, 2.0]), gpu.up(&[3.0f32]));
    let waits = dev.host_waits();
    let first = dev.download_async(&[(a, 8), (b, 4)]).unwrap();
    // Work queued after the readback (the next step) does not change it.
    dev.upload(a, &bytes(&[9.0f32, 9.0])).unwrap();
    let second = dev.download_async(&[(a, 4)]).unwrap();
    assert_eq!(
        dev.wait_readback(first).unwrap(),
        bytes(&[1.0f32, 2.0, 3.0])
    );
    assert_eq!(dev.overlapped_waits(), 1, "the upload was queued behind it");
    assert_eq!(dev.wait_readback(second).unwrap(), bytes(&[9.0f32]));
    assert_eq!(dev.overlapped_waits(), 1, "nothing was queued behind it");
    assert_eq!(dev.host_waits() - waits, 2);
    assert!(
        dev.wait_readback(kiln_kernels::cuda::Readback(1)).is_err(),
        "a readback is collected once"
    );
    dev.begin_capture().unwrap();
    assert!(
        dev.download_async(&[(a, 4)]).is_err(),
        "not during a capture"
    );
    dev.end_capture().unwrap();
}

#[test]
fn a_warp_vote_is_true_in_every_lane_when_any_lane_holds() {
    const SOURCE: &str = r#"#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_test_any(const int* holds, int* y) {
  y[threadIdx.x] = __any_sync(KILN_FULL_MASK, holds[threadIdx.x] != 0) ? 1 : 0;
}
"#;
    let mut gpu = Gpu::new(&[]);
    gpu.load("any.cu", SOURCE);
    // Warp 0: only lane 17 holds; warp 1: none does.
    let holds: Vec<i32> = (0..64).map(|i| i32::from(i == 17)).collect();
    let y = gpu.zeros(64 * 4);
    gpu.run("kiln_test_any", (1, 1), 64, &[Ptr(gpu.up(&holds)), Ptr(y)]);
    let got: Vec<i32> = gpu.down(y, 64);
    let want: Vec<i32> = (0..64).map(|i| i32::from(i < 32)).collect();
    assert_eq!(got, want);
}

#[test]
fn divergent_barrier_is_an_error() {
    const SOURCE: &str = r#"#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_test_divergent(float* y) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  y[threadIdx.x] = 1.0f;
}
"#;
    let mut gpu = Gpu::new(&[]);
    gpu.load("divergent.cu", SOURCE);
    let y = gpu.zeros(64 * 4);
    let result = gpu.try_run("kiln_test_divergent", (1, 1), 64, &[Ptr(y)]);
    let err = result.expect_err("a divergent barrier must fail");
    assert!(err.to_string().contains("different lines"), "{err}");
}

#[test]
fn a_programmatic_launch_must_wait_for_its_inputs_in_every_thread() {
    // Thread 0 returns before kiln_wait_inputs(): on a GPU, a write before
    // the wait could land while the previous kernel still reads.
    const SOURCE: &str = r#"#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_test_waits(float* y, int skip) {
  if ((int)threadIdx.x == skip) return;
  kiln_wait_inputs();
  y[threadIdx.x] = 1.0f;
}
"#;
    let mut gpu = Gpu::new(&[]);
    gpu.load("waits.cu", SOURCE);
    let y = gpu.zeros(64 * 4);
    let f = gpu.f("kiln_test_waits");
    let config = LaunchConfig {
        programmatic: true,
        ..LaunchConfig::linear(2, 64)
    };
    let err = gpu.dev.launch(f, config, &[Ptr(y), int(0)]);
    let err = err.expect_err("a thread returned without waiting");
    assert!(
        err.to_string()
            .contains("thread 0 of a programmatic launch"),
        "{err}"
    );
    gpu.dev.launch(f, config, &[Ptr(y), int(64)]).unwrap();
    // Launched plainly, nothing is checked.
    let plain = LaunchConfig::linear(2, 64);
    gpu.dev.launch(f, plain, &[Ptr(y), int(0)]).unwrap();
}

#[test]
fn a_misaligned_load_or_store_fails_its_launch_as_on_a_gpu() {
    // A 16-byte vector load, and a word store, at `offset` bytes into their
    // buffers: fine at multiples of their size, a fault on a GPU otherwise.
    // The third kernel has a barrier, so its threads run as fibers (the
    // others run them as plain calls): a failing thread is left either way.
    const SOURCE: &str = r#"#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_test_load(const unsigned char* x, float* y, int offset) {
  y[threadIdx.x] = __uint_as_float(load_streaming(x + offset + 16 * threadIdx.x).v[0]);
}
extern "C" __global__ void kiln_test_store(const unsigned char* x, unsigned char* y, int offset) {
  *reinterpret_cast<unsigned int*>(y + offset + 4 * threadIdx.x) = 1u;
}
extern "C" __global__ void kiln_test_store_barrier(const unsigned char* x, unsigned char* y, int offset) {
  __syncthreads();
  *reinterpret_cast<unsigned int*>(y + offset + 4 * threadIdx.x) = 1u;
}
"#;
    let mut gpu = Gpu::new(&[]);
    gpu.load("aligned.cu", SOURCE);
    let x = gpu.zeros(32 * 16 + 32);
    let y = gpu.zeros(32 * 4 + 32);
    let run =
        |name: &str, offset: usize| gpu.try_run(name, (2, 1), 32, &[Ptr(x), Ptr(y), int(offset)]);
    run("kiln_test_load", 16).expect("an aligned load");
    let err = run("kiln_test_load", 4)
        .expect_err("a 16-byte load at 4")
        .to_string();
    assert!(
        err.contains("misaligned") && err.contains("Bytes16"),
        "{err}"
    );
    assert!(err.contains("16-byte alignment"), "{err}");
    // Named by the header's own line, not the module's.
    assert!(err.contains("kiln_cuda.cuh:"), "{err}");
    for (name, line) in [("kiln_test_store", 6), ("kiln_test_store_barrier", 10)] {
        run(name, 8).expect("an aligned store");
        let err = run(name, 2).expect_err("a word at 2").to_string();
        assert!(err.contains("misaligned store to 'unsigned int'"), "{err}");
        assert!(err.contains(&format!("aligned.cu:{line}:")), "{err}");
    }
    run("kiln_test_load", 32).expect("the device carries on after a failed launch");
}

#[test]
fn a_launch_the_gpu_would_refuse_fails() {
    const SOURCE: &str = r#"#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_test_nothing(float* y) {}
"#;
    let mut gpu = Gpu::new(&[]);
    gpu.load("nothing.cu", SOURCE);
    let f = gpu.f("kiln_test_nothing");
    let y = gpu.zeros(4);
    let launch = |grid, block, shared_bytes| {
        let config = LaunchConfig {
            shared_bytes,
            ..LaunchConfig::new(grid, block)
        };
        gpu.dev.launch(f, config, &[Ptr(y)])
    };
    launch((1, 65_535, 1), (1, 1, 1), 0).expect("at the limit in y");
    launch((1, 1, 1), (1024, 1, 1), 99 * 1024).expect("at the limits of a block");
    launch((1, 1, 1), (8, 2, 64), 0).expect("at the limit in z");
    let refused = [
        ((0, 1, 1), (32, 1, 1), 0, "an empty grid"),
        ((1, 65_536, 1), (32, 1, 1), 0, "65,535 in y"),
        ((1, 1, 1), (0, 1, 1), 0, "an empty block"),
        ((1, 1, 1), (512, 4, 1), 0, "past 1,024 threads"),
        ((1, 1, 1), (1, 1, 65), 0, "64 in z"),
        ((1, 1, 1), (32, 1, 1), 99 * 1024 + 1, "99 KiB"),
    ];
    for (grid, block, shared, problem) in refused {
        let err = launch(grid, block, shared).expect_err(problem).to_string();
        assert!(err.contains(problem), "{err}");
    }
}

/// Sum of each row of `n` values: warp shuffles, then one partial per warp
/// through shared memory, then warp 0 adds the partials.
const REDUCTION: &str = r#"#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_test_row_sum(const float* x, float* y, int n) {
  __shared__ float partial[32];
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[(i64)blockIdx.x * n + i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(KILN_FULL_MASK, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(KILN_FULL_MASK, v, o);
    if (threadIdx.x == 0) y[blockIdx.x] = v;
  }
}
"#;

#[test]
fn a_write_past_the_dynamic_shared_memory_fails_its_launch() {
    const SOURCE: &str = r#"#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_test_shared_past(float* y, int n) {
  KILN_DYNAMIC_SHARED(float, tile);
  tile[threadIdx.x + n] = 1.0f;
  __syncthreads();
  y[threadIdx.x] = tile[threadIdx.x + n];
}
"#;
    let mut gpu = Gpu::new(&[]);
    gpu.load("shared_past.cu", SOURCE);
    let f = gpu.f("kiln_test_shared_past");
    let y = gpu.zeros(32 * 4);
    let launch = |offset: usize| {
        let config = LaunchConfig {
            shared_bytes: 32 * 4,
            ..LaunchConfig::linear(1, 32)
        };
        gpu.dev.launch(f, config, &[Ptr(y), int(offset)])
    };
    launch(0).expect("within its 128 bytes");
    let err = launch(1).expect_err("one float past").to_string();
    assert!(
        err.contains("past its 128 bytes of dynamic shared memory"),
        "{err}"
    );
}

#[test]
fn block_reduction_needs_its_barrier() {
    let (rows, n) = (3usize, 1000usize);
    // Small integers: every order of summation gives the exact sum.
    let x: Vec<f32> = (0..rows * n).map(|i| (i % 7 + i / n) as f32).collect();
    let want: Vec<f32> = x.chunks(n).map(|r| r.iter().sum()).collect();
    let racy = REDUCTION.replace("__syncthreads();", "");
    for (name, text) in [("reduce.cu", REDUCTION), ("reduce_racy.cu", &racy)] {
        let mut gpu = Gpu::new(&[]);
        gpu.load(name, text);
        let y = gpu.zeros(rows * 4);
        let args = [Ptr(gpu.up(&x)), Ptr(y), int(n)];
        gpu.run("kiln_test_row_sum", (rows as u32, 1), 256, &args);
        let got: Vec<f32> = gpu.down(y, rows);
        if text == REDUCTION {
            assert_eq!(got, want, "with the barrier");
        } else {
            // Warp 0 reads the other warps' partials before they are written.
            assert_ne!(got, want, "without the barrier");
        }
    }
}

#[test]
fn out_of_bounds_download_is_an_error() {
    let gpu = Gpu::new(&[]);
    let (dev, ptr) = (&gpu.dev, gpu.up(&[1.0f32, 2.0, 3.0, 4.0]));
    let mut out = [0u8; 16];
    assert!(dev.download(ptr, &mut out).is_ok());
    assert!(dev.download(ptr + 8, &mut out).is_err(), "past the end");
    let too_long = dev.download(ptr, &mut [0u8; 17]);
    assert!(too_long.is_err(), "one byte too many");
    let before = dev.download(ptr - 16, &mut out);
    assert!(before.is_err(), "before the start");
    dev.free(ptr);
    assert!(dev.download(ptr, &mut out).is_err(), "after free");
}
