// Flash attention on tensor cores for prefill and chunked-prefill steps, over
// the bf16 or E4M3 paged KV cache (FlashAttention-2's scheme: queries stay
// in registers, key/value tiles pass through shared memory, the softmax is
// online, nothing of size T × T is ever stored). An E4M3 tile is widened to
// bf16 in shared memory as it arrives (`widen_tile`), so the products are
// the bf16 cache's.
//
// One block of eight warps takes 128 query rows of one sequence for one query
// head; each warp owns 16 rows. Key/value tiles of 64 positions are gathered
// from the paged cache into shared memory by asynchronous 16-byte copies
// (cp.async), each warp computing S = Q·Kᵀ and O += P·V with
// `mma_bf16_16816` (bf16 inputs, f32 accumulation; fragments by ldmatrix):
// the PTX instructions on sm_80+, warp-level emulations of the same layouts
// on the kernel emulator. Q and P are rounded to bf16 for the products, as
// FlashAttention does; scores, the softmax and the output stay f32.
//
// The copies overlap the products (FlashAttention-2's pipeline, one buffer
// each for K and V): tile j's values are fetched while the block computes
// S = Q·K_jᵀ and its softmax, and tile j + 1's keys while it computes
// O += P·V_j. 128 rows share each tile that passes through shared memory
// (half the bytes a FLOP of 64-row blocks). One block of eight warps an SM:
// at ~250 registers a thread (d128) that is what two blocks of four were;
// at ~170 (d64) three of four fitted, so d64 trades a third of its warps
// for the halved tile traffic and the overlap (unmeasured).
//
// Arguments and layouts are those of kiln_paged_attention_bf16 (attention.cu)
// without the split-K ones (`out` of type `out_type`, KILN_OUT_*): causal over positions, `window` > 0 keeps the last
// `window` positions, `softcap` > 0 applies cap·tanh(score / cap). The grid's
// x is the query head (the heads of one key/value head run side by side and
// share its tiles in L2), y covers the query tiles of every sequence
// (⌈rows_b / 128⌉ each; blocks past the last tile return), taken in reverse:
// a prompt's last tiles, which see the most keys, start first, so the
// shortest ones fill the tail of the launch.
#include "kiln_cuda.cuh"

#define KILN_FLASH_WARPS 8
#define KILN_FLASH_THREADS (32 * KILN_FLASH_WARPS)
#define KILN_FLASH_ROWS (16 * KILN_FLASH_WARPS)
#define KILN_FLASH_KEYS 64

// Finds query tile `tile` of the batch: its sequence and first row; false
// past the last tile.
__device__ __forceinline__ bool find_tile(const i64* row_offsets, int batch, int tile, int* seq, i64* first_row) {
  for (int b = 0; b < batch; ++b) {
    i64 rows = row_offsets[b + 1] - row_offsets[b];
    int tiles = (int)((rows + KILN_FLASH_ROWS - 1) / KILN_FLASH_ROWS);
    if (tile < tiles) {
      *seq = b;
      *first_row = row_offsets[b] + (i64)tile * KILN_FLASH_ROWS;
      return true;
    }
    tile -= tiles;
  }
  return false;
}

// The cache slots of positions first..first+63 of sequence b into `slots`
// (by the block's first 64 threads), -1 past `last`: looked up once per
// tile, where every 16-byte piece would repeat the block-table division and
// load. Read by other threads after the next barrier.
__device__ __forceinline__ void find_slots(int* slots, const i64* __restrict__ block_tables, int b,
                                           int blocks_per_seq, int block_size, int first, int last) {
  if (threadIdx.x < KILN_FLASH_KEYS) {
    int position = first + threadIdx.x;
    slots[threadIdx.x] = position <= last ? (int)cache_slot(block_tables, b, blocks_per_seq, block_size, position) : -1;
  }
}

// Issues this thread's share of the asynchronous copies of one kv head's
// tile of 64 positions at `slots` into `tile` [64][D + 8] bf16 (padded rows:
// fragment loads of neighbouring rows fall in different banks); positions
// without a slot become zeros, so masked weights never meet NaN. The tile is
// there once the thread has waited for its copies (copy_async_wait), has
// widened them (widen_tile) and the block has passed a barrier. A bf16
// cache's 16-byte pieces (8 values) go to the tile as they are; an E4M3
// cache's (16 values) to `stage`, piece i at stage[i], for widen_tile.
template <int D, typename C>
__device__ __forceinline__ void load_tile(bf16_bits* tile, Bytes16* stage, const int* slots,
                                          const C* __restrict__ cache, int stride, int kv_head) {
  const int values = 16 / (int)sizeof(C), chunks = D / values, pieces = KILN_FLASH_KEYS * chunks;
#pragma unroll
  for (int p = 0; p < (pieces + KILN_FLASH_THREADS - 1) / KILN_FLASH_THREADS; ++p) {
    int i = threadIdx.x + p * KILN_FLASH_THREADS, key = i / chunks, chunk = i % chunks;
    if (i >= pieces) break;
    int slot = slots[key];
    void* to = sizeof(C) == 1 ? (void*)(stage + i) : (void*)(tile + key * (D + 8) + chunk * 8);
    copy_async_16(to, cache + (i64)max(slot, 0) * stride + kv_head * D + chunk * values, slot >= 0);
  }
}

// An E4M3 cache's tile: the pieces this thread copied to `stage` widened
// into `tile` as bf16 (exactly: every E4M3 value is a bf16 value), after its
// copy_async_wait and before the barrier that publishes the tile. Nothing
// for a bf16 cache.
template <int D, typename C>
__device__ __forceinline__ void widen_tile(bf16_bits* tile, const Bytes16* stage) {
  if (sizeof(C) != 1) return;
  const int chunks = D / 16, pieces = KILN_FLASH_KEYS * chunks;
#pragma unroll
  for (int p = 0; p < (pieces + KILN_FLASH_THREADS - 1) / KILN_FLASH_THREADS; ++p) {
    int i = threadIdx.x + p * KILN_FLASH_THREADS, key = i / chunks, chunk = i % chunks;
    if (i >= pieces) break;
    Bytes16 raw = stage[i], half[2];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      float v[4];
      e4m3x4_to_f32(raw.v[w], v);
      half[w / 2].v[2 * (w % 2)] = pack_bf16(v[0], v[1]);
      half[w / 2].v[2 * (w % 2) + 1] = pack_bf16(v[2], v[3]);
    }
    Bytes16* to = reinterpret_cast<Bytes16*>(tile + key * (D + 8) + chunk * 16);
    to[0] = half[0];
    to[1] = half[1];
  }
}

template <int D, typename C>
__device__ void flash_attention(const float* __restrict__ q, const C* __restrict__ k_cache,
                                const C* __restrict__ v_cache, float* __restrict__ out,
                                const i64* __restrict__ row_offsets, const i64* __restrict__ context_lens,
                                const i64* __restrict__ block_tables, int batch, int blocks_per_seq,
                                int block_size, int num_heads, int kv_heads, float scale, int window,
                                float softcap, int out_type) {
  // Bytes16 elements: 16-byte aligned for the tile loads.
  __shared__ Bytes16 k_raw[KILN_FLASH_KEYS * (D + 8) / 8];
  __shared__ Bytes16 v_raw[KILN_FLASH_KEYS * (D + 8) / 8];
  bf16_bits* k_tile = reinterpret_cast<bf16_bits*>(k_raw);
  bf16_bits* v_tile = reinterpret_cast<bf16_bits*>(v_raw);
  // An E4M3 cache's tile as copied (one buffer for K and V: each copy into
  // it is issued after the barrier that follows the widening of the last).
  __shared__ Bytes16 stage[sizeof(C) == 1 ? KILN_FLASH_KEYS * D / 16 : 1];
  __shared__ int slots[2][KILN_FLASH_KEYS];  // of the tile in use and of the next
  int b;
  i64 tile_row;
  if (!find_tile(row_offsets, batch, (int)(gridDim.y - 1 - blockIdx.y), &b, &tile_row)) return;
  int head = blockIdx.x, kv_head = head / (num_heads / kv_heads);
  int stride = kv_heads * D;
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int g = lane / 4, t = lane % 4;  // fragment row group and column pair

  // Rows of this sequence in the step and their positions (a context holds
  // fewer than 2³¹ positions).
  i64 seq_start = row_offsets[b], seq_end = row_offsets[b + 1];
  int first_position = (int)(context_lens[b] - (seq_end - seq_start));  // of the sequence's first row
  i64 warp_row = tile_row + 16 * warp;
  // This lane's two rows (g and g + 8), whether they belong to the sequence,
  // and their positions.
  i64 row_a = warp_row + g, row_b = row_a + 8;
  bool in_a = row_a < seq_end, in_b = row_b < seq_end;
  int pos_a = first_position + (int)(row_a - seq_start), pos_b = pos_a + 8;
  bool warp_active = warp_row < seq_end;
  int warp_first = first_position + (int)(warp_row - seq_start);
  int warp_last = first_position + (int)(min(seq_end, warp_row + 16) - 1 - seq_start);
  float scale_log2 = scale * KILN_LOG2E;
  const SoftCap cap(scale, softcap);
  // The lane's ldmatrix rows in the key and value tiles at key 0 (the
  // products step from them by constant offsets): keys j·8 + i % 8 at
  // dimension 8 (i / 8) for S = Q·Kᵀ; keys 8 ((i / 8) % 2) + i % 8 at
  // dimension 8 (i / 16) for O += P·V.
  const bf16_bits* key_row = k_tile + (lane % 8) * (D + 8) + 8 * (lane / 8);
  const bf16_bits* v_row = v_tile + (8 * ((lane / 8) % 2) + lane % 8) * (D + 8) + 8 * (lane / 16);

  // Q fragments (rows g and g + 8, 16 dims per chunk), rounded to bf16.
  unsigned qf[D / 16][4];
#pragma unroll
  for (int c = 0; c < D / 16; ++c) {
    const float* qa = q + (row_a * num_heads + head) * D + c * 16 + 2 * t;
    const float* qb = q + (row_b * num_heads + head) * D + c * 16 + 2 * t;
    qf[c][0] = in_a ? pack_bf16(qa[0], qa[1]) : 0u;
    qf[c][1] = in_b ? pack_bf16(qb[0], qb[1]) : 0u;
    qf[c][2] = in_a ? pack_bf16(qa[8], qa[9]) : 0u;
    qf[c][3] = in_b ? pack_bf16(qb[8], qb[9]) : 0u;
  }
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = KILN_NEG_INF, m_b = KILN_NEG_INF, l_a = 0.0f, l_b = 0.0f;

  // Keys any row of the tile sees: from the first row's window start to the
  // last row's position.
  int tile_first_position = first_position + (int)(tile_row - seq_start);
  int tile_last_position = first_position + (int)(min(seq_end, tile_row + KILN_FLASH_ROWS) - 1 - seq_start);
  int key_start = window > 0 ? max(0, tile_first_position + 1 - window) : 0;
  find_slots(slots[0], block_tables, b, blocks_per_seq, block_size, key_start, tile_last_position);
  __syncthreads();
  load_tile<D>(k_tile, stage, slots[0], k_cache, stride, kv_head);
  for (int k0 = key_start, i = 0; k0 <= tile_last_position; k0 += KILN_FLASH_KEYS, ++i) {
    copy_async_wait();  // this thread's part of K_j
    widen_tile<D, C>(k_tile, stage);
    __syncthreads();  // all of K_j; every warp is done with V_{j-1}
    load_tile<D>(v_tile, stage, slots[i & 1], v_cache, stride, kv_head);
    find_slots(slots[(i + 1) & 1], block_tables, b, blocks_per_seq, block_size, k0 + KILN_FLASH_KEYS,
               tile_last_position);
    bool sees = warp_active && k0 <= warp_last;  // causal: a warp's rows may see none of the tile
    float s[KILN_FLASH_KEYS / 8][4];
    float base_a = 0.0f, base_b = 0.0f;
    if (sees) {
      // S = Q·Kᵀ: 8 column tiles of 8 keys. Lane i's ldmatrix row: key
      // 8j + i % 8, dimensions 16c + 8 (i / 8) ..: the B fragments of chunks
      // c and c + 1.
#pragma unroll
      for (int j = 0; j < KILN_FLASH_KEYS / 8; ++j) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int c = 0; c < D / 16; c += 2) {
          unsigned kb[4];
          ldmatrix_x4<false>(kb, key_row, 2 * (j * 8 * (D + 8) + c * 16));
          mma_bf16_16816(s[j], qf[c], kb);
          mma_bf16_16816(s[j], qf[c + 1], kb + 2);
        }
      }
      // Scale, cap, mask (in log2 units), and the tile's row maxima. A tile
      // whose every key each of the warp's rows sees (all but the causal
      // diagonal's, and a window's edge) needs no mask.
      bool unmasked = k0 + KILN_FLASH_KEYS - 1 <= warp_first && (window <= 0 || k0 > warp_last - window);
      float tile_m_a = KILN_NEG_INF, tile_m_b = KILN_NEG_INF;
#pragma unroll
      for (int j = 0; j < KILN_FLASH_KEYS / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v;
          if (softcap > 0.0f)
            v = cap(s[j][e]);
          else
            v = s[j][e] * scale_log2;
          if (!unmasked) {
            int key = k0 + j * 8 + 2 * t + (e & 1);
            int pos = e < 2 ? pos_a : pos_b;
            bool visible = key <= pos && (window <= 0 || key > pos - window);
            v = visible ? v : KILN_NEG_INF;
          }
          s[j][e] = v;
          if (e < 2)
            tile_m_a = fmaxf(tile_m_a, v);
          else
            tile_m_b = fmaxf(tile_m_b, v);
        }
      }
      // The four lanes of a row group hold one row between them.
#pragma unroll
      for (int offset = 1; offset < 4; offset <<= 1) {
        tile_m_a = fmaxf(tile_m_a, __shfl_xor_sync(KILN_FULL_MASK, tile_m_a, offset));
        tile_m_b = fmaxf(tile_m_b, __shfl_xor_sync(KILN_FULL_MASK, tile_m_b, offset));
      }
      float new_a = fmaxf(m_a, tile_m_a), new_b = fmaxf(m_b, tile_m_b);
      // A row that has seen no key yet keeps weights of 0 (exp2(-inf - 0)).
      base_a = new_a == KILN_NEG_INF ? 0.0f : new_a;
      base_b = new_b == KILN_NEG_INF ? 0.0f : new_b;
      float corr_a = exp2f(m_a - base_a), corr_b = exp2f(m_b - base_b);
      m_a = new_a;
      m_b = new_b;
      l_a *= corr_a;
      l_b *= corr_b;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= corr_a;
        o[n][1] *= corr_a;
        o[n][2] *= corr_b;
        o[n][3] *= corr_b;
      }
    }
    copy_async_wait();  // this thread's part of V_j
    widen_tile<D, C>(v_tile, stage);
    __syncthreads();  // all of V_j and the next tile's slots; every warp is done with K_j
    if (k0 + KILN_FLASH_KEYS <= tile_last_position)
      load_tile<D>(k_tile, stage, slots[(i + 1) & 1], k_cache, stride, kv_head);
    if (sees) {
      // P = exp2(S - m), and O += P·V: P's accumulator layout for keys
      // 16c..16c+15 is the A fragment of the second product.
#pragma unroll
      for (int c = 0; c < KILN_FLASH_KEYS / 16; ++c) {
        float p[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          p[h][0] = fast_exp2(s[2 * c + h][0] - base_a);
          p[h][1] = fast_exp2(s[2 * c + h][1] - base_a);
          p[h][2] = fast_exp2(s[2 * c + h][2] - base_b);
          p[h][3] = fast_exp2(s[2 * c + h][3] - base_b);
          l_a += p[h][0] + p[h][1];
          l_b += p[h][2] + p[h][3];
        }
        unsigned pa[4] = {pack_bf16(p[0][0], p[0][1]), pack_bf16(p[0][2], p[0][3]), pack_bf16(p[1][0], p[1][1]),
                          pack_bf16(p[1][2], p[1][3])};
        // Lane i's transposed ldmatrix row: key 16c + 8 ((i / 8) % 2) + i % 8,
        // dimensions 8 (n + i / 16) ..: the B fragments of n and n + 1.
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          unsigned vb[4];
          ldmatrix_x4<true>(vb, v_row, 2 * (c * 16 * (D + 8) + n * 8));
          mma_bf16_16816(o[n], pa, vb);
          mma_bf16_16816(o[n + 1], pa, vb + 2);
        }
      }
    }
  }
  if (!warp_active) return;
  // Each lane summed its own columns of P: the row's total is over the four.
#pragma unroll
  for (int offset = 1; offset < 4; offset <<= 1) {
    l_a += __shfl_xor_sync(KILN_FULL_MASK, l_a, offset);
    l_b += __shfl_xor_sync(KILN_FULL_MASK, l_b, offset);
  }
  float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    int d = n * 8 + 2 * t;
    if (in_a) {
      i64 y = (row_a * num_heads + head) * D + d;
      store_as(out, y, o[n][0] * inv_a, out_type);
      store_as(out, y + 1, o[n][1] * inv_a, out_type);
    }
    if (in_b) {
      i64 y = (row_b * num_heads + head) * D + d;
      store_as(out, y, o[n][2] * inv_b, out_type);
      store_as(out, y + 1, o[n][3] * inv_b, out_type);
    }
  }
}

#define KILN_FLASH_PARAMS(C)                                                                                  \
  const float *__restrict__ q, const C *__restrict__ k_cache, const C *__restrict__ v_cache,                 \
      float *__restrict__ out, const i64 *__restrict__ row_offsets, const i64 *__restrict__ context_lens,    \
      const i64 *__restrict__ block_tables, int batch, int blocks_per_seq, int block_size, int num_heads,    \
      int kv_heads, float scale, int window, float softcap, int out_type
#define KILN_FLASH_ARGS                                                                                          \
  q, k_cache, v_cache, out, row_offsets, context_lens, block_tables, batch, blocks_per_seq, block_size, num_heads, \
      kv_heads, scale, window, softcap, out_type

// The entry points: a bf16 or (`_fp8`) E4M3 cache, heads of 64, 96 or 128.
extern "C" __global__ void kiln_flash_attention_bf16_d64(KILN_FLASH_PARAMS(bf16_bits)) { flash_attention<64>(KILN_FLASH_ARGS); }
extern "C" __global__ void kiln_flash_attention_bf16_d96(KILN_FLASH_PARAMS(bf16_bits)) { flash_attention<96>(KILN_FLASH_ARGS); }
extern "C" __global__ void kiln_flash_attention_bf16_d128(KILN_FLASH_PARAMS(bf16_bits)) { flash_attention<128>(KILN_FLASH_ARGS); }
extern "C" __global__ void kiln_flash_attention_fp8_d64(KILN_FLASH_PARAMS(fp8_e4m3)) { flash_attention<64>(KILN_FLASH_ARGS); }
extern "C" __global__ void kiln_flash_attention_fp8_d96(KILN_FLASH_PARAMS(fp8_e4m3)) { flash_attention<96>(KILN_FLASH_ARGS); }
extern "C" __global__ void kiln_flash_attention_fp8_d128(KILN_FLASH_PARAMS(fp8_e4m3)) { flash_attention<128>(KILN_FLASH_ARGS); }
