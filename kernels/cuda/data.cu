// Data movement shared by every model: embedding rows, row gathers, strided
// copies (permute, slice, broadcast, concat), type conversions and the
// split of a stacked product's output.
#include "kiln_cuda.cuh"

#define KILN_MAX_RANK 8

// A strided view: element i of the output (row-major over `shape`) reads
// input element in_offset + Σ index_d · in_stride[d] and writes output
// element out_offset + Σ index_d · out_stride[d].
struct KilnStrided {
  int rank;
  i64 shape[KILN_MAX_RANK];
  i64 in_stride[KILN_MAX_RANK];
  i64 out_stride[KILN_MAX_RANK];
  i64 in_offset;
  i64 out_offset;
  i64 count;
};

__device__ __forceinline__ void strided_offsets(const KilnStrided& s, i64 i, i64* in, i64* out) {
  i64 a = s.in_offset, b = s.out_offset;
  for (int d = s.rank - 1; d >= 0; --d) {
    i64 index = i % s.shape[d];
    i /= s.shape[d];
    a += index * s.in_stride[d];
    b += index * s.out_stride[d];
  }
  *in = a;
  *out = b;
}

template <typename T>
__device__ __forceinline__ void copy_strided(const T* __restrict__ x, T* __restrict__ y, const KilnStrided& s) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < s.count; i += (i64)gridDim.x * blockDim.x) {
    i64 a, b;
    strided_offsets(s, i, &a, &b);
    y[b] = x[a];
  }
}

// Strided copies of 4-, 8- and 1-byte elements.
extern "C" __global__ void kiln_copy_strided_b4(const unsigned int* __restrict__ x, unsigned int* __restrict__ y,
                                                KilnStrided s) {
  copy_strided(x, y, s);
}

extern "C" __global__ void kiln_copy_strided_b8(const i64* __restrict__ x, i64* __restrict__ y, KilnStrided s) {
  copy_strided(x, y, s);
}

extern "C" __global__ void kiln_copy_strided_b1(const unsigned char* __restrict__ x, unsigned char* __restrict__ y,
                                                KilnStrided s) {
  copy_strided(x, y, s);
}

// out[o, i, r] = x[o, ids[i], r] for x [outer, axis_len, inner]; an index
// outside the axis writes zeros and sets *error to 1.
template <typename T>
__device__ __forceinline__ void gather(const T* __restrict__ x, const i64* __restrict__ ids, T* __restrict__ y,
                                       i64 outer, i64 count, i64 axis_len, i64 inner, int* __restrict__ error) {
  i64 total = outer * count * inner;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
    i64 r = e % inner, i = (e / inner) % count, o = e / (inner * count);
    i64 id = ids[i];
    if (id < 0) id += axis_len;
    if (id < 0 || id >= axis_len) {
      y[e] = 0;
      *error = 1;
    } else {
      y[e] = x[(o * axis_len + id) * inner + r];
    }
  }
}

// Gathers of 4-, 8- and 1-byte elements.
extern "C" __global__ void kiln_gather_b4(const unsigned int* __restrict__ x, const i64* __restrict__ ids,
                                          unsigned int* __restrict__ y, i64 outer, i64 count, i64 axis_len,
                                          i64 inner, int* __restrict__ error) {
  gather(x, ids, y, outer, count, axis_len, inner, error);
}

extern "C" __global__ void kiln_gather_b8(const i64* __restrict__ x, const i64* __restrict__ ids, i64* __restrict__ y,
                                          i64 outer, i64 count, i64 axis_len, i64 inner, int* __restrict__ error) {
  gather(x, ids, y, outer, count, axis_len, inner, error);
}

extern "C" __global__ void kiln_gather_b1(const unsigned char* __restrict__ x, const i64* __restrict__ ids,
                                          unsigned char* __restrict__ y, i64 outer, i64 count, i64 axis_len,
                                          i64 inner, int* __restrict__ error) {
  gather(x, ids, y, outer, count, axis_len, inner, error);
}

// Embedding rows of a [rows, cols] table (f32, bf16 or f16) into f32: one
// block per id; an id outside the table writes zeros and sets *error to 1.
// `norm`: the RMS norm that reads the rows, taken with them (or none).
template <typename T, float (*convert)(T)>
__device__ __forceinline__ void embedding(const T* __restrict__ table, const i64* __restrict__ ids,
                                          float* __restrict__ y, i64 rows, int cols, int* __restrict__ error,
                                          const KilnRowNorm& norm) {
  i64 id = ids[blockIdx.x];
  bool valid = id >= 0 && id < rows;
  if (!valid && threadIdx.x == 0) *error = 1;
  const T* row = table + (valid ? id : 0) * cols;
  write_row_normed(y, blockIdx.x, cols, [&](int c) { return valid ? convert(row[c]) : 0.0f; }, norm);
}

__device__ __forceinline__ float f32_identity(float v) { return v; }

#define KILN_EMBEDDING_ARGS(T) \
  const T *__restrict__ table, const i64 *__restrict__ ids, float *__restrict__ y, i64 rows, int cols, \
      int *__restrict__ error, KilnRowNorm norm
extern "C" __global__ void kiln_embedding_f32(KILN_EMBEDDING_ARGS(float)) {
  embedding<float, f32_identity>(table, ids, y, rows, cols, error, norm);
}
extern "C" __global__ void kiln_embedding_bf16(KILN_EMBEDDING_ARGS(bf16_bits)) {
  embedding<bf16_bits, bf16_to_f32>(table, ids, y, rows, cols, error, norm);
}
extern "C" __global__ void kiln_embedding_f16(KILN_EMBEDDING_ARGS(f16_bits)) {
  embedding<f16_bits, f16_to_f32>(table, ids, y, rows, cols, error, norm);
}

// f32 → bf16 / f16 (activations for a half-precision weight product), and
// back.
extern "C" __global__ void kiln_f32_to_bf16(const float* __restrict__ x, bf16_bits* __restrict__ y, i64 n) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    y[i] = f32_to_bf16(x[i]);
}

extern "C" __global__ void kiln_f32_to_f16(const float* __restrict__ x, f16_bits* __restrict__ y, i64 n) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    y[i] = f32_to_f16(x[i]);
}

extern "C" __global__ void kiln_bf16_to_f32(const bf16_bits* __restrict__ x, float* __restrict__ y, i64 n) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    y[i] = bf16_to_f32(x[i]);
}

extern "C" __global__ void kiln_f16_to_f32(const f16_bits* __restrict__ x, float* __restrict__ y, i64 n) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    y[i] = f16_to_f32(x[i]);
}

// act(gate) · up of a gated MLP from its stacked product (gate and up stored
// one after another and multiplied by one GEMM, host/src/runtime/cuda/
// products.rs, activates_after_stack): row r of y [rows, 2·n] (elements of
// `in_type`, KILN_OUT_*) holds gate's n values from `gate_at` and up's from
// `up_at`; out [rows, n] holds elements of `out_type`. Four values a thread
// (`quads` = rows · n / 4 < 2^31, 32-bit divisions; n a multiple of 4), each
// input one 8-byte (half) or 16-byte (f32) load, both issued before either
// is used.
extern "C" __global__ void kiln_gated_rows(const float* __restrict__ y, float* __restrict__ out, int quads, int n,
                                           int gate_at, int up_at, int activation, int in_type, int out_type) {
  const unsigned row_quads = (unsigned)n / 4;
  for (unsigned q = blockIdx.x * blockDim.x + threadIdx.x; q < (unsigned)quads; q += gridDim.x * blockDim.x) {
    const i64 row = q / row_quads;
    const int c = (int)(q % row_quads) * 4;
    float gate[4], up[4], value[4];
    load4_as(y, row * 2 * n + gate_at + c, in_type, gate);
    load4_as(y, row * 2 * n + up_at + c, in_type, up);
#pragma unroll
    for (int j = 0; j < 4; ++j) value[j] = kiln_gated(activation, gate[j], up[j]);
    store4_as(out, row * n + c, value, out_type);
  }
}

// A stacked product's output x [rows, cols] (matrices that share x stored
// one after another and multiplied by one GEMM, host/src/runtime/cuda/
// stacked.rs) to its members' outputs: member p takes the 16-byte units
// starts[p] .. starts[p + 1] - 1 of each row into out[p] (widths in 16-byte
// units: the host stacks only members whose outputs' rows are whole units).
#define KILN_STACK_MAX 4
struct KilnColumnSplit {
  i64 count;
  i64 starts[KILN_STACK_MAX + 1];
  Bytes16* out[KILN_STACK_MAX];
};

// A block row per row of x (gridDim.y), its threads striding over the row.
extern "C" __global__ void kiln_split_columns(const Bytes16* __restrict__ x, KilnColumnSplit s) {
  i64 row = blockIdx.y, width = 0;
  // Constant indices into the argument (a computed one would copy it to
  // local memory).
#pragma unroll
  for (int p = 0; p < KILN_STACK_MAX; ++p)
    if (p < s.count) width = s.starts[p + 1];
  for (int unit = blockIdx.x * blockDim.x + threadIdx.x; unit < width; unit += gridDim.x * blockDim.x) {
    Bytes16 v = x[row * width + unit];
#pragma unroll
    for (int p = 0; p < KILN_STACK_MAX; ++p) {
      if (p < s.count && unit >= s.starts[p] && unit < s.starts[p + 1])
        s.out[p][row * (s.starts[p + 1] - s.starts[p]) + unit - s.starts[p]] = v;
    }
  }
}
