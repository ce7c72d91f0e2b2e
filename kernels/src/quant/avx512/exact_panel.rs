//! Exact products over many activation rows (prefill) from weights decoded
//! once. The multi-row kernels of `exact` decode every 64 weights again for
//! each group of up to 8 activation rows and reload each row's activations
//! for every weight row: one load per FMA plus the decoding. Here a tile of
//! weight rows is first decoded to f32 ([`decode_rows`]), then
//! [`panel_multiply`] multiplies it with every activation row in register
//! tiles of [`WEIGHT_ROWS`] weight rows × [`ACT_ROWS`] activation rows
//! (10 loads for 24 FMAs).
//!
//! Every (weight row, activation row) pair accumulates exactly as
//! [`ExactSums::add`](super::exact::ExactSums) does, with the same weights:
//! its two chains get the same FMAs in the same order, so the result has the
//! bits of the single-row kernel's. The chains are independent, so a
//! register tile runs one chain at a time: one register a pair, twice the
//! pairs.
//!
//! Both operands are laid out for that: by groups (of `WEIGHT_ROWS` weight
//! rows, of `ACT_ROWS` activation rows; the last group of each takes what is
//! left), each group's block by runs of values (see [`run_len`]), each run
//! first the values of chain 0 (values 0..32 of every 64), then those of
//! chain 1, in steps of 16 values with the group's rows interleaved. So a
//! register tile reads two sequential streams. (Row-major rows a multiple
//! of 4 KiB apart also fell into the same L1 sets.)
//!
//! Safety: as the parent module's kernels.

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::exact::{ExactRows, ExactSums};

/// Weight rows of a register tile.
const WEIGHT_ROWS: usize = 4;
/// Activation rows of a register tile (and of a group of rows whose run of
/// activations stays in L1 while the tile's weight rows pass).
const ACT_ROWS: usize = 6;
/// Activation values a group takes at a time on longer rows (a multiple of
/// 64): 6 rows × 4 KiB stay in L1 while the weights stream from L2.
const RUN_VALUES: usize = 1024;
/// The longest rows multiplied in one run.
const ONE_RUN_VALUES: usize = 1536;
/// Groups of activation rows a thread lays out at least.
const PACK_MIN_GROUPS: usize = 8;

/// Values of a row that a run takes.
fn run_len(cols: usize) -> usize {
    if cols <= ONE_RUN_VALUES {
        cols
    } else {
        RUN_VALUES
    }
}

/// The values of chain 0 in a run of `len` values (32 of every 64).
fn chain0_len(len: usize) -> usize {
    32 * len.div_ceil(64)
}

/// `total` rows in groups of `size` (the last one takes what is left): each
/// group's first row and row count.
fn groups(total: usize, size: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..total)
        .step_by(size)
        .map(move |r| (r, size.min(total - r)))
}

/// Writes `rows` (`g` rows of `cols` values, a multiple of 32) into `out` as
/// the module's layout has a group.
fn lay_out(rows: &[f32], g: usize, cols: usize, out: &mut [f32]) {
    let (out, _) = out.as_chunks_mut::<16>();
    let mut at = 0;
    let run = run_len(cols);
    for k0 in (0..cols).step_by(run) {
        let end = (k0 + run).min(cols);
        for chain in 0..2 {
            for start in (k0 + 32 * chain..end).step_by(64) {
                for v in [start, start + 16] {
                    for r in 0..g {
                        let chunk: &[f32; 16] = rows[r * cols + v..][..16].try_into().expect("16");
                        out[at] = *chunk;
                        at += 1;
                    }
                }
            }
        }
    }
}

/// Lays out activation rows (`x`, rows of `cols` values) for
/// [`panel_multiply`], in groups of [`ACT_ROWS`].
pub(crate) fn pack_acts(x: &[f32], cols: usize, out: &mut [f32]) {
    let group = ACT_ROWS * cols;
    x.par_chunks(group)
        .zip(out.par_chunks_mut(group))
        .with_min_len(PACK_MIN_GROUPS)
        .for_each(|(x, out)| lay_out(x, x.len() / cols, cols, out));
}

/// Decodes `w` (whole weight rows of `cols` values) to f32 in `out`, laid
/// out for [`panel_multiply`] in groups of [`WEIGHT_ROWS`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn decode_rows<D: ExactRows>(w: &[u8], cols: usize, out: &mut [f32]) {
    let setup = D::setup();
    let row_bytes = cols / D::BLOCK_VALUES * D::BLOCK_BYTES;
    let mut rows = vec![0f32; WEIGHT_ROWS * cols];
    for (r0, g) in groups(w.len() / row_bytes, WEIGHT_ROWS) {
        let rows = &mut rows[..g * cols];
        for (r, row) in rows.chunks_exact_mut(cols).enumerate() {
            D::decode_row(&w[(r0 + r) * row_bytes..][..row_bytes], &setup, row);
        }
        lay_out(rows, g, cols, &mut out[r0 * cols..(r0 + g) * cols]);
    }
}

/// `outs[i][col0 + r]` = weight row `r` (of those [`decode_rows`] put in
/// `panel`) · activation row `i` (of those [`pack_acts`] put in `x`, an
/// output row for each), rows of `cols` values, bit for bit what
/// [`exact`](super::exact) gives from the encoded row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn panel_multiply(
    panel: &[f32],
    x: &[f32],
    cols: usize,
    outs: &mut [&mut [f32]],
    col0: usize,
) {
    let n = panel.len() / cols;
    let mut sums = vec![ExactSums::zero(); n * ACT_ROWS];
    for (i0, g) in groups(x.len() / cols, ACT_ROWS) {
        let x = &x[i0 * cols..(i0 + g) * cols];
        let outs = &mut outs[i0..i0 + g];
        match g {
            ACT_ROWS => group::<ACT_ROWS>(panel, x, cols, &mut sums, outs, col0),
            5 => group::<5>(panel, x, cols, &mut sums, outs, col0),
            4 => group::<4>(panel, x, cols, &mut sums, outs, col0),
            3 => group::<3>(panel, x, cols, &mut sums, outs, col0),
            2 => group::<2>(panel, x, cols, &mut sums, outs, col0),
            _ => group::<1>(panel, x, cols, &mut sums, outs, col0),
        }
    }
}

/// [`panel_multiply`] for one group of `R` activation rows (`x`, laid out),
/// writing `outs[i][col0 + r]`. `sums` has room for `n × R` running sums: a
/// register tile keeps one chain's there while it runs the other, and both
/// between runs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
unsafe fn group<const R: usize>(
    panel: &[f32],
    x: &[f32],
    cols: usize,
    sums: &mut [ExactSums],
    outs: &mut [&mut [f32]],
    col0: usize,
) {
    let n = panel.len() / cols;
    let run = run_len(cols);
    // Each run of activations passes every weight row before the next run:
    // a pair's sums see the same additions in the same order as in one pass.
    for k0 in (0..cols).step_by(run) {
        let len = run.min(cols - k0);
        let half = chain0_len(len);
        let (x0, x1) = x[k0 * R..(k0 + len) * R].split_at(half * R);
        let pass = Pass {
            first: k0 == 0,
            last: k0 + len == cols,
        };
        for (r0, g) in groups(n, WEIGHT_ROWS) {
            let w = &panel[r0 * cols..(r0 + g) * cols][k0 * g..(k0 + len) * g];
            let (w0, w1) = w.split_at(half * g);
            let block = Block {
                sums: &mut sums[r0 * R..(r0 + g) * R],
                outs: &mut *outs,
                col: col0 + r0,
            };
            match g {
                WEIGHT_ROWS => chains::<WEIGHT_ROWS, R>([w0, w1], [x0, x1], pass, block),
                3 => chains::<3, R>([w0, w1], [x0, x1], pass, block),
                2 => chains::<2, R>([w0, w1], [x0, x1], pass, block),
                _ => chains::<1, R>([w0, w1], [x0, x1], pass, block),
            }
        }
    }
}

/// Where a run lies in its rows.
#[derive(Clone, Copy)]
struct Pass {
    /// The sums start at zero.
    first: bool,
    /// The sums are finished into the outputs.
    last: bool,
}

/// A register tile's running sums (`sums[r * R + i]`, between runs) and
/// outputs (`outs[i][col + r]`).
struct Block<'a, 'o> {
    sums: &'a mut [ExactSums],
    outs: &'a mut [&'o mut [f32]],
    col: usize,
}

/// Both chains of a register tile over one run: `w[h]` and `x[h]` the
/// values of chain `h`, as laid out.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)] // see the comment inside
unsafe fn chains<const NW: usize, const R: usize>(
    w: [&[f32]; 2],
    x: [&[f32]; 2],
    pass: Pass,
    block: Block,
) {
    // One chain at a time, the other in memory (24 registers each: both
    // live at once spilled inside the loop). Index loops, not iterators:
    // with iterators over the register arrays the sums stayed in memory,
    // stored after every step.
    for h in 0..2 {
        let mut s = [[_mm512_setzero_ps(); R]; NW];
        if !pass.first {
            for r in 0..NW {
                for i in 0..R {
                    s[r][i] = block.sums[r * R + i].0[h];
                }
            }
        }
        s = tile::<NW, R>(w[h], x[h], s);
        for r in 0..NW {
            for i in 0..R {
                block.sums[r * R + i].0[h] = s[r][i];
            }
        }
    }
    if pass.last {
        // 16 pairs at a time (pair `p` is weight row `p / R`, activation
        // row `p % R`).
        for (c, sums) in block.sums[..NW * R].chunks(16).enumerate() {
            let dots = ExactSums::finish16(sums);
            for (j, &dot) in dots[..sums.len()].iter().enumerate() {
                let p = 16 * c + j;
                block.outs[p % R][block.col + p / R] = dot;
            }
        }
    }
}

/// Adds `NW` weight rows times `R` activation rows (`w` and `x`: the values
/// of one chain of one run of their groups, as laid out) to `s[r][i]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn tile<const NW: usize, const R: usize>(
    w: &[f32],
    x: &[f32],
    mut s: [[__m512; R]; NW],
) -> [[__m512; R]; NW] {
    let steps = x.len() / (16 * R);
    assert!(x.len() == 16 * R * steps && w.len() == 16 * NW * steps);
    let (mut w, mut x) = (w.as_ptr(), x.as_ptr());
    for _ in 0..steps {
        // SAFETY: `steps` steps of 16 values a row (checked above).
        s = step::<NW, R>(s, &mut w, &mut x);
    }
    s
}

/// One step of [`tile`]: the next 16 values of every row (at `w` and `x`,
/// which it advances) into every pair's sum. The caller guarantees them.
/// (The sums go by value: through a reference, each FMA stored its sum;
/// and by index loops, as in [`chains`].)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni,avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)]
unsafe fn step<const NW: usize, const R: usize>(
    mut s: [[__m512; R]; NW],
    w: &mut *const f32,
    x: &mut *const f32,
) -> [[__m512; R]; NW] {
    let mut wv = [_mm512_setzero_ps(); NW];
    for r in 0..NW {
        wv[r] = _mm512_loadu_ps(w.add(16 * r));
    }
    for i in 0..R {
        let xv = _mm512_loadu_ps(x.add(16 * i));
        for r in 0..NW {
            s[r][i] = _mm512_fmadd_ps(wv[r], xv, s[r][i]);
        }
    }
    *w = w.add(16 * NW);
    *x = x.add(16 * R);
    s
}
