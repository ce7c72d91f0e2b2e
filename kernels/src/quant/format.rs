//! The GGUF block formats: sizes, type ids, and the one place that knows each
//! block's byte layout (`unpack`), from which dequantization and the portable
//! dot products are derived.

use std::fmt;

use half::f16;

use super::QuantError;

/// Elements in a K-quant super-block.
pub(crate) const QK_K: usize = 256;
/// Elements in a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 block.
pub(crate) const QK: usize = 32;

/// A GGUF (ggml) quantized block format.
///
/// Every format stores a row as consecutive blocks of [`block_elems`] values in
/// [`block_bytes`] bytes, with ggml's exact little-endian layout.
///
/// [`block_elems`]: QuantType::block_elems
/// [`block_bytes`]: QuantType::block_bytes
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// 32 values: f16 scale, 4-bit signed quants (offset 8).
    Q4_0,
    /// 32 values: f16 scale and minimum, 4-bit unsigned quants.
    Q4_1,
    /// 32 values: f16 scale, 5-bit signed quants (offset 16).
    Q5_0,
    /// 32 values: f16 scale and minimum, 5-bit unsigned quants.
    Q5_1,
    /// 32 values: f16 scale, 8-bit signed quants.
    Q8_0,
    /// 256 values: 16 sub-blocks of 16 with 4-bit scales and minimums, 2-bit quants.
    Q2K,
    /// 256 values: 16 sub-blocks of 16 with 6-bit scales, 3-bit signed quants.
    Q3K,
    /// 256 values: 8 sub-blocks of 32 with 6-bit scales and minimums, 4-bit quants.
    Q4K,
    /// 256 values: 8 sub-blocks of 32 with 6-bit scales and minimums, 5-bit quants.
    Q5K,
    /// 256 values: 16 sub-blocks of 16 with 8-bit scales, 6-bit signed quants.
    Q6K,
    /// 32 values: f16 scale, 4-bit indices into a fixed table of 16 non-uniform
    /// values ([`IQ4_VALUES`]).
    IQ4NL,
    /// 256 values: 8 sub-blocks of 32 with 6-bit scales, 4-bit indices into
    /// [`IQ4_VALUES`].
    IQ4XS,
}

/// The 16 values a 4-bit IQ4_NL or IQ4_XS index stands for (ggml's
/// `kvalues_iq4nl`), before the block's scale.
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

impl QuantType {
    /// Every supported format.
    pub const ALL: [QuantType; 12] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q2K,
        QuantType::Q3K,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::IQ4NL,
        QuantType::IQ4XS,
    ];

    /// Values per block: 32, or 256 for the K-quants.
    pub const fn block_elems(self) -> usize {
        match self {
            QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0
            | QuantType::IQ4NL => QK,
            QuantType::Q2K
            | QuantType::Q3K
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
            | QuantType::IQ4XS => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => 2 + QK / 2,
            QuantType::Q4_1 => 4 + QK / 2,
            QuantType::Q5_0 => 2 + 4 + QK / 2,
            QuantType::Q5_1 => 4 + 4 + QK / 2,
            QuantType::Q8_0 => 2 + QK,
            QuantType::Q2K => QK_K / 16 + QK_K / 4 + 4,
            QuantType::Q3K => QK_K / 8 + QK_K / 4 + 12 + 2,
            QuantType::Q4K => 4 + 12 + QK_K / 2,
            QuantType::Q5K => 4 + 12 + QK_K / 8 + QK_K / 2,
            QuantType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            QuantType::IQ4NL => 2 + QK / 2,
            QuantType::IQ4XS => 2 + 2 + QK_K / 64 + QK_K / 2,
        }
    }

    /// The `ggml_type` number that GGUF files store for this format.
    pub const fn gguf_type_id(self) -> u32 {
        match self {
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q5_1 => 7,
            QuantType::Q8_0 => 8,
            QuantType::Q2K => 10,
            QuantType::Q3K => 11,
            QuantType::Q4K => 12,
            QuantType::Q5K => 13,
            QuantType::Q6K => 14,
            QuantType::IQ4NL => 20,
            QuantType::IQ4XS => 23,
        }
    }

    /// The format with GGUF type id `id`.
    pub fn from_gguf_type_id(id: u32) -> Result<Self, QuantError> {
        Self::ALL
            .into_iter()
            .find(|ty| ty.gguf_type_id() == id)
            .ok_or(QuantError::UnsupportedTypeId(id))
    }

    /// The name ggml and GGUF use (`"Q4_K"`).
    pub const fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q2K => "Q2_K",
            QuantType::Q3K => "Q3_K",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
            QuantType::IQ4NL => "IQ4_NL",
            QuantType::IQ4XS => "IQ4_XS",
        }
    }

    /// Byte offsets in a block of its f16 fields: the scale, and the minimum's
    /// scale where there is one. The other bytes may hold anything (which
    /// is how tests and benchmarks make random blocks that decode to finite
    /// values).
    pub const fn f16_fields(self) -> &'static [usize] {
        match self {
            QuantType::Q4_0
            | QuantType::Q5_0
            | QuantType::Q8_0
            | QuantType::IQ4NL
            | QuantType::IQ4XS => &[0],
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
            QuantType::Q2K => &[80, 82],
            QuantType::Q3K => &[108],
            QuantType::Q6K => &[208],
        }
    }

    /// Whether this is a 256-value format (a K-quant or IQ4_XS), whose fast
    /// dot products use Q8_K activations rather than Q8_0-style blocks of 32.
    pub const fn is_k_quant(self) -> bool {
        self.block_elems() == QK_K
    }

    /// Bytes taken by a row of `cols` values; `cols` must be a multiple of
    /// [`block_elems`](QuantType::block_elems).
    pub fn row_bytes(self, cols: usize) -> Result<usize, QuantError> {
        let elems = self.block_elems();
        if !cols.is_multiple_of(elems) {
            return Err(QuantError::UnalignedCols { ty: self, cols });
        }
        (cols / elems)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::TooLarge)
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A format known at compile time, so that kernels specialize on it (block
/// sizes become constants, format branches disappear).
pub(crate) trait Format {
    const TY: QuantType;
    /// Bytes per block.
    const BYTES: usize = Self::TY.block_bytes();
    /// Values per block.
    const ELEMS: usize = Self::TY.block_elems();
}

/// Zero-sized [`Format`] markers, one per [`QuantType`].
pub(crate) mod marker {
    use super::{Format, QuantType};

    macro_rules! markers {
        ($($name:ident),*) => {$(
            pub(crate) struct $name;
            impl Format for $name {
                const TY: QuantType = QuantType::$name;
            }
        )*};
    }
    markers!(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K, IQ4NL, IQ4XS);
}

/// One block unpacked to integers: `value[i] = scale[s] * q[i] - offset[s]`
/// with `s = i / SUB`, computed in f32 exactly in that order (which is what
/// ggml and gguf-py compute, so dequantization is bit-exact).
pub(crate) struct Unpacked {
    /// Quants in element order (only the block's first `block_elems` are used).
    pub q: [i8; QK_K],
    /// Per sub-block scale.
    pub scale: [f32; 16],
    /// Per sub-block offset (a minimum's negation for Q4_1/Q5_1).
    pub offset: [f32; 16],
}

impl Default for Unpacked {
    fn default() -> Self {
        Self {
            q: [0; QK_K],
            scale: [0.0; 16],
            offset: [0.0; 16],
        }
    }
}

/// Reads the little-endian f16 at `at`.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The 8 six-bit scales (bytes 0..8) and 8 six-bit minimums (bytes 8..16)
/// packed in the 12 bytes of a Q4_K/Q5_K block, unpacked with ggml's word
/// arithmetic (the SIMD kernels' form of `get_scale_min_k4`).
#[inline]
pub(crate) fn k4_scales_mins_words(packed: &[u8]) -> [u32; 4] {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| {
        u32::from_le_bytes([
            packed[4 * i],
            packed[4 * i + 1],
            packed[4 * i + 2],
            packed[4 * i + 3],
        ])
    };
    let (w0, w1, w2) = (word(0), word(1), word(2));
    [
        w0 & LOW6,
        (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4),
        w1 & LOW6,
        ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4),
    ]
}

/// The 8 scales and 8 minimums of a Q4_K/Q5_K block.
#[inline]
pub(crate) fn k4_scales_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let w = k4_scales_mins_words(packed);
    let bytes = |a: u32, b: u32| {
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    };
    (bytes(w[0], w[1]), bytes(w[2], w[3]))
}

/// The 8 six-bit scales of an IQ4_XS block (`b`: the whole block), already
/// offset by -32: sub-block `j` takes its low four bits from nibble `j` of
/// the four bytes at 4 and its top two from bits `2·j` of the word at 2.
#[inline]
pub(crate) fn iq4xs_scales(b: &[u8]) -> [i8; 8] {
    let high = u16::from_le_bytes([b[2], b[3]]);
    std::array::from_fn(|j| {
        let low = (b[4 + j / 2] >> (4 * (j % 2))) & 0xF;
        let top = ((high >> (2 * j)) & 3) as u8;
        (low | (top << 4)) as i8 - 32
    })
}

/// The 16 six-bit scales of a Q3_K block (not yet offset by -32), four a
/// little-endian word, unpacked with ggml's word arithmetic (the SIMD
/// kernels' form of [`q3k_scales`]): scale `j` takes its low four bits
/// from nibble `j / 8` of byte `j % 8`, its top two from bits `2·(j / 4)`
/// of byte `8 + j % 4`.
#[inline]
pub(crate) fn q3k_scales_words(packed: &[u8]) -> [u32; 4] {
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().unwrap());
    let (w0, w1, w2) = (word(0), word(1), word(2));
    [
        (w0 & LOW4) | ((w2 & LOW2) << 4),
        (w1 & LOW4) | (((w2 >> 2) & LOW2) << 4),
        ((w0 >> 4) & LOW4) | (((w2 >> 4) & LOW2) << 4),
        ((w1 >> 4) & LOW4) | (((w2 >> 6) & LOW2) << 4),
    ]
}

/// The 16 signed six-bit scales of a Q3_K block (already offset by -32).
#[inline]
pub(crate) fn q3k_scales(packed: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, s) in out.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 0xF
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *s = (low | (high << 4)) as i8 - 32;
    }
    out
}

impl QuantType {
    /// Whether the 32-value format stores a minimum per block (Q4_1, Q5_1)
    /// rather than subtracting a fixed offset from its quants.
    pub(crate) const fn has_min(self) -> bool {
        matches!(self, QuantType::Q4_1 | QuantType::Q5_1)
    }

    /// Sub-block length: the run of values sharing one scale and offset.
    pub(crate) const fn sub_block(self) -> usize {
        match self {
            QuantType::Q2K | QuantType::Q3K | QuantType::Q6K => 16,
            _ => 32,
        }
    }

    /// Unpacks one block of exactly [`block_bytes`](Self::block_bytes) bytes,
    /// overwriting the block's quants, scales and offsets in `u`.
    #[inline]
    pub(crate) fn unpack(self, b: &[u8], u: &mut Unpacked) {
        debug_assert_eq!(b.len(), self.block_bytes());
        match self {
            QuantType::Q4_0 | QuantType::Q4_1 => {
                let (qs, signed) = if self == QuantType::Q4_0 {
                    u.scale[0] = f16_at(b, 0);
                    u.offset[0] = 0.0;
                    (&b[2..18], true)
                } else {
                    u.scale[0] = f16_at(b, 0);
                    u.offset[0] = -f16_at(b, 2);
                    (&b[4..20], false)
                };
                let bias = if signed { 8 } else { 0 };
                for (j, &byte) in qs.iter().enumerate() {
                    u.q[j] = (byte & 0xF) as i8 - bias;
                    u.q[j + 16] = (byte >> 4) as i8 - bias;
                }
            }
            QuantType::Q5_0 | QuantType::Q5_1 => {
                let (qh, qs, bias) = if self == QuantType::Q5_0 {
                    u.scale[0] = f16_at(b, 0);
                    u.offset[0] = 0.0;
                    (&b[2..6], &b[6..22], 16)
                } else {
                    u.scale[0] = f16_at(b, 0);
                    u.offset[0] = -f16_at(b, 2);
                    (&b[4..8], &b[8..24], 0)
                };
                let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
                for (j, &byte) in qs.iter().enumerate() {
                    let h0 = ((qh >> j) & 1) as u8;
                    let h1 = ((qh >> (j + 16)) & 1) as u8;
                    u.q[j] = ((byte & 0xF) | (h0 << 4)) as i8 - bias;
                    u.q[j + 16] = ((byte >> 4) | (h1 << 4)) as i8 - bias;
                }
            }
            QuantType::Q8_0 => {
                u.scale[0] = f16_at(b, 0);
                u.offset[0] = 0.0;
                for (q, &byte) in u.q.iter_mut().zip(&b[2..34]) {
                    *q = byte as i8;
                }
            }
            QuantType::Q2K => {
                let (scales, qs) = (&b[0..16], &b[16..80]);
                let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
                for (j, &sc) in scales.iter().enumerate() {
                    u.scale[j] = d * f32::from(sc & 0xF);
                    u.offset[j] = dmin * f32::from(sc >> 4);
                }
                // Each 32-byte half of `qs` holds 128 values as four 2-bit planes.
                for (half, q32) in qs.chunks_exact(32).enumerate() {
                    for plane in 0..4 {
                        for (l, &byte) in q32.iter().enumerate() {
                            u.q[half * 128 + plane * 32 + l] = ((byte >> (2 * plane)) & 3) as i8;
                        }
                    }
                }
            }
            QuantType::Q3K => {
                let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
                let d = f16_at(b, 108);
                for (j, &sc) in q3k_scales(scales).iter().enumerate() {
                    u.scale[j] = d * f32::from(sc);
                    u.offset[j] = 0.0;
                }
                for (half, q32) in qs.chunks_exact(32).enumerate() {
                    for plane in 0..4 {
                        let bit = 1u8 << (half * 4 + plane);
                        for (l, &byte) in q32.iter().enumerate() {
                            let low = ((byte >> (2 * plane)) & 3) as i8;
                            let high = if hmask[l] & bit != 0 { 0 } else { 4 };
                            u.q[half * 128 + plane * 32 + l] = low - high;
                        }
                    }
                }
            }
            QuantType::Q4K | QuantType::Q5K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (sc, mn) = k4_scales_mins(&b[4..16]);
                for j in 0..8 {
                    u.scale[j] = d * f32::from(sc[j]);
                    u.offset[j] = dmin * f32::from(mn[j]);
                }
                let (qh, qs) = if self == QuantType::Q4K {
                    (None, &b[16..144])
                } else {
                    (Some(&b[16..48]), &b[48..176])
                };
                // Each 32 bytes of `qs` hold two sub-blocks: low then high nibbles.
                for (pair, q32) in qs.chunks_exact(32).enumerate() {
                    for (l, &byte) in q32.iter().enumerate() {
                        let (mut lo, mut hi) = (byte & 0xF, byte >> 4);
                        if let Some(qh) = qh {
                            lo |= ((qh[l] >> (2 * pair)) & 1) << 4;
                            hi |= ((qh[l] >> (2 * pair + 1)) & 1) << 4;
                        }
                        u.q[pair * 64 + l] = lo as i8;
                        u.q[pair * 64 + 32 + l] = hi as i8;
                    }
                }
            }
            QuantType::IQ4NL | QuantType::IQ4XS => {
                let d = f16_at(b, 0);
                let qs = if self == QuantType::IQ4NL {
                    u.scale[0] = d;
                    u.offset[0] = 0.0;
                    &b[2..18]
                } else {
                    for (j, &sc) in iq4xs_scales(b).iter().enumerate() {
                        u.scale[j] = d * f32::from(sc);
                        u.offset[j] = 0.0;
                    }
                    &b[8..136]
                };
                // Each 16 bytes hold a sub-block of 32: low then high nibbles.
                for (s, q16) in qs.chunks_exact(16).enumerate() {
                    for (l, &byte) in q16.iter().enumerate() {
                        u.q[32 * s + l] = IQ4_VALUES[usize::from(byte & 0xF)];
                        u.q[32 * s + 16 + l] = IQ4_VALUES[usize::from(byte >> 4)];
                    }
                }
            }
            QuantType::Q6K => {
                let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for (j, &sc) in scales.iter().enumerate() {
                    u.scale[j] = d * f32::from(sc as i8);
                    u.offset[j] = 0.0;
                }
                for half in 0..2 {
                    let (ql, qh) = (&ql[half * 64..], &qh[half * 32..]);
                    let q = &mut u.q[half * 128..];
                    for l in 0..32 {
                        let h = qh[l];
                        q[l] = ((ql[l] & 0xF) | ((h & 3) << 4)) as i8 - 32;
                        q[l + 32] = ((ql[l + 32] & 0xF) | (((h >> 2) & 3) << 4)) as i8 - 32;
                        q[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
                        q[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
                    }
                }
            }
        }
    }

    /// Dequantizes one block into `out` (`block_elems` values).
    #[inline]
    pub(crate) fn dequantize_block(self, block: &[u8], u: &mut Unpacked, out: &mut [f32]) {
        self.unpack(block, u);
        let sub = self.sub_block();
        for (i, v) in out.iter_mut().enumerate() {
            *v = u.scale[i / sub] * f32::from(u.q[i]) - u.offset[i / sub];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_ggml() {
        let expected = [
            (QuantType::Q4_0, 32, 18),
            (QuantType::Q4_1, 32, 20),
            (QuantType::Q5_0, 32, 22),
            (QuantType::Q5_1, 32, 24),
            (QuantType::Q8_0, 32, 34),
            (QuantType::Q2K, 256, 84),
            (QuantType::Q3K, 256, 110),
            (QuantType::Q4K, 256, 144),
            (QuantType::Q5K, 256, 176),
            (QuantType::Q6K, 256, 210),
            (QuantType::IQ4NL, 32, 18),
            (QuantType::IQ4XS, 256, 136),
        ];
        for (ty, elems, bytes) in expected {
            assert_eq!((ty.block_elems(), ty.block_bytes()), (elems, bytes), "{ty}");
        }
    }

    #[test]
    fn type_ids_round_trip() {
        for ty in QuantType::ALL {
            assert_eq!(QuantType::from_gguf_type_id(ty.gguf_type_id()).unwrap(), ty);
        }
        for id in [0, 1, 9, 15, 16, 30, u32::MAX] {
            assert!(QuantType::from_gguf_type_id(id).is_err(), "{id}");
        }
    }

    #[test]
    fn row_bytes_checks_alignment() {
        assert_eq!(QuantType::Q4_0.row_bytes(64).unwrap(), 36);
        assert_eq!(QuantType::Q6K.row_bytes(512).unwrap(), 420);
        assert!(QuantType::Q4K.row_bytes(32).is_err());
        assert!(QuantType::Q8_0.row_bytes(usize::MAX - 31).is_err());
    }

    #[test]
    fn q3k_scale_words_follow_the_scales() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100 {
            let packed: [u8; 12] = std::array::from_fn(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            });
            let words = q3k_scales_words(&packed).map(u32::to_le_bytes).concat();
            let from_words: Vec<i8> = words.iter().map(|&b| b as i8 - 32).collect();
            assert_eq!(from_words, q3k_scales(&packed));
        }
    }

    #[test]
    fn k4_scales_follow_ggml() {
        // ggml's get_scale_min_k4 written out for j = 1 and j = 5.
        let p: [u8; 12] = [
            0xC1, 0x82, 0x43, 0x04, 0xE5, 0xA6, 0x67, 0x28, 0x9A, 0xBC, 0xDE, 0xF0,
        ];
        let (sc, mn) = k4_scales_mins(&p);
        assert_eq!((sc[1], mn[1]), (p[1] & 63, p[5] & 63));
        assert_eq!(sc[5], (p[9] & 0xF) | ((p[1] >> 6) << 4));
        assert_eq!(mn[5], (p[9] >> 4) | ((p[5] >> 6) << 4));
    }
}
