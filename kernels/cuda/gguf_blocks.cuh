// GGUF block formats on the device, shared by the decode products
// (gemv.cu) and the mixture-of-experts kernels (moe.cu). Each format splits
// a block among `LANES` lanes of a warp; `dot` adds one lane's part of the
// block's products with up to MAX_M rows of x, `value` decodes one value.
//   Q8_0  (34 B / 32):  4 lanes, 8 quants each
//   Q4_0  (18 B / 32):  4 lanes, 4 bytes of nibbles each
//   Q4_K (144 B / 256): 16 lanes, 8 bytes of nibbles each (two sub-blocks)
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
// sector per lane and cost the load unit more than the weights).
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
          for (int t = 0; t < 4; ++t) sum += w[j + t] * __uint_as_float(v.v[t]);
        }
      } else {
        for (int j = 0; j < count; ++j) sum += w[j] * __ldg(xi + j);
      }
      acc[i] += sum;
    }
  }
}

struct Q8_0 {
  static const int ELEMS = 32, BYTES = 34, LANES = 4;
  // Lane part s: quants 8s .. 8s+7.
  template <int MAX_M>
  __device__ static void dot(const u8* b, int s, const float* x, int m, int k, int col, float* acc) {
    float d = load_f16(b), w[8];
    for (int j = 0; j < 4; ++j) {
      unsigned short q = load_u16(b + 2 + 8 * s + 2 * j);
      w[2 * j] = d * (float)(signed char)(q & 0xff);
      w[2 * j + 1] = d * (float)(signed char)(q >> 8);
    }
    accumulate<MAX_M>(acc, w, 8, x, m, k, col + 8 * s);
  }
  __device__ static float value(const u8* b, int j) { return load_f16(b) * (float)(signed char)b[2 + j]; }
};

struct Q4_0 {
  static const int ELEMS = 32, BYTES = 18, LANES = 4;
  // Lane part s: bytes 4s .. 4s+3, low nibbles are values 4s.., high 16+4s...
  template <int MAX_M>
  __device__ static void dot(const u8* b, int s, const float* x, int m, int k, int col, float* acc) {
    float d = load_f16(b), lo[4], hi[4];
    for (int j = 0; j < 2; ++j) {
      unsigned short q = load_u16(b + 2 + 4 * s + 2 * j);
      for (int h = 0; h < 2; ++h) {
        unsigned int byte = (q >> (8 * h)) & 0xffu;
        lo[2 * j + h] = d * ((float)(byte & 0xfu) - 8.0f);
        hi[2 * j + h] = d * ((float)(byte >> 4) - 8.0f);
      }
    }
    accumulate<MAX_M>(acc, lo, 4, x, m, k, col + 4 * s);
    accumulate<MAX_M>(acc, hi, 4, x, m, k, col + 16 + 4 * s);
  }
  __device__ static float value(const u8* b, int j) {
    unsigned int byte = b[2 + (j % 16)];
    return load_f16(b) * ((float)(j < 16 ? byte & 0xfu : byte >> 4) - 8.0f);
  }
};

// Scale and minimum of Q4_K sub-block `j` (ggml's get_scale_min_k4).
__device__ __forceinline__ void q4k_scale_min(const u8* scales, int j, float* sc, float* mn) {
  if (j < 4) {
    *sc = (float)(scales[j] & 63);
    *mn = (float)(scales[j + 4] & 63);
  } else {
    *sc = (float)((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
    *mn = (float)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

struct Q4_K {
  static const int ELEMS = 256, BYTES = 144, LANES = 16;
  // Lane part s: chunk c = s / 4 of 64 values, bytes 8 (s % 4) .. +7 of its
  // 32: low nibbles in sub-block 2c, high nibbles in 2c + 1.
  template <int MAX_M>
  __device__ static void dot(const u8* b, int s, const float* x, int m, int k, int col, float* acc) {
    int c = s / 4, p = s % 4;
    float d = load_f16(b), dmin = load_f16(b + 2);
    float sc0, m0, sc1, m1;
    q4k_scale_min(b + 4, 2 * c, &sc0, &m0);
    q4k_scale_min(b + 4, 2 * c + 1, &sc1, &m1);
    const unsigned int* q = reinterpret_cast<const unsigned int*>(b + 16 + 32 * c + 8 * p);
    unsigned int words[2] = {q[0], q[1]};
    float lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
      unsigned int byte = (words[j / 4] >> (8 * (j % 4))) & 0xffu;
      lo[j] = d * sc0 * (float)(byte & 0xfu) - dmin * m0;
      hi[j] = d * sc1 * (float)(byte >> 4) - dmin * m1;
    }
    accumulate<MAX_M>(acc, lo, 8, x, m, k, col + 64 * c + 8 * p);
    accumulate<MAX_M>(acc, hi, 8, x, m, k, col + 64 * c + 32 + 8 * p);
  }
  __device__ static float value(const u8* b, int j) {
    int c = j / 64, l = j % 32, high = (j % 64) >= 32;
    float sc, mn;
    q4k_scale_min(b + 4, 2 * c + high, &sc, &mn);
    unsigned int byte = b[16 + 32 * c + l];
    return load_f16(b) * sc * (float)(high ? byte >> 4 : byte & 0xfu) - load_f16(b + 2) * mn;
  }
};

struct Q6_K {
  static const int ELEMS = 256, BYTES = 210, LANES = 32;
  // Lane t: half h = t / 16 of 128 values, positions l0, l0 + 1 (l0 = 2 (t %
  // 16)) of each of its four quarters of 32.
  template <int MAX_M>
  __device__ static void dot(const u8* b, int t, const float* x, int m, int k, int col, float* acc) {
    int h = t / 16, l0 = 2 * (t % 16);
    float d = load_f16(b + 208);
    unsigned short ql0 = load_u16(b + 64 * h + l0), ql1 = load_u16(b + 64 * h + 32 + l0);
    unsigned short qh = load_u16(b + 128 + 32 * h + l0);
    const signed char* scales = reinterpret_cast<const signed char*>(b + 192 + 8 * h + l0 / 16);
    for (int quarter = 0; quarter < 4; ++quarter) {
      unsigned short ql = quarter % 2 == 0 ? ql0 : ql1;
      float scale = d * (float)scales[2 * quarter], w[2];
      for (int e = 0; e < 2; ++e) {
        unsigned int low = ((ql >> (8 * e)) >> (quarter < 2 ? 0 : 4)) & 0xfu;
        unsigned int high = ((qh >> (8 * e)) >> (2 * quarter)) & 3u;
        w[e] = scale * (float)((int)(low | (high << 4)) - 32);
      }
      accumulate<MAX_M>(acc, w, 2, x, m, k, col + 128 * h + 32 * quarter + l0);
    }
  }
  __device__ static float value(const u8* b, int j) {
    int h = j / 128, quarter = (j % 128) / 32, l = j % 32;
    unsigned int ql = b[64 * h + l + (quarter % 2) * 32];
    unsigned int low = (quarter < 2 ? ql : ql >> 4) & 0xfu;
    unsigned int high = (b[128 + 32 * h + l] >> (2 * quarter)) & 3u;
    float scale = (float)(reinterpret_cast<const signed char*>(b + 192))[8 * h + l / 16 + 2 * quarter];
    return load_f16(b + 208) * scale * (float)((int)(low | (high << 4)) - 32);
  }
};

// The warp's dot product of row `row` of a matrix of F blocks `w [*, k]`
// with `x [k]` (every lane gets the sum).
template <typename F>
__device__ __forceinline__ float blocks_row_dot(const u8* w, int row, const float* x, int k) {
  int lane = threadIdx.x % 32, blocks = k / F::ELEMS;
  const u8* wr = w + (i64)row * blocks * F::BYTES;
  float acc[1] = {0.0f};
  for (int blk = lane / F::LANES; blk < blocks; blk += 32 / F::LANES)
    F::template dot<1>(wr + (i64)blk * F::BYTES, lane % F::LANES, x, 1, k, blk * F::ELEMS, acc);
  return warp_sum(acc[0]);
}
