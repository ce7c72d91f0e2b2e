//! Paged attention's kernels (`attention.cu`) on the kernel emulator against
//! the CPU's `write_kv` and `paged_attention` over ragged batches (decode,
//! chunked prefill, GQA, windows, soft caps, split-K), over f32, bf16 and
//! E4M3 (`--kv-cache-dtype fp8`) caches; and the E4M3 conversions of
//! `kiln_cuda.cuh` against the float8 crate's (a port of cuda_fp8.hpp's).

mod common;

use common::ragged::RaggedBatch;
use common::*;
use float8::F8E4M3;
use kiln_kernels::cuda::sources;
use kiln_kernels::cuda::KernelArg::{Ptr, F32};
use kiln_kernels::cuda::{Device, LaunchConfig};
use kiln_kernels::dense::attention::{self as attn, AttentionParams, CacheLayout};

/// A paged-attention kernel under test: one block per (row, query head), or
/// per (row, key/value head, group of up to `n` of its query heads).
#[derive(Clone, Copy)]
enum Attention {
    PerHead(&'static str),
    Grouped(&'static str, usize),
}

impl Attention {
    fn name(self) -> &'static str {
        match self {
            Attention::PerHead(name) | Attention::Grouped(name, _) => name,
        }
    }

    /// The grid's second dimension for `heads` query heads over `kv_heads`.
    fn blocks_per_row(self, heads: usize, kv_heads: usize) -> usize {
        match self {
            Attention::PerHead(_) => heads,
            Attention::Grouped(_, n) => kv_heads * (heads / kv_heads).div_ceil(n),
        }
    }
}

/// One ragged batch through kiln_write_kv + `kernel` and the CPU write_kv +
/// paged_attention: `shape` is (heads, kv heads, head_dim, block size).
/// The kernel's `_bf16` form runs it too over the cache rounded to bf16, and
/// its `_fp8` form over the cache kiln_write_kv_fp8 wrote, which must hold
/// the E4M3 encodings of the CPU's cache (the float8 crate's, as
/// cuda_fp8.h's satfinite conversion). Stored in bf16 or f16 (for the output
/// projection), the output is the f32 result rounded, whole or merged from
/// split-K partials.
fn attention_case(
    gpu: &Gpu,
    kernel: Attention,
    shape: (usize, usize, usize, usize),
    window: Option<usize>,
    cap: Option<f32>,
) {
    let (heads, kv_heads, d, bs) = shape;
    let name = kernel.name();
    let what = format!("{name}: heads {heads}/{kv_heads}, d {d}, block {bs}, {window:?}, {cap:?}");
    let mut rng = Rng::new((heads * 1000 + d * 10 + bs) as u64);
    let layout = CacheLayout {
        block_size: bs,
        num_kv_heads: kv_heads,
        head_dim: d,
    };
    let stride = kv_heads * d;
    // (context after the step, rows fed): a decode row with a long context
    // (10 cache blocks: split in one, two merge rounds of splits),
    // a chunk in mid-sequence, a context exactly at a block boundary, a
    // whole prompt one past it, and a decode row with one cached position.
    let shapes = [
        (9 * bs + 3, 1),
        (3 * bs - 2, 5),
        (2 * bs, 3),
        (bs + 1, bs + 1),
        (2, 1),
    ];
    let batch = RaggedBatch::new(&mut rng, layout, &shapes);
    let (mut kh, mut vh, rows) = (batch.k_cache.clone(), batch.v_cache.clone(), batch.rows);
    let (kc, vc) = (gpu.up(&kh), gpu.up(&vh));
    let (k, v) = (rng.data(rows * stride, 1.0), rng.data(rows * stride, 1.0));
    let q = rng.data(rows * heads * d, 1.0);
    let metadata = batch.metadata(gpu);

    // The fp8 cache before the step: the same positions, encoded.
    let (k8, v8) = (gpu.up(&e4m3(&kh).0), gpu.up(&e4m3(&vh).0));
    let seqs = batch.sequences();
    attn::write_kv(layout, &mut kh, &mut vh, &k, &v, &seqs);
    let (k_in, v_in) = (gpu.up(&k), gpu.up(&v));
    let write = |kernel: &str, kc, vc| {
        let args = [Ptr(k_in), Ptr(v_in), Ptr(kc), Ptr(vc)];
        let args = [&args[..], &metadata, &[int(stride)]].concat();
        gpu.run(kernel, (rows as u32, 1), 128, &args);
    };
    write("kiln_write_kv", kc, vc);
    for (ptr, want, name) in [(kc, &kh, "k"), (vc, &vh, "v")] {
        let got: Vec<f32> = gpu.down(ptr, want.len());
        let same = bits(&got) == bits(want);
        assert!(same, "{what}: {name} cache differs after write_kv");
    }
    write("kiln_write_kv_fp8", k8, v8);
    let ((k8_want, k8_values), (v8_want, v8_values)) = (e4m3(&kh), e4m3(&vh));
    for (ptr, want, name) in [(k8, &k8_want, "k"), (v8, &v8_want, "v")] {
        let got: Vec<u8> = gpu.down(ptr, want.len());
        assert!(
            &got == want,
            "{what}: fp8 {name} cache differs after write_kv"
        );
    }

    let scale = 1.0 / (d as f32).sqrt();
    let params = AttentionParams {
        scale,
        sliding_window: window,
        softcap: cap,
    };
    let (window, cap) = (int(window.unwrap_or(0)), F32(cap.unwrap_or(0.0)));
    let sizes = [int(heads), int(kv_heads), int(d)];
    let tail = [&metadata[..], &sizes, &[F32(scale), window, cap]].concat();
    let grid = (rows as u32, kernel.blocks_per_row(heads, kv_heads) as u32);
    let mut caches = vec![(name.to_string(), kc, vc, kh.clone(), vh.clone())];
    if let Attention::Grouped(..) = kernel {
        let ((kb, kr), (vb, vr)) = (bf16s(&kh), bf16s(&vh));
        caches.push((format!("{name}_bf16"), gpu.up(&kb), gpu.up(&vb), kr, vr));
    }
    caches.push((format!("{name}_fp8"), k8, v8, k8_values, v8_values));
    for (name, kc, vc, kh, vh) in caches {
        let what = format!("{what}, {name}");
        let mut want = vec![0f32; q.len()];
        attn::paged_attention(layout, &kh, &vh, &q, &mut want, heads, &seqs, params);
        let out = gpu.zeros(q.len() * 4);
        let q_in = gpu.up(&q);
        let args_into = |out| [&[Ptr(q_in), Ptr(kc), Ptr(vc), Ptr(out)][..], &tail].concat();
        let args = args_into(out);
        let unsplit = |out_type| [&args[..], &[int(0), Ptr(0), Ptr(0), int(out_type)]].concat();
        gpu.run(&name, grid, 128, &unsplit(0));
        gpu.check(out, &want, &what);
        let exact: Vec<f32> = gpu.down(out, q.len());
        gpu.check_half_stores(out, &exact, &what, |t| {
            gpu.run(&name, grid, 128, &unsplit(t))
        });

        // Split-K: each row's keys in parts of one block, and in two
        // halves, merged by the last block of each (row, heads) to finish,
        // which leaves the counters at zero for the next launch.
        let per_seq = batch.per_seq;
        for splits in [per_seq, 2] {
            let split_keys = per_seq.div_ceil(splits) * bs;
            let partials = gpu.zeros(rows * heads * splits * (d + 2) * 4);
            let counters = gpu.zeros(rows * heads * 4);
            let out = gpu.zeros(q.len() * 4);
            let run_split = |t| {
                let split = [
                    &args_into(out)[..],
                    &[int(split_keys), Ptr(partials), Ptr(counters), int(t)],
                ]
                .concat();
                let mut config = LaunchConfig::linear(grid.0, 128);
                config.grid = (grid.0, grid.1, splits as u32);
                gpu.dev.launch(gpu.f(&name), config, &split).unwrap();
                let left: Vec<u32> = gpu.down(counters, rows * heads);
                assert!(
                    left.iter().all(|&c| c == 0),
                    "{what}: counters left {left:?}"
                );
            };
            run_split(0);
            let what = format!("{what}, {splits} splits");
            gpu.check(out, &want, &what);
            let exact: Vec<f32> = gpu.down(out, q.len());
            gpu.check_half_stores(out, &exact, &what, run_split);
        }
    }
}

#[test]
fn write_kv_and_paged_attention_match_the_cpu() {
    let gpu = Gpu::new(&[sources::ATTENTION]);
    // (heads, kv heads, head_dim, block size): GQA 1, 2, 4 and 8.
    let attention = Attention::PerHead("kiln_paged_attention");
    attention_case(&gpu, attention, (2, 2, 8, 16), None, None);
    attention_case(&gpu, attention, (4, 2, 64, 4), Some(5), None);
    attention_case(&gpu, attention, (4, 1, 256, 8), None, Some(0.5));
    attention_case(&gpu, attention, (8, 1, 64, 4), Some(6), Some(0.5));
    // Heads above 256: DeepSeek's latent head (512 + 64) as one key/value
    // head, and a width that leaves most lanes' last values unused.
    let wide = Attention::PerHead("kiln_paged_attention_wide");
    attention_case(&gpu, wide, (4, 1, 576, 4), None, None);
    attention_case(&gpu, wide, (2, 2, 264, 8), Some(5), Some(0.5));
    attention_case(&gpu, wide, (2, 1, 64, 16), None, None);
}

#[test]
fn grouped_attention_matches_the_cpu() {
    let gpu = Gpu::new(&[sources::ATTENTION]);
    // (heads, kv heads, head_dim, block size). Groups of 4 over 4 heads a
    // key/value head (Llama-3), over 7 (Qwen2.5-7B: a group of 4 and one of
    // 3) and over 8 (two groups); of 2 and 1. Heads of 8 values (a lane a
    // key), 96 and 80 (lanes holding nothing), 128 and 256 (a warp a key).
    let (g1, g2, g4) = (
        Attention::Grouped("kiln_grouped_attention_g1", 1),
        Attention::Grouped("kiln_grouped_attention_g2", 2),
        Attention::Grouped("kiln_grouped_attention_g4", 4),
    );
    attention_case(&gpu, g4, (8, 2, 64, 4), Some(5), None);
    attention_case(&gpu, g4, (14, 2, 128, 16), None, None);
    attention_case(&gpu, g4, (8, 1, 96, 8), None, Some(0.5));
    attention_case(&gpu, g4, (4, 1, 256, 4), Some(6), None);
    attention_case(&gpu, g2, (4, 2, 80, 4), None, None);
    attention_case(&gpu, g1, (2, 2, 8, 16), Some(3), Some(0.5));
    attention_case(&gpu, g1, (3, 3, 128, 4), None, None);
}

/// Encodes x[i] (f32_to_e4m3) and decodes every byte pattern (e4m3_to_f32,
/// one at a time and four to a word through e4m3x4_to_f32).
const E4M3_PROBE: &str = r#"
#include "kiln_cuda.cuh"
extern "C" __global__ void kiln_e4m3_probe(const float* x, unsigned char* encoded, int n, float* one, float* four) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) encoded[i] = (unsigned char)f32_to_e4m3(x[i]);
  if (i < 256) one[i] = e4m3_to_f32((unsigned int)i);
  if (i < 64) {
    unsigned int word = (unsigned int)(4 * i) | (unsigned int)(4 * i + 1) << 8 | (unsigned int)(4 * i + 2) << 16 |
                        (unsigned int)(4 * i + 3) << 24;
    e4m3x4_to_f32(word, four + 4 * i);
  }
}
"#;

#[test]
fn e4m3_conversions_match_the_float8_crate() {
    let mut gpu = Gpu::new(&[]);
    gpu.load("e4m3_probe.cu", E4M3_PROBE);
    // Every E4M3 value, the midpoints to its neighbour and the floats either
    // side of them (ties go to the even code), both signs; the saturation
    // edge (448, the midpoint 464 to the next code that would be, past it,
    // f32's largest, infinity), subnormal edges, NaN; random bit patterns.
    let mut x: Vec<f32> = vec![
        448.0,
        464.0,
        464.0f32.next_up(),
        500.0,
        f32::MAX,
        f32::INFINITY,
    ];
    x.extend([
        f32::NAN,
        2f32.powi(-10),
        2f32.powi(-10).next_up(),
        2f32.powi(-6),
        1e-30,
        0.0,
    ]);
    for code in 0u8..0x7e {
        let (a, b) = (
            F8E4M3::from_bits(code).to_f32(),
            F8E4M3::from_bits(code + 1).to_f32(),
        );
        let mid = a + (b - a) / 2.0;
        x.extend([a, mid, mid.next_up(), mid.next_down()]);
    }
    let negated: Vec<f32> = x.iter().map(|v| -v).collect();
    x.extend(negated);
    let mut rng = Rng::new(9);
    x.extend((0..2000).map(|_| f32::from_bits(rng.u32())));
    let n = x.len();
    let (encoded, one, four) = (gpu.zeros(n), gpu.zeros(256 * 4), gpu.zeros(256 * 4));
    let args = [Ptr(gpu.up(&x)), Ptr(encoded), int(n), Ptr(one), Ptr(four)];
    gpu.run("kiln_e4m3_probe", (n.div_ceil(128) as u32, 1), 128, &args);
    for (&v, got) in x.iter().zip(gpu.down::<u8>(encoded, n)) {
        let want = F8E4M3::from_f32(v).to_bits();
        assert_eq!(got, want, "f32_to_e4m3({v:e} = {:#x})", v.to_bits());
    }
    let (one, four): (Vec<f32>, Vec<f32>) = (gpu.down(one, 256), gpu.down(four, 256));
    for (b, (one, four)) in one.iter().zip(&four).enumerate() {
        let want = F8E4M3::from_bits(b as u8).to_f32();
        for (got, how) in [(one, "e4m3_to_f32"), (four, "e4m3x4_to_f32")] {
            let ok = if want.is_nan() {
                got.is_nan()
            } else {
                got.to_bits() == want.to_bits()
            };
            assert!(ok, "{how}({b:#04x}) = {got:e}, want {want:e}");
        }
    }
}
