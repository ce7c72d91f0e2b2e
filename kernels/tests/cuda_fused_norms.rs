//! RMS norms taken by the launches beside them, on the kernel emulator
//! against the CPU's `rms_norm_rows`: at a decoder's two ends
//! (host/src/runtime/cuda/end_norms.rs) an embedding's rows with the first
//! layer's norm (`KilnRowNorm`) and the last layer's add and norm of the
//! rows a gather picks (`kiln_add_rms_norm_rows`), and a product's
//! post-norm with the add and norm after it (`kiln_norm_add_rms_norm`,
//! post_norms.rs), each in its loop and `_chunks` variants; and q's and k's
//! per-head norms in their rotary launch (`KilnHeadNorms`, head_norms.rs).

mod common;
use common::*;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::{Ptr, F32};
use kiln_kernels::dense::{norm, rope};
use kiln_kernels::quant::QuantType;

const EPS: f32 = 1e-6;

/// Rows `ids` of `values [_, cols]` (negative ids from the end where
/// `wrap`), zeros for an id outside.
fn rows_of(values: &[f32], cols: usize, ids: &[i64], wrap: bool) -> Vec<f32> {
    let rows = (values.len() / cols) as i64;
    ids.iter()
        .flat_map(|&id| {
            let id = if wrap && id < 0 { id + rows } else { id };
            match usize::try_from(id) {
                Ok(r) if id < rows => values[r * cols..(r + 1) * cols].to_vec(),
                _ => vec![0.0; cols],
            }
        })
        .collect()
}

/// Dense tables (rows of 300 on blocks of 32: a partial second pass) and
/// GGUF blocks (Q8_0, 256 columns on 128 threads): with the norm, the rows
/// are the same bits as without, the norm is the CPU's of those rows
/// (weight offsets 0 and 1) stored in f32 and in each half type, and a bad
/// id's row is zeros and flagged; scaled (Gemma's √hidden), with or
/// without the norm, the rows are the bits of each value times the scale
/// and the norm is of those.
#[test]
fn embeddings_take_the_norm_of_their_rows() {
    let gpu = Gpu::new(&[sources::DATA, sources::GEMV_Q8_0]);
    let rows = 6;
    let mut rng = Rng::new(7);
    let dense = rng.data(rows * 300, 2.0);
    let (as_bf16, bf16_values) = bf16s(&dense);
    let (q8_0, q8_0_values) = random_blocks(QuantType::Q8_0, rows, 256, 3);
    let tables = [
        ("kiln_embedding_f32", gpu.up(&dense), dense.clone(), 32),
        ("kiln_embedding_bf16", gpu.up(&as_bf16), bf16_values, 32),
        ("kiln_embedding_q8_0", gpu.up(&q8_0), q8_0_values, 128),
    ];
    let ids = [5i64, 0, 9, 3];
    let idp = gpu.up(&ids);
    for (name, table, values, block) in &tables {
        let cols = values.len() / rows;
        let w = rng.data(cols, 1.0);
        let wp = gpu.up(&w);
        for (offset, scale) in [(0.0, 1.0), (1.0, 1.0), (1.0, 45.254833)] {
            let rows_want: Vec<f32> = rows_of(values, cols, &ids, false)
                .iter()
                .map(|v| v * scale)
                .collect();
            let mut want = vec![0f32; rows_want.len()];
            let what = format!("{name}, weight offset {offset}, scale {scale}");
            let bytes = rows_want.len() * 4;
            let (error, h, y) = (gpu.up(&[0i32]), gpu.zeros(bytes), gpu.zeros(bytes));
            let embed = |out, norm| {
                let head = [Ptr(*table), Ptr(idp), Ptr(out), long(rows), int(cols)];
                let args = [&head[..], &[Ptr(error), norm]].concat();
                gpu.run(name, (ids.len() as u32, 1), *block, &args);
            };
            let norm = |out_type| scaled_row_norm(Some((wp, y, EPS, offset, out_type)), scale);
            let run = |out_type| embed(h, norm(out_type));
            norm::rms_norm_rows(&rows_want, &w, offset, EPS, &mut want);
            gpu.check_stores(y, &want, &what, run);
            let got: Vec<f32> = gpu.down(h, rows_want.len());
            assert!(bits(&got) == bits(&rows_want), "{what}: the rows");
            assert_eq!(gpu.down::<i32>(error, 1), [1], "{what}: id 9 flagged");
            // The rows alone, scaled as with the norm.
            let alone = gpu.zeros(bytes);
            embed(alone, scaled_row_norm(None, scale));
            let got: Vec<f32> = gpu.down(alone, rows_want.len());
            assert!(
                bits(&got) == bits(&rows_want),
                "{what}: the rows without the norm"
            );
        }
    }
}

/// The gathered rows of `rms_norm(a + b)`: ids from the end too, a row
/// outside zeros and flagged, in the loop kernel (rows of 300 on 32
/// threads, 2,048 on 256) and the one holding a row in registers.
#[test]
fn the_last_norm_takes_only_the_gathered_rows() {
    let gpu = Gpu::new(&[sources::NORM]);
    let (mut rng, rows) = (Rng::new(11), 5);
    let cases = [
        ("kiln_add_rms_norm_rows", 32, 300),
        ("kiln_add_rms_norm_rows", 256, 2048),
        ("kiln_add_rms_norm_rows_chunks", 32, 200),
        ("kiln_add_rms_norm_rows_chunks", 256, 2048),
    ];
    for (kernel, block, cols) in cases {
        let (a, b) = (rng.data(rows * cols, 3.0), rng.data(rows * cols, 1.0));
        let w = rng.data(cols, 1.0);
        let (ap, bp, wp) = (gpu.up(&a), gpu.up(&b), gpu.up(&w));
        let sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
        let mut normed = vec![0f32; rows * cols];
        for offset in [0.0, 1.0] {
            norm::rms_norm_rows(&sum, &w, offset, EPS, &mut normed);
            for (ids, bad) in [(vec![4i64, 0, -1, 2], 0), (vec![1, 5, -6], 1)] {
                let what = format!("{kernel}, {cols} columns, offset {offset}, ids {ids:?}");
                let want = rows_of(&normed, cols, &ids, true);
                let (error, y) = (gpu.up(&[0i32]), gpu.up(&vec![f32::NAN; want.len()]));
                let idp = gpu.up(&ids);
                let run = |out_type| {
                    let inputs = [Ptr(ap), Ptr(bp), Ptr(wp), Ptr(idp), long(rows), Ptr(y)];
                    let tail = [int(cols), F32(EPS), F32(offset), int(out_type), Ptr(error)];
                    let grid = (ids.len() as u32, 1);
                    gpu.run(kernel, grid, block, &[&inputs[..], &tail].concat());
                };
                gpu.check_stores(y, &want, &what, run);
                assert_eq!(gpu.down::<i32>(error, 1), [bad], "{what}: flag");
            }
        }
    }
}

/// `x = r + rms_norm(p) · (offset + w1)` written and the norm of x with w2
/// (Gemma's post-norm, residual add and next norm), in the loop kernel and
/// the one holding a row in registers, with both weight offsets.
#[test]
fn a_post_norm_the_add_and_the_next_norm_run_as_one() {
    let gpu = Gpu::new(&[sources::NORM]);
    let (mut rng, rows) = (Rng::new(13), 3);
    let cases = [
        ("kiln_norm_add_rms_norm", 32, 300),
        ("kiln_norm_add_rms_norm", 256, 2048),
        ("kiln_norm_add_rms_norm_chunks", 32, 200),
        ("kiln_norm_add_rms_norm_chunks", 256, 2048),
    ];
    for (kernel, block, cols) in cases {
        let (p, r) = (rng.data(rows * cols, 40.0), rng.data(rows * cols, 1.0));
        let (w1, w2) = (rng.data(cols, 1.0), rng.data(cols, 1.0));
        let (pp, rp, w1p, w2p) = (gpu.up(&p), gpu.up(&r), gpu.up(&w1), gpu.up(&w2));
        let (mut post, mut want) = (vec![0f32; rows * cols], vec![0f32; rows * cols]);
        for (post_offset, offset) in [(0.0, 0.0), (1.0, 1.0), (1.0, 0.0)] {
            norm::rms_norm_rows(&p, &w1, post_offset, 1e-5, &mut post);
            let sum: Vec<f32> = r.iter().zip(&post).map(|(r, n)| r + n).collect();
            norm::rms_norm_rows(&sum, &w2, offset, EPS, &mut want);
            let what = format!("{kernel}, {cols} columns, offsets {post_offset} and {offset}");
            let (x, y) = (gpu.zeros(rows * cols * 4), gpu.zeros(rows * cols * 4));
            let run = |out_type| {
                let post = [Ptr(pp), Ptr(rp), Ptr(w1p), F32(1e-5), F32(post_offset)];
                let tail = [
                    Ptr(w2p),
                    Ptr(x),
                    Ptr(y),
                    int(cols),
                    F32(EPS),
                    F32(offset),
                    int(out_type),
                ];
                gpu.run(
                    kernel,
                    (rows as u32, 1),
                    block,
                    &[&post[..], &tail].concat(),
                );
            };
            gpu.check_stores(y, &want, &what, run);
            gpu.check(x, &sum, &format!("{what}: the sum"));
        }
    }
}

/// `kiln_rope` with q's and k's per-head norms (Qwen3's, Gemma 3's with
/// offset 1): each head normalized with its tensor's weight, then rotated,
/// as the CPU's norm and rotation one after the other; heads of 16 and 128
/// values, one block a token or three (each block works out every head's
/// scale).
#[test]
fn q_and_k_take_their_head_norms_in_the_rotary_launch() {
    let gpu = Gpu::new(&[sources::ROPE]);
    let (positions, heads, heads2) = (vec![0i64, 5, 17], 4, 2);
    let mut rng = Rng::new(17);
    for half in [8usize, 64] {
        let dim = 2 * half;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| 10000f32.powf(-(i as f32) / half as f32))
            .collect();
        let x = rng.data(positions.len() * heads * dim, 4.0);
        let x2 = rng.data(positions.len() * heads2 * dim, 4.0);
        let (w, w2) = (rng.data(dim, 1.0), rng.data(dim, 1.0));
        let up = |v: &[f32]| gpu.up(v);
        let (xp, x2p, wp, w2p) = (up(&x), up(&x2), up(&w), up(&w2));
        let (pp, fp) = (gpu.up(&positions), gpu.up(&inv_freq));
        for (offset, interleaved) in [(0.0, 0), (1.0, 1)] {
            let normed_rotated = |x: &[f32], w: &[f32], heads: usize| {
                let mut out = vec![0f32; x.len()];
                norm::rms_norm_rows(x, w, offset, EPS, &mut out);
                rope::rope(
                    &mut out,
                    &positions,
                    &inv_freq,
                    heads,
                    interleaved == 1,
                    1.0,
                );
                out
            };
            let (want, want2) = (
                normed_rotated(&x, &w, heads),
                normed_rotated(&x2, &w2, heads2),
            );
            for blocks in [1, 3] {
                let (y, y2) = (gpu.zeros(x.len() * 4), gpu.zeros(x2.len() * 4));
                let norms = head_norms(Some((wp, w2p, EPS, offset)));
                let head = [Ptr(xp), Ptr(pp), Ptr(fp), Ptr(y), int(heads), int(half)];
                let rest = [
                    int(interleaved),
                    F32(1.0),
                    Ptr(x2p),
                    Ptr(y2),
                    int(heads2),
                    int(0),
                ];
                let args = [&head[..], &rest, &[norms]].concat();
                gpu.run("kiln_rope", (positions.len() as u32, blocks), 32, &args);
                let what = format!("half {half}, offset {offset}, {blocks} blocks a token");
                gpu.check(y, &want, &format!("{what}: q"));
                gpu.check(y2, &want2, &format!("{what}: k"));
            }
        }
    }
}
