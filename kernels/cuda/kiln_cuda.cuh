// Definitions every Kiln CUDA kernel shares. Written for NVRTC without the
// CUDA toolkit's headers (bf16 and f16 are raw bits, converted by the
// conversion instructions in inline PTX, by hand in the emulator), so the
// same source also compiles on the CPU through the kernel emulator
// (emulator/kiln_emu.h), which defines KILN_EMULATOR and models the few
// PTX instructions written inline (mma, ldmatrix, cp.async, dp4a).
#pragma once

#ifndef KILN_EMULATOR
// NVRTC: dynamic shared memory, 16-byte aligned.
#define KILN_DYNAMIC_SHARED(type, name) \
  extern __shared__ __align__(16) unsigned char kiln_dynamic_smem[]; \
  type* name = reinterpret_cast<type*>(kiln_dynamic_smem)
#endif

typedef long long i64;
typedef unsigned short bf16_bits;
typedef unsigned short f16_bits;

#define KILN_FULL_MASK 0xffffffffu
// The largest block a launch may ask for. Kernels the host launches with a
// block that follows the row (norms, rotary, cache writes: up to 1024
// threads) say so with __launch_bounds__(KILN_MAX_THREADS), so the compiler
// keeps them within 64 registers a thread (a larger count fails the launch
// on a GPU, which the emulator cannot show; the NVRTC test allows no spill).
#define KILN_MAX_THREADS 1024
#define KILN_NEG_INF __int_as_float((int)0xff800000u)
// log2(e) and ln(2): softmax weights as powers of two (fast_exp2).
#define KILN_LOG2E 1.4426950408889634f
#define KILN_LN2 0.6931471805599453f

__device__ __forceinline__ float bf16_to_f32(bf16_bits b) {
  return __uint_as_float(((unsigned int)b) << 16);
}

// Round to nearest even; NaN stays NaN. On the GPU one conversion
// instruction (sm_80+), where the bit arithmetic below issues about six; the
// two differ only in a NaN's payload (the instruction's is canonical).
__device__ __forceinline__ bf16_bits f32_to_bf16(float f) {
#ifdef KILN_EMULATOR
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_bits)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16_bits)(u >> 16);
#else
  bf16_bits r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#endif
}

// n - OFFSET as a float, for quants 0 ≤ n < 2^23: n under the exponent of
// 2^23 is the float 2^23 + n, and subtracting 2^23 + OFFSET is exact, so the
// value is (float)n - OFFSET to the bit. A logic op and an add, at the FP32
// units' full rate, where the integer-to-float conversion of `(float)n`
// issues 16 a clock on an sm_80/sm_90 multiprocessor (FFMA: 64 / 128): one
// per weight of a GGUF block made the conversions alone cost more than
// reading the blocks (by arithmetic, Llama-3-8B in Q4_K on an H200: 1.7 ms a
// decode step against 1.05 ms to read 4.4 GB).
template <int OFFSET>
__device__ __forceinline__ float quant_f32(unsigned int n) {
  return __uint_as_float(0x4b000000u | n) - (8388608.0f + (float)OFFSET);
}
// Byte k (0..3; a constant once loops are unrolled) of `word` less OFFSET,
// as quant_f32 computes it: one byte permute puts the byte under the
// exponent of 2^23 (0x4b0000nn), where shifting the byte down, masking it
// and or-ing the exponent took two or three instructions.
template <int OFFSET>
__device__ __forceinline__ float byte_quant_f32(unsigned int word, int k) {
  return __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7540u | (unsigned int)k)) - (8388608.0f + (float)OFFSET);
}
// 8 + b / 16 for byte k of `word` (b < 128): one byte permute puts the byte
// under the exponent of 8 (0x41nn0000, the byte's top bit the exponent's
// lowest, hence b < 128). A quant's float without quant_f32's subtraction,
// for formats whose value is a multiply-add of it anyway (KQuant).
__device__ __forceinline__ float eight_plus_byte(unsigned int word, int k) {
  return __uint_as_float(__byte_perm(word, 0x41000000u, 0x7054u | ((unsigned int)k << 8)));
}
// A signed byte's value (two's complement bits in the low 8 of `b`).
__device__ __forceinline__ float signed_quant_f32(unsigned int b) { return quant_f32<128>((b & 0xffu) ^ 0x80u); }

// An integer -2^22 ≤ v < 2^22 as a float, exactly, the same way: v + 2^22
// under the exponent of 2^23, less 2^23 + 2^22.
__device__ __forceinline__ float int_f32(int v) { return __uint_as_float(0x4b400000u + (unsigned int)v) - 12582912.0f; }

// c + the four products of the signed bytes of a and b (PTX dp4a, sm_61+):
// the integer dot products of the 8-bit activation GEMVs (gemv.cuh).
__device__ __forceinline__ int dot4_i8(unsigned int a, unsigned int b, int c) {
#ifdef KILN_EMULATOR
  for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return c;
#else
  int r;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
#endif
}

// Exact (f16 values are all f32 values). On the GPU one conversion
// instruction, where the bit arithmetic below issues ~25 with branches for
// subnormals and infinities: GGUF blocks carry their scales in f16, so every
// block's decoding paid them.
__device__ __forceinline__ float f16_to_f32(f16_bits h) {
#ifdef KILN_EMULATOR
  unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
  unsigned int exponent = ((unsigned int)h >> 10) & 0x1fu;
  unsigned int mantissa = (unsigned int)h & 0x3ffu;
  if (exponent == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Subnormal (or zero): mantissa · 2^-24.
    float value = quant_f32<0>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -value : value;
  }
  return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#else
  float r;
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
  return r;
#endif
}

// Round to nearest even, with overflow to infinity and subnormals (one
// instruction on the GPU; the two differ only in a NaN's payload).
__device__ __forceinline__ f16_bits f32_to_f16(float f) {
#ifdef KILN_EMULATOR
  unsigned int u = __float_as_uint(f);
  unsigned int sign = (u >> 16) & 0x8000u;
  unsigned int a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (f16_bits)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (f16_bits)(sign | 0x7c00u);  // rounds to >= 65520
  if (a < 0x38800000u) {
    // Subnormal half: value / 2^-24, rounded to nearest even.
    float scaled = __uint_as_float(a) * 16777216.0f;
    unsigned int m = (unsigned int)scaled;
    float rest = scaled - (float)m;
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) m += 1;
    return (f16_bits)(sign | m);
  }
  unsigned int rounded = a + 0x0fffu + ((a >> 13) & 1u);
  return (f16_bits)(sign | ((rounded - 0x38000000u) >> 13));
#else
  f16_bits r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
#endif
}

// Two bf16 (lower index in the low half) from two f32, as one register of
// a tensor-core fragment or one 32-bit store: one instruction on the GPU
// (the bit arithmetic's conversions were over a quarter of qmatmul.cu's
// loop: kiln_qmm_q4_k's 1,625 sm_90 instructions a stretch became 1,177).
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
#ifdef KILN_EMULATOR
  return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
#else
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

// Programmatic dependent launch (sm_90 and newer): the host launches the
// kernels of some sources (`Source::waits_for_inputs` in sources.rs) so that
// they may start while the previous kernel in the stream still runs. Every
// thread of such a kernel calls kiln_wait_inputs() before it reads anything
// but weights or writes anything at all (the arena reuses memory, so even a
// write could land on the previous kernel's input): it returns once the
// previous kernel has completed and its writes are visible, and then lets
// the next kernel's blocks start. Launched plainly, or before sm_90, it
// returns at once; the emulator checks that every thread calls it.
__device__ __forceinline__ void kiln_wait_inputs() {
#ifdef KILN_EMULATOR
  kiln_emu::inputs_awaited();
#elif __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks for the line holding `p` in L2 without waiting for it: weights a
// kernel will read, fetched before kiln_wait_inputs() returns.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#ifndef KILN_EMULATOR
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// store(i, load(i)) for i = first, first + step, ... < n, BATCH loads
// before their stores: NVRTC keeps a load behind any store before it (even
// through __restrict__ pointers, as the SASS shows), so a loop of load,
// store pays a memory round trip an element (a sampler's pass over a 128k
// vocabulary with 512 threads: 250 in a row).
template <typename T, int BATCH = 8, typename Load, typename Store>
__device__ __forceinline__ void for_each_batched(int first, int n, int step, Load load, Store store) {
  for (; first < n; first += BATCH * step) {
    T v[BATCH];
#pragma unroll
    for (int u = 0; u < BATCH; ++u)
      if (first + u * step < n) v[u] = load(first + u * step);
#pragma unroll
    for (int u = 0; u < BATCH; ++u)
      if (first + u * step < n) store(first + u * step, v[u]);
  }
}

// The same over the thread's elements of n, a block's width apart.
template <typename T, typename Load, typename Store>
__device__ __forceinline__ void for_each_batched(int n, Load load, Store store) {
  for_each_batched<T>((int)threadIdx.x, n, (int)blockDim.x, load, store);
}

// Sixteen bytes, for 128-bit loads and stores.
struct __align__(16) Bytes16 {
  unsigned int v[4];
};

// Eight bytes, for 64-bit loads and stores.
struct __align__(8) Bytes8 {
  unsigned int v[2];
};

// Two floats, for 64-bit stores.
struct __align__(8) FloatPair {
  float x, y;
};

// A 16-byte load of data read once (weights): not kept in L1, so what is
// read again (the activations every warp reads) stays there. Only for data
// nothing writes while the kernel chain runs (weights; a sampler's logits,
// launched plainly): the asm has no memory operand, so the compiler may move
// it above kiln_wait_inputs() or a barrier, and `.nc` assumes it read-only.
__device__ __forceinline__ Bytes16 load_streaming(const void* p) {
#ifdef KILN_EMULATOR
  return *reinterpret_cast<const Bytes16*>(p);
#else
  Bytes16 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.v[0]), "=r"(r.v[1]), "=r"(r.v[2]), "=r"(r.v[3])
      : "l"(p));
  return r;
#endif
}

// Eight bytes of weights, as load_streaming reads sixteen.
__device__ __forceinline__ unsigned long long load_streaming_u64(const void* p) {
#ifdef KILN_EMULATOR
  return *reinterpret_cast<const unsigned long long*>(p);
#else
  unsigned long long r;
  asm("ld.global.nc.L1::no_allocate.u64 %0, [%1];" : "=l"(r) : "l"(p));
  return r;
#endif
}

// Four bytes of weights, as load_streaming reads sixteen.
__device__ __forceinline__ unsigned int load_streaming_u32(const void* p) {
#ifdef KILN_EMULATOR
  return *reinterpret_cast<const unsigned int*>(p);
#else
  unsigned int r;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r) : "l"(p));
  return r;
#endif
}

// One warp's tensor-core product D += A·B: A 16×16 bf16 (row-major), B 16×8
// bf16 (column-major), D 16×8 f32, in the fragment layout of PTX's
// mma.m16n8k16 (lane = 4·group + pair): a[0] holds A[group][2·pair, +1],
// a[1] row group + 8, a[2] and a[3] the same rows 8 columns on; b[0] holds
// B[2·pair, +1][group], b[1] 8 rows on; d[0], d[1] are D[group][2·pair, +1],
// d[2], d[3] row group + 8. Two bf16 share a register, the lower index in the
// low half. Every lane of the warp must call it together.
__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned* a, const unsigned* b) {
#ifdef KILN_EMULATOR
  kiln_emu::mma_bf16_16816(d, a, b, __LINE__);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

#ifndef KILN_EMULATOR
// A pointer into shared memory as the 32-bit shared-space address that
// ldmatrix and cp.async take.
__device__ __forceinline__ unsigned shared_address(const void* p) {
  unsigned address;
  asm("{ .reg .u64 s; cvta.to.shared.u64 s, %1; cvt.u32.u64 %0, s; }" : "=r"(address) : "l"(p));
  return address;
}
#endif

// 16 bytes from global to shared memory without passing through registers
// (PTX cp.async, sm_80+), or 16 zero bytes where !valid (`from` then is not
// read); shared memory holds them once the thread has called
// copy_async_wait() (then a barrier, for other threads to read them). Both
// addresses 16-byte aligned. The emulator applies the copies at the wait.
__device__ __forceinline__ void copy_async_16(void* to, const void* from, bool valid) {
#ifdef KILN_EMULATOR
  kiln_emu::copy_async_16(to, from, valid);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(to)), "l"(from),
               "r"(valid ? 16 : 0));
#endif
}

// Waits for the thread's copy_async_16 copies.
__device__ __forceinline__ void copy_async_wait() {
#ifdef KILN_EMULATOR
  kiln_emu::copy_async_wait();
#else
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// Four 8×8 matrices of b16 from shared memory into one warp's fragment
// registers (PTX ldmatrix .x4, sm_75+): lane i gives the address of row
// i % 8 of matrix i / 8 (8 consecutive values, 16-byte aligned); register m
// of a lane gets matrix m's (row lane / 4, columns 2 (lane % 4), +1), the B
// fragment of mma_bf16_16816 for a matrix whose rows are B's columns; with
// TRANS, (rows 2 (lane % 4), +1, column lane / 4), for one whose rows are
// B's rows. One instruction where building the fragments from 32-bit (or,
// transposed, 16-bit) shared loads took 2 (or 4 and a byte permute) per
// register. Every lane of the warp must call it together.
//
// `offset` bytes past `row`: where `row` stays the same through a loop and
// the offset steps, its shared address is worked out once (the conversion
// is pure), and each call adds 32 bits to it, where a pointer computed per
// call took 64-bit arithmetic and a conversion each time.
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const void* row, unsigned offset = 0) {
#ifdef KILN_EMULATOR
  kiln_emu::ldmatrix_x4(r, static_cast<const unsigned char*>(row) + offset, TRANS, __LINE__);
#else
  unsigned address = shared_address(row) + offset;
  if (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#endif
}

// 2^x for the softmax weights: the multi-function unit's approximation on
// the GPU (ex2.approx, relative error ~2^-22; subnormal results flushed to
// zero), where exp2f adds a range check and scaling around it. The weights
// are rounded to bf16 for the tensor-core product.
__device__ __forceinline__ float fast_exp2(float x) {
#ifdef KILN_EMULATOR
  return exp2f(x);
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#endif
}

// The activations of gated MLPs, as the generated element-wise kernels
// write them (host/src/runtime/cuda/codegen.rs), shared with the GEMV that
// applies one to the gate's row as it multiplies it with up's (gemv.cuh) and
// with the experts of a mixture (moe.cu), through `kiln_gated`.
__device__ __forceinline__ float kiln_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float kiln_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float kiln_gelu_tanh(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
// NaN stays NaN.
__device__ __forceinline__ float kiln_relu(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }

// The activation numbered `code` as the host numbers them
// (`GatedActivation`, host/src/runtime/cuda/fusion.rs): 1 SiLU, 2 GELU (erf),
// 3 GELU (tanh), 4 ReLU.
__device__ __forceinline__ float kiln_gated(int code, float gate, float up) {
  float a = code == 1 ? kiln_silu(gate) : code == 2 ? kiln_gelu(gate) : code == 3 ? kiln_gelu_tanh(gate) : kiln_relu(gate);
  return a * up;
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// `op` over the 32 lanes of a warp; every lane gets the result.
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(KILN_FULL_MASK, v, offset));
  return v;
}

// `op` over the block (blockDim.x a multiple of 32, at most 1024), with
// `identity` for the missing warps; every thread gets the result. `scratch`
// holds 32 floats of shared memory.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float identity, float* scratch) {
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, op);
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp()); }
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce(v, SumOp(), 0.0f, scratch); }
// 1 / sqrt(total / n + eps): the scale of an RMS norm from its row's sum of
// squares (of a layer norm from its sum of squared deviations).
__device__ __forceinline__ float inverse_root_mean(float total, int n, float eps) {
  return 1.0f / sqrtf(total / (float)n + eps);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, MaxOp(), KILN_NEG_INF, scratch);
}

// True in every thread of the block that finishes last among the `blocks`
// blocks counting in `counter` (whose results are then all written and
// visible); the count returns to zero for the next launch (a replayed
// graph). Every thread calls it after writing its results: each fences its
// writes before thread 0 counts the block (the CUDA programming guide's
// last-block pattern). Split-K attention merges its splits so, split-K
// tensor-core products add theirs, and the logits' GEMV writes greedy's
// picks.
__device__ __forceinline__ bool last_block_done(unsigned* counter, unsigned blocks) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicInc(counter, blocks - 1) == blocks - 1;
    // The acquire side: the other blocks' fenced writes are ordered before
    // the last block's reads (the count alone is a relaxed atomic).
    if (last) __threadfence();
  }
  __syncthreads();
  return last;
}

// Rotary embedding (rope.cu, and the q/k/v GEMV of gemv.cuh): the cos and
// sin (times `scale`, YaRN's) of frequency `inv_freq` at `position`, the
// angle in f32 as transformers computes it ...
__device__ __forceinline__ void rope_cos_sin(float position, float inv_freq, float scale, float* c, float* s) {
  float angle = position * inv_freq;
  *c = cosf(angle) * scale;
  *s = sinf(angle) * scale;
}
// ... and a pair (x0, x1) rotated by them.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float* r0, float* r1) {
  *r0 = x0 * c - x1 * s;
  *r1 = x1 * c + x0 * s;
}

// Keys that order floats: a larger float has a larger key.
__device__ __forceinline__ unsigned int order_key(float f) {
  unsigned int u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Rounds an f32 to the nearest bf16 / f16 value (results of ops typed bf16 or
// f16 are computed in f32 and stored rounded, as the CPU backend does).
__device__ __forceinline__ float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
__device__ __forceinline__ float round_f16(float v) { return f16_to_f32(f32_to_f16(v)); }

// The type an f32 result is stored in: producers whose only readers are
// matrix products that take x in a half type write it in that type, so the
// products need no cast of their own (host/src/runtime/cuda/fusion.rs,
// `half_product_inputs`). Numbered as the host's `OutputType`.
#define KILN_OUT_F32 0
#define KILN_OUT_BF16 1
#define KILN_OUT_F16 2

// v in the half type `type` (KILN_OUT_BF16 or KILN_OUT_F16), and back.
__device__ __forceinline__ unsigned short to_half(float v, int type) {
  return type == KILN_OUT_BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}
__device__ __forceinline__ float from_half(unsigned short h, int type) {
  return type == KILN_OUT_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// Element i of `out`, whose elements are of type `type`, set to v.
__device__ __forceinline__ void store_as(float* out, i64 i, float v, int type) {
  if (type == KILN_OUT_F32)
    out[i] = v;
  else
    reinterpret_cast<unsigned short*>(out)[i] = to_half(v, type);
}

// Element i of `in`, whose elements are of type `type` (KILN_OUT_*), as f32:
// generated kernels reading a product's output that cuBLAS stored in a half
// type (host/src/runtime/cuda/fusion.rs, `half_product_outputs`).
__device__ __forceinline__ float load_as(const float* in, i64 i, int type) {
  if (type == KILN_OUT_F32) return in[i];
  return from_half(reinterpret_cast<const unsigned short*>(in)[i], type);
}

// Whether `p` may take a 16-byte load or store.
__device__ __forceinline__ bool aligned16(const void* p) { return ((unsigned long long)p & 15) == 0; }

// Elements i .. i + 3 of `in` (of type `type`, as load_as) into v in one
// load (16 bytes of f32, 8 of a half type): i a multiple of 4, `in`
// 16-byte aligned.
__device__ __forceinline__ void load4_as(const float* in, i64 i, int type, float* v) {
  if (type == KILN_OUT_F32) {
    Bytes16 b = *reinterpret_cast<const Bytes16*>(in + i);
    for (int j = 0; j < 4; ++j) v[j] = __uint_as_float(b.v[j]);
    return;
  }
  Bytes8 b = *reinterpret_cast<const Bytes8*>(reinterpret_cast<const unsigned short*>(in) + i);
  for (int j = 0; j < 4; ++j) v[j] = from_half((unsigned short)(b.v[j / 2] >> (16 * (j % 2))), type);
}

// Elements i .. i + 3 of `out` (of type `type`, as store_as) set to v in one
// store, with load4_as's conditions.
__device__ __forceinline__ void store4_as(float* out, i64 i, const float* v, int type) {
  if (type == KILN_OUT_F32) {
    Bytes16 b;
    for (int j = 0; j < 4; ++j) b.v[j] = __float_as_uint(v[j]);
    *reinterpret_cast<Bytes16*>(out + i) = b;
    return;
  }
  Bytes8 b;
  for (int j = 0; j < 2; ++j) b.v[j] = (unsigned)to_half(v[2 * j], type) | (unsigned)to_half(v[2 * j + 1], type) << 16;
  *reinterpret_cast<Bytes8*>(reinterpret_cast<unsigned short*>(out) + i) = b;
}

// A row of `out` (elements of type `type`) starting at element `at`.
struct OutRow {
  float* out;
  i64 at;
  int type;
  __device__ __forceinline__ void set(i64 i, float v) const { store_as(out, at + i, v, type); }
};

// The RMS norm of the rows a kernel writes, taken as it writes them (the
// embedding's rows and the first layer's norm): y [row] = x [row] · s ·
// (offset + w), s = 1 / sqrt(mean(x [row]²) + eps), stored as `out_type`
// says (store_as). None where w is null. The rows are scaled first, x =
// row · scale (Gemma's √hidden, Granite's embedding multiplier; 1 for
// none), with or without a norm.
struct KilnRowNorm {
  const float* w;
  float* y;
  float eps, offset;
  int out_type;
  float scale;
};

// Row `row` of out [_, cols] set to load(c) at each column c (a block a
// row: for_each_batched's columns a thread), scaled by `norm.scale`, then
// its norm where `norm` has one, each thread reading back the columns it
// wrote.
template <typename Load>
__device__ __forceinline__ void write_row_normed(float* out, i64 row, int cols, Load load, const KilnRowNorm& norm) {
  __shared__ float scratch[32];
  float* x = out + row * cols;
  float squares = 0.0f;
  for_each_batched<float>(cols, load, [&](int c, float v) {
    v *= norm.scale;
    x[c] = v;
    squares += v * v;
  });
  if (norm.w == nullptr) return;
  const float s = inverse_root_mean(block_sum(squares, scratch), cols, norm.eps);
  for_each_batched<FloatPair>(
      cols, [&](int c) { return FloatPair{x[c], norm.w[c]}; },
      [&](int c, FloatPair v) { store_as(norm.y, row * cols + c, v.x * s * (norm.offset + v.y), norm.out_type); });
}

// Float to integer as Rust's `as i64`: toward zero, saturating, NaN to 0.
__device__ __forceinline__ i64 f32_to_i64(float v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18f) return 0x7fffffffffffffffLL;
  if (v <= -9.2233720368547758e18f) return (i64)(-0x7fffffffffffffffLL - 1);
  return (i64)v;
}

// The paged KV cache (attention.cu, rope.cu): a ragged batch's rows, their
// sequences and positions, and where a position's keys and values live.

// The sequence owning batch row `row`: the first whose rows end past it
// (the last if none do). Where sequence `row` holds row `row` alone (every
// row of a decode step), two loads side by side find it; else a binary
// search, ⌈log2 batch⌉ dependent loads (6 at 64 sequences, ~2 µs at the
// start of each block of attention), where a scan took up to `batch`.
__device__ __forceinline__ int sequence_of_row(const i64* row_offsets, int batch, i64 row) {
  if (row < batch && row_offsets[row] == row && row_offsets[row + 1] == row + 1) return (int)row;
  int b = 0, end = batch - 1;
  while (b < end) {
    int mid = (b + end) / 2;
    if (row_offsets[mid + 1] > row)
      end = mid;
    else
      b = mid + 1;
  }
  return b;
}

// The sequence owning batch row `row` and the row's position in it.
__device__ __forceinline__ int sequence_of(const i64* row_offsets, const i64* context_lens, int batch,
                                           i64 row, i64* position) {
  int b = sequence_of_row(row_offsets, batch, row);
  i64 fed = row_offsets[b + 1] - row_offsets[b];
  *position = context_lens[b] - fed + (row - row_offsets[b]);
  return b;
}

// cache_slot in two steps, for a lookup issued well before its use (decode
// attention's next chunk): the cache block holding position `p` (its entry
// in a sequence's row of the block tables), then the slot of `p` in it.
// Positions (≥ 0 here) and block sizes fit 32 bits: a 32-bit division,
// where a 64-bit one calls a subroutine of ~70 instructions.
__device__ __forceinline__ i64 cache_block_of(const i64* table_row, unsigned p, unsigned size) {
  return table_row[p / size];
}
__device__ __forceinline__ i64 cache_slot_in(i64 block, unsigned p, unsigned size) {
  return block * size + p % size;
}

__device__ __forceinline__ i64 cache_slot(const i64* block_tables, int b, int blocks_per_seq, int block_size,
                                          i64 position) {
  const unsigned p = (unsigned)position, size = (unsigned)block_size;
  return cache_slot_in(cache_block_of(block_tables + (i64)b * blocks_per_seq, p, size), p, size);
}

// Cache elements to and from f32. Kernels told the element type at run time
// (the rotated GEMV's cache write) number them as the host's `KvElement`.
#define KILN_CACHE_F32 0
#define KILN_CACHE_BF16 1
#define KILN_CACHE_FP8 2
__device__ __forceinline__ float cache_load(const float* p) { return *p; }
__device__ __forceinline__ float cache_load(const bf16_bits* p) { return bf16_to_f32(*p); }
__device__ __forceinline__ void cache_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void cache_store(bf16_bits* p, float v) { *p = f32_to_bf16(v); }

// An 8-bit float of the fp8 cache (`--kv-cache-dtype fp8`): E4M3 as
// OCP/NVIDIA's e4m3fn (bias 7, no infinities, 0x7f/0xff NaN, ±448 at
// most), vLLM's fp8 KV cache with its default scale of 1.
struct fp8_e4m3 {
  unsigned char bits;
};

// Round to nearest even, saturating finite values to ±448 (cuda_fp8.h's
// __NV_SATFINITE, as vLLM stores its cache); NaN gives 0x7f under its sign.
// Writes are a token's row at a time, so the bit arithmetic runs on every
// target.
__device__ __forceinline__ unsigned int f32_to_e4m3(float v) {
  unsigned int sign = (__float_as_uint(v) >> 24) & 0x80u;
  if (v != v) return sign | 0x7fu;
  float a = fminf(fabsf(v), 448.0f);
  if (a < 0.015625f) return sign | (unsigned int)rintf(a * 512.0f);  // subnormal: units of 2^-9 (8: 2^-6)
  unsigned int u = __float_as_uint(a);
  u += 0x7ffffu + ((u >> 20) & 1u);  // round the mantissa to 3 bits, to nearest even
  return sign | ((((u >> 23) - 120u) << 3) | ((u >> 20) & 7u));
}

// Exact (every E4M3 value is an f32 value); 0x7f and 0xff read as NaN.
__device__ __forceinline__ float e4m3_to_f32(unsigned int b) {
  unsigned int magnitude = b & 0x7fu;
  float v = magnitude >= 8u ? __uint_as_float((magnitude << 20) + (120u << 23))  // 2^(e-7) · 1.m
                            : quant_f32<0>(magnitude) * 0.001953125f;            // m · 2^-9
  if (magnitude == 0x7fu) v = __uint_as_float(0x7fc00000u);
  return __uint_as_float(__float_as_uint(v) | ((b & 0x80u) << 24));
}

// Bytes 0..3 of `word` as four E4M3 values. On sm_89+ two conversion
// instructions to f16 pairs (cvt.rn.f16x2.e4m3x2) and four to f32, where the
// bit arithmetic above (sm_80, the emulator) issues about eight a value;
// both give the same values (a NaN's payload aside).
__device__ __forceinline__ void e4m3x4_to_f32(unsigned int word, float* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(KILN_EMULATOR)
  unsigned int lo, hi;
  asm("{\n .reg .b16 a, b;\n mov.b32 {a, b}, %2;\n cvt.rn.f16x2.e4m3x2 %0, a;\n cvt.rn.f16x2.e4m3x2 %1, b;\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
  out[0] = f16_to_f32((f16_bits)(lo & 0xffffu));
  out[1] = f16_to_f32((f16_bits)(lo >> 16));
  out[2] = f16_to_f32((f16_bits)(hi & 0xffffu));
  out[3] = f16_to_f32((f16_bits)(hi >> 16));
#else
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = e4m3_to_f32((word >> (8 * j)) & 0xffu);
#endif
}

__device__ __forceinline__ float cache_load(const fp8_e4m3* p) { return e4m3_to_f32(p->bits); }
__device__ __forceinline__ void cache_store(fp8_e4m3* p, float v) { p->bits = (unsigned char)f32_to_e4m3(v); }

// Eight cached values as loaded (attention.cu, decode_attention.cu): one
// aligned 32-byte (f32), 16-byte (bf16) or 8-byte (E4M3) load, widened to
// f32 or to bf16 pairs when used.
template <typename C>
struct Cached8 {
  Bytes16 part[sizeof(C) / 2];
};
__device__ __forceinline__ Cached8<float> load_cached8(const float* p) {
  return Cached8<float>{{*reinterpret_cast<const Bytes16*>(p), *reinterpret_cast<const Bytes16*>(p + 4)}};
}
__device__ __forceinline__ Cached8<bf16_bits> load_cached8(const bf16_bits* p) {
  return Cached8<bf16_bits>{{*reinterpret_cast<const Bytes16*>(p)}};
}
__device__ __forceinline__ void widen8(const Cached8<float>& r, float* out) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[j] = __uint_as_float(r.part[0].v[j]);
    out[4 + j] = __uint_as_float(r.part[1].v[j]);
  }
}
__device__ __forceinline__ void widen8(const Cached8<bf16_bits>& r, float* out) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = __uint_as_float(r.part[0].v[j] << 16);
    out[2 * j + 1] = __uint_as_float(r.part[0].v[j] & 0xffff0000u);
  }
}
// E4M3: one 8-byte load.
template <>
struct __align__(8) Cached8<fp8_e4m3> {
  unsigned int word[2];
};
__device__ __forceinline__ Cached8<fp8_e4m3> load_cached8(const fp8_e4m3* p) {
  return *reinterpret_cast<const Cached8<fp8_e4m3>*>(p);
}
__device__ __forceinline__ void widen8(const Cached8<fp8_e4m3>& r, float* out) {
  e4m3x4_to_f32(r.word[0], out);
  e4m3x4_to_f32(r.word[1], out + 4);
}
template <typename C>
__device__ __forceinline__ void load8(const C* p, float* out) {
  widen8(load_cached8(p), out);
}
// The eight values as four bf16 pairs (the lower index in the low half), a
// tensor-core fragment's registers: bf16 as loaded; E4M3 widened, exactly
// (every E4M3 value is a bf16 value).
__device__ __forceinline__ Bytes16 bf16_pairs8(const Cached8<bf16_bits>& r) { return r.part[0]; }
__device__ __forceinline__ Bytes16 bf16_pairs8(const Cached8<fp8_e4m3>& r) {
  float f[8];
  widen8(r, f);
  Bytes16 pairs;
#pragma unroll
  for (int j = 0; j < 4; ++j) pairs.v[j] = pack_bf16(f[2 * j], f[2 * j + 1]);
  return pairs;
}
