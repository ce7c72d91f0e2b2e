// Products of GGUF-block matrices with batches too large for the decode
// GEMV (gemv.cuh) and too small for expanding the whole matrix to bf16 for
// cuBLAS to pay off (up to 64 rows of x, a decode step of many sequences):
// y [m, n] = x [m, k] · Wᵀ, W [n, k] read packed, x as bf16 (cast by
// kiln_f32_to_bf16), on tensor cores with f32 accumulation.
//
// A block of four warps takes 64 rows of W and 64 rows of x (16 in the
// `_m16` kernels, which the host takes up to 16 rows of x). For each
// stretch of 128 columns it decodes its W rows' part of the blocks into
// shared memory as bf16 while x's stretch is copied there by asynchronous
// 16-byte copies (cp.async, so x holds no registers), then each warp
// multiplies its share of the tile through mma_bf16_16816: 16 rows of W
// with the 16 rows of x in `_m16`, 32 rows of W with 32 of x otherwise
// (skipping groups of 16 rows of x past m, whose rows are not copied). The
// next stretch's packed bytes are loaded into registers before the current
// stretch's products, so their memory round trip overlaps the arithmetic.
// W is read once for m ≤ 64, packed: a quarter (Q4_K) to a half (Q8_0) of
// the bytes of bf16, and none of the expanded copy's writes and reads.
//
// The kernel streams W with one stretch of a block in flight, so what
// bounds it is how many blocks each multiprocessor holds and how much of a
// stretch's time its next stretch's loads are in flight: at 195 registers
// a thread (x's stretch in registers too) it held two blocks, whose loads
// overlapped the products only, and Q4_K_M at 16 rows took 11.8 ms a step
// where cuBLAS on bf16 took 6.1 (H200, 2026-11-30). Launch bounds now hold
// it to KILN_QMM_BLOCKS_PER_SM blocks (128 registers; host/src/runtime/
// cuda/qmm.rs sizes its splits for as many); the fragments' shared
// addresses are worked out once (ldmatrix_x4's offset), which keeps the
// products unrolled within them; and the formats whose two loaded
// stretches fit without spilling (Q4_K, Q6_K, Q4_0: EARLY) ask for the
// next stretch before decoding this one, so its loads overlap the
// decoding too (Q8_0, Q5_0, Q5_K and bf16 spilled doing so; Q5_0, Q5_K and
// Q4_0 unroll the products by 2, Q8_0 and Q6_K by 4, where 8 spilled). The `_m16` kernels
// (X_GROUPS = 1: one group's accumulators and fragments, a quarter of x's
// tile) fit in 96 registers, so 5 blocks a multiprocessor, every format
// EARLY but bf16. Each thread's W and x rows' addresses are worked out once
// (StretchRows, XStretch), not again every stretch. In sm_90 SASS a Q4_K
// stretch is 593 instructions a thread (698, then 624 before), 474 in
// `_m16` (588 before the addresses were worked out once; unmeasured on a
// GPU).
//
// The decoded runs reach the shared tile 16 bytes a store (runs of 8
// values), K-quant rows on consecutive lanes (Stretch::ROWS_FASTEST), so
// no two stores of a quarter-warp share a bank: a warp's Q4_K decoding a
// stretch took 128 shared wavefronts (bank conflicts of 8-byte stores
// 64 columns apart) where 32 carry its bytes, now 32 (Q6_K and Q8_0 64 →
// 32; kernels/cuda/qmm_banks.py). The shared memory serves an SM one
// wavefront a cycle: with ldmatrix's 64 and x's copies' 8, `_m16`'s 20
// warps an SM asked ~4,000 cycles a stretch of it against ~2,400 of issue
// (474 instructions a warp, four schedulers); now ~2,100. The H200 profile
// measured ~5 µs a stretch at 16 rows (Q4_K gate/up 101 µs, 0.65 TB/s).
// The 64-row kernels' warps each took 16 W rows against all 64 rows of x
// (5 ldmatrix a 16-column chunk: 160 wavefronts a warp's stretch, 224 with
// the decoding's 32 and x's copies' 32, ~3,600 cycles an SM's 16 warps
// against ~2,500 of issue); in 2 × 2 they take 4 (~3,100 against ~2,500).
// Unmeasured on a GPU since.
//
// Dense bf16 matrices take the same path (`kiln_qmm_bf16`, DenseBf16: a
// "block" of 8 values is one 16-byte load, copied to shared memory as it
// is), opted into in place of cuBLAS until measured on a GPU.
//
// One launch covers up to KILN_QMM_MAX_GROUP matrices that share x (q, k
// and v; gate and up: KilnQmmGroup), their tiles side by side in the grid,
// and for a gated MLP's gate and up it writes the activation itself.
//
// Split-K: the gridDim.z blocks of a tile take `k_split` columns each (a
// multiple of 128), so matrices with few rows still fill the card. With more
// than one, each writes its tile's sums to `partials` and the last of the
// tile's blocks to finish (last_block_done) adds them in order (the same
// bits every run, unlike atomics) and writes the outputs; with one, the
// block writes them.
#include "kiln_cuda.cuh"
#include "gguf_blocks.cuh"
#include "gguf_low_bits.cuh"

#define KILN_QMM_TILE 64
#define KILN_QMM_K 128
// A shared row of a stretch, padded by 8 bf16: the fragment loads of a
// warp's 8 rows × 4 column pairs fall in 32 different banks.
#define KILN_QMM_STRIDE (KILN_QMM_K + 8)
#define KILN_QMM_THREADS 128
// Blocks a multiprocessor holds (registers ≤ 65536 / (128 · 4) = 128), and
// for the `_m16` kernels (≤ 102; their shared tiles 21.8 KB a block).
#define KILN_QMM_BLOCKS_PER_SM 4
#define KILN_QMM_M16_BLOCKS_PER_SM 5
// 16-byte chunks of x's stretch (16 rows at a time) each thread copies.
#define KILN_QMM_X_CHUNKS_PER_GROUP (16 * KILN_QMM_K / 8 / KILN_QMM_THREADS)

// How F's lane parts cover a stretch of 128 columns of a row: PARTS parts
// (of one block, or of 128 / ELEMS blocks), PER_THREAD of the tile's per
// thread. PARTS divides the block's threads, so a thread takes the same part
// of rows ROW_STEP apart: one address computed per stretch, stepped by rows.
template <typename F>
struct Stretch {
  static const int PARTS =
      F::ELEMS >= KILN_QMM_K ? F::LANES * KILN_QMM_K / F::ELEMS : F::LANES * (KILN_QMM_K / F::ELEMS);
  static const int PER_THREAD = KILN_QMM_TILE * PARTS / KILN_QMM_THREADS;
  static const int ROW_STEP = KILN_QMM_THREADS / PARTS;
  static_assert(KILN_QMM_THREADS % PARTS == 0, "a thread's parts lie in rows ROW_STEP apart");
  // Thread t's part and first row. Where a warp's parts span 8 rows (PARTS
  // ≤ 4: the K-quants), consecutive lanes take consecutive rows, so a
  // quarter-warp's 16-byte stores fall in 8 rows of one part, 17 units of
  // 16 bytes apart (KILN_QMM_STRIDE): 8 different banks (a row's parts on
  // consecutive lanes put two 64 columns apart, the same banks, in one).
  // A warp loads the same rows and parts either way.
  static const bool ROWS_FASTEST = PARTS <= 4;
  static const int WARP_ROWS = 32 / PARTS;
  __device__ static int part_of_thread(unsigned t) { return (int)(ROWS_FASTEST ? t % 32 / WARP_ROWS : t % PARTS); }
  __device__ static int row_of_thread(unsigned t) {
    return (int)(ROWS_FASTEST ? t / 32 * WARP_ROWS + t % WARP_ROWS : t / PARTS);
  }
};

// Dense bf16 rows as a format of 8-value blocks: one 16-byte load each.
struct DenseBf16 {
  static const int ELEMS = 8, BYTES = 16, LANES = 1;
  typedef Bytes16 Raw;
  __device__ static Raw load(const u8* b, int) { return load_streaming(b); }
};

// A loaded part of a W row to its place in the shared tile (`column` of
// the stretch) as bf16: decoded by the format (runs of 8 one 16-byte
// store), or a dense row's copied.
template <typename F>
struct SharedRow {
  __device__ static void store(const typename F::Raw& raw, int part, int column, bf16_bits* row) {
    // Every format's runs of 8 start at a multiple of 8 columns: 16-byte
    // aligned in the tile's rows.
    F::values(raw, part, column, [&](const float* v, int count, int at, float scale) {
      store_bf16_run(row + at, v, count, scale, true);
    });
  }
};
template <>
struct SharedRow<DenseBf16> {
  __device__ static void store(const Bytes16& raw, int, int column, bf16_bits* row) {
    *reinterpret_cast<Bytes16*>(row + column) = raw;
  }
};

// The matrices of one launch, all [*, k] in one format, that share x:
// matrix s takes tiles tiles_end[s-1] .. tiles_end[s] of the grid's x
// dimension (64 of its rows each, the last cut short) and writes y[s]
// [m, rows[s]]. Gated (`activation` nonzero, kiln_gated's numbering): two
// matrices of rows[0] rows, a gated MLP's gate and up; tile t holds gate's
// rows 32t .. 32t + 31 and up's same rows and writes act(gate)·up to y[0]
// [m, rows[0]] (y[1] is not written): the activation's launch and the round
// trip of gate's and up's products through memory are saved. Outputs are
// stored as `out_type` says (store_as).
#define KILN_QMM_MAX_GROUP 4
struct KilnQmmGroup {
  i64 count;
  i64 tiles_end[KILN_QMM_MAX_GROUP];
  i64 rows[KILN_QMM_MAX_GROUP];
  const u8* w[KILN_QMM_MAX_GROUP];
  float* y[KILN_QMM_MAX_GROUP];
  i64 activation;
  i64 out_type;
};

// The block's tile: tile row r is row `first + r` of `w[0]`, or, gated, row
// `first + r % 32` of gate's (`w[0]`, r < 32) or up's (`w[1]`) matrix, of
// `n` rows; the outputs go to `y` [m, n].
struct QmmTile {
  const u8* w[2];
  float* y;
  int first, n;
  bool gated;
};

__device__ __forceinline__ QmmTile qmm_tile(const KilnQmmGroup& g) {
  int t = blockIdx.x;
  if (g.activation != 0) return QmmTile{{g.w[0], g.w[1]}, g.y[0], 32 * t, (int)g.rows[0], true};
  // Constant indices into the group (a computed one would copy the kernel
  // argument to local memory).
  int start = 0;
  QmmTile tile{{g.w[0], g.w[0]}, g.y[0], 0, 0, false};
#pragma unroll
  for (int s = 0; s < KILN_QMM_MAX_GROUP; ++s) {
    if (s < g.count && t >= start && t < g.tiles_end[s]) {
      tile = QmmTile{{g.w[s], g.w[s]}, g.y[s], (t - start) * KILN_QMM_TILE, (int)g.rows[s], false};
    }
    start = (int)g.tiles_end[s];
  }
  return tile;
}

// The tile's stretch of W at column kc, loaded: thread t's parts t, t + 128,
// ... (part q: row q / PARTS, part q % PARTS of the row's stretch). What
// lies past n or k_end is zero.
template <typename F>
struct Loaded {
  typename F::Raw w[Stretch<F>::PER_THREAD];
};

// What a thread loads and decodes of every stretch of the tile's W, worked
// out once before the loop over stretches: its parts lie in tile rows
// `row`, row + ROW_STEP, ... (the first half below tile row 32, the second
// at or past it: up's rows in a gated tile), at the same place of each
// row's stretch. A stretch's loads are then an offset from the two first
// rows' addresses (in sm_90 SASS the stretch loop's integer arithmetic,
// each part's row address worked out again a stretch, was ~270 of the
// dense bf16 `_m16` kernel's 357 instructions; 243 now).
template <typename F>
struct StretchRows {
  typedef Stretch<F> S;
  static_assert(S::PER_THREAD * S::ROW_STEP == KILN_QMM_TILE, "a thread's parts cover the tile's rows");
  static_assert(32 % S::ROW_STEP == 0, "a thread's rows stay in one half of a gated tile");
  static const int HALF = S::PER_THREAD / 2;  // parts below tile row 32
  const u8* first[2];  // the thread's first row of each half, at column 0
  int left[2];         // W rows from each half's first to n (parts at or past them are zeros)
  int row;             // tile row of the first part
  int block_in, lane;  // the part: lane part `lane` of the stretch's block `block_in`

  __device__ StretchRows(const QmmTile& tile, int k) {
    int part = S::part_of_thread(threadIdx.x);
    row = S::row_of_thread(threadIdx.x);
    block_in = part / F::LANES;
    lane = part % F::LANES;
    i64 row_bytes = row_bytes_of(k);
    int low = tile.first + row, high = tile.gated ? low : low + 32;
    first[0] = tile.w[0] + low * row_bytes;
    first[1] = tile.w[1] + high * row_bytes;
    left[0] = tile.n - low;
    left[1] = tile.n - high;
  }
  // Bytes of a row of W (worked out again where used: in a register
  // throughout, the 64-row kernels spilled).
  __device__ static i64 row_bytes_of(int k) { return (i64)((unsigned)k / F::ELEMS) * F::BYTES; }
  // The stretch's block holding the part and which lane part of it.
  __device__ int block_of(int kc) const { return (int)((unsigned)kc / F::ELEMS) + block_in; }
  __device__ int part_of(int kc) const {
    return (F::ELEMS >= KILN_QMM_K ? (int)((unsigned)kc % F::ELEMS / KILN_QMM_K) * S::PARTS : 0) + lane;
  }
  // The parts of the stretch at column kc; zeros past n or k_end.
  __device__ void load(Loaded<F>* s, int k, int kc, int k_end) const {
    int block = block_of(kc), part = part_of(kc);
    bool in_k = kc < k_end && block * F::ELEMS < k_end;  // (a K-quant block may start before a stretch past k_end)
    i64 offset = (i64)block * F::BYTES, row_step = S::ROW_STEP * row_bytes_of(k);
#pragma unroll
    for (int j = 0; j < S::PER_THREAD; ++j) {
      const int h = j / HALF, step = j % HALF;
      s->w[j] = typename F::Raw{};
      if (in_k && step * S::ROW_STEP < left[h]) s->w[j] = F::load(first[h] + step * row_step + offset, part);
    }
  }
  // Decodes the loaded stretch at column kc into the shared tile.
  __device__ void store(const Loaded<F>& s, bf16_bits (*ws)[KILN_QMM_STRIDE], int kc) const {
    int column = block_of(kc) * F::ELEMS - kc, part = part_of(kc);
#pragma unroll
    for (int j = 0; j < S::PER_THREAD; ++j) SharedRow<F>::store(s.w[j], part, column, ws[row + j * S::ROW_STEP]);
  }
};

// A thread's copies of x's stretches into the shared tile, worked out once:
// chunk j of group g is x row m0 + 16g + 8j + row (zeros past m and k_end)
// at the thread's 8 columns of the stretch.
struct XStretch {
  const bf16_bits* from;  // x row m0 + row at the thread's column of stretch 0
  int left;               // rows of x from m0 + row to m
  int row, column;

  __device__ XStretch(const bf16_bits* x, int m0, int m, int k) {
    static_assert(KILN_QMM_X_CHUNKS_PER_GROUP == 2, "a group of 16 rows is two chunks of 8 a thread");
    row = threadIdx.x / (KILN_QMM_K / 8);
    column = threadIdx.x % (KILN_QMM_K / 8) * 8;
    from = x + (i64)(m0 + row) * k + column;
    left = m - m0 - row;
  }
  // Issues the copies of the stretch at column kc (rows of the first
  // `m_groups` groups of 16); in the tile once the thread has waited for
  // its copies and the block has passed a barrier. `x` stands in for the
  // address of a copy not made.
  template <int X_GROUPS>
  __device__ void copy(bf16_bits (*xs)[KILN_QMM_STRIDE], const bf16_bits* x, int m_groups, int k, int kc,
                       int k_end) const {
    bool in_k = kc + column < k_end;
    i64 rows8 = 8 * (i64)k;  // elements from a row of x to the one 8 on
#pragma unroll
    for (int g = 0; g < X_GROUPS; ++g) {
      if (g < m_groups) {
#pragma unroll
        for (int j = 0; j < KILN_QMM_X_CHUNKS_PER_GROUP; ++j) {
          const int r = 16 * g + 8 * j;
          bool valid = in_k && r < left;
          copy_async_16(xs[r + row] + column, valid ? from + (2 * g + j) * rows8 + kc : x, valid);
        }
      }
    }
  }
};

// The tile's sums (sums[x row][tile row], x rows m0 ..) to its outputs:
// each row's, or, gated, act(gate)·up of each pair of rows 32 apart.
__device__ __forceinline__ void store_tile(const KilnQmmGroup& g, const QmmTile& tile,
                                           const float (*sums)[KILN_QMM_TILE + 1], int m0, int rows) {
  int width = tile.gated ? KILN_QMM_TILE / 2 : KILN_QMM_TILE;
  for (int i = threadIdx.x; i < rows * width; i += KILN_QMM_THREADS) {
    int r = i / width, c = i % width, col = tile.first + c;
    if (col >= tile.n) continue;
    float v = tile.gated ? kiln_gated((int)g.activation, sums[r][c], sums[r][c + width]) : sums[r][c];
    store_as(tile.y, (i64)(m0 + r) * tile.n + col, v, (int)g.out_type);
  }
}

// F: W's format; EARLY: the next stretch asked for before this one's
// decoding; UNROLL: steps of the products unrolled; X_GROUPS: groups of 16
// rows of x a block takes (4, or 1 for the `_m16` kernels).
template <typename F, bool EARLY, int UNROLL, int X_GROUPS>
__device__ void qmm(const KilnQmmGroup& g, const bf16_bits* __restrict__ x, float* __restrict__ partials,
                    unsigned* __restrict__ counters, int m, int k, int k_split) {
  // The tiles as 16-byte units (aligned for the 16-byte stores of x).
  __shared__ Bytes16 w_raw[KILN_QMM_TILE * KILN_QMM_STRIDE / 8];
  __shared__ Bytes16 x_raw[16 * X_GROUPS * KILN_QMM_STRIDE / 8];
  bf16_bits(*ws)[KILN_QMM_STRIDE] = reinterpret_cast<bf16_bits(*)[KILN_QMM_STRIDE]>(w_raw);
  bf16_bits(*xs)[KILN_QMM_STRIDE] = reinterpret_cast<bf16_bits(*)[KILN_QMM_STRIDE]>(x_raw);
  QmmTile tile = qmm_tile(g);
  int m0 = blockIdx.y * 16 * X_GROUPS;
  int k_begin = blockIdx.z * k_split, k_end = min(k, k_begin + k_split);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = lane / 4, pair = lane % 4;
  // Groups of 16 rows of x that hold rows of this tile (the same in every
  // lane, so the warp's tensor-core products stay together).
  int m_groups = min(16 * X_GROUPS, m - m0 + 15) / 16;
  // The block's 4 warps over its tile of products: with 4 groups of x, 2 × 2
  // (a warp takes 2 groups of 16 W rows and 2 groups of x: 4 ldmatrix a
  // 16-column chunk, where 16 W rows against all 4 groups took 5); with 1,
  // 16 W rows each.
  const int X_SUB = X_GROUPS == 4 ? 2 : 1;  // groups of x a warp takes
  const int W_SUB = X_GROUPS / X_SUB;       // groups of 16 W rows a warp takes
  const int W_WARPS = 4 / W_SUB;            // warps along W's rows
  // The warp's place, uniform in it as the compiler sees it (a shuffle from
  // lane 0), so its products need no reconvergence around their test of
  // m_groups.
  int warp_w = warp % W_WARPS, warp_x = W_WARPS == 4 ? 0 : __shfl_sync(0xffffffffu, warp / W_WARPS, 0);
  float acc[X_SUB][W_SUB][2][4] = {};
  // The lane's ldmatrix rows at a stretch's column 0 (see the products).
  const bf16_bits* w_rows_at[W_SUB];
#pragma unroll
  for (int s = 0; s < W_SUB; ++s)
    w_rows_at[s] = ws[16 * (W_SUB * warp_w + s) + 8 * (lane / 16) + lane % 8] + 8 * ((lane / 8) % 2);
  const bf16_bits* x_rows[X_SUB];
#pragma unroll
  for (int s = 0; s < X_SUB; ++s)
    x_rows[s] = xs[16 * (X_SUB * warp_x + s) + 8 * ((lane / 8) % 2) + lane % 8] + 8 * (lane / 16);
  StretchRows<F> w_rows(tile, k);
  XStretch x_rows_copy(x, m0, m, k);
  Loaded<F> current;
  w_rows.load(&current, k, k_begin, k_end);
  for (int kc = k_begin; kc < k_end; kc += KILN_QMM_K) {
    // The next stretch's W, asked for before this one's decoding (EARLY)
    // or before its products only.
    // Past k_end (the last stretch's turn) it is zeros, nothing loaded.
    Loaded<F> next;
    if (EARLY) w_rows.load(&next, k, kc + KILN_QMM_K, k_end);
    __syncthreads();  // every warp is done with the previous stretch
    x_rows_copy.copy<X_GROUPS>(xs, x, m_groups, k, kc, k_end);  // x's copies overlap W's decoding
    w_rows.store(current, ws, kc);
    copy_async_wait();
    __syncthreads();
    if (!EARLY) w_rows.load(&next, k, kc + KILN_QMM_K, k_end);
#pragma unroll(UNROLL)
    for (int c = 0; c < KILN_QMM_K / 16; ++c) {
      // B fragments of each of the warp's groups of 16 W rows: lane i's
      // ldmatrix row is the group's row 8 (i / 16) + i % 8 at column 16c + 8
      // ((i / 8) % 2), giving b[s][0..1] for its first 8 rows, b[s][2..3]
      // for the next.
      unsigned b[W_SUB][4];
#pragma unroll
      for (int s = 0; s < W_SUB; ++s) ldmatrix_x4<false>(b[s], w_rows_at[s], 32 * c);
#pragma unroll
      for (int s = 0; s < X_SUB; ++s) {
        // A fragment of the warp's x group s: lane i's row 8 ((i / 8) % 2) +
        // i % 8 of it at column 16c + 8 (i / 16) (loaded for every group: a
        // branch around the load costs more than the load; groups past
        // m_groups, never copied, are not multiplied).
        unsigned a[4];
        ldmatrix_x4<false>(a, x_rows[s], 32 * c);
        if (X_SUB * warp_x + s < m_groups) {
#pragma unroll
          for (int t = 0; t < W_SUB; ++t) {
            mma_bf16_16816(acc[s][t][0], a, b[t]);
            mma_bf16_16816(acc[s][t][1], a, b[t] + 2);
          }
        }
      }
    }
    current = next;
  }
  // The sums through shared memory (the stretches' space, once every warp
  // is done with it), so the outputs are written a row at a time.
  __syncthreads();
  float(*sums)[KILN_QMM_TILE + 1] = reinterpret_cast<float(*)[KILN_QMM_TILE + 1]>(w_raw);
#pragma unroll
  for (int s = 0; s < X_SUB; ++s)
#pragma unroll
    for (int w = 0; w < W_SUB; ++w)
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sums[16 * (X_SUB * warp_x + s) + group + (e >= 2 ? 8 : 0)]
              [16 * (W_SUB * warp_w + w) + 8 * t + 2 * pair + e % 2] = acc[s][w][t][e];
  __syncthreads();
  int rows = min(16 * X_GROUPS, m - m0);
  if (gridDim.z > 1) {
    // partials [z][m][every tile's 64 rows]; the tile's last block adds them.
    i64 width = (i64)gridDim.x * KILN_QMM_TILE, at = (i64)blockIdx.x * KILN_QMM_TILE;
    for (int i = threadIdx.x; i < rows * KILN_QMM_TILE; i += KILN_QMM_THREADS)
      partials[((i64)blockIdx.z * m + m0 + i / KILN_QMM_TILE) * width + at + i % KILN_QMM_TILE] =
          sums[i / KILN_QMM_TILE][i % KILN_QMM_TILE];
    if (!last_block_done(counters + blockIdx.y * gridDim.x + blockIdx.x, gridDim.z)) return;
    // Each element's splits added in split order from 0 (the same bits
    // every run), four elements a thread at a time, their loads from L2
    // (`__ldcg`: the other blocks' fenced writes) issued together. Read
    // element by element, split by split, as a volatile loop compiled, the
    // last block paid elements × splits L2 round trips in a row (32 at 16
    // rows and 4 splits); now a quarter of that.
    const int count = rows * KILN_QMM_TILE;
    for (int first = threadIdx.x; first < count; first += 4 * KILN_QMM_THREADS) {
      float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int z = 0; z < (int)gridDim.z; ++z) {
        float part[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          int i = first + u * KILN_QMM_THREADS;
          part[u] = i < count ? __ldcg(partials + ((i64)z * m + m0 + i / KILN_QMM_TILE) * width + at + i % KILN_QMM_TILE)
                              : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) sum[u] += part[u];
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        int i = first + u * KILN_QMM_THREADS;
        if (i < count) sums[i / KILN_QMM_TILE][i % KILN_QMM_TILE] = sum[u];
      }
    }
    __syncthreads();
  }
  store_tile(g, tile, sums, m0, rows);
}

// Grid: (the group's tiles, x's row tiles of 64 rows, or 16 for `_m16`,
// K's splits). `counters`: one per (x row tile, tile), zero, and left so;
// unused without splits.
#define KILN_QMM_ARGS                                                                                        \
  KilnQmmGroup g, const bf16_bits *__restrict__ x, float *__restrict__ partials, unsigned *__restrict__ counters, \
      int m, int k, int k_split

extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q8_0(KILN_QMM_ARGS) { qmm<Q8_0, false, 4, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q8_0_m16(KILN_QMM_ARGS) { qmm<Q8_0, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q4_0(KILN_QMM_ARGS) { qmm<Q4_0, true, 2, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q4_0_m16(KILN_QMM_ARGS) { qmm<Q4_0, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q5_0(KILN_QMM_ARGS) { qmm<Q5_0, false, 2, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q5_0_m16(KILN_QMM_ARGS) { qmm<Q5_0, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q4_1(KILN_QMM_ARGS) { qmm<Q4_1, true, 2, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q4_1_m16(KILN_QMM_ARGS) { qmm<Q4_1, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q5_1(KILN_QMM_ARGS) { qmm<Q5_1, false, 2, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q5_1_m16(KILN_QMM_ARGS) { qmm<Q5_1, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q4_k(KILN_QMM_ARGS) { qmm<Q4_K, true, 8, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q4_k_m16(KILN_QMM_ARGS) { qmm<Q4_K, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q5_k(KILN_QMM_ARGS) { qmm<Q5_K, false, 2, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q5_k_m16(KILN_QMM_ARGS) { qmm<Q5_K, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q6_k(KILN_QMM_ARGS) { qmm<Q6_K, true, 4, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q6_k_m16(KILN_QMM_ARGS) { qmm<Q6_K, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_iq4_nl(KILN_QMM_ARGS) { qmm<IQ4_NL, true, 2, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_iq4_nl_m16(KILN_QMM_ARGS) { qmm<IQ4_NL, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_iq4_xs(KILN_QMM_ARGS) { qmm<IQ4_XS, true, 8, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_iq4_xs_m16(KILN_QMM_ARGS) { qmm<IQ4_XS, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q2_k(KILN_QMM_ARGS) { qmm<Q2_K, true, 4, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q2_k_m16(KILN_QMM_ARGS) { qmm<Q2_K, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_q3_k(KILN_QMM_ARGS) { qmm<Q3_K, true, 4, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_q3_k_m16(KILN_QMM_ARGS) { qmm<Q3_K, true, 8, 1>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_BLOCKS_PER_SM) kiln_qmm_bf16(KILN_QMM_ARGS) { qmm<DenseBf16, false, 8, 4>(g, x, partials, counters, m, k, k_split); }
extern "C" __global__ void __launch_bounds__(KILN_QMM_THREADS, KILN_QMM_M16_BLOCKS_PER_SM) kiln_qmm_bf16_m16(KILN_QMM_ARGS) { qmm<DenseBf16, false, 8, 1>(g, x, partials, counters, m, k, k_split); }
