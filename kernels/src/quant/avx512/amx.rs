//! AMX int8 products for the fast kernels of Q4_0, Q4_1, Q5_0, Q5_1 and
//! Q8_0 over 16 activation rows or more (prefill); Q4_K and Q6_K in
//! `k_quants`.
//!
//! One `tdpbssd`/`tdpbusd` multiplies 16 weight rows by 16 activation rows
//! over one block of 32 values: 256 exact integer block sums, which the
//! AVX-512 code then scales into the running sums exactly as the `fast`
//! kernels do (see that module: same integer sums, same products of
//! scales, same FMAs in the same order), so a product has the same bits
//! with or without AMX.
//!
//! A task first decodes a tile of its weight rows to bytes
//! ([`decode_weights`]: the quants minus their offset, signed for Q4_0,
//! Q5_0 and Q8_0, unsigned 0..16 or 0..32 for Q4_1 and Q5_1, rows padded
//! to a multiple of 16) and its scales by groups of 16 rows, which feed the
//! A tiles (16 rows × 32 bytes). The activations are laid out once per
//! product as B tiles ([`pack_acts`]: per 16 rows and block, 8 rows of 16 ×
//! 4 bytes, with the rows' scales and scale × quant sums).
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

use super::super::aligned::grow;
use super::super::format::{f16_at, Format};
use super::fast::{BlockQ8x2, LANES};
use super::{load_pair, nibble_index, quant_offset, unsigned_quants};

mod k_quants;
pub(crate) use k_quants::{decode_q4k, decode_q6k, multiply_q4k, multiply_q6k, pack_acts_k};

/// Lays out activation rows (of the given blocks, `act_len` of them a row,
/// the row's values last) as B tiles for [`multiply`], [`multiply_q4k`] or
/// [`multiply_q6k`].
pub(crate) type PackActs<A> = fn(&[A], usize, usize) -> AmxActs;

/// Values in a block.
const BLOCK: usize = 32;

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

/// One block of 16 activation rows as a B tile, with the rows' scales and
/// scale × quant sums (zeros for rows past the last); for the K-quants, the
/// rows' super-block scales and the sub-block's quant sums (exact in f32).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct ActTile {
    /// `q[4 * 16 * k + 4 * i + t]` = quant `4k + t` of row `i`.
    q: [i8; 4 * LANES * BLOCK / 4],
    d: [f32; LANES],
    s: [f32; LANES],
}

impl ActTile {
    const EMPTY: Self = Self {
        q: [0; 4 * LANES * BLOCK / 4],
        d: [0.0; LANES],
        s: [0.0; LANES],
    };

    /// Puts one activation row's quants of the block (32 values, or 16),
    /// scale `d` and sum `s` in `lane`.
    fn set_lane(&mut self, lane: usize, qs: &[i8], d: f32, s: f32) {
        for (k, q4) in qs.chunks_exact(4).enumerate() {
            let at = 4 * (LANES * k + lane);
            self.q[at..at + 4].copy_from_slice(q4);
        }
        self.d[lane] = d;
        self.s[lane] = s;
    }
}

/// Activation rows laid out as B tiles: tile `t * blocks + b` holds block
/// `b` of rows `16t..16t + 16`.
pub(crate) struct AmxActs {
    tiles: Vec<ActTile>,
    blocks: usize,
    cols: usize,
}

impl AmxActs {
    /// Values in an activation row.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }
}

/// Lays out `acts` (rows of `act_len` pairs of blocks, `cols` values each)
/// as B tiles.
pub(crate) fn pack_acts(acts: &[BlockQ8x2], act_len: usize, cols: usize) -> AmxActs {
    let blocks = cols / BLOCK;
    let m = acts.len() / act_len.max(1);
    let mut tiles = vec![ActTile::EMPTY; m.div_ceil(LANES) * blocks];
    for (i, row) in acts.chunks_exact(act_len).enumerate() {
        let (t, lane) = (i / LANES, i % LANES);
        for b in 0..blocks {
            let (pair, h) = (&row[b / 2], b % 2);
            let qs = &pair.qs[h * BLOCK..(h + 1) * BLOCK];
            tiles[t * blocks + b].set_lane(lane, qs, pair.d[h], pair.s[h]);
        }
    }
    AmxActs {
        tiles,
        blocks,
        cols,
    }
}

/// A tile of weight rows decoded for the A tiles: `q` the rows' quants
/// (minus their offset) as bytes, rows padded to a multiple of 16; `d` and
/// `m` per group of 16 rows and block the rows' scales and minimums (for
/// the K-quants the integer sub-block scales and minimums, and `super_d`,
/// `super_m` per super-block its scale and minimum scale). (The buffers are
/// reused: past the rows decoded last they hold stale values.)
#[derive(Default)]
pub(crate) struct AmxWeights {
    q: Vec<u8>,
    d: Vec<[f32; LANES]>,
    m: Vec<[f32; LANES]>,
    super_d: Vec<[f32; LANES]>,
    super_m: Vec<[f32; LANES]>,
    cols: usize,
}

/// Decodes the whole rows in `w` (of `cols` values each) into `out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_weights<F: Format>(w: &[u8], cols: usize, out: &mut AmxWeights) {
    let blocks = cols / BLOCK;
    let row_bytes = blocks * F::BYTES;
    let rows = w.len() / row_bytes.max(1);
    let groups = rows.div_ceil(LANES);
    // Grown, never cleared: the padding rows' values only reach their own
    // sums, which are dropped.
    out.cols = cols;
    grow(&mut out.q, groups * LANES * cols, 0);
    grow(&mut out.d, groups * blocks, [0.0; LANES]);
    grow(&mut out.m, groups * blocks, [0.0; LANES]);
    let nibbles = nibble_index::<F>();
    let offset = _mm512_set1_epi8(quant_offset(F::TY) as u8 as i8);
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        let q = &mut out.q[r * cols..(r + 1) * cols];
        for (p, b) in row.chunks(2 * F::BYTES).enumerate() {
            let v = _mm512_sub_epi8(unsigned_quants::<F>(b, load_pair::<F>(b), nibbles), offset);
            let q = &mut q[2 * p * BLOCK..];
            let mask = if q.len() >= 2 * BLOCK {
                u64::MAX
            } else {
                u64::from(u32::MAX)
            };
            // SAFETY: the mask keeps the store inside `q` (64 bytes, or the
            // 32 of an odd last block).
            _mm512_mask_storeu_epi8(q.as_mut_ptr().cast(), mask, v);
        }
        let (g, lane) = (r / LANES, r % LANES);
        for (b, block) in row.chunks_exact(F::BYTES).enumerate() {
            out.d[g * blocks + b][lane] = f16_at(block, 0);
            if F::TY.has_min() {
                out.m[g * blocks + b][lane] = f16_at(block, 2);
            }
        }
    }
}

/// The tile shapes, two sets (for two blocks in flight): tmm0 and tmm3 A
/// tiles (16 weight rows × 32 bytes, or 16), tmm1 and tmm4 B tiles (8 × 64
/// bytes, or 4 × 64), tmm2 and tmm5 C tiles (16 × 16 sums).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    /// A tiles of `a_bytes` (32, or 16 for Q6_K's sub-blocks) a row, and
    /// B tiles of as many bytes a column.
    fn new(a_bytes: u16) -> Self {
        let mut c = [0u8; 64];
        c[0] = 1; // palette 1
        let shapes = [(16, a_bytes), (a_bytes as u8 / 4, 64), (16, 64)];
        for (t, (rows, bytes)) in shapes.into_iter().chain(shapes).enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&bytes.to_le_bytes());
            c[48 + t] = rows;
        }
        Self(c)
    }
}

/// The tiles configured on this thread (with A tiles of `a_bytes` a row)
/// until dropped, which releases them.
struct Tiles;

impl Tiles {
    /// # Safety
    /// Only where [`available`] (the CPU has AMX and the OS granted its
    /// state).
    unsafe fn configure(a_bytes: u16) -> Self {
        let config = TileConfig::new(a_bytes);
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

/// The C tile's sums, stored from tmm2.
#[repr(C, align(64))]
struct Sums([i32; LANES * LANES]);

/// Block sums of 16 weight rows (A tile at `a`, rows `stride` bytes apart)
/// times 16 activation rows (B tile `b`), into `c`: `c[16 j + i]` = weight
/// row `j` times activation row `i`. `SIGNED`: signed weights (`tdpbssd`),
/// else unsigned (`tdpbusd`); `SET`: which set of tiles.
#[inline(always)]
unsafe fn block_sums<const SIGNED: bool, const SET: usize>(
    a: *const u8,
    stride: usize,
    b: &ActTile,
    c: &mut Sums,
) {
    // SAFETY (caller): tiles configured (`Tiles`); `a` has 16 rows of the
    // A tiles' width at `stride`, `b.q` the B tile's rows of 64 bytes, `c`
    // 16 rows of 64.
    macro_rules! product {
        ($op:literal, $a:literal, $b:literal, $c:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{a} + {stride} * 1]"),
                concat!("tileloadd ", $b, ", [{b} + {row} * 1]"),
                concat!("tilezero ", $c),
                concat!($op, " ", $c, ", ", $a, ", ", $b),
                concat!("tilestored [{c} + {row} * 1], ", $c),
                a = in(reg) a,
                stride = in(reg) stride,
                b = in(reg) b.q.as_ptr(),
                c = in(reg) c.0.as_mut_ptr(),
                row = in(reg) 64usize,
                options(nostack),
            )
        };
    }
    match (SIGNED, SET) {
        (true, 0) => product!("tdpbssd", "tmm0", "tmm1", "tmm2"),
        (true, _) => product!("tdpbssd", "tmm3", "tmm4", "tmm5"),
        (false, 0) => product!("tdpbusd", "tmm0", "tmm1", "tmm2"),
        (false, _) => product!("tdpbusd", "tmm3", "tmm4", "tmm5"),
    }
}

/// Block sums of a weight group's block `b` (of `q`, rows `cols` apart)
/// with an activation tile, on tile set `SET`.
#[inline(always)]
unsafe fn group_block_sums<F: Format, const SET: usize>(
    q: &[u8],
    cols: usize,
    b: usize,
    tile: &ActTile,
    c: &mut Sums,
) {
    let a = q[b * BLOCK..].as_ptr();
    if quant_offset(F::TY) != 0 {
        block_sums::<true, SET>(a, cols, tile, c);
    } else {
        block_sums::<false, SET>(a, cols, tile, c);
    }
}

/// Adds one block's sums to the running sums of 16 weight rows (`acc[j]`,
/// lanes the activation rows): as `fast::scale_block`, lanes being
/// activation rows. `wd` and `wm` are the weight rows' scales and minimums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scale_sums<F: Format>(
    acc: &mut [__m512; LANES],
    sums: &Sums,
    tile: &ActTile,
    wd: &[f32; LANES],
    wm: &[f32; LANES],
) {
    let d = _mm512_loadu_ps(tile.d.as_ptr());
    let s = _mm512_loadu_ps(tile.s.as_ptr());
    for (j, acc) in acc.iter_mut().enumerate() {
        let sum = _mm512_loadu_si512(sums.0[LANES * j..].as_ptr().cast());
        *acc = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(sum),
            _mm512_mul_ps(d, _mm512_set1_ps(wd[j])),
            *acc,
        );
        if F::TY.has_min() {
            *acc = _mm512_fmadd_ps(_mm512_set1_ps(wm[j]), s, *acc);
        }
    }
}

/// `outs[i][col0 + r]` = weight row `r` of `w` (`n` rows) times activation
/// row `i` of `acts` (one row of `outs` for each).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn multiply<F: Format>(
    w: &AmxWeights,
    acts: &AmxActs,
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
) {
    let blocks = acts.blocks;
    debug_assert_eq!(w.cols, blocks * BLOCK);
    let _tiles = Tiles::configure(BLOCK as u16);
    let mut sums = [Sums([0; LANES * LANES]), Sums([0; LANES * LANES])];
    for (t, act_tiles) in acts.tiles.chunks_exact(blocks).enumerate() {
        for g in 0..n.div_ceil(LANES) {
            let q = &w.q[g * LANES * w.cols..(g + 1) * LANES * w.cols];
            let mut acc = [_mm512_setzero_ps(); LANES];
            // Two blocks in flight, on the two tile sets; scaled in order.
            for b in (0..blocks).step_by(2) {
                group_block_sums::<F, 0>(q, w.cols, b, &act_tiles[b], &mut sums[0]);
                if b + 1 < blocks {
                    group_block_sums::<F, 1>(q, w.cols, b + 1, &act_tiles[b + 1], &mut sums[1]);
                }
                for h in 0..(blocks - b).min(2) {
                    let k = g * blocks + b + h;
                    scale_sums::<F>(&mut acc, &sums[h], &act_tiles[b + h], &w.d[k], &w.m[k]);
                }
            }
            store_outputs(&acc, outs, col0, n, t, g);
        }
    }
}

/// Writes the sums of weight group `g` (`acc[j]`, lanes the activation rows
/// of tile `t`) to `outs[i][col0 + r]`, `n` weight rows in all.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn store_outputs(
    acc: &[__m512; LANES],
    outs: &mut [&mut [f32]],
    col0: usize,
    n: usize,
    t: usize,
    g: usize,
) {
    let mut y = [[0f32; LANES]; LANES];
    for (y, acc) in y.iter_mut().zip(acc) {
        _mm512_storeu_ps(y.as_mut_ptr(), *acc);
    }
    let rows = (n - g * LANES).min(LANES);
    for (i, out) in outs.iter_mut().skip(t * LANES).take(LANES).enumerate() {
        let out = &mut out[col0 + g * LANES..][..rows];
        for (j, out) in out.iter_mut().enumerate() {
            *out = y[j][i];
        }
    }
}
