// Mixture of experts: routing, then each token's picked experts only.
//
//   kiln_moe_route      one block per token: router logits [T, E] to the
//                       picked experts [T, K] (i32) and their weights [T, K]
//                       (f32), as kernels/src/dense/moe.rs computes them
//                       (softmax top-k, or sigmoid scores picked with a
//                       correction bias within the best groups).
//   kiln_moe_gate_up_*  one warp per (token, pick, row of I): reads row r of
//                       the picked expert's gate and up matrices, writes
//                       h[t·K + j, r] = act(gate · x_t) · (up · x_t).
//   kiln_moe_down_*     one warp per (token, row of hidden): the sum over
//                       the token's picks of weight · (down_e · h[t·K + j]).
//
// Expert matrices are found through tables of device addresses indexed by
// expert (uploaded once at load), so nothing here waits for the host and the
// launches replay in a CUDA graph. The matrices are bf16, f16 or f32 rows,
// or GGUF blocks read packed (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS:
// gguf_blocks.cuh;
// Q2_K, Q3_K: gguf_low_bits.cuh); the
// gate and up matrices share one format, the down matrices may have another.
#include "kiln_cuda.cuh"
#include "gguf_blocks.cuh"
#include "gguf_low_bits.cuh"
#include "dense_rows.cuh"

#define KILN_MOE_MAX_EXPERTS 512
#define KILN_MOE_MAX_GROUPS 64
#define KILN_MOE_WARPS 4

// The index of the largest `v[i]` not `taken` (the first on ties).
__device__ __forceinline__ int moe_best(const float* v, const unsigned char* taken, int n) {
  int pick = -1;
  for (int i = 0; i < n; ++i)
    if (!taken[i] && (pick < 0 || v[i] > v[pick])) pick = i;
  return pick;
}

// scoring: 0 softmax, 1 sigmoid. `bias` may be null.
extern "C" __global__ void kiln_moe_route(const float* logits, const float* bias, int* experts,
                                          float* weights, int num_experts, int top_k, int scoring,
                                          int groups, int top_groups, int renormalize, float scale) {
  __shared__ float scores[KILN_MOE_MAX_EXPERTS];
  __shared__ float choice[KILN_MOE_MAX_EXPERTS];
  __shared__ unsigned char taken[KILN_MOE_MAX_EXPERTS];
  if (threadIdx.x != 0) return;
  int t = blockIdx.x;
  const float* row = logits + (i64)t * num_experts;
  if (scoring == 0) {
    float max = KILN_NEG_INF;
    for (int e = 0; e < num_experts; ++e) max = fmaxf(max, row[e]);
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e) {
      scores[e] = expf(row[e] - max);
      sum += scores[e];
    }
    for (int e = 0; e < num_experts; ++e) {
      scores[e] = scores[e] / sum;
      choice[e] = scores[e];
    }
  } else {
    for (int e = 0; e < num_experts; ++e) {
      scores[e] = 1.0f / (1.0f + expf(-row[e]));
      choice[e] = bias ? scores[e] + bias[e] : scores[e];
    }
    if (groups > 1 && top_groups < groups) {
      int size = num_experts / groups;
      float group_scores[KILN_MOE_MAX_GROUPS];
      unsigned char kept[KILN_MOE_MAX_GROUPS];
      for (int g = 0; g < groups; ++g) {
        for (int i = 0; i < size; ++i) taken[i] = 0;
        int first = moe_best(choice + g * size, taken, size);
        taken[first] = 1;
        int second = moe_best(choice + g * size, taken, size);
        group_scores[g] = choice[g * size + first] + (second < 0 ? 0.0f : choice[g * size + second]);
        kept[g] = 0;
      }
      for (int i = 0; i < top_groups; ++i) kept[moe_best(group_scores, kept, groups)] = 1;
      for (int g = 0; g < groups; ++g)
        if (!kept[g])
          for (int i = 0; i < size; ++i) choice[g * size + i] = 0.0f;
    }
  }
  for (int e = 0; e < num_experts; ++e) taken[e] = 0;
  int* picked = experts + (i64)t * top_k;
  float* w = weights + (i64)t * top_k;
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    int e = moe_best(choice, taken, num_experts);
    taken[e] = 1;
    picked[j] = e;
    w[j] = scores[e];
    sum += scores[e];
  }
  for (int j = 0; j < top_k; ++j) {
    if (renormalize) w[j] = w[j] / sum;
    w[j] = w[j] * scale;
  }
}

// Rows of dense values (dense_rows.cuh's BYTES: 2 bf16, 3 f16, 4 f32): `dot`
// is the warp's dot product of row `row` of `w [*, cols]` with `x [cols]`,
// in 16-byte loads, eight in flight, as the decode GEMV's.
template <int BYTES>
struct DenseRows {
  __device__ static float dot(unsigned long long w, int row, const float* x, int cols) {
    float acc[1] = {0.0f};
    dense_row<BYTES, 1, 1>((const u8*)w + (i64)row * cols * (BYTES == 4 ? 4 : 2), 0, x, 1, cols, acc);
    return warp_sum(acc[0]);
  }
};

// Rows of GGUF blocks of format F, read packed (K-quants in the GEMV's
// spread lane order, which keeps the loads of f32 x in whole lines of L1).
template <typename F>
struct BlockRows {
  __device__ static float dot(unsigned long long w, int row, const float* x, int cols) {
    return blocks_row_dot<F>((const u8*)w, row, x, cols);
  }
};

// Grid (T·K, ceil(I / KILN_MOE_WARPS)): the picks on x, which has room for
// every token of a long prompt; h is [T·K, I].
template <typename R>
__device__ __forceinline__ void moe_gate_up(const float* x, const int* experts,
                                            const unsigned long long* gate,
                                            const unsigned long long* up, float* h, int hidden,
                                            int inter, int top_k, int activation) {
  int row = blockIdx.y * KILN_MOE_WARPS + threadIdx.x / 32;
  if (row >= inter) return;
  int slot = blockIdx.x;  // t·K + j
  int e = experts[slot];
  const float* xt = x + (i64)(slot / top_k) * hidden;
  float g = R::dot(gate[e], row, xt, hidden);
  float u = R::dot(up[e], row, xt, hidden);
  if (threadIdx.x % 32 == 0) h[(i64)slot * inter + row] = kiln_gated(activation, g, u);
}

// Grid (T, ceil(hidden / KILN_MOE_WARPS)); out is [T, hidden].
template <typename R>
__device__ __forceinline__ void moe_down(const float* h, const int* experts, const float* weights,
                                         const unsigned long long* down, float* out, int hidden,
                                         int inter, int top_k) {
  int row = blockIdx.y * KILN_MOE_WARPS + threadIdx.x / 32;
  if (row >= hidden) return;
  int t = blockIdx.x;
  float acc = 0.0f;
  for (int j = 0; j < top_k; ++j) {
    int slot = t * top_k + j;
    acc += weights[slot] * R::dot(down[experts[slot]], row, h + (i64)slot * inter, inter);
  }
  if (threadIdx.x % 32 == 0) out[(i64)t * hidden + row] = acc;
}

// The entry points, one per matrix format: `_f32`, `_bf16`, `_f16` rows,
// `_q8_0`, `_q4_0`, `_q5_0`, `_q4_1`, `_q5_1`, `_q4_k`, `_q5_k`, `_q6_k`, `_iq4_nl`, `_iq4_xs`, `_q2_k`,
// `_q3_k` blocks.
#define KILN_MOE_GATE_UP_PARAMS                                                                         \
  const float *x, const int *experts, const unsigned long long *gate, const unsigned long long *up, \
      float *h, int hidden, int inter, int top_k, int activation
#define KILN_MOE_GATE_UP_ARGS x, experts, gate, up, h, hidden, inter, top_k, activation
#define KILN_MOE_DOWN_PARAMS                                                                          \
  const float *h, const int *experts, const float *weights, const unsigned long long *down, float *out, \
      int hidden, int inter, int top_k
#define KILN_MOE_DOWN_ARGS h, experts, weights, down, out, hidden, inter, top_k

extern "C" __global__ void kiln_moe_gate_up_f32(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<DenseRows<4>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_bf16(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<DenseRows<2>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_f16(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<DenseRows<3>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q8_0(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q8_0>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q4_0(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q4_0>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q5_0(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q5_0>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q4_1(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q4_1>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q5_1(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q5_1>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q4_k(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q4_K_SpreadRows>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q5_k(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q5_K_SpreadRows>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q6_k(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q6_K_SpreadRows>>(KILN_MOE_GATE_UP_ARGS);
}

extern "C" __global__ void kiln_moe_gate_up_iq4_nl(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<IQ4_NL>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_iq4_xs(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<IQ4_XS_Spread>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q2_k(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q2_K_SpreadRows>>(KILN_MOE_GATE_UP_ARGS);
}
extern "C" __global__ void kiln_moe_gate_up_q3_k(KILN_MOE_GATE_UP_PARAMS) {
  moe_gate_up<BlockRows<Q3_K_SpreadRows>>(KILN_MOE_GATE_UP_ARGS);
}

extern "C" __global__ void kiln_moe_down_f32(KILN_MOE_DOWN_PARAMS) {
  moe_down<DenseRows<4>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_bf16(KILN_MOE_DOWN_PARAMS) {
  moe_down<DenseRows<2>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_f16(KILN_MOE_DOWN_PARAMS) {
  moe_down<DenseRows<3>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q8_0(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q8_0>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q4_0(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q4_0>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q5_0(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q5_0>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q4_1(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q4_1>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q5_1(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q5_1>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q4_k(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q4_K_SpreadRows>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q5_k(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q5_K_SpreadRows>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q6_k(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q6_K_SpreadRows>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_iq4_nl(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<IQ4_NL>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_iq4_xs(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<IQ4_XS_Spread>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q2_k(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q2_K_SpreadRows>>(KILN_MOE_DOWN_ARGS);
}
extern "C" __global__ void kiln_moe_down_q3_k(KILN_MOE_DOWN_PARAMS) {
  moe_down<BlockRows<Q3_K_SpreadRows>>(KILN_MOE_DOWN_ARGS);
}
