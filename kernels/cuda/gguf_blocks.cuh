// GGUF block formats on the device, shared by the decode products
// (gemv.cu, qmatmul.cu) and the mixture-of-experts kernels (moe.cu). Each
// format splits a block among `LANES` lanes of a warp: `load` reads a lane's
// part, `values` decodes it, `block_dot` adds its products with up to MAX_M
// rows of x; `value` decodes one value.
//   Q8_0  (34 B / 32):  4 lanes, 8 quants each
//   Q4_0  (18 B / 32):  4 lanes, 4 bytes of nibbles each
//   Q4_K (144 B / 256): 8 lanes, 16 bytes of nibbles each (two sub-blocks)
//   Q6_K (210 B / 256): 32 lanes, 8 values each
// The layouts are ggml's (kernels/src/quant/format.rs decodes the same bytes
// on the CPU). Included after kiln_cuda.cuh; the loader inlines both.
#pragma once

typedef unsigned char u8;

__device__ __forceinline__ unsigned short load_u16(const u8* p) {
  return *reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ float load_f16(const u8* p) { return f16_to_f32(load_u16(p)); }

// Adds w · x[i, col + j] for the `count` weights `w` to acc[i], for every row
// i < m of x. x is read 16 bytes at a time where it is aligned for that (a
// lane's scalar loads, 32 bytes apart across the warp, would each touch a
// sector per lane and cost the load unit more than the weights). One fused
// multiply-add per weight and row, written out: kernels compile with
// --fmad=false, under which `sum += w * x` is a multiply and an add (by
// arithmetic, Llama-3-8B in bf16 with 8 rows of x is 1.3e11 such operations
// a step, 3.8 ms of an H200's FP32 issue against 3.9 ms to read the weights).
template <int MAX_M>
__device__ __forceinline__ void accumulate(float* acc, const float* w, int count, const float* x, int m,
                                           int k, int col) {
#pragma unroll
  for (int i = 0; i < MAX_M; ++i) {
    if (i < m) {
      const float* xi = x + (i64)i * k + col;
      float sum = 0.0f;
      if (count % 4 == 0 && (reinterpret_cast<unsigned long long>(xi) & 15) == 0) {
        for (int j = 0; j < count; j += 4) {
          Bytes16 v = *reinterpret_cast<const Bytes16*>(xi + j);
          for (int t = 0; t < 4; ++t) sum = fmaf(w[j + t], __uint_as_float(v.v[t]), sum);
        }
      } else {
        for (int j = 0; j < count; ++j) sum = fmaf(w[j], __ldg(xi + j), sum);
      }
      acc[i] += sum;
    }
  }
}

// Each format reads a lane's part of a block in `load` (all of a part's
// loads at once, so a caller can have several blocks' loads in flight before
// it uses the first) and decodes it in `values`, which hands the part's
// weights to `sink(w, count, column)` in runs of `count` (an even number),
// the block's values numbered from `col`. A zeroed `Raw` decodes to zeros.

// A lane's part of a 32-value block that starts with its f16 scale (Q8_0,
// Q4_0): the scale and WORDS 16-bit words of quants, part s's starting at
// byte 2 + 2·WORDS·s (blocks are 2-byte aligned: 16-bit loads).
template <int WORDS>
struct ScaledWords {
  unsigned short d, q[WORDS];
  __device__ static ScaledWords load(const u8* b, int s) {
    ScaledWords r;
    r.d = load_u16(b);
    for (int j = 0; j < WORDS; ++j) r.q[j] = load_u16(b + 2 + 2 * WORDS * s + 2 * j);
    return r;
  }
};

struct Q8_0 {
  static const int ELEMS = 32, BYTES = 34, LANES = 4;
  // Lane part s: quants 8s .. 8s+7.
  typedef ScaledWords<4> Raw;
  __device__ static Raw load(const u8* b, int s) { return Raw::load(b, s); }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    float d = f16_to_f32(r.d), w[8];
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = d * signed_quant_f32(r.q[j]);
      w[2 * j + 1] = d * signed_quant_f32(r.q[j] >> 8);
    }
    sink(w, 8, col + 8 * s);
  }
  __device__ static float value(const u8* b, int j) { return load_f16(b) * signed_quant_f32(b[2 + j]); }
};

struct Q4_0 {
  static const int ELEMS = 32, BYTES = 18, LANES = 4;
  // Lane part s: bytes 4s .. 4s+3, low nibbles are values 4s.., high 16+4s...
  typedef ScaledWords<2> Raw;
  __device__ static Raw load(const u8* b, int s) { return Raw::load(b, s); }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    float d = f16_to_f32(r.d), lo[4], hi[4];
    for (int j = 0; j < 2; ++j) {
      for (int h = 0; h < 2; ++h) {
        unsigned int byte = (r.q[j] >> (8 * h)) & 0xffu;
        lo[2 * j + h] = d * quant_f32<8>(byte & 0xfu);
        hi[2 * j + h] = d * quant_f32<8>(byte >> 4);
      }
    }
    sink(lo, 4, col + 4 * s);
    sink(hi, 4, col + 16 + 4 * s);
  }
  __device__ static float value(const u8* b, int j) {
    unsigned int byte = b[2 + (j % 16)];
    return load_f16(b) * quant_f32<8>(j < 16 ? byte & 0xfu : byte >> 4);
  }
};

// Byte i of 16 loaded bytes, by selects rather than an indexed register
// array (a computed index would put the array in local memory).
__device__ __forceinline__ unsigned int byte_of(const Bytes16& b, int i) {
  unsigned int word = i < 8 ? (i < 4 ? b.v[0] : b.v[1]) : (i < 12 ? b.v[2] : b.v[3]);
  return (word >> (8 * (i % 4))) & 0xffu;
}

// Scale and minimum of Q4_K sub-block `j` (ggml's get_scale_min_k4) from
// the 12 scale bytes at `scale(i)`.
template <typename Scale>
__device__ __forceinline__ void q4k_scale_min_by(Scale scale, int j, float* sc, float* mn) {
  if (j < 4) {
    *sc = quant_f32<0>(scale(j) & 63);
    *mn = quant_f32<0>(scale(j + 4) & 63);
  } else {
    *sc = quant_f32<0>((scale(j + 4) & 0xf) | ((scale(j - 4) >> 6) << 4));
    *mn = quant_f32<0>((scale(j + 4) >> 4) | ((scale(j) >> 6) << 4));
  }
}

struct Q4_K {
  static const int ELEMS = 256, BYTES = 144, LANES = 8;
  // Lane part s: chunk c = s / 2 of 64 values, bytes 16 (s % 2) .. +15 of
  // its 32: low nibbles in sub-block 2c, high nibbles in 2c + 1. A part is
  // two 16-byte loads, the block's head (d, dmin, the 12 scale bytes: the
  // same address for the block's 8 lanes) and its quants; blocks are 144
  // bytes and rows whole blocks, so both are 16-byte aligned.
  struct Raw {
    Bytes16 head, q;
  };
  __device__ static Raw load(const u8* b, int s) {
    Raw r;
    r.head = load_streaming(b);
    r.q = load_streaming(b + 16 + 32 * (s / 2) + 16 * (s % 2));
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    int c = s / 2;
    float d = f16_to_f32((f16_bits)(r.head.v[0] & 0xffffu)), dmin = f16_to_f32((f16_bits)(r.head.v[0] >> 16));
    float sc0, m0, sc1, m1;
    auto scale = [&](int i) { return byte_of(r.head, 4 + i); };
    q4k_scale_min_by(scale, 2 * c, &sc0, &m0);
    q4k_scale_min_by(scale, 2 * c + 1, &sc1, &m1);
    float a0 = d * sc0, b0 = dmin * m0, a1 = d * sc1, b1 = dmin * m1;
    int first = col + 64 * c + 16 * (s % 2);
#pragma unroll
    for (int word = 0; word < 4; ++word) {
      float lo[4], hi[4];
      for (int j = 0; j < 4; ++j) {
        unsigned int byte = (r.q.v[word] >> (8 * j)) & 0xffu;
        lo[j] = a0 * quant_f32<0>(byte & 0xfu) - b0;
        hi[j] = a1 * quant_f32<0>(byte >> 4) - b1;
      }
      sink(lo, 4, first + 4 * word);
      sink(hi, 4, first + 32 + 4 * word);
    }
  }
  __device__ static float value(const u8* b, int j) {
    int c = j / 64, l = j % 32, high = (j % 64) >= 32;
    float sc, mn;
    q4k_scale_min_by([&](int i) { return (unsigned int)b[4 + i]; }, 2 * c + high, &sc, &mn);
    unsigned int byte = b[16 + 32 * c + l];
    return load_f16(b) * sc * quant_f32<0>(high ? byte >> 4 : byte & 0xfu) - load_f16(b + 2) * mn;
  }
};

struct Q6_K {
  static const int ELEMS = 256, BYTES = 210, LANES = 32;
  // Lane t: half h = t / 16 of 128 values, positions l0, l0 + 1 (l0 = 2 (t %
  // 16)) of each of its four quarters of 32 (blocks are 2-byte aligned).
  struct Raw {
    unsigned short ql0, ql1, qh, d;
    unsigned int scales;  // the four quarters' signed scales, a byte each
  };
  __device__ static Raw load(const u8* b, int t) {
    int h = t / 16, l0 = 2 * (t % 16);
    Raw r;
    r.d = load_u16(b + 208);
    r.ql0 = load_u16(b + 64 * h + l0);
    r.ql1 = load_u16(b + 64 * h + 32 + l0);
    r.qh = load_u16(b + 128 + 32 * h + l0);
    const signed char* scales = reinterpret_cast<const signed char*>(b + 192 + 8 * h + l0 / 16);
    r.scales = 0;
    for (int quarter = 0; quarter < 4; ++quarter) r.scales |= (unsigned int)(u8)scales[2 * quarter] << (8 * quarter);
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int t, int col, Sink sink) {
    int h = t / 16, l0 = 2 * (t % 16);
    float d = f16_to_f32(r.d);
    // Not unrolled: four copies of the products with 8 rows of x cost
    // the kernels for several rows ~80 registers.
#pragma unroll 1
    for (int quarter = 0; quarter < 4; ++quarter) {
      unsigned short ql = quarter % 2 == 0 ? r.ql0 : r.ql1;
      float scale = d * signed_quant_f32(r.scales >> (8 * quarter)), w[2];
      for (int e = 0; e < 2; ++e) {
        unsigned int low = ((ql >> (8 * e)) >> (quarter < 2 ? 0 : 4)) & 0xfu;
        unsigned int high = ((r.qh >> (8 * e)) >> (2 * quarter)) & 3u;
        w[e] = scale * quant_f32<32>(low | (high << 4));
      }
      sink(w, 2, col + 128 * h + 32 * quarter + l0);
    }
  }
  __device__ static float value(const u8* b, int j) {
    int h = j / 128, quarter = (j % 128) / 32, l = j % 32;
    unsigned int ql = b[64 * h + l + (quarter % 2) * 32];
    unsigned int low = (quarter < 2 ? ql : ql >> 4) & 0xfu;
    unsigned int high = (b[128 + 32 * h + l] >> (2 * quarter)) & 3u;
    float scale = signed_quant_f32(b[192 + 8 * h + l / 16 + 2 * quarter]);
    return load_f16(b + 208) * scale * quant_f32<32>(low | (high << 4));
  }
};

// Stores `count` (even) values at `out` as bf16, two to a 32-bit store.
__device__ __forceinline__ void store_bf16_pairs(bf16_bits* out, const float* v, int count) {
  for (int e = 0; e < count; e += 2)
    *reinterpret_cast<unsigned*>(out + e) = pack_bf16(v[e], v[e + 1]);
}

// A loaded lane part `s` of a block whose values start at column `col`
// times x, added to acc.
template <typename F, int MAX_M>
__device__ __forceinline__ void dot_raw(const typename F::Raw& r, int s, const float* x, int m, int k, int col,
                                        float* acc) {
  F::values(r, s, col, [=](const float* w, int count, int column) { accumulate<MAX_M>(acc, w, count, x, m, k, column); });
}

// Lane part `s` of the block at `b` times x, added to acc.
template <typename F, int MAX_M>
__device__ __forceinline__ void block_dot(const u8* b, int s, const float* x, int m, int k, int col, float* acc) {
  dot_raw<F, MAX_M>(F::load(b, s), s, x, m, k, col, acc);
}

// The warp's dot product of row `row` of a matrix of F blocks `w [*, k]`
// with `x [k]` (every lane gets the sum).
template <typename F>
__device__ __forceinline__ float blocks_row_dot(const u8* w, int row, const float* x, int k) {
  int lane = threadIdx.x % 32, blocks = k / F::ELEMS;
  const u8* wr = w + (i64)row * blocks * F::BYTES;
  float acc[1] = {0.0f};
  for (int blk = lane / F::LANES; blk < blocks; blk += 32 / F::LANES)
    block_dot<F, 1>(wr + (i64)blk * F::BYTES, lane % F::LANES, x, 1, k, blk * F::ELEMS, acc);
  return warp_sum(acc[0]);
}
