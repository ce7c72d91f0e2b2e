// Row normalizations: one block per row of `cols` values.
#include "kiln_cuda.cuh"

// The rows a block of a norm reads (`from`) and writes (`to`): its own, or
// for the last layer's norm the row of the token whose logits are asked for
// (`gathered`); a row outside the input writes zeros (and sets the error
// flag).
struct NormRows {
  i64 from, to;
  bool valid;
  __device__ static NormRows same() { return {(i64)blockIdx.x, (i64)blockIdx.x, true}; }
  // Row ids [blockIdx.x] of `rows` (negative: from the end).
  __device__ static NormRows gathered(const i64* __restrict__ ids, i64 rows, int* __restrict__ error) {
    i64 id = ids[blockIdx.x];
    if (id < 0) id += rows;
    const bool valid = id >= 0 && id < rows;
    if (!valid && threadIdx.x == 0) *error = 1;
    return {valid ? id : 0, (i64)blockIdx.x, valid};
  }
};

// The RMS norm a product's output takes before it joins the residual stream
// (Gemma 2's and 3's post-norms): p · s · (offset + w), s = 1 / sqrt(mean(p²)
// + eps). None where w is null.
struct PostNorm {
  const float* w;
  float eps, offset;
};

// y = x / sqrt(mean(x²) + eps) * (offset + w); offset is 1 for Gemma's (1 + w).
// y is stored as `out_type` says (store_as: f32, or the half type of the
// products that read it).
extern "C" __global__ void kiln_rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                         float* __restrict__ y, int cols, float eps, float offset,
                                         int out_type) {
  kiln_wait_inputs();
  __shared__ float scratch[32];
  const float* row = x + (i64)blockIdx.x * cols;
  i64 base = (i64)blockIdx.x * cols;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) sum += row[i] * row[i];
  sum = block_sum(sum, scratch);
  float inv = inverse_root_mean(sum, cols, eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) store_as(y, base + i, row[i] * inv * (offset + w[i]), out_type);
}

// x = a + b (the residual stream, written) and y = rms_norm(x) · (offset + w)
// in one pass: a residual add fused into the norm that reads it (y stored
// as `out_type` says). Rows `rows.from` of a, b and x, `rows.to` of y; x
// may be null (not written: a + b is read again for y). With a `post` norm,
// a is normalized by it first: x = post(a) + b.
__device__ void add_rms_norm_loop(const float* __restrict__ a, const float* __restrict__ b,
                                  const float* __restrict__ w, float* __restrict__ x, float* __restrict__ y,
                                  int cols, float eps, float offset, int out_type, NormRows rows,
                                  PostNorm post = {}) {
  __shared__ float scratch[32];
  const i64 from = rows.from * cols;
  float post_scale = 1.0f;
  if (post.w) {
    float squares = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) squares += a[from + i] * a[from + i];
    post_scale = inverse_root_mean(block_sum(squares, scratch), cols, post.eps);
  }
  auto sum_at = [&](int i) {
    return (post.w ? a[from + i] * post_scale * (post.offset + post.w[i]) : a[from + i]) + b[from + i];
  };
  float sum = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    float v = sum_at(i);
    if (x) x[from + i] = v;
    sum += v * v;
  }
  sum = block_sum(sum, scratch);
  const float inv = rows.valid ? inverse_root_mean(sum, cols, eps) : 0.0f;
  for_each_batched<FloatPair>(
      cols, [&](int i) { return FloatPair{x ? x[from + i] : sum_at(i), w[i]}; },
      [&](int i, FloatPair v) { store_as(y, rows.to * cols + i, v.x * inv * (offset + v.y), out_type); });
}

extern "C" __global__ void kiln_add_rms_norm(const float* __restrict__ a, const float* __restrict__ b,
                                             const float* __restrict__ w, float* __restrict__ x,
                                             float* __restrict__ y, int cols, float eps, float offset,
                                             int out_type) {
  kiln_wait_inputs();
  add_rms_norm_loop(a, b, w, x, y, cols, eps, offset, out_type, NormRows::same());
}

// The same two norms for rows of at most 8 · blockDim.x values, a multiple
// of 4, 16-byte aligned: each thread loads its two 16-byte chunks of the
// row (and of the weight) at once and keeps them in registers, so a row
// costs one memory round trip before its reduction instead of one per
// iteration of a loop over the row, read twice (the loop kernels above
// take ~8 µs for a decode step's single row of 2048 on an H200).
#define KILN_NORM_CHUNKS 2

template <bool ADD, bool POST = false>
__device__ void rms_norm_chunks(const float* __restrict__ a, const float* __restrict__ b,
                                const float* __restrict__ w, float* __restrict__ x, float* __restrict__ y,
                                int cols, float eps, float offset, int out_type, NormRows rows,
                                PostNorm post = {}) {
  __shared__ float scratch[32];
  const i64 from = rows.from * cols;
  int quads = cols / 4;
  Bytes16 v[KILN_NORM_CHUNKS], scale[KILN_NORM_CHUNKS], other[KILN_NORM_CHUNKS], post_w[KILN_NORM_CHUNKS];
  float sum = 0.0f;
#pragma unroll
  for (int c = 0; c < KILN_NORM_CHUNKS; ++c) {
    int q = threadIdx.x + c * blockDim.x;
    if (q < quads) {
      v[c] = *reinterpret_cast<const Bytes16*>(a + from + 4 * q);
      scale[c] = *reinterpret_cast<const Bytes16*>(w + 4 * q);
      if (ADD) other[c] = *reinterpret_cast<const Bytes16*>(b + from + 4 * q);
      if (POST) post_w[c] = *reinterpret_cast<const Bytes16*>(post.w + 4 * q);
    }
  }
  if (POST) {
    float squares = 0.0f;
#pragma unroll
    for (int c = 0; c < KILN_NORM_CHUNKS; ++c)
      if (threadIdx.x + c * blockDim.x < quads)
        for (int j = 0; j < 4; ++j) squares += __uint_as_float(v[c].v[j]) * __uint_as_float(v[c].v[j]);
    const float post_scale = inverse_root_mean(block_sum(squares, scratch), cols, post.eps);
#pragma unroll
    for (int c = 0; c < KILN_NORM_CHUNKS; ++c)
      if (threadIdx.x + c * blockDim.x < quads)
        for (int j = 0; j < 4; ++j)
          v[c].v[j] = __float_as_uint(__uint_as_float(v[c].v[j]) * post_scale *
                                      (post.offset + __uint_as_float(post_w[c].v[j])));
  }
#pragma unroll
  for (int c = 0; c < KILN_NORM_CHUNKS; ++c) {
    int q = threadIdx.x + c * blockDim.x;
    if (q < quads) {
      if (ADD)
        for (int j = 0; j < 4; ++j)
          v[c].v[j] = __float_as_uint(__uint_as_float(v[c].v[j]) + __uint_as_float(other[c].v[j]));
      if (x) *reinterpret_cast<Bytes16*>(x + from + 4 * q) = v[c];
      for (int j = 0; j < 4; ++j) sum += __uint_as_float(v[c].v[j]) * __uint_as_float(v[c].v[j]);
    }
  }
  sum = block_sum(sum, scratch);
  float inv = rows.valid ? inverse_root_mean(sum, cols, eps) : 0.0f;
#pragma unroll
  for (int c = 0; c < KILN_NORM_CHUNKS; ++c) {
    int q = threadIdx.x + c * blockDim.x;
    if (q < quads) {
      float out[4];
      for (int j = 0; j < 4; ++j)
        out[j] = __uint_as_float(v[c].v[j]) * inv * (offset + __uint_as_float(scale[c].v[j]));
      store4_as(y, rows.to * cols + 4 * q, out, out_type);
    }
  }
}

extern "C" __global__ void __launch_bounds__(KILN_MAX_THREADS, 1) kiln_rms_norm_chunks(const float* __restrict__ x, const float* __restrict__ w,
                                                float* __restrict__ y, int cols, float eps, float offset,
                                                int out_type) {
  kiln_wait_inputs();
  rms_norm_chunks<false>(x, nullptr, w, nullptr, y, cols, eps, offset, out_type, NormRows::same());
}
extern "C" __global__ void __launch_bounds__(KILN_MAX_THREADS, 1) kiln_add_rms_norm_chunks(const float* __restrict__ a, const float* __restrict__ b,
                                                    const float* __restrict__ w, float* __restrict__ x,
                                                    float* __restrict__ y, int cols, float eps, float offset,
                                                    int out_type) {
  kiln_wait_inputs();
  rms_norm_chunks<true>(a, b, w, x, y, cols, eps, offset, out_type, NormRows::same());
}

// The last layer's add and norm, and the gather of the rows whose logits
// are asked for after it, in one launch: y [i] = rms_norm(a + b) [ids [i]] ·
// (offset + w), a block a row of y; the sum is not written (only the norm
// reads it). A row outside a's `rows` writes zeros and sets *error to 1.
extern "C" __global__ void kiln_add_rms_norm_rows(const float* __restrict__ a, const float* __restrict__ b,
                                                  const float* __restrict__ w, const i64* __restrict__ ids, i64 rows,
                                                  float* __restrict__ y, int cols, float eps, float offset,
                                                  int out_type, int* __restrict__ error) {
  kiln_wait_inputs();
  add_rms_norm_loop(a, b, w, nullptr, y, cols, eps, offset, out_type, NormRows::gathered(ids, rows, error));
}
extern "C" __global__ void __launch_bounds__(KILN_MAX_THREADS, 1)
    kiln_add_rms_norm_rows_chunks(const float* __restrict__ a, const float* __restrict__ b,
                                  const float* __restrict__ w, const i64* __restrict__ ids, i64 rows,
                                  float* __restrict__ y, int cols, float eps, float offset, int out_type,
                                  int* __restrict__ error) {
  kiln_wait_inputs();
  rms_norm_chunks<true>(a, b, w, nullptr, y, cols, eps, offset, out_type, NormRows::gathered(ids, rows, error));
}

// x = post(p) + r (written) and y = rms_norm(x) · (offset + w): a product's
// post-norm, the residual add after it and the norm after that (Gemma 2's
// and 3's sandwich norms) in one launch, post(p) not written (only the add
// reads it).
#define KILN_NORM_ADD_NORM_PARAMS                                                                          \
  const float *__restrict__ p, const float *__restrict__ r, const float *__restrict__ post_w, float post_eps, \
      float post_offset, const float *__restrict__ w, float *__restrict__ x, float *__restrict__ y, int cols,  \
      float eps, float offset, int out_type
extern "C" __global__ void kiln_norm_add_rms_norm(KILN_NORM_ADD_NORM_PARAMS) {
  kiln_wait_inputs();
  add_rms_norm_loop(p, r, w, x, y, cols, eps, offset, out_type, NormRows::same(), {post_w, post_eps, post_offset});
}
extern "C" __global__ void __launch_bounds__(KILN_MAX_THREADS, 1) kiln_norm_add_rms_norm_chunks(KILN_NORM_ADD_NORM_PARAMS) {
  kiln_wait_inputs();
  rms_norm_chunks<true, true>(p, r, w, x, y, cols, eps, offset, out_type, NormRows::same(),
                              {post_w, post_eps, post_offset});
}

// y = (x - mean) / sqrt(var + eps) * gamma + beta.
extern "C" __global__ void kiln_layer_norm(const float* __restrict__ x, const float* __restrict__ gamma,
                                           const float* __restrict__ beta, float* __restrict__ y,
                                           int cols, float eps) {
  kiln_wait_inputs();
  __shared__ float scratch[32];
  const float* row = x + (i64)blockIdx.x * cols;
  float* out = y + (i64)blockIdx.x * cols;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) sum += row[i];
  float mean = block_sum(sum, scratch) / (float)cols;
  float sq = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) sq += (row[i] - mean) * (row[i] - mean);
  float inv = inverse_root_mean(block_sum(sq, scratch), cols, eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x) out[i] = (row[i] - mean) * inv * gamma[i] + beta[i];
}

// Softmax (or log-softmax when `log`) along an axis of `cols` elements with
// `inner` elements after it: one block per (outer, inner) position; element j
// of block r is at (r / inner) · cols · inner + r % inner + j · inner.
extern "C" __global__ void kiln_softmax(const float* __restrict__ x, float* __restrict__ y, int cols, int inner,
                                        int log) {
  kiln_wait_inputs();
  __shared__ float scratch[32];
  const i64 r = blockIdx.x;
  const i64 base = (r / inner) * cols * inner + r % inner;
  const float* row = x + base;
  float* out = y + base;
  float m = KILN_NEG_INF;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, row[(i64)i * inner]);
  m = block_max(m, scratch);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) sum += expf(row[(i64)i * inner] - m);
  sum = block_sum(sum, scratch);
  if (log) {
    float log_sum = logf(sum);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[(i64)i * inner] = (row[(i64)i * inner] - m) - log_sum;
  } else {
    float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) out[(i64)i * inner] = expf(row[(i64)i * inner] - m) * inv;
  }
}
