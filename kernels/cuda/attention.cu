// Attention over the paged KV cache for a ragged batch (chunked prefill and
// decode alike). The cache of one layer is [blocks, block_size, kv_heads,
// head_dim], f32, bf16 or E4M3 (`_bf16` and `_fp8` kernels: a half or a
// quarter of the bytes to read, computed in f32; fp8_e4m3 in kiln_cuda.cuh);
// sequence b's rows are row_offsets[b]..row_offsets[b+1] of the batch, and
// its last row sits at position context_lens[b] - 1. A padding
// sequence (a decode step padded to a CUDA graph's batch size) has context
// length 0: its row sits at position -1, nothing is written to the cache for
// it and its attention output is zero.
#include "kiln_cuda.cuh"
#include "paged_attention.cuh"

#define KILN_ATTN_WARPS 4
// Heads up to 256 values: 8 per lane, keys four at a time. The `_wide`
// kernels take heads up to 576 (DeepSeek's latent head, 512 + 64): 18 per
// lane, keys two at a time, to stay within the registers.
#define KILN_ATTN_PER_LANE 8
#define KILN_ATTN_KEYS 4
#define KILN_ATTN_WIDE_PER_LANE 18
#define KILN_ATTN_WIDE_KEYS 2

// Writes this step's keys and values [T, kv_heads, head_dim] into the cache:
// one block per row (up to 1024 threads, a decode row's values in one round).
template <typename C>
__device__ void write_kv(const float* __restrict__ k, const float* __restrict__ v, C* __restrict__ k_cache,
                         C* __restrict__ v_cache, const i64* __restrict__ row_offsets,
                         const i64* __restrict__ context_lens, const i64* __restrict__ block_tables, int batch,
                         int blocks_per_seq, int block_size, int stride) {
  i64 row = blockIdx.x, position;
  // The row's first keys and values are loaded before the slot is looked up
  // (three dependent reads of the batch description), so the two overlap.
  float k0 = 0.0f, v0 = 0.0f;
  if (threadIdx.x < stride) {
    k0 = k[row * stride + threadIdx.x];
    v0 = v[row * stride + threadIdx.x];
  }
  int b = sequence_of(row_offsets, context_lens, batch, row, &position);
  if (position < 0) return;  // padding
  i64 at = cache_slot(block_tables, b, blocks_per_seq, block_size, position) * stride;
  if (threadIdx.x < stride) {
    cache_store(k_cache + at + threadIdx.x, k0);
    cache_store(v_cache + at + threadIdx.x, v0);
  }
  for (int i = threadIdx.x + blockDim.x; i < stride; i += blockDim.x) {
    cache_store(k_cache + at + i, k[row * stride + i]);
    cache_store(v_cache + at + i, v[row * stride + i]);
  }
}

extern "C" __global__ void __launch_bounds__(KILN_MAX_THREADS, 1) kiln_write_kv(const float* __restrict__ k, const float* __restrict__ v,
                                         float* __restrict__ k_cache, float* __restrict__ v_cache,
                                         const i64* __restrict__ row_offsets, const i64* __restrict__ context_lens,
                                         const i64* __restrict__ block_tables, int batch, int blocks_per_seq,
                                         int block_size, int stride) {
  kiln_wait_inputs();
  write_kv(k, v, k_cache, v_cache, row_offsets, context_lens, block_tables, batch, blocks_per_seq, block_size,
           stride);
}

extern "C" __global__ void __launch_bounds__(KILN_MAX_THREADS, 1) kiln_write_kv_bf16(const float* __restrict__ k, const float* __restrict__ v,
                                              bf16_bits* __restrict__ k_cache, bf16_bits* __restrict__ v_cache,
                                              const i64* __restrict__ row_offsets,
                                              const i64* __restrict__ context_lens,
                                              const i64* __restrict__ block_tables, int batch, int blocks_per_seq,
                                              int block_size, int stride) {
  kiln_wait_inputs();
  write_kv(k, v, k_cache, v_cache, row_offsets, context_lens, block_tables, batch, blocks_per_seq, block_size,
           stride);
}

extern "C" __global__ void __launch_bounds__(KILN_MAX_THREADS, 1) kiln_write_kv_fp8(const float* __restrict__ k, const float* __restrict__ v,
                                              fp8_e4m3* __restrict__ k_cache, fp8_e4m3* __restrict__ v_cache,
                                              const i64* __restrict__ row_offsets,
                                              const i64* __restrict__ context_lens,
                                              const i64* __restrict__ block_tables, int batch, int blocks_per_seq,
                                              int block_size, int stride) {
  kiln_wait_inputs();
  write_kv(k, v, k_cache, v_cache, row_offsets, context_lens, block_tables, batch, blocks_per_seq, block_size,
           stride);
}

// Where head `kv_head` of key position `key` starts in a paged cache.
struct PagedKeys {
  const i64* block_tables;
  int b, blocks_per_seq, block_size, stride;
  __device__ __forceinline__ i64 operator()(i64 key, int kv_head, int head_dim) const {
    return cache_slot(block_tables, b, blocks_per_seq, block_size, key) * stride + (i64)kv_head * head_dim;
  }
};

// Where head `kv_head` of a sequence's key `key` starts in this step's own
// keys [T, kv_heads, head_dim], the sequence's rows starting at `first_row`.
struct RowKeys {
  i64 first_row;
  int stride;
  __device__ __forceinline__ i64 operator()(i64 key, int kv_head, int head_dim) const {
    return (first_row + key) * stride + (i64)kv_head * head_dim;
  }
};

// One (row, query head) of attention over keys first..last (found through
// `keys`): four warps split the keys four at a time, each keeping an online
// softmax, then merge. Writes the normalized output to `out_row`, or with
// `part` set the running max, sum of weights and unnormalized output
// ([m, l, acc...], for split-K). `softcap` > 0 applies cap·tanh(score / cap).
// Products and sums are fused multiply-adds and weights powers of two
// (fast_exp2), as in grouped_attention.
// A lane holds PER_LANE values of the head (head_dim ≤ 32 · PER_LANE); a
// warp takes KEYS keys at a time.
template <int PER_LANE, int KEYS, typename C, typename Keys>
__device__ void attend_keys(const float* __restrict__ q_row, const C* __restrict__ k, const C* __restrict__ v,
                            OutRow out_row, float* __restrict__ part, Keys keys, int kv_head,
                            i64 first, i64 last, int head_dim, float scale, float softcap) {
  __shared__ float warp_m[KILN_ATTN_WARPS];
  __shared__ float warp_l[KILN_ATTN_WARPS];
  __shared__ float warp_acc[KILN_ATTN_WARPS][32 * PER_LANE];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float qr[PER_LANE], acc[PER_LANE];
  // Scores in log2 units, as grouped_attention keeps them: without a cap q
  // is scaled once by scale · log2 e.
  float q_scale = softcap > 0.0f ? 1.0f : scale * KILN_LOG2E;
  const SoftCap cap(scale, softcap);
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j) {
    int d = lane + 32 * j;
    qr[j] = d < head_dim ? q_row[d] * q_scale : 0.0f;
    acc[j] = 0.0f;
  }
  // Each warp takes KEYS keys at a time: their loads are in
  // flight together and their reductions interleave, where one key at a
  // time would wait a memory round trip and a shuffle chain per key.
  float m = KILN_NEG_INF, l = 0.0f;
  for (i64 key0 = first + warp * KEYS; key0 <= last; key0 += KILN_ATTN_WARPS * KEYS) {
    float kr[KEYS][PER_LANE], vr[KEYS][PER_LANE], s[KEYS];
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      i64 key = min(key0 + t, last);  // past the end: a repeat, weighted 0 below
      i64 base = keys(key, kv_head, head_dim);
#pragma unroll
      for (int j = 0; j < PER_LANE; ++j) {
        int d = lane + 32 * j;
        kr[t][j] = d < head_dim ? cache_load(k + base + d) : 0.0f;
        vr[t][j] = d < head_dim ? cache_load(v + base + d) : 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < PER_LANE; ++j) dot = fmaf(qr[j], kr[t][j], dot);
      s[t] = dot;
    }
    float m_new = m;
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      s[t] = warp_sum(s[t]);
      if (softcap > 0.0f) s[t] = cap(s[t]);
      if (key0 + t <= last) m_new = fmaxf(m_new, s[t]);
    }
    // No key seen yet: nothing to rescale (and 2^(-inf - -inf) is NaN).
    float correction = m_new == KILN_NEG_INF ? 1.0f : fast_exp2(m - m_new);
    l *= correction;
#pragma unroll
    for (int j = 0; j < PER_LANE; ++j) acc[j] *= correction;
#pragma unroll
    for (int t = 0; t < KEYS; ++t) {
      float p = key0 + t <= last ? fast_exp2(s[t] - m_new) : 0.0f;
      l += p;
#pragma unroll
      for (int j = 0; j < PER_LANE; ++j) acc[j] = fmaf(p, vr[t][j], acc[j]);
    }
    m = m_new;
  }
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j) {
    int d = lane + 32 * j;
    if (d < head_dim) warp_acc[warp][d] = acc[j];
  }
  __syncthreads();
  float m_all = KILN_NEG_INF;
  for (int w = 0; w < KILN_ATTN_WARPS; ++w) m_all = fmaxf(m_all, warp_m[w]);
  float total = 0.0f;
  float weight[KILN_ATTN_WARPS];
  for (int w = 0; w < KILN_ATTN_WARPS; ++w) {
    weight[w] = warp_l[w] > 0.0f ? fast_exp2(warp_m[w] - m_all) : 0.0f;
    total += warp_l[w] * weight[w];
  }
  if (part != nullptr && threadIdx.x == 0) {
    part[0] = m_all * KILN_LN2;  // merge_head_splits' units (natural log)
    part[1] = total;
  }
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < KILN_ATTN_WARPS; ++w) sum += warp_acc[w][d] * weight[w];
    if (part != nullptr)
      part[2 + d] = sum;
    else
      out_row.set(d, total > 0.0f ? sum / total : 0.0f);  // no keys: padding
  }
}

// out [T, num_heads, head_dim]: one block per (row, query head) over the
// row's visible cached positions; query head h reads key/value head
// h / (num_heads / kv_heads). `window` > 0 keeps the last `window` positions.
//
// Split-K (flash-decoding), for steps with few rows and long contexts: with
// `partials` set, blockIdx.z takes keys z·split_keys .. (z+1)·split_keys - 1
// only and writes its running max, sum of weights and unnormalized output to
// partials[((row · num_heads + head) · gridDim.z + z) · (head_dim + 2)]:
// [m, l, acc...]; the last of a (row, head)'s blocks to finish merges them
// into `out` (`last_block_done`, counting in split_counters[row · gridDim.y +
// blockIdx.y], which start at zero and are left at zero).
// `out` holds elements of type `out_type` (KILN_OUT_*: f32, or the half type
// of the output projection reading it).
template <int PER_LANE, int KEYS, typename C>
__device__ void paged_attention(KILN_PAGED_ATTENTION_PARAMS(C)) {
  const i64 row = blockIdx.x;
  int head = blockIdx.y;
  i64 first, last;
  const int b =
      attended_keys(row_offsets, context_lens, batch, row, window, partials != nullptr, split_keys, &first, &last);
  float* part = partials == nullptr
                    ? nullptr
                    : partials + ((row * num_heads + head) * gridDim.z + blockIdx.z) * (head_dim + 2);
  PagedKeys keys{block_tables, b, blocks_per_seq, block_size, kv_heads * head_dim};
  OutRow out_row{out, (row * num_heads + head) * head_dim, out_type};
  attend_keys<PER_LANE, KEYS>(q + (row * num_heads + head) * head_dim, k_cache, v_cache, out_row, part, keys,
                             head / (num_heads / kv_heads), first, last, head_dim, scale, softcap);
  if (part != nullptr) merge_head_splits(out, partials, split_counters, row, head, 1, num_heads, head_dim, out_type);
}

// Grouped-query attention over the paged cache, for heads of a multiple of 8
// values up to 256: one block of KILN_GQA_THREADS per (row, key/value head,
// group of up to GROUP of the query heads that read it, split), so the
// key/value head's positions are read once for the whole group (the
// per-query-head kernel above reads them once per query head: 4 times for
// Llama-3's 32 heads over 8). A key takes `lanes` lanes (head_dim / 8
// rounded up to a power of two), each holding 8 of its values from one
// 16-byte load (bf16; two of f32); a block's lane groups take KILN_GQA_KEYS
// keys each per round, their loads in flight together, and keep an online
// softmax per query head, merged through shared memory at the end. A
// round's loads (the block-table lookups and the keys and values) are
// issued before the previous round's arithmetic, so each round's memory
// round trips overlap the last one's work rather than follow it (at 64
// decode rows of 256 positions, 16 rounds a block, latency-bound).
// Scores are kept in units of log2 (q scaled by scale · log2 e once, the
// weights 2^(s - m) by fast_exp2), products and sums are fused
// multiply-adds, and a round's eight sums over each key's lanes share one
// loop of shuffles: at 64 decode rows of ~200 positions the kernel was
// bound by issue, not memory (57.8 µs a layer on the H200 for ~50 MB of
// cache, 0.86 TB/s), its two unrolled rounds taking ~1,960 instructions
// in sm_90 SASS (a plain product and sum issue twice under --fmad=false,
// expf a dozen, a 64-bit division in cache_slot a subroutine call), now
// ~1,140 (unmeasured on a GPU).
// Same arguments, output and split-K partials as paged_attention; the grid
// is (rows, kv_heads · ⌈group / GROUP⌉, splits).
#define KILN_GQA_THREADS 128
#define KILN_GQA_KEYS 2

template <int GROUP, typename C>
__device__ void grouped_attention(KILN_PAGED_ATTENTION_PARAMS(C)) {
  // Per lane group: its running max and sum of weights per query head, and
  // its unnormalized outputs; then each head's merged max and sum, and each
  // lane group's weight in the merge.
  __shared__ float group_m[KILN_GQA_THREADS][GROUP];
  __shared__ float group_l[KILN_GQA_THREADS][GROUP];
  __shared__ float group_acc[GROUP][KILN_GQA_THREADS * 8];
  __shared__ float head_m[GROUP], head_l[GROUP];
  const i64 row = blockIdx.x;
  int per_kv = num_heads / kv_heads, head_groups = (per_kv + GROUP - 1) / GROUP;
  int kv_head = blockIdx.y / head_groups, in_group = (blockIdx.y % head_groups) * GROUP;
  int first_head = kv_head * per_kv + in_group, heads = min(GROUP, per_kv - in_group);
  i64 first, last;
  const int b =
      attended_keys(row_offsets, context_lens, batch, row, window, partials != nullptr, split_keys, &first, &last);
  int lanes = 1;
  while (lanes * 8 < head_dim) lanes *= 2;
  int groups = blockDim.x / lanes, group = threadIdx.x / lanes, d0 = (threadIdx.x % lanes) * 8;
  bool holds = d0 < head_dim;  // lanes past a head of 8·(non-power-of-two) values hold nothing
  float qr[GROUP][8], acc[GROUP][8], m[GROUP], l[GROUP];
#pragma unroll
  for (int h = 0; h < GROUP; ++h) {
#pragma unroll
    for (int j = 0; j < 8; ++j) qr[h][j] = acc[h][j] = 0.0f;
    if (holds && h < heads) load8(q + (row * num_heads + first_head + h) * head_dim + d0, qr[h]);
    // Without a cap, q scaled once so that dot products are scores in log2.
#pragma unroll
    for (int j = 0; j < 8; ++j) qr[h][j] *= softcap > 0.0f ? 1.0f : scale * KILN_LOG2E;
    m[h] = KILN_NEG_INF;
    l[h] = 0.0f;
  }
  const SoftCap cap(scale, softcap);
  PagedKeys keys{block_tables, b, blocks_per_seq, block_size, kv_heads * head_dim};
  const i64 step = (i64)groups * KILN_GQA_KEYS;
  // The round at `base`'s keys and values, as loaded (zeros for lanes that
  // hold nothing); past the end, a repeat of the last key, weighted 0 below.
  Cached8<C> next_k[KILN_GQA_KEYS], next_v[KILN_GQA_KEYS];
  auto fetch = [&](i64 base) {
#pragma unroll
    for (int t = 0; t < KILN_GQA_KEYS; ++t) {
      next_k[t] = next_v[t] = Cached8<C>{};
      if (holds) {
        i64 at = keys(min(base + group + t * groups, last), kv_head, head_dim) + d0;
        next_k[t] = load_cached8(k_cache + at);
        next_v[t] = load_cached8(v_cache + at);
      }
    }
  };
  if (first <= last) fetch(first);
  // Rounds are the same for the whole block (the shuffles need every lane).
  for (i64 base = first; base <= last; base += step) {
    float kr[KILN_GQA_KEYS][8], vr[KILN_GQA_KEYS][8];
#pragma unroll
    for (int t = 0; t < KILN_GQA_KEYS; ++t) {
      widen8(next_k[t], kr[t]);
      widen8(next_v[t], vr[t]);
    }
    if (base + step <= last) fetch(base + step);
    // Every head's dot products with the round's keys, then their sums
    // over each key's lanes together (one loop of shuffles for all).
    float s[GROUP][KILN_GQA_KEYS];
#pragma unroll
    for (int h = 0; h < GROUP; ++h) {
#pragma unroll
      for (int t = 0; t < KILN_GQA_KEYS; ++t) {
        s[h][t] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) s[h][t] = fmaf(qr[h][j], kr[t][j], s[h][t]);
      }
    }
    for (int offset = lanes / 2; offset > 0; offset >>= 1) {
#pragma unroll
      for (int h = 0; h < GROUP; ++h) {
#pragma unroll
        for (int t = 0; t < KILN_GQA_KEYS; ++t) s[h][t] += __shfl_xor_sync(KILN_FULL_MASK, s[h][t], offset);
      }
    }
#pragma unroll
    for (int h = 0; h < GROUP; ++h) {
      float m_new = m[h];
#pragma unroll
      for (int t = 0; t < KILN_GQA_KEYS; ++t) {
        if (softcap > 0.0f) s[h][t] = cap(s[h][t]);
        if (base + group + t * groups <= last) m_new = fmaxf(m_new, s[h][t]);
      }
      // No key seen yet: nothing to rescale (and 2^(-inf - -inf) is NaN).
      float correction = m_new == KILN_NEG_INF ? 1.0f : fast_exp2(m[h] - m_new);
      l[h] *= correction;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[h][j] *= correction;
#pragma unroll
      for (int t = 0; t < KILN_GQA_KEYS; ++t) {
        float p = base + group + t * groups <= last ? fast_exp2(s[h][t] - m_new) : 0.0f;
        l[h] += p;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[h][j] = fmaf(p, vr[t][j], acc[h][j]);
      }
      m[h] = m_new;
    }
  }
#pragma unroll
  for (int h = 0; h < GROUP; ++h) {
    if (d0 == 0) {
      group_m[group][h] = m[h];
      group_l[group][h] = l[h];
    }
    if (holds) {
#pragma unroll
      for (int j = 0; j < 8; ++j) group_acc[h][group * head_dim + d0 + j] = acc[h][j];
    }
  }
  __syncthreads();
  merge_softmax_parts(&group_m[0][0], &group_l[0][0], groups, GROUP, heads, head_m, head_l);
  for (int i = threadIdx.x; i < heads * head_dim; i += blockDim.x) {
    int h = i / head_dim, d = i % head_dim;
    float sum = 0.0f;
    for (int g = 0; g < groups; ++g) sum += group_acc[h][g * head_dim + d] * group_m[g][h];
    write_head_value(out, partials, row * num_heads + first_head + h, head_dim, d, head_m[h], head_l[h], sum,
                     out_type);
  }
  if (partials != nullptr)
    merge_head_splits(out, partials, split_counters, row, first_head, heads, num_heads, head_dim, out_type);
}

// Attention within each sequence of a ragged batch over this step's own keys
// and values [T, kv_heads, head_dim], with no cache (encoders): one block per
// (row, query head); every row of the sequence is visible, or with `causal`
// the rows up to its own.
extern "C" __global__ void kiln_sequence_attention(const float* __restrict__ q, const float* __restrict__ k,
                                                   const float* __restrict__ v, float* __restrict__ out,
                                                   const i64* __restrict__ row_offsets, int batch, int num_heads,
                                                   int kv_heads, int head_dim, float scale, int causal) {
  kiln_wait_inputs();
  i64 row = blockIdx.x;
  int head = blockIdx.y;
  int b = sequence_of_row(row_offsets, batch, row);
  i64 start = row_offsets[b];
  i64 last = causal ? row - start : row_offsets[b + 1] - start - 1;
  RowKeys keys{start, kv_heads * head_dim};
  attend_keys<KILN_ATTN_PER_LANE, KILN_ATTN_KEYS>(q + (row * num_heads + head) * head_dim, k, v,
                                                 OutRow{out, (row * num_heads + head) * head_dim, KILN_OUT_F32},
                                                 (float*)nullptr, keys,
                                                 head / (num_heads / kv_heads), (i64)0, last, head_dim, scale, 0.0f);
}

// The entry points: f32, bf16 or E4M3 cache, heads up to 256 or (`_wide`) 576.
extern "C" __global__ void kiln_paged_attention(KILN_PAGED_ATTENTION_PARAMS(float)) {
  kiln_wait_inputs();
  paged_attention<KILN_ATTN_PER_LANE, KILN_ATTN_KEYS>(KILN_PAGED_ATTENTION_ARGS);
}

extern "C" __global__ void kiln_paged_attention_bf16(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  kiln_wait_inputs();
  paged_attention<KILN_ATTN_PER_LANE, KILN_ATTN_KEYS>(KILN_PAGED_ATTENTION_ARGS);
}

extern "C" __global__ void kiln_paged_attention_fp8(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  kiln_wait_inputs();
  paged_attention<KILN_ATTN_PER_LANE, KILN_ATTN_KEYS>(KILN_PAGED_ATTENTION_ARGS);
}

extern "C" __global__ void kiln_paged_attention_wide(KILN_PAGED_ATTENTION_PARAMS(float)) {
  kiln_wait_inputs();
  paged_attention<KILN_ATTN_WIDE_PER_LANE, KILN_ATTN_WIDE_KEYS>(KILN_PAGED_ATTENTION_ARGS);
}

extern "C" __global__ void kiln_paged_attention_wide_bf16(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  kiln_wait_inputs();
  paged_attention<KILN_ATTN_WIDE_PER_LANE, KILN_ATTN_WIDE_KEYS>(KILN_PAGED_ATTENTION_ARGS);
}

extern "C" __global__ void kiln_paged_attention_wide_fp8(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  kiln_wait_inputs();
  paged_attention<KILN_ATTN_WIDE_PER_LANE, KILN_ATTN_WIDE_KEYS>(KILN_PAGED_ATTENTION_ARGS);
}

// Grouped-query entry points (GROUP query heads a block): f32, bf16 or E4M3
// cache.
extern "C" __global__ void kiln_grouped_attention_g1(KILN_PAGED_ATTENTION_PARAMS(float)) {
  kiln_wait_inputs();
  grouped_attention<1>(KILN_PAGED_ATTENTION_ARGS);
}
extern "C" __global__ void kiln_grouped_attention_g2(KILN_PAGED_ATTENTION_PARAMS(float)) {
  kiln_wait_inputs();
  grouped_attention<2>(KILN_PAGED_ATTENTION_ARGS);
}
extern "C" __global__ void kiln_grouped_attention_g4(KILN_PAGED_ATTENTION_PARAMS(float)) {
  kiln_wait_inputs();
  grouped_attention<4>(KILN_PAGED_ATTENTION_ARGS);
}
extern "C" __global__ void kiln_grouped_attention_g1_bf16(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  kiln_wait_inputs();
  grouped_attention<1>(KILN_PAGED_ATTENTION_ARGS);
}
extern "C" __global__ void kiln_grouped_attention_g2_bf16(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  kiln_wait_inputs();
  grouped_attention<2>(KILN_PAGED_ATTENTION_ARGS);
}
// Four blocks an SM (at most 128 registers: sm_80/sm_90 fit them without
// spills, the same main loop give or take a few instructions; 156 unbounded
// left three): Llama-3's 8 key/value heads at 64 decode rows are 512 blocks,
// one wave on 132 SMs instead of 1.3. The f32 cache's kernel would spill.
extern "C" __global__ void __launch_bounds__(KILN_GQA_THREADS, 4)
    kiln_grouped_attention_g4_bf16(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  kiln_wait_inputs();
  grouped_attention<4>(KILN_PAGED_ATTENTION_ARGS);
}
extern "C" __global__ void kiln_grouped_attention_g1_fp8(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  kiln_wait_inputs();
  grouped_attention<1>(KILN_PAGED_ATTENTION_ARGS);
}
extern "C" __global__ void kiln_grouped_attention_g2_fp8(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  kiln_wait_inputs();
  grouped_attention<2>(KILN_PAGED_ATTENTION_ARGS);
}
// Unbounded: within 128 registers (the bf16 kernel's four blocks an SM) the
// widened keys and values spill.
extern "C" __global__ void kiln_grouped_attention_g4_fp8(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  kiln_wait_inputs();
  grouped_attention<4>(KILN_PAGED_ATTENTION_ARGS);
}
