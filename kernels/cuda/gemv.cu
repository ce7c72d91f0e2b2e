// The decode GEMVs of dense rows (bf16, f16, f32; gemv.cuh) in every
// split, for one row of x and up to KILN_GEMV_MAX_M, and the quantization
// of x to 8 bits for the GGUF formats' `_x8` GEMVs (gemv_<format>.cu).
#include "kiln_cuda.cuh"
#include "gguf_blocks.cuh"
#include "dense_rows.cuh"
#include "gemv.cuh"

// Entry points call the templates with the format's bytes and then the
// rows of x and the split (`kiln_gemv_<format>[_m1][_s2|_s4]`).
extern "C" __global__ void kiln_gemv_bf16(KILN_GEMV_ARGS) { gemv_dense<2, KILN_GEMV_MAX_M, 1>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_bf16_s2(KILN_GEMV_ARGS) { gemv_dense<2, KILN_GEMV_MAX_M, 2>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_bf16_s4(KILN_GEMV_ARGS) { gemv_dense<2, KILN_GEMV_MAX_M, 4>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_bf16_m1(KILN_GEMV_ARGS) { gemv_dense<2, 1, 1>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_bf16_m1_s2(KILN_GEMV_ARGS) { gemv_dense<2, 1, 2>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_bf16_m1_s4(KILN_GEMV_ARGS) { gemv_dense<2, 1, 4>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f16(KILN_GEMV_ARGS) { gemv_dense<3, KILN_GEMV_MAX_M, 1>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f16_s2(KILN_GEMV_ARGS) { gemv_dense<3, KILN_GEMV_MAX_M, 2>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f16_s4(KILN_GEMV_ARGS) { gemv_dense<3, KILN_GEMV_MAX_M, 4>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f16_m1(KILN_GEMV_ARGS) { gemv_dense<3, 1, 1>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f16_m1_s2(KILN_GEMV_ARGS) { gemv_dense<3, 1, 2>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f16_m1_s4(KILN_GEMV_ARGS) { gemv_dense<3, 1, 4>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f32(KILN_GEMV_ARGS) { gemv_dense<4, KILN_GEMV_MAX_M, 1>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f32_s2(KILN_GEMV_ARGS) { gemv_dense<4, KILN_GEMV_MAX_M, 2>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f32_s4(KILN_GEMV_ARGS) { gemv_dense<4, KILN_GEMV_MAX_M, 4>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f32_m1(KILN_GEMV_ARGS) { gemv_dense<4, 1, 1>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f32_m1_s2(KILN_GEMV_ARGS) { gemv_dense<4, 1, 2>(g, x, m, k); }
extern "C" __global__ void kiln_gemv_f32_m1_s4(KILN_GEMV_ARGS) { gemv_dense<4, 1, 4>(g, x, m, k); }

// x [rows, k] f32 (k a multiple of 32; `blocks` = rows·k / 32) as 8-bit
// blocks for the `_x8` GEMVs (Int8X's layout): d = max|x| / 127 and each
// quant x / d rounded to nearest even, as the CPU's fast products quantize
// (kernels/src/quant/act.rs). A warp per block of 32, striding over the
// grid.
extern "C" __global__ void kiln_quantize_x8(const float* x, u8* out, i64 blocks) {
  kiln_wait_inputs();
  int lane = threadIdx.x % 32;
  i64 warps = (i64)gridDim.x * (blockDim.x / 32);
  X8Scale* scales = reinterpret_cast<X8Scale*>(out + blocks * 32);
  for (i64 b = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; b < blocks; b += warps) {
    float v = x[b * 32 + lane];
    float d = warp_reduce(fabsf(v), MaxOp()) / 127.0f;
    float q = rintf(v * (d != 0.0f ? 1.0f / d : 0.0f));
    reinterpret_cast<signed char*>(out)[b * 32 + lane] = (signed char)(int)q;
    float sum = warp_sum(q);  // integers below 2^12: exact in any order
    if (lane == 0) scales[b] = X8Scale{d, d * sum};
  }
}
