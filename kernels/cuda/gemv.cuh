// Matrix products for small batches (decode): y[m, n] = x[m, k] · W[n, k]ᵀ
// with m ≤ KILN_GEMV_MAX_M, bound by reading W once. Warps stream rows of W
// (bf16/f16/f32 in 16-byte loads kept out of L1, GGUF blocks read as
// packed), multiply them with every row of x (f32, kept in L1: it is small
// and every warp reads it) and reduce across their lanes. Each warp issues
// a round of loads (eight per lane in the one-row `_m1` kernels, four
// otherwise; the parts of four K-quant blocks or eight of 32 values for
// GGUF rows) before it uses the first, so
// a round costs one memory round trip. One launch covers up to
// KILN_GEMV_MAX_GROUP matrices that share x (q, k and v; gate and up): their
// rows form one grid, so small matrices do not leave the card half idle and
// a layer reads its weights in fewer launches; for a gated MLP's gate and
// up the launch also applies the activation (KilnGemvGroup's `activation`).
// The `kiln_gemv_<format>_q6_k*` kernels read a group whose last matrix is
// Q6_K (the v of llama.cpp's Q4_K_M and Q5_K_M files in half the layers).
// A residual add and the RMS norm after it, between two such launches (an
// o or down projection and the products that read the norm), are folded
// into them (KilnGemvNorm): the norm's own launch is saved.
// Launched as programmatic dependents (kiln_cuda.cuh), the kernels load
// their first round of dense weights into registers (DenseRow), or ask for
// their first GGUF blocks and the next dense round in L2, before they wait
// for x.
//
// Every kernel comes in three splits of a row among the warps of a block:
// SPLIT = 1 (no suffix), a warp per row; 2 (`_s2`) and 4 (`_s4`), two or
// four warps each taking every SPLIT-th stretch of the row and adding their
// sums through shared memory: more warps, and so more loads in flight, for
// matrices with few rows and long ones (down projections). Which is fastest
// depends on the card and the shape; the host times them at load
// (host/src/runtime/cuda/tune.rs).
//
// GGUF rows are sequences of blocks (the formats are in gguf_blocks.cuh);
// each format splits a block among `LANES` lanes, so a warp covers
// 32 / LANES blocks per sweep. `kiln_dequant_*` expand the same blocks
// to bf16 for the GEMM of larger batches, and `kiln_embedding_*` read rows
// of a table of blocks.
//
// With 8-bit activations (`--precision fast`, llama.cpp's MMVQ), the GGUF
// GEMVs `kiln_gemv_<format>_x8*` read x as kiln_quantize_x8 writes it and
// take each part's products in integer dot products of four bytes (dp4a),
// at the cost of rounding x to 8 bits per block of 32. In sm_90 SASS
// (sass_report.py), the one-row kernels' loop over a lane's part of a Q4_K
// block (32 weights; a warp's iteration covers 1,024) is 82 instructions
// with 8-bit x and 201 decoding each weight to a float: for Llama-3-8B in
// Q4_K (~7e9 weights a decode step) 0.54 ms and 1.3 ms of an H200's issue
// (132 SMs × 4 schedulers × 1.98 GHz), against 1.06 ms to read 4.4 GB. On
// f32 x the kernels read K-quant blocks in the lanes' order of
// KQuantSpread and Q6KSpread (gguf_blocks.cuh), so that each load of x
// takes whole lines of L1 (30 instructions more than KQuant's parts in the
// one-row loop, whose loads of x asked four times the lines of L1).
//
// This header holds what the GEMVs share; the entry points are in gemv.cu
// (dense rows and kiln_quantize_x8), gemv_<format>.cu (one GGUF format
// each) and gemv_<format>_q6_k.cu (groups whose last matrix is Q6_K), so
// that NVRTC compiles them side by side: 94 s for the one file they came
// from, at most 22 s a module (sm_90, on a 2-core VM). Needs
// kiln_cuda.cuh, gguf_blocks.cuh and dense_rows.cuh first.
#pragma once

#define KILN_GEMV_MAX_M 8
// Warps per block at most: the host launches 4 (GEMV_WARPS in
// host/src/runtime/cuda/products.rs; rows per block: warps / SPLIT), and 8
// for gated launches split four ways (two rows). Kernels read blockDim.
#define KILN_GEMV_MAX_WARPS 8
#define KILN_GEMV_MAX_GROUP 4

// Each format has kernels for up to KILN_GEMV_MAX_M rows of x and, `_m1`,
// for a single row, each in three splits: `kiln_gemv_<format>[_m1][_s2|_s4]`.
#define KILN_GEMV_ARGS KilnGemvGroup g, const float* x, int m, int k
// The GGUF formats' `_x8` kernels take x as kiln_quantize_x8 writes it.
#define KILN_GEMV_X8_ARGS KilnGemvGroup g, const u8* x, int m, int k

// The matrices of one launch, all [*, k] in one format (or the last in the
// kernel's second, gemv_blocks' LAST): matrix s has rows
// rows_end[s-1] .. rows_end[s] of the grid and writes y[s] [m, its rows].
// Gated (`activation` nonzero, kiln_gated's numbering): two matrices of n
// rows each, a gated MLP's gate and up, whose rows interleave in the grid
// (row 2j is gate's j, 2j + 1 up's), so each pair is taken by one block,
// which writes act(gate)·up to y[0] [m, n] (y[1] is not written): the
// activation's own launch and the round trip of gate's and up's products
// through memory are saved. Blocks hold an even number of rows.
//
// Rotated (`rope.positions` set): three matrices, q, k and v, with the
// rotary embedding of q and k applied (rope.cu's arithmetic): the rows of
// each rotated pair (i and i + half of a head; 2i and 2i + 1 with
// `interleaved`) are neighbours in the grid, so a block holds both and
// writes the rotated rows to rope.q_out and rope.k_out (y[0] and y[1] are
// not written); with `k_cache` set, the rotated keys and v's rows also go to
// the token's slot in the paged cache (attention.cu's layout; a padding row,
// at position -1, writes nothing there): the rotary launch is saved.
struct KilnGemvRope {
  const i64* positions;
  const float* inv_freq;
  float* q_out;
  float* k_out;
  u8* k_cache;  // float, bf16_bits or fp8_e4m3, as `cache_type` says
  u8* v_cache;
  const i64* row_offsets;
  const i64* context_lens;
  const i64* block_tables;
  float scale;  // multiplies cos and sin (YaRN)
  int half;     // half of a head
  int interleaved;
  int cache_type;  // KILN_CACHE_*
  int batch;
  int blocks_per_seq;
  int block_size;
};

// Greedy's pick (`keys` set; one matrix, the logits' product): each row of
// x's first largest value (NaN as -inf), the sampler's greedy pick (in
// sampling.cu), found as the logits are written. A block takes the
// largest key (logit_key) of its rows and raises the row's entry in `keys`
// to it (atomicMax, only when larger: the order of blocks cannot change
// the result); the last block to finish (`counter`) writes the picks to
// `tokens`. The keys start the launch at zero (the step's upload zeroes
// them), the counter at zero (the last block leaves it so).
struct KilnGemvArgmax {
  unsigned long long* keys;
  unsigned* counter;
  unsigned* tokens;
};

// A residual add and the RMS norm that reads it, between two decode GEMVs,
// folded into them by linearity: W · (h · s · g) = s · (W · (h · g)), s =
// 1 / sqrt(mean(h²) + eps) for each row of x. The producing GEMV (`sum`
// set: one matrix, an o or down projection) adds its products to the
// residual, writes the sum h and h · (offset + w) (to y[0], the next
// GEMV's x) and its block's Σh² of each row of x to `partials`; its last
// block to finish (`counter`) adds those up in block order and writes each
// row's s to `scales`. The consuming GEMV (KilnGemvGroup's `row_scales`)
// multiplies each row of x's sums by s before its own epilogue. The norm's
// launch is saved, and no block normalizes a row of its own.
struct KilnGemvNorm {
  const float* residual;  // [m, n]
  float* sum;             // [m, n]: residual + products (null: no norm)
  const float* weight;    // [n]
  float* partials;        // [blocks, m]
  unsigned* counter;      // zero before the launch, left at zero
  float* scales;          // [m]
  float offset;           // added to the weight (Gemma's 1 + w)
  float eps;
};

struct KilnGemvGroup {
  i64 count;
  i64 rows_end[KILN_GEMV_MAX_GROUP];
  const u8* w[KILN_GEMV_MAX_GROUP];
  float* y[KILN_GEMV_MAX_GROUP];
  i64 activation;
  KilnGemvRope rope;
  KilnGemvArgmax argmax;
  KilnGemvNorm norm;
  const float* row_scales;  // [m]: each row of x's sums times this (null: none)
};

// The warp's output row: its matrix's weights row and where its results go,
// and which of the row's SPLIT parts the warp takes.
struct GemvRow {
  const u8* w;  // the matrix (row 0)
  float* y;     // the matrix's output
  int row, n;   // row within the matrix, the matrix's rows
  int part;     // 0 .. SPLIT - 1
  int matrix;   // its index in the group
};

// The warp's row of the launch's grid.
template <int SPLIT>
__device__ __forceinline__ int grid_row() {
  return blockIdx.x * (blockDim.x / 32 / SPLIT) + threadIdx.x / 32 / SPLIT;
}

// The warp's row; false past the grid's last row (the warp still takes part
// in its block's reduction).
template <int SPLIT>
__device__ __forceinline__ bool gemv_row(const KilnGemvGroup& g, GemvRow* r) {
  int warp = threadIdx.x / 32;
  int row = grid_row<SPLIT>();
  r->part = warp % SPLIT;
  if (row >= g.rows_end[g.count - 1]) return false;
  if (g.rope.positions != nullptr && row < g.rows_end[1]) {
    bool is_k = row >= g.rows_end[0];
    int local = is_k ? row - (int)g.rows_end[0] : row, head_dim = 2 * g.rope.half;
    int in_head = local % head_dim, pair = in_head / 2;  // grid rows 2j and 2j + 1: pair j
    r->row = local - in_head + (g.rope.interleaved ? in_head : pair + (in_head & 1) * g.rope.half);
    r->w = is_k ? g.w[1] : g.w[0];
    r->matrix = is_k ? 1 : 0;
    r->y = is_k ? g.rope.k_out : g.rope.q_out;
    r->n = is_k ? (int)(g.rows_end[1] - g.rows_end[0]) : (int)g.rows_end[0];
    return true;
  }
  if (g.activation != 0) {
    bool up = row & 1;
    r->w = up ? g.w[1] : g.w[0];
    r->matrix = up ? 1 : 0;
    r->y = g.y[0];
    r->row = row >> 1;
    r->n = (int)g.rows_end[0];
    return true;
  }
  // Constant indices into the group (a computed one would copy the kernel
  // argument to local memory).
  int start = 0;
#pragma unroll
  for (int s = 0; s < KILN_GEMV_MAX_GROUP; ++s) {
    if (s < g.count && row < g.rows_end[s]) {
      r->w = g.w[s];
      r->matrix = s;
      r->y = g.y[s];
      r->row = row - start;
      r->n = (int)g.rows_end[s] - start;
      return true;
    }
    start = (int)g.rows_end[s];
  }
  return false;
}

// Grid row `row` (of matrix 0 q, 1 k or 2 v) of x's row `token`, rotated
// from `mine` and the pair's other row's `partner` (rope.cu's arithmetic),
// to its output, and keys and values to the token's cache slot. Worked out
// here, not kept through the products (registers).
__device__ __forceinline__ void store_rotated(const KilnGemvGroup& g, const GemvRow& r, int row, int token,
                                              float mine, float partner) {
  const KilnGemvRope& p = g.rope;
  int matrix = row < g.rows_end[0] ? 0 : row < g.rows_end[1] ? 1 : 2;
  if (matrix < 2) {
    bool first = row % 2 == 0;  // grid rows 2j and 2j + 1: pair j of a head
    int pair = (int)((matrix == 0 ? row : row - g.rows_end[0]) % (2 * p.half)) / 2;
    float c, s, r0, r1;
    rope_cos_sin((float)p.positions[token], p.inv_freq[pair], p.scale, &c, &s);
    rope_rotate(first ? mine : partner, first ? partner : mine, c, s, &r0, &r1);
    mine = first ? r0 : r1;
  }
  r.y[(i64)token * r.n + r.row] = mine;
  if (p.k_cache == nullptr || matrix == 0) return;
  i64 position;
  int b = sequence_of(p.row_offsets, p.context_lens, p.batch, token, &position);
  if (position < 0) return;
  i64 at = cache_slot(p.block_tables, b, p.blocks_per_seq, p.block_size, position) * r.n + r.row;
  u8* cache = matrix == 1 ? p.k_cache : p.v_cache;
  if (p.cache_type == KILN_CACHE_BF16)
    cache_store(reinterpret_cast<bf16_bits*>(cache) + at, mine);
  else if (p.cache_type == KILN_CACHE_FP8)
    cache_store(reinterpret_cast<fp8_e4m3*>(cache) + at, mine);
  else
    cache_store(reinterpret_cast<float*>(cache) + at, mine);
}

// The order of logits in greedy's pick as one 64-bit key: the value's
// order_key (NaN as -inf) above the complement of its index, so the
// largest key is the largest value's first index.
__device__ __forceinline__ unsigned long long logit_key(float v, int index) {
  return (unsigned long long)order_key(v == v ? v : KILN_NEG_INF) << 32 | (0xffffffffu - (unsigned)index);
}

// Greedy's pick among the block's rows (`sum`: lane i's row i of x, where
// `writes`), raised into the launch's keys; the last block writes the
// picks (KilnGemvArgmax). Every thread of the block calls it.
template <int MAX_M, int SPLIT>
__device__ void pick_first_largest(const KilnGemvArgmax& a, const GemvRow& r, bool writes, float sum, int m) {
  __shared__ unsigned long long best[KILN_GEMV_MAX_WARPS][MAX_M];
  int lane = threadIdx.x % 32, slot = threadIdx.x / 32 / SPLIT, rows = blockDim.x / 32 / SPLIT;
  if (r.part == 0 && lane < MAX_M) best[slot][lane] = writes ? logit_key(sum, r.row) : 0ull;
  __syncthreads();
  if ((int)threadIdx.x < m) {
    unsigned long long key = 0;
    for (int s = 0; s < rows; ++s) key = best[s][threadIdx.x] > key ? best[s][threadIdx.x] : key;
    unsigned long long* entry = a.keys + threadIdx.x;
    if (key > *reinterpret_cast<volatile unsigned long long*>(entry)) atomicMax(entry, key);
  }
  if (last_block_done(a.counter, gridDim.x) && (int)threadIdx.x < m) {
    unsigned long long key = *reinterpret_cast<volatile unsigned long long*>(a.keys + threadIdx.x);
    a.tokens[threadIdx.x] = 0xffffffffu - (unsigned)key;
  }
}

// What a lane's row of x (lane i: row i) needs past the products in a
// folded norm (KilnGemvNorm): the consumer's s, the producer's residual
// and the norm's weight, loaded before the lanes' sums are reduced, so
// that the reduction overlaps their round trip (loaded before the
// products, they held 8 to 20 more registers through them in sm_90 SASS:
// Q4_K's one-row kernel 80 → 88).
struct RowInputs {
  float scale = 1.0f, residual = 0.0f, gain = 0.0f;
  __device__ RowInputs(const KilnGemvGroup& g, const GemvRow& r, bool valid, int m) {
    int lane = threadIdx.x % 32;
    if (!valid || r.part != 0 || lane >= m) return;
    if (g.row_scales != nullptr) scale = g.row_scales[lane];
    if (g.norm.sum != nullptr) {
      residual = g.norm.residual[(i64)lane * r.n + r.row];
      gain = g.norm.offset + g.norm.weight[r.row];
    }
  }
};

// The last block's part of a folded norm: each row of x's s from the
// blocks' partial sums, added up in block order. Not inlined: inlined, the
// bf16 one-row kernel took 64 registers where it had 56 (sm_90; the 8-bit
// kernels' allocation moves either way by a few). It takes the pointers
// and numbers it needs, never a reference into the kernel's parameters:
// a parameter's address passed to a call made every thread copy the whole
// KilnGemvGroup (304 bytes) to local memory at its start, more bytes than
// the weights it reads (H200, 2026-12-04: the batch-1 GEMVs at half speed,
// Llama-3-8B 181 -> 108 tok/s).
//
// The partials are read from L2 (`__ldcg`: the other blocks' fenced writes,
// last_block_done), a batch of loads issued before the first is added: read
// one after another, as a volatile loop compiled (sm_90's SASS: load, add,
// branch back), the last block of a 2,048-block GEMV paid 16 L2 round trips
// in a row at the end of the kernel.
__device__ __noinline__ void write_norm_scales(const float* partials, float* scales, float eps, int m,
                                               int cols) {
  __shared__ float scratch[32];
  for (int i = 0; i < m; ++i) {
    float total = 0.0f;
    for_each_batched<float>(
        (int)threadIdx.x, (int)gridDim.x, (int)blockDim.x, [&](int b) { return __ldcg(partials + (i64)b * m + i); },
        [&](int, float partial) { total += partial; });
    total = block_sum(total, scratch);
    if (threadIdx.x == 0) scales[i] = inverse_root_mean(total, cols, eps);
  }
}

// The producer's side of a folded norm (KilnGemvNorm) for the block's rows
// (`sum`: lane i's product of row i of x, where `writes`): h = residual +
// sum and h · gain written, the block's Σh² of each row of x to its
// partials; the last block writes each row's s. Every thread calls it.
template <int MAX_M, int SPLIT>
__device__ void add_norm_rows(const KilnGemvNorm& p, const GemvRow& r, bool writes, float sum, int m, int cols,
                              const RowInputs& in) {
  __shared__ float squares[KILN_GEMV_MAX_WARPS][MAX_M];
  int lane = threadIdx.x % 32, slot = threadIdx.x / 32 / SPLIT, rows = blockDim.x / 32 / SPLIT;
  float h = 0.0f;
  if (writes) {
    i64 at = (i64)lane * r.n + r.row;
    h = in.residual + sum;
    p.sum[at] = h;
    r.y[at] = h * in.gain;
  }
  if (r.part == 0 && lane < MAX_M) squares[slot][lane] = h * h;
  __syncthreads();
  if ((int)threadIdx.x < m) {
    float block = 0.0f;
    for (int s = 0; s < rows; ++s) block += squares[s][threadIdx.x];
    p.partials[(i64)blockIdx.x * m + threadIdx.x] = block;
  }
  if (last_block_done(p.counter, gridDim.x)) write_norm_scales(p.partials, p.scales, p.eps, m, cols);
}

// The sums of the warps of a row to y[i, row]: each warp reduces across
// its lanes, and with SPLIT > 1 the row's first warp adds the others'
// sums; lane i of that warp then holds row i's, times row i's s where a
// norm is folded in before (`in`). Gated or rotated, each row's lanes take
// the paired row's sums next to theirs through shared memory; with
// `argmax`, the block takes part in greedy's pick; with a norm folded in
// after, the block adds the residual (add_norm_rows).
template <int MAX_M, int SPLIT>
__device__ __forceinline__ void store_rows(float* acc, const GemvRow& r, bool valid, int m, const KilnGemvGroup& g,
                                           const RowInputs& in) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float sum = 0.0f;
  if (SPLIT == 1) {
#pragma unroll
    for (int i = 0; i < MAX_M; ++i) {
      if (i < m) {
        float v = warp_sum(acc[i]);
        if (lane == i) sum = v;
      }
    }
  } else {
    __shared__ float partial[KILN_GEMV_MAX_WARPS][MAX_M];
#pragma unroll
    for (int i = 0; i < MAX_M; ++i) {
      float v = warp_sum(acc[i]);
      if (lane == 0) partial[warp][i] = v;
    }
    __syncthreads();
    if (r.part == 0 && lane < m)
      for (int p = 0; p < SPLIT; ++p) sum += partial[warp + p][lane];
  }
  sum *= in.scale;
  bool writes = valid && r.part == 0 && lane < m;
  bool rotated = g.rope.positions != nullptr;
  if (g.norm.sum != nullptr) {
    add_norm_rows<MAX_M, SPLIT>(g.norm, r, writes, sum, m, (int)g.rows_end[0], in);
    return;
  }
  if (g.activation == 0 && !rotated) {
    if (writes) r.y[(i64)lane * r.n + r.row] = sum;
    if (g.argmax.keys != nullptr) pick_first_largest<MAX_M, SPLIT>(g.argmax, r, writes, sum, m);
    return;
  }
  __shared__ float rows[KILN_GEMV_MAX_WARPS][MAX_M];
  int slot = warp / SPLIT;  // the row's place in the block: even for gate (a pair's first), odd for up
  if (r.part == 0 && lane < m) rows[slot][lane] = sum;
  __syncthreads();
  if (!writes) return;
  if (rotated)
    store_rotated(g, r, grid_row<SPLIT>(), lane, sum, rows[slot ^ 1][lane]);
  else if (slot % 2 == 0)
    r.y[(i64)lane * r.n + r.row] = kiln_gated((int)g.activation, sum, rows[slot + 1][lane]);
}

// BYTES: 2 = bf16, 3 = f16 (2 bytes each), 4 = f32; MAX_M: rows of x at
// most (1 for batch-1 decode: fewer registers, so more warps and more loads
// in flight per multiprocessor); SPLIT: warps per row.
template <int BYTES, int MAX_M, int SPLIT>
__device__ void gemv_dense(const KilnGemvGroup& g, const float* x, int m, int k) {
  GemvRow r;
  bool valid = gemv_row<SPLIT>(g, &r);
  const u8* wr = valid ? r.w + (i64)r.row * k * (BYTES == 4 ? 4 : 2) : nullptr;
  DenseRow<BYTES, MAX_M, SPLIT> row(wr, r.part, k);  // its first round loaded
  row.prefetch_next();
  kiln_wait_inputs();
  float acc[MAX_M];
  for (int i = 0; i < MAX_M; ++i) acc[i] = 0.0f;
  row.multiply(x, m, k, acc);
  store_rows<MAX_M, SPLIT>(acc, r, valid, m, g, RowInputs(g, r, valid, m));
}


// x of the GGUF GEMVs as 8-bit rows (`--precision fast`; f32 rows are
// gguf_blocks.cuh's FloatX), as kiln_quantize_x8 writes them: m rows of k
// quants, then the X8Scale of each block of 32.
struct Int8X {
  const signed char* q;
  const X8Scale* scale;
  __device__ Int8X(const u8* x, int m, int k)
      : q(reinterpret_cast<const signed char*>(x)), scale(reinterpret_cast<const X8Scale*>(x + (i64)m * k)) {}
  // Its loads are aligned: 4 bytes, or 16 at a multiple of 16 within a
  // K-quant block (rows of 256k quants in the step's aligned scratch).
  __device__ bool rows_aligned(int) const { return true; }
  template <typename F, int MAX_M, bool X16>
  __device__ __forceinline__ void dot(const typename F::Raw& raw, int part, int m, int k, int col,
                                      float* acc) const {
#pragma unroll
    for (int i = 0; i < MAX_M; ++i) {
      i64 first = (i64)i * k + col;
      if (i < m) acc[i] += F::dot_x8(raw, part, q + first, scale + first / 32);
    }
  }
};


// A row of GGUF blocks in format F: each lane takes its part of every
// (32 / LANES)-th block among the row's warps, and loads its parts of
// blocks_depth such blocks before using the first (gguf_blocks.cuh): a
// Llama-3 row of 4,096 columns in one round a warp.
template <typename F, int SPLIT>
struct BlocksRow {
  static const int DEPTH = blocks_depth<F>();
  static const int STRIDE = (32 / F::LANES) * SPLIT;  // blocks the row's warps take per sweep
  bool active;  // whether the warp has this row (else nothing is read)
  const u8* w;
  int blocks, first;
  __device__ BlocksRow(const GemvRow& r, bool active, int k)
      : active(active),
        w(active ? r.w + (i64)r.row * (k / F::ELEMS) * F::BYTES : nullptr),
        blocks(k / F::ELEMS),
        first(r.part * (32 / F::LANES) + (int)(threadIdx.x % 32) / F::LANES) {}
  // The first blocks' weights toward L2 while the previous kernel finishes.
  __device__ void prefetch() const {
    for (int u = 0, blk = first; active && u < DEPTH && blk < blocks; ++u, blk += STRIDE)
      prefetch_l2(w + (i64)blk * F::BYTES);
  }
  // The row times x (the lane's share, added to acc), taken by X (FloatX
  // or Int8X). x's alignment is checked once (the same in every thread)
  // rather than for every run of weights.
  template <typename X, int MAX_M>
  __device__ void multiply(X x, int m, int k, float* acc) const {
    if (active && x.rows_aligned(k))
      blocks_sweep<F, X, MAX_M, DEPTH, true>(w, x, m, k, first, STRIDE, acc);
    else if (active)
      blocks_sweep<F, X, MAX_M, DEPTH, false>(w, x, m, k, first, STRIDE, acc);
  }
};

template <typename A, typename B>
struct SameFormat {
  static const bool value = false;
};
template <typename A>
struct SameFormat<A, A> {
  static const bool value = true;
};

// The GEMV of GGUF rows: every matrix of the group in format F, or with
// LAST another format, the group's last matrix in LAST (the `_<f>_<last>`
// kernels: llama.cpp's *_K_M files keep some layers' v at Q6_K among Q4_K
// or Q5_K q and k, and q, k and v still take one launch). A warp's row is
// of one matrix, so the branch between the formats is uniform in a warp;
// the wait stays outside it (a block's warps may take both).
template <typename F, typename X, int MAX_M, int SPLIT, typename LAST = F>
__device__ void gemv_blocks(const KilnGemvGroup& g, X x, int m, int k) {
  const bool mixed = !SameFormat<F, LAST>::value;
  GemvRow r;
  bool valid = gemv_row<SPLIT>(g, &r);
  bool last = mixed && valid && r.matrix == (int)g.count - 1;
  BlocksRow<F, SPLIT> row(r, valid && !last, k);
  BlocksRow<LAST, SPLIT> last_row(r, last, k);
  row.prefetch();
  if (mixed) last_row.prefetch();
  kiln_wait_inputs();
  float acc[MAX_M];
  for (int i = 0; i < MAX_M; ++i) acc[i] = 0.0f;
  row.template multiply<X, MAX_M>(x, m, k, acc);
  if (mixed) last_row.template multiply<X, MAX_M>(x, m, k, acc);
  store_rows<MAX_M, SPLIT>(acc, r, valid, m, g, RowInputs(g, r, valid, m));
}

// Embedding rows read from a table of blocks: y[t, :] = table[ids[t], :],
// one block of threads per id (as `embedding` in data.cu; a bad id sets
// `error` and gives zeros).
template <typename F>
__device__ void embedding_blocks(const u8* table, const i64* ids, float* y, i64 rows, int cols, int* error,
                                 const KilnRowNorm& norm) {
  kiln_wait_inputs();
  i64 id = ids[blockIdx.x];
  bool valid = id >= 0 && id < rows;
  if (!valid && threadIdx.x == 0) *error = 1;
  const u8* row = table + (valid ? id : 0) * (i64)(cols / F::ELEMS) * F::BYTES;
  write_row_normed(
      y, blockIdx.x, cols,
      [&](int c) { return valid ? F::value(row + (c / F::ELEMS) * F::BYTES, c % F::ELEMS) : 0.0f; }, norm);
}

// Every value of `count` blocks as bf16: a thread per lane part of a block
// (the GEMV's loads), striding over the grid. K-quant blocks are taken in
// the spread lane order (Q4_K_Spread, Q6_K_Spread): a block's 8 lanes then
// store 32 consecutive values (two whole 32-byte sectors) an instruction,
// where KQuant's and Q6_K's parts of 16 consecutive values had them store
// 8 bytes into each of 8 sectors (4 times the store transactions for the
// ~15 GB a Llama-3-8B Q4_K_M prefill step expands). Runs of 8 values at a
// multiple of 8 columns (Q8_0's: 16 bytes at a 16-byte boundary of the
// output, whose blocks' values start at multiples of 8) take one store,
// not two of 8 bytes that each half-filled the block's two sectors.
template <typename F>
__device__ void dequant(const u8* w, bf16_bits* out, i64 count) {
  kiln_wait_inputs();
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count * F::LANES; i += (i64)gridDim.x * blockDim.x) {
    i64 block = i / F::LANES;
    int part = (int)(i % F::LANES);
    bf16_bits* values = out + block * F::ELEMS;
    F::values(F::load(w + block * F::BYTES, part), part, 0, [&](const float* v, int n, int column, float scale) {
      store_bf16_run(values + column, v, n, scale, column % 8 == 0);
    });
  }
}
