// GGUF block formats on the device, shared by the decode products
// (gemv.cuh, qmatmul.cu) and the mixture-of-experts kernels (moe.cu). Each
// format splits a block among `LANES` lanes of a warp: `load` reads a lane's
// part, `values` decodes it, `dot_raw` adds its products with up to MAX_M
// rows of x (`blocks_sweep` over a row's blocks); `dot_x8` takes a part's
// dot product with a row of 8-bit x (X8Scale) in integer arithmetic;
// `value` decodes one value.
//   Q8_0  (34 B / 32):  4 lanes, 8 quants each
//   Q4_0  (18 B / 32):  4 lanes, 4 bytes of nibbles each
//   Q5_0  (22 B / 32):  4 lanes, 4 bytes of nibbles and their fifth bits
//   Q4_1, Q5_1 (20, 24 B / 32): as Q4_0 and Q5_0, with a minimum
//   Q4_K (144 B / 256): 8 lanes, 16 bytes of nibbles each (two sub-blocks)
//   Q5_K (176 B / 256): 8 lanes, 16 bytes of nibbles and their fifth bits
//   Q6_K (210 B / 256): 8 lanes, 16 consecutive values in each of 2 quarters
//   IQ4_NL (18 B / 32):  4 lanes, 4 bytes of table indices each
//   IQ4_XS (136 B / 256): 8 lanes, a sub-block of 32 each (16 bytes)
// The GEMVs on f32 x read Q4_K, Q5_K, Q6_K and IQ4_XS in another order of
// lanes (KQuantSpread, Q6KSpread, IQ4_XS_Spread), which keeps their loads
// of x in whole lines of L1.
// The layouts are ggml's (kernels/src/quant/format.rs decodes the same bytes
// on the CPU). Included after kiln_cuda.cuh; the loader inlines both.
#pragma once

typedef unsigned char u8;

__device__ __forceinline__ unsigned short load_u16(const u8* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}
__device__ __forceinline__ float load_f16(const u8* p) { return f16_to_f32(load_u16(p)); }
// Four bytes at a 2-byte-aligned address (in blocks of 18, 22 or 34
// bytes): two 16-bit loads.
__device__ __forceinline__ unsigned int load_u32(const u8* p) {
  return load_u16(p) | ((unsigned int)load_u16(p + 2) << 16);
}
// Sixteen bytes at a 2-byte-aligned address (in Q6_K's blocks of 210):
// the four or five aligned words that hold them, realigned by funnel shifts
// (16-bit loads took eight).
__device__ __forceinline__ Bytes16 load_16_at2(const u8* p) {
  unsigned long long address = reinterpret_cast<unsigned long long>(p);
  const unsigned int* words = reinterpret_cast<const unsigned int*>(address & ~3ull);
  unsigned int shift = (unsigned int)(address & 2) * 8, w[5];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = __ldg(words + i);
  w[4] = shift ? __ldg(words + 4) : 0u;
  Bytes16 r;
#pragma unroll
  for (int i = 0; i < 4; ++i) r.v[i] = __funnelshift_r(w[i], w[i + 1], shift);
  return r;
}

// Adds scale · w[j] · x[i, col + j] over the run of `count` weights to
// acc[i], for every row i < m of x (the run's scale taken once, after its
// sum: a multiply a weight fewer than scaling each weight). x is read 16
// bytes at a time where it is aligned for that (a lane's scalar loads, 32
// bytes apart across the warp, would each touch a sector per lane and cost
// the load unit more than the weights): checked per call, or known by the
// caller (X16: every run of 4 lies at a 16-byte boundary, so the check and
// the scalar path compile away). One fused
// multiply-add per weight and row, written out: kernels compile with
// --fmad=false, under which `sum += w * x` is a multiply and an add (by
// arithmetic, Llama-3-8B in bf16 with 8 rows of x is 1.3e11 such operations
// a step, 3.8 ms of an H200's FP32 issue against 3.9 ms to read the weights).
template <int MAX_M, bool X16 = false>
__device__ __forceinline__ void accumulate(float* acc, const float* w, int count, const float* x, int m,
                                           int k, int col, float scale = 1.0f) {
#pragma unroll
  for (int i = 0; i < MAX_M; ++i) {
    if (i < m) {
      const float* xi = x + (i64)i * k + col;
      float sum = 0.0f;
      if (count % 4 == 0 && (X16 || (reinterpret_cast<unsigned long long>(xi) & 15) == 0)) {
        for (int j = 0; j < count; j += 4) {
          Bytes16 v = *reinterpret_cast<const Bytes16*>(xi + j);
          for (int t = 0; t < 4; ++t) sum = fmaf(w[j + t], __uint_as_float(v.v[t]), sum);
        }
      } else {
        // A plain load, not __ldg: x is written by the kernel before, which
        // a programmatic launch overlaps (the non-coherent path assumes
        // read-only data for the kernel's whole life).
        for (int j = 0; j < count; ++j) sum = fmaf(w[j], xi[j], sum);
      }
      acc[i] = fmaf(scale, sum, acc[i]);
    }
  }
}

// Activations as 8-bit blocks of 32 (kiln_quantize_x8 in gemv.cu): a row's
// quants are signed bytes, and each block of 32 has its scale `d` (max|x| /
// 127) and `sum`, d · Σq, for the formats whose values are offset (Q4_0's
// -8, Q5_0's -16) or less a minimum (Q4_K, Q5_K). A part's `dot_x8` gets the row's quants and
// scales at the weight block's first column.
struct X8Scale {
  float d, sum;
};

// Four quants of x from a 4-byte-aligned address.
__device__ __forceinline__ unsigned int x8_word(const signed char* q) {
  return *reinterpret_cast<const unsigned int*>(q);
}

// Each format reads a lane's part of a block in `load` (all of a part's
// loads at once, so a caller can have several blocks' loads in flight before
// it uses the first) and decodes it in `values`, which hands the part's
// weights to `sink(w, count, column, scale)` in runs of `count` (an even
// number) of weights scale · w[j], the block's values numbered from `col`.
// A zeroed `Raw` decodes to zeros.

struct Q8_0 {
  static const int ELEMS = 32, BYTES = 34, LANES = 4;
  // Lane part s: the f16 scale and quants 8s .. 8s+7, four to a word.
  struct Raw {
    unsigned short d;
    unsigned int q[2];
  };
  __device__ static Raw load(const u8* b, int s) {
    Raw r;
    r.d = load_u16(b);
    for (int j = 0; j < 2; ++j) r.q[j] = load_u32(b + 2 + 8 * s + 4 * j);
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    float w[8];
    // Signed bytes as n + 128 (the top bit flipped), less 128 once a float.
    unsigned int biased[2] = {r.q[0] ^ 0x80808080u, r.q[1] ^ 0x80808080u};
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = byte_quant_f32<128>(biased[j / 4], j % 4);
    sink(w, 8, col + 8 * s, f16_to_f32(r.d));
  }
  __device__ static float dot_x8(const Raw& r, int s, const signed char* q, const X8Scale* scale) {
    int sum = dot4_i8(r.q[1], x8_word(q + 8 * s + 4), dot4_i8(r.q[0], x8_word(q + 8 * s), 0));
    return f16_to_f32(r.d) * scale->d * int_f32(sum);
  }
  __device__ static float value(const u8* b, int j) { return load_f16(b) * signed_quant_f32(b[2 + j]); }
};

// Four bits (the low four of `bits`) as bit 4 of four bytes: each bit j
// of bits · 0x204081 lands on bit 8j, and no two shifted copies overlap.
__device__ __forceinline__ unsigned int fifth_bits(unsigned int bits) {
  return ((bits & 0xfu) * 0x00204081u & 0x01010101u) << 4;
}

// Q4_0 (18 B / 32) and Q5_0 (22 B / 32): an f16 scale d, for Q5_0 the
// values' fifth bits (32 bits at byte 2, bit j for value j), then 16 bytes
// whose low nibbles are values 0..15 and high nibbles 16..31; a value is
// d · (n - 8), or d · (n - 16) with the fifth bit. Q4_1 (20 B / 32) and
// Q5_1 (24 B / 32), MIN: an f16 minimum m after d, then the same; a value
// is d · n + m.
template <bool FIVE_BITS, bool MIN>
struct Nibbles {
  static const int HEAD = MIN ? 4 : 2;  // d (and m), then the fifth bits or the quants
  static const int ELEMS = 32, BYTES = HEAD + (FIVE_BITS ? 20 : 16), LANES = 4;
  static const int OFFSET = MIN ? 0 : FIVE_BITS ? 16 : 8, QS = HEAD + (FIVE_BITS ? 4 : 0);
  // Lane part s: bytes 4s .. 4s+3 of the quants: values 4s.. (low nibbles)
  // and 16+4s.. (high). Blocks of 18 or 22 bytes are 2-byte aligned (16-bit
  // loads), of 20 or 24 bytes 4-byte aligned: 32-bit loads, d and m in one
  // (with a 16-bit d and m each, qmm's 64-row Q5_1 kernel spilled).
  static const bool ALIGNED4 = BYTES % 4 == 0;
  struct Raw {
    unsigned int dm;       // d in the low 16 bits, m in the high
    unsigned int q, high;  // high: the fifth bits of the whole block
  };
  __device__ static unsigned int word(const u8* p) {
    return ALIGNED4 ? __ldg(reinterpret_cast<const unsigned int*>(p)) : load_u32(p);
  }
  __device__ static Raw load(const u8* b, int s) {
    Raw r;
    r.dm = MIN ? word(b) : load_u16(b);
    r.q = word(b + QS + 4 * s);
    r.high = FIVE_BITS ? word(b + HEAD) : 0u;
    return r;
  }
  __device__ __forceinline__ static float d_of(const Raw& r) { return f16_to_f32((f16_bits)(r.dm & 0xffffu)); }
  __device__ __forceinline__ static float m_of(const Raw& r) { return f16_to_f32((f16_bits)(r.dm >> 16)); }
  // The part's quants n (a byte each): values 4s.. and 16+4s...
  __device__ __forceinline__ static void quants(const Raw& r, int s, unsigned int* lo, unsigned int* hi) {
    *lo = r.q & 0x0f0f0f0fu;
    *hi = (r.q >> 4) & 0x0f0f0f0fu;
    if (FIVE_BITS) {
      *lo |= fifth_bits(r.high >> (4 * s));
      *hi |= fifth_bits(r.high >> (16 + 4 * s));
    }
  }
  // With a minimum, each weight is one fused multiply-add (the run's sum
  // then taken at scale 1); else the run's scale d multiplies its sum once.
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    unsigned int n[2];
    quants(r, s, &n[0], &n[1]);
    float d = d_of(r), m = m_of(r);
    for (int h = 0; h < 2; ++h) {
      float w[4];
      for (int j = 0; j < 4; ++j) w[j] = MIN ? fmaf(d, byte_quant_f32<0>(n[h], j), m) : byte_quant_f32<OFFSET>(n[h], j);
      sink(w, 4, col + 16 * h + 4 * s, MIN ? 1.0f : d);
    }
  }
  // Σ (n - OFFSET) x over the part is Σ n x less OFFSET · Σx, and Σ (d · n
  // + m) x is d · Σ n x plus m · Σx; the block's four parts each take a
  // quarter of the block's Σx (`sum`), as llama.cpp's MMVQ does.
  __device__ static float dot_x8(const Raw& r, int s, const signed char* q, const X8Scale* scale) {
    unsigned int lo, hi;
    quants(r, s, &lo, &hi);
    int sum = dot4_i8(hi, x8_word(q + 16 + 4 * s), dot4_i8(lo, x8_word(q + 4 * s), 0));
    if (MIN) return d_of(r) * scale->d * int_f32(sum) + 0.25f * m_of(r) * scale->sum;
    return d_of(r) * (scale->d * int_f32(sum) - (OFFSET / 4) * scale->sum);
  }
  // As the CPU: d · (n - OFFSET), or d · n + m.
  __device__ static float value(const u8* b, int j) {
    unsigned int byte = b[QS + (j % 16)];
    unsigned int n = j < 16 ? byte & 0xfu : byte >> 4;
    if (FIVE_BITS) n |= ((b[HEAD + j / 8] >> (j % 8)) & 1u) << 4;
    return MIN ? load_f16(b) * quant_f32<0>(n) + load_f16(b + 2) : load_f16(b) * quant_f32<OFFSET>(n);
  }
};
typedef Nibbles<false, false> Q4_0;
typedef Nibbles<true, false> Q5_0;
typedef Nibbles<false, true> Q4_1;
typedef Nibbles<true, true> Q5_1;

// Scale and minimum of Q4_K sub-block `j` (ggml's get_scale_min_k4) from
// the 12 scale bytes at `scales` (one value's decoding; a block part's
// takes four sub-blocks at once, KQuant::factors).
__device__ __forceinline__ void q4k_scale_min(const u8* scales, unsigned int j, float* sc, float* mn) {
  if (j < 4) {
    *sc = quant_f32<0>(scales[j] & 63);
    *mn = quant_f32<0>(scales[j + 4] & 63);
  } else {
    *sc = quant_f32<0>((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
    *mn = quant_f32<0>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// Q4_K (144 B / 256) and Q5_K (176 B / 256): f16 d and dmin, 12 bytes of
// 6-bit scales and minimums for 8 sub-blocks of 32, for Q5_K the values'
// fifth bits (32 bytes: bit 2c of byte l for value l of sub-block 2c, bit
// 2c + 1 for sub-block 2c + 1), then 128 bytes of nibbles: each 32 hold
// sub-block 2c (low nibbles) and 2c + 1 (high). A value of sub-block j is
// d · scale_j · n - dmin · minimum_j.
template <bool FIVE_BITS>
struct KQuant {
  static const int ELEMS = 256, BYTES = FIVE_BITS ? 176 : 144, LANES = 8;
  static const int QS = FIVE_BITS ? 48 : 16;
  // Lane part s: chunk c = s / 2 of 64 values, positions 16 (s % 2) .. +15
  // of its 32 in both sub-blocks. A part is two 16-byte loads, three with
  // the fifth bits: the block's head (d, dmin, the 12 scale bytes: the same
  // address for the block's 8 lanes), its quants and their fifth bits;
  // blocks are 144 or 176 bytes and rows whole blocks, so all are 16-byte
  // aligned.
  struct Raw {
    Bytes16 head, q, high;
  };
  __device__ static Raw load(const u8* b, int s) {
    Raw r;
    r.head = load_streaming(b);
    r.q = load_streaming(b + QS + 32 * (s / 2) + 16 * (s % 2));
    if (FIVE_BITS) r.high = load_streaming(b + 16 + 16 * (s % 2));
    return r;
  }
  // Word w of the part's quants n (a byte each) in sub-blocks 2c (lo) and
  // 2c + 1 (hi): positions 16 (s % 2) + 4w ...
  __device__ __forceinline__ static void quants(const Raw& r, int c, int w, unsigned int* lo, unsigned int* hi) {
    *lo = r.q.v[w] & 0x0f0f0f0fu;
    *hi = (r.q.v[w] >> 4) & 0x0f0f0f0fu;
    if (FIVE_BITS) {
      *lo |= ((r.high.v[w] >> (2 * c)) & 0x01010101u) << 4;
      *hi |= ((r.high.v[w] >> (2 * c + 1)) & 0x01010101u) << 4;
    }
  }
  // Sub-blocks 2c and 2c + 1's d · scale and dmin · minimum: a value n of
  // sub-block 2c + h is scale[h] · n - minimum[h] (one fused multiply-add
  // in `values`). The 6-bit scales (and minimums) of four sub-blocks are
  // gathered a byte each into one word, ggml's get_scale_min_k4 for four at
  // once, and the part's two taken from it by byte permutes: a few
  // instructions on either side of the branch on c (the GEMV's lanes take
  // different sides; qmm's threads of a stretch the same one), where
  // extracting each sub-block's bits on its own took ~25 a side.
  __device__ __forceinline__ static void factors(const Bytes16& head, unsigned int c, float* scale, float* minimum) {
    float d = f16_to_f32((f16_bits)(head.v[0] & 0xffffu)), dmin = f16_to_f32((f16_bits)(head.v[0] >> 16));
    unsigned int sc, mn;
    scale_words(head, c >= 2, &sc, &mn);
    int at = 2 * (int)(c % 2);
    for (int h = 0; h < 2; ++h) {
      scale[h] = d * byte_quant_f32<0>(sc, at + h);
      minimum[h] = dmin * byte_quant_f32<0>(mn, at + h);
    }
  }
  // The 6-bit scales and minimums of sub-blocks 0..3 (or with `high`
  // 4..7), a byte each, from the head's scale bytes 0..3, 4..7 and 8..11:
  // for 0..3 the low six bits of bytes 0..3 and 4..7; for 4..7 the nibbles
  // of bytes 8..11 under the top two bits of bytes 0..3 and 4..7.
  __device__ __forceinline__ static void scale_words(const Bytes16& head, bool high, unsigned int* sc,
                                                     unsigned int* mn) {
    unsigned int s0 = head.v[1], s1 = head.v[2], s2 = head.v[3];
    if (!high) {
      *sc = s0 & 0x3f3f3f3fu;
      *mn = s1 & 0x3f3f3f3fu;
    } else {
      *sc = (s2 & 0x0f0f0f0fu) | ((s0 >> 2) & 0x30303030u);
      *mn = ((s2 >> 4) & 0x0f0f0f0fu) | ((s1 >> 2) & 0x30303030u);
    }
  }
  // A value as one fused multiply-add of its quant's float f = 8 + n /
  // UNIT (n · 16 / UNIT, below 128, under the exponent of 8:
  // eight_plus_byte): scale · n - minimum = UNIT · scale · f - (8 · UNIT ·
  // scale + minimum), the offset rounded once a sub-block (16 units of n
  // for Q4_K, 32 for Q5_K, a value's 15 or 31 at most). quant_f32's
  // subtraction of 2^23 a value fewer: the one-row Q4_K GEMV's loop over a
  // part of a block went from 195 to 171 instructions (sm_90 SASS).
  static const int UNIT = FIVE_BITS ? 4 : 2;
  static const int SHIFT = FIVE_BITS ? 2 : 3;  // n · 16 / UNIT = n << SHIFT
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    unsigned int c = (unsigned int)s / 2;
    float scale[2], minimum[2];
    factors(r.head, c, scale, minimum);
    float step[2], offset[2];
    for (int h = 0; h < 2; ++h) {
      step[h] = (float)UNIT * scale[h];
      offset[h] = -fmaf(8.0f * (float)UNIT, scale[h], minimum[h]);
    }
    int first = col + 64 * (int)c + 16 * (s % 2);  // col < 0 where a block starts before qmm's stretch
    // Runs of 8 (two words' values) at multiples of 8: qmm stores each
    // in one 16-byte store.
#pragma unroll
    for (int word = 0; word < 4; word += 2) {
      unsigned int n[2][2];  // [sub-block 2c + h][word]
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        quants(r, c, word + w, &n[0][w], &n[1][w]);
        n[0][w] <<= SHIFT;
        n[1][w] <<= SHIFT;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[8];
        for (int j = 0; j < 8; ++j) v[j] = fmaf(step[h], eight_plus_byte(n[h][j / 4], j % 4), offset[h]);
        sink(v, 8, first + 32 * h + 4 * word, 1.0f);
      }
    }
  }
  // The part's 16 quants of sub-block 2c against 16 of x's, its 16 of
  // 2c + 1 against the next 32's; each sub-block's minimum times its Σx
  // (`sum`) is taken half by each of the two parts that share it.
  __device__ static float dot_x8(const Raw& r, int s, const signed char* q, const X8Scale* scale) {
    unsigned int c = (unsigned int)s / 2;
    float factor[2], minimum[2];
    factors(r.head, c, factor, minimum);
    const signed char* x = q + 64 * c + 16 * (s % 2);
    Bytes16 x_lo = *reinterpret_cast<const Bytes16*>(x), x_hi = *reinterpret_cast<const Bytes16*>(x + 32);
    int sum_lo = 0, sum_hi = 0;
#pragma unroll
    for (int word = 0; word < 4; ++word) {
      unsigned int n_lo, n_hi;
      quants(r, c, word, &n_lo, &n_hi);
      sum_lo = dot4_i8(n_lo, x_lo.v[word], sum_lo);
      sum_hi = dot4_i8(n_hi, x_hi.v[word], sum_hi);
    }
    const X8Scale &x0 = scale[2 * c], &x1 = scale[2 * c + 1];
    return factor[0] * x0.d * int_f32(sum_lo) + factor[1] * x1.d * int_f32(sum_hi) -
           0.5f * (minimum[0] * x0.sum + minimum[1] * x1.sum);
  }
  __device__ static float value(const u8* b, int j) {
    int c = j / 64, l = j % 32, high = (j % 64) >= 32;
    float sc, mn;
    q4k_scale_min(b + 4, 2 * c + high, &sc, &mn);
    unsigned int byte = b[QS + 32 * c + l];
    unsigned int n = high ? byte >> 4 : byte & 0xfu;
    if (FIVE_BITS) n |= ((b[16 + l] >> (2 * c + high)) & 1u) << 4;
    return load_f16(b) * sc * quant_f32<0>(n) - load_f16(b + 2) * mn;
  }
};
typedef KQuant<false> Q4_K;
typedef KQuant<true> Q5_K;

// Q4_K and Q5_K blocks as the GEMVs read them against f32 x (FloatX): the
// same bytes, lane s of a block's 8 taking word s of each of
// the four 32-byte chunks of nibbles, values 4s .. 4s + 3 of every
// sub-block. A 16-byte load of x then has a block's 8 lanes read 32
// consecutive floats, one 128-byte line: 4 lines a warp's load, 32 for its
// 1,024 weights. With KQuant's parts (16 consecutive bytes of nibbles a
// lane) a block's lanes read four lines a load, every sector half used: 16
// lines a load, 128 for the same weights. L1 returns at most a line a
// cycle, so at batch 1 an 8B model's ~6e9 Q4_K weights (Q4_K_M) asked by
// that count ~2.9 ms a step of an H200's L1s for x alone, against ~1 ms to
// read the weights (measured: 8.4 ms a step). The price is a lane working
// out all eight sub-blocks' factors, not two: the one-row loop over a
// block goes from 171 to 201 instructions for Q4_K, 202 to 226 for Q5_K
// (sm_90 SASS). The factors are KQuant's, bit for bit. The kernels for
// more rows of x, whose loads of x are m times as many (at 8 rows KQuant's
// parts asked 1,024 lines of L1 for a warp's 1,024 weights against 684
// instructions: the dense GEMV at 8 rows measured 3.7 times slower than
// cuBLAS at 16), read the same order with the loop over the chunks ROLLED
// (`_SpreadRows`): unrolled, the live factors took them from 96 to 182
// registers; rolled, 80, and ~1,050 instructions a block.
template <bool FIVE_BITS, bool ROLLED>
struct KQuantSpread {
  typedef KQuant<FIVE_BITS> Block;
  static const int ELEMS = 256, BYTES = Block::BYTES, LANES = 8;
  struct Raw {
    Bytes16 head;
    unsigned int q[4], high;
  };
  __device__ static Raw load(const u8* b, int s) {
    Raw r;
    r.head = load_streaming(b);
#pragma unroll
    for (int c = 0; c < 4; ++c) r.q[c] = load_streaming_u32(b + Block::QS + 32 * c + 4 * s);
    r.high = FIVE_BITS ? load_streaming_u32(b + 16 + 4 * s) : 0u;
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    // d · scale_j · UNIT and dmin · minimum_j from each 6-bit byte b as 8 +
    // b / 16 (eight_plus_byte): A · (8 + b / 16) - 8A in one rounding, as
    // KQuant's d · b (times UNIT, a power of two) and dmin · b.
    float unit_d = 16.0f * (float)Block::UNIT * f16_to_f32((f16_bits)(r.head.v[0] & 0xffffu));
    float unit_dmin = 16.0f * f16_to_f32((f16_bits)(r.head.v[0] >> 16));
    unsigned int sc[2], mn[2];  // sub-blocks 0..3 and 4..7
    Block::scale_words(r.head, false, &sc[0], &mn[0]);
    Block::scale_words(r.head, true, &sc[1], &mn[1]);
#pragma unroll(ROLLED ? 1 : 4)
    for (int c = 0; c < 4; ++c) {
      unsigned int q = c == 0 ? r.q[0] : c == 1 ? r.q[1] : c == 2 ? r.q[2] : r.q[3];
      unsigned int n[2] = {q & 0x0f0f0f0fu, (q >> 4) & 0x0f0f0f0fu};
      if (FIVE_BITS) {
        n[0] |= ((r.high >> (2 * c)) & 0x01010101u) << 4;
        n[1] |= ((r.high >> (2 * c + 1)) & 0x01010101u) << 4;
      }
      unsigned int sc_c = c < 2 ? sc[0] : sc[1], mn_c = c < 2 ? mn[0] : mn[1];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int j = 2 * c + h;
        float step = fmaf(unit_d, eight_plus_byte(sc_c, j % 4), -8.0f * unit_d);
        float minimum = fmaf(unit_dmin, eight_plus_byte(mn_c, j % 4), -8.0f * unit_dmin);
        float offset = -fmaf(8.0f, step, minimum);
        unsigned int shifted = n[h] << Block::SHIFT;
        float w[4];
        for (int t = 0; t < 4; ++t) w[t] = fmaf(step, eight_plus_byte(shifted, t), offset);
        sink(w, 4, col + 32 * j + 4 * s, 1.0f);
      }
    }
  }
};
typedef KQuantSpread<false, false> Q4_K_Spread;
typedef KQuantSpread<true, false> Q5_K_Spread;
typedef KQuantSpread<false, true> Q4_K_SpreadRows;
typedef KQuantSpread<true, true> Q5_K_SpreadRows;

struct Q6_K {
  static const int ELEMS = 256, BYTES = 210, LANES = 8;
  // Lane t: half h = t / 4 of 128 values; in it, positions p .. p + 15 (p =
  // 16 (t % 2)) of quarters e and e + 2 (e = (t / 2) % 2), whose low four
  // bits are the low and high nibbles of ql[64h + 32e + p ..], whose top two
  // bits are bits 2e and 2e + 4 of qh[32h + p ..], and whose scales are
  // scales[8h + 2e + p / 16] and the one four on. A part is two 16-byte
  // runs (load_16_at2), the two scales and d; its 16 positions of a quarter
  // share a scale: four 16-byte loads of x, or one of 8-bit x.
  struct Raw {
    Bytes16 ql, qh;
    unsigned short d, scales;  // scales: quarter e's (low byte) and e + 2's, signed
  };
  __device__ static int half_of(int t) { return t / 4; }
  __device__ static int pair_of(int t) { return (t / 2) % 2; }
  __device__ static int position_of(int t) { return 16 * (t % 2); }
  __device__ static Raw load(const u8* b, int t) {
    int h = half_of(t), e = pair_of(t), p = position_of(t);
    Raw r;
    r.ql = load_16_at2(b + 64 * h + 32 * e + p);
    r.qh = load_16_at2(b + 128 + 32 * h + p);
    r.d = load_u16(b + 208);
    // Scale bytes 2e + p/16 and 2e + 4 + p/16 of the half's eight: from the
    // 16-bit words at 2e and 2e + 4.
    const u8* scales = b + 192 + 8 * h + 2 * e;
    unsigned int pick = (unsigned int)p / 16;
    r.scales = (unsigned short)__byte_perm(load_u16(scales), load_u16(scales + 4), pick | ((4u + pick) << 4));
    return r;
  }
  // The six-bit quants (0 .. 63, a byte each) of quarter e + 2g at the
  // part's positions 4w .. 4w + 3.
  __device__ __forceinline__ static unsigned int quants(const Raw& r, int e, int g, int w) {
    return ((r.ql.v[w] >> (4 * g)) & 0x0f0f0f0fu) | (((r.qh.v[w] >> (2 * e + 4 * g)) & 0x03030303u) << 4);
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int t, int col, Sink sink) {
    int e = pair_of(t);
    float d = f16_to_f32(r.d);
    int first = col + 128 * half_of(t) + 32 * e + position_of(t);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      float scale = d * signed_quant_f32(r.scales >> (8 * g));
      // Runs of 8 at multiples of 8, as KQuant's.
#pragma unroll
      for (int w = 0; w < 4; w += 2) {
        unsigned int n[2] = {quants(r, e, g, w), quants(r, e, g, w + 1)};
        float v[8];
        for (int j = 0; j < 8; ++j) v[j] = byte_quant_f32<32>(n[j / 4], j % 4);
        sink(v, 8, first + 64 * g + 4 * w, scale);
      }
    }
  }
  // n - 32 in each byte: n + 0x60 stays below 256, and flipping the top bit
  // takes 128 off.
  __device__ static float dot_x8(const Raw& r, int t, const signed char* q, const X8Scale* scale) {
    int h = half_of(t), e = pair_of(t), p = position_of(t);
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      int quarter = e + 2 * g;
      Bytes16 x = *reinterpret_cast<const Bytes16*>(q + 128 * h + 32 * quarter + p);
      int dot = 0;
#pragma unroll
      for (int w = 0; w < 4; ++w) dot = dot4_i8((quants(r, e, g, w) + 0x60606060u) ^ 0x80808080u, x.v[w], dot);
      sum += signed_quant_f32(r.scales >> (8 * g)) * scale[4 * h + quarter].d * int_f32(dot);
    }
    return f16_to_f32(r.d) * sum;
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

// Q6_K blocks as the GEMVs read them against f32 x (FloatX), for
// KQuantSpread's reason: lane t of a block's 8 takes values 4t .. 4t + 3
// of each of the eight quarters of 32 (two halves of four), so a 16-byte
// load of x has the block's lanes read one 128-byte line (Q6_K's parts:
// four lines, every sector half used). Its quants are the words at 4t of
// each half's two runs of ql and of its qh; its scales bytes t / 4 + 2q of
// each half's eight. Blocks of 210 bytes lie at 2-byte boundaries, so
// words come in two 16-bit loads (load_u32): the one-row loop over a block
// goes from 209 to 232 instructions, 21 to 26 of them loads (sm_90 SASS),
// for ~104 lines of L1 a warp's 1,024 weights instead of ~158. ROLLED (the
// kernels for more rows of x, `_SpreadRows`): the loop over the halves
// rolled, 64 registers at 8 rows where unrolled took 182.
template <bool ROLLED>
struct Q6KSpread {
  static const int ELEMS = 256, BYTES = 210, LANES = 8;
  struct Raw {
    unsigned int ql[2][2], qh[2];  // [half][run of ql]
    unsigned int scales[2];        // each half's four (quarter q in byte q), signed
    unsigned short d;
  };
  __device__ static Raw load(const u8* b, int t) {
    Raw r;
    Bytes16 sc = load_16_at2(b + 192);
    unsigned int pick = (unsigned int)t / 4;
    unsigned int select = pick | (pick + 2) << 4 | (pick + 4) << 8 | (pick + 6) << 12;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r.ql[h][0] = load_u32(b + 64 * h + 4 * t);
      r.ql[h][1] = load_u32(b + 64 * h + 32 + 4 * t);
      r.qh[h] = load_u32(b + 128 + 32 * h + 4 * t);
      r.scales[h] = __byte_perm(sc.v[2 * h], sc.v[2 * h + 1], select);
    }
    r.d = load_u16(b + 208);
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int t, int col, Sink sink) {
    float d = f16_to_f32(r.d);
#pragma unroll(ROLLED ? 1 : 2)
    for (int h = 0; h < 2; ++h) {
      // Constant indices (a computed one would put Raw in local memory).
      unsigned int ql[2] = {h == 0 ? r.ql[0][0] : r.ql[1][0], h == 0 ? r.ql[0][1] : r.ql[1][1]};
      unsigned int qh = h == 0 ? r.qh[0] : r.qh[1], scales = h == 0 ? r.scales[0] : r.scales[1];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        unsigned int n = ((ql[q % 2] >> (4 * (q / 2))) & 0x0f0f0f0fu) | (((qh >> (2 * q)) & 0x03030303u) << 4);
        float v[4];
        for (int j = 0; j < 4; ++j) v[j] = byte_quant_f32<32>(n, j);
        sink(v, 4, col + 128 * h + 32 * q + 4 * t, d * signed_quant_f32(scales >> (8 * q)));
      }
    }
  }
};
typedef Q6KSpread<false> Q6_K_Spread;
typedef Q6KSpread<true> Q6_K_SpreadRows;

// IQ4_NL and IQ4_XS (ggml's non-linear 4-bit formats): a 4-bit index n
// stands for the signed byte kvalues_iq4nl[n] (IQ4_VALUES in
// kernels/src/quant/format.rs), held here as four words of table bytes
// (XOR-ed with BIAS: 0x80808080 gives the values biased by 128, the form
// byte_quant_f32<128> turns into floats). The four indices in the low
// nibbles of `select`'s low 16 bits (byte permutes read three bits of each)
// to their table bytes: the low half of the table and the high half each
// permuted by them, then each byte taken from the half its index's top bit
// names. Three byte permutes for four values, where a table in memory would
// be a load per value (and divergent in constant memory).
template <unsigned BIAS>
__device__ __forceinline__ unsigned int iq4_bytes(unsigned int select) {
  const unsigned int low = __byte_perm(0xbfad9881u ^ BIAS, 0xf6eaddcfu ^ BIAS, select);
  const unsigned int high = __byte_perm(0x26190d01u ^ BIAS, 0x71594535u ^ BIAS, select);
  return __byte_perm(low, high, 0x3210u | ((select & 0x8888u) >> 1));
}
// The table bytes of a word of ggml's index bytes (byte j: index j in its
// low nibble, index j + 16 of the run in its high one): `lo` the four low
// nibbles', `hi` the four high nibbles'.
template <unsigned BIAS>
__device__ __forceinline__ void iq4_word(unsigned int q, unsigned int* lo, unsigned int* hi) {
  unsigned int pairs[2] = {iq4_bytes<BIAS>(q), iq4_bytes<BIAS>(q >> 16)};  // lo, hi, lo, hi of bytes 2h, 2h + 1
  *lo = __byte_perm(pairs[0], pairs[1], 0x6420u);
  *hi = __byte_perm(pairs[0], pairs[1], 0x7531u);
}
// The table bytes of four indices, one in each byte's low nibble: the
// nibbles gathered into the low 16 bits first.
template <unsigned BIAS>
__device__ __forceinline__ unsigned int iq4_nibbles(unsigned int n) {
  return iq4_bytes<BIAS>(__byte_perm(n | (n >> 4), 0u, 0x4420u));
}
// Four table bytes biased by 128 as floats (the values' own).
__device__ __forceinline__ void iq4_floats(unsigned int biased, float* w) {
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = byte_quant_f32<128>(biased, j);
}

// IQ4_NL (18 B / 32): an f16 scale d, then 16 bytes of indices laid out
// as Q4_0's quants (low nibbles values 0..15, high 16..31); a value is
// d · table[n].
struct IQ4_NL {
  static const int ELEMS = 32, BYTES = 18, LANES = 4;
  // Lane part s: bytes 4s .. 4s+3 of the indices, values 4s.. and 16+4s..
  // (blocks are 2-byte aligned: 16-bit loads).
  struct Raw {
    unsigned short d;
    unsigned int q;
  };
  __device__ static Raw load(const u8* b, int s) {
    Raw r;
    r.d = load_u16(b);
    r.q = load_u32(b + 2 + 4 * s);
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    unsigned int v[2];
    iq4_word<0x80808080u>(r.q, &v[0], &v[1]);
    float d = f16_to_f32(r.d);
    for (int h = 0; h < 2; ++h) {
      float w[4];
      iq4_floats(v[h], w);
      sink(w, 4, col + 16 * h + 4 * s, d);
    }
  }
  __device__ static float dot_x8(const Raw& r, int s, const signed char* q, const X8Scale* scale) {
    unsigned int lo, hi;
    iq4_word<0u>(r.q, &lo, &hi);
    int sum = dot4_i8(hi, x8_word(q + 16 + 4 * s), dot4_i8(lo, x8_word(q + 4 * s), 0));
    return f16_to_f32(r.d) * scale->d * int_f32(sum);
  }
  __device__ static float value(const u8* b, int j) {
    unsigned int byte = b[2 + j % 16];
    return load_f16(b) * signed_quant_f32(iq4_nibbles<0u>(j < 16 ? byte & 0xfu : byte >> 4));
  }
};

// IQ4_XS (136 B / 256): an f16 d, 16 bits of the scales' top two bits
// (bits 2j, 2j + 1 for sub-block j), 4 bytes of their low nibbles (byte
// j / 2, nibble j % 2), then the 128 bytes of indices: 16 a sub-block of
// 32, laid out as IQ4_NL's. A value of sub-block j is d · (scale_j - 32) ·
// table[n]. Blocks of 136 bytes and rows of whole blocks keep every block at
// an 8-byte boundary: the head (d and the scales) is one 8-byte load.
__device__ __forceinline__ float iq4_xs_scale(unsigned long long head, int j) {
  unsigned int low = (unsigned int)(head >> (32 + 4 * j)) & 0xfu, top = (unsigned int)(head >> (16 + 2 * j)) & 3u;
  return f16_to_f32((f16_bits)(head & 0xffffu)) * quant_f32<32>(low | top << 4);
}
struct IQ4_XS {
  static const int ELEMS = 256, BYTES = 136, LANES = 8;
  // Lane part s: sub-block s (values 32s .. 32s+31, so qmm's stretches of
  // 128 columns take parts 0..3 and 4..7), its 16 bytes in two 8-byte
  // loads, and the head (the same address for the block's 8 lanes).
  struct Raw {
    unsigned long long head, q[2];
  };
  __device__ static Raw load(const u8* b, int s) {
    Raw r;
    r.head = load_streaming_u64(b);
    for (int h = 0; h < 2; ++h) r.q[h] = load_streaming_u64(b + 8 + 16 * s + 8 * h);
    return r;
  }
  // The part's table bytes: lo[w] of values 4w.., hi[w] of 16+4w...
  template <unsigned BIAS>
  __device__ __forceinline__ static void bytes(const Raw& r, unsigned int* lo, unsigned int* hi) {
#pragma unroll
    for (int w = 0; w < 4; ++w) iq4_word<BIAS>((unsigned int)(r.q[w / 2] >> (32 * (w % 2))), &lo[w], &hi[w]);
  }
  // Runs of 8 (two words' values) at multiples of 8: qmm stores each in
  // one 16-byte store.
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int s, int col, Sink sink) {
    unsigned int v[2][4];
    bytes<0x80808080u>(r, v[0], v[1]);
    float scale = iq4_xs_scale(r.head, s);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        float w[8];
        iq4_floats(v[h][2 * p], w);
        iq4_floats(v[h][2 * p + 1], w + 4);
        sink(w, 8, col + 32 * s + 16 * h + 8 * p, scale);
      }
    }
  }
  // The sub-block against x's block of 32 at the same columns (16-byte
  // aligned: rows of 256k quants).
  __device__ static float dot_x8(const Raw& r, int s, const signed char* q, const X8Scale* scale) {
    unsigned int lo[4], hi[4];
    bytes<0u>(r, lo, hi);
    Bytes16 x_lo = *reinterpret_cast<const Bytes16*>(q + 32 * s), x_hi = *reinterpret_cast<const Bytes16*>(q + 32 * s + 16);
    int sum = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) sum = dot4_i8(hi[w], x_hi.v[w], dot4_i8(lo[w], x_lo.v[w], sum));
    return iq4_xs_scale(r.head, s) * scale[s].d * int_f32(sum);
  }
  __device__ static float value(const u8* b, int j) {
    unsigned int byte = b[8 + 16 * (j / 32) + j % 16];
    unsigned long long head = 0;
    for (int i = 0; i < 8; ++i) head |= (unsigned long long)b[i] << (8 * i);
    return iq4_xs_scale(head, j / 32) * signed_quant_f32(iq4_nibbles<0u>(j % 32 < 16 ? byte & 0xfu : byte >> 4));
  }
};

// IQ4_XS blocks as the GEMVs read them against f32 x (FloatX), for
// KQuantSpread's reason: lane t of a block's 8 takes values 4 (t % 4) ..
// +3 of each sub-block's low (t < 4) or high half, the low or high nibbles
// of word t % 4 of its indices, so a 16-byte load of x has the block's
// lanes read one 128-byte line (IQ4_XS's parts: 16 bytes of x a lane, 64
// apart, eight lines a load, every sector half used). The price is eight
// 4-byte loads a part instead of two of 8, and each sub-block's scale
// worked out in every lane.
struct IQ4_XS_Spread {
  static const int ELEMS = 256, BYTES = 136, LANES = 8;
  struct Raw {
    unsigned long long head;
    unsigned int q[8];
  };
  __device__ static Raw load(const u8* b, int t) {
    Raw r;
    r.head = load_streaming_u64(b);
#pragma unroll
    for (int j = 0; j < 8; ++j) r.q[j] = load_streaming_u32(b + 8 + 16 * j + 4 * (t % 4));
    return r;
  }
  template <typename Sink>
  __device__ __forceinline__ static void values(const Raw& r, int t, int col, Sink sink) {
    int shift = 4 * (t / 4), first = col + 16 * (t / 4) + 4 * (t % 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float w[4];
      iq4_floats(iq4_nibbles<0x80808080u>((r.q[j] >> shift) & 0x0f0f0f0fu), w);
      sink(w, 4, first + 32 * j, iq4_xs_scale(r.head, j));
    }
  }
};

// Stores `count` (even) values scale · v[e] at `out` as bf16: runs of four
// (every format's, at columns that are multiples of 4, so 8-byte aligned
// in qmm's shared rows and in dequant's output) one 8-byte store each
// (half the store instructions of two to a 32-bit store), a pair left
// over in a 32-bit one.
struct __align__(8) Bf16x4 {
  unsigned lo, hi;
};
__device__ __forceinline__ void store_bf16_pairs(bf16_bits* out, const float* v, int count, float scale) {
  int e = 0;
  for (; e + 4 <= count; e += 4)
    *reinterpret_cast<Bf16x4*>(out + e) =
        Bf16x4{pack_bf16(scale * v[e], scale * v[e + 1]), pack_bf16(scale * v[e + 2], scale * v[e + 3])};
  if (e < count) *reinterpret_cast<unsigned*>(out + e) = pack_bf16(scale * v[e], scale * v[e + 1]);
}

// A format's run (`values`' sink) stored as bf16: a run of 8 at a 16-byte
// boundary (`aligned16`) in one 16-byte store (a warp's 8-byte stores of
// runs 64 columns apart shared banks in qmm's tile), else store_bf16_pairs.
__device__ __forceinline__ void store_bf16_run(bf16_bits* out, const float* v, int count, float scale,
                                               bool aligned16) {
  if (count == 8 && aligned16) {
    Bytes16 run;
    for (int e = 0; e < 4; ++e) run.v[e] = pack_bf16(scale * v[2 * e], scale * v[2 * e + 1]);
    *reinterpret_cast<Bytes16*>(out) = run;
  } else {
    store_bf16_pairs(out, v, count, scale);
  }
}

// A loaded lane part `s` of a block whose values start at column `col`
// times x, added to acc (X16: x's rows 16-byte aligned, as `accumulate`).
template <typename F, int MAX_M, bool X16 = false>
__device__ __forceinline__ void dot_raw(const typename F::Raw& r, int s, const float* x, int m, int k, int col,
                                        float* acc) {
  F::values(r, s, col, [=](const float* w, int count, int column, float scale) {
    accumulate<MAX_M, X16>(acc, w, count, x, m, k, column, scale);
  });
}

// x of the GGUF GEMVs (gemv.cuh's, beside its 8-bit Int8X) and of the
// experts' rows (moe.cu): f32 rows, each weight decoded to a float (exact
// precision).
struct FloatX {
  const float* x;
  // Whether every row of x starts at a 16-byte boundary (parts' runs of 4
  // weights then lie at one too: GGUF columns come in multiples of 4).
  __device__ bool rows_aligned(int k) const {
    return (reinterpret_cast<unsigned long long>(x) & 15) == 0 && k % 4 == 0;
  }
  template <typename F, int MAX_M, bool X16>
  __device__ __forceinline__ void dot(const typename F::Raw& raw, int part, int m, int k, int col,
                                      float* acc) const {
    dot_raw<F, MAX_M, X16>(raw, part, x, m, k, col, acc);
  }
};

// Blocks of F a lane loads the parts of before it uses the first: a warp's
// round is 2.3 KB of Q4_K (3.4 KB of Q6_K, 1.2 KB of Q4_0 and 2.2 KB of
// Q8_0, whose blocks of 32 take twice the depth). A block at a time (the
// one-warp-per-row GEMVs and the experts' rows until 2026-11-30), a warp's
// round was 576 bytes of Q4_K: at the ~40 warps an H200's SM held, ~23 KB
// in flight an SM, where its 4.16 TB/s at a microsecond's latency asks
// ~31 KB.
template <typename F>
__device__ __forceinline__ constexpr int blocks_depth() {
  return F::ELEMS == 32 ? 8 : 4;
}

// The blocks `first`, `first + stride`, ... of row `wr` times x, added to
// acc, DEPTH blocks' loads at a time (X16: as `accumulate`).
template <typename F, typename X, int MAX_M, int DEPTH, bool X16>
__device__ __forceinline__ void blocks_sweep(const u8* wr, X x, int m, int k, int first, int stride, float* acc) {
  int blocks = k / F::ELEMS, part = threadIdx.x % F::LANES;
  for (int blk = first; blk < blocks; blk += DEPTH * stride) {
    typename F::Raw raw[DEPTH];
#pragma unroll
    for (int u = 0; u < DEPTH; ++u)
      if (blk + u * stride < blocks) raw[u] = F::load(wr + (i64)(blk + u * stride) * F::BYTES, part);
#pragma unroll
    for (int u = 0; u < DEPTH; ++u)
      if (blk + u * stride < blocks)
        x.template dot<F, MAX_M, X16>(raw[u], part, m, k, (blk + u * stride) * F::ELEMS, acc);
  }
}

// The warp's dot product of row `row` of a matrix of F blocks `w [*, k]`
// with `x [k]` (every lane gets the sum): each lane takes its part of every
// (32 / LANES)-th block, blocks_depth at a time.
template <typename F>
__device__ __forceinline__ float blocks_row_dot(const u8* w, int row, const float* x, int k) {
  const int depth = blocks_depth<F>(), stride = 32 / F::LANES;
  int first = (int)(threadIdx.x % 32) / F::LANES;
  const u8* wr = w + (i64)row * (k / F::ELEMS) * F::BYTES;
  float acc[1] = {0.0f};
  FloatX xs{x};
  if (xs.rows_aligned(k))
    blocks_sweep<F, FloatX, 1, depth, true>(wr, xs, 1, k, first, stride, acc);
  else
    blocks_sweep<F, FloatX, 1, depth, false>(wr, xs, 1, k, first, stride, acc);
  return warp_sum(acc[0]);
}
