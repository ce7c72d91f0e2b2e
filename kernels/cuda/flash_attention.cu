// Flash attention on tensor cores for prefill and chunked-prefill steps, over
// the bf16 or E4M3 paged KV cache (FlashAttention-2's scheme: a block's
// queries and key/value tiles pass through shared memory, the softmax is
// online, nothing of size T × T is ever stored). An E4M3 tile is widened to
// bf16 in shared memory as it arrives (`widen_tile`), so the products are
// the bf16 cache's.
//
// One block of four warps takes 128 query rows of one sequence for one query
// head; each warp owns two tiles of 16 rows (FlashAttention-2's layout for
// heads of 128 on sm_80 and sm_90). The rows are rounded to bf16 into shared
// memory once; key/value tiles of 64 positions are gathered from the paged
// cache into shared memory by asynchronous 16-byte copies (cp.async), each
// warp computing S = Q·Kᵀ and O += P·V with `mma_bf16_16816` (bf16 inputs,
// f32 accumulation; fragments by ldmatrix): the PTX instructions on sm_80+,
// warp-level emulations of the same layouts on the kernel emulator. Q and P
// are rounded to bf16 for the products, as FlashAttention does; scores, the
// softmax and the output stay f32.
//
// The copies overlap the products (FlashAttention-2's pipeline, one buffer
// each for K and V): tile j's values are fetched while the block computes
// S = Q·K_jᵀ and its softmax, and tile j + 1's keys while it computes
// O += P·V_j. Why two row tiles a warp: each fragment of K and V a warp
// loads from shared memory (ldmatrix, 512 bytes) serves four products, not
// two, so a product costs ~160 bytes of shared-memory reads, not 256 (at
// 128 bytes a cycle an SM, the old layout's reads alone bounded it near half
// the mma.sync rate); and a block of 128 threads at ≤ 255 registers leaves
// room for two an SM, whose barriers and softmax
// phases interleave, where one block of eight warps held the whole register
// file and stalled at each of its two barriers a tile (sm_90, Nsight Compute
// at base clocks: 268 µs a layer of a 2048-token Llama-3-8B prompt, ~128
// TFLOP/s). The tiles take (128 + 2·64)(D + 8)·2 bytes of dynamic shared
// memory, with an E4M3 cache 64·D more (`kiln_kernels::cuda::flash`): past
// 48 KiB for heads of 96 and 128, which the driver opts the kernels in to.
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
#include "paged_attention.cuh"

#define KILN_FLASH_WARPS 4
#define KILN_FLASH_THREADS (32 * KILN_FLASH_WARPS)
// Tiles of 16 query rows a warp: each fragment of K and V loaded from
// shared memory serves both.
#define KILN_FLASH_WARP_TILES 2
#define KILN_FLASH_ROWS (16 * KILN_FLASH_WARP_TILES * KILN_FLASH_WARPS)
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
  // Rolled: unrolled, the pieces' addresses took registers the two row
  // tiles' scores and outputs need (ptxas spilled at heads of 128).
#pragma unroll 1
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
  // Rolled, as load_tile's loop.
#pragma unroll 1
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
  // Dynamic shared memory (16-byte aligned; its size in the header): the
  // query tile [128][D + 8] and the key and value tiles [64][D + 8] in bf16
  // (padded rows: ldmatrix's eight rows fall in different banks), then an
  // E4M3 cache's tile as copied (one buffer for K and V: each copy into it is
  // issued after the barrier that follows the widening of the last).
  KILN_DYNAMIC_SHARED(Bytes16, smem);
  bf16_bits* q_tile = reinterpret_cast<bf16_bits*>(smem);
  bf16_bits* k_tile = q_tile + KILN_FLASH_ROWS * (D + 8);
  bf16_bits* v_tile = k_tile + KILN_FLASH_KEYS * (D + 8);
  Bytes16* stage = reinterpret_cast<Bytes16*>(v_tile + KILN_FLASH_KEYS * (D + 8));
  __shared__ int slots[2][KILN_FLASH_KEYS];  // of the tile in use and of the next
  int b;
  i64 tile_row;
  if (!find_tile(row_offsets, batch, (int)(gridDim.y - 1 - blockIdx.y), &b, &tile_row)) return;
  int head = blockIdx.x, kv_head = head / (num_heads / kv_heads);
  int stride = kv_heads * D;
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int g = lane / 4, t = lane % 4;  // fragment row group and column pair
  const int MT = KILN_FLASH_WARP_TILES;

  // Rows of this sequence in the step and their positions (a context holds
  // fewer than 2³¹ positions).
  i64 seq_start = row_offsets[b], seq_end = row_offsets[b + 1];
  int first_position = (int)(context_lens[b] - (seq_end - seq_start));  // of the sequence's first row
  i64 warp_row = tile_row + 16 * MT * warp;
  bool warp_active = warp_row < seq_end;
  int warp_first = first_position + (int)(warp_row - seq_start);
  int warp_last = first_position + (int)(min(seq_end, warp_row + 16 * MT) - 1 - seq_start);
  float scale_log2 = scale * KILN_LOG2E;
  const SoftCap cap(scale, softcap);
  // The lane's ldmatrix rows at the tiles' start (the products step from
  // them by constant offsets): query row i % 16 at dimension 8 (i / 16) for
  // the A fragments of S = Q·Kᵀ; keys i % 8 + 8 (i / 16) at dimension
  // 8 ((i / 8) % 2) for its B fragments (two groups of 8 keys a load); keys
  // 8 ((i / 8) % 2) + i % 8 at dimension 8 (i / 16) for O += P·V.
  const bf16_bits* q_row = q_tile + (16 * MT * warp + lane % 16) * (D + 8) + 8 * (lane / 16);
  const bf16_bits* key_row = k_tile + (lane % 8 + 8 * (lane / 16)) * (D + 8) + 8 * ((lane / 8) % 2);
  const bf16_bits* v_row = v_tile + (8 * ((lane / 8) % 2) + lane % 8) * (D + 8) + 8 * (lane / 16);

  // The tile's query rows, rounded to bf16 (zeros past the sequence), for
  // every warp to read its fragments from; published by the loop's first
  // barrier. Sixteen pairs a thread are loaded before the first is stored
  // (64 pairs a thread for heads of 128: four memory round trips, not 16).
#pragma unroll 16
  for (int i = threadIdx.x; i < KILN_FLASH_ROWS * D / 2; i += KILN_FLASH_THREADS) {
    int r = i / (D / 2), d = 2 * (i % (D / 2));
    i64 row = tile_row + r;
    unsigned v = 0u;
    if (row < seq_end) {
      FloatPair f = *reinterpret_cast<const FloatPair*>(q + (row * num_heads + head) * D + d);
      v = pack_bf16(f.x, f.y);
    }
    *reinterpret_cast<unsigned*>(q_tile + r * (D + 8) + d) = v;
  }
  // Per 16-row tile of the warp: its rows' output (rows g and g + 8), their
  // running maxima and sums (log2 units), and their positions.
  float o[MT][D / 8][4];
  float m_a[MT], m_b[MT], l_a[MT], l_b[MT];
  int pos_a[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    m_a[mt] = m_b[mt] = KILN_NEG_INF;
    l_a[mt] = l_b[mt] = 0.0f;
    pos_a[mt] = warp_first + 16 * mt + g;
  }

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
    __syncthreads();  // all of K_j (and Q); every warp is done with V_{j-1}
    load_tile<D>(v_tile, stage, slots[i & 1], v_cache, stride, kv_head);
    find_slots(slots[(i + 1) & 1], block_tables, b, blocks_per_seq, block_size, k0 + KILN_FLASH_KEYS,
               tile_last_position);
    bool sees = warp_active && k0 <= warp_last;  // causal: a warp's rows may see none of the tile
    float s[MT][KILN_FLASH_KEYS / 8][4];
    float base_a[MT], base_b[MT];
    if (sees) {
      // S = Q·Kᵀ, a chunk of 16 dimensions at a time: each tile's A
      // fragment is loaded once for the 8 column tiles of 8 keys, each
      // B fragment (two column tiles a load) once for the warp's tiles.
      // The chunk loop stays rolled (16 products an iteration): unrolled,
      // ptxas hoisted fragments past the 255 registers and spilled.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < KILN_FLASH_KEYS / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll 1
      for (int c = 0; c < D / 16; ++c) {
        unsigned qa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldmatrix_x4<false>(qa[mt], q_row, 2 * (mt * 16 * (D + 8) + c * 16));
#pragma unroll
        for (int j = 0; j < KILN_FLASH_KEYS / 8; j += 2) {
          unsigned kb[4];
          ldmatrix_x4<false>(kb, key_row, 2 * (j * 8 * (D + 8) + c * 16));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16_16816(s[mt][j], qa[mt], kb);
            mma_bf16_16816(s[mt][j + 1], qa[mt], kb + 2);
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        // Scale, cap, mask (in log2 units), and the tile's row maxima. A
        // tile whose every key each of the rows sees (all but the causal
        // diagonal's, and a window's edge) needs no mask.
        int first = warp_first + 16 * mt, last = first + 15;
        bool unmasked = k0 + KILN_FLASH_KEYS - 1 <= first && (window <= 0 || k0 > last - window);
        float tile_m_a = KILN_NEG_INF, tile_m_b = KILN_NEG_INF;
        // Row g's position less the lane's first key (k0 + 2t): element e
        // of column tile j, key k0 + 2t + 8j + (e & 1), is visible while
        // 8j + (e & 1) is at most this (row g + 8's is 8 more), compared
        // with constants.
        int reach = pos_a[mt] - k0 - 2 * t;
#pragma unroll
        for (int j = 0; j < KILN_FLASH_KEYS / 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v;
            if (softcap > 0.0f)
              v = cap(s[mt][j][e]);
            else
              v = s[mt][j][e] * scale_log2;
            if (!unmasked) {
              int column = j * 8 + (e & 1), row_reach = e < 2 ? reach : reach + 8;
              bool visible = column <= row_reach && (window <= 0 || column > row_reach - window);
              v = visible ? v : KILN_NEG_INF;
            }
            s[mt][j][e] = v;
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
        float new_a = fmaxf(m_a[mt], tile_m_a), new_b = fmaxf(m_b[mt], tile_m_b);
        // A row that has seen no key yet keeps weights of 0 (exp2(-inf - 0)).
        base_a[mt] = new_a == KILN_NEG_INF ? 0.0f : new_a;
        base_b[mt] = new_b == KILN_NEG_INF ? 0.0f : new_b;
        float corr_a = exp2f(m_a[mt] - base_a[mt]), corr_b = exp2f(m_b[mt] - base_b[mt]);
        m_a[mt] = new_a;
        m_b[mt] = new_b;
        l_a[mt] *= corr_a;
        l_b[mt] *= corr_b;
        // Once the rows' maxima settle (most tiles of a long prompt), no
        // factor moves and the warp skips the rescaling (FlashAttention-3's
        // conditional rescale): D / 2 multiplications a lane.
        if (__any_sync(KILN_FULL_MASK, corr_a != 1.0f || corr_b != 1.0f)) {
#pragma unroll
          for (int n = 0; n < D / 8; ++n) {
            o[mt][n][0] *= corr_a;
            o[mt][n][1] *= corr_a;
            o[mt][n][2] *= corr_b;
            o[mt][n][3] *= corr_b;
          }
        }
      }
    }
    copy_async_wait();  // this thread's part of V_j
    widen_tile<D, C>(v_tile, stage);
    __syncthreads();  // all of V_j and the next tile's slots; every warp is done with K_j
    if (k0 + KILN_FLASH_KEYS <= tile_last_position)
      load_tile<D>(k_tile, stage, slots[(i + 1) & 1], k_cache, stride, kv_head);
    if (sees) {
      // P = exp2(S - m), and O += P·V: P's accumulator layout for keys
      // 16c..16c+15 is the A fragment of the second product; each B
      // fragment is loaded once for the warp's tiles.
#pragma unroll
      for (int c = 0; c < KILN_FLASH_KEYS / 16; ++c) {
        unsigned pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float p[2][4];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            p[h][0] = fast_exp2(s[mt][2 * c + h][0] - base_a[mt]);
            p[h][1] = fast_exp2(s[mt][2 * c + h][1] - base_a[mt]);
            p[h][2] = fast_exp2(s[mt][2 * c + h][2] - base_b[mt]);
            p[h][3] = fast_exp2(s[mt][2 * c + h][3] - base_b[mt]);
            l_a[mt] += p[h][0] + p[h][1];
            l_b[mt] += p[h][2] + p[h][3];
          }
          pa[mt][0] = pack_bf16(p[0][0], p[0][1]);
          pa[mt][1] = pack_bf16(p[0][2], p[0][3]);
          pa[mt][2] = pack_bf16(p[1][0], p[1][1]);
          pa[mt][3] = pack_bf16(p[1][2], p[1][3]);
        }
        // Lane i's transposed ldmatrix row: key 16c + 8 ((i / 8) % 2) + i % 8,
        // dimensions 8 (n + i / 16) ..: the B fragments of n and n + 1.
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          unsigned vb[4];
          ldmatrix_x4<true>(vb, v_row, 2 * (c * 16 * (D + 8) + n * 8));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16_16816(o[mt][n], pa[mt], vb);
            mma_bf16_16816(o[mt][n + 1], pa[mt], vb + 2);
          }
        }
      }
    }
  }
  if (!warp_active) return;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    // Each lane summed its own columns of P: the row's total is over the four.
    float la = l_a[mt], lb = l_b[mt];
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
      la += __shfl_xor_sync(KILN_FULL_MASK, la, offset);
      lb += __shfl_xor_sync(KILN_FULL_MASK, lb, offset);
    }
    float inv_a = la > 0.0f ? 1.0f / la : 0.0f, inv_b = lb > 0.0f ? 1.0f / lb : 0.0f;
    i64 row_a = warp_row + 16 * mt + g, row_b = row_a + 8;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      int d = n * 8 + 2 * t;
      if (row_a < seq_end) {
        i64 y = (row_a * num_heads + head) * D + d;
        store_as(out, y, o[mt][n][0] * inv_a, out_type);
        store_as(out, y + 1, o[mt][n][1] * inv_a, out_type);
      }
      if (row_b < seq_end) {
        i64 y = (row_b * num_heads + head) * D + d;
        store_as(out, y, o[mt][n][2] * inv_b, out_type);
        store_as(out, y + 1, o[mt][n][3] * inv_b, out_type);
      }
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
extern "C" __global__ void __launch_bounds__(KILN_FLASH_THREADS, 2) kiln_flash_attention_bf16_d64(KILN_FLASH_PARAMS(bf16_bits)) { flash_attention<64>(KILN_FLASH_ARGS); }
extern "C" __global__ void __launch_bounds__(KILN_FLASH_THREADS, 2) kiln_flash_attention_bf16_d96(KILN_FLASH_PARAMS(bf16_bits)) { flash_attention<96>(KILN_FLASH_ARGS); }
extern "C" __global__ void __launch_bounds__(KILN_FLASH_THREADS, 2) kiln_flash_attention_bf16_d128(KILN_FLASH_PARAMS(bf16_bits)) { flash_attention<128>(KILN_FLASH_ARGS); }
extern "C" __global__ void __launch_bounds__(KILN_FLASH_THREADS, 2) kiln_flash_attention_fp8_d64(KILN_FLASH_PARAMS(fp8_e4m3)) { flash_attention<64>(KILN_FLASH_ARGS); }
extern "C" __global__ void __launch_bounds__(KILN_FLASH_THREADS, 2) kiln_flash_attention_fp8_d96(KILN_FLASH_PARAMS(fp8_e4m3)) { flash_attention<96>(KILN_FLASH_ARGS); }
extern "C" __global__ void __launch_bounds__(KILN_FLASH_THREADS, 2) kiln_flash_attention_fp8_d128(KILN_FLASH_PARAMS(fp8_e4m3)) { flash_attention<128>(KILN_FLASH_ARGS); }
