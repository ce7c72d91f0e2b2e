//! AMX int8 products for the fast kernels of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
//! and IQ4_NL over 16 activation rows or more (prefill); Q4_K and Q6_K in
//! `k_quants`.
//!
//! One `tdpbssd`/`tdpbsud` multiplies 16 activation rows (the A tile, read
//! straight from the quantized rows) by 16 weight rows (the B tile) over
//! one block of 32 values: 256 exact integer block sums, a row of them per
//! activation row with a lane per weight row. The AVX-512 code then scales
//! them into the running sums exactly as the `fast` kernels do (see that
//! module: same integer sums, same products of scales, same FMAs in the
//! same order), so a product has the same bits with or without AMX. While
//! it scales one block, the tile unit computes the next.
//!
//! A task first decodes a tile of its weight rows ([`decode_weights`]): the
//! quants minus their offset as bytes (signed for Q4_0, Q5_0, Q8_0 and IQ4_NL,
//! unsigned 0..16 or 0..32 for Q4_1 and Q5_1), laid out as B tiles (per 16
//! rows and block, 8 rows of 16 weight rows × 4 bytes), and the rows'
//! scales by groups of 16.
//!
//! The tiles are AMX state of the thread: the products configure them at
//! their start and release them at their end (`Tiles`). Linux grants a
//! process that state on request ([`available`]).
//!
//! Safety: as the parent module's kernels, and AMX-TILE and AMX-INT8 with
//! the state granted ([`available`]).

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use super::super::aligned::{grow, Aligned};
use super::super::format::{f16_at, Format};
use super::fast::{BlockQ8x2, LANES};
use super::{load_pair, nibble_index, quant_offset, unsigned_quants};

mod k_quants;
pub(crate) use k_quants::{decode_q4k, decode_q6k, multiply_q4k, multiply_q6k};

/// Values in a block.
const BLOCK: usize = 32;

/// Bytes of a B tile row: 16 weight rows × 4 values.
const TILE_ROW: usize = 64;

/// Set (to anything) to keep the AMX kernels off: the AVX-512 ones then
/// compute the same bits, more slowly.
pub(crate) const DISABLE_ENV: &str = "KILN_NO_AMX";

/// Whether this CPU has AMX int8 tiles, the OS granted this process their
/// state (asked once) and [`DISABLE_ENV`] is not set.
pub(crate) fn available() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| {
        // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
        let edx = __cpuid_count(7, 0).edx;
        let has = __get_cpuid_max(0).0 >= 7 && edx >> 24 & 1 == 1 && edx >> 25 & 1 == 1;
        has && std::env::var_os(DISABLE_ENV).is_none() && request_tile_state()
    })
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`); whether it was granted.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: this request only extends the state the process may use.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// A tile of weight rows decoded for the B tiles, rows padded to a
/// multiple of 16 (the buffers are reused: past the rows decoded last they
/// hold stale values, which only reach their own, dropped, lanes).
#[derive(Default)]
pub(crate) struct Int8Weights {
    /// The B tiles, in the order the products read them.
    pub(super) q: Aligned,
    /// 16 weight rows decoded row by row, before [`transpose_rows`] lays
    /// them out as B tiles (two such buffers for the K-quants).
    pub(super) rows: Vec<u8>,
    /// Per group of 16 rows and block (super-block for the K-quants), the
    /// rows' scales.
    pub(super) d: Vec<[f32; LANES]>,
    /// The same for the rows' minimums (minimum scales for Q4_K).
    pub(super) m: Vec<[f32; LANES]>,
    /// Q4_K: per group and super-block, the rows' eight sub-block minimums,
    /// each twice as a pair of 16-bit integers (`vpdpwssd`'s layout).
    min_pairs: Vec<[u32; LANES]>,
    /// IQ4_XS: per group, super-block and sub-block, the rows' scales less
    /// 32 (`vnni::decode_iq4xs`).
    pub(super) sub_scales: Vec<[i32; LANES]>,
    pub(super) cols: usize,
}

/// Transposes 16 rows of 16 32-bit values: `out[e]` lane `j` = `rows[j]`
/// lane `e`. Applied to 64 bytes of 16 weight rows, it gives the 16 rows
/// of a B tile (16 weight rows × 4 bytes each).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn transpose_16x16(rows: &[__m512i; LANES]) -> [__m512i; LANES] {
    // Rows 4q..4q + 4 interleaved: `u[4q + e]` holds their value e of each
    // 128-bit lane L (values e + 4L).
    let mut u = [_mm512_setzero_si512(); LANES];
    for q in 0..4 {
        let r = &rows[4 * q..4 * q + 4];
        let (ab_lo, ab_hi) = (
            _mm512_unpacklo_epi32(r[0], r[1]),
            _mm512_unpackhi_epi32(r[0], r[1]),
        );
        let (cd_lo, cd_hi) = (
            _mm512_unpacklo_epi32(r[2], r[3]),
            _mm512_unpackhi_epi32(r[2], r[3]),
        );
        u[4 * q] = _mm512_unpacklo_epi64(ab_lo, cd_lo);
        u[4 * q + 1] = _mm512_unpackhi_epi64(ab_lo, cd_lo);
        u[4 * q + 2] = _mm512_unpacklo_epi64(ab_hi, cd_hi);
        u[4 * q + 3] = _mm512_unpackhi_epi64(ab_hi, cd_hi);
    }
    // Then the 128-bit lanes gathered: value e + 4L of all 16 rows.
    let mut out = [_mm512_setzero_si512(); LANES];
    for e in 0..4 {
        let v_lo = _mm512_shuffle_i32x4::<0x44>(u[e], u[4 + e]);
        let v_hi = _mm512_shuffle_i32x4::<0xEE>(u[e], u[4 + e]);
        let w_lo = _mm512_shuffle_i32x4::<0x44>(u[8 + e], u[12 + e]);
        let w_hi = _mm512_shuffle_i32x4::<0xEE>(u[8 + e], u[12 + e]);
        out[e] = _mm512_shuffle_i32x4::<0x88>(v_lo, w_lo);
        out[4 + e] = _mm512_shuffle_i32x4::<0xDD>(v_lo, w_lo);
        out[8 + e] = _mm512_shuffle_i32x4::<0x88>(v_hi, w_hi);
        out[12 + e] = _mm512_shuffle_i32x4::<0xDD>(v_hi, w_hi);
    }
    out
}

/// Lays out 16 weight rows (`rows`, `cols` bytes each) as B tiles: the 16
/// rows' bytes `64c..64c + 64` become the 16 tile rows (1 KiB) that
/// `place(c)` says where to put in `out`. A last chunk of 32 bytes gives 8
/// tile rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn transpose_rows(
    rows: &[u8],
    cols: usize,
    out: &mut [u8],
    place: impl Fn(usize) -> usize,
) {
    for c in 0..cols.div_ceil(TILE_ROW) {
        let bytes = (cols - c * TILE_ROW).min(TILE_ROW);
        let mask = if bytes == TILE_ROW {
            u64::MAX
        } else {
            (1 << bytes) - 1
        };
        let mut v = [_mm512_setzero_si512(); LANES];
        for (j, v) in v.iter_mut().enumerate() {
            let row = &rows[j * cols + c * TILE_ROW..][..bytes];
            // SAFETY: the mask keeps the load inside `row`.
            *v = _mm512_maskz_loadu_epi8(mask, row.as_ptr().cast());
        }
        let out = &mut out[place(c)..][..bytes / 4 * TILE_ROW];
        for (e, v) in transpose_16x16(&v).iter().take(bytes / 4).enumerate() {
            _mm512_storeu_si512(out[e * TILE_ROW..].as_mut_ptr().cast(), *v);
        }
    }
}

/// Decodes the whole rows in `w` (of `cols` values each) into `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_weights<F: Format>(w: &[u8], cols: usize, out: &mut Int8Weights) {
    let blocks = cols / BLOCK;
    let row_bytes = blocks * F::BYTES;
    let rows = w.len() / row_bytes.max(1);
    let groups = rows.div_ceil(LANES);
    out.cols = cols;
    out.q.bytes(groups * blocks * BLOCK * LANES);
    grow(&mut out.rows, LANES * cols, 0);
    grow(&mut out.d, groups * blocks, [0.0; LANES]);
    grow(&mut out.m, groups * blocks, [0.0; LANES]);
    let nibbles = nibble_index::<F>();
    let offset = _mm512_set1_epi8(quant_offset(F::TY) as u8 as i8);
    for (g, group) in w.chunks(LANES * row_bytes).enumerate() {
        for (j, row) in group.chunks_exact(row_bytes).enumerate() {
            let q = &mut out.rows[j * cols..(j + 1) * cols];
            for (p, b) in row.chunks(2 * F::BYTES).enumerate() {
                let v = unsigned_quants::<F>(b, load_pair::<F>(b), nibbles);
                let v = _mm512_sub_epi8(v, offset);
                let q = &mut q[2 * p * BLOCK..];
                let mask = if q.len() >= 2 * BLOCK {
                    u64::MAX
                } else {
                    u64::from(u32::MAX)
                };
                // SAFETY: the mask keeps the store inside `q` (64 bytes, or
                // the 32 of an odd last block).
                _mm512_mask_storeu_epi8(q.as_mut_ptr().cast(), mask, v);
            }
            for (b, block) in row.chunks_exact(F::BYTES).enumerate() {
                out.d[g * blocks + b][j] = f16_at(block, 0);
                if F::TY.has_min() {
                    out.m[g * blocks + b][j] = f16_at(block, 2);
                }
            }
        }
        // Block b's tile (8 rows) at (g · blocks + b) · 512: a chunk of 64
        // bytes holds two blocks, whose tiles are consecutive.
        let group_q =
            &mut out.q.bytes((g + 1) * blocks * BLOCK * LANES)[g * blocks * BLOCK * LANES..];
        transpose_rows(&out.rows, cols, group_q, |c| c * 2 * BLOCK * LANES);
    }
}

/// The tile shapes, from tmm0 on: (rows, bytes a row).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(shapes: &[(u8, u16)]) -> Self {
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        for (t, &(rows, bytes)) in shapes.iter().enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&bytes.to_le_bytes());
            c[48 + t] = rows;
        }
        Self(c)
    }
}

/// The tiles configured on this thread until dropped, which releases them.
struct Tiles;

impl Tiles {
    /// # Safety
    /// Only where [`available`] (the CPU has AMX and the OS granted its
    /// state).
    unsafe fn configure(shapes: &[(u8, u16)]) -> Self {
        let config = TileConfig::new(shapes);
        // SAFETY: AMX is available (the caller's contract); the
        // configuration is a valid palette-1 one.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config.0.as_ptr(), options(nostack)) };
        Self
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a `Tiles` exists only after `configure`, so AMX is
        // available.
        unsafe { asm!("tilerelease", options(nostack)) };
    }
}

/// A C tile's sums, stored: row `i` (an activation row) has a lane per
/// weight row.
#[repr(C, align(64))]
struct Sums([i32; LANES * LANES]);

impl Sums {
    const ZERO: Self = Self([0; LANES * LANES]);

    /// Activation row `i`'s sums.
    #[inline(always)]
    unsafe fn row(&self, i: usize) -> __m512i {
        _mm512_load_si512(self.0[LANES * i..].as_ptr().cast())
    }
}

/// Starts the block sums of 16 activation rows (A tile at `a`, rows
/// `stride` bytes apart) times 16 weight rows (B tile at `b`) on tile set
/// `SET` (tmm0–2 or tmm3–5); [`store_sums`] stores them. `SIGNED`: signed
/// weights (`tdpbssd`), else unsigned (`tdpbsud`).
#[inline(always)]
unsafe fn block_sums<const SIGNED: bool, const SET: usize>(
    a: *const i8,
    stride: usize,
    b: *const u8,
) {
    // SAFETY (caller): tiles configured (`Tiles`); `a` has 16 rows of 32
    // bytes at `stride`, `b` the B tile's 8 rows of 64 bytes.
    macro_rules! product {
        ($op:literal, $a:literal, $b:literal, $c:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{a} + {stride} * 1]"),
                concat!("tileloadd ", $b, ", [{b} + {row} * 1]"),
                concat!("tilezero ", $c),
                concat!($op, " ", $c, ", ", $a, ", ", $b),
                a = in(reg) a,
                stride = in(reg) stride,
                b = in(reg) b,
                row = in(reg) TILE_ROW,
                options(nostack),
            )
        };
    }
    match (SIGNED, SET) {
        (true, 0) => product!("tdpbssd", "tmm0", "tmm1", "tmm2"),
        (true, _) => product!("tdpbssd", "tmm3", "tmm4", "tmm5"),
        (false, 0) => product!("tdpbsud", "tmm0", "tmm1", "tmm2"),
        (false, _) => product!("tdpbsud", "tmm3", "tmm4", "tmm5"),
    }
}

/// Stores the sums of tile set `SET` into `c`.
#[inline(always)]
unsafe fn store_sums<const SET: usize>(c: &mut Sums) {
    macro_rules! store {
        ($c:literal) => {
            asm!(
                concat!("tilestored [{c} + {row} * 1], ", $c),
                c = in(reg) c.0.as_mut_ptr(),
                row = in(reg) TILE_ROW,
                options(nostack),
            )
        };
    }
    if SET == 0 {
        store!("tmm2");
    } else {
        store!("tmm5");
    }
}

/// Starts block `b`'s sums of activation tile `acts` (16 rows of `act_len`
/// pairs of blocks) and weight group `q` (its B tiles), on tile set `b % 2`.
#[inline(always)]
unsafe fn group_block_sums<F: Format>(acts: &[BlockQ8x2], act_len: usize, q: &[u8], b: usize) {
    let a = acts[b / 2].qs[b % 2 * BLOCK..].as_ptr();
    let stride = act_len * size_of::<BlockQ8x2>();
    let tile = q[b * BLOCK * LANES..].as_ptr();
    match (quant_offset(F::TY) != 0, b % 2) {
        (true, 0) => block_sums::<true, 0>(a, stride, tile),
        (true, _) => block_sums::<true, 1>(a, stride, tile),
        (false, 0) => block_sums::<false, 0>(a, stride, tile),
        (false, _) => block_sums::<false, 1>(a, stride, tile),
    }
}

/// Adds block `b`'s sums to the running sums of 16 activation rows
/// (`acc[i]`, lanes the weight rows): as `fast::scale_block`. `wd` and `wm`
/// are the weight rows' scales and minimums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scale_sums<F: Format>(
    acc: &mut [__m512; LANES],
    sums: &Sums,
    acts: &[BlockQ8x2],
    act_len: usize,
    b: usize,
    wd: &[f32; LANES],
    wm: &[f32; LANES],
) {
    let (wd, wm) = (_mm512_loadu_ps(wd.as_ptr()), _mm512_loadu_ps(wm.as_ptr()));
    let h = b % 2;
    for (i, acc) in acc.iter_mut().enumerate() {
        let a = &acts[i * act_len + b / 2];
        let scale = _mm512_mul_ps(wd, _mm512_set1_ps(a.d[h]));
        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums.row(i)), scale, *acc);
        if F::TY.has_min() {
            *acc = _mm512_fmadd_ps(wm, _mm512_set1_ps(a.s[h]), *acc);
        }
    }
}

/// `outs[i][col0 + r]` = weight row `r` of `w` (`n` rows) times activation
/// row `i` of `acts` (`act_len` pairs of blocks a row, the rows padded with
/// zero blocks to a multiple of 16; a row of `outs` for each unpadded row).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply<F: Format>(
    w: &Int8Weights,
    acts: &[BlockQ8x2],
    act_len: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    let blocks = w.cols / BLOCK;
    let shapes = [
        (16, BLOCK as u16),
        (8, TILE_ROW as u16),
        (16, TILE_ROW as u16),
    ];
    let _tiles = Tiles::configure(&[shapes, shapes].concat());
    // A group's B tiles, and its first block's index into the scales.
    let group = |g: usize| {
        let q = &w.q.all_bytes()[g * blocks * BLOCK * LANES..][..blocks * BLOCK * LANES];
        (q, g * blocks)
    };
    pipelined(
        Pipeline {
            acts,
            act_len,
            outs,
            col0,
            n,
            steps: blocks,
        },
        &mut [Sums::ZERO, Sums::ZERO],
        group,
        |acts, (q, _), b| group_block_sums::<F>(acts, act_len, q, b),
        |b, sums| {
            if b % 2 == 0 {
                store_sums::<0>(sums);
            } else {
                store_sums::<1>(sums);
            }
        },
        |acc, sums, acts, (_, first), b| {
            let k = first + b;
            scale_sums::<F>(acc, sums, acts, act_len, b, &w.d[k], &w.m[k]);
        },
    );
}

/// What [`pipelined`] runs over: activation rows (`act_len` blocks each,
/// padded to a multiple of 16 rows), their outputs (from column `col0`, `n`
/// weight rows), and the steps (blocks or super-blocks) of a row.
struct Pipeline<'a, 'o, A> {
    acts: &'a [A],
    act_len: usize,
    outs: &'a mut [&'o mut [f32]],
    col0: usize,
    n: usize,
    steps: usize,
}

/// The loop of the AMX products: for each tile of 16 activation rows and
/// group `g` of 16 weight rows (what the steps need of it: `group(g)`),
/// step `k + 1`'s tile products are started (`start(acts, group, k + 1)`)
/// before step `k`'s sums, stored into `sums[k % 2]` (`store`) by the
/// previous iteration, are scaled into the running sums (`scale(acc, sums,
/// acts, group, k)`); then step `k + 1`'s are stored. The tile unit runs its instructions in order, so a product
/// stored right away would stall the scaling behind it.
#[inline(always)]
unsafe fn pipelined<A, S, G: Copy>(
    p: Pipeline<'_, '_, A>,
    sums: &mut [S; 2],
    group: impl Fn(usize) -> G,
    start: impl Fn(&[A], G, usize),
    store: impl Fn(usize, &mut S),
    scale: impl Fn(&mut [__m512; LANES], &S, &[A], G, usize),
) {
    let Pipeline {
        acts,
        act_len,
        outs,
        col0,
        n,
        steps,
    } = p;
    debug_assert!(acts.len() >= outs.len().next_multiple_of(LANES) * act_len);
    for (t, outs) in outs.chunks_mut(LANES).enumerate() {
        let acts = &acts[t * LANES * act_len..(t + 1) * LANES * act_len];
        for g in 0..n.div_ceil(LANES) {
            let mut acc = [_mm512_setzero_ps(); LANES];
            let group = group(g);
            start(acts, group, 0);
            store(0, &mut sums[0]);
            for k in 0..steps {
                if k + 1 < steps {
                    start(acts, group, k + 1);
                }
                scale(&mut acc, &sums[k % 2], acts, group, k);
                if k + 1 < steps {
                    store(k + 1, &mut sums[(k + 1) % 2]);
                }
            }
            store_outputs(&acc, outs, col0 + g * LANES, n - g * LANES);
        }
    }
}

/// Writes `acc[i]` (lanes the weight rows, `rows` of them at most 16 that
/// count) to `outs[i][col..]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn store_outputs(
    acc: &[__m512; LANES],
    outs: &mut [&mut [f32]],
    col: usize,
    rows: usize,
) {
    let rows = rows.min(LANES);
    let mask = ((1u32 << rows) - 1) as u16;
    for (out, acc) in outs.iter_mut().zip(acc) {
        let out = &mut out[col..col + rows];
        // SAFETY: the mask keeps the store inside `out`.
        _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, *acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_16x16_swaps_rows_and_lanes() {
        if !crate::quant::Isa::Avx512.is_available() {
            eprintln!("skipped: no AVX-512");
            return;
        }
        let rows: [[u32; LANES]; LANES] =
            std::array::from_fn(|j| std::array::from_fn(|e| (100 * j + e) as u32));
        // SAFETY: AVX-512 checked above.
        let out = unsafe {
            let v = rows.map(|r| _mm512_loadu_si512(r.as_ptr().cast()));
            transpose_16x16(&v).map(|v| std::mem::transmute::<__m512i, [u32; LANES]>(v))
        };
        for (e, out) in out.iter().enumerate() {
            for (j, &v) in out.iter().enumerate() {
                assert_eq!(v, rows[j][e], "lane {j} of row {e}");
            }
        }
    }
}
