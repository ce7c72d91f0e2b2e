//! The element-wise graph ops of a prefill step on the CPU, at Qwen2.5-0.5B's
//! sizes over 512 tokens: the residual add, a bias over rows, the RMS norm
//! and the rotary embedding (`runtime::cpu_ops`, split over rayon's global
//! pool of one thread a core). The fused gated product runs through the
//! same chunks (`runtime/fused.rs`); its activation is in `kernels`'s
//! `activation` bench.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln_host::runtime::cpu_ops::eval;
use kiln_host::runtime::{BufferPool, Tensor};
use kiln_plugin_api::graph::{BinaryOp, DType, Op};

const TOKENS: usize = 512;
const HIDDEN: usize = 896;
const QKV: usize = 1152;
const HEADS: usize = 14;
const HEAD_DIM: usize = 64;

fn values(len: usize, seed: f32) -> Vec<f32> {
    (0..len).map(|i| (i as f32 * seed).sin()).collect()
}

fn bench(c: &mut Criterion) {
    let pool = BufferPool::default();
    let mut group = c.benchmark_group("elementwise");
    group.sample_size(30);
    let run = |op: &Op, inputs: &[&Tensor], shape: &[usize]| {
        let out = eval(op, inputs, DType::F32, shape.to_vec(), &pool).unwrap();
        pool.give(out);
    };

    let x = Tensor::f32(vec![TOKENS, HIDDEN], values(TOKENS * HIDDEN, 0.37));
    let y = Tensor::f32(vec![TOKENS, HIDDEN], values(TOKENS * HIDDEN, 0.11));
    let add = Op::Binary { op: BinaryOp::Add };
    group.throughput(Throughput::Elements((TOKENS * HIDDEN) as u64));
    group.bench_function("residual_add_512x896", |b| {
        b.iter(|| run(&add, &[&x, &y], &[TOKENS, HIDDEN]))
    });

    let qkv = Tensor::f32(vec![TOKENS, QKV], values(TOKENS * QKV, 0.23));
    let bias = Tensor::f32(vec![QKV], values(QKV, 0.5));
    group.throughput(Throughput::Elements((TOKENS * QKV) as u64));
    group.bench_function("bias_add_512x1152", |b| {
        b.iter(|| run(&add, &[&qkv, &bias], &[TOKENS, QKV]))
    });

    let weight = Tensor::f32(vec![HIDDEN], values(HIDDEN, 0.7));
    let norm = Op::RmsNorm {
        eps: 1e-6,
        weight_offset: 0.0,
    };
    group.throughput(Throughput::Elements((TOKENS * HIDDEN) as u64));
    group.bench_function("rms_norm_512x896", |b| {
        b.iter(|| run(&norm, &[&x, &weight], &[TOKENS, HIDDEN]))
    });

    let q = Tensor::f32(
        vec![TOKENS, HEADS, HEAD_DIM],
        values(TOKENS * HEADS * HEAD_DIM, 0.19),
    );
    let positions = Tensor::i64(vec![TOKENS], (0..TOKENS as i64).collect());
    let inv_freq: Vec<f32> = (0..HEAD_DIM / 2)
        .map(|i| 1e6f32.powf(-2.0 * i as f32 / HEAD_DIM as f32))
        .collect();
    let inv_freq = Tensor::f32(vec![HEAD_DIM / 2], inv_freq);
    let rope = Op::Rope {
        interleaved: false,
        scale: 1.0,
    };
    group.throughput(Throughput::Elements((TOKENS * HEADS * HEAD_DIM) as u64));
    group.bench_function("rope_512x14x64", |b| {
        b.iter(|| {
            run(
                &rope,
                &[&q, &positions, &inv_freq],
                &[TOKENS, HEADS, HEAD_DIM],
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
