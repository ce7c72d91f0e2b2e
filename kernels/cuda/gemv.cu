// Matrix products for small batches (decode): y[m, n] = x[m, k] · W[n, k]ᵀ
// with m ≤ KILN_GEMV_MAX_M, bound by reading W once. One warp per output row
// streams that row of W (bf16/f16/f32 in 16-byte loads kept out of L1, four
// in flight per lane, eight in the one-row `_m1` kernels; GGUF blocks read
// as packed), multiplies it with every row of x (f32, kept in L1: it is small
// and every warp reads it) and reduces across its lanes. One launch covers
// up to KILN_GEMV_MAX_GROUP matrices that share x (q, k and v; gate and up):
// their rows form one grid, so small matrices do not leave the card half
// idle and a layer reads its weights in fewer launches.
//
// GGUF rows are sequences of blocks; each format splits a block among
// `LANES` lanes, so a warp covers 32 / LANES blocks per iteration:
//   Q8_0  (34 B / 32):  4 lanes, 8 quants each
//   Q4_0  (18 B / 32):  4 lanes, 4 bytes of nibbles each
//   Q4_K (144 B / 256): 16 lanes, 8 bytes of nibbles each (two sub-blocks)
//   Q6_K (210 B / 256): 32 lanes, 8 values each
// The layouts are ggml's (kernels/src/quant/format.rs decodes the same bytes
// on the CPU). `kiln_dequant_*` expand the same blocks to bf16 for the GEMM
// of larger batches, and `kiln_embedding_*` read rows of a table of blocks.
#include "kiln_cuda.cuh"

#define KILN_GEMV_MAX_M 8
#define KILN_GEMV_WARPS 4
#define KILN_GEMV_MAX_GROUP 4

typedef unsigned char u8;

// The matrices of one launch, all [*, k] in one format: matrix s has rows
// rows_end[s-1] .. rows_end[s] of the grid and writes y[s] [m, its rows].
struct KilnGemvGroup {
  i64 count;
  i64 rows_end[KILN_GEMV_MAX_GROUP];
  const u8* w[KILN_GEMV_MAX_GROUP];
  float* y[KILN_GEMV_MAX_GROUP];
};

// The warp's output row: its matrix's weights row and where its results go.
struct GemvRow {
  const u8* w;  // the matrix (row 0)
  float* y;     // the matrix's output
  int row, n;   // row within the matrix, the matrix's rows
};

__device__ __forceinline__ bool gemv_row(const KilnGemvGroup& g, GemvRow* r) {
  int row = blockIdx.x * KILN_GEMV_WARPS + threadIdx.x / 32;
  if (row >= g.rows_end[g.count - 1]) return false;
  // Constant indices into the group (a computed one would copy the kernel
  // argument to local memory).
  int start = 0;
#pragma unroll
  for (int s = 0; s < KILN_GEMV_MAX_GROUP; ++s) {
    if (s < g.count && row < g.rows_end[s]) {
      r->w = g.w[s];
      r->y = g.y[s];
      r->row = row - start;
      r->n = (int)g.rows_end[s] - start;
      return true;
    }
    start = (int)g.rows_end[s];
  }
  return false;
}

__device__ __forceinline__ unsigned short load_u16(const u8* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ float load_f16(const u8* p) { return f16_to_f32(load_u16(p)); }

// Adds w · x[i, col + j] for the `count` weights `w` to acc[i], for every row
// i < m of x. x is read 16 bytes at a time where it is aligned for that (a
// lane's scalar loads, 32 bytes apart across the warp, would each touch a
// sector per lane and cost the load unit more than the weights).
template <int MAX_M>
__device__ __forceinline__ void accumulate(float* acc, const float* w, int count, const float* x, int m,
                                           int k, int col) {
#pragma unroll
  for (int i = 0; i < MAX_M; ++i) {
    if (i < m) {
      const float* xi = x + (i64)i * k + col;
      float sum = 0.0f;
      if (count % 4 == 0 && (reinterpret_cast<unsigned long long>(xi) & 15) == 0) {
        for (int j = 0; j < count; j += 4) {
          Bytes16 v = *reinterpret_cast<const Bytes16*>(xi + j);
          for (int t = 0; t < 4; ++t) sum += w[j + t] * __uint_as_float(v.v[t]);
        }
      } else {
        for (int j = 0; j < count; ++j) sum += w[j] * __ldg(xi + j);
      }
      acc[i] += sum;
    }
  }
}

// The warp's sums to y[i, row].
template <int MAX_M>
__device__ __forceinline__ void store_rows(float* acc, float* y, int m, int n, int row) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < MAX_M; ++i) {
    if (i < m) {
      float v = warp_sum(acc[i]);
      if (lane == 0) y[(i64)i * n + row] = v;
    }
  }
}

// ---- dense rows: 8 elements per lane and load ----

// Eight elements of a bf16, f16 or f32 row, as loaded (one 16-byte load,
// two for f32) and as f32.
template <int BYTES>
struct Raw8 {
  Bytes16 part[BYTES == 4 ? 2 : 1];
};

template <int BYTES>
__device__ __forceinline__ Raw8<BYTES> load8(const u8* row, int col) {
  Raw8<BYTES> r;
  const int size = BYTES == 4 ? 4 : 2;
  for (int p = 0; p < (BYTES == 4 ? 2 : 1); ++p) r.part[p] = load_streaming(row + (i64)col * size + 16 * p);
  return r;
}

template <int BYTES>
__device__ __forceinline__ void widen8(const Raw8<BYTES>& r, float* w) {
  if (BYTES == 4) {
    for (int j = 0; j < 8; ++j) w[j] = __uint_as_float(r.part[j / 4].v[j % 4]);
  } else {
    for (int j = 0; j < 4; ++j) {
      unsigned short lo = (unsigned short)(r.part[0].v[j] & 0xffffu), hi = (unsigned short)(r.part[0].v[j] >> 16);
      w[2 * j] = BYTES == 2 ? bf16_to_f32(lo) : f16_to_f32(lo);
      w[2 * j + 1] = BYTES == 2 ? bf16_to_f32(hi) : f16_to_f32(hi);
    }
  }
}

template <int BYTES>
__device__ __forceinline__ float load1(const u8* row, int col) {
  if (BYTES == 4) return *reinterpret_cast<const float*>(row + (i64)col * 4);
  unsigned short b = load_u16(row + (i64)col * 2);
  return BYTES == 2 ? bf16_to_f32(b) : f16_to_f32(b);
}

// BYTES: 2 = bf16, 3 = f16 (2 bytes each), 4 = f32; MAX_M: rows of x at
// most (1 for batch-1 decode: fewer registers, so more warps and more loads
// in flight per multiprocessor).
template <int BYTES, int MAX_M>
__device__ void gemv_dense(const KilnGemvGroup& g, const float* x, int m, int k) {
  // Loads of the weights a lane has in flight before it uses the first.
  const int depth = MAX_M == 1 ? 8 : 4;
  const int size = BYTES == 4 ? 4 : 2;
  const int step = 32 * 8;  // elements a warp reads per load
  int lane = threadIdx.x % 32;
  GemvRow r;
  if (!gemv_row(g, &r)) return;
  const u8* wr = r.w + (i64)r.row * k * size;
  float acc[MAX_M];
  for (int i = 0; i < MAX_M; ++i) acc[i] = 0.0f;
  int vector_end = (k % 8 == 0) ? k : 0;  // 16-byte loads need aligned rows
  int col = lane * 8;
  // Every load of a round is issued before the first is used: a memory
  // round trip per round, not per load.
  for (; col + (depth - 1) * step < vector_end; col += depth * step) {
    Raw8<BYTES> raw[depth];
#pragma unroll
    for (int u = 0; u < depth; ++u) raw[u] = load8<BYTES>(wr, col + u * step);
#pragma unroll
    for (int u = 0; u < depth; ++u) {
      float v[8];
      widen8<BYTES>(raw[u], v);
      accumulate<MAX_M>(acc, v, 8, x, m, k, col + u * step);
    }
  }
  for (; col < vector_end; col += step) {
    float v[8];
    widen8<BYTES>(load8<BYTES>(wr, col), v);
    accumulate<MAX_M>(acc, v, 8, x, m, k, col);
  }
  for (int c = vector_end + lane; c < k; c += 32) {
    float v = load1<BYTES>(wr, c);
    accumulate<MAX_M>(acc, &v, 1, x, m, k, c);
  }
  store_rows<MAX_M>(acc, r.y, m, r.n, r.row);
}

// Each format has a kernel for up to KILN_GEMV_MAX_M rows of x and one, `_m1`,
// for a single row.
extern "C" __global__ void kiln_gemv_bf16(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_dense<2, KILN_GEMV_MAX_M>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_bf16_m1(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_dense<2, 1>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_f16(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_dense<3, KILN_GEMV_MAX_M>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_f16_m1(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_dense<3, 1>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_f32(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_dense<4, KILN_GEMV_MAX_M>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_f32_m1(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_dense<4, 1>(g, x, m, k);
}

// ---- GGUF blocks ----

struct Q8_0 {
  static const int ELEMS = 32, BYTES = 34, LANES = 4;
  // Lane part s: quants 8s .. 8s+7.
  template <int MAX_M>
  __device__ static void dot(const u8* b, int s, const float* x, int m, int k, int col, float* acc) {
    float d = load_f16(b), w[8];
    for (int j = 0; j < 4; ++j) {
      unsigned short q = load_u16(b + 2 + 8 * s + 2 * j);
      w[2 * j] = d * (float)(signed char)(q & 0xff);
      w[2 * j + 1] = d * (float)(signed char)(q >> 8);
    }
    accumulate<MAX_M>(acc, w, 8, x, m, k, col + 8 * s);
  }
  __device__ static float value(const u8* b, int j) { return load_f16(b) * (float)(signed char)b[2 + j]; }
};

struct Q4_0 {
  static const int ELEMS = 32, BYTES = 18, LANES = 4;
  // Lane part s: bytes 4s .. 4s+3, low nibbles are values 4s.., high 16+4s...
  template <int MAX_M>
  __device__ static void dot(const u8* b, int s, const float* x, int m, int k, int col, float* acc) {
    float d = load_f16(b), lo[4], hi[4];
    for (int j = 0; j < 2; ++j) {
      unsigned short q = load_u16(b + 2 + 4 * s + 2 * j);
      for (int h = 0; h < 2; ++h) {
        unsigned int byte = (q >> (8 * h)) & 0xffu;
        lo[2 * j + h] = d * ((float)(byte & 0xfu) - 8.0f);
        hi[2 * j + h] = d * ((float)(byte >> 4) - 8.0f);
      }
    }
    accumulate<MAX_M>(acc, lo, 4, x, m, k, col + 4 * s);
    accumulate<MAX_M>(acc, hi, 4, x, m, k, col + 16 + 4 * s);
  }
  __device__ static float value(const u8* b, int j) {
    unsigned int byte = b[2 + (j % 16)];
    return load_f16(b) * ((float)(j < 16 ? byte & 0xfu : byte >> 4) - 8.0f);
  }
};

// Scale and minimum of Q4_K sub-block `j` (ggml's get_scale_min_k4).
__device__ __forceinline__ void q4k_scale_min(const u8* scales, int j, float* sc, float* mn) {
  if (j < 4) {
    *sc = (float)(scales[j] & 63);
    *mn = (float)(scales[j + 4] & 63);
  } else {
    *sc = (float)((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
    *mn = (float)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

struct Q4_K {
  static const int ELEMS = 256, BYTES = 144, LANES = 16;
  // Lane part s: chunk c = s / 4 of 64 values, bytes 8 (s % 4) .. +7 of its
  // 32: low nibbles in sub-block 2c, high nibbles in 2c + 1.
  template <int MAX_M>
  __device__ static void dot(const u8* b, int s, const float* x, int m, int k, int col, float* acc) {
    int c = s / 4, p = s % 4;
    float d = load_f16(b), dmin = load_f16(b + 2);
    float sc0, m0, sc1, m1;
    q4k_scale_min(b + 4, 2 * c, &sc0, &m0);
    q4k_scale_min(b + 4, 2 * c + 1, &sc1, &m1);
    const unsigned int* q = reinterpret_cast<const unsigned int*>(b + 16 + 32 * c + 8 * p);
    unsigned int words[2] = {q[0], q[1]};
    float lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
      unsigned int byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
      lo[j] = d * sc0 * (float)(byte & 0xfu) - dmin * m0;
      hi[j] = d * sc1 * (float)(byte >> 4) - dmin * m1;
    }
    accumulate<MAX_M>(acc, lo, 8, x, m, k, col + 64 * c + 8 * p);
    accumulate<MAX_M>(acc, hi, 8, x, m, k, col + 64 * c + 32 + 8 * p);
  }
  __device__ static float value(const u8* b, int j) {
    int c = j / 64, l = j % 32, high = (j % 64) >= 32;
    float sc, mn;
    q4k_scale_min(b + 4, 2 * c + high, &sc, &mn);
    unsigned int byte = b[16 + 32 * c + l];
    return load_f16(b) * sc * (float)(high ? byte >> 4 : byte & 0xfu) - load_f16(b + 2) * mn;
  }
};

struct Q6_K {
  static const int ELEMS = 256, BYTES = 210, LANES = 32;
  // Lane t: half h = t / 16 of 128 values, positions l0, l0 + 1 (l0 = 2 (t %
  // 16)) of each of its four quarters of 32.
  template <int MAX_M>
  __device__ static void dot(const u8* b, int t, const float* x, int m, int k, int col, float* acc) {
    int h = t / 16, l0 = 2 * (t % 16);
    float d = load_f16(b + 208);
    unsigned short ql0 = load_u16(b + 64 * h + l0), ql1 = load_u16(b + 64 * h + 32 + l0);
    unsigned short qh = load_u16(b + 128 + 32 * h + l0);
    const signed char* scales = reinterpret_cast<const signed char*>(b + 192 + 8 * h + l0 / 16);
    for (int quarter = 0; quarter < 4; ++quarter) {
      unsigned short ql = quarter % 2 == 0 ? ql0 : ql1;
      float scale = d * (float)scales[2 * quarter], w[2];
      for (int e = 0; e < 2; ++e) {
        unsigned int low = ((ql >> (8 * e)) >> (quarter < 2 ? 0 : 4)) & 0xfu;
        unsigned int high = ((qh >> (8 * e)) >> (2 * quarter)) & 3u;
        w[e] = scale * (float)((int)(low | (high << 4)) - 32);
      }
      accumulate<MAX_M>(acc, w, 2, x, m, k, col + 128 * h + 32 * quarter + l0);
    }
  }
  __device__ static float value(const u8* b, int j) {
    int h = j / 128, quarter = (j % 128) / 32, l = j % 32;
    unsigned int ql = b[64 * h + l + (quarter % 2) * 32];
    unsigned int low = (quarter < 2 ? ql : ql >> 4) & 0xfu;
    unsigned int high = (b[128 + 32 * h + l] >> (2 * quarter)) & 3u;
    float scale = (float)(reinterpret_cast<const signed char*>(b + 192))[8 * h + l / 16 + 2 * quarter];
    return load_f16(b + 208) * scale * (float)((int)(low | (high << 4)) - 32);
  }
};

template <typename F, int MAX_M>
__device__ void gemv_blocks(const KilnGemvGroup& g, const float* x, int m, int k) {
  int lane = threadIdx.x % 32;
  GemvRow r;
  if (!gemv_row(g, &r)) return;
  int blocks = k / F::ELEMS;
  const u8* wr = r.w + (i64)r.row * blocks * F::BYTES;
  float acc[MAX_M];
  for (int i = 0; i < MAX_M; ++i) acc[i] = 0.0f;
  for (int blk = lane / F::LANES; blk < blocks; blk += 32 / F::LANES)
    F::template dot<MAX_M>(wr + (i64)blk * F::BYTES, lane % F::LANES, x, m, k, blk * F::ELEMS, acc);
  store_rows<MAX_M>(acc, r.y, m, r.n, r.row);
}

// Embedding rows read from a table of blocks: y[t, :] = table[ids[t], :],
// one block of threads per id (as `embedding` in data.cu; a bad id sets
// `error` and gives zeros).
template <typename F>
__device__ void embedding_blocks(const u8* table, const i64* ids, float* y, i64 rows, int cols, int* error) {
  i64 id = ids[blockIdx.x];
  bool valid = id >= 0 && id < rows;
  if (!valid && threadIdx.x == 0) *error = 1;
  const u8* row = table + (valid ? id : 0) * (i64)(cols / F::ELEMS) * F::BYTES;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[(i64)blockIdx.x * cols + c] = valid ? F::value(row + (c / F::ELEMS) * F::BYTES, c % F::ELEMS) : 0.0f;
}

// Every value of `count` blocks as bf16, one thread per value.
template <typename F>
__device__ void dequant(const u8* w, bf16_bits* out, i64 count) {
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count * F::ELEMS) return;
  out[i] = f32_to_bf16(F::value(w + (i / F::ELEMS) * F::BYTES, (int)(i % F::ELEMS)));
}

extern "C" __global__ void kiln_gemv_q8_0(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q8_0, KILN_GEMV_MAX_M>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_q8_0_m1(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q8_0, 1>(g, x, m, k);
}
extern "C" __global__ void kiln_dequant_q8_0(const u8* w, bf16_bits* out, i64 blocks) { dequant<Q8_0>(w, out, blocks); }
extern "C" __global__ void kiln_embedding_q8_0(const u8* table, const i64* ids, float* y, i64 rows, int cols,
                                             int* error) {
  embedding_blocks<Q8_0>(table, ids, y, rows, cols, error);
}
extern "C" __global__ void kiln_gemv_q4_0(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q4_0, KILN_GEMV_MAX_M>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_q4_0_m1(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q4_0, 1>(g, x, m, k);
}
extern "C" __global__ void kiln_dequant_q4_0(const u8* w, bf16_bits* out, i64 blocks) { dequant<Q4_0>(w, out, blocks); }
extern "C" __global__ void kiln_embedding_q4_0(const u8* table, const i64* ids, float* y, i64 rows, int cols,
                                             int* error) {
  embedding_blocks<Q4_0>(table, ids, y, rows, cols, error);
}
extern "C" __global__ void kiln_gemv_q4_k(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q4_K, KILN_GEMV_MAX_M>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_q4_k_m1(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q4_K, 1>(g, x, m, k);
}
extern "C" __global__ void kiln_dequant_q4_k(const u8* w, bf16_bits* out, i64 blocks) { dequant<Q4_K>(w, out, blocks); }
extern "C" __global__ void kiln_embedding_q4_k(const u8* table, const i64* ids, float* y, i64 rows, int cols,
                                             int* error) {
  embedding_blocks<Q4_K>(table, ids, y, rows, cols, error);
}
extern "C" __global__ void kiln_gemv_q6_k(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q6_K, KILN_GEMV_MAX_M>(g, x, m, k);
}
extern "C" __global__ void kiln_gemv_q6_k_m1(KilnGemvGroup g, const float* x, int m, int k) {
  gemv_blocks<Q6_K, 1>(g, x, m, k);
}
extern "C" __global__ void kiln_dequant_q6_k(const u8* w, bf16_bits* out, i64 blocks) { dequant<Q6_K>(w, out, blocks); }
extern "C" __global__ void kiln_embedding_q6_k(const u8* table, const i64* ids, float* y, i64 rows, int cols,
                                             int* error) {
  embedding_blocks<Q6_K>(table, ids, y, rows, cols, error);
}
