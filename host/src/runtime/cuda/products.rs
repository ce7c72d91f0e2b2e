//! Matrix products of a step. Up to [`GEMV_MAX_M`] rows of x (decode), the
//! GEMV of `kernels/cuda/gemv.cu` reads each matrix once, packed GGUF blocks
//! included, with x in f32; matrices that share x (q, k and v; gate and up)
//! run as one launch, in the split of rows among warps chosen at load
//! (`tune.rs`). More rows go to cuBLAS on x cast to the weight's half
//! type, a packed matrix expanded to bf16 first, both in the step's scratch.

use kiln_kernels::cuda::{DevicePtr, Gemm, GemmType, KernelArg, LaunchConfig, WeightLayout};

use super::launch::Frame;
use super::plan::StepPlan;
use super::tune::GemvShape;
use super::weights::DeviceMatrix;

/// Most rows of x the decode GEMV takes (`KILN_GEMV_MAX_M` in gemv.cu).
pub const GEMV_MAX_M: usize = 8;
/// Warps per GEMV block (`KILN_GEMV_WARPS`).
pub const GEMV_WARPS: usize = 4;
/// Matrices one GEMV launch covers at most (`KILN_GEMV_MAX_GROUP`).
pub const GEMV_MAX_GROUP: usize = 4;

/// `(n, k)` of a product over `w` stored as `layout`.
fn product_dims(w: &DeviceMatrix, layout: WeightLayout) -> (usize, usize) {
    match layout {
        WeightLayout::OutIn => (w.rows, w.cols),
        WeightLayout::InOut => (w.cols, w.rows),
    }
}

/// The decode GEMV for `m` rows of x times `w` (stored `[n, k]`), where one
/// applies: a single row has kernels of its own (fewer registers, more
/// weight loads in flight).
pub fn gemv_kernel(w: &DeviceMatrix, layout: WeightLayout, m: usize) -> Option<&'static str> {
    if m > GEMV_MAX_M || layout != WeightLayout::OutIn {
        return None;
    }
    let (many, one) = match (w.packed, w.ty) {
        (Some(p), _) => (p.kernels().gemv, p.kernels().gemv_m1),
        (None, GemmType::BF16) => ("kiln_gemv_bf16", "kiln_gemv_bf16_m1"),
        (None, GemmType::F16) => ("kiln_gemv_f16", "kiln_gemv_f16_m1"),
        (None, GemmType::F32) => ("kiln_gemv_f32", "kiln_gemv_f32_m1"),
    };
    Some(if m == 1 { one } else { many })
}

/// The scratch a GEMM over `w` needs for `x_elements` values of x: x cast
/// to W's half type (at offset 0), then W expanded from its blocks to bf16
/// (at the returned offset). `(offset, total bytes)`; nothing for a GEMV.
fn gemm_scratch(w: &DeviceMatrix, layout: WeightLayout, x_elements: usize) -> (usize, usize) {
    let (_, k) = product_dims(w, layout);
    let m = x_elements / k.max(1);
    if m == 0 || gemv_kernel(w, layout, m).is_some() {
        return (0, 0);
    }
    let cast = if w.ty == GemmType::F32 {
        0
    } else {
        x_elements * w.ty.size()
    };
    let offset = cast.div_ceil(super::memory::ALIGN) * super::memory::ALIGN;
    match w.packed {
        Some(_) => (offset, offset + w.rows * w.cols * GemmType::BF16.size()),
        None => (0, cast),
    }
}

/// Scratch bytes `plan` needs when its first input has `x_elements` values
/// (a group's products run one after another in one scratch).
pub fn scratch_bytes(plan: &StepPlan, x_elements: usize) -> usize {
    match plan {
        StepPlan::Linear(w) => gemm_scratch(w, WeightLayout::OutIn, x_elements).1,
        StepPlan::MatMul(w) => gemm_scratch(w, WeightLayout::InOut, x_elements).1,
        StepPlan::LinearGroup(members) => members
            .iter()
            .map(|(w, _)| gemm_scratch(w, WeightLayout::OutIn, x_elements).1)
            .max()
            .unwrap_or(0),
        _ => 0,
    }
}

/// The `KilnGemvGroup` argument: the matrices (with their outputs) as one
/// grid of rows.
pub fn group_arg(members: &[(DeviceMatrix, DevicePtr)]) -> KernelArg {
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
    KernelArg::Struct(words)
}

impl Frame<'_> {
    /// `out [m, n] = x [m, k] · W`: the decode GEMV for small `m`, else
    /// cuBLAS on x cast to W's half type (and W expanded from its blocks).
    pub(super) fn product(
        &self,
        w: &DeviceMatrix,
        layout: WeightLayout,
        x: DevicePtr,
        x_elements: usize,
        out: DevicePtr,
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        let (n, k) = product_dims(w, layout);
        let m = x_elements / k.max(1);
        if m == 0 {
            return Ok(());
        }
        if gemv_kernel(w, layout, m).is_some() {
            return self.product_group(&[(*w, out)], x, x_elements, scratch);
        }
        let (matrix_offset, bytes) = gemm_scratch(w, layout, x_elements);
        let scratch = match bytes {
            0 => 0,
            _ => scratch.ok_or("no scratch buffer planned")?,
        };
        let x = match w.ty {
            GemmType::F32 => x,
            half => {
                let name = if half == GemmType::BF16 {
                    "kiln_f32_to_bf16"
                } else {
                    "kiln_f32_to_f16"
                };
                self.launch(
                    name,
                    LaunchConfig::elementwise(x_elements),
                    &[
                        KernelArg::Ptr(x),
                        KernelArg::Ptr(scratch),
                        KernelArg::I64(x_elements as i64),
                    ],
                )?;
                scratch
            }
        };
        let weights = match w.packed {
            None => w.ptr,
            Some(packed) => {
                let expanded = scratch + matrix_offset as DevicePtr;
                let blocks = w.rows * w.cols / packed.quant_type().block_elems();
                self.launch(
                    packed.kernels().dequant,
                    LaunchConfig::elementwise(w.rows * w.cols),
                    &[
                        KernelArg::Ptr(w.ptr),
                        KernelArg::Ptr(expanded),
                        KernelArg::I64(blocks as i64),
                    ],
                )?;
                expanded
            }
        };
        self.device
            .gemm(&Gemm {
                m,
                n,
                k,
                ty: w.ty,
                x,
                w: weights,
                layout,
                y: out,
            })
            .map_err(|e| e.to_string())
    }

    /// `out_i = x · W_iᵀ` for matrices of one format that share x: one GEMV
    /// launch over all their rows for small batches, else one product each.
    pub(super) fn product_group(
        &self,
        members: &[(DeviceMatrix, DevicePtr)],
        x: DevicePtr,
        x_elements: usize,
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        let Some((first, _)) = members.first() else {
            return Ok(());
        };
        let k = first.cols;
        let m = x_elements / k.max(1);
        let gemv = gemv_kernel(first, WeightLayout::OutIn, m);
        let (Some(name), true) = (gemv, m > 0 && members.len() <= GEMV_MAX_GROUP) else {
            return members.iter().try_for_each(|(w, out)| {
                self.product(w, WeightLayout::OutIn, x, x_elements, *out, scratch)
            });
        };
        let rows: usize = members.iter().map(|(w, _)| w.rows).sum();
        let int = |v: usize| KernelArg::I32(v as i32);
        let shape = GemvShape {
            kernel: name,
            rows,
            k,
        };
        let choice = self.gemv.get(&shape, self.hand);
        self.device
            .launch(
                choice.function,
                choice.config(rows),
                &[group_arg(members), KernelArg::Ptr(x), int(m), int(k)],
            )
            .map_err(|e| e.to_string())
    }
}
