// The decode GEMVs of groups of Q2_K matrices whose last matrix is Q3_K or
// Q4_K (gemv.cuh, `gemv_blocks`' LAST): the v that llama.cpp's Q2_K files
// keep at more bits than q and k, so that q, k and v still take one launch.
// In every split, for one row of x and up to KILN_GEMV_MAX_M, on f32 x and
// on 8-bit x (`_x8`).
#include "kiln_cuda.cuh"
#include "gguf_blocks.cuh"
#include "gguf_low_bits.cuh"
#include "dense_rows.cuh"
#include "gemv.cuh"

extern "C" __global__ void kiln_gemv_q2_k_q3_k(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 1, Q3_K_SpreadRows>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_s2(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 2, Q3_K_SpreadRows>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_s4(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 4, Q3_K_SpreadRows>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_m1(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_Spread, FloatX, 1, 1, Q3_K_Spread>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_m1_s2(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_Spread, FloatX, 1, 2, Q3_K_Spread>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_m1_s4(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_Spread, FloatX, 1, 4, Q3_K_Spread>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_x8(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, KILN_GEMV_MAX_M, 1, Q3_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_x8_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, KILN_GEMV_MAX_M, 2, Q3_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_x8_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, KILN_GEMV_MAX_M, 4, Q3_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_x8_m1(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, 1, 1, Q3_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_x8_m1_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, 1, 2, Q3_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q3_k_x8_m1_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, 1, 4, Q3_K>(g, Int8X(x, m, k), m, k); }

extern "C" __global__ void kiln_gemv_q2_k_q4_k(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 1, Q4_K_SpreadRows>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_s2(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 2, Q4_K_SpreadRows>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_s4(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_SpreadRows, FloatX, KILN_GEMV_MAX_M, 4, Q4_K_SpreadRows>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_m1(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_Spread, FloatX, 1, 1, Q4_K_Spread>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_m1_s2(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_Spread, FloatX, 1, 2, Q4_K_Spread>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_m1_s4(KILN_GEMV_ARGS) { gemv_blocks<Q2_K_Spread, FloatX, 1, 4, Q4_K_Spread>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_x8(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, KILN_GEMV_MAX_M, 1, Q4_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_x8_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, KILN_GEMV_MAX_M, 2, Q4_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_x8_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, KILN_GEMV_MAX_M, 4, Q4_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_x8_m1(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, 1, 1, Q4_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_x8_m1_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, 1, 2, Q4_K>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_q2_k_q4_k_x8_m1_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<Q2_K, Int8X, 1, 4, Q4_K>(g, Int8X(x, m, k), m, k); }
