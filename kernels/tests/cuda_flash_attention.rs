//! The tensor-core attention kernels on the kernel emulator (which runs
//! their `mma.sync` products through a warp-level model of the same fragment
//! layout), against the CPU's paged attention over the same bf16 or E4M3
//! cache: `flash_attention.cu` over ragged batches of whole prompts, chunks
//! that start mid-sequence and decode rows, several query and key tiles;
//! `decode_attention.cu` over decode rows and short chunks, whole and split
//! (flash-decoding); GQA, sliding windows and soft caps; each head size the
//! kernels are built for. Also the emulated tensor-core product alone
//! against a plain matrix product.

mod common;

use common::ragged::RaggedBatch;
use common::*;
use kiln_kernels::cuda::KernelArg::{Ptr, F32};
use kiln_kernels::cuda::{flash, sources, Device, DevicePtr, LaunchConfig};
use kiln_kernels::dense::attention::{self as attn, AttentionParams, CacheLayout};

/// The tensor-core kernel under test.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    /// `kiln_flash_attention_*`: blocks of 4 warps take 128 query rows of one
    /// head.
    Flash,
    /// `kiln_decode_attention_bf16_*`: a block per (row, key/value head,
    /// split); run whole, in two splits and in splits of one cache block.
    Decode,
}

/// Largest |tensor cores - reference|. The kernel rounds q and the softmax weights
/// to bf16 for the products; the reference takes the same rounded q, so what
/// remains is the weights' rounding (2⁻⁹ relative each; about 1e-3 seen).
const FLASH_TOL: f32 = 4e-3;

/// The cache's element type: bf16, or E4M3 (the `_fp8` kernels).
#[derive(Clone, Copy, Debug)]
enum Cache {
    Bf16,
    Fp8,
}

impl Cache {
    /// `values` as the cache holds them, uploaded.
    fn up(self, gpu: &Gpu, values: &[f32]) -> DevicePtr {
        match self {
            Cache::Bf16 => gpu.up(&bf16s(values).0),
            Cache::Fp8 => gpu.up(&e4m3(values).0),
        }
    }

    /// The values the cache holds for `values` (the float8 crate's encoding).
    fn held(self, values: &[f32]) -> Vec<f32> {
        match self {
            Cache::Bf16 => bf16s(values).1,
            Cache::Fp8 => e4m3(values).1,
        }
    }

    /// Bytes a cache element.
    fn bytes(self) -> usize {
        match self {
            Cache::Bf16 => 2,
            Cache::Fp8 => 1,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Cache::Bf16 => "bf16",
            Cache::Fp8 => "fp8",
        }
    }
}

/// One ragged batch: `shape` is (heads, kv heads, head_dim, block size),
/// `shapes` (context after the step, rows fed) per sequence.
fn flash_case(
    gpu: &Gpu,
    kernel: Kernel,
    cache: Cache,
    shape: (usize, usize, usize, usize),
    shapes: &[(usize, usize)],
    window: Option<usize>,
    cap: Option<f32>,
) {
    let (heads, kv_heads, d, bs) = shape;
    let what = format!(
        "{kernel:?} {cache:?} heads {heads}/{kv_heads}, d {d}, block {bs}, {shapes:?}, {window:?}, {cap:?}"
    );
    let mut rng = Rng::new((heads * 1000 + d * 10 + bs) as u64);
    let layout = CacheLayout {
        block_size: bs,
        num_kv_heads: kv_heads,
        head_dim: d,
    };
    let batch = RaggedBatch::new(&mut rng, layout, shapes);
    let stride = kv_heads * d;
    let rows = batch.rows;
    // The device cache in bf16 or E4M3; the CPU's holds the same values in
    // f32.
    let (kc, vc) = (cache.up(gpu, &batch.k_cache), cache.up(gpu, &batch.v_cache));
    let (k, v) = (rng.data(rows * stride, 1.0), rng.data(rows * stride, 1.0));
    let q = rng.data(rows * heads * d, 1.0);
    let metadata = batch.metadata(gpu);
    let args = [Ptr(gpu.up(&k)), Ptr(gpu.up(&v)), Ptr(kc), Ptr(vc)];
    let args = [&args[..], &metadata, &[int(stride)]].concat();
    let write = format!("kiln_write_kv_{}", cache.suffix());
    gpu.run(&write, (rows as u32, 1), 128, &args);
    let (mut kh, mut vh) = (batch.k_cache.clone(), batch.v_cache.clone());
    let seqs = batch.sequences();
    attn::write_kv(layout, &mut kh, &mut vh, &k, &v, &seqs);
    let (kh, vh) = (cache.held(&kh), cache.held(&vh));

    let scale = 1.0 / (d as f32).sqrt();
    let params = AttentionParams {
        scale,
        sliding_window: window,
        softcap: cap,
    };
    let mut want = vec![0f32; q.len()];
    attn::paged_attention(
        layout,
        &kh,
        &vh,
        &bf16s(&q).1,
        &mut want,
        heads,
        &seqs,
        params,
    );
    let q_in = gpu.up(&q);
    let (window, cap) = (int(window.unwrap_or(0)), F32(cap.unwrap_or(0.0)));
    let sizes = [int(heads), int(kv_heads)];
    // Runs the kernel into a fresh `out` and checks it, stored in f32 and, for
    // the output projection, in bf16 or f16 (the f32 result rounded).
    let check = |what: &str, run: &dyn Fn(DevicePtr, usize)| {
        let out = gpu.up(&vec![f32::NAN; q.len()]);
        run(out, 0);
        let got: Vec<f32> = gpu.down(out, want.len());
        close(&got, &want, FLASH_TOL, what);
        gpu.check_half_stores(out, &got, what, |t| run(out, t));
        let worst = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        println!("{what}: max |Δ| {worst:.1e}");
    };
    let head = |out| {
        [
            &[Ptr(q_in), Ptr(kc), Ptr(vc), Ptr(out)][..],
            &metadata,
            &sizes,
        ]
        .concat()
    };
    match kernel {
        Kernel::Flash => {
            // Blocks of 4 warps take 128 query rows of one head.
            let tiles = rows.div_ceil(flash::ROWS) + shapes.len();
            let name = format!("kiln_flash_attention_{}_d{d}", cache.suffix());
            let config = LaunchConfig {
                shared_bytes: flash::shared_bytes(d, cache.bytes()),
                ..LaunchConfig::new((heads as u32, tiles as u32, 1), (flash::THREADS, 1, 1))
            };
            check(&what, &|out, out_type| {
                let tail = [F32(scale), window.clone(), cap.clone(), int(out_type)];
                let args = [&head(out)[..], &tail].concat();
                gpu.dev.launch(gpu.f(&name), config, &args).unwrap();
            });
        }
        Kernel::Decode => {
            let name = format!("kiln_decode_attention_{}_d{d}", cache.suffix());
            let per_seq = batch.per_seq;
            for splits in [1, 2, per_seq] {
                let split_keys = per_seq.div_ceil(splits) * bs;
                let partials = gpu.zeros(rows * heads * splits * (d + 2) * 4);
                let counters = gpu.zeros(rows * kv_heads * 4);
                let (split_keys, partials) = match splits {
                    1 => (0, 0),
                    _ => (split_keys, partials),
                };
                let what = format!("{what}, {splits} splits");
                check(&what, &|out, out_type| {
                    let tail = [F32(scale), window.clone(), cap.clone(), int(split_keys)];
                    let split = [Ptr(partials), Ptr(counters), int(out_type)];
                    let args = [&head(out)[..], &[int(d)], &tail, &split].concat();
                    let mut config = LaunchConfig::linear(rows as u32, 128);
                    config.grid = (rows as u32, kv_heads as u32, splits as u32);
                    gpu.dev.launch(gpu.f(&name), config, &args).unwrap();
                    let left: Vec<u32> = gpu.down(counters, rows * kv_heads);
                    assert!(
                        left.iter().all(|&c| c == 0),
                        "{what}: counters left {left:?}"
                    );
                });
            }
        }
    }
}

/// Every head size over `cache`: a whole prompt of three query tiles of 128
/// rows (the last one partial, six key tiles for it to stream), a chunk of
/// 70 rows starting at position 130, a decode row with 90 keys behind it, a
/// short prompt, and a chunk whose first row (position 62) sees all but the
/// last key of the first key tile (the edge of the unmasked tiles); a window
/// and a cap.
fn flash_cases(gpu: &Gpu, cache: Cache) {
    let mixed = [(330, 330), (200, 70), (91, 1), (17, 17), (100, 38)];
    flash_case(
        gpu,
        Kernel::Flash,
        cache,
        (4, 2, 64, 16),
        &mixed,
        None,
        None,
    );
    flash_case(
        gpu,
        Kernel::Flash,
        cache,
        (2, 1, 128, 16),
        &mixed,
        Some(40),
        None,
    );
    let short = [(130, 130), (100, 33)];
    flash_case(
        gpu,
        Kernel::Flash,
        cache,
        (3, 3, 96, 8),
        &short,
        None,
        Some(0.5),
    );
}

#[test]
fn flash_attention_matches_the_cpu_over_a_bf16_cache() {
    let gpu = Gpu::new(&[sources::ATTENTION, sources::FLASH_ATTENTION]);
    flash_cases(&gpu, Cache::Bf16);
    // A window narrower than a key tile, over blocks of 4 positions.
    let cache = Cache::Bf16;
    flash_case(
        &gpu,
        Kernel::Flash,
        cache,
        (8, 2, 64, 4),
        &[(160, 96)],
        Some(5),
        Some(2.0),
    );
}

/// Rows one at a time on tensor cores: decode rows with long and short
/// contexts (one cached position), a chunk mid-sequence and a short prompt;
/// a key/value head of 4, 8 (the most), 7, 1 and 2 query heads; heads of
/// 64, 128 and 256; cache blocks of 16 positions (a chunk of keys a block),
/// 4 and 8 (four and two); windows narrower and wider than a chunk, and
/// caps.
fn decode_cases(gpu: &Gpu, cache: Cache) {
    let mixed = [(330, 1), (91, 1), (40, 7), (17, 17), (2, 1)];
    // (heads, kv heads, head_dim, block size), window, cap.
    let cases = [
        ((8, 2, 64, 16), None, None),
        ((8, 1, 128, 4), Some(40), None),
        ((14, 2, 128, 16), None, Some(0.5)),
        ((3, 3, 64, 8), Some(5), Some(2.0)),
        // Gemma's heads of 256 (V loaded once S is done).
        ((8, 4, 256, 16), Some(40), Some(0.5)),
    ];
    for (shape, window, cap) in cases {
        flash_case(gpu, Kernel::Decode, cache, shape, &mixed, window, cap);
    }
}

#[test]
fn decode_attention_matches_the_cpu_over_a_bf16_cache() {
    let gpu = Gpu::new(&[sources::ATTENTION, sources::DECODE_ATTENTION]);
    decode_cases(&gpu, Cache::Bf16);
}

/// Over an E4M3 cache each lane's loaded values are widened to bf16 pairs
/// in registers.
#[test]
fn decode_attention_matches_the_cpu_over_an_fp8_cache() {
    let gpu = Gpu::new(&[sources::ATTENTION, sources::DECODE_ATTENTION]);
    decode_cases(&gpu, Cache::Fp8);
}

/// Over an E4M3 cache (`--kv-cache-dtype fp8`), each key/value tile is
/// copied to a staging buffer and widened to bf16 by the thread that copied
/// it.
#[test]
fn flash_attention_matches_the_cpu_over_an_fp8_cache() {
    let gpu = Gpu::new(&[sources::ATTENTION, sources::FLASH_ATTENTION]);
    flash_cases(&gpu, Cache::Fp8);
}

/// A kernel that loads A [16, 16] and B [16, 8] (bf16, row-major) into the
/// documented fragments, multiplies them once and stores D [16, 8].
const MMA_PROBE: &str = r#"
#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_mma_probe(const bf16_bits* a, const bf16_bits* b, float* d) {
  int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  unsigned fa[4], fb[2];
  for (int r = 0; r < 4; ++r) {
    int row = g + 8 * (r % 2), col = 2 * t + 8 * (r / 2);
    fa[r] = (unsigned)a[row * 16 + col] | ((unsigned)a[row * 16 + col + 1] << 16);
  }
  for (int r = 0; r < 2; ++r) {
    int k = 2 * t + 8 * r;
    fb[r] = (unsigned)b[k * 8 + g] | ((unsigned)b[(k + 1) * 8 + g] << 16);
  }
  float acc[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  mma_bf16_16816(acc, fa, fb);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}
"#;

#[test]
fn the_emulated_tensor_core_product_is_a_matrix_product() {
    let mut gpu = Gpu::new(&[]);
    gpu.load("mma_probe.cu", MMA_PROBE);
    let mut rng = Rng::new(7);
    let ((a_bits, a), (b_bits, b)) = (bf16s(&rng.data(256, 2.0)), bf16s(&rng.data(128, 2.0)));
    let d = gpu.zeros(128 * 4);
    let args = [Ptr(gpu.up(&a_bits)), Ptr(gpu.up(&b_bits)), Ptr(d)];
    gpu.run("kiln_mma_probe", (1, 1), 32, &args);
    let want: Vec<f32> = (0..128)
        .map(|i| {
            let (row, col) = (i / 8, i % 8);
            1.0 + (0..16)
                .map(|k| a[row * 16 + k] * b[k * 8 + col])
                .sum::<f32>()
        })
        .collect();
    gpu.check(d, &want, "D = A·B + 1");
}
