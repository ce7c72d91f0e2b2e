// Rotary position embedding of x [T, heads, 2·half] at positions [T]: a
// row of blocks per token (gridDim.y of them, each taking every gridDim.y-th
// stretch of blockDim.x (head, pair)s; one where the tokens alone fill the
// GPU), a thread per (head, pair) (up to KILN_ROPE_THREADS).
#include "kiln_cuda.cuh"

// Threads of a rotary block at most: four blocks an SM (64 registers a
// thread), each a token or part of one, so that one block's loads run while
// another works out its cos and sin or waits for its row's position. Blocks
// of 1024 threads held an SM each and took a token at a time: a 2048-token
// prefill's launch took 86.7 µs a layer on the H200 for ~90 MB (2026-11-30).
// The host's `ROPE_THREADS` (attention.rs).
#define KILN_ROPE_THREADS 256

// `interleaved` rotates adjacent pairs (GGUF llama), else the two halves
// (NeoX / Hugging Face). `scale` multiplies cos and sin (YaRN). A second
// tensor of the same positions (k after q: one launch for both) has
// `heads2` > 0 heads in x2 → y2. `in_stride` > 0: a token's row of x, x2
// (and of the cache write's v) starts that many values after the one
// before, as in the stacked output of q, k and v's one product (the host's
// stacked.rs), rather than right after it; the outputs are dense.
// Frequencies whose cos and sin a block computes once into shared memory
// (half of the head); wider heads compute them per pair.
#define KILN_ROPE_MAX_HALF 256

// Per-head RMS norms of x and x2 before they are rotated (Qwen3's and Gemma
// 3's q_norm and k_norm): each head's values times s · (offset + w), s = 1 /
// sqrt(mean of the head's squares + eps), w of x2's heads `w2`. None where w
// is null. A block takes the heads of its token, at most
// KILN_ROPE_NORMED_HEADS of them.
struct KilnHeadNorms {
  const float* w;
  const float* w2;
  float eps, offset;
};
#define KILN_ROPE_NORMED_HEADS 256

#define KILN_ROPE_PARAMS                                                                                    \
  const float *__restrict__ x, const i64 *__restrict__ positions, const float *__restrict__ inv_freq,         \
      float *__restrict__ y, int heads, int half, int interleaved, float scale, const float *__restrict__ x2, \
      float *__restrict__ y2, int heads2, int in_stride, KilnHeadNorms norms
#define KILN_ROPE_ARGS x, positions, inv_freq, y, heads, half, interleaved, scale, x2, y2, heads2, in_stride, norms

// Pairs of a thread's batch loaded before any is stored.
#define KILN_ROPE_BATCH 4

// Pair p of a token's (head, pair)s: the head (of the second tensor, k,
// past `heads`), the pair within it and the two elements it rotates.
struct RopePair {
  int head, i, a, b;
  bool second;
  __device__ __forceinline__ RopePair(int p, int half, int interleaved, int heads) {
    head = p / half;
    i = p % half;
    second = head >= heads;
    if (second) head -= heads;
    a = interleaved ? 2 * i : i;
    b = interleaved ? 2 * i + 1 : i + half;
  }
  // Where the pair's head of `token` starts in its tensor (x or x2, y or y2),
  // rows of `stride` values (0: dense rows of the tensor's heads).
  __device__ __forceinline__ i64 head_start(i64 token, int heads, int heads2, int head_dim, int stride = 0) const {
    const i64 row = stride > 0 ? stride : (i64)(second ? heads2 : heads) * head_dim;
    return token * row + (i64)head * head_dim;
  }
};

// Rotates the block's token. With `k_slot` set, the second tensor's rotated
// rows (the keys) are also stored there: the token's place in the KV cache.
template <typename C>
__device__ __forceinline__ void rope_token(KILN_ROPE_PARAMS, C* __restrict__ k_slot) {
  __shared__ float cos_sin[2 * KILN_ROPE_MAX_HALF];
  i64 token = blockIdx.x;
  float position = (float)positions[token];
  int head_dim = 2 * half;
  // f32 angle like transformers (inv_freq ⊗ position in f32): each
  // frequency's cos and sin once per token, not once per head.
  bool shared = half <= KILN_ROPE_MAX_HALF;
  if (shared) {
    for (int i = threadIdx.x; i < half; i += blockDim.x)
      rope_cos_sin(position, inv_freq[i], scale, &cos_sin[i], &cos_sin[half + i]);
  }
  // Each head's norm scale, a warp a head (x's heads, then x2's).
  __shared__ float head_scale[KILN_ROPE_NORMED_HEADS];
  if (norms.w) {
    const int lane = threadIdx.x % 32;
    for (int h = threadIdx.x / 32; h < heads + heads2; h += blockDim.x / 32) {
      RopePair r(h * half, half, interleaved, heads);
      const float* in = (r.second ? x2 : x) + r.head_start(token, heads, heads2, head_dim, in_stride);
      float squares = 0.0f;
      for (int i = lane; i < head_dim; i += 32) squares += in[i] * in[i];
      squares = warp_sum(squares);
      if (lane == 0) head_scale[h] = inverse_root_mean(squares, head_dim, norms.eps);
    }
  }
  if (shared || norms.w) __syncthreads();
  // The thread's (head, pair)s, KILN_ROPE_BATCH at a time, loaded before
  // any result is stored (for_each_batched: a 2048-token Llama-3-8B
  // prompt's ten pairs a thread were ten memory round trips).
  const int pairs = (heads + heads2) * half;
  for_each_batched<FloatPair, KILN_ROPE_BATCH>(
      blockIdx.y * blockDim.x + threadIdx.x, pairs, gridDim.y * blockDim.x,
      [&](int p) {
        RopePair r(p, half, interleaved, heads);
        const float* in = (r.second ? x2 : x) + r.head_start(token, heads, heads2, head_dim, in_stride);
        FloatPair v{in[r.a], in[r.b]};
        if (norms.w) {
          const float s = head_scale[(r.second ? heads : 0) + r.head];
          const float* w = r.second ? norms.w2 : norms.w;
          v.x = v.x * s * (norms.offset + w[r.a]);
          v.y = v.y * s * (norms.offset + w[r.b]);
        }
        return v;
      },
      [&](int p, FloatPair pair) {
        RopePair r(p, half, interleaved, heads);
        float* out = (r.second ? y2 : y) + r.head_start(token, heads, heads2, head_dim);
        float c, s;
        if (shared) {
          c = cos_sin[r.i];
          s = cos_sin[half + r.i];
        } else {
          rope_cos_sin(position, inv_freq[r.i], scale, &c, &s);
        }
        float r0, r1;
        rope_rotate(pair.x, pair.y, c, s, &r0, &r1);
        out[r.a] = r0;
        out[r.b] = r1;
        if (r.second && k_slot != nullptr) {
          cache_store(k_slot + r.head * head_dim + r.a, r0);
          cache_store(k_slot + r.head * head_dim + r.b, r1);
        }
      });
}

extern "C" __global__ void __launch_bounds__(KILN_ROPE_THREADS, 4) kiln_rope(KILN_ROPE_PARAMS) {
  kiln_wait_inputs();
  rope_token<float>(KILN_ROPE_ARGS, nullptr);
}

// Rotary embedding of q (x) and k (x2) fused with paged attention's cache
// write (attention.cu's kiln_write_kv): the rotated keys go to y2 and to the
// token's cache slot, and the token's values v [T, heads2 · 2·half] (rows
// `in_stride` apart where set: a stacked product's) are copied to theirs; a
// padding row (position -1) writes nothing to the cache. One launch a layer
// fewer, and k is not read back.
template <typename C>
__device__ void rope_write_kv(KILN_ROPE_PARAMS, const float* __restrict__ v, C* __restrict__ k_cache,
                              C* __restrict__ v_cache, const i64* __restrict__ row_offsets,
                              const i64* __restrict__ context_lens, const i64* __restrict__ block_tables, int batch,
                              int blocks_per_seq, int block_size) {
  i64 row = blockIdx.x, position;
  int stride = heads2 * 2 * half;
  int b = sequence_of(row_offsets, context_lens, batch, row, &position);
  i64 at = position < 0 ? -1 : cache_slot(block_tables, b, blocks_per_seq, block_size, position) * stride;
  rope_token<C>(KILN_ROPE_ARGS, at < 0 ? nullptr : k_cache + at);
  if (at < 0) return;
  // The token's values, KILN_ROPE_BATCH a thread loaded before any is stored.
  const i64 v_row = row * (in_stride > 0 ? in_stride : stride);
  for_each_batched<float, KILN_ROPE_BATCH>(
      blockIdx.y * blockDim.x + threadIdx.x, stride, gridDim.y * blockDim.x, [&](int i) { return v[v_row + i]; },
      [&](int i, float value) { cache_store(v_cache + at + i, value); });
}

#define KILN_ROPE_CACHE_PARAMS(C)                                                                             \
  const float *__restrict__ v, C *__restrict__ k_cache, C *__restrict__ v_cache,                              \
      const i64 *__restrict__ row_offsets, const i64 *__restrict__ context_lens,                              \
      const i64 *__restrict__ block_tables, int batch, int blocks_per_seq, int block_size
#define KILN_ROPE_CACHE_ARGS v, k_cache, v_cache, row_offsets, context_lens, block_tables, batch, blocks_per_seq, block_size

extern "C" __global__ void __launch_bounds__(KILN_ROPE_THREADS, 4) kiln_rope_write_kv(KILN_ROPE_PARAMS, KILN_ROPE_CACHE_PARAMS(float)) {
  kiln_wait_inputs();
  rope_write_kv(KILN_ROPE_ARGS, KILN_ROPE_CACHE_ARGS);
}

extern "C" __global__ void __launch_bounds__(KILN_ROPE_THREADS, 4) kiln_rope_write_kv_bf16(KILN_ROPE_PARAMS, KILN_ROPE_CACHE_PARAMS(bf16_bits)) {
  kiln_wait_inputs();
  rope_write_kv(KILN_ROPE_ARGS, KILN_ROPE_CACHE_ARGS);
}

extern "C" __global__ void __launch_bounds__(KILN_ROPE_THREADS, 4) kiln_rope_write_kv_fp8(KILN_ROPE_PARAMS, KILN_ROPE_CACHE_PARAMS(fp8_e4m3)) {
  kiln_wait_inputs();
  rope_write_kv(KILN_ROPE_ARGS, KILN_ROPE_CACHE_ARGS);
}
