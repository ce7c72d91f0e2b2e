//! The decode GEMV of q, k and v with the rotary embedding applied in the
//! launch (`gemv.cuh`'s rotated `KilnGemvGroup`) against the GEMV without it
//! followed by `kiln_rope_write_kv`: the same bits in the rotated q and k,
//! in v and in the paged cache (f32 and bf16), for NeoX and interleaved
//! pairs, every split of a row among warps, one and several rows of x.

mod common;

use common::ragged::RaggedBatch;
use common::*;
use half::bf16;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::{self, Ptr, F32};
use kiln_kernels::cuda::{Device, DevicePtr, LaunchConfig};
use kiln_kernels::dense::attention::CacheLayout;

/// Query heads, key/value heads, head size, row length of x.
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 32;
const K: usize = 64;

/// The `KilnGemvGroup` of q, k and v (bf16 rows) writing `outputs`, with
/// `rope`'s words (13, `KilnGemvRope`) or none.
fn group(matrices: [DevicePtr; 3], outputs: [DevicePtr; 3], rope: Option<[u64; 13]>) -> KernelArg {
    let rows = [HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM];
    let mut words = vec![3u64];
    let mut end = 0;
    words.extend((0..4).map(|i| {
        end += rows.get(i).copied().unwrap_or(0) as u64;
        end
    }));
    words.extend(matrices.iter().copied().chain([0]));
    words.extend(outputs.iter().copied().chain([0]));
    words.push(0);
    words.extend(rope.unwrap_or([0; 13]));
    words.extend([0; 3]); // no greedy pick (`KilnGemvArgmax`)
    words.extend([0; 8]); // no norm folded in (`KilnGemvNorm`, `row_scales`)
    KernelArg::Struct(words)
}

/// One cache (f32 or bf16 elements) uploaded from the batch's f32 values.
fn cache_up(gpu: &Gpu, values: &[f32], bf16_cache: bool) -> DevicePtr {
    match bf16_cache {
        true => gpu.up(&values
            .iter()
            .map(|&v| bf16::from_f32(v).to_bits())
            .collect::<Vec<u16>>()),
        false => gpu.up(values),
    }
}

fn cache_down(gpu: &Gpu, ptr: DevicePtr, len: usize, bf16_cache: bool) -> Vec<u32> {
    match bf16_cache {
        true => gpu
            .down::<u16>(ptr, len)
            .into_iter()
            .map(u32::from)
            .collect(),
        false => bits(&gpu.down::<f32>(ptr, len)),
    }
}

#[test]
fn the_rotated_gemv_writes_what_the_gemv_and_the_rotary_launch_write() {
    let gpu = Gpu::new(&[sources::GEMV, sources::ROPE]);
    let layout = CacheLayout {
        block_size: 4,
        num_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
    };
    let (q_rows, kv_rows) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let half = HEAD_DIM / 2;
    let mut rng = Rng::new(7);
    let weights: Vec<Vec<f32>> = [q_rows, kv_rows, kv_rows]
        .iter()
        .map(|&rows| rng.data(rows * K, 1.0))
        .collect();
    let bf16_rows = |w: &[f32]| {
        w.iter()
            .map(|&v| bf16::from_f32(v).to_bits())
            .collect::<Vec<u16>>()
    };
    let matrices = [0, 1, 2].map(|i| gpu.up(&bf16_rows(&weights[i])));
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / HEAD_DIM as f32))
        .collect();
    let inv_freq = gpu.up(&inv_freq);
    // Decode rows: one sequence, and three (contexts across block edges).
    for shapes in [vec![(6, 1)], vec![(7, 1), (12, 1), (3, 1)]] {
        let batch = RaggedBatch::new(&mut rng, layout, &shapes);
        let m = batch.rows;
        let x = gpu.up(&rng.data(m * K, 1.0));
        let positions: Vec<i64> = shapes.iter().map(|&(c, _)| c as i64 - 1).collect();
        let positions = gpu.up(&positions);
        let metadata = batch.metadata(&gpu);
        let (row_offsets, context_lens, tables) = match metadata[..3] {
            [Ptr(a), Ptr(b), Ptr(c)] => (a, b, c),
            _ => unreachable!("metadata starts with three pointers"),
        };
        for (interleaved, bf16_cache, (suffix, split)) in [
            (false, true, ("", 1)),
            (true, false, ("", 1)),
            (false, false, ("_s2", 2)),
            (true, true, ("_s4", 4)),
        ] {
            let kernel = match m {
                1 => format!("kiln_gemv_bf16_m1{suffix}"),
                _ => format!("kiln_gemv_bf16{suffix}"),
            };
            // Blocks hold whole pairs: two rows at least (eight warps for
            // four a row).
            let warps = 4.max(2 * split);
            let config = LaunchConfig::linear(
                ((q_rows + 2 * kv_rows) * split).div_ceil(warps) as u32,
                32 * warps as u32,
            );
            let what =
                format!("{kernel}, {m} rows, interleaved {interleaved}, bf16 cache {bf16_cache}");
            let caches = || {
                (
                    cache_up(&gpu, &batch.k_cache, bf16_cache),
                    cache_up(&gpu, &batch.v_cache, bf16_cache),
                )
            };
            let outputs = || [q_rows, kv_rows, kv_rows].map(|rows| gpu.zeros(m * rows * 4));

            // The GEMV, then the rotary launch writing the cache.
            let (k_cache, v_cache) = caches();
            let lin = outputs();
            let plain = [group(matrices, lin, None), Ptr(x), int(m), int(K)];
            gpu.dev.launch(gpu.f(&kernel), config, &plain).unwrap();
            let (q_rot, k_rot) = (gpu.zeros(m * q_rows * 4), gpu.zeros(m * kv_rows * 4));
            let rope = [
                &[
                    Ptr(lin[0]),
                    Ptr(positions),
                    Ptr(inv_freq),
                    Ptr(q_rot),
                    int(HEADS),
                    int(half),
                    int(usize::from(interleaved)),
                    F32(1.0),
                    Ptr(lin[1]),
                    Ptr(k_rot),
                    int(KV_HEADS),
                    int(0),
                    head_norms(None),
                    Ptr(lin[2]),
                    Ptr(k_cache),
                    Ptr(v_cache),
                ][..],
                &metadata,
            ]
            .concat();
            let name = if bf16_cache {
                "kiln_rope_write_kv_bf16"
            } else {
                "kiln_rope_write_kv"
            };
            // Three blocks a row of 32 threads, each taking every third
            // stretch of the rotations and of the values' copy.
            gpu.run(name, (m as u32, 3), 32, &rope);

            // The rotated GEMV.
            let (k_cache2, v_cache2) = caches();
            let lin2 = outputs();
            let (q_rot2, k_rot2) = (gpu.zeros(m * q_rows * 4), gpu.zeros(m * kv_rows * 4));
            let words = [
                positions,
                inv_freq,
                q_rot2,
                k_rot2,
                k_cache2,
                v_cache2,
                row_offsets,
                context_lens,
                tables,
                u64::from(1f32.to_bits()) | (half as u64) << 32,
                u64::from(interleaved) | u64::from(bf16_cache) << 32,
                shapes.len() as u64 | (batch.per_seq as u64) << 32,
                layout.block_size as u64,
            ];
            let rotated = [group(matrices, lin2, Some(words)), Ptr(x), int(m), int(K)];
            gpu.dev.launch(gpu.f(&kernel), config, &rotated).unwrap();

            let same = |a: DevicePtr, b: DevicePtr, len: usize, name: &str| {
                let (a, b) = (
                    bits(&gpu.down::<f32>(a, len)),
                    bits(&gpu.down::<f32>(b, len)),
                );
                assert!(a == b, "{what}: {name} differs");
            };
            same(q_rot, q_rot2, m * q_rows, "rotated q");
            same(k_rot, k_rot2, m * kv_rows, "rotated k");
            same(lin[2], lin2[2], m * kv_rows, "v");
            let cache_len = batch.k_cache.len();
            for (a, b, name) in [
                (k_cache, k_cache2, "k cache"),
                (v_cache, v_cache2, "v cache"),
            ] {
                let (a, b) = (
                    cache_down(&gpu, a, cache_len, bf16_cache),
                    cache_down(&gpu, b, cache_len, bf16_cache),
                );
                assert!(a == b, "{what}: {name} differs");
            }
            // The step's keys did land in the cache (not both unwritten).
            let before = cache_down(
                &gpu,
                cache_up(&gpu, &batch.k_cache, bf16_cache),
                cache_len,
                bf16_cache,
            );
            let after = cache_down(&gpu, k_cache2, cache_len, bf16_cache);
            assert!(before != after, "{what}: no key written");
        }
    }
}
