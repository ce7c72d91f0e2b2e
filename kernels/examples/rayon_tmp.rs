// TEMPORARY (not to be committed)
use std::hint::black_box;
use std::time::Instant;
fn spin(n: u64) -> u64 {
    let mut x = 1u64;
    for i in 0..n {
        x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}
fn main() {
    for work in [0u64, 10_000, 40_000] {
        let t = Instant::now();
        let n = 2000;
        for _ in 0..n {
            black_box(spin(work));
        }
        let base = t.elapsed().as_secs_f64() / n as f64 * 1e6;
        let t = Instant::now();
        for _ in 0..n {
            rayon::join(|| spin(work / 2), || spin(work / 2));
        }
        let outside = t.elapsed().as_secs_f64() / n as f64 * 1e6;
        let t = Instant::now();
        rayon::scope(|_| {
            for _ in 0..n {
                rayon::join(|| spin(work / 2), || spin(work / 2));
            }
        });
        let inside_scope = t.elapsed().as_secs_f64() / n as f64 * 1e6;
        let pool = rayon::ThreadPoolBuilder::new().build().unwrap();
        let t = Instant::now();
        pool.install(|| {
            for _ in 0..n {
                rayon::join(|| spin(work / 2), || spin(work / 2));
            }
        });
        let inside = t.elapsed().as_secs_f64() / n as f64 * 1e6;
        let t = Instant::now();
        for _ in 0..n {
            rayon::in_place_scope(|s| {
                s.spawn(|_| {
                    spin(work / 2);
                });
                spin(work / 2);
            });
        }
        let inplace = t.elapsed().as_secs_f64() / n as f64 * 1e6;
        println!("work {work}: serial {base:.1}us  join-outside {outside:.1}us  in-scope {inside_scope:.1}  in-pool {inside:.1}us  in_place_scope {inplace:.1}us");
    }
}
