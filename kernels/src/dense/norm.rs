//! Row-wise normalizations and softmax over the last axis.

/// In place softmax of each row of length `row_len`, vectorized (the
/// exponential of [`activation`](super::activation), 16 partial sums): the
/// AVX-512, AVX2 and baseline builds give the same bits.
pub fn softmax_rows(x: &mut [f32], row_len: usize) {
    if row_len == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512(x: &mut [f32], row_len: usize) {
            for row in x.chunks_exact_mut(row_len) {
                softmax_row(row);
            }
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(x: &mut [f32], row_len: usize) {
            for row in x.chunks_exact_mut(row_len) {
                softmax_row(row);
            }
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { avx512(x, row_len) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { avx2(x, row_len) };
        }
    }
    for row in x.chunks_exact_mut(row_len) {
        softmax_row(row);
    }
}

/// Softmax of one row, in lanes of 16 the compiler vectorizes (whole
/// chunks of 16, then the rest in the first lanes).
#[inline(always)]
fn softmax_row(row: &mut [f32]) {
    const LANES: usize = 16;
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let (chunks, tail) = row.as_chunks::<LANES>();
    for chunk in chunks {
        for l in 0..LANES {
            maxes[l] = if chunk[l] > maxes[l] {
                chunk[l]
            } else {
                maxes[l]
            };
        }
    }
    for (l, &v) in tail.iter().enumerate() {
        maxes[l] = if v > maxes[l] { v } else { maxes[l] };
    }
    let mut max = f32::NEG_INFINITY;
    for m in maxes {
        max = max.max(m);
    }
    let mut sums = [0f32; LANES];
    let (chunks, tail) = row.as_chunks_mut::<LANES>();
    for chunk in chunks {
        for l in 0..LANES {
            chunk[l] = super::activation::exp(chunk[l] - max);
            sums[l] += chunk[l];
        }
    }
    for (l, v) in tail.iter_mut().enumerate() {
        *v = super::activation::exp(*v - max);
        sums[l] += *v;
    }
    let mut sum = 0f32;
    for s in sums {
        sum += s;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// In place log-softmax of each row.
pub fn log_softmax_rows(x: &mut [f32], row_len: usize) {
    if row_len == 0 {
        return;
    }
    for row in x.chunks_exact_mut(row_len) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|v| (v - max).exp()).sum();
        // Subtract the max first: `x - (max + ln sum)` loses digits for large x.
        let log_sum = sum.ln();
        row.iter_mut().for_each(|v| *v = (*v - max) - log_sum);
    }
}

/// `out = x / sqrt(mean(x²) + eps) * (offset + w)` per row.
pub fn rms_norm_rows(x: &[f32], w: &[f32], offset: f32, eps: f32, out: &mut [f32]) {
    let n = w.len();
    assert!(
        x.len() == out.len() && n > 0 && x.len().is_multiple_of(n),
        "rms_norm sizes"
    );
    for (row, out) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean_square = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (mean_square + eps).sqrt();
        for ((o, v), g) in out.iter_mut().zip(row).zip(w) {
            *o = v * inv * (offset + g);
        }
    }
}

/// `out = (x - mean) / sqrt(var + eps) * gamma + beta` per row.
pub fn layer_norm_rows(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, out: &mut [f32]) {
    let n = gamma.len();
    assert!(
        x.len() == out.len() && beta.len() == n && n > 0 && x.len().is_multiple_of(n),
        "layer_norm sizes"
    );
    for (row, out) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mean = row.iter().sum::<f32>() / n as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, v), g), b) in out.iter_mut().zip(row).zip(gamma).zip(beta) {
            *o = (v - mean) * inv * g + b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_is_stable_and_normalized() {
        let mut x = vec![1000.0, 1001.0, 1002.0, -5.0, 0.0, 5.0];
        softmax_rows(&mut x, 3);
        for row in x.chunks(3) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
        assert!((x[2] - 0.665_240_9).abs() < 1e-6);
        let mut y = vec![1000.0, 1001.0, 1002.0];
        log_softmax_rows(&mut y, 3);
        assert!((y[2] - 0.665_240_9f32.ln()).abs() < 1e-5);
    }

    /// Rows of every length up to 70 (whole chunks of 16 and tails), with
    /// masked (-inf) entries, against softmax in f64.
    #[test]
    fn softmax_matches_f64_on_every_row_length() {
        for len in 1..=70usize {
            let mut row: Vec<f32> = (0..len)
                .map(|i| match i % 11 {
                    7 if len > 1 => f32::NEG_INFINITY,
                    _ => ((i * 37 % 23) as f32 - 11.0) * 1.7,
                })
                .collect();
            let max = row
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, |m, v| m.max(v as f64));
            let exps: Vec<f64> = row.iter().map(|&v| (v as f64 - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            softmax_rows(&mut row, len);
            for (got, e) in row.iter().zip(&exps) {
                let want = e / sum;
                assert!(
                    (*got as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12,
                    "len {len}: {got} vs {want}"
                );
            }
        }
    }
}
