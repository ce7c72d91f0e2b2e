//! SiLU and GELU-tanh over a prefill-sized activation (64 rows of SmolLM2's
//! 1536-wide MLP), against the same formulas with the standard library's
//! `exp`/`tanh` per element. Throughput is elements per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln_kernels::dense::activation::{gelu_tanh, silu};

fn bench(c: &mut Criterion) {
    let xs: Vec<f32> = (0..64 * 1536)
        .map(|i| ((i * 7919) % 2000) as f32 / 200.0 - 5.0)
        .collect();
    let mut group = c.benchmark_group("activation");
    group.throughput(Throughput::Elements(xs.len() as u64));
    let mut ys = xs.clone();
    group.bench_function("silu", |b| {
        b.iter(|| {
            ys.copy_from_slice(&xs);
            silu(&mut ys)
        })
    });
    group.bench_function("silu_std", |b| {
        b.iter(|| {
            ys.copy_from_slice(&xs);
            ys.iter_mut().for_each(|v| *v = *v / (1.0 + (-*v).exp()));
        })
    });
    group.bench_function("gelu_tanh", |b| {
        b.iter(|| {
            ys.copy_from_slice(&xs);
            gelu_tanh(&mut ys)
        })
    });
    group.bench_function("gelu_tanh_std", |b| {
        b.iter(|| {
            ys.copy_from_slice(&xs);
            ys.iter_mut().for_each(|v| {
                let a = *v;
                *v = 0.5 * a * (1.0 + (0.797_884_6 * (a + 0.044_715 * a * a * a)).tanh());
            });
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
