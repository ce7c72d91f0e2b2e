// What the paged-attention kernels share (attention.cu, decode_attention.cu,
// flash_attention.cu): their arguments, the keys a row attends, the soft
// cap, and the merges of softmax states (a block's parts; split-K's splits).
// After kiln_cuda.cuh, which has the cache lookups.
#pragma once

// Attention's soft cap (Gemma 2's), a score in log2 units: cap · tanh(s ·
// scale / cap) · log2 e, its factors worked out once, not divided per score.
struct SoftCap {
  float in, out;
  __device__ SoftCap(float scale, float cap) : in(cap > 0.0f ? scale / cap : 0.0f), out(cap * KILN_LOG2E) {}
  __device__ __forceinline__ float operator()(float s) const { return out * tanhf(s * in); }
};

// The paged-attention kernels' arguments (attention.cu, decode_attention.cu).
#define KILN_PAGED_ATTENTION_PARAMS(C)                                                                           \
  const float *__restrict__ q, const C *__restrict__ k_cache, const C *__restrict__ v_cache,                     \
      float *__restrict__ out, const i64 *__restrict__ row_offsets, const i64 *__restrict__ context_lens,        \
      const i64 *__restrict__ block_tables, int batch, int blocks_per_seq, int block_size, int num_heads,        \
      int kv_heads, int head_dim, float scale, int window, float softcap, int split_keys,                         \
      float *__restrict__ partials, unsigned *__restrict__ split_counters, int out_type
#define KILN_PAGED_ATTENTION_ARGS                                                                                 \
  q, k_cache, v_cache, out, row_offsets, context_lens, block_tables, batch, blocks_per_seq, block_size, num_heads, \
      kv_heads, head_dim, scale, window, softcap, split_keys, partials, split_counters, out_type

// The sequence of batch row `row` (returned) and the positions the row
// attends to, first..last (none for padding): the last `window` of them
// where window > 0, and with `split` (split-K) those of blockIdx.z's part
// of `split_keys` positions.
__device__ __forceinline__ int attended_keys(const i64* row_offsets, const i64* context_lens, int batch, i64 row,
                                             int window, bool split, int split_keys, i64* first, i64* last) {
  i64 position;
  int b = sequence_of(row_offsets, context_lens, batch, row, &position);
  *first = window > 0 && position + 1 > window ? position + 1 - window : 0;
  *last = position;
  if (split) {
    *first = max(*first, (i64)blockIdx.z * split_keys);
    *last = min(*last, (i64)(blockIdx.z + 1) * split_keys - 1);
  }
  return b;
}

// The softmax states of a block's `parts` parts (lane groups, warps) merged
// per query head: part i's max (log2 units) and sum of weights for head h at
// part_m[i · stride + h] and part_l[i · stride + h] in shared memory; thread
// h < heads writes head h's merged max and sum to head_m[h], head_l[h] and
// each part's weight in the merge in place of its max. A part that saw no key
// weighs 0. The block synchronizes after.
__device__ __forceinline__ void merge_softmax_parts(float* part_m, const float* part_l, int parts, int stride,
                                                    int heads, float* head_m, float* head_l) {
  if (threadIdx.x < heads) {
    const int h = threadIdx.x;
    float m_all = KILN_NEG_INF, total = 0.0f;
    for (int i = 0; i < parts; ++i)
      if (part_l[i * stride + h] > 0.0f) m_all = fmaxf(m_all, part_m[i * stride + h]);
    for (int i = 0; i < parts; ++i) {
      const float l = part_l[i * stride + h], weight = l > 0.0f ? fast_exp2(part_m[i * stride + h] - m_all) : 0.0f;
      part_m[i * stride + h] = weight;
      total += l * weight;
    }
    head_m[h] = m_all;
    head_l[h] = total;
  }
  __syncthreads();
}

// Split-K attention (flash-decoding): blockIdx.z of a launch takes a range
// of a row's keys and writes, per query head row, its running max (log2
// units), sum of weights and unnormalized output to
// partials[(head_row · gridDim.z + z) · (head_dim + 2)]: [m · ln 2, l, acc...].
//
// Value d of query head row `head_row`: with `partials`, this split's part;
// else the output, sum / l (zero where no key was seen: padding).
__device__ __forceinline__ void write_head_value(float* out, float* partials, i64 head_row, int head_dim, int d,
                                                 float m, float l, float sum, int out_type) {
  if (partials != nullptr) {
    float* part = partials + (head_row * gridDim.z + blockIdx.z) * (head_dim + 2);
    if (d == 0) {
      part[0] = m * KILN_LN2;  // merge_head_splits' units (natural log)
      part[1] = l;
    }
    part[2 + d] = sum;
  } else {
    store_as(out, head_row * head_dim + d, l > 0.0f ? sum / l : 0.0f, out_type);
  }
}

// Splits a merge takes at most (the host's MAX_SPLITS, attention.rs, is
// 32), query heads (decode_attention.cu's KILN_DECODE_HEADS), splits whose
// values a thread loads together, and outputs a thread merges at once.
#define KILN_MAX_SPLITS 128
#define KILN_MERGE_HEADS 8
#define KILN_MERGE_SPLITS 16
#define KILN_MERGE_OUTPUTS 4

// Split z's partial result for query head row `head_row` (write_head_value).
__device__ __forceinline__ const float* split_part(const float* partials, i64 head_row, int z, int head_dim) {
  return partials + (head_row * gridDim.z + z) * (head_dim + 2);
}

// After every thread of the block has written its part (write_head_value):
// the last of the splits of (row, blockIdx.y) to finish merges the parts of
// its `heads` query heads from `first_head` into `out`. The counters,
// split_counters[row · gridDim.y + blockIdx.y], start at zero and are left
// at zero. First each split's weight for each head, exp(m_z − max) (a warp
// a head, a lane every 32nd split: one round of loads a head, then shuffles),
// then each output's sum of the splits' values by their weights over the
// sum of their weighted sums, KILN_MERGE_OUTPUTS outputs a thread with
// their loads of KILN_MERGE_SPLITS splits issued before any is used: a few
// L2 round trips in all, where each output's own chain of them (before
// 2026-11-30, one after another, each value tested before the next was
// read) took ~38 µs a layer at 16 splits on the H200 (a batch-1
// Llama-3-8B layer's attention, bench/results/gpu-2026-11-30b). The sums
// run over the splits in order.
__device__ __forceinline__ void merge_head_splits(float* out, const float* partials, unsigned* split_counters, i64 row,
                                                  int first_head, int heads, int num_heads, int head_dim,
                                                  int out_type) {
  __shared__ float split_weight[KILN_MERGE_HEADS][KILN_MAX_SPLITS];
  __shared__ float head_total[KILN_MERGE_HEADS];
  if (!last_block_done(split_counters + row * gridDim.y + blockIdx.y, gridDim.z)) return;
  const int splits = gridDim.z, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const i64 first_row = row * num_heads + first_head;
  constexpr int PER_LANE = KILN_MAX_SPLITS / 32;
  for (int j = 0; j < KILN_MERGE_HEADS; ++j) {
    // Bounded by what every thread sees alike (blockDim, heads), so the
    // compiler knows the shuffles below run in whole warps.
    if (j * warps >= heads) break;
    const int h = warp + j * warps;
    float m[PER_LANE], l[PER_LANE];
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
      const int z = lane + 32 * t;
      const bool in = h < heads && z < splits;
      m[t] = in ? __ldcg(split_part(partials, first_row + h, z, head_dim)) : KILN_NEG_INF;
      l[t] = in ? __ldcg(split_part(partials, first_row + h, z, head_dim) + 1) : 0.0f;
    }
    // A split that saw no key (l = 0) weighs nothing.
    float m_all = KILN_NEG_INF;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t)
      if (l[t] > 0.0f) m_all = fmaxf(m_all, m[t]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) m_all = fmaxf(m_all, __shfl_xor_sync(KILN_FULL_MASK, m_all, offset));
    float total = 0.0f;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
      const int z = lane + 32 * t;
      const float weight = l[t] > 0.0f ? expf(m[t] - m_all) : 0.0f;
      total += l[t] * weight;
      if (h < heads && z < splits) split_weight[h][z] = weight;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(KILN_FULL_MASK, total, offset);
    if (h < heads && lane == 0) head_total[h] = total;
  }
  __syncthreads();
  const int n = heads * head_dim;
  for (int base = threadIdx.x; base < n; base += KILN_MERGE_OUTPUTS * blockDim.x) {
    float sum[KILN_MERGE_OUTPUTS] = {};
    for (int z0 = 0; z0 < splits; z0 += KILN_MERGE_SPLITS) {
      float value[KILN_MERGE_OUTPUTS][KILN_MERGE_SPLITS];
#pragma unroll
      for (int o = 0; o < KILN_MERGE_OUTPUTS; ++o) {
        const int i = base + o * blockDim.x;
#pragma unroll
        for (int j = 0; j < KILN_MERGE_SPLITS; ++j) {
          const bool in = i < n && z0 + j < splits;
          const i64 head_row = first_row + i / head_dim;
          value[o][j] = in ? __ldcg(split_part(partials, head_row, z0 + j, head_dim) + 2 + i % head_dim) : 0.0f;
        }
      }
#pragma unroll
      for (int o = 0; o < KILN_MERGE_OUTPUTS; ++o) {
        const int h = min(base + o * (int)blockDim.x, n - 1) / head_dim;
#pragma unroll
        for (int j = 0; j < KILN_MERGE_SPLITS; ++j)
          if (z0 + j < splits) sum[o] += value[o][j] * split_weight[h][z0 + j];
      }
    }
#pragma unroll
    for (int o = 0; o < KILN_MERGE_OUTPUTS; ++o) {
      const int i = base + o * blockDim.x;
      if (i >= n) break;
      const float total = head_total[i / head_dim];
      store_as(out, (first_row + i / head_dim) * head_dim + i % head_dim, total > 0.0f ? sum[o] / total : 0.0f,
               out_type);  // no keys: padding
    }
  }
}
