// The decode GEMVs of Q3_K matrices (gemv.cuh) in every split, for one
// row of x and up to KILN_GEMV_MAX_M, on f32 x and on 8-bit x (`_x8`);
// the expansion of Q3_K blocks to bf16 for the GEMM of larger batches, and
// its embedding rows (gguf_low_bits.cuh has the format; f32 x and the
// expansion read it in Q3_K_Spread's order of lanes, the kernels of several
// rows of x with its loop over halves rolled: Q3_K_SpreadRows).
#include "kiln_cuda.cuh"
#include "gguf_blocks.cuh"
#include "gguf_low_bits.cuh"
#include "dense_rows.cuh"
#include "gemv.cuh"

extern "C" __global__ void kiln_gemv_q3_k(KILN_GEMV_ARGS) { gemv_blocks<Q3_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 1>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q3_k_s2(KILN_GEMV_ARGS) { gemv_blocks<Q3_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 2>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q3_k_s4(KILN_GEMV_ARGS) { gemv_blocks<Q3_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 4>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q3_k_m1(KILN_GEMV_ARGS) { gemv_blocks<Q3_K_Spread, FloatX, 1, 1>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q3_k_m1_s2(KILN_GEMV_ARGS) { gemv_blocks<Q3_K_Spread, FloatX, 1, 2>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q3_k_m1_s4(KILN_GEMV_ARGS) { gemv_blocks<Q3_K_Spread, FloatX, 1, 4>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q3_k_x8(KILN_GEMV_X8_ARGS) { gemv_blocks<Q3_K, Int8X, KILN_GEMV_MAX_M, 1>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q3_k_x8_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<Q3_K, Int8X, KILN_GEMV_MAX_M, 2>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q3_k_x8_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<Q3_K, Int8X, KILN_GEMV_MAX_M, 4>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q3_k_x8_m1(KILN_GEMV_X8_ARGS) { gemv_blocks<Q3_K, Int8X, 1, 1>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q3_k_x8_m1_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<Q3_K, Int8X, 1, 2>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q3_k_x8_m1_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<Q3_K, Int8X, 1, 4>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_dequant_q3_k(const u8* w, bf16_bits* out, i64 blocks) { dequant<Q3_K_Spread>(w, out, blocks); }
extern "C" __global__ void kiln_embedding_q3_k(const u8* table, const i64* ids, float* y, i64 rows, int cols,
                                                 int* error, KilnRowNorm norm) {
  embedding_blocks<Q3_K>(table, ids, y, rows, cols, error, norm);
}
