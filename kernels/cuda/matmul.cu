// Products of two activations, batched over the leading axes: attention
// written as matrix products in a graph, multi-head latent attention's
// per-head up-projections. f32; shared-memory tiles of 16 × 16.
#include "kiln_cuda.cuh"

#define KILN_MM_TILE 16

// c[z] = a[z] · b[z] for z < gridDim.z: a [m, k], b [k, n], c [m, n] per
// batch, row-major; a batch stride of 0 repeats one operand for every batch.
// Grid (ceil(n / 16), ceil(m / 16), batch), block (16, 16).
extern "C" __global__ void kiln_batched_matmul(const float* __restrict__ a, const float* __restrict__ b,
                                               float* __restrict__ c, int m, int n, int k, i64 a_batch_stride,
                                               i64 b_batch_stride) {
  __shared__ float a_tile[KILN_MM_TILE][KILN_MM_TILE];
  __shared__ float b_tile[KILN_MM_TILE][KILN_MM_TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int row = blockIdx.y * KILN_MM_TILE + ty;
  const int col = blockIdx.x * KILN_MM_TILE + tx;
  const float* a_batch = a + (i64)blockIdx.z * a_batch_stride;
  const float* b_batch = b + (i64)blockIdx.z * b_batch_stride;
  float acc = 0.0f;
  for (int t = 0; t < k; t += KILN_MM_TILE) {
    a_tile[ty][tx] = (row < m && t + tx < k) ? a_batch[(i64)row * k + t + tx] : 0.0f;
    b_tile[ty][tx] = (col < n && t + ty < k) ? b_batch[(i64)(t + ty) * n + col] : 0.0f;
    __syncthreads();
    for (int i = 0; i < KILN_MM_TILE; ++i) acc += a_tile[ty][i] * b_tile[i][tx];
    __syncthreads();
  }
  if (row < m && col < n) c[(i64)blockIdx.z * m * n + (i64)row * n + col] = acc;
}
