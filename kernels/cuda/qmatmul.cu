// Products of GGUF-block matrices with batches too large for the decode
// GEMV (gemv.cu) and too small for expanding the whole matrix to bf16 for
// cuBLAS to pay off (up to 64 rows of x, a decode step of many sequences):
// y [m, n] = x [m, k] · Wᵀ, W [n, k] read packed, x as bf16 (cast by
// kiln_f32_to_bf16), on tensor cores with f32 accumulation.
//
// A block of four warps takes 64 rows of W and 64 rows of x. For each
// stretch of 128 columns it decodes its W rows' part of the blocks into
// shared memory as bf16 and copies x's, then each warp multiplies 16 rows
// of W with the tile's rows of x through mma_bf16_16816 (skipping groups of
// 16 rows of x past m). The next stretch's packed bytes and x are loaded into
// registers before the current stretch's products, so their memory round
// trip overlaps the arithmetic. W is read once for m ≤ 64, packed: a quarter
// (Q4_K) to a half (Q8_0) of the bytes of bf16, and none of the expanded
// copy's writes and reads.
//
// Split-K: the gridDim.z blocks of a tile take `k_split` columns each (a
// multiple of 128), so matrices with few rows still fill the card. With more
// than one, each writes its sums to partials [z][m][n] and kiln_qmm_reduce
// adds them in order (the same bits every run, unlike atomics); with one,
// the block writes y.
#include "kiln_cuda.cuh"
#include "gguf_blocks.cuh"

#define KILN_QMM_TILE 64
#define KILN_QMM_K 128
// A shared row of a stretch, padded by 8 bf16: the fragment loads of a
// warp's 8 rows × 4 column pairs fall in 32 different banks.
#define KILN_QMM_STRIDE (KILN_QMM_K + 8)
#define KILN_QMM_THREADS 128
// 16-byte chunks of x's stretch each thread copies.
#define KILN_QMM_X_CHUNKS (KILN_QMM_TILE * KILN_QMM_K / 8 / KILN_QMM_THREADS)

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
};

// The tile's stretch at column kc, loaded: thread t's parts t, t + 128, ...
// of W (part q: row q / PARTS, part q % PARTS of the row's stretch) and its
// chunks of x. What lies past n, m or k_end is zero.
template <typename F>
struct Loaded {
  typename F::Raw w[Stretch<F>::PER_THREAD];
  Bytes16 x[KILN_QMM_X_CHUNKS];
};

// Where part `i` of a row's stretch at column kc lies: its block and which
// of the block's lane parts it is.
template <typename F>
__device__ __forceinline__ void stretch_part(int kc, int i, int* block, int* part) {
  *block = kc / F::ELEMS + i / F::LANES;
  *part = (F::ELEMS >= KILN_QMM_K ? (kc % F::ELEMS) / KILN_QMM_K * Stretch<F>::PARTS : 0) + i % F::LANES;
}

template <typename F>
__device__ __forceinline__ void load_stretch(Loaded<F>* s, const u8* w, const bf16_bits* x, int n0, int m0, int m,
                                             int n, int k, int kc, int k_end) {
  typedef Stretch<F> S;
  i64 row_bytes = (i64)(k / F::ELEMS) * F::BYTES;
  int row = threadIdx.x / S::PARTS, block, part;
  stretch_part<F>(kc, threadIdx.x % S::PARTS, &block, &part);
  const u8* at = w + (n0 + row) * row_bytes + (i64)block * F::BYTES;
  bool in_k = block * F::ELEMS < k_end;
#pragma unroll
  for (int j = 0; j < S::PER_THREAD; ++j) {
    s->w[j] = typename F::Raw{};
    if (in_k && n0 + row + j * S::ROW_STEP < n) s->w[j] = F::load(at + j * S::ROW_STEP * row_bytes, part);
  }
#pragma unroll
  for (int j = 0; j < KILN_QMM_X_CHUNKS; ++j) {
    int c = threadIdx.x + j * KILN_QMM_THREADS, row = c / (KILN_QMM_K / 8), col = kc + c % (KILN_QMM_K / 8) * 8;
    s->x[j] = Bytes16{};
    if (m0 + row < m && col < k_end) s->x[j] = *reinterpret_cast<const Bytes16*>(x + (i64)(m0 + row) * k + col);
  }
}

// Decodes a loaded stretch into the shared tiles.
template <typename F>
__device__ __forceinline__ void store_stretch(const Loaded<F>& s, bf16_bits (*ws)[KILN_QMM_STRIDE],
                                              bf16_bits (*xs)[KILN_QMM_STRIDE], int kc) {
  typedef Stretch<F> S;
  int row = threadIdx.x / S::PARTS, block, part;
  stretch_part<F>(kc, threadIdx.x % S::PARTS, &block, &part);
#pragma unroll
  for (int j = 0; j < S::PER_THREAD; ++j) {
    bf16_bits* out = ws[row + j * S::ROW_STEP];
    F::values(s.w[j], part, block * F::ELEMS - kc,
              [&](const float* v, int count, int column, float scale) {
                store_bf16_pairs(out + column, v, count, scale);
              });
  }
#pragma unroll
  for (int j = 0; j < KILN_QMM_X_CHUNKS; ++j) {
    int c = threadIdx.x + j * KILN_QMM_THREADS;
    *reinterpret_cast<Bytes16*>(xs[c / (KILN_QMM_K / 8)] + c % (KILN_QMM_K / 8) * 8) = s.x[j];
  }
}

template <typename F>
__device__ void qmm(const u8* __restrict__ w, const bf16_bits* __restrict__ x, float* __restrict__ y,
                    float* __restrict__ partials, int m, int n, int k, int k_split) {
  // The tiles as 16-byte units (aligned for the 16-byte stores of x).
  __shared__ Bytes16 w_raw[KILN_QMM_TILE * KILN_QMM_STRIDE / 8];
  __shared__ Bytes16 x_raw[KILN_QMM_TILE * KILN_QMM_STRIDE / 8];
  bf16_bits(*ws)[KILN_QMM_STRIDE] = reinterpret_cast<bf16_bits(*)[KILN_QMM_STRIDE]>(w_raw);
  bf16_bits(*xs)[KILN_QMM_STRIDE] = reinterpret_cast<bf16_bits(*)[KILN_QMM_STRIDE]>(x_raw);
  int n0 = blockIdx.x * KILN_QMM_TILE, m0 = blockIdx.y * KILN_QMM_TILE;
  int k_begin = blockIdx.z * k_split, k_end = min(k, k_begin + k_split);
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = lane / 4, pair = lane % 4;
  // Groups of 16 rows of x that hold rows of this tile (the same in every
  // lane, so the warp's tensor-core products stay together).
  int m_groups = min(KILN_QMM_TILE, m - m0 + 15) / 16;
  float acc[KILN_QMM_TILE / 16][2][4] = {};
  Loaded<F> next;
  load_stretch<F>(&next, w, x, n0, m0, m, n, k, k_begin, k_end);
  for (int kc = k_begin; kc < k_end; kc += KILN_QMM_K) {
    __syncthreads();  // every warp is done with the previous stretch
    store_stretch<F>(next, ws, xs, kc);
    __syncthreads();
    if (kc + KILN_QMM_K < k_end) load_stretch<F>(&next, w, x, n0, m0, m, n, k, kc + KILN_QMM_K, k_end);
#pragma unroll
    for (int c = 0; c < KILN_QMM_K / 16; ++c) {
      // B fragments of the warp's two groups of 8 W rows: lane i's ldmatrix
      // row is W row 16 warp + 8 (i / 16) + i % 8 at column 16c + 8 ((i / 8)
      // % 2), giving b[t][0], b[t][1] for t = 0, 1.
      unsigned b[4];
      ldmatrix_x4<false>(b, ws[16 * warp + 8 * (lane / 16) + lane % 8] + 16 * c + 8 * ((lane / 8) % 2));
#pragma unroll
      for (int g = 0; g < KILN_QMM_TILE / 16; ++g) {
        // A fragment of x rows 16g ..: lane i's row 16g + 8 ((i / 8) % 2) +
        // i % 8 at column 16c + 8 (i / 16) (loaded for every group: a branch
        // around the load costs more than the load).
        unsigned a[4];
        ldmatrix_x4<false>(a, xs[16 * g + 8 * ((lane / 8) % 2) + lane % 8] + 16 * c + 8 * (lane / 16));
        if (g < m_groups) {
          mma_bf16_16816(acc[g][0], a, b);
          mma_bf16_16816(acc[g][1], a, b + 2);
        }
      }
    }
  }
  float* out = gridDim.z > 1 ? partials + (i64)blockIdx.z * m * n : y;
#pragma unroll
  for (int g = 0; g < KILN_QMM_TILE / 16; ++g) {
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int row = m0 + 16 * g + group + (e >= 2 ? 8 : 0), col = n0 + 16 * warp + 8 * t + 2 * pair + e % 2;
        if (row < m && col < n) out[(i64)row * n + col] = acc[g][t][e];
      }
    }
  }
}

#define KILN_QMM_ARGS                                                                                          \
  const u8 *__restrict__ w, const bf16_bits *__restrict__ x, float *__restrict__ y, float *__restrict__ partials, \
      int m, int n, int k, int k_split

extern "C" __global__ void kiln_qmm_q8_0(KILN_QMM_ARGS) { qmm<Q8_0>(w, x, y, partials, m, n, k, k_split); }
extern "C" __global__ void kiln_qmm_q4_0(KILN_QMM_ARGS) { qmm<Q4_0>(w, x, y, partials, m, n, k, k_split); }
extern "C" __global__ void kiln_qmm_q5_0(KILN_QMM_ARGS) { qmm<Q5_0>(w, x, y, partials, m, n, k, k_split); }
extern "C" __global__ void kiln_qmm_q4_k(KILN_QMM_ARGS) { qmm<Q4_K>(w, x, y, partials, m, n, k, k_split); }
extern "C" __global__ void kiln_qmm_q5_k(KILN_QMM_ARGS) { qmm<Q5_K>(w, x, y, partials, m, n, k, k_split); }
extern "C" __global__ void kiln_qmm_q6_k(KILN_QMM_ARGS) { qmm<Q6_K>(w, x, y, partials, m, n, k, k_split); }

// y = the sum of `splits` partial products [splits][count], in order.
extern "C" __global__ void kiln_qmm_reduce(const float* __restrict__ partials, float* __restrict__ y, i64 count,
                                           int splits) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (i64)gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (int z = 0; z < splits; ++z) sum += partials[z * count + i];
    y[i] = sum;
  }
}
