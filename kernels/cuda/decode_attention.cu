// Grouped-query attention on tensor cores for rows taken one at a time
// (decode steps, and prefill chunks too short for flash_attention.cu's
// tiles of 16 rows a warp), over the bf16 or E4M3 paged cache (E4M3
// widened to bf16 pairs in registers, exactly): FlashInfer's tensor-core
// decode. The query heads that share a key/value head are the rows of the
// products: S = Q·Kᵀ (heads × keys) and Oᵀ += Vᵀ·Pᵀ (head_dim × heads),
// each warp taking 16 keys at a time by mma_bf16_16816.
//
// Where grouped_attention (attention.cu) spends its issue on a warp's
// shuffle sums (four a key and head for 16 lanes' parts of a dot product),
// widening and f32 fused multiply-adds, here a chunk of 16 keys is 16
// 16-byte loads a lane, 24 products and a softmax of four scores a lane
// (two shuffles for a head's max): the kernel reads the cache at the
// memory's rate, not the issue's. No shared memory but the merge: the
// fragments are loaded straight from the cache, a product's inner order
// being free to choose:
// - S = Q·Kᵀ, k-step 2i + half: a lane (group g, pair p) holds key g's
//   values 32i + 8p .. + 7 from one 16-byte load, values + 4·half, + 1 as
//   B[2p, 2p + 1][g] and + 4·half + 2, + 3 as B[2p + 8, 2p + 9][g]; Q's
//   fragment takes the same values of head g (rows 8..15 are zero: a key/value
//   head has at most 8 query heads here).
// - Oᵀ += Vᵀ·Pᵀ: S's accumulator holds head g's scores of keys 2p, 2p + 1
//   (and 8 on), exactly Pᵀ's B fragment. Vᵀ's A fragment needs two keys'
//   values of one dimension a register: a lane loads keys 2p, 2p + 1, 2p + 8
//   and 2p + 9, values 64j + 8g .. + 7 of each, and pairs them by byte
//   permutes; row g of m-tile 4j + u is value 64j + 8g + 2u, row g + 8 the
//   one after. Oᵀ's accumulator then holds heads 2p, 2p + 1 of those values.
//
// q and the softmax weights are rounded to bf16 for the products, as in
// flash_attention.cu; scores, the softmax and the output stay f32.
//
// One block of four warps per (row, key/value head, split); warp w takes
// chunks w, w + 4, ... of 16 positions aligned to 16 (keys outside
// first..last weigh nothing), and the warps' softmax states merge through
// shared memory. Arguments, output and split-K partials are those of
// kiln_grouped_attention_g4_bf16 (attention.cu, KILN_PAGED_ATTENTION_PARAMS);
// the grid is (rows, kv_heads, splits), num_heads / kv_heads at most 8;
// head_dim is the kernel's (64, 128 or 256).
#include "kiln_cuda.cuh"
#include "paged_attention.cuh"

#define KILN_DECODE_WARPS 4
#define KILN_DECODE_THREADS (32 * KILN_DECODE_WARPS)
// Keys a warp takes at a time: two n-tiles of S, one k-step of Pᵀ.
#define KILN_DECODE_KEYS 16
// Query heads a key/value head may have: rows 0..7 of the products.
#define KILN_DECODE_HEADS 8

template <int D, typename C>
__device__ void decode_attention(KILN_PAGED_ATTENTION_PARAMS(C)) {
  constexpr int K_LOADS = D / 32;  // a key's 16-byte loads a lane, for S
  constexpr int V_LOADS = D / 64;  // and a value's, for Oᵀ
  constexpr bool LATE_V = D > 128;
  __shared__ float warp_m[KILN_DECODE_WARPS][KILN_DECODE_HEADS];
  __shared__ float warp_l[KILN_DECODE_WARPS][KILN_DECODE_HEADS];
  // Each warp's Oᵀ by head, rows of D + 2: a lane's two values of a head
  // are one 8-byte store, and a warp's 32 stores (heads 2p, values 8g + 2u)
  // fall on 16 banks, 4 wavefronts, where rows of D floats put lanes g and
  // g + 4 of every p on one bank (8 ways: Nsight Compute counted 86 % of
  // the shared stores' wavefronts as conflicts at 64 rows of Llama-3-8B).
  constexpr int O_ROW = D + 2;
  __shared__ FloatPair warp_o[KILN_DECODE_WARPS][KILN_DECODE_HEADS][O_ROW / 2];
  __shared__ float head_m[KILN_DECODE_HEADS], head_l[KILN_DECODE_HEADS];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, p = lane % 4;
  const i64 row = blockIdx.x;
  const int kv_head = blockIdx.y, heads = num_heads / kv_heads, first_head = kv_head * heads;
  // Before the wait (kiln_cuda.cuh), what the previous kernel does not
  // write: the keys this block attends (the step's inputs), the cache slot
  // of the warp's first chunk (the block tables), and that chunk's keys and
  // values asked for in L2 (all but the step's own token were written by
  // earlier steps; a prefetch reads nothing stale, L2 being the point of
  // coherence): at batch 1 two dependent lookups and a DRAM round trip off
  // the path the wait leaves.
  i64 first, last;
  const int b =
      attended_keys(row_offsets, context_lens, batch, row, window, partials != nullptr, split_keys, &first, &last);
  const int stride = kv_heads * D;
  const int first_key = (int)first, last_key = (int)last;  // positions fit 32 bits (cache_slot takes them so)
  // Lane j (and j + 16) looks up the cache slot of key base + j % 16, and
  // hands it to the lanes that read it: one lookup a lane, not six. A key
  // outside first..last reads one inside, weighted 0 below. A warp knows
  // its next chunk's slots a chunk ahead (to ask for that chunk in L2) and
  // loads the block-table entry of the chunk after it at the top of a
  // chunk, used at its end.
  constexpr int ROUND = KILN_DECODE_WARPS * KILN_DECODE_KEYS;
  const unsigned size = (unsigned)block_size;
  const i64* table = block_tables + (i64)b * blocks_per_seq;
  auto key_of = [&](int chunk) { return (unsigned)min(max(chunk + lane % KILN_DECODE_KEYS, first_key), last_key); };
  int base = (first_key & ~(KILN_DECODE_KEYS - 1)) + warp * KILN_DECODE_KEYS;
  auto slot_of = [&](int chunk) {
    const unsigned key = key_of(chunk);
    return (unsigned)cache_slot_in(cache_block_of(table, key, size), key, size);
  };
  // A chunk's keys and values asked for in L2 by the slot of this lane's
  // key: lanes 0..15 their key's row of K, 16..31 of V.
  auto prefetch_chunk = [&](unsigned chunk_slot) {
    const char* kv_row =
        reinterpret_cast<const char*>((lane < 16 ? k_cache : v_cache) + (i64)chunk_slot * stride + kv_head * D);
    for (int at = 0; at < D * (int)sizeof(C); at += 128) prefetch_l2(kv_row + at);
  };
  // The warp's first two chunks (a padding row, last_key -1, looks up
  // nothing).
  unsigned slot = 0u, next_slot = 0u;
  if (base <= last_key) {
    slot = slot_of(base);
    next_slot = slot_of(base + ROUND);
    prefetch_chunk(slot);
    if (base + ROUND <= last_key) prefetch_chunk(next_slot);
  }
  kiln_wait_inputs();

  // Q's A fragments, k-step 2i + half (rows 8..15 zero).
  unsigned qa[2 * K_LOADS][4];
#pragma unroll
  for (int i = 0; i < K_LOADS; ++i) {
    Bytes16 x[2] = {};
    if (g < heads) {
      const float* at = q + (row * num_heads + first_head + g) * D + 32 * i + 8 * p;
      x[0] = *reinterpret_cast<const Bytes16*>(at);
      x[1] = *reinterpret_cast<const Bytes16*>(at + 4);
    }
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __uint_as_float(x[j / 4].v[j % 4]);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      unsigned* a = qa[2 * i + half];
      a[0] = pack_bf16(v[4 * half], v[4 * half + 1]);
      a[2] = pack_bf16(v[4 * half + 2], v[4 * half + 3]);
      a[1] = a[3] = 0u;
    }
  }

  // Scores in log2 units: s · scale · log2 e, or capped.
  const float scale_log2 = scale * KILN_LOG2E;
  const SoftCap cap(scale, softcap);
  float o[D / 16][4] = {}, m = KILN_NEG_INF, l = 0.0f;
  for (; base <= last_key; base += ROUND) {
    // The block-table entry of the chunk after next, in flight while this
    // chunk's keys and values are read and used.
    const unsigned later_key = key_of(base + 2 * ROUND);
    const i64 later_block = cache_block_of(table, later_key, size);
    // The next chunk asked for in L2 before this one's loads (fire and
    // forget, its slots known a chunk ahead): its loads then take an L2
    // round trip, not a DRAM one (at ~200 positions unsplit, as at 64 rows
    // of Llama-3-8B, a warp takes 3 or 4 chunks in a row).
    if (base + ROUND <= last_key) prefetch_chunk(next_slot);
    auto at = [&](int j, int d) {
      return (i64)__shfl_sync(KILN_FULL_MASK, slot, j) * stride + kv_head * D + d;
    };
    Cached8<C> k_raw[2][K_LOADS];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const C* k = k_cache + at(8 * t + g, 8 * p);
#pragma unroll
      for (int i = 0; i < K_LOADS; ++i) k_raw[t][i] = load_cached8(k + 32 * i);
    }
    // V as bf16 pairs: loaded with K, or at heads of 256 once S is done
    // (K's registers free; both at once would not fit two blocks an SM).
    Bytes16 vw[4][V_LOADS];
    auto load_v = [&] {
      Cached8<C> v_raw[4][V_LOADS];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const C* v = v_cache + at(2 * p + (t & 1) + 8 * (t >> 1), 8 * g);
#pragma unroll
        for (int j = 0; j < V_LOADS; ++j) v_raw[t][j] = load_cached8(v + 64 * j);
      }
#pragma unroll
      for (int t = 0; t < 4; ++t) {
#pragma unroll
        for (int j = 0; j < V_LOADS; ++j) vw[t][j] = bf16_pairs8(v_raw[t][j]);
      }
    };
    if constexpr (!LATE_V) load_v();
    // K as bf16 pairs, once its loads are in flight.
    Bytes16 kw[2][K_LOADS];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int i = 0; i < K_LOADS; ++i) kw[t][i] = bf16_pairs8(k_raw[t][i]);
    }

    // S: this lane's scores of head g, keys 2p, 2p + 1, 8 + 2p, 9 + 2p.
    float s[2][4] = {};
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int i = 0; i < K_LOADS; ++i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          unsigned kb[2] = {kw[t][i].v[2 * half], kw[t][i].v[2 * half + 1]};
          mma_bf16_16816(s[t], qa[2 * i + half], kb);
        }
      }
    }
    float score[4], m_chunk = KILN_NEG_INF;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float v = s[c / 2][c % 2];
      v = softcap > 0.0f ? cap(v) : v * scale_log2;
      const int key = base + 8 * (c / 2) + 2 * p + (c % 2);
      score[c] = key >= first_key && key <= last_key ? v : KILN_NEG_INF;
      m_chunk = fmaxf(m_chunk, score[c]);
    }
    m_chunk = fmaxf(m_chunk, __shfl_xor_sync(KILN_FULL_MASK, m_chunk, 1));
    m_chunk = fmaxf(m_chunk, __shfl_xor_sync(KILN_FULL_MASK, m_chunk, 2));
    const float m_new = fmaxf(m, m_chunk);
    // No key seen yet: nothing to rescale (and 2^(-inf - -inf) is NaN).
    const float correction = m_new == KILN_NEG_INF ? 1.0f : fast_exp2(m - m_new);
    float weight[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) weight[c] = score[c] == KILN_NEG_INF ? 0.0f : fast_exp2(score[c] - m_new);
    l = l * correction + (weight[0] + weight[1]) + (weight[2] + weight[3]);
    m = m_new;
    // Oᵀ's columns are heads 2p and 2p + 1, whose corrections lanes 8p and
    // 8p + 4 hold.
    const float c_even = __shfl_sync(KILN_FULL_MASK, correction, 8 * p);
    const float c_odd = __shfl_sync(KILN_FULL_MASK, correction, 8 * p + 4);
    if constexpr (LATE_V) load_v();
    const unsigned pb[2] = {pack_bf16(weight[0], weight[1]), pack_bf16(weight[2], weight[3])};
#pragma unroll
    for (int j = 0; j < V_LOADS; ++j) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        float* acc = o[4 * j + u];
        acc[0] *= c_even;
        acc[1] *= c_odd;
        acc[2] *= c_even;
        acc[3] *= c_odd;
        const unsigned va[4] = {__byte_perm(vw[0][j].v[u], vw[1][j].v[u], 0x5410),
                                __byte_perm(vw[0][j].v[u], vw[1][j].v[u], 0x7632),
                                __byte_perm(vw[2][j].v[u], vw[3][j].v[u], 0x5410),
                                __byte_perm(vw[2][j].v[u], vw[3][j].v[u], 0x7632)};
        mma_bf16_16816(acc, va, pb);
      }
    }
    slot = next_slot;
    next_slot = (unsigned)cache_slot_in(later_block, later_key, size);
  }

  // The warps' states merged per head: each lane's sum of weights over its
  // group's four lanes, then across the warps through shared memory.
  l += __shfl_xor_sync(KILN_FULL_MASK, l, 1);
  l += __shfl_xor_sync(KILN_FULL_MASK, l, 2);
  if (p == 0) {
    warp_m[warp][g] = m;
    warp_l[warp][g] = l;
  }
#pragma unroll
  for (int j = 0; j < V_LOADS; ++j) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int d = 64 * j + 8 * g + 2 * u;
      warp_o[warp][2 * p][d / 2] = FloatPair{o[4 * j + u][0], o[4 * j + u][2]};
      warp_o[warp][2 * p + 1][d / 2] = FloatPair{o[4 * j + u][1], o[4 * j + u][3]};
    }
  }
  __syncthreads();
  merge_softmax_parts(&warp_m[0][0], &warp_l[0][0], KILN_DECODE_WARPS, KILN_DECODE_HEADS, heads, head_m, head_l);
  for (int i = threadIdx.x; i < heads * D; i += blockDim.x) {
    const int h = i / D, d = i % D;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < KILN_DECODE_WARPS; ++w)
      sum += reinterpret_cast<const float*>(warp_o[w][h])[d] * warp_m[w][h];
    write_head_value(out, partials, row * num_heads + first_head + h, D, d, head_m[h], head_l[h], sum, out_type);
  }
  if (partials != nullptr)
    merge_head_splits(out, partials, split_counters, row, first_head, heads, num_heads, D, out_type);
}

// The entry points, by cache element and head size; `head_dim` must be the
// kernel's. decode_attention waits for its inputs itself.
#define KILN_DECODE_ATTENTION(D) decode_attention<D>(KILN_PAGED_ATTENTION_ARGS)

// Four blocks an SM at head 64 (at most 128 registers); three at 128 (168:
// within 128 a chunk's loads of bf16 spill), two for E4M3 on sm_80, whose
// conversions by bit arithmetic spill within 168; two at 256.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#define KILN_DECODE_FP8_D128_BLOCKS 2
#else
#define KILN_DECODE_FP8_D128_BLOCKS 3
#endif
extern "C" __global__ void __launch_bounds__(KILN_DECODE_THREADS, 4)
    kiln_decode_attention_bf16_d64(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  KILN_DECODE_ATTENTION(64);
}
extern "C" __global__ void __launch_bounds__(KILN_DECODE_THREADS, 3)
    kiln_decode_attention_bf16_d128(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  KILN_DECODE_ATTENTION(128);
}
extern "C" __global__ void __launch_bounds__(KILN_DECODE_THREADS, 2)
    kiln_decode_attention_bf16_d256(KILN_PAGED_ATTENTION_PARAMS(bf16_bits)) {
  KILN_DECODE_ATTENTION(256);
}
extern "C" __global__ void __launch_bounds__(KILN_DECODE_THREADS, 4)
    kiln_decode_attention_fp8_d64(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  KILN_DECODE_ATTENTION(64);
}
extern "C" __global__ void __launch_bounds__(KILN_DECODE_THREADS, KILN_DECODE_FP8_D128_BLOCKS)
    kiln_decode_attention_fp8_d128(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  KILN_DECODE_ATTENTION(128);
}
extern "C" __global__ void __launch_bounds__(KILN_DECODE_THREADS, 2)
    kiln_decode_attention_fp8_d256(KILN_PAGED_ATTENTION_PARAMS(fp8_e4m3)) {
  KILN_DECODE_ATTENTION(256);
}
