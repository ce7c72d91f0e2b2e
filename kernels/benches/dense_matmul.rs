//! f32 linear-layer throughput (`y = x·Wᵀ`) at SmolLM2-135M's layer shapes,
//! for decode (1 row) and prefill (64 rows; 512 for bf16), in FLOP/s (criterion's
//! "elements" are floating-point operations here). Also the bf16-weight
//! kernel. Compare with `torch_matmul.py` on the same machine.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln_kernels::dense::matmul::{linear, linear_half, linear_half_fast, HalfFormat};

/// (in, out) of SmolLM2's projections: attention, MLP up, MLP down, LM head.
const SHAPES: [(usize, usize); 4] = [(576, 576), (576, 1536), (1536, 576), (576, 49152)];

fn data(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("linear_f32");
    for rows in [1usize, 64] {
        for (k, n) in SHAPES {
            let (x, w) = (data(rows * k), data(n * k));
            let mut y = vec![0f32; rows * n];
            group.throughput(Throughput::Elements((2 * rows * k * n) as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("m{rows}"), format!("{k}x{n}")),
                &(),
                |b, _| b.iter(|| linear(&x, &w, &mut y, rows, k, n)),
            );
        }
    }
    group.finish();

    let mut group = c.benchmark_group("linear_bf16");
    for rows in [1usize, 64, 512] {
        // A 512-row prefill's LM head would take most of the run: the
        // logits of a prefill are one row's.
        for (k, n) in SHAPES.into_iter().filter(|&(_, n)| rows < 512 || n < 49152) {
            let x = data(rows * k);
            let w: Vec<u8> = data(n * k)
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect();
            let mut y = vec![0f32; rows * n];
            group.throughput(Throughput::Elements((2 * rows * k * n) as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("m{rows}"), format!("{k}x{n}")),
                &(),
                |b, _| b.iter(|| linear_half(&x, &w, HalfFormat::BF16, &mut y, rows, k, n)),
            );
            // `--precision fast`: bf16 pairs where the CPU has AVX512_BF16.
            group.bench_with_input(
                BenchmarkId::new(format!("fast_m{rows}"), format!("{k}x{n}")),
                &(),
                |b, _| b.iter(|| linear_half_fast(&x, &w, HalfFormat::BF16, &mut y, rows, k, n)),
            );
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
