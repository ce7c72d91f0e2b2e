//! Rotary position embedding, in place on `[T, heads, head_dim]`.

/// Rotates each head of token `t` by `positions[t] · inv_freq`, scaling cos and
/// sin by `scale`. `interleaved` pairs element `2i` with `2i+1` (GPT-J);
/// otherwise element `i` with `i + head_dim/2` (NeoX / Hugging Face).
pub fn rope(
    x: &mut [f32],
    positions: &[i64],
    inv_freq: &[f32],
    heads: usize,
    interleaved: bool,
    scale: f32,
) {
    let half = inv_freq.len();
    let head_dim = 2 * half;
    assert_eq!(x.len(), positions.len() * heads * head_dim, "rope sizes");
    let mut cos = vec![0f32; half];
    let mut sin = vec![0f32; half];
    for (token, &pos) in x.chunks_exact_mut(heads * head_dim).zip(positions) {
        for i in 0..half {
            // f32 angle like transformers (inv_freq ⊗ position in f32).
            let angle = pos as f32 * inv_freq[i];
            cos[i] = angle.cos() * scale;
            sin[i] = angle.sin() * scale;
        }
        for head in token.chunks_exact_mut(head_dim) {
            for i in 0..half {
                let (a, b) = if interleaved {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + half)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos[i] - x1 * sin[i];
                head[b] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }
}
