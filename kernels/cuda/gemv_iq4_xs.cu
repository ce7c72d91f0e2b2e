// The decode GEMVs of IQ4_XS matrices (gemv.cuh) in every split, for one
// row of x and up to KILN_GEMV_MAX_M, on f32 x and on 8-bit x (`_x8`);
// the expansion of IQ4_XS blocks to bf16 for the GEMM of larger batches, and
// its embedding rows (gguf_blocks.cuh has the format; f32 x and the
// expansion read it in IQ4_XS_Spread's order of lanes).
#include "kiln_cuda.cuh"
#include "gguf_blocks.cuh"
#include "dense_rows.cuh"
#include "gemv.cuh"

extern "C" __global__ void kiln_gemv_iq4_xs(KILN_GEMV_ARGS) { gemv_blocks<IQ4_XS_Spread, FloatX, KILN_GEMV_MAX_M, 1>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_s2(KILN_GEMV_ARGS) { gemv_blocks<IQ4_XS_Spread, FloatX, KILN_GEMV_MAX_M, 2>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_s4(KILN_GEMV_ARGS) { gemv_blocks<IQ4_XS_Spread, FloatX, KILN_GEMV_MAX_M, 4>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_m1(KILN_GEMV_ARGS) { gemv_blocks<IQ4_XS_Spread, FloatX, 1, 1>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_m1_s2(KILN_GEMV_ARGS) { gemv_blocks<IQ4_XS_Spread, FloatX, 1, 2>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_m1_s4(KILN_GEMV_ARGS) { gemv_blocks<IQ4_XS_Spread, FloatX, 1, 4>(g, FloatX{x}, m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_x8(KILN_GEMV_X8_ARGS) { gemv_blocks<IQ4_XS, Int8X, KILN_GEMV_MAX_M, 1>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_x8_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<IQ4_XS, Int8X, KILN_GEMV_MAX_M, 2>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_x8_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<IQ4_XS, Int8X, KILN_GEMV_MAX_M, 4>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_x8_m1(KILN_GEMV_X8_ARGS) { gemv_blocks<IQ4_XS, Int8X, 1, 1>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_x8_m1_s2(KILN_GEMV_X8_ARGS) { gemv_blocks<IQ4_XS, Int8X, 1, 2>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_gemv_iq4_xs_x8_m1_s4(KILN_GEMV_X8_ARGS) { gemv_blocks<IQ4_XS, Int8X, 1, 4>(g, Int8X(x, m, k), m, k); }
extern "C" __global__ void kiln_dequant_iq4_xs(const u8* w, bf16_bits* out, i64 blocks) { dequant<IQ4_XS_Spread>(w, out, blocks); }
extern "C" __global__ void kiln_embedding_iq4_xs(const u8* table, const i64* ids, float* y, i64 rows, int cols,
                                                 int* error, KilnRowNorm norm) {
  embedding_blocks<IQ4_XS>(table, ids, y, rows, cols, error, norm);
}
