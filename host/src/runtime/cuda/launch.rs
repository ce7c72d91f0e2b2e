//! Running one planned step: the launch of its kernel(s) with this step's
//! shapes and buffer addresses.

use std::collections::HashSet;

use kiln_kernels::cuda::{
    Device, DevicePtr, FunctionId, GemmType, KernelArg, LaunchConfig, WeightLayout,
};
use kiln_plugin_api::graph::{DType, ValueId};

use super::attention::HEAD_DIM;
use super::codegen::{self, MAX_RANK};
use super::fusion::{HalfStore, HalfValues};
use super::gemv::{GemvEpilogue, GreedyPicks};
use super::norm_fold::{FoldScratch, NormFolds};
use super::plan::{HandKernels, RowNorm, StepPlan};
use super::products::{
    activates_after_stack, out_type_arg, storage_code, writes_activation, x_half_type, y_half_type,
};
use super::tune::GemvChoices;
use super::weights::DeviceMatrix;
use super::DeviceKvCache;
use crate::compiler::Step;

/// Everything a step's launch reads.
pub struct Frame<'a> {
    /// The device.
    pub device: &'a dyn Device,
    /// The hand-written kernels.
    pub hand: &'a HandKernels,
    /// The kernels launched as programmatic dependents (`None`: none;
    /// generated kernels are too when it is `Some`).
    pub programmatic: Option<&'a HashSet<FunctionId>>,
    /// The decode GEMV's kernel for each launch shape.
    pub gemv: &'a GemvChoices,
    /// Concrete shape of each value (empty for values never materialized).
    pub shapes: &'a [Vec<usize>],
    /// Device address of each value (0 where none).
    pub addrs: &'a [DevicePtr],
    /// Values stored in a half type (products' x and outputs).
    pub half: &'a HalfValues,
    /// Where a kernel reports an out-of-range index.
    pub error_flag: DevicePtr,
    /// The counters of finished splits of split-K attention and tensor-core
    /// products, zero before each launch that uses them.
    pub split_counters: DevicePtr,
    /// The KV cache, when the step batch has one.
    pub cache: Option<&'a DeviceKvCache>,
    /// The logits' product (its output) and where its decode GEMV leaves
    /// greedy's picks.
    pub greedy: Option<(ValueId, GreedyPicks)>,
    /// Attention may run on tensor cores (`AttentionBackend::Auto`).
    pub flash_attention: bool,
    /// Tensor-core decode attention may split into less than a round of
    /// keys (`KILN_SHORT_ATTENTION_SPLITS`).
    pub short_attention_splits: bool,
    /// The adds and norms folded into the products around them, and their
    /// scratch at this step's shapes (where one applies).
    pub folds: (&'a NormFolds, Option<FoldScratch>),
}

pub(super) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// An input of a generated kernel: its address, shape and the half type it
/// is stored in (`None`: as its type says).
pub(super) struct Operand<'a> {
    ptr: DevicePtr,
    shape: &'a [usize],
    half: Option<GemmType>,
}

/// Threads for a kernel that loops over `n` items per block: a multiple of
/// 32, at most 256.
fn block_threads(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Threads for a kernel whose block takes a row of `n` items, as many as
/// the items up to 1024: a decode step's single row is one block, whose
/// items are then read in one round rather than a loop of round trips.
pub(super) fn row_threads(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, 1024) as u32
}

fn row_major_strides(shape: &[usize]) -> Vec<i64> {
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1] as i64;
    }
    strides
}

/// The `KilnStrided` argument of `kiln_copy_strided_*` (see `data.cu`).
struct Strided {
    shape: Vec<usize>,
    in_stride: Vec<i64>,
    out_stride: Vec<i64>,
    in_offset: i64,
    out_offset: i64,
}

impl Strided {
    fn words(&self) -> Vec<u64> {
        let mut words = vec![self.shape.len() as u64];
        let pad = |v: Vec<u64>| {
            let mut v = v;
            v.resize(MAX_RANK, 0);
            v
        };
        words.extend(pad(self.shape.iter().map(|&d| d as u64).collect()));
        words.extend(pad(self.in_stride.iter().map(|&d| d as u64).collect()));
        words.extend(pad(self.out_stride.iter().map(|&d| d as u64).collect()));
        words.push(self.in_offset as u64);
        words.push(self.out_offset as u64);
        words.push(numel(&self.shape) as u64);
        words
    }
}

impl Frame<'_> {
    pub(super) fn kernel(&self, name: &str) -> kiln_kernels::cuda::FunctionId {
        self.hand[name]
    }

    /// The half type `value` is stored in at this step's shapes
    /// ([`HalfStore`]): that of the products reading it (past the decode
    /// GEMV), where its producer writes it so, or W's where cuBLAS computes
    /// it for generated kernels; `None` for f32.
    pub(super) fn stored_half(&self, value: ValueId) -> Option<GemmType> {
        let elements = numel(&self.shapes[value as usize]);
        match self.half.get(&value)? {
            HalfStore::ProductInput(w) => {
                x_half_type(w, WeightLayout::OutIn, elements / w.cols.max(1))
            }
            HalfStore::ProductOutput(w) => {
                y_half_type(w, WeightLayout::OutIn, elements / w.rows.max(1))
            }
        }
    }

    pub(super) fn launch(
        &self,
        name: &str,
        config: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), String> {
        self.launch_function(self.kernel(name), config, args)
    }

    /// Launches `function`, as a programmatic dependent of the previous
    /// kernel where it is one of those that wait for their inputs.
    pub(super) fn launch_function(
        &self,
        function: FunctionId,
        mut config: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), String> {
        config.programmatic = self.programmatic.is_some_and(|w| w.contains(&function));
        self.device
            .launch(function, config, args)
            .map_err(|e| e.to_string())
    }

    /// Launches `name` with one block per row, each with threads for `cols`
    /// items; nothing when there are no rows.
    fn launch_rows(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        args: &[KernelArg],
    ) -> Result<(), String> {
        if rows == 0 {
            return Ok(());
        }
        self.launch(
            name,
            LaunchConfig::linear(rows as u32, block_threads(cols)),
            args,
        )
    }

    /// An RMS norm over `rows` rows of `cols` values: `chunked` (a row held
    /// in registers, two 16-byte chunks a thread) where the row fits and
    /// every pointer in `args` is 16-byte aligned, else `name`, a loop over
    /// the row.
    fn launch_rms_norm(
        &self,
        (name, chunked): (&str, &str),
        rows: usize,
        cols: usize,
        args: &[KernelArg],
    ) -> Result<(), String> {
        const CHUNKS: usize = 2;
        let quads = cols / 4;
        let aligned = args.iter().all(|a| match a {
            KernelArg::Ptr(p) => p % 16 == 0,
            _ => true,
        });
        if rows == 0 || !cols.is_multiple_of(4) || quads > CHUNKS * 1024 || !aligned {
            return self.launch_rows(name, rows, cols, args);
        }
        let threads = (quads.div_ceil(CHUNKS).div_ceil(32) * 32).clamp(32, 1024);
        self.launch(
            chunked,
            LaunchConfig::linear(rows as u32, threads as u32),
            args,
        )
    }

    /// `KilnRowNorm` (kiln_cuda.cuh) of `norm`, or of none, with the rows
    /// scaled by `scale`.
    fn row_norm_arg(&self, norm: Option<&RowNorm>, scale: f32) -> KernelArg {
        let norm = norm.map(|n| {
            let out_type = storage_code(self.stored_half(n.output));
            let (w, y) = (self.addrs[n.weight as usize], self.addrs[n.output as usize]);
            (w, y, n.eps, n.offset, out_type)
        });
        kiln_kernels::cuda::row_norm_arg(norm, scale)
    }

    /// `a [..., m, k] · b [..., k, n]` into `out [..., m, n]`, batched over
    /// the leading axes with NumPy broadcasting. One launch when each side
    /// has every batch or a single one; one per output batch otherwise.
    fn batched_matmul(
        &self,
        (a, a_shape): (DevicePtr, &[usize]),
        (b, b_shape): (DevicePtr, &[usize]),
        (out, out_shape): (DevicePtr, &[usize]),
    ) -> Result<(), String> {
        let split = |shape: &[usize]| {
            let (batch, matrix) = shape.split_at(shape.len() - 2);
            (batch.to_vec(), matrix[0], matrix[1])
        };
        let ((a_batch, m, k), (b_batch, k2, n)) = (split(a_shape), split(b_shape));
        let out_batch = &out_shape[..out_shape.len() - 2];
        let batches: usize = out_batch.iter().product();
        if k != k2 {
            return Err(format!(
                "matmul of {a_shape:?} and {b_shape:?}: inner sizes differ"
            ));
        }
        if batches * m * n == 0 {
            return Ok(());
        }
        let (a_count, b_count) = (a_batch.iter().product(), b_batch.iter().product());
        let whole = |count: usize| count == batches || count == 1;
        let stride = |count: usize, size: usize| if count == 1 { 0 } else { size as i64 };
        let launch = |a: DevicePtr, b: DevicePtr, out: DevicePtr, z: usize, strides: (i64, i64)| {
            let tiles = |len: usize| len.div_ceil(16) as u32;
            let config = LaunchConfig::new((tiles(n), tiles(m), z as u32), (16, 16, 1));
            let args = [
                KernelArg::Ptr(a),
                KernelArg::Ptr(b),
                KernelArg::Ptr(out),
                KernelArg::I32(m as i32),
                KernelArg::I32(n as i32),
                KernelArg::I32(k as i32),
                KernelArg::I64(strides.0),
                KernelArg::I64(strides.1),
            ];
            self.launch("kiln_batched_matmul", config, &args)
        };
        if whole(a_count) && whole(b_count) && batches <= 65_535 {
            let strides = (stride(a_count, m * k), stride(b_count, k * n));
            return launch(a, b, out, batches, strides);
        }
        // Element offsets of each side's matrices over the output's batches.
        let (a_strides, b_strides) = (
            broadcast_strides(&a_batch, out_batch),
            broadcast_strides(&b_batch, out_batch),
        );
        let out_strides = row_major_strides(out_batch);
        for z in 0..batches {
            let (mut a_at, mut b_at) = (0i64, 0i64);
            for d in 0..out_batch.len() {
                let index = (z / out_strides[d] as usize % out_batch[d]) as i64;
                a_at += index * a_strides[d];
                b_at += index * b_strides[d];
            }
            let bytes = |matrices: i64, size: usize| (matrices as u64) * (size as u64) * 4;
            launch(
                a + bytes(a_at, m * k),
                b + bytes(b_at, k * n),
                out + bytes(z as i64, m * n),
                1,
                (0, 0),
            )?;
        }
        Ok(())
    }

    fn copy_strided(
        &self,
        x: DevicePtr,
        y: DevicePtr,
        bytes: usize,
        s: &Strided,
    ) -> Result<(), String> {
        if s.shape.len() > MAX_RANK {
            return Err(format!("rank {} exceeds {MAX_RANK}", s.shape.len()));
        }
        let n = numel(&s.shape);
        if n == 0 {
            return Ok(());
        }
        let name = match bytes {
            4 => "kiln_copy_strided_b4",
            8 => "kiln_copy_strided_b8",
            _ => "kiln_copy_strided_b1",
        };
        self.launch(
            name,
            LaunchConfig::elementwise(n),
            &[
                KernelArg::Ptr(x),
                KernelArg::Ptr(y),
                KernelArg::Struct(s.words()),
            ],
        )
    }

    /// A generated element-wise kernel over `inputs`, each broadcast to
    /// `out`'s shape; an f32 result stored in `out_half` where that is given.
    /// `vector_path`: the kernel has one (`codegen::has_vector_path`).
    fn fused(
        &self,
        (function, vector_path): (FunctionId, bool),
        inputs: &[Operand<'_>],
        (out, out_shape): (DevicePtr, &[usize]),
        out_half: Option<GemmType>,
    ) -> Result<(), String> {
        let n = numel(out_shape);
        if n == 0 {
            return Ok(());
        }
        let mut words = vec![out_shape.len() as u64];
        let mut shape_words: Vec<u64> = out_shape.iter().map(|&d| d as u64).collect();
        shape_words.resize(MAX_RANK, 0);
        words.extend(shape_words);
        for input in inputs {
            let mut strides = broadcast_strides(input.shape, out_shape);
            strides.resize(MAX_RANK, 0);
            words.extend(strides.iter().map(|&s| s as u64));
        }
        if inputs.is_empty() {
            words.extend([0u64; MAX_RANK]);
        }
        words.push(n as u64);
        let mut args = vec![KernelArg::Ptr(out)];
        args.extend(inputs.iter().map(|input| KernelArg::Ptr(input.ptr)));
        args.push(KernelArg::Struct(words));
        args.push(out_type_arg(out_half));
        args.push(codegen::input_types_arg(inputs.iter().map(|i| i.half))?);
        // The vector path's grid where it runs (the kernel checks its
        // condition itself: a grid sized for the other path is only slower).
        let addresses = std::iter::once(out).chain(inputs.iter().map(|i| i.ptr));
        let per_thread = if vector_path && codegen::vector_path_applies(n, addresses) {
            codegen::VECTOR_ELEMENTS_PER_THREAD
        } else {
            codegen::ELEMENTS_PER_THREAD
        };
        // Generated kernels wait for their inputs (codegen.rs).
        let config = LaunchConfig {
            programmatic: self.programmatic.is_some(),
            ..LaunchConfig::elementwise(n.div_ceil(per_thread))
        };
        self.device
            .launch(function, config, &args)
            .map_err(|e| e.to_string())
    }

    /// Runs step `step` as `plan` says; `dtype` is the output's type,
    /// `scratch` the step's scratch buffer (if planned).
    pub fn run(
        &self,
        step: &Step,
        plan: &StepPlan,
        dtype: DType,
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        let element_bytes = super::element_bytes(dtype);
        let out = self.addrs[step.output as usize];
        let out_shape = &self.shapes[step.output as usize];
        let input = |i: usize| self.addrs[step.inputs[i] as usize];
        let in_shape = |i: usize| &self.shapes[step.inputs[i] as usize];
        let rows_of = |shape: &[usize]| numel(shape) / shape.last().copied().unwrap_or(1).max(1);
        let operands = || -> Vec<Operand<'_>> {
            (0..step.inputs.len())
                .map(|i| Operand {
                    ptr: input(i),
                    shape: in_shape(i),
                    half: self.stored_half(step.inputs[i]),
                })
                .collect()
        };
        match plan {
            StepPlan::Alias => Ok(()),
            StepPlan::Linear(w) | StepPlan::MatMul(w) => {
                let layout = match plan {
                    StepPlan::Linear(_) => WeightLayout::OutIn,
                    _ => WeightLayout::InOut,
                };
                let elements = numel(in_shape(0));
                let x = (input(0), self.stored_half(step.inputs[0]).is_some());
                if let StepPlan::Linear(_) = plan {
                    // The GEMV's epilogues: greedy's picks, folded norms.
                    let m = elements / w.cols.max(1);
                    let picks = self.greedy.filter(|&(logits, _)| logits == step.output);
                    let row_scales = self.row_scales(step.inputs[0], m)?;
                    let (epilogue, out) = match self.folded_norm(step.output, m)? {
                        Some((norm, norm_out)) => (Some(GemvEpilogue::AddNorm(norm)), norm_out),
                        None => (picks.map(|(_, p)| GemvEpilogue::GreedyPick(p)), out),
                    };
                    if epilogue.is_some() || row_scales.is_some() {
                        let members = [(*w, out)];
                        let epilogue = (epilogue, row_scales);
                        return self.product_group(&members, epilogue, x, elements, scratch, &[]);
                    }
                }
                let x = self.product_x(w, layout, x, elements, scratch)?;
                let out = (out, self.stored_half(step.output));
                self.product(w, layout, (x, elements), out, scratch)
            }
            StepPlan::BatchedMatMul => self.batched_matmul(
                (input(0), in_shape(0)),
                (input(1), in_shape(1)),
                (out, out_shape),
            ),
            StepPlan::LinearGroup {
                members,
                gated,
                rotation,
            } => {
                let out_halves: Vec<Option<GemmType>> =
                    members.iter().map(|&(_, v)| self.stored_half(v)).collect();
                let members: Vec<(DeviceMatrix, DevicePtr)> = members
                    .iter()
                    .map(|(w, value)| (*w, self.addrs[*value as usize]))
                    .collect();
                let epilogue = match (gated, rotation) {
                    (Some(g), _) => Some(GemvEpilogue::Gated(
                        *g,
                        self.addrs[g.output as usize],
                        self.stored_half(g.output),
                    )),
                    (None, Some(r)) => Some(GemvEpilogue::Rotated(self.gemv_rotation(r)?)),
                    (None, None) => None,
                };
                let x = (input(0), self.stored_half(step.inputs[0]).is_some());
                let elements = numel(in_shape(0));
                let m = members.first().map_or(0, |(w, _)| elements / w.cols.max(1));
                let epilogue = (epilogue, self.row_scales(step.inputs[0], m)?);
                self.product_group(&members, epilogue, x, elements, scratch, &out_halves)
            }
            StepPlan::GatedActivation {
                matrix,
                fused,
                stacked,
                ..
            } => {
                let rows = rows_of(out_shape);
                if writes_activation(matrix, rows) || activates_after_stack(matrix, *stacked, rows)
                {
                    return Ok(()); // written by the product
                }
                let out_half = self.stored_half(step.output);
                // Gate and up whole f32 values (`fuse_gated_activations`
                // takes no other): the kernel has the vector path.
                self.fused((*fused, true), &operands(), (out, out_shape), out_half)
            }
            StepPlan::ComputedAt { .. } => Ok(()),
            StepPlan::AddRmsNorm(norm) => {
                if self.norm_folded(step.output, rows_of(out_shape)) {
                    return Ok(()); // by the product it reads and those reading it
                }
                let cols = *out_shape.last().unwrap_or(&1);
                self.launch_rms_norm(
                    ("kiln_add_rms_norm", "kiln_add_rms_norm_chunks"),
                    rows_of(out_shape),
                    cols,
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(self.addrs[norm.weight as usize]),
                        KernelArg::Ptr(out),
                        KernelArg::Ptr(self.addrs[norm.output as usize]),
                        KernelArg::I32(cols as i32),
                        KernelArg::F32(norm.eps),
                        KernelArg::F32(norm.offset),
                        out_type_arg(self.stored_half(norm.output)),
                    ],
                )
            }
            StepPlan::NormAddRmsNorm {
                post,
                residual,
                sum,
                norm,
            } => {
                let cols = *out_shape.last().unwrap_or(&1);
                let addr = |v: ValueId| KernelArg::Ptr(self.addrs[v as usize]);
                self.launch_rms_norm(
                    ("kiln_norm_add_rms_norm", "kiln_norm_add_rms_norm_chunks"),
                    rows_of(out_shape),
                    cols,
                    &[
                        KernelArg::Ptr(input(0)),
                        addr(*residual),
                        addr(post.weight),
                        KernelArg::F32(post.eps),
                        KernelArg::F32(post.offset),
                        addr(norm.weight),
                        addr(*sum),
                        addr(norm.output),
                        KernelArg::I32(cols as i32),
                        KernelArg::F32(norm.eps),
                        KernelArg::F32(norm.offset),
                        out_type_arg(self.stored_half(norm.output)),
                    ],
                )
            }
            StepPlan::AddRmsNormRows { norm, ids } => {
                let cols = *out_shape.last().unwrap_or(&1);
                self.launch_rms_norm(
                    ("kiln_add_rms_norm_rows", "kiln_add_rms_norm_rows_chunks"),
                    numel(&self.shapes[*ids as usize]),
                    cols,
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(self.addrs[norm.weight as usize]),
                        KernelArg::Ptr(self.addrs[*ids as usize]),
                        KernelArg::I64(rows_of(out_shape) as i64),
                        KernelArg::Ptr(self.addrs[norm.output as usize]),
                        KernelArg::I32(cols as i32),
                        KernelArg::F32(norm.eps),
                        KernelArg::F32(norm.offset),
                        out_type_arg(self.stored_half(norm.output)),
                        KernelArg::Ptr(self.error_flag),
                    ],
                )
            }
            StepPlan::Embedding {
                table,
                function,
                scale,
                norm,
            } => {
                let ids = numel(in_shape(0));
                if ids == 0 {
                    return Ok(());
                }
                let (factor, out) = match scale {
                    Some((factor, scaled)) => (*factor, self.addrs[*scaled as usize]),
                    None => (1.0, out),
                };
                self.device
                    .launch(
                        *function,
                        LaunchConfig::linear(ids as u32, block_threads(table.cols)),
                        &[
                            KernelArg::Ptr(table.ptr),
                            KernelArg::Ptr(input(0)),
                            KernelArg::Ptr(out),
                            KernelArg::I64(table.rows as i64),
                            KernelArg::I32(table.cols as i32),
                            KernelArg::Ptr(self.error_flag),
                            self.row_norm_arg(norm.as_ref(), factor),
                        ],
                    )
                    .map_err(|e| e.to_string())
            }
            StepPlan::Fused(function, inputs) => {
                let out_half = self.stored_half(step.output);
                let kernel = (*function, codegen::has_vector_path(inputs, dtype));
                self.fused(kernel, &operands(), (out, out_shape), out_half)
            }
            StepPlan::RmsNorm { eps, offset } => {
                let cols = *out_shape.last().unwrap_or(&1);
                self.launch_rms_norm(
                    ("kiln_rms_norm", "kiln_rms_norm_chunks"),
                    rows_of(out_shape),
                    cols,
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(out),
                        KernelArg::I32(cols as i32),
                        KernelArg::F32(*eps),
                        KernelArg::F32(*offset),
                        out_type_arg(self.stored_half(step.output)),
                    ],
                )
            }
            StepPlan::LayerNorm(eps) => {
                let cols = *out_shape.last().unwrap_or(&1);
                self.launch_rows(
                    "kiln_layer_norm",
                    rows_of(out_shape),
                    cols,
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(input(2)),
                        KernelArg::Ptr(out),
                        KernelArg::I32(cols as i32),
                        KernelArg::F32(*eps),
                    ],
                )
            }
            StepPlan::Softmax { axis, log } => {
                let cols = out_shape[*axis];
                let inner: usize = out_shape[axis + 1..].iter().product();
                self.launch_rows(
                    "kiln_softmax",
                    numel(out_shape) / cols.max(1),
                    cols,
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(out),
                        KernelArg::I32(cols as i32),
                        KernelArg::I32(inner as i32),
                        KernelArg::I32(i32::from(*log)),
                    ],
                )
            }
            StepPlan::Rope {
                interleaved,
                scale,
                with,
                cache_write,
                in_group,
                head_norms,
            } => self.rope(
                step,
                (*interleaved, *scale),
                *with,
                (*cache_write, *in_group),
                *head_norms,
            ),
            StepPlan::Attention {
                spec,
                cache_written,
            } => self.attention(step, spec, *cache_written, scratch),
            StepPlan::SequenceAttention(spec) => {
                let (q, k) = (in_shape(0), in_shape(1));
                let (tokens, heads, head_dim) = (q[0], q[1], q[2]);
                if head_dim > HEAD_DIM || heads % k[1] != 0 {
                    return Err(format!(
                        "{heads} query heads over {} key/value heads of {head_dim} are not supported (head_dim ≤ {HEAD_DIM})",
                        k[1]
                    ));
                }
                if tokens == 0 {
                    return Ok(());
                }
                self.launch(
                    "kiln_sequence_attention",
                    LaunchConfig::new((tokens as u32, heads as u32, 1), (128, 1, 1)),
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(input(2)),
                        KernelArg::Ptr(out),
                        KernelArg::Ptr(input(3)),
                        KernelArg::I32(numel(in_shape(3)) as i32 - 1),
                        KernelArg::I32(heads as i32),
                        KernelArg::I32(k[1] as i32),
                        KernelArg::I32(head_dim as i32),
                        KernelArg::F32(spec.scale),
                        KernelArg::I32(i32::from(spec.causal)),
                    ],
                )
            }
            StepPlan::MixtureOfExperts(moe) => {
                let x = in_shape(0);
                let hidden = x.last().copied().unwrap_or(1);
                let bias = if step.inputs.len() > 2 { input(2) } else { 0 };
                self.mixture_of_experts(
                    moe,
                    input(0),
                    input(1),
                    bias,
                    out,
                    rows_of(x),
                    hidden,
                    scratch,
                )
            }
            StepPlan::Gather(axis) => {
                let data = in_shape(0);
                let outer: usize = data[..*axis].iter().product();
                let inner: usize = data[axis + 1..].iter().product();
                let count = numel(in_shape(1));
                let total = outer * count * inner;
                if total == 0 {
                    return Ok(());
                }
                let name = match element_bytes {
                    4 => "kiln_gather_b4",
                    8 => "kiln_gather_b8",
                    _ => "kiln_gather_b1",
                };
                self.launch(
                    name,
                    LaunchConfig::elementwise(total),
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(out),
                        KernelArg::I64(outer as i64),
                        KernelArg::I64(count as i64),
                        KernelArg::I64(data[*axis] as i64),
                        KernelArg::I64(inner as i64),
                        KernelArg::Ptr(self.error_flag),
                    ],
                )
            }
            StepPlan::Slice {
                axis,
                start,
                step: stride,
            } => {
                let in_strides = row_major_strides(in_shape(0));
                let mut strided_in = in_strides.clone();
                strided_in[*axis] *= *stride as i64;
                let s = Strided {
                    shape: out_shape.clone(),
                    in_stride: strided_in,
                    out_stride: row_major_strides(out_shape),
                    in_offset: *start as i64 * in_strides[*axis],
                    out_offset: 0,
                };
                self.copy_strided(input(0), out, element_bytes, &s)
            }
            StepPlan::Permute(perm) => {
                let in_strides = row_major_strides(in_shape(0));
                let s = Strided {
                    shape: out_shape.clone(),
                    in_stride: perm.iter().map(|&p| in_strides[p]).collect(),
                    out_stride: row_major_strides(out_shape),
                    in_offset: 0,
                    out_offset: 0,
                };
                self.copy_strided(input(0), out, element_bytes, &s)
            }
            StepPlan::BroadcastTo => {
                let s = Strided {
                    shape: out_shape.clone(),
                    in_stride: broadcast_strides(in_shape(0), out_shape),
                    out_stride: row_major_strides(out_shape),
                    in_offset: 0,
                    out_offset: 0,
                };
                self.copy_strided(input(0), out, element_bytes, &s)
            }
            StepPlan::Concat(axis) => {
                let out_strides = row_major_strides(out_shape);
                let mut at = 0usize;
                for i in 0..step.inputs.len() {
                    let part = in_shape(i);
                    let s = Strided {
                        shape: part.clone(),
                        in_stride: row_major_strides(part),
                        out_stride: out_strides.clone(),
                        in_offset: 0,
                        out_offset: at as i64 * out_strides[*axis],
                    };
                    self.copy_strided(input(i), out, element_bytes, &s)?;
                    at += part[*axis];
                }
                Ok(())
            }
            StepPlan::Print(label) => {
                let tensor = super::download(self.device, dtype, out_shape.clone(), input(0))
                    .map_err(|e| e.to_string())?;
                crate::runtime::executor::print_tensor(label, &tensor);
                let bytes = numel(out_shape) * element_bytes;
                self.device
                    .copy(out, input(0), bytes)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// Strides that read `input` (numpy-broadcast) at each index of `output`.
pub fn broadcast_strides(input: &[usize], output: &[usize]) -> Vec<i64> {
    let own = row_major_strides(input);
    let lead = output.len() - input.len();
    (0..output.len())
        .map(|d| {
            if d < lead || input[d - lead] == 1 {
                0
            } else {
                own[d - lead]
            }
        })
        .collect()
}
