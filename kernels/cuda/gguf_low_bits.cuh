// GGUF's 2- and 3-bit K-quant formats on the device, beside those of
// gguf_blocks.cuh and with the same interface (`load`, `values`, `dot_x8`,
// `value`; see there):
//   Q2_K  (84 B / 256): 8 lanes, 8 bytes of 2-bit quants each (4 planes)
//   Q3_K (110 B / 256): 8 lanes, the same with their high bits
// and, as the GEMVs on f32 x read them (KQuantSpread's reason: a 16-byte
// load of x has a block's 8 lanes read one 128-byte line), Q2KSpread and
// Q3KSpread. The layouts are ggml's (kernels/src/quant/format.rs decodes
// the same bytes on the CPU). Included after gguf_blocks.cuh.
//
// Both formats hold 256 values as two halves of 128 whose quants are 32
// bytes of four 2-bit planes: value 128n + 32j + l is bits 2j, 2j + 1 of
// quant byte 32n + l, in sub-block 8n + 2j + l / 16 of 16 values. Lane
// part s (Q2_K, Q3_K) takes half n = s / 4 and positions l = 8 (s % 4) ..
// +7 of its four planes: runs of 8 at multiples of 8, parts 0..3 the first
// 128 columns (qmm's stretch) and 4..7 the next. A spread lane t takes
// positions 4t .. 4t + 3 of every plane of both halves.
#pragma once

// Four bytes at `lo` (bytes 0..3) and `hi` (4..7): bytes h, h + 2, h + 4
// and h + 6 (h 0 or 1): a part's four sub-blocks' scales from a half's
// eight, those of planes 0..3 at positions l / 16 = h.
__device__ __forceinline__ unsigned int every_other_byte(unsigned int lo, unsigned int hi, unsigned int h) {
  return __byte_perm(lo, hi, h | (h + 2) << 4 | (h + 4) << 8 | (h + 6) << 12);
}

// The four 2-bit quants of plane j in a word of quant bytes, a byte each.
__device__ __forceinline__ unsigned int plane_quants(unsigned int q, int j) { return (q >> (2 * j)) & 0x03030303u; }

// Q2_K (84 B / 256): 16 scale bytes (sub-block i's: scale in the low
// nibble, minimum in the high), the 64 quant bytes, then f16 d and dmin. A
// value of sub-block i is d · scale_i · q - dmin · minimum_i. Blocks of 84
// bytes keep every block at a 4-byte boundary.
struct Q2_K {
  static const int ELEMS = 256, BYTES = 84, LANES = 8;
  struct Raw {
    unsigned int q[2];   // quant bytes 32n + 8t ..
    unsigned int scales; // the part's sub-blocks' scale bytes, plane j's in byte j
    unsigned int dd;     // d (low 16 bits) and dmin
  };
  __device__ static Raw load(const u8* b, int s) {
    int n = s / 4, t = s % 4;
    Raw r;
    for (int w = 0; w < 2; ++w) r.q[w] = load_streaming_u32(b + 16 + 32 * n + 8 * t + 4 * w);
    r.scales = every_other_byte(load_streaming_u32(b + 8 * n), load_streaming_u32(b + 8 * n + 4), (unsigned)t / 2);
    r.dd = load_streaming_u32(b + 80);
    return r;
  }
  // Sub-block scale · d and minimum · dmin of a scale byte.
  __device__ __forceinline__ static void factors(unsigned int dd, unsigned int scales, int j, float* scale,
                                                 float* minimum) {
    *scale = f16_to_f32((f16_bits)(dd & 0xffffu)) * byte_quant_f32<0>(scales & 0x0f0f0f0fu, j);
    *minimum = f16_to_f32((f16_bits)(dd >> 16)) * byte_quant_f32<0>((scales >> 4) & 0x0f0f0f0fu, j);
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    int first = col + 128 * (s / 4) + 8 * (s % 4);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float scale, minimum;
      factors(r.dd, r.scales, j, &scale, &minimum);
      float v[8];
      for (int e = 0; e < 8; ++e) v[e] = fmaf(scale, byte_quant_f32<0>(plane_quants(r.q[e / 4], j), e % 4), -minimum);
      sink(v, 8, first + 32 * j, 1.0f);
    }
  }
  // Each plane's 8 quants against x's; its minimum times the same 8 of x
  // (their sum by a dot product with ones: x's block sums cover 32).
  __device__ static float dot_x8(const Raw& r, int s, const signed char* q, const X8Scale* scale) {
    int n = s / 4, t = s % 4;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const signed char* x = q + 128 * n + 32 * j + 8 * t;
      unsigned int x0 = x8_word(x), x1 = x8_word(x + 4);
      int dot = dot4_i8(plane_quants(r.q[1], j), x1, dot4_i8(plane_quants(r.q[0], j), x0, 0));
      int x_sum = dot4_i8(0x01010101u, x1, dot4_i8(0x01010101u, x0, 0));
      float factor, minimum;
      factors(r.dd, r.scales, j, &factor, &minimum);
      sum += scale[4 * n + j].d * (factor * int_f32(dot) - minimum * int_f32(x_sum));
    }
    return sum;
  }
  // As the CPU: (d · scale) · q - dmin · minimum.
  __device__ static float value(const u8* b, int i) {
    int n = i / 128, j = (i % 128) / 32, l = i % 32;
    unsigned int byte = b[8 * n + 2 * j + l / 16];
    unsigned int q = (b[16 + 32 * n + l] >> (2 * j)) & 3u;
    return load_f16(b + 80) * quant_f32<0>(byte & 0xfu) * quant_f32<0>(q) - load_f16(b + 82) * quant_f32<0>(byte >> 4);
  }
};

// Q2_K blocks as the GEMVs read them against f32 x (FloatX): lane t takes
// the quant words at 4t of both halves and the scale bytes of positions
// 4t.. (t / 4 = l / 16) of both halves' eight. ROLLED (the kernels for more
// rows of x and the experts', `_SpreadRows`): the loop over the halves
// rolled, as Q6KSpread's.
template <bool ROLLED>
struct Q2KSpread {
  static const int ELEMS = 256, BYTES = 84, LANES = 8;
  struct Raw {
    unsigned int q[2], scales[2], dd;  // [half]
  };
  __device__ static Raw load(const u8* b, int t) {
    Raw r;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      r.q[n] = load_streaming_u32(b + 16 + 32 * n + 4 * t);
      r.scales[n] = every_other_byte(load_streaming_u32(b + 8 * n), load_streaming_u32(b + 8 * n + 4), (unsigned)t / 4);
    }
    r.dd = load_streaming_u32(b + 80);
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int t, int col, Sink sink) {
#pragma unroll(ROLLED ? 1 : 2)
    for (int n = 0; n < 2; ++n) {
      // Constant indices (a computed one would put Raw in local memory).
      unsigned int q = n == 0 ? r.q[0] : r.q[1], scales = n == 0 ? r.scales[0] : r.scales[1];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float scale, minimum;
        Q2_K::factors(r.dd, scales, j, &scale, &minimum);
        unsigned int quants = plane_quants(q, j);
        float v[4];
        for (int e = 0; e < 4; ++e) v[e] = fmaf(scale, byte_quant_f32<0>(quants, e), -minimum);
        sink(v, 4, col + 128 * n + 32 * j + 4 * t, 1.0f);
      }
    }
  }
};
typedef Q2KSpread<false> Q2_K_Spread;
typedef Q2KSpread<true> Q2_K_SpreadRows;

// Q3_K (110 B / 256): 32 bytes of high bits (bit 4n + j of byte l: value
// 128n + 32j + l's), the 64 quant bytes, 12 bytes of 6-bit scales, then
// f16 d. A value is d · (scale_i - 32) · (q + 4 · high - 4). The scales of
// sub-blocks 0..7 have their low four bits in the low nibbles of bytes 0..7,
// those of 8..15 in the high nibbles; their top two bits are bits 2 (i / 4),
// 2 (i / 4) + 1 of byte 8 + i % 4. Blocks of 110 bytes lie at 2-byte
// boundaries: words come in two 16-bit loads (load_u32), the scales in
// load_16_at2's aligned words (bytes 92..107, all within the block).
struct Q3_K {
  static const int ELEMS = 256, BYTES = 110, LANES = 8;
  struct Raw {
    unsigned int q[2], high[2];  // quant bytes 32n + 8t .., high-bit bytes 8t ..
    unsigned int scales;         // the part's sub-blocks' 6-bit scales, plane j's in byte j
    unsigned short d;
  };
  // Sub-blocks 8n .. 8n + 7's scales, a byte each (sub-block 8n + b in byte
  // b of word 0, 8n + 4 + b in word 1), from the 16 bytes at 92.
  __device__ __forceinline__ static void half_scales(const Bytes16& at92, int n, unsigned int* words) {
    unsigned int tops = at92.v[3];  // bytes 104..107: scale bytes 8..11
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      int group = 2 * n + g;  // sub-blocks 4 group .. +3
      unsigned int low = at92.v[1 + group % 2];  // scale bytes 0..3 or 4..7
      words[g] = ((low >> (4 * (group / 2))) & 0x0f0f0f0fu) | (((tops >> (2 * group)) & 0x03030303u) << 4);
    }
  }
  __device__ static Raw load(const u8* b, int s) {
    int n = s / 4, t = s % 4;
    Raw r;
    for (int w = 0; w < 2; ++w) {
      r.q[w] = load_u32(b + 32 + 32 * n + 8 * t + 4 * w);
      r.high[w] = load_u32(b + 8 * t + 4 * w);
    }
    unsigned int words[2];
    half_scales(load_16_at2(b + 92), n, words);
    r.scales = every_other_byte(words[0], words[1], (unsigned)t / 2);
    r.d = load_u16(b + 108);
    return r;
  }
  // Plane j's four quants q + 4 · high of a word of quant bytes and one of
  // high bits (`bit` = 4n + j), a byte each (0 .. 7).
  __device__ __forceinline__ static unsigned int quants(unsigned int q, unsigned int high, int j, int bit) {
    return plane_quants(q, j) | ((high >> bit) & 0x01010101u) << 2;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    int n = s / 4, first = col + 128 * n + 8 * (s % 4);
    float d = f16_to_f32(r.d);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      unsigned int w[2] = {quants(r.q[0], r.high[0], j, 4 * n + j), quants(r.q[1], r.high[1], j, 4 * n + j)};
      float v[8];
      for (int e = 0; e < 8; ++e) v[e] = byte_quant_f32<4>(w[e / 4], e % 4);
      sink(v, 8, first + 32 * j, d * byte_quant_f32<32>(r.scales, j));
    }
  }
  // q + 4 · high - 4 in each byte: adding 124 stays below 256, and
  // flipping the top bit takes 128 off.
  __device__ static float dot_x8(const Raw& r, int s, const signed char* q, const X8Scale* scale) {
    int n = s / 4, t = s % 4;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const signed char* x = q + 128 * n + 32 * j + 8 * t;
      int dot = 0;
#pragma unroll
      for (int w = 0; w < 2; ++w)
        dot = dot4_i8((quants(r.q[w], r.high[w], j, 4 * n + j) + 0x7c7c7c7cu) ^ 0x80808080u, x8_word(x + 4 * w), dot);
      sum += byte_quant_f32<32>(r.scales, j) * scale[4 * n + j].d * int_f32(dot);
    }
    return f16_to_f32(r.d) * sum;
  }
  // As the CPU: (d · (scale - 32)) · (q + 4 · high - 4).
  __device__ static float value(const u8* b, int i) {
    int n = i / 128, j = (i % 128) / 32, l = i % 32, sub = 8 * n + 2 * j + l / 16;
    unsigned int low = (b[96 + sub % 8] >> (4 * (sub / 8))) & 0xfu, top = (b[104 + sub % 4] >> (2 * (sub / 4))) & 3u;
    unsigned int q = ((b[32 + 32 * n + l] >> (2 * j)) & 3u) | ((b[l] >> (4 * n + j)) & 1u) << 2;
    return load_f16(b + 108) * quant_f32<32>(low | top << 4) * quant_f32<4>(q);
  }
};

// Q3_K blocks as the GEMVs read them against f32 x (FloatX): lane t takes
// the quant words at 4t of both halves, the high-bit word at 4t, and the
// scales of positions 4t.. (t / 4 = l / 16) of both halves' eight. ROLLED
// as Q2KSpread's.
template <bool ROLLED>
struct Q3KSpread {
  static const int ELEMS = 256, BYTES = 110, LANES = 8;
  struct Raw {
    unsigned int q[2], scales[2];  // [half]
    unsigned int high;
    unsigned short d;
  };
  __device__ static Raw load(const u8* b, int t) {
    Raw r;
    Bytes16 at92 = load_16_at2(b + 92);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      r.q[n] = load_u32(b + 32 + 32 * n + 4 * t);
      unsigned int words[2];
      Q3_K::half_scales(at92, n, words);
      r.scales[n] = every_other_byte(words[0], words[1], (unsigned)t / 4);
    }
    r.high = load_u32(b + 4 * t);
    r.d = load_u16(b + 108);
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int t, int col, Sink sink) {
    float d = f16_to_f32(r.d);
#pragma unroll(ROLLED ? 1 : 2)
    for (int n = 0; n < 2; ++n) {
      unsigned int q = n == 0 ? r.q[0] : r.q[1], scales = n == 0 ? r.scales[0] : r.scales[1];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        unsigned int quants = Q3_K::quants(q, r.high, j, 4 * n + j);
        float v[4];
        for (int e = 0; e < 4; ++e) v[e] = byte_quant_f32<4>(quants, e);
        sink(v, 4, col + 128 * n + 32 * j + 4 * t, d * byte_quant_f32<32>(scales, j));
      }
    }
  }
};
typedef Q3KSpread<false> Q3_K_Spread;
typedef Q3KSpread<true> Q3_K_SpreadRows;
