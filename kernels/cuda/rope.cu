// Rotary position embedding of x [T, heads, 2·half] at positions [T]: one
// block per token, a thread per (head, pair) (up to 1024: a decode step's
// single token is one block, so its pairs are read in few rounds).
#include "kiln_cuda.cuh"

// `interleaved` rotates adjacent pairs (GGUF llama), else the two halves
// (NeoX / Hugging Face). `scale` multiplies cos and sin (YaRN). A second
// tensor of the same positions (k after q: one launch for both) has
// `heads2` > 0 heads in x2 → y2.
// Frequencies whose cos and sin a block computes once into shared memory
// (half of the head); wider heads compute them per pair.
#define KILN_ROPE_MAX_HALF 256

extern "C" __global__ void kiln_rope(const float* __restrict__ x, const i64* __restrict__ positions,
                                     const float* __restrict__ inv_freq, float* __restrict__ y,
                                     int heads, int half, int interleaved, float scale,
                                     const float* __restrict__ x2, float* __restrict__ y2, int heads2) {
  __shared__ float cos_sin[2 * KILN_ROPE_MAX_HALF];
  i64 token = blockIdx.x;
  float position = (float)positions[token];
  int head_dim = 2 * half;
  // f32 angle like transformers (inv_freq ⊗ position in f32): each
  // frequency's cos and sin once per token, not once per head.
  bool shared = half <= KILN_ROPE_MAX_HALF;
  if (shared) {
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float angle = position * inv_freq[i];
      cos_sin[i] = cosf(angle) * scale;
      cos_sin[half + i] = sinf(angle) * scale;
    }
    __syncthreads();
  }
#pragma unroll 4
  for (int p = threadIdx.x; p < (heads + heads2) * half; p += blockDim.x) {
    int head = p / half, i = p % half;
    bool second = head >= heads;
    int count = second ? heads2 : heads;
    if (second) head -= heads;
    const float* in = (second ? x2 : x) + (token * count + head) * head_dim;
    float* out = (second ? y2 : y) + (token * count + head) * head_dim;
    float c, s;
    if (shared) {
      c = cos_sin[i];
      s = cos_sin[half + i];
    } else {
      float angle = position * inv_freq[i];
      c = cosf(angle) * scale;
      s = sinf(angle) * scale;
    }
    int a = interleaved ? 2 * i : i;
    int b = interleaved ? 2 * i + 1 : i + half;
    float x0 = in[a], x1 = in[b];
    out[a] = x0 * c - x1 * s;
    out[b] = x1 * c + x0 * s;
  }
}
