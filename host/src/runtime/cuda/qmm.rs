//! The tensor-core product of packed GGUF blocks for batches between the
//! decode GEMV and cuBLAS (`kernels/cuda/qmatmul.cu`): its launch shape
//! (tiles of 64 W rows, K split until the card has work), the
//! `KilnQmmGroup` argument that puts the matrices sharing x (q, k and v;
//! gate and up, whose activation it then writes) in one launch, and its
//! scratch and counters. Split-K sums are added by each tile's last block,
//! so a product is one launch whatever its splits. Dense bf16 matrices take
//! it in place of cuBLAS where asked ([`DenseRows`]).

use kiln_kernels::cuda::{DevicePtr, GemmType, KernelArg, LaunchConfig, WeightLayout};

use super::fusion::GatedActivation;
use super::gemv::gemv_max_rows;
use super::launch::Frame;
use super::products::storage_code;
use super::weights::{DeviceMatrix, Packed};

/// Most rows of x the tensor-core product of packed blocks takes. Past it
/// cuBLAS on the matrix expanded to bf16 wins: by arithmetic, the product
/// reads W once per 64 rows of x, and its simple tiles compute at a fraction
/// of cuBLAS's rate, while the expansion costs a fixed ~4.5 bytes a weight.
pub const QMM_MAX_M: usize = 64;
/// Rows of W and of x per block (`KILN_QMM_TILE`).
const TILE: usize = 64;
/// Columns a block takes per step (`KILN_QMM_K`); K splits are multiples.
const STRETCH: usize = 128;
/// Threads per block (`KILN_QMM_THREADS`).
const THREADS: u32 = 128;
/// Matrices one launch covers at most (`KILN_QMM_MAX_GROUP`).
const MAX_GROUP: usize = 4;
/// Rows of x the `_m16` kernels take at most (their x tile: one group of 16).
const M16: usize = 16;
/// Blocks a multiprocessor holds (`KILN_QMM_BLOCKS_PER_SM` and
/// `KILN_QMM_M16_BLOCKS_PER_SM`, the kernels' launch bounds): the kernel
/// streams W one stretch a block at a time, so the blocks resident are the
/// loads in flight.
const BLOCKS_PER_SM: usize = 4;
const M16_BLOCKS_PER_SM: usize = 5;
/// Multiprocessors of an H100 or H200: a wave is every block resident at
/// once on them.
const MULTIPROCESSORS: usize = 132;
/// Parts a product's K is split into at most (each part's block writes
/// partial sums that the tile's last block adds).
const MAX_SPLITS: usize = 16;

/// Which kernels multiply dense bf16 matrices with 3 to 64 rows of x (past the GEMV's [`DENSE_GEMV_MAX_M`](super::gemv::DENSE_GEMV_MAX_M)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DenseRows {
    /// cuBLAS, a launch per matrix (what was measured on a GPU so far).
    #[default]
    Cublas,
    /// This tensor-core product (`kiln_qmm_bf16`): the matrices that share
    /// x in one launch, a gated pair's activation written by it.
    TensorCores,
}

impl DenseRows {
    /// `KILN_DENSE_ROWS`: `cublas` (the default) or `tensor-cores`.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var("KILN_DENSE_ROWS").as_deref() {
            Err(_) | Ok("cublas") => Ok(Self::Cublas),
            Ok("tensor-cores") => Ok(Self::TensorCores),
            Ok(other) => Err(format!(
                "KILN_DENSE_ROWS={other}: expected cublas or tensor-cores (the products of dense \
                 bf16 matrices with 3 to 64 rows of x)"
            )),
        }
    }
}

/// One launch: its kernel, grid (the group's W row tiles, x's row tiles,
/// K's splits) and columns per split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QmmLaunch {
    pub kernel: &'static str,
    pub grid: (u32, u32, u32),
    pub k_split: usize,
}

impl QmmLaunch {
    /// The launch of `members` (one matrix, or several sharing x; `gated`:
    /// a gated MLP's gate and up, paired in tiles) for `m` rows of x, where
    /// the product takes them: packed blocks of one format, or dense bf16
    /// rows of a multiple of 8 that opted in (`dense_on_tensor_cores`),
    /// `[n, k]`, more rows of x than the GEMV takes and at most
    /// [`QMM_MAX_M`].
    pub fn of(members: &[DeviceMatrix], gated: bool, m: usize) -> Option<Self> {
        let first = members.first()?;
        // Up to 16 rows, the kernels whose x tile is one group of 16 rows:
        // fewer registers, so more blocks in flight, and no products of
        // groups of x that are not there.
        let kernels = match first.packed {
            Some(packed) => packed.kernels().qmm,
            None if first.dense_on_tensor_cores && first.cols % 8 == 0 => {
                ["kiln_qmm_bf16", "kiln_qmm_bf16_m16"]
            }
            None => return None,
        };
        let (kernel, x_tile, wave) = match m <= M16 {
            true => (kernels[1], M16, MULTIPROCESSORS * M16_BLOCKS_PER_SM),
            false => (kernels[0], TILE, MULTIPROCESSORS * BLOCKS_PER_SM),
        };
        let fits =
            members.len() <= MAX_GROUP && (gemv_max_rows(first) + 1..=QMM_MAX_M).contains(&m);
        let kind = |w: &DeviceMatrix| (w.packed, w.ty, w.dense_on_tensor_cores, w.cols);
        let alike = members.iter().all(|w| kind(w) == kind(first));
        let paired = !gated || (members.len() == 2 && members[0].rows == members[1].rows);
        if !fits || !alike || !paired {
            return None;
        }
        let tiles = match gated {
            true => first.rows.div_ceil(TILE / 2),
            false => members.iter().map(|w| w.rows.div_ceil(TILE)).sum(),
        };
        let k = first.cols;
        let stretches = k.div_ceil(STRETCH);
        let x_tiles = m.div_ceil(x_tile);
        let k_split = stretches.div_ceil(k_splits(tiles * x_tiles, stretches, wave)) * STRETCH;
        Some(Self {
            kernel,
            grid: (tiles as u32, x_tiles as u32, k.div_ceil(k_split) as u32),
            k_split,
        })
    }

    /// Blocks along K.
    pub fn splits(&self) -> usize {
        self.grid.2 as usize
    }

    /// Scratch bytes of the splits' partial sums for `m` rows of x:
    /// `[splits][m][tiles · 64]` f32, none unsplit.
    pub fn partial_bytes(&self, m: usize) -> usize {
        match self.splits() {
            1 => 0,
            splits => splits * m * self.grid.0 as usize * TILE * 4,
        }
    }

    /// Bytes of the tiles' counters of finished splits (in the step's zeroed
    /// split counters), none unsplit.
    pub fn counter_bytes(&self) -> usize {
        match self.splits() {
            1 => 0,
            _ => (self.grid.0 * self.grid.1) as usize * 4,
        }
    }
}

/// How many parts to split K's `stretches` into for a product of `blocks`
/// blocks a part (W's tiles times x's): the count whose launch takes the
/// fewest stretches' time, counted as waves of `wave` blocks times the
/// stretches each block takes, plus one (its first stretch's loads, which
/// no arithmetic overlaps); ties to fewer parts. Matrices with few rows
/// (o, down, k and v) split until every multiprocessor streams weights;
/// a launch of two waves or more is not split (its tail is small, and the
/// partial sums would cost more).
fn k_splits(blocks: usize, stretches: usize, wave: usize) -> usize {
    if blocks >= 2 * wave {
        return 1;
    }
    let time = |parts: usize| {
        let per_part = stretches.div_ceil(parts);
        (blocks * stretches.div_ceil(per_part)).div_ceil(wave) * (per_part + 1)
    };
    (1..=stretches.clamp(1, MAX_SPLITS))
        .min_by_key(|&parts| time(parts))
        .unwrap_or(1)
}

/// How m rows of x times `w` run here, if they do.
pub fn single(w: &DeviceMatrix, layout: WeightLayout, m: usize) -> Option<QmmLaunch> {
    (layout == WeightLayout::OutIn)
        .then(|| QmmLaunch::of(&[*w], false, m))
        .flatten()
}

/// The `KilnQmmGroup` argument: the members' tiles side by side, or
/// (`activation`) gate's and up's paired, writing `act(gate) · up` to the
/// first member's output; outputs stored as `out_type` says.
fn group_arg(
    members: &[(DeviceMatrix, DevicePtr)],
    activation: Option<GatedActivation>,
    out_type: Option<GemmType>,
) -> KernelArg {
    let mut tiles_end = [0u64; MAX_GROUP];
    let (mut rows, mut w, mut y) = ([0u64; MAX_GROUP], [0u64; MAX_GROUP], [0u64; MAX_GROUP]);
    let mut tiles = 0;
    for (i, (matrix, out)) in members.iter().enumerate() {
        tiles += matrix.rows.div_ceil(TILE) as u64;
        (tiles_end[i], rows[i], w[i], y[i]) = (tiles, matrix.rows as u64, matrix.ptr, *out);
    }
    let mut words = vec![members.len() as u64];
    words.extend(tiles_end);
    words.extend(rows);
    words.extend(w);
    words.extend(y);
    words.extend([
        activation.map_or(0, |a| a as u64),
        u64::from(storage_code(out_type)),
    ]);
    KernelArg::Struct(words)
}

impl Frame<'_> {
    /// `out_i = x · W_iᵀ` for `m` rows of x in bf16 as one launch; `gated`:
    /// the members are gate and up, and `act(gate) · up` goes to the given
    /// address in the given type instead. `partials`: the scratch for the
    /// splits' sums ([`QmmLaunch::partial_bytes`]).
    pub(super) fn qmm(
        &self,
        q: &QmmLaunch,
        members: &[(DeviceMatrix, DevicePtr)],
        gated: Option<(GatedActivation, DevicePtr, Option<GemmType>)>,
        (x, m): (DevicePtr, usize),
        partials: DevicePtr,
    ) -> Result<(), String> {
        let group = match gated {
            Some((activation, out, half)) => {
                let pair = [(members[0].0, out), members[1]];
                group_arg(&pair, Some(activation), half)
            }
            None => group_arg(members, None, None),
        };
        let int = |v: usize| KernelArg::I32(v as i32);
        let args = [
            group,
            KernelArg::Ptr(x),
            KernelArg::Ptr(partials),
            KernelArg::Ptr(self.split_counters),
            int(m),
            int(members[0].0.cols),
            int(q.k_split),
        ];
        self.launch(q.kernel, LaunchConfig::new(q.grid, (THREADS, 1, 1)), &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_kernels::quant::QuantType;

    fn matrix(packed: Option<QuantType>, rows: usize, cols: usize) -> DeviceMatrix {
        DeviceMatrix::unplaced(packed, rows, cols)
    }

    fn launch(members: &[DeviceMatrix], gated: bool, m: usize) -> QmmLaunch {
        QmmLaunch::of(members, gated, m).unwrap_or_else(|| panic!("{m} rows of x"))
    }

    #[test]
    fn packed_products_between_the_gemv_and_cublas_run_here() {
        let q4k = Some(QuantType::Q4K);
        let o_proj = matrix(q4k, 4096, 4096);
        for m in [8, 65] {
            assert_eq!(QmmLaunch::of(&[o_proj], false, m), None, "{m} rows");
        }
        assert_eq!(QmmLaunch::of(&[matrix(None, 4096, 4096)], false, 16), None);
        // Llama-3-8B's shapes at 64 sequences: K is split until a matrix
        // with few rows fills a wave of 528 blocks (4 on each of 132
        // multiprocessors); a wide one is not split.
        let o = launch(&[o_proj], false, 64);
        assert_eq!(
            (o.kernel, o.grid, o.k_split),
            ("kiln_qmm_q4_k", (64, 1, 8), 512)
        );
        let k_proj = launch(&[matrix(q4k, 1024, 4096)], false, 64);
        assert_eq!((k_proj.grid, k_proj.k_split), ((16, 1, 16), 256));
        // Up to 16 rows the `_m16` kernel, 5 blocks a multiprocessor: waves
        // of 660 (down: 10 parts of 12 stretches, 640 blocks).
        let down = launch(&[matrix(q4k, 4096, 14336)], false, 16);
        assert_eq!(
            (down.kernel, down.grid, down.k_split),
            ("kiln_qmm_q4_k_m16", (64, 1, 10), 1536)
        );
        let down = launch(&[matrix(q4k, 4096, 14336)], false, 17);
        assert_eq!((down.kernel, down.grid.2), ("kiln_qmm_q4_k", 8));
        let head = launch(&[matrix(Some(QuantType::Q6K), 128_256, 4096)], false, 9);
        assert_eq!(
            (head.kernel, head.grid),
            ("kiln_qmm_q6_k_m16", (2004, 1, 1))
        );
        // Splits never outnumber the matrix's stretches of 128 columns.
        let short = launch(&[matrix(Some(QuantType::Q8_0), 64, 288)], false, 64);
        assert_eq!((short.grid, short.k_split), ((1, 1, 3), 128));
    }

    #[test]
    fn a_group_is_one_grid_of_its_members_tiles() {
        let q4k = Some(QuantType::Q4K);
        let (q, kv) = (matrix(q4k, 4096, 4096), matrix(q4k, 1024, 4096));
        // q, k and v: 64 + 16 + 16 tiles, split five ways at 64 rows: one
        // wave of 528 blocks, 7 + 1 stretches each (eleven ways would be two
        // waves of 3 + 1); six ways at 16 rows (576 blocks, waves of 660).
        let qkv = launch(&[q, kv, kv], false, 64);
        assert_eq!((qkv.grid, qkv.k_split), ((96, 1, 5), 896));
        let qkv = launch(&[q, kv, kv], false, 16);
        assert_eq!((qkv.grid, qkv.k_split), ((96, 1, 6), 768));
        assert_eq!(qkv.partial_bytes(16), 6 * 16 * 96 * 64 * 4);
        assert_eq!(qkv.counter_bytes(), 96 * 4);
        // Gate and up: 32 pairs of rows a tile, 448 tiles in one wave
        // (split in two they would take two waves of 16 + 1 stretches).
        let up = matrix(q4k, 14336, 4096);
        let gated = launch(&[up, up], true, 64);
        assert_eq!((gated.grid, gated.splits()), ((448, 1, 1), 1));
        assert_eq!((gated.partial_bytes(64), gated.counter_bytes()), (0, 0));
        // Members of other formats or widths, or more than four, or an
        // unequal gated pair, are not one launch.
        let q8 = matrix(Some(QuantType::Q8_0), 1024, 4096);
        assert_eq!(QmmLaunch::of(&[q, q8], false, 16), None);
        assert_eq!(
            QmmLaunch::of(&[q, matrix(q4k, 1024, 2048)], false, 16),
            None
        );
        assert_eq!(QmmLaunch::of(&[kv; 5], false, 16), None);
        assert_eq!(QmmLaunch::of(&[q, kv], true, 16), None);
    }
}
