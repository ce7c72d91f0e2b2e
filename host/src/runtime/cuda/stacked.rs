//! Stacked matrices: dense matrices that share x (q, k and v; gate and up)
//! stored one after another at load, so that past the GEMV (cuBLAS's route)
//! their products run as one GEMM over the stacked matrix, whose output
//! `kiln_split_columns` (data.cu) then hands to each member (or, for q, k
//! and v whose rotation moved into their group, the rotary launch reads
//! where it lies: `products::rotates_after_stack`). On the H200
//! (2026-11-30) Llama-3-8B's q, k and v at 64 decode rows took 14.1, 8.3
//! and 8.3 µs on cuBLAS (2.4, 1.0 and 1.0 TB/s; kernels matched to products
//! by their shapes) and two split-K reductions of ~4 µs more: products that
//! small do not fill the card. A gated MLP's gate and up (117 MB each,
//! 3.4 TB/s apart on the H200) are stored stacked too and run as one GEMM
//! without a split: `kiln_gated_rows` reads both from its rows for the
//! activation (`products::activates_after_stack`): a GEMM and a launch gap
//! fewer a layer, and cuBLAS's tiles over 28,672 rows rather than two
//! launches of 14,336, each under a wave (100 tiles on 132
//! multiprocessors).

use std::collections::HashMap;

use kiln_kernels::cuda::{DevicePtr, Gemm, GemmType, KernelArg, LaunchConfig, WeightLayout};
use kiln_plugin_api::graph::ValueId;

use super::launch::Frame;
use super::weights::{self, DeviceMatrix, WeightDtype};
use crate::compiler::{Kernel, Program};
use crate::runtime::WeightData;

/// Most members of a stack (`KILN_STACK_MAX` in data.cu).
pub const STACK_MAX: usize = 4;

/// Most rows of x a stacked product whose output is split takes: decode
/// batches and short prompts. Past them each product fills the card on its
/// own (a 2048-token prompt's q, k and v are ~100 GFLOP), and the split
/// would copy an output of up to 50 MB (Llama-3-8B's q, k and v in f32) a
/// layer.
pub const STACK_MAX_M: usize = 256;

/// Most rows of x a stacked product whose output is read where it lies
/// takes ([`Stack::in_place`]: q, k and v's rotation, gate and up's
/// activation): a whole prefill chunk at `--max-num-batched-tokens`'
/// default. With nothing copied, one GEMM still saves the smaller
/// products' tails (on the H200 a 2048-token prompt's k and v ran at 515
/// TFLOP/s, its q at 597) and launches; the scratch holds the output in
/// f32 (235 MB for Llama-3-8B's gate and up at 2048 rows).
pub const IN_PLACE_MAX_M: usize = 2048;

/// The weights (indices) to store stacked, each group in program order:
/// those of the `Linear` steps that read one value, 2 to [`STACK_MAX`] of
/// them, dense, of one product type and row length, and read by no other
/// step (so each stays where its other readers expect it).
pub fn stacked_weights(
    program: &Program,
    weights: &[WeightData],
    dtype: WeightDtype,
) -> Vec<Vec<usize>> {
    let mut uses: HashMap<usize, usize> = HashMap::new();
    let mut by_input: Vec<(ValueId, Vec<usize>)> = Vec::new();
    for step in &program.steps {
        match &step.kernel {
            Kernel::Linear { weight } => {
                *uses.entry(*weight).or_default() += 1;
                match by_input.iter_mut().find(|(x, _)| *x == step.inputs[0]) {
                    Some((_, readers)) => readers.push(*weight),
                    None => by_input.push((step.inputs[0], vec![*weight])),
                }
            }
            Kernel::Embedding { weight } => *uses.entry(*weight).or_default() += 1,
            _ => {}
        }
    }
    let stackable = |group: &[usize]| {
        let first = &weights[group[0]];
        let ty = weights::product_type(first, dtype);
        (2..=STACK_MAX).contains(&group.len())
            && group.iter().all(|&w| {
                let weight = &weights[w];
                uses[&w] == 1
                    && weight.spec.shape.len() == 2
                    && weight.spec.shape[1] == first.spec.shape[1]
                    && weights::packed_format(weight, dtype).is_none()
                    && weights::product_type(weight, dtype) == ty
            })
    };
    by_input
        .into_iter()
        .map(|(_, group)| group)
        .filter(|group| stackable(group))
        .collect()
}

/// Products of a group that run as one GEMM over their stacked matrix.
#[derive(Clone, Debug)]
pub struct Stack {
    /// The stacked matrix: the first member's address, all members' rows.
    matrix: DeviceMatrix,
    /// Each member's rows.
    widths: Vec<usize>,
}

impl Stack {
    /// Where the products of `members` (a group's run past the GEMV that
    /// cuBLAS takes, not a gated pair) over `m` rows of x run as one GEMM
    /// whose output is split: 2 to [`STACK_MAX`] dense matrices of one type
    /// and row length stored one after another, their output rows whole
    /// 16-byte units in `y_type` (for the split), `m` up to [`STACK_MAX_M`].
    pub fn of(members: &[DeviceMatrix], m: usize, y_type: GemmType) -> Option<Self> {
        Self::with_rows(members, (m, STACK_MAX_M), y_type)
    }

    /// [`Stack::of`] for an output read where it lies, `m` up to
    /// [`IN_PLACE_MAX_M`].
    pub fn in_place(members: &[DeviceMatrix], m: usize, y_type: GemmType) -> Option<Self> {
        Self::with_rows(members, (m, IN_PLACE_MAX_M), y_type)
    }

    fn with_rows(
        members: &[DeviceMatrix],
        (m, most): (usize, usize),
        y_type: GemmType,
    ) -> Option<Self> {
        let first = members.first()?;
        let adjacent = members.windows(2).all(|pair| {
            pair[1].ptr == pair[0].ptr + pair[0].bytes() as DevicePtr
                && pair[1].ty == first.ty
                && pair[1].cols == first.cols
        });
        let units = members
            .iter()
            .all(|w| (w.rows * y_type.size()).is_multiple_of(16));
        let stackable = (2..=STACK_MAX).contains(&members.len())
            && members.iter().all(|w| w.packed.is_none())
            && adjacent
            && units
            && (1..=most).contains(&m);
        stackable.then(|| Self {
            matrix: DeviceMatrix {
                rows: members.iter().map(|w| w.rows).sum(),
                ..*first
            },
            widths: members.iter().map(|w| w.rows).collect(),
        })
    }

    /// Bytes of the stacked product's output over `m` rows of x, at most
    /// (f32).
    pub fn output_bytes(&self, m: usize) -> usize {
        m * self.matrix.rows * GemmType::F32.size()
    }

    /// `KilnColumnSplit`: the members' first 16-byte units of a row of the
    /// output (in `y_type`) and their outputs.
    fn split_arg(&self, outs: &[DevicePtr], y_type: GemmType) -> KernelArg {
        let mut starts = [0u64; STACK_MAX + 1];
        let mut out = [0u64; STACK_MAX];
        for (p, (&rows, &ptr)) in self.widths.iter().zip(outs).enumerate() {
            starts[p + 1] = starts[p] + (rows * y_type.size() / 16) as u64;
            out[p] = ptr;
        }
        let mut words = vec![self.widths.len() as u64];
        words.extend(starts);
        words.extend(out);
        KernelArg::Struct(words)
    }
}

impl Frame<'_> {
    /// `y = x · Wᵀ` over the stacked matrix of `stack`: its members' outputs
    /// side by side in each row of `y` (scratch of [`Stack::output_bytes`]),
    /// in `y_type`.
    pub(super) fn stacked_gemm(
        &self,
        stack: &Stack,
        (x, m): (DevicePtr, usize),
        (y, y_type): (DevicePtr, GemmType),
    ) -> Result<(), String> {
        let w = &stack.matrix;
        self.device
            .gemm(&Gemm {
                m,
                n: w.rows,
                k: w.cols,
                ty: w.ty,
                x,
                w: w.ptr,
                layout: WeightLayout::OutIn,
                y,
                y_type,
            })
            .map_err(|e| e.to_string())
    }

    /// `outs[i] = x · W_iᵀ` for the members of `stack`: [`Self::stacked_gemm`]
    /// into `y`, its columns then split to the members' outputs, all in
    /// `y_type`.
    pub(super) fn stacked_product(
        &self,
        stack: &Stack,
        outs: &[DevicePtr],
        (x, m): (DevicePtr, usize),
        (y, y_type): (DevicePtr, GemmType),
    ) -> Result<(), String> {
        self.stacked_gemm(stack, (x, m), (y, y_type))?;
        let w = &stack.matrix;
        let units = w.rows * y_type.size() / 16;
        let threads = 256;
        let config = LaunchConfig::new(
            (units.div_ceil(threads) as u32, m as u32, 1),
            (threads as u32, 1, 1),
        );
        let args = [KernelArg::Ptr(y), stack.split_arg(outs, y_type)];
        self.launch("kiln_split_columns", config, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ptr: DevicePtr, rows: usize) -> DeviceMatrix {
        DeviceMatrix::placed(ptr, GemmType::BF16, None, (rows, 256))
    }

    #[test]
    fn only_adjacent_dense_matrices_of_whole_output_units_stack() {
        let q = at(0x1000, 64);
        let k = at(0x1000 + 64 * 256 * 2, 16);
        let v = at(0x1000 + 80 * 256 * 2, 16);
        let stack = Stack::of(&[q, k, v], 12, GemmType::F32).unwrap();
        assert_eq!((stack.matrix.rows, stack.matrix.ptr), (96, 0x1000));
        assert_eq!(stack.widths, [64, 16, 16]);
        // Each member's first unit of a row (f32: 4 to a unit), then its output.
        let KernelArg::Struct(words) = stack.split_arg(&[1, 2, 3], GemmType::F32) else {
            panic!("not a struct");
        };
        assert_eq!(words, [3, 0, 16, 20, 24, 0, 1, 2, 3, 0]);
        // A gap, another order, a single matrix, packed blocks, rows that
        // end mid-unit, no rows or too many.
        assert!(Stack::of(&[q, v], 12, GemmType::F32).is_none());
        assert!(Stack::of(&[k, q], 12, GemmType::F32).is_none());
        assert!(Stack::of(&[q], 12, GemmType::F32).is_none());
        let packed = Some(kiln_kernels::quant::QuantType::Q8_0);
        let packed = DeviceMatrix::placed(0x1000 + 64 * 256 * 2, GemmType::BF16, packed, (16, 256));
        assert!(Stack::of(&[q, packed], 12, GemmType::F32).is_none());
        let odd = at(0x1000 + 64 * 256 * 2, 6);
        assert!(Stack::of(&[q, odd], 12, GemmType::BF16).is_none());
        assert!(Stack::of(&[q, odd], 12, GemmType::F32).is_none());
        assert!(Stack::of(&[q, at(0x1000 + 64 * 256 * 2, 8)], 12, GemmType::BF16).is_some());
        assert!(Stack::of(&[q, k], 0, GemmType::F32).is_none());
        assert!(Stack::of(&[q, k], STACK_MAX_M, GemmType::F32).is_some());
        assert!(Stack::of(&[q, k], STACK_MAX_M + 1, GemmType::F32).is_none());
        // Read where it lies, a whole prefill chunk.
        assert!(Stack::in_place(&[q, k], STACK_MAX_M + 1, GemmType::F32).is_some());
        assert!(Stack::in_place(&[q, k], IN_PLACE_MAX_M, GemmType::F32).is_some());
        assert!(Stack::in_place(&[q, k], IN_PLACE_MAX_M + 1, GemmType::F32).is_none());
    }
}
