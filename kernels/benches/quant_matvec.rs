//! Quantized matrix-vector products (m = 1, decode) at SmolLM2-135M's shapes,
//! in weight bytes per second, beside the machine's memory bandwidth; and
//! quantized matrix products with 64 activation rows (prefill) at SmolLM2's
//! and Gemma-3-270M's shapes (and, for Q2_K, Q3_K, Q4_K and Q6_K,
//! Gemma-3-270M's and Qwen2.5-0.5B's matrices with a multiple of 256
//! columns), in fast precision, in FLOP/s
//! (`quant_prefill`: criterion's "elem/s" are multiply-adds × 2).
//!
//! `cargo bench -p kiln-kernels --bench quant_matvec` (add `-- quant_prefill`
//! for the prefill cases only). The rayon pool has its
//! default size (one thread per core) and the products are called from inside
//! it, as a runtime does (`quant_matvec_outside_pool` shows the cost of calling
//! from another thread). K-quants and IQ4_XS need rows of a multiple of 256 values, so
//! they only run where `cols` is one.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::f16;
use kiln_kernels::quant::{Precision, QuantMatrix, QuantType};
use kiln_kernels::HugePageBuffer;
use rayon::prelude::*;

/// rows x cols of SmolLM2-135M's projections: attention q/o, MLP up/gate,
/// MLP down, and the tied embedding / LM head.
const SHAPES: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];
const TYPES: [QuantType; 10] = [
    QuantType::Q4_1,
    QuantType::Q4_0,
    QuantType::Q5_0,
    QuantType::Q8_0,
    QuantType::Q4K,
    QuantType::Q6K,
    QuantType::IQ4NL,
    QuantType::IQ4XS,
    QuantType::Q3K,
    QuantType::Q2K,
];

/// Activation rows of a prefill batch: enough that, as in a real prompt's
/// prefill, the panel and AMX kernels decode each weight tile once for many
/// activation rows (16 tiles of 16 here).
const PREFILL_M: usize = 256;
/// rows x cols of the prefill cases: SmolLM2-135M's attention q/o, MLP
/// up/gate and down, then Gemma-3-270M's attention q, attention o, MLP
/// up/gate and down.
const PREFILL_SHAPES: [(usize, usize); 7] = [
    (576, 576),
    (1536, 576),
    (576, 1536),
    (1024, 640),
    (640, 1024),
    (2048, 640),
    (640, 2048),
];
/// The 32-value formats the real models use for most matrices (SmolLM2 Q4_1,
/// Qwen2.5 and Gemma-3 Q5_0 and Q8_0).
const PREFILL_TYPES: [QuantType; 3] = [QuantType::Q4_1, QuantType::Q5_0, QuantType::Q8_0];
/// rows x cols of the K-quant prefill cases (`cols` a multiple of 256):
/// Gemma-3-270M's attention o and MLP down, and Qwen2.5-0.5B's MLP down.
const PREFILL_K_SHAPES: [(usize, usize); 3] = [(640, 1024), (640, 2048), (896, 4864)];
/// The K-quants of the `Q4_K_M` files (Gemma-3 and Qwen2.5 use Q4_K and
/// Q6_K), and of the `Q3_K_M` and `Q2_K` ones (Q3_K, Q2_K).
const PREFILL_K_TYPES: [QuantType; 4] = [
    QuantType::Q4K,
    QuantType::Q6K,
    QuantType::Q3K,
    QuantType::Q2K,
];

/// Deterministic bytes (xorshift).
fn bytes(n: usize, mut s: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// Random blocks with a finite f16 scale (and minimum) in every block.
fn random_weights(ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    let len = rows * ty.row_bytes(cols).expect("bench shapes are whole blocks");
    let mut data = bytes(len, 0x9E37_79B9_7F4A_7C15);
    for block in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in ty.f16_fields() {
            block[at..at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        }
    }
    data
}

/// Times `iters` calls of `f` made from a thread of the rayon pool.
fn in_pool(iters: u64, mut f: impl FnMut() + Send) -> Duration {
    rayon::scope(|_| {
        let start = Instant::now();
        for _ in 0..iters {
            f();
        }
        start.elapsed()
    })
}

fn quant_matvec(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant_matvec");
    for ty in TYPES {
        for (rows, cols) in SHAPES {
            if !cols.is_multiple_of(ty.block_elems()) {
                continue;
            }
            let data = random_weights(ty, rows, cols);
            let w = QuantMatrix::new(ty, rows, cols, &data).expect("valid matrix");
            let x: Vec<f32> = bytes(cols, 7)
                .iter()
                .map(|&b| f32::from(b) / 128.0 - 1.0)
                .collect();
            let mut y = vec![0f32; rows];
            group.throughput(Throughput::Bytes(data.len() as u64));
            for precision in [Precision::Exact, Precision::Fast] {
                let id = BenchmarkId::new(format!("{ty}/{precision:?}"), format!("{rows}x{cols}"));
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        in_pool(iters, || {
                            w.matmul(precision, black_box(&x), 1, &mut y)
                                .expect("matmul")
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

fn quant_prefill(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant_prefill");
    let cases = PREFILL_TYPES
        .iter()
        .flat_map(|&ty| PREFILL_SHAPES.iter().map(move |&shape| (ty, shape)))
        .chain(
            PREFILL_K_TYPES
                .iter()
                .flat_map(|&ty| PREFILL_K_SHAPES.iter().map(move |&shape| (ty, shape))),
        );
    for (ty, (rows, cols)) in cases {
        let data = random_weights(ty, rows, cols);
        let w = QuantMatrix::new(ty, rows, cols, &data).expect("valid matrix");
        let x: Vec<f32> = bytes(PREFILL_M * cols, 7)
            .iter()
            .map(|&b| f32::from(b) / 128.0 - 1.0)
            .collect();
        let mut y = vec![0f32; PREFILL_M * rows];
        group.throughput(Throughput::Elements((2 * rows * cols * PREFILL_M) as u64));
        for precision in [Precision::Exact, Precision::Fast] {
            let id = BenchmarkId::new(
                format!("{ty}/{precision:?}/m{PREFILL_M}"),
                format!("{rows}x{cols}"),
            );
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    in_pool(iters, || {
                        w.matmul(precision, black_box(&x), PREFILL_M, &mut y)
                            .expect("matmul")
                    })
                })
            });
        }
    }
    group.finish();
}

/// Batched decode: a few activation rows (one per sequence of the batch)
/// against Qwen2.5-0.5B's MLP up projection (4864 x 896) in the 32-value
/// formats and its down projection (896 x 4864) in the K-quants, on the
/// pool. A step of `m` sequences should cost little more than one: the
/// weights are read once for all of them.
fn quant_batch_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant_batch_decode");
    let cases = [
        (QuantType::Q5_0, (4864, 896)),
        (QuantType::Q8_0, (4864, 896)),
        (QuantType::Q4K, (896, 4864)),
        (QuantType::Q6K, (896, 4864)),
        (QuantType::Q3K, (896, 4864)),
        (QuantType::Q2K, (896, 4864)),
    ];
    for (ty, (rows, cols)) in cases {
        let data = random_weights(ty, rows, cols);
        let w = QuantMatrix::new(ty, rows, cols, &data).expect("valid matrix");
        group.throughput(Throughput::Bytes(data.len() as u64));
        for m in [1, 2, 3, 4, 8] {
            let x: Vec<f32> = bytes(m * cols, 7)
                .iter()
                .map(|&b| f32::from(b) / 128.0 - 1.0)
                .collect();
            let mut y = vec![0f32; m * rows];
            for precision in [Precision::Exact, Precision::Fast] {
                let id =
                    BenchmarkId::new(format!("{ty}/{precision:?}/{rows}x{cols}"), format!("m{m}"));
                group.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        in_pool(iters, || {
                            w.matmul(precision, black_box(&x), m, &mut y)
                                .expect("matmul")
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

/// Sum with 32 independent partial sums, so that it vectorizes and is bound
/// by memory rather than by the latency of one chain of additions.
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    for c in v.chunks_exact(32) {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum()
}

/// One decode step's worth of SmolLM2-135M Q4_1 products: 30 layers of
/// q, k, v, o, gate, up and down (66 MB) and the LM head (18 MB), each matrix
/// its own allocation, so that they stream from memory as in a model rather
/// than from a core's cache. On the rayon pool (one thread per core) and on a
/// one-thread pool; throughput in weight bytes per second. `FastResidual`
/// runs every product with two-digit activations (the runtime gives them to
/// the down projections only): the cost of the second digit.
fn quant_decode_step(c: &mut Criterion) {
    const LAYER: [(usize, usize); 7] = [
        (576, 576),
        (192, 576),
        (192, 576),
        (576, 576),
        (1536, 576),
        (1536, 576),
        (576, 1536),
    ];
    let ty = QuantType::Q4_1;
    let shapes: Vec<(usize, usize)> = (0..30).flat_map(|_| LAYER).chain([(49152, 576)]).collect();
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(rows, cols)| random_weights(ty, rows, cols))
        .collect();
    let mats: Vec<QuantMatrix> = shapes
        .iter()
        .zip(&data)
        .map(|(&(rows, cols), d)| QuantMatrix::new(ty, rows, cols, d).expect("valid matrix"))
        .collect();
    let x = vec![0.25f32; 1536];
    let mut y = vec![0f32; 49152];
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    let mut group = c.benchmark_group("quant_decode_step");
    group.throughput(Throughput::Bytes(data.iter().map(|d| d.len() as u64).sum()));
    group.sample_size(10);
    for precision in [Precision::Exact, Precision::Fast, Precision::FastResidual] {
        let mut step = || {
            for (w, &(rows, cols)) in mats.iter().zip(&shapes) {
                w.matmul(precision, black_box(&x[..cols]), 1, &mut y[..rows])
                    .expect("matmul");
            }
        };
        let id = format!("smollm2_q4_1/{precision:?}");
        group.bench_function(format!("{id}/pool"), |b| {
            b.iter_custom(|iters| in_pool(iters, &mut step))
        });
        group.bench_function(format!("{id}/1_thread"), |b| {
            b.iter_custom(|iters| one.install(|| in_pool(iters, &mut step)))
        });
    }
    group.finish();
}

/// Gemma-3-270M's LM head, 262144 x 640 in Q8_0 (178 MB, 72 % of the
/// bytes of its decode step), for one activation row on the pool, from
/// memory: the read bandwidth bounds it. In 4 KiB pages (a plain `Vec`)
/// and, as the runtime holds weights, in memory advised for huge pages
/// (`kiln_kernels::HugePageBuffer`).
fn quant_lm_head(c: &mut Criterion) {
    let (rows, cols) = (262_144, 640);
    let ty = QuantType::Q8_0;
    let data = random_weights(ty, rows, cols);
    let mut huge = HugePageBuffer::new(data.len()).expect("memory for the weights");
    huge.copy_from_slice(&data);
    let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 / 7.0 - 0.5).collect();
    let mut y = vec![0f32; rows];
    let mut group = c.benchmark_group("quant_lm_head");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);
    for (pages, bytes) in [("4k_pages", &data[..]), ("huge_pages", &huge[..])] {
        let w = QuantMatrix::new(ty, rows, cols, bytes).expect("valid matrix");
        for precision in [Precision::Exact, Precision::Fast] {
            group.bench_function(format!("gemma3_{ty}/{precision:?}/{pages}"), |b| {
                b.iter_custom(|iters| {
                    in_pool(iters, || {
                        w.matmul(precision, black_box(&x), 1, &mut y)
                            .expect("matmul")
                    })
                })
            });
        }
    }
    group.finish();
}

fn quant_matvec_outside_pool(c: &mut Criterion) {
    let mut group = c.benchmark_group("quant_matvec_outside_pool");
    let ty = QuantType::Q4_0;
    for (rows, cols) in SHAPES {
        let data = random_weights(ty, rows, cols);
        let w = QuantMatrix::new(ty, rows, cols, &data).expect("valid matrix");
        let x = vec![0.5f32; cols];
        let mut y = vec![0f32; rows];
        group.throughput(Throughput::Bytes(data.len() as u64));
        let id = BenchmarkId::new(format!("{ty}/Fast"), format!("{rows}x{cols}"));
        group.bench_function(id, |b| {
            b.iter(|| {
                w.matmul(Precision::Fast, black_box(&x), 1, &mut y)
                    .expect("matmul")
            })
        });
    }
    group.finish();
}

fn memory_bandwidth(c: &mut Criterion) {
    const BYTES: usize = 256 << 20;
    let src: Vec<f32> = (0..BYTES / 4).map(|i| i as f32).collect();
    let mut dst = vec![0f32; src.len()];
    let mut group = c.benchmark_group("memory");
    group.throughput(Throughput::Bytes(BYTES as u64));
    group.sample_size(10);
    group.bench_function("sum_f32_256MiB/1_thread", |b| {
        b.iter(|| sum(black_box(&src)))
    });
    group.bench_function("sum_f32_256MiB/rayon", |b| {
        b.iter(|| black_box(&src).par_chunks(1 << 16).map(sum).sum::<f32>())
    });
    group.bench_function("memcpy_256MiB/1_thread", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    group.bench_function("memcpy_256MiB/rayon", |b| {
        b.iter(|| {
            dst.par_chunks_mut(1 << 20)
                .zip(black_box(&src).par_chunks(1 << 20))
                .for_each(|(d, s)| d.copy_from_slice(s))
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = quant_matvec, quant_prefill, quant_batch_decode, quant_decode_step, quant_lm_head, quant_matvec_outside_pool, memory_bandwidth
}
criterion_main!(benches);
