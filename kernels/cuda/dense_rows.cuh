// Rows of dense weights (bf16, f16 or f32) times f32 x, a warp per row
// (or `SPLIT` warps, each taking every SPLIT-th stretch of 256 columns),
// eight elements a lane and stretch (load8), a round of loads issued
// before the first is used: the decode GEMV's rows (gemv.cuh) and the
// experts' (moe.cu).
// BYTES: 2 = bf16, 3 = f16 (2 bytes each), 4 = f32. Needs kiln_cuda.cuh
// and gguf_blocks.cuh (`accumulate`) first.
#pragma once

// A lane's eight elements of a 256-column stretch of a bf16, f16 or f32
// row: four at `col` and four at `col + 128` (8-byte loads, 16-byte for
// f32), so that a warp's load of x (16 bytes a lane, four columns) reads
// 512 consecutive bytes, four lines of L1. With eight consecutive elements
// a lane (one 16-byte load of bf16) its two loads of x each touched eight
// lines, every sector half used: 16 lines of x a warp's 256 weights rather
// than 8 (at a line a cycle, Llama-3-8B's batch-1 step asked ~2.4 ms of an
// H200's L1s that way, against ~3.9 ms to read its weights).
template <int BYTES>
struct Raw8 {
  Bytes16 part[BYTES == 4 ? 2 : 1];  // bf16/f16: v[0..1] at col, v[2..3] at col + 128
};

template <int BYTES>
__device__ __forceinline__ Raw8<BYTES> load8(const u8* row, int col) {
  Raw8<BYTES> r;
  if constexpr (BYTES == 4) {
    r.part[0] = load_streaming(row + (i64)col * 4);
    r.part[1] = load_streaming(row + (i64)(col + 128) * 4);
  } else {
    unsigned long long lo = load_streaming_u64(row + (i64)col * 2);
    unsigned long long hi = load_streaming_u64(row + (i64)(col + 128) * 2);
    r.part[0] = Bytes16{{(unsigned)lo, (unsigned)(lo >> 32), (unsigned)hi, (unsigned)(hi >> 32)}};
  }
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

// COUNT loads of a lane's eight elements (load8) `step` apart from `col`
// (with BOUNDED, those at or past `end` not made), all issued before
// use_round uses the first: a memory round trip for the round, not per
// load.
template <int BYTES, int COUNT, bool BOUNDED>
__device__ __forceinline__ void load_round(Raw8<BYTES>* raw, const u8* wr, int col, int step, int end) {
#pragma unroll
  for (int u = 0; u < COUNT; ++u)
    if (!BOUNDED || col + u * step < end) raw[u] = load8<BYTES>(wr, col + u * step);
}

// A loaded round (load_round's) times the m rows of x, added to acc.
template <int BYTES, int MAX_M, int COUNT, bool BOUNDED>
__device__ __forceinline__ void use_round(const Raw8<BYTES>* raw, int col, int step, int end, const float* x, int m,
                                          int k, float* acc) {
#pragma unroll
  for (int u = 0; u < COUNT; ++u) {
    if (!BOUNDED || col + u * step < end) {
      float v[8];
      widen8<BYTES>(raw[u], v);
      accumulate<MAX_M>(acc, v, 4, x, m, k, col + u * step);
      accumulate<MAX_M>(acc, v + 4, 4, x, m, k, col + u * step + 128);
    }
  }
}

template <int BYTES, int MAX_M, int COUNT, bool BOUNDED>
__device__ __forceinline__ void dense_round(const u8* wr, int col, int step, int end, const float* x, int m,
                                            int k, float* acc) {
  Raw8<BYTES> raw[COUNT];
  load_round<BYTES, COUNT, BOUNDED>(raw, wr, col, step, end);
  use_round<BYTES, MAX_M, COUNT, BOUNDED>(raw, col, step, end, x, m, k, acc);
}

// The columns read in whole stretches of 256 (load8): rows of a multiple
// of 4 columns start at 8-byte boundaries.
__device__ __forceinline__ int dense_vector_end(int k) { return k % 4 == 0 ? k / 256 * 256 : 0; }

// Loads of the weights a lane has in flight before it uses the first: the
// one-row kernels have the registers for more.
template <int MAX_M>
__device__ __forceinline__ constexpr int dense_depth() {
  return MAX_M == 1 ? 8 : 4;
}

// A lane's part of row `wr [k]` (part `part` of SPLIT) times the m rows of
// x [m, k]: whole rounds over stretches of 256 columns, then what is left
// as one bounded round (one warp per row took it a load at a time: a
// Qwen2.5-1.5B row of 1,536 columns, 6 stretches, was 6 memory round trips,
// one a stretch), then the columns past the last whole stretch (all of them
// when a row's columns are not a multiple of 4) one at a time. The first
// round is loaded when the row is made, so that a kernel launched as a
// programmatic dependent has it in registers before it waits for its inputs
// (weights are never written by the kernels before it): a whole row of up
// to 2,048 columns a warp (Llama-3.2-1B's) by then, where the round asked
// for in L2 (prefetch_l2) still took an L2 round trip after the wait. The
// next round is asked for in L2 (`prefetch_next`).
template <int BYTES, int MAX_M, int SPLIT>
struct DenseRow {
  static const int DEPTH = dense_depth<MAX_M>();
  static const int STEP = 256 * SPLIT;  // columns the row's warps cover per load
  const u8* wr;                         // null: no row (nothing loaded)
  int part, col, vector_end;
  Raw8<BYTES> first[DEPTH];

  __device__ DenseRow(const u8* wr, int part, int k)
      : wr(wr), part(part), col(part * 256 + (int)(threadIdx.x % 32) * 4), vector_end(dense_vector_end(k)) {
    if (wr) load_round<BYTES, DEPTH, true>(first, wr, col, STEP, vector_end);
  }

  // The round after the first toward L2.
  __device__ void prefetch_next() const {
    const int size = BYTES == 4 ? 4 : 2;
    for (int u = 0, c = col + DEPTH * STEP; wr && u < DEPTH && c < vector_end; ++u, c += STEP) {
      prefetch_l2(wr + (i64)c * size);
      prefetch_l2(wr + (i64)(c + 128) * size);
    }
  }

  // The row times x, added to acc (nothing for no row).
  __device__ void multiply(const float* x, int m, int k, float* acc) const {
    if (!wr) return;
    use_round<BYTES, MAX_M, DEPTH, true>(first, col, STEP, vector_end, x, m, k, acc);
    int c = col + DEPTH * STEP;
    for (; c + (DEPTH - 1) * STEP < vector_end; c += DEPTH * STEP)
      dense_round<BYTES, MAX_M, DEPTH, false>(wr, c, STEP, vector_end, x, m, k, acc);
    if (c < vector_end) dense_round<BYTES, MAX_M, DEPTH - 1, true>(wr, c, STEP, vector_end, x, m, k, acc);
    int lane = threadIdx.x % 32;
    for (int t = vector_end + part * 32 + lane; t < k; t += 32 * SPLIT) {
      float v = load1<BYTES>(wr, t);
      accumulate<MAX_M>(acc, &v, 1, x, m, k, t);
    }
  }
};

template <int BYTES, int MAX_M, int SPLIT>
__device__ __forceinline__ void dense_row(const u8* wr, int part, const float* x, int m, int k, float* acc) {
  DenseRow<BYTES, MAX_M, SPLIT>(wr, part, k).multiply(x, m, k, acc);
}
