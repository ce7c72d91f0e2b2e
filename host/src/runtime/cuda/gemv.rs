//! The decode GEMV's launch (`kernels/cuda/gemv.cuh`, up to [`GEMV_MAX_M`]
//! rows of x): which kernel reads a group of matrices that share x
//! ([`GemvGroup`]), and its `KilnGemvGroup` argument with what the launch
//! does beyond the products: a gated MLP's activation, q's and k's
//! rotation with the cache write, greedy's picks.

use kiln_kernels::cuda::{DevicePtr, GemmType, KernelArg, WeightLayout};
use kiln_kernels::quant::QuantType;

use super::attention::CacheTarget;
use super::fusion::{GatedActivation, GatedProduct};
use super::weights::{DeviceMatrix, Packed};

/// Most rows of x the decode GEMV takes (`KILN_GEMV_MAX_M` in gemv.cuh).
pub const GEMV_MAX_M: usize = 8;
/// Most rows of x the decode GEMV takes for a dense (bf16, f16, f32)
/// matrix by default ([`DenseGemvRows`]); more go to cuBLAS. The GEMV reads
/// every row of x for every row of W: 16 bytes of bf16 W bring m × 32 bytes
/// of f32 x through L1, past its ~128 bytes a clock per SM from m = 4, and
/// a down projection's x (m × 14336 × 4 bytes for Llama-3-8B) leaves L1 for
/// L2. Measured on an
/// H200 (`bench/results/gpu-2026-11-30`): 8 rows of Llama-3-8B took
/// 22.4 ms a step on the GEMV against 6.1 ms for 16 rows on cuBLAS. A
/// packed row brings fewer bytes of W per value of x, but no faster
/// product of 2 to 8 rows reads its blocks, so it keeps the GEMV.
pub const DENSE_GEMV_MAX_M: usize = 2;
/// Warps per GEMV block (gated launches split four ways take twice as
/// many: `KILN_GEMV_MAX_WARPS`).
pub const GEMV_WARPS: usize = 4;
/// Matrices one GEMV launch covers at most (`KILN_GEMV_MAX_GROUP`).
pub const GEMV_MAX_GROUP: usize = 4;

/// Most rows of x the decode GEMV takes for dense matrices
/// ([`DENSE_GEMV_MAX_M`] by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseGemvRows(pub usize);

impl Default for DenseGemvRows {
    fn default() -> Self {
        Self(DENSE_GEMV_MAX_M)
    }
}

impl DenseGemvRows {
    /// `KILN_DENSE_GEMV_ROWS` (1 to [`GEMV_MAX_M`], to measure the GEMV
    /// against cuBLAS, as `bench/gpu/run.sh dense-gemv` does), else the
    /// default.
    pub fn from_env() -> Result<Self, String> {
        std::env::var("KILN_DENSE_GEMV_ROWS").map_or(Ok(Self::default()), |v| Self::parse(&v))
    }

    /// A row count of 1 to [`GEMV_MAX_M`].
    fn parse(value: &str) -> Result<Self, String> {
        value
            .parse()
            .ok()
            .filter(|rows| (1..=GEMV_MAX_M).contains(rows))
            .map(Self)
            .ok_or_else(|| {
                format!(
                    "KILN_DENSE_GEMV_ROWS={value}: expected 1 to {GEMV_MAX_M} (the most rows \
                     of x the decode GEMV takes for dense matrices)"
                )
            })
    }
}

/// Most rows of x the decode GEMV takes for `w`.
pub fn gemv_max_rows(w: &DeviceMatrix) -> usize {
    match w.packed {
        Some(_) => GEMV_MAX_M,
        None => w.dense_gemv_rows,
    }
}

/// The decode GEMV for `m` rows of x times `w` (stored `[n, k]`), where one
/// applies: a single row has kernels of its own (fewer registers, more
/// weight loads in flight).
pub fn gemv_kernel(w: &DeviceMatrix, layout: WeightLayout, m: usize) -> Option<&'static str> {
    if m > gemv_max_rows(w) || layout != WeightLayout::OutIn {
        return None;
    }
    let (many, one) = match (w.packed, w.ty) {
        (Some(p), _) if w.int8_activations => (p.kernels().gemv_x8[0], p.kernels().gemv_x8[1]),
        (Some(p), _) => (p.kernels().gemv, p.kernels().gemv_m1),
        (None, GemmType::BF16) => ("kiln_gemv_bf16", "kiln_gemv_bf16_m1"),
        (None, GemmType::F16) => ("kiln_gemv_f16", "kiln_gemv_f16_m1"),
        (None, GemmType::F32) => ("kiln_gemv_f32", "kiln_gemv_f32_m1"),
    };
    Some(if m == 1 { one } else { many })
}

/// The matrices of one decode GEMV launch as its kernel sees them: the
/// first stands for the type, width and format of all, except that the
/// last may be in another packed format where a kernel pairs the two
/// (`gemv_blocks`' LAST in gemv.cuh: llama.cpp's Q4_K_M and Q5_K_M files
/// keep some layers' v at Q6_K among their q and k).
#[derive(Clone, Copy, Debug)]
pub struct GemvGroup {
    /// The first matrix.
    pub first: DeviceMatrix,
    /// How many share the launch.
    pub count: usize,
    /// The last one's format, where it differs from the first's.
    pub last: Option<QuantType>,
}

impl GemvGroup {
    /// The group of `matrices` (in launch order), if one GEMV kernel reads
    /// them all: one type, width and format, or the last in a format
    /// [`Packed::mixed_gemv`] pairs with the others'.
    pub fn of<'a>(matrices: impl IntoIterator<Item = &'a DeviceMatrix>) -> Option<Self> {
        let mut matrices = matrices.into_iter();
        let first = *matrices.next()?;
        let kind = |w: &DeviceMatrix| (w.ty, w.cols, w.int8_activations);
        let (mut count, mut last) = (1, first);
        for w in matrices {
            // Every member but the last is in the first's format.
            if last.packed != first.packed || kind(w) != kind(&first) {
                return None;
            }
            (count, last) = (count + 1, *w);
        }
        let last = match (first.packed, last.packed) {
            (f, l) if f == l => None,
            (Some(f), Some(l)) if f.mixed_gemv(l).is_some() => Some(l),
            _ => return None,
        };
        Some(Self { first, count, last })
    }

    /// The single matrix `w`.
    pub fn single(w: &DeviceMatrix) -> Self {
        Self {
            first: *w,
            count: 1,
            last: None,
        }
    }

    /// Its kernel for `m` rows of x (the one-warp-per-row name), where the
    /// decode GEMV takes them.
    pub fn kernel(&self, m: usize) -> Option<&'static str> {
        if m == 0 || self.count > GEMV_MAX_GROUP {
            return None;
        }
        let uniform = gemv_kernel(&self.first, WeightLayout::OutIn, m)?;
        let Some(last) = self.last else {
            return Some(uniform);
        };
        let [many, one, many_x8, one_x8] = self.first.packed?.mixed_gemv(last)?;
        Some(match (self.first.int8_activations, m == 1) {
            (false, false) => many,
            (false, true) => one,
            (true, false) => many_x8,
            (true, true) => one_x8,
        })
    }
}

/// The rotary embedding a GEMV launch of q, k and v applies to q and k, and
/// the paged-cache write of the rotated keys and of v (`KilnGemvRope` in
/// gemv.cuh).
#[derive(Clone, Copy, Debug)]
pub struct GemvRotation {
    /// The positions `[T]` and frequencies `[half]` (`kiln_rope`'s).
    pub positions: DevicePtr,
    pub inv_freq: DevicePtr,
    /// Where the rotated q and k go.
    pub q_out: DevicePtr,
    pub k_out: DevicePtr,
    /// cos/sin scale, half a head, adjacent pairs.
    pub scale: f32,
    pub half: usize,
    pub interleaved: bool,
    /// The cache write of the rotated keys and of v, if any.
    pub cache: Option<CacheTarget>,
    /// Past the GEMV, q, k and v rotate after their one stacked GEMM
    /// ([`GroupRotation::stacked`](super::plan::GroupRotation)).
    pub stacked: bool,
}

impl GemvRotation {
    /// Its words as `KilnGemvRope` lays them out (none: all zero; no cache
    /// write: null cache pointers).
    fn words(rotation: Option<&Self>) -> [u64; 13] {
        let Some(r) = rotation else {
            return [0; 13];
        };
        let pair = |low: u64, high: usize| low | (high as u64) << 32;
        let c = r.cache.unwrap_or_default();
        [
            r.positions,
            r.inv_freq,
            r.q_out,
            r.k_out,
            c.k_cache,
            c.v_cache,
            c.row_offsets,
            c.context_lens,
            c.block_tables,
            pair(u64::from(r.scale.to_bits()), r.half),
            pair(u64::from(r.interleaved), c.element as usize),
            pair(c.batch as u64, c.blocks_per_seq),
            c.block_size as u64,
        ]
    }
}

/// Bytes of the step's upload that the logits GEMV's greedy pick takes: its
/// count of blocks done (4 bytes and 4 of padding), then a key for each of
/// up to [`GEMV_MAX_M`] rows.
pub const GREEDY_PICKS_BYTES: usize = 8 + 8 * GEMV_MAX_M;

/// Where the GEMV of the logits leaves greedy's picks (`KilnGemvArgmax` in
/// gemv.cuh): each row's largest key so far and the count of blocks done,
/// both zero before the launch (in the step's upload), and the picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GreedyPicks {
    /// `[GEMV_MAX_M]` u64 keys.
    pub keys: DevicePtr,
    /// A u32 count of blocks done.
    pub counter: DevicePtr,
    /// `[GEMV_MAX_M]` u32 token ids.
    pub tokens: DevicePtr,
}

impl GreedyPicks {
    /// The counter and keys laid out in the [`GREEDY_PICKS_BYTES`] at
    /// `region` (of the step's upload), the picks going to `tokens`.
    pub fn at(region: DevicePtr, tokens: DevicePtr) -> Self {
        Self {
            counter: region,
            keys: region + 8,
            tokens,
        }
    }
}

/// A residual add and RMS norm folded into the GEMV of the product the add
/// reads (`KilnGemvNorm` in gemv.cuh; `norm_fold.rs`): the launch writes
/// `residual + products` to `sum`, that times `offset + weight` to its
/// output (the next GEMV's x), and each row of x's `1 / rms` to `scales`.
#[derive(Clone, Copy, Debug)]
pub struct GemvNorm {
    /// `[m, n]` f32.
    pub residual: DevicePtr,
    pub sum: DevicePtr,
    /// `[n]` f32.
    pub weight: DevicePtr,
    /// `[blocks, m]` f32: each block's sums of squares.
    pub partials: DevicePtr,
    /// A u32 count of blocks done: zero before the launch, left at zero.
    pub counter: DevicePtr,
    /// `[m]` f32.
    pub scales: DevicePtr,
    pub offset: f32,
    pub eps: f32,
}

impl GemvNorm {
    /// Its words as `KilnGemvNorm` lays them out (none: all zero).
    fn words(norm: Option<&Self>) -> [u64; 7] {
        let Some(n) = norm else {
            return [0; 7];
        };
        let floats = kiln_kernels::cuda::float_pair_word(n.offset, n.eps);
        [
            n.residual, n.sum, n.weight, n.partials, n.counter, n.scales, floats,
        ]
    }
}

/// What a GEMV launch does beyond writing its products.
#[derive(Clone, Copy, Debug)]
pub(super) enum GemvEpilogue {
    /// A gated MLP's gate and up, rows paired in blocks: their activation,
    /// written to the address, in the half type given (tensor cores only).
    Gated(GatedProduct, DevicePtr, Option<GemmType>),
    /// q's and k's rows rotated, paired in blocks (members q, k and v).
    Rotated(GemvRotation),
    /// The logits: each row of x's first largest value, greedy's pick.
    GreedyPick(GreedyPicks),
    /// A residual add and RMS norm after the product (one matrix), whose
    /// output is the norm's, unscaled.
    AddNorm(GemvNorm),
}

/// The `KilnGemvGroup` argument: the matrices (with their outputs) as one
/// grid of rows; gated (`activation`, see [`GatedActivation`]), gate and
/// up, whose activation is written to gate's output; rotated
/// ([`GemvRotation`]), q, k and v; with `picks`, the logits' matrix alone,
/// greedy's picks found too; with `norm`, one matrix, a residual add and
/// norm after it; with `row_scales`, each row of x's sums times its scale
/// (a norm folded in before).
pub fn group_arg(
    members: &[(DeviceMatrix, DevicePtr)],
    activation: Option<GatedActivation>,
    rotation: Option<&GemvRotation>,
    picks: Option<&GreedyPicks>,
    (norm, row_scales): (Option<&GemvNorm>, Option<DevicePtr>),
) -> KernelArg {
    let mut rows_end = [0u64; GEMV_MAX_GROUP];
    let (mut w, mut y) = ([0u64; GEMV_MAX_GROUP], [0u64; GEMV_MAX_GROUP]);
    let mut rows = 0;
    for (i, (matrix, out)) in members.iter().enumerate() {
        rows += matrix.rows as u64;
        (rows_end[i], w[i], y[i]) = (rows, matrix.ptr, *out);
    }
    let mut words = vec![members.len() as u64];
    words.extend(rows_end);
    words.extend(w);
    words.extend(y);
    words.push(activation.map_or(0, |a| a as u64));
    words.extend(GemvRotation::words(rotation));
    words.extend(picks.map_or([0; 3], |p| [p.keys, p.counter, p.tokens]));
    words.extend(GemvNorm::words(norm));
    words.push(row_scales.unwrap_or(0));
    KernelArg::Struct(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(packed: QuantType, rows: usize) -> DeviceMatrix {
        DeviceMatrix::unplaced(Some(packed), rows, 4096)
    }

    #[test]
    fn a_group_takes_one_format_or_a_paired_last_one() {
        let (q, k) = (matrix(QuantType::Q4K, 4096), matrix(QuantType::Q4K, 1024));
        let v = matrix(QuantType::Q6K, 1024);
        let kernel = |members: &[DeviceMatrix], m| GemvGroup::of(members)?.kernel(m);
        assert_eq!(kernel(&[q, k, k], 1), Some("kiln_gemv_q4_k_m1"));
        assert_eq!(kernel(&[q, k, v], 1), Some("kiln_gemv_q4_k_q6_k_m1"));
        assert_eq!(kernel(&[q, k, v], 8), Some("kiln_gemv_q4_k_q6_k"));
        assert_eq!(kernel(&[q, k, v], 9), None);
        // The odd format only last, and only where a kernel pairs the two.
        assert!(GemvGroup::of(&[q, v, k]).is_none());
        assert!(GemvGroup::of(&[v, v, q]).is_none());
        let q5 = matrix(QuantType::Q5K, 1024);
        assert_eq!(kernel(&[q5, v], 8), Some("kiln_gemv_q5_k_q6_k"));
        assert!(GemvGroup::of(&[q, q5]).is_none());
        assert!(GemvGroup::of(&[q, DeviceMatrix::unplaced(None, 1024, 4096)]).is_none());
        let narrow = DeviceMatrix::unplaced(Some(QuantType::Q6K), 1024, 2048);
        assert!(GemvGroup::of(&[q, narrow]).is_none());
        // 8-bit x: the `_x8` kernels.
        let x8 = |w: DeviceMatrix| DeviceMatrix {
            int8_activations: true,
            ..w
        };
        let group = GemvGroup::of(&[x8(q), x8(k), x8(v)]).unwrap();
        assert_eq!(group.kernel(1), Some("kiln_gemv_q4_k_q6_k_x8_m1"));
        assert_eq!(group.kernel(2), Some("kiln_gemv_q4_k_q6_k_x8"));
        assert!(GemvGroup::of(&[x8(q), v]).is_none());
        assert!(GemvGroup::of(&[q, k, k, k, v]).unwrap().kernel(1).is_none());
    }

    #[test]
    fn dense_matrices_leave_the_gemv_past_two_rows_packed_past_eight() {
        let dense = DeviceMatrix::unplaced(None, 4096, 4096);
        let gemv = |w: &DeviceMatrix, m| gemv_kernel(w, WeightLayout::OutIn, m);
        assert_eq!(gemv(&dense, 1), Some("kiln_gemv_bf16_m1"));
        assert_eq!(gemv(&dense, 2), Some("kiln_gemv_bf16"));
        assert_eq!(gemv(&dense, 3), None);
        let packed = matrix(QuantType::Q4K, 4096);
        assert_eq!(gemv(&packed, 8), Some("kiln_gemv_q4_k"));
        assert_eq!(gemv(&packed, 9), None);
        // KILN_DENSE_GEMV_ROWS moves the line, within the kernels' rows.
        let rows = DenseGemvRows::parse("8").unwrap();
        let dense = DeviceMatrix {
            dense_gemv_rows: rows.0,
            ..dense
        };
        assert_eq!(gemv(&dense, 8), Some("kiln_gemv_bf16"));
        for bad in ["0", "9", "two"] {
            let err = DenseGemvRows::parse(bad).unwrap_err();
            assert!(err.contains("expected 1 to 8"), "{err}");
        }
    }
}
