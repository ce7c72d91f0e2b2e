// Rotary position embedding of x [T, heads, 2·half] at positions [T]: one
// block per token, a thread per (head, pair).
#include "kiln_cuda.cuh"

// `interleaved` rotates adjacent pairs (GGUF llama), else the two halves
// (NeoX / Hugging Face). `scale` multiplies cos and sin (YaRN).
extern "C" __global__ void kiln_rope(const float* __restrict__ x, const i64* __restrict__ positions,
                                     const float* __restrict__ inv_freq, float* __restrict__ y,
                                     int heads, int half, int interleaved, float scale) {
  i64 token = blockIdx.x;
  float position = (float)positions[token];
  int head_dim = 2 * half;
  const float* in = x + token * heads * head_dim;
  float* out = y + token * heads * head_dim;
  for (int p = threadIdx.x; p < heads * half; p += blockDim.x) {
    int head = p / half, i = p % half;
    // f32 angle like transformers (inv_freq ⊗ position in f32).
    float angle = position * inv_freq[i];
    float c = cosf(angle) * scale, s = sinf(angle) * scale;
    int a = interleaved ? 2 * i : i;
    int b = interleaved ? 2 * i + 1 : i + half;
    float x0 = in[head * head_dim + a], x1 = in[head * head_dim + b];
    out[head * head_dim + a] = x0 * c - x1 * s;
    out[head * head_dim + b] = x1 * c + x0 * s;
  }
}
