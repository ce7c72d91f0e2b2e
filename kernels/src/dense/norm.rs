//! Row-wise normalizations and softmax over the last axis.

/// In place softmax of each row of length `row_len`.
pub fn softmax_rows(x: &mut [f32], row_len: usize) {
    if row_len == 0 {
        return;
    }
    for row in x.chunks_exact_mut(row_len) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|v| *v *= inv);
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
}
