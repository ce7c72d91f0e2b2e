//! Matrix products of a step: the route each takes by its rows of x, the
//! scratch it needs, and its launches. Up to [`GEMV_MAX_M`] rows of x
//! (decode; [`DENSE_GEMV_MAX_M`] for dense matrices), the GEMV of
//! `kernels/cuda/gemv.cuh` reads each matrix once, packed GGUF blocks
//! included, with x in f32; matrices that share x (q, k
//! and v; gate and up) run as one launch (`gemv.rs`), in the split of rows
//! among warps chosen at load (`tune.rs`). Packed matrices with up to
//! [`qmm::QMM_MAX_M`] rows of x (decode of many sequences, short prompts)
//! run on tensor cores reading the blocks (`qmm.rs`), x cast to bf16, again
//! a launch for the matrices of one format that share x. More rows go to
//! cuBLAS on x cast to the weight's half type, a packed matrix expanded to
//! bf16 first, both in the step's scratch; dense matrices that share x and
//! were stored stacked (q, k and v) take one GEMM (`stacked.rs`). With
//! `--precision fast`, the GEMV of packed matrices reads x quantized to 8
//! bits in the scratch (`kiln_quantize_x8`, once for the matrices that share
//! x) and takes integer dot products.
//!
//! [`GEMV_MAX_M`]: super::gemv::GEMV_MAX_M
//! [`DENSE_GEMV_MAX_M`]: super::gemv::DENSE_GEMV_MAX_M

use kiln_kernels::cuda::{DevicePtr, Gemm, GemmType, KernelArg, LaunchConfig, WeightLayout};
use kiln_plugin_api::graph::ValueId;

use super::fusion::GatedProduct;
use super::gemv::{gemv_kernel, group_arg, GemvEpilogue, GemvGroup, GemvRotation};
use super::launch::Frame;
use super::plan::{RotatingGroup, StepPlan};
use super::qmm::{self, QmmLaunch};
use super::stacked::{Stack, IN_PLACE_MAX_M};
use super::tune::{GemvShape, RowPairs};
use super::weights::{DeviceMatrix, Packed};

/// `(n, k)` of a product over `w` stored as `layout`.
fn product_dims(w: &DeviceMatrix, layout: WeightLayout) -> (usize, usize) {
    match layout {
        WeightLayout::OutIn => (w.rows, w.cols),
        WeightLayout::InOut => (w.cols, w.rows),
    }
}

/// How `m` rows of x times `w` run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    /// The decode GEMV (`gemv_kernel` names it).
    Gemv,
    /// Packed blocks on tensor cores.
    Qmm(QmmLaunch),
    /// cuBLAS on x cast to W's half type (and W expanded from its blocks).
    Gemm,
}

fn route(w: &DeviceMatrix, layout: WeightLayout, m: usize) -> Route {
    if gemv_kernel(w, layout, m).is_some() {
        return Route::Gemv;
    }
    qmm::single(w, layout, m).map_or(Route::Gemm, Route::Qmm)
}

/// The stack of a group's run of products over `m` rows of x that cuBLAS
/// takes, where they run as one GEMM (`stacked.rs`; not a gated pair,
/// whose activation its own step computes from both outputs).
fn stack_of<T>(
    run: &[(DeviceMatrix, T)],
    gated: bool,
    m: usize,
    y_type: GemmType,
) -> Option<Stack> {
    let matrices: Vec<DeviceMatrix> = run.iter().map(|&(w, _)| w).collect();
    let on_cublas = matrices
        .iter()
        .all(|w| route(w, WeightLayout::OutIn, m) == Route::Gemm);
    (on_cublas && !gated)
        .then(|| Stack::of(&matrices, m, y_type))
        .flatten()
}

/// Whether q, k and v, whose rotation (and cache write) moved into their
/// group's product ([`RotatingGroup`]), rotate after one stacked GEMM over
/// `m` rows: past the GEMV, on cuBLAS, stored stacked. The rotary launch
/// then reads q, k and v from the GEMM's rows (no split of its columns, a
/// launch a layer fewer), writes the rotated q and k and the cache, and the
/// group's rotation step is skipped.
pub fn rotates_after_stack(group: &RotatingGroup, m: usize) -> bool {
    group.stacked
        && group.gemv.kernel(m).is_none()
        && route(&group.gemv.first, WeightLayout::OutIn, m) == Route::Gemm
        && (1..=IN_PLACE_MAX_M).contains(&m)
}

/// Whether a gated MLP's gate and up ([`GatedProduct`], `gate` their first
/// matrix) write their activation after one stacked
/// GEMM over `m` rows: past the GEMV and the tensor-core product (which
/// write it themselves), on cuBLAS, stored `stacked`, rows a multiple of 4.
/// `kiln_gated_rows` (data.cu) then reads gate and up from the GEMM's rows
/// and writes `act(gate) · up`: one GEMM where there were two, and the
/// activation step is skipped.
pub fn activates_after_stack(gate: &DeviceMatrix, stacked: bool, m: usize) -> bool {
    stacked
        && !writes_activation(gate, m)
        && route(gate, WeightLayout::OutIn, m) == Route::Gemm
        && gate.rows.is_multiple_of(4)
        && (1..=IN_PLACE_MAX_M).contains(&m)
}

/// The half type `m` rows of x times `w` read x in: bf16 on tensor cores,
/// W's own type for cuBLAS; `None` for f32 (the GEMV, f32 matrices).
pub fn x_half_type(w: &DeviceMatrix, layout: WeightLayout, m: usize) -> Option<GemmType> {
    match route(w, layout, m) {
        Route::Gemv => None,
        Route::Qmm(_) => Some(GemmType::BF16),
        Route::Gemm => Some(w.ty).filter(|&ty| ty != GemmType::F32),
    }
}

/// The half type `m` rows of x times `w` store their output in when only
/// generated kernels read it (`fusion::HalfStore::ProductOutput`): W's own
/// where cuBLAS computes it with a half W (rounding its f32 sums once);
/// `None` for f32 (the GEMV, the tensor-core product of packed blocks, f32
/// matrices).
pub fn y_half_type(w: &DeviceMatrix, layout: WeightLayout, m: usize) -> Option<GemmType> {
    match route(w, layout, m) {
        Route::Gemm => Some(w.ty).filter(|&ty| ty != GemmType::F32),
        Route::Gemv | Route::Qmm(_) => None,
    }
}

/// How kernels number the storage of an f32 value (`KILN_OUT_*` in
/// kiln_cuda.cuh, for `store_as` and `load_as`): 0 f32, 1 bf16, 2 f16.
pub fn storage_code(half: Option<GemmType>) -> u32 {
    match half {
        None | Some(GemmType::F32) => 0,
        Some(GemmType::BF16) => 1,
        Some(GemmType::F16) => 2,
    }
}

/// The `out_type` argument of kernels that may store an f32 result in a
/// half type for the products that read it (`store_as` in kiln_cuda.cuh).
pub fn out_type_arg(half: Option<GemmType>) -> KernelArg {
    KernelArg::I32(storage_code(half) as i32)
}

/// Whether the product of a gated MLP's gate and up over `m` rows of x
/// writes their activation (the GEMV's or the tensor-core product's
/// epilogue), so the activation's own kernel does not run.
pub fn writes_activation(gate: &DeviceMatrix, m: usize) -> bool {
    GemvGroup::of([gate, gate]).is_some_and(|g| g.kernel(m).is_some())
        || QmmLaunch::of(&[*gate, *gate], true, m).is_some()
}

/// Bytes of `x_elements` values of x quantized to 8 bits
/// (`kiln_quantize_x8`): a byte each, and 8 per block of 32.
fn int8_x_bytes(x_elements: usize) -> usize {
    x_elements + x_elements / 32 * 8
}

/// The scratch a product over `w` needs for `x_elements` values of x: x cast
/// to W's half type (bf16 for packed blocks, at offset 0), then W expanded
/// from its blocks to bf16 (a GEMM) or the partial sums of K's splits (on
/// tensor cores), at the returned offset. `(offset, total bytes)`; for a
/// GEMV, x quantized to 8 bits where it takes that, else nothing.
fn product_scratch(w: &DeviceMatrix, layout: WeightLayout, x_elements: usize) -> (usize, usize) {
    let k = product_dims(w, layout).1;
    let m = x_elements / k.max(1);
    if m == 0 {
        return (0, 0);
    }
    let aligned = |bytes: usize| bytes.div_ceil(super::memory::ALIGN) * super::memory::ALIGN;
    match route(w, layout, m) {
        Route::Gemv if w.int8_activations => (0, int8_x_bytes(x_elements)),
        Route::Gemv => (0, 0),
        Route::Qmm(q) => qmm_scratch(&q, x_elements, m),
        Route::Gemm => {
            let cast = if w.ty == GemmType::F32 {
                0
            } else {
                x_elements * w.ty.size()
            };
            match w.packed {
                Some(_) => {
                    let offset = aligned(cast);
                    (offset, offset + w.rows * w.cols * GemmType::BF16.size())
                }
                None => (0, cast),
            }
        }
    }
}

/// The scratch of a tensor-core product: x in bf16, then the splits'
/// partial sums at the returned offset.
fn qmm_scratch(q: &QmmLaunch, x_elements: usize, m: usize) -> (usize, usize) {
    let aligned = |bytes: usize| bytes.div_ceil(super::memory::ALIGN) * super::memory::ALIGN;
    let offset = aligned(x_elements * GemmType::BF16.size());
    (offset, offset + q.partial_bytes(m))
}

/// A group's members in runs of one format (a mixed group's last member
/// alone): past the GEMV each run is one tensor-core launch where
/// [`QmmLaunch::of`] takes it ([`run_qmm`]), else a product each.
fn format_runs<T>(members: &[(DeviceMatrix, T)]) -> impl Iterator<Item = &[(DeviceMatrix, T)]> {
    members.chunk_by(|a, b| a.0.packed == b.0.packed)
}

/// The tensor-core launch of a run of `format_runs` over `m` rows of x,
/// where they run as one.
fn run_qmm<T>(run: &[(DeviceMatrix, T)], gated: bool, m: usize) -> Option<QmmLaunch> {
    let matrices: Vec<DeviceMatrix> = run.iter().map(|&(w, _)| w).collect();
    QmmLaunch::of(&matrices, gated, m)
}

/// The most any launch of a group's products past the GEMV needs (one per
/// run of `format_runs`), over `x_elements` values of x: `launch` of a run's
/// tensor-core launch, else the most `each` of its products one by one.
fn most_of_its_runs(
    members: &[(DeviceMatrix, ValueId)],
    gated: bool,
    x_elements: usize,
    launch: impl Fn(&QmmLaunch, usize) -> usize,
    each: impl Fn(&DeviceMatrix) -> usize,
) -> usize {
    let m = x_elements / members.first().map_or(1, |(w, _)| w.cols.max(1));
    let run_needs = |run: &[(DeviceMatrix, ValueId)]| match run_qmm(run, gated, m) {
        Some(q) => launch(&q, m),
        None => run.iter().map(|(w, _)| each(w)).max().unwrap_or(0),
    };
    format_runs(members).map(run_needs).max().unwrap_or(0)
}

/// Scratch bytes `plan` needs when its first input has `x_elements` values
/// (a group's products run one after another in one scratch, or as one
/// launch per run of one format).
pub fn scratch_bytes(plan: &StepPlan, x_elements: usize) -> usize {
    let product = |w: &DeviceMatrix, layout| product_scratch(w, layout, x_elements).1;
    match plan {
        StepPlan::Linear(w) => product(w, WeightLayout::OutIn),
        StepPlan::MatMul(w) => product(w, WeightLayout::InOut),
        StepPlan::LinearGroup {
            members,
            gated,
            rotation,
        } => {
            let in_place = gated.is_some_and(|g| g.stacked) || rotation.is_some_and(|r| r.stacked);
            let stacked = stack_scratch(members, gated.is_some(), in_place, x_elements);
            most_of_its_runs(
                members,
                gated.is_some(),
                x_elements,
                |q, m| qmm_scratch(q, x_elements, m).1,
                |w| product(w, WeightLayout::OutIn),
            )
            .max(stacked.1)
        }
        _ => 0,
    }
}

/// The scratch of a group's stacked product (x cast to W's type, then the
/// product's output at the returned offset): `(offset, total bytes)`, or
/// nothing where its products do not stack. `in_place`: its output is read
/// where it lies (gate and up's activation, q, k and v's rotation), not
/// split.
fn stack_scratch<T>(
    members: &[(DeviceMatrix, T)],
    gated: bool,
    in_place: bool,
    x_elements: usize,
) -> (usize, usize) {
    let Some(first) = members.first().map(|(w, _)| w) else {
        return (0, 0);
    };
    let m = x_elements / first.cols.max(1);
    // The output type is the members' (f32 or W's half type): sized for f32.
    let stack = match in_place {
        true => Stack::in_place(
            &members.iter().map(|(w, _)| *w).collect::<Vec<_>>(),
            m,
            GemmType::F32,
        ),
        false => stack_of(members, gated, m, GemmType::F32),
    };
    match stack {
        Some(stack) => {
            let offset = stack_output_offset(first, x_elements);
            (offset, offset + stack.output_bytes(m))
        }
        None => (0, 0),
    }
}

/// Where a stacked product's output starts in the scratch: past x cast to
/// W's type (`x_elements` values).
fn stack_output_offset(w: &DeviceMatrix, x_elements: usize) -> usize {
    (x_elements * w.ty.size()).div_ceil(super::memory::ALIGN) * super::memory::ALIGN
}

/// Bytes of the zeroed split counters `plan` needs when its first input has
/// `x_elements` values: a split tensor-core product's, one per tile (a
/// launch's counters are back at zero when it ends, so a group's launches
/// share them).
pub fn split_counter_bytes(plan: &StepPlan, x_elements: usize) -> usize {
    let single = |w: &DeviceMatrix| {
        let m = x_elements / w.cols.max(1);
        qmm::single(w, WeightLayout::OutIn, m).map_or(0, |q| q.counter_bytes())
    };
    match plan {
        StepPlan::Linear(w) => single(w),
        StepPlan::LinearGroup { members, gated, .. } => most_of_its_runs(
            members,
            gated.is_some(),
            x_elements,
            |q, _| q.counter_bytes(),
            single,
        ),
        _ => 0,
    }
}

impl Frame<'_> {
    /// x as the product over `w` reads it: cast to bf16 (tensor cores) or
    /// to W's half type (cuBLAS) at the start of the scratch, else as it is
    /// (f32, or already in that half type: `written_half`, its producer
    /// stored it so). Products that share x take it from one call.
    pub(super) fn product_x(
        &self,
        w: &DeviceMatrix,
        layout: WeightLayout,
        (x, written_half): (DevicePtr, bool),
        x_elements: usize,
        scratch: Option<DevicePtr>,
    ) -> Result<DevicePtr, String> {
        let m = x_elements / product_dims(w, layout).1.max(1);
        let half = x_half_type(w, layout, m).filter(|_| !written_half);
        let Some(half) = half else {
            return Ok(x);
        };
        let to = scratch.ok_or("no scratch buffer planned for x in a half type")?;
        self.cast_x(half, x, x_elements, to)
    }

    /// `out [m, n] = x [m, k] · W`, x as [`Self::product_x`] gives it: the
    /// decode GEMV for small `m`, packed blocks on tensor cores for moderate
    /// `m`, else cuBLAS on x cast to W's half type (and W expanded from its
    /// blocks). `out_half`: out is stored in that type ([`y_half_type`]).
    pub(super) fn product(
        &self,
        w: &DeviceMatrix,
        layout: WeightLayout,
        (x, x_elements): (DevicePtr, usize),
        (out, out_half): (DevicePtr, Option<GemmType>),
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        let (n, k) = product_dims(w, layout);
        let m = x_elements / k.max(1);
        let route = route(w, layout, m);
        if out_half.is_some() && out_half != y_half_type(w, layout, m) {
            return Err(format!("a product's output in {out_half:?} on {route:?}"));
        }
        if route == Route::Gemv {
            let (members, x) = ([(*w, out)], (x, false));
            return self.product_group(&members, (None, None), x, x_elements, scratch, &[]);
        }
        let (second_offset, bytes) = product_scratch(w, layout, x_elements);
        let scratch = match bytes {
            0 => 0,
            _ => scratch.ok_or("no scratch buffer planned")?,
        };
        let second = scratch + second_offset as DevicePtr;
        if let Route::Qmm(q) = route {
            return self.qmm(&q, &[(*w, out)], None, (x, m), second);
        }
        let weights = match w.packed {
            None => w.ptr,
            Some(packed) => {
                let blocks = w.rows * w.cols / packed.block_elems();
                self.launch(
                    packed.kernels().dequant,
                    LaunchConfig::elementwise(blocks * packed.lanes()),
                    &[
                        KernelArg::Ptr(w.ptr),
                        KernelArg::Ptr(second),
                        KernelArg::I64(blocks as i64),
                    ],
                )?;
                second
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
                y_type: out_half.unwrap_or(GemmType::F32),
            })
            .map_err(|e| e.to_string())
    }

    /// x [`x_elements`] f32 cast to the half type `half` at `to`.
    fn cast_x(
        &self,
        half: GemmType,
        x: DevicePtr,
        x_elements: usize,
        to: DevicePtr,
    ) -> Result<DevicePtr, String> {
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
                KernelArg::Ptr(to),
                KernelArg::I64(x_elements as i64),
            ],
        )?;
        Ok(to)
    }

    /// [`Self::product_group`] past the GEMV: one tensor-core launch for
    /// each run of packed matrices of one format (a gated pair's activation
    /// written by it too), else one product each, all on x cast once (the
    /// members share W's type, and so the type their route reads x in).
    /// Rotations are left to their steps, greedy's picks to the sampler.
    fn products_past_the_gemv(
        &self,
        members: &[(DeviceMatrix, DevicePtr)],
        epilogue: Option<GemvEpilogue>,
        x: (DevicePtr, bool),
        x_elements: usize,
        scratch: Option<DevicePtr>,
        out_halves: &[Option<GemmType>],
    ) -> Result<(), String> {
        let (first, layout) = (members[0].0, WeightLayout::OutIn);
        let m = x_elements / first.cols.max(1);
        let x = self.product_x(&first, layout, x, x_elements, scratch)?;
        if let Some(GemvEpilogue::Rotated(rotation)) = &epilogue {
            let group = GemvGroup::of(members.iter().map(|(w, _)| w)).map(|gemv| RotatingGroup {
                gemv,
                stacked: rotation.stacked,
            });
            if group.is_some_and(|g| rotates_after_stack(&g, m)) {
                if out_halves.get(2).copied().flatten().is_some() {
                    return Err("v, written by the rotary launch, is stored in a half type".into());
                }
                return self.rotate_after_stack(members, rotation, (x, m), x_elements, scratch);
            }
        }
        let gated = match epilogue {
            Some(GemvEpilogue::Gated(product, out, half)) => Some((product, out, half)),
            _ => None,
        };
        if let Some(gated) = gated.filter(|(p, ..)| activates_after_stack(&first, p.stacked, m)) {
            let y_type = out_halves.first().copied().flatten();
            return self.activate_after_stack(
                members,
                gated,
                (x, m),
                x_elements,
                (scratch, y_type),
            );
        }
        let mut done = 0;
        for run in format_runs(members) {
            let y_type = out_halves.get(done).copied().flatten();
            let same_type =
                (done..done + run.len()).all(|i| out_halves.get(i).copied().flatten() == y_type);
            let y_type = y_type.unwrap_or(GemmType::F32);
            let stack = stack_of(run, gated.is_some(), m, y_type).filter(|_| same_type);
            if let Some(stack) = stack {
                let offset = stack_output_offset(&run[0].0, x_elements);
                let y = scratch.ok_or("no scratch buffer planned for a stacked product")?
                    + offset as DevicePtr;
                let outs: Vec<DevicePtr> = run.iter().map(|&(_, out)| out).collect();
                self.stacked_product(&stack, &outs, (x, m), (y, y_type))?;
                done += run.len();
                continue;
            }
            let Some(q) = run_qmm(run, gated.is_some(), m) else {
                for (i, (w, out)) in run.iter().enumerate() {
                    let out = (*out, out_halves.get(done + i).copied().flatten());
                    self.product(w, layout, (x, x_elements), out, scratch)?;
                }
                done += run.len();
                continue;
            };
            let (offset, bytes) = qmm_scratch(&q, x_elements, m);
            let scratch = scratch.ok_or("no scratch buffer planned for x in bf16")?;
            let partials = if bytes > offset {
                scratch + offset as DevicePtr
            } else {
                0
            };
            match gated {
                Some((product, out, half)) => {
                    let pair = [run[product.gate], run[1 - product.gate]];
                    let activation = Some((product.activation, out, half));
                    self.qmm(&q, &pair, activation, (x, m), partials)?;
                }
                None => self.qmm(&q, run, None, (x, m), partials)?,
            }
            done += run.len();
        }
        Ok(())
    }

    /// q, k and v ([`rotates_after_stack`]): their one GEMM into the scratch
    /// in f32, then the rotary launch reading its rows, writing the rotated
    /// q and k and the cache (the members' own outputs are left unwritten:
    /// only the skipped rotation step reads q and k, only the attention, which
    /// reads the cache, v).
    fn rotate_after_stack(
        &self,
        members: &[(DeviceMatrix, DevicePtr)],
        rotation: &GemvRotation,
        (x, m): (DevicePtr, usize),
        x_elements: usize,
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        let matrices: Vec<DeviceMatrix> = members.iter().map(|&(w, _)| w).collect();
        let stack = Stack::in_place(&matrices, m, GemmType::F32)
            .ok_or("q, k and v planned to rotate after one stacked product do not stack")?;
        let y = scratch.ok_or("no scratch buffer planned for a stacked product")?
            + stack_output_offset(&matrices[0], x_elements) as DevicePtr;
        self.stacked_gemm(&stack, (x, m), (y, GemmType::F32))?;
        let (q_width, kv_width) = (matrices[0].rows, matrices[1].rows);
        self.rope_after_stack(rotation, (y, m), (q_width, kv_width))
    }

    /// A gated MLP's gate and up ([`activates_after_stack`]): their one GEMM
    /// into the scratch (in `y_type`, the type gate's and up's outputs are
    /// stored in: W's half type, or f32 for `None`), then `kiln_gated_rows`
    /// writing the activation to `out` in `half` (f32 for `None`); gate's and
    /// up's own outputs are left unwritten (only the skipped activation step
    /// reads them).
    fn activate_after_stack(
        &self,
        members: &[(DeviceMatrix, DevicePtr)],
        (product, out, half): (GatedProduct, DevicePtr, Option<GemmType>),
        (x, m): (DevicePtr, usize),
        x_elements: usize,
        (scratch, y_type): (Option<DevicePtr>, Option<GemmType>),
    ) -> Result<(), String> {
        let matrices: Vec<DeviceMatrix> = members.iter().map(|&(w, _)| w).collect();
        let in_type = y_type.unwrap_or(GemmType::F32);
        // As planned (`GatedProduct::stacked`): whole units of f32 rows, what
        // `activates_after_stack`'s rows of a multiple of 4 give.
        let stack = Stack::in_place(&matrices, m, GemmType::F32)
            .ok_or("gate and up planned to run as one stacked product do not stack")?;
        let y = scratch.ok_or("no scratch buffer planned for a stacked product")?
            + stack_output_offset(&matrices[0], x_elements) as DevicePtr;
        self.stacked_gemm(&stack, (x, m), (y, in_type))?;
        let n = matrices[0].rows;
        // Member i's outputs start at i · n in a row (gate is member 0 or 1).
        let (gate_at, up_at) = (product.gate * n, (1 - product.gate) * n);
        let quads = m * n / 4;
        let quads_arg = i32::try_from(quads)
            .map_err(|_| format!("{m} rows of {n}: too many for kiln_gated_rows"))?;
        let int = |v: usize| KernelArg::I32(v as i32);
        self.launch(
            "kiln_gated_rows",
            LaunchConfig::elementwise(quads),
            &[
                KernelArg::Ptr(y),
                KernelArg::Ptr(out),
                KernelArg::I32(quads_arg),
                int(n),
                int(gate_at),
                int(up_at),
                KernelArg::I32(product.activation as i32),
                out_type_arg(y_type),
                out_type_arg(half),
            ],
        )
    }

    /// `out_i = x · W_iᵀ` for matrices that share x: one GEMV launch over
    /// all their rows for small batches (where a [`GemvGroup`] holds them),
    /// else one product each.
    /// `epilogue`: the members are a gated MLP's gate and up, and the GEMV
    /// writes their activation to the address given instead; or q, k and v,
    /// and the GEMV applies their rotation (and cache write) too; or the
    /// logits' matrix, and the GEMV finds greedy's picks too; or one matrix
    /// with a residual add and norm after it. `row_scales`: each row of x's
    /// products times its scale (a norm folded in before). Past the GEMV
    /// neither a folded norm nor the rest is done here, and member i's
    /// output is stored in `out_halves[i]` (none: f32).
    pub(super) fn product_group(
        &self,
        members: &[(DeviceMatrix, DevicePtr)],
        (epilogue, row_scales): (Option<GemvEpilogue>, Option<DevicePtr>),
        (x, written_half): (DevicePtr, bool),
        x_elements: usize,
        scratch: Option<DevicePtr>,
        out_halves: &[Option<GemmType>],
    ) -> Result<(), String> {
        let Some((first, _)) = members.first() else {
            return Ok(());
        };
        let k = first.cols;
        let m = x_elements / k.max(1);
        if m == 0 {
            return Ok(());
        }
        let group = GemvGroup::of(members.iter().map(|(w, _)| w));
        let Some(name) = group.and_then(|g| g.kernel(m)) else {
            if row_scales.is_some() || matches!(epilogue, Some(GemvEpilogue::AddNorm(_))) {
                return Err(format!(
                    "a norm folded into products of {m} rows past the GEMV"
                ));
            }
            return self.products_past_the_gemv(
                members,
                epilogue,
                (x, written_half),
                x_elements,
                scratch,
                out_halves,
            );
        };
        let x = if first.int8_activations {
            let to = scratch.ok_or("no scratch buffer planned for 8-bit x")?;
            self.launch(
                "kiln_quantize_x8",
                LaunchConfig::elementwise(x_elements),
                &[
                    KernelArg::Ptr(x),
                    KernelArg::Ptr(to),
                    KernelArg::I64((x_elements / 32) as i64),
                ],
            )?;
            to
        } else {
            x
        };
        let rows: usize = members.iter().map(|(w, _)| w.rows).sum();
        let int = |v: usize| KernelArg::I32(v as i32);
        let scaled = (None, row_scales);
        let (group, pairs) = match &epilogue {
            Some(GemvEpilogue::Gated(_, _, Some(half))) => {
                return Err(format!("a gated GEMV's activation in {half:?}"))
            }
            Some(GemvEpilogue::Gated(product, out, None)) => {
                let (gate, up) = (members[product.gate], members[1 - product.gate]);
                let pair = [(gate.0, *out), up];
                let group = group_arg(&pair, Some(product.activation), None, None, scaled);
                (group, RowPairs::Gated)
            }
            Some(GemvEpilogue::Rotated(rotation)) => (
                group_arg(members, None, Some(rotation), None, scaled),
                RowPairs::Rotated,
            ),
            Some(GemvEpilogue::GreedyPick(picks)) if members.len() == 1 => (
                group_arg(members, None, None, Some(picks), scaled),
                RowPairs::Unpaired,
            ),
            Some(GemvEpilogue::AddNorm(norm)) if members.len() == 1 => (
                group_arg(members, None, None, None, (Some(norm), row_scales)),
                RowPairs::Unpaired,
            ),
            Some(GemvEpilogue::GreedyPick(_) | GemvEpilogue::AddNorm(_)) => {
                return Err("greedy's pick or a folded norm in a GEMV of several matrices".into())
            }
            None => (
                group_arg(members, None, None, None, scaled),
                RowPairs::Unpaired,
            ),
        };
        let shape = GemvShape {
            kernel: name,
            rows,
            k,
            pairs,
        };
        let choice = self.gemv.get(&shape, self.hand);
        self.launch_function(
            choice.function,
            choice.config(rows),
            &[group, KernelArg::Ptr(x), int(m), int(k)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_kernels::quant::QuantType;

    fn matrix(packed: Option<QuantType>, rows: usize, cols: usize) -> DeviceMatrix {
        DeviceMatrix::unplaced(packed, rows, cols)
    }

    #[test]
    fn packed_products_between_the_gemv_and_cublas_run_on_tensor_cores() {
        let o_proj = matrix(Some(QuantType::Q4K), 4096, 4096);
        let route = |w: &DeviceMatrix, m| route(w, WeightLayout::OutIn, m);
        assert_eq!(route(&o_proj, 8), Route::Gemv);
        let qmm = QmmLaunch::of(&[o_proj], false, 9).map(Route::Qmm);
        assert_eq!(Some(route(&o_proj, 9)), qmm);
        assert_eq!(route(&o_proj, 65), Route::Gemm);
        assert_eq!(route(&matrix(None, 4096, 4096), 16), Route::Gemm);
        let stored_in_out = super::route(&o_proj, WeightLayout::InOut, 16);
        assert_eq!(stored_in_out, Route::Gemm);
    }

    #[test]
    fn gated_products_write_their_activation_on_the_gemv_and_tensor_cores() {
        let up = matrix(Some(QuantType::Q4K), 14336, 4096);
        assert!(writes_activation(&up, 8) && writes_activation(&up, 9));
        assert!(writes_activation(&up, 64) && !writes_activation(&up, 65));
        let dense = matrix(None, 14336, 4096);
        // Dense rows leave the GEMV past two rows of x (cuBLAS).
        assert!(writes_activation(&dense, 2) && !writes_activation(&dense, 3));
        assert!(!writes_activation(&dense, 8) && !writes_activation(&dense, 16));
        let opted_in = DeviceMatrix {
            dense_on_tensor_cores: true,
            ..dense
        };
        assert!(writes_activation(&opted_in, 3) && writes_activation(&opted_in, 16));
    }

    #[test]
    fn gemvs_on_8_bit_x_have_their_kernels_and_scratch() {
        let w = DeviceMatrix {
            int8_activations: true,
            ..matrix(Some(QuantType::Q4K), 1024, 4096)
        };
        let gemv = |m| gemv_kernel(&w, WeightLayout::OutIn, m);
        assert_eq!(gemv(1), Some("kiln_gemv_q4_k_x8_m1"));
        assert_eq!(gemv(8), Some("kiln_gemv_q4_k_x8"));
        // A byte a value, and (d, d·Σq) per block of 32.
        let x8 = product_scratch(&w, WeightLayout::OutIn, 8 * 4096);
        assert_eq!(x8, (0, 8 * 4096 + 8 * 128 * 8));
        // Past the GEMV, x in bf16 on tensor cores as in exact precision.
        let qmm = product_scratch(&w, WeightLayout::OutIn, 16 * 4096);
        assert_eq!(qmm.0, 16 * 4096 * 2);
    }

    #[test]
    fn scratch_holds_x_in_bf16_and_the_partial_sums() {
        let w = matrix(Some(QuantType::Q4K), 1024, 4096);
        let (offset, total) = product_scratch(&w, WeightLayout::OutIn, 64 * 4096);
        assert_eq!(offset, 64 * 4096 * 2);
        assert_eq!(total, offset + 16 * 64 * 1024 * 4);
        let wide = matrix(Some(QuantType::Q4K), 128_256, 4096);
        let (offset, total) = product_scratch(&wide, WeightLayout::OutIn, 16 * 4096);
        assert_eq!((offset, total), (16 * 4096 * 2, 16 * 4096 * 2));
    }

    #[test]
    fn a_mixed_group_past_the_gemv_runs_each_format_on_tensor_cores() {
        let (q, k) = (
            matrix(Some(QuantType::Q4K), 4096, 4096),
            matrix(Some(QuantType::Q4K), 1024, 4096),
        );
        let v = matrix(Some(QuantType::Q6K), 1024, 4096);
        let members = vec![(q, 0), (k, 1), (v, 2)];
        let runs: Vec<usize> = format_runs(&members).map(<[_]>::len).collect();
        assert_eq!(runs, [2, 1]);
        let plan = StepPlan::LinearGroup {
            members,
            gated: None,
            rotation: None,
        };
        // q and k as one launch, v as another: the scratch and counters of
        // the larger.
        let x_elements = 16 * 4096;
        let qk = QmmLaunch::of(&[q, k], false, 16).unwrap();
        let v_alone = QmmLaunch::of(&[v], false, 16).unwrap();
        let bytes = |q: &QmmLaunch| qmm_scratch(q, x_elements, 16).1;
        assert_eq!(
            scratch_bytes(&plan, x_elements),
            bytes(&qk).max(bytes(&v_alone))
        );
        let counters = qk.counter_bytes().max(v_alone.counter_bytes());
        assert_eq!(split_counter_bytes(&plan, x_elements), counters);
        assert!(counters > 0);
    }
}
