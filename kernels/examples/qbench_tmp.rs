// TEMPORARY dev harness (not to be committed): min-of-trials timing.
use half::f16;
use kiln_kernels::quant::{Isa, Precision, QuantMatrix, QuantType};
use std::time::Instant;

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
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    for c in v.chunks_exact(32) {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum()
}
fn mem() {
    use rayon::prelude::*;
    let src: Vec<f32> = (0..(64usize << 20)).map(|i| i as f32).collect();
    let mut dst = vec![0f32; src.len()];
    let bytes = (src.len() * 4) as f64;
    let mut b = [f64::MAX; 4];
    for _ in 0..15 {
        let t = Instant::now();
        std::hint::black_box(sum(&src));
        b[0] = b[0].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        std::hint::black_box(src.par_chunks(1 << 16).map(sum).sum::<f32>());
        b[1] = b[1].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        dst.copy_from_slice(&src);
        b[2] = b[2].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        dst.par_chunks_mut(1 << 20)
            .zip(src.par_chunks(1 << 20))
            .for_each(|(d, s)| d.copy_from_slice(s));
        b[3] = b[3].min(t.elapsed().as_secs_f64());
    }
    println!(
        "mem: sum 1t {:.1} GB/s, sum rayon {:.1}, memcpy 1t {:.1}, memcpy rayon {:.1}",
        bytes / b[0] / 1e9,
        bytes / b[1] / 1e9,
        bytes / b[2] / 1e9,
        bytes / b[3] / 1e9
    );
}
fn main() {
    if std::env::args().nth(1).as_deref() == Some("mem") {
        mem();
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let filter = args.get(1).cloned().unwrap_or_default();
    let isa = match args.get(2).map(|s| s.as_str()) {
        Some("scalar") => Isa::Scalar,
        Some("avx2") => Isa::Avx2,
        _ => Isa::detect(),
    };
    let shapes = [(576usize, 576usize), (1536, 576), (576, 1536), (49152, 576)];
    for ty in [
        QuantType::Q4_1,
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q6K,
        QuantType::Q5_0,
        QuantType::Q5K,
    ] {
        if !ty.name().contains(&filter) {
            continue;
        }
        for (rows, cols) in shapes {
            if cols % ty.block_elems() != 0 {
                continue;
            }
            let mut data = bytes(rows * ty.row_bytes(cols).unwrap(), 99);
            let fields: &[usize] = match ty {
                QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
                QuantType::Q2K => &[80, 82],
                QuantType::Q3K => &[108],
                QuantType::Q6K => &[208],
                _ => &[0],
            };
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                for &at in fields {
                    b[at..at + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                }
            }
            let w = QuantMatrix::new(ty, rows, cols, &data).unwrap();
            let x: Vec<f32> = bytes(cols, 7)
                .iter()
                .map(|&b| b as f32 / 128.0 - 1.0)
                .collect();
            let mut y = vec![0f32; rows];
            let mut line = format!("{:5} {:>5}x{:<5}", ty.name(), rows, cols);
            for p in [Precision::Exact, Precision::Fast] {
                let reps = (20_000_000 / data.len()).max(3);
                let mut best = f64::MAX;
                let inpool = std::env::var("OUTSIDE").is_err();
                for _ in 0..25 {
                    let mut body = || {
                        let t = Instant::now();
                        for _ in 0..reps {
                            w.matmul_with(isa, p, &x, 1, &mut y).unwrap();
                        }
                        t.elapsed().as_secs_f64()
                    };
                    let el = if inpool { rayon::scope(|_| body()) } else { body() };
                    best = best.min(el / reps as f64);
                }
                line += &format!(
                    "  {:?}: {:6.1} GB/s ({:7.1} us)",
                    p,
                    data.len() as f64 / best / 1e9,
                    best * 1e6
                );
            }
            println!("{line}");
        }
    }
}
