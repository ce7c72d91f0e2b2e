//! Lowering a compiled [`Program`] to CUDA work, once at load: which kernel
//! each step launches and where each value lives (the arena, or a persistent
//! buffer for weights and constants). Everything that depends on the step's
//! shapes is left to run time (`launch.rs`).

use std::collections::HashMap;

use kiln_kernels::cuda::{Device, FunctionId, GemmType};
use kiln_plugin_api::graph::{AttentionSpec, DType, Op, SequenceAttentionSpec, ValueId};

use super::codegen::{self, FusedInput};
use super::gemv::{DenseGemvRows, GemvGroup};
use super::qmm::DenseRows;
use super::weights::{self, DeviceMatrix, WeightDtype};
use super::CudaError;
use crate::compiler::{ElementOp, Instr, Kernel, Operand, Program, Step};
use crate::runtime::precision::ProductPrecisions;
use crate::runtime::tensor::Tensor;
use crate::runtime::{Precision, WeightData};

/// An RMS norm taken by the launch of another step: the add before it, an
/// embedding, the gather after it, a post-norm before the add
/// (`fusion.rs`, `end_norms.rs`, `post_norms.rs`).
#[derive(Clone, Copy, Debug)]
pub struct RowNorm {
    /// Epsilon.
    pub eps: f32,
    /// Added to the weight (Gemma's 1 + w).
    pub offset: f32,
    /// The weight, on the device.
    pub weight: ValueId,
    /// The value the launch writes the norm to.
    pub output: ValueId,
}

/// The per-head RMS norms of q and k (Qwen3's and Gemma 3's `q_norm` and
/// `k_norm`) that their paired rotation takes (`head_norms.rs`): the norms'
/// outputs, the rotation's inputs, are not written.
#[derive(Clone, Copy, Debug)]
pub struct HeadNorms {
    /// q's norm (its output the rotation's input).
    pub q: RowNorm,
    /// The norm's input: q before it.
    pub q_in: ValueId,
    /// k's norm.
    pub k: RowNorm,
    /// k before it.
    pub k_in: ValueId,
}

/// What one step launches.
#[derive(Clone, Debug)]
pub enum StepPlan {
    /// Same bytes, new shape: no work.
    Alias,
    /// `x · Wᵀ` on the device's GEMM (x cast to W's type first when W is half).
    Linear(DeviceMatrix),
    /// `x · W` with a stored `W [k, n]` (GPT-2's Conv1D).
    MatMul(DeviceMatrix),
    /// `a · b` of two f32 values `[..., m, k]` and `[..., k, n]`, batched
    /// over the leading axes with broadcasting.
    BatchedMatMul,
    /// Several `Linear` steps that read the same x with matrices of one
    /// format (q, k and v; gate and up), run here as one launch.
    LinearGroup {
        /// Each matrix with the value it writes (this step's output first).
        members: Vec<(DeviceMatrix, ValueId)>,
        /// A gated MLP's gate and up, whose activation step the decode GEMV
        /// computes too.
        gated: Option<super::fusion::GatedProduct>,
        /// q, k and v, whose rotation (and cache write) the decode GEMV
        /// applies too.
        rotation: Option<GroupRotation>,
    },
    /// `act(gate) · up` of a gated MLP (a generated kernel), computed by the
    /// [`StepPlan::LinearGroup`] at `at` instead when that runs as the decode
    /// GEMV (which writes the products of a pair of rows of gate and up no
    /// further than the block's shared memory), as the tensor-core product
    /// of packed blocks, or as one stacked GEMM past them.
    GatedActivation {
        /// The step of the gate and up products.
        at: usize,
        /// Their first matrix (which says whether they run as a GEMV).
        matrix: DeviceMatrix,
        /// Gate and up are stored stacked: past the GEMV, one GEMM and
        /// `kiln_gated_rows` write it (`products::activates_after_stack`).
        stacked: bool,
        /// The generated kernel, for steps that do not.
        fused: FunctionId,
    },
    /// `x = a + b` written, and `rms_norm(x, w)` of a later step with it,
    /// in one kernel (the residual stream and the next norm's input).
    AddRmsNorm(RowNorm),
    /// A product's post-norm, the residual add reading it and the norm of
    /// that sum in one launch at the post-norm's step (`post_norms.rs`):
    /// `sum = residual + post(x)` and `norm(sum)` written, `post(x)` not.
    NormAddRmsNorm {
        /// The post-norm (its output unwritten).
        post: RowNorm,
        /// The add's other input.
        residual: ValueId,
        /// The add's output.
        sum: ValueId,
        /// The norm of the sum.
        norm: RowNorm,
    },
    /// A step computed earlier, by the step `at` (a [`StepPlan::LinearGroup`],
    /// an [`StepPlan::AddRmsNorm`], a paired [`StepPlan::Rope`], or the
    /// embedding, [`StepPlan::AddRmsNormRows`] or
    /// [`StepPlan::NormAddRmsNorm`] that take a norm).
    ComputedAt {
        /// The step that computes it.
        at: usize,
    },
    /// Rows of a table, scaled where a scaling that alone reads them is
    /// fused in, and the RMS norm that reads them where that is
    /// (`end_norms.rs`).
    Embedding {
        /// The table.
        table: DeviceMatrix,
        /// Its kernel (`kiln_embedding_*`).
        function: FunctionId,
        /// The factor (Gemma's √hidden, Granite's embedding multiplier) and
        /// the scaling's output, which the launch writes instead of the
        /// embedding's.
        scale: Option<(f32, ValueId)>,
        /// The norm.
        norm: Option<RowNorm>,
    },
    /// The last layer's residual add and RMS norm with the gather of the
    /// rows whose logits are asked for (`end_norms.rs`): the gathered rows
    /// of the norm, written as the gather's output; the sum and the whole
    /// norm are not written (nothing else reads them).
    AddRmsNormRows {
        /// The norm, whose output here is the gather's.
        norm: RowNorm,
        /// The gather's row ids.
        ids: ValueId,
    },
    /// A generated element-wise kernel.
    Fused(FunctionId, Vec<FusedInput>),
    /// RMS normalization.
    RmsNorm {
        /// Epsilon.
        eps: f32,
        /// Added to the weight.
        offset: f32,
    },
    /// Layer normalization.
    LayerNorm(f32),
    /// Rotary embedding.
    Rope {
        /// Adjacent pairs.
        interleaved: bool,
        /// cos/sin scale.
        scale: f32,
        /// A second rotation at the same positions run in the same launch
        /// (k with q): its input and output.
        with: Option<(ValueId, ValueId)>,
        /// The KV-cache write of the paged attention that reads the second
        /// rotation's output as its keys, done by this launch.
        cache_write: Option<CacheWrite>,
        /// Done by the product of q, k and v instead (a
        /// [`StepPlan::LinearGroup`] with a [`GroupRotation`]) when that runs
        /// as the decode GEMV, or as one stacked GEMM whose output the
        /// rotary launch then reads (`products::rotates_after_stack`).
        in_group: Option<RotatingGroup>,
        /// q's and k's per-head norms, taken by this launch before it
        /// rotates (`head_norms.rs`).
        head_norms: Option<HeadNorms>,
    },
    /// Softmax or log-softmax over an axis.
    Softmax {
        /// The axis.
        axis: usize,
        /// Log-softmax.
        log: bool,
    },
    /// Paged attention: cache write (unless a [`StepPlan::Rope`] does it),
    /// then attention.
    Attention {
        /// The op.
        spec: AttentionSpec,
        /// The keys and values are in the cache already.
        cache_written: bool,
    },
    /// Attention within each sequence over the step's own keys (encoders).
    SequenceAttention(SequenceAttentionSpec),
    /// A mixture of experts: routing, then the picked experts.
    MixtureOfExperts(super::moe::MoePlan),
    /// Gather along an axis.
    Gather(usize),
    /// A strided slice.
    Slice {
        /// Axis.
        axis: usize,
        /// First index.
        start: usize,
        /// Stride.
        step: usize,
    },
    /// Axis permutation.
    Permute(Vec<usize>),
    /// Broadcast.
    BroadcastTo,
    /// Concatenation.
    Concat(usize),
    /// Print the value (downloads it).
    Print(String),
}

/// What a rotary launch needs to write a layer's keys and values into the
/// paged cache: the values and the batch description (graph inputs), the
/// layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheWrite {
    /// The values `[T, kv_heads, head_dim]`.
    pub v: ValueId,
    /// The attention's `row_offsets`, `context_lens` and `block_tables`.
    pub batch: [ValueId; 3],
    /// The cache layer.
    pub layer: u32,
}

/// A paired [`StepPlan::Rope`] of q and k (with its cache write) that the
/// decode GEMV of q, k and v applies as it writes them: its inputs and
/// outputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupRotation {
    /// Adjacent pairs.
    pub interleaved: bool,
    /// cos/sin scale.
    pub scale: f32,
    /// The positions `[T]` and the frequencies `[half]`.
    pub positions: ValueId,
    pub inv_freq: ValueId,
    /// The rotated q and k.
    pub q_out: ValueId,
    pub k_out: ValueId,
    /// The cache write of the rotated keys and the values.
    pub cache_write: Option<CacheWrite>,
    /// q, k and v are stored stacked, the cache write takes v and nothing
    /// but attentions reading the cache reads v: past the GEMV their one
    /// product's output is rotated where it lies (v's own value unwritten).
    pub stacked: bool,
}

/// The q, k and v products a rotation moved into ([`GroupRotation`]): their
/// GEMV, and whether they rotate after one stacked GEMM past it.
#[derive(Clone, Copy, Debug)]
pub struct RotatingGroup {
    /// The group's GEMV.
    pub gemv: GemvGroup,
    /// [`GroupRotation::stacked`].
    pub stacked: bool,
}

/// Where a value's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// Planned in the arena under this root value (itself, or the value a
    /// reshape aliases).
    Arena(ValueId),
    /// A buffer made at load (weights read as values, constants).
    Persistent(u64),
    /// Never read as a value (a weight only a product or an embedding reads).
    Nowhere,
}

/// Everything lowered at load.
pub struct Lowered {
    /// One plan per program step.
    pub steps: Vec<StepPlan>,
    /// Per value.
    pub homes: Vec<Home>,
    /// Values stored in a half type (products' x and outputs).
    pub half: super::fusion::HalfValues,
    /// Adds and norms folded into the decode GEMVs around them.
    pub folds: super::norm_fold::NormFolds,
    /// Persistent allocations (to free with the executor).
    pub owned: Vec<u64>,
    /// Generated kernel sources, by name, for dumps and compile checks.
    pub generated: Vec<(String, String)>,
    /// Bytes of weights one step reads (products' matrices, other weights).
    pub weight_bytes_per_step: usize,
    /// Floating-point operations of the matrix products per token (two per
    /// matrix element).
    pub product_flops_per_token: f64,
    /// The product whose output is the logits (the graph's first output, as
    /// it is or reshaped): its output and matrix. Its decode GEMV also
    /// finds greedy's picks.
    pub logits_product: Option<(ValueId, DeviceMatrix)>,
}

/// The hand-written kernels, by name.
pub type HandKernels = HashMap<String, FunctionId>;

/// Lowers `program` onto `device`: uploads weights and constants, generates
/// and loads the fused kernels, and picks each step's kernel. Fails naming the
/// first step no CUDA kernel covers. `precision` picks the products whose
/// decode GEMV takes x in 8 bits (`int8_activations`): those of packed
/// matrices that `precision.rs` gives [`Precision::Fast`] (not the logits';
/// `fast-residual`'s two-digit products keep f32 x here); `dense_rows`,
/// where dense bf16 products of more rows than the GEMV's `dense_gemv_rows`
/// (and at most 64) run.
pub fn lower(
    device: &dyn Device,
    program: &Program,
    weights: &[WeightData],
    (dtype, precision): (WeightDtype, Precision),
    (dense_rows, dense_gemv_rows): (DenseRows, DenseGemvRows),
    hand: &HandKernels,
) -> Result<Lowered, CudaError> {
    let graph = &program.graph;
    let precisions = ProductPrecisions::new(program, precision);
    let mut owned = Vec::new();
    let mut weight_bytes_per_step = 0;
    let mut homes = vec![Home::Nowhere; graph.nodes.len()];
    // Values every step reads; weights among them are stored as f32 values.
    let read: std::collections::HashSet<ValueId> = program
        .steps
        .iter()
        .flat_map(|s| s.inputs.iter().copied())
        .chain(graph.outputs.iter().copied())
        .collect();
    for (id, node) in graph.nodes.iter().enumerate() {
        let id = id as ValueId;
        homes[id as usize] = match &node.op {
            Op::Input { .. } => Home::Arena(id),
            Op::Weight { index } if read.contains(&id) => {
                weight_bytes_per_step += weights[*index].elements() * 4;
                let ptr = weights::upload_values(device, &weights[*index])?;
                owned.push(ptr);
                Home::Persistent(ptr)
            }
            Op::Constant(c) if read.contains(&id) => {
                let shape = node
                    .ty
                    .static_shape()
                    .map(|s| s.iter().map(|&d| d as usize).collect())
                    .unwrap_or_default();
                let tensor = Tensor::from_f64(node.ty.dtype, shape, &c.values);
                let ptr = weights::upload_tensor(device, &tensor, "a constant")?;
                owned.push(ptr);
                Home::Persistent(ptr)
            }
            _ => Home::Nowhere,
        };
    }
    let mut matrices: HashMap<usize, DeviceMatrix> = HashMap::new();
    // Dense matrices that share x, stored one after another
    // (`stacked.rs`).
    for group in super::stacked::stacked_weights(program, weights, dtype) {
        let members: Vec<&WeightData> = group.iter().map(|&w| &weights[w]).collect();
        let ty = weights::product_type(members[0], dtype);
        let (base, placed) = weights::upload_stacked(device, &members, ty)?;
        owned.push(base);
        matrices.extend(group.into_iter().zip(placed));
    }
    // Bytes and elements of each product's matrix.
    let mut product_matrices: HashMap<usize, (usize, usize)> = HashMap::new();
    let mut matrix = |index: usize, owned: &mut Vec<u64>| -> Result<DeviceMatrix, CudaError> {
        if let Some(m) = matrices.get(&index) {
            return Ok(*m);
        }
        let weight = &weights[index];
        let packed = weights::packed_format(weight, dtype);
        let ty = weights::product_type(weight, dtype);
        let m = weights::upload_matrix(device, weight, ty, packed)?;
        owned.push(m.ptr);
        matrices.insert(index, m);
        Ok(m)
    };
    let mut fused_modules: HashMap<String, FunctionId> = HashMap::new();
    let mut generated = Vec::new();
    let mut steps = Vec::with_capacity(program.steps.len());
    for step in &program.steps {
        let node = &graph.nodes[step.output as usize];
        let unsupported = |message: String| CudaError::Unsupported {
            op: format!("%{} = {}", step.output, node.op.name()),
            module: node.module.clone(),
            message,
        };
        let plan = match &step.kernel {
            Kernel::Linear { weight } => {
                let m = matrix(*weight, &mut owned)?;
                product_matrices.insert(*weight, (m.bytes(), m.rows * m.cols));
                StepPlan::Linear(DeviceMatrix {
                    int8_activations: m.packed.is_some()
                        && precisions.of(step.output) == Precision::Fast,
                    dense_on_tensor_cores: dense_rows == DenseRows::TensorCores
                        && m.packed.is_none()
                        && m.ty == GemmType::BF16,
                    dense_gemv_rows: dense_gemv_rows.0,
                    ..m
                })
            }
            Kernel::Embedding { weight } => {
                let m = matrix(*weight, &mut owned)?;
                StepPlan::Embedding {
                    table: m,
                    function: hand[weights::embedding_kernel(&m)],
                    scale: None,
                    norm: None,
                }
            }
            Kernel::MixtureOfExperts { gate, up, down } => {
                let Op::MixtureOfExperts(spec) = &node.op else {
                    return Err(unsupported(
                        "a mixture-of-experts step on another op".into(),
                    ));
                };
                let experts = [gate.as_slice(), up, down];
                let plan = super::moe::plan(device, spec, experts, weights, dtype, &mut owned)
                    .map_err(unsupported)?;
                // A batch-1 step reads its token's picked experts.
                product_matrices.insert(gate[0], plan.per_token);
                StepPlan::MixtureOfExperts(plan)
            }
            Kernel::Fused { program: instrs } => fused(
                device,
                program,
                step,
                instrs,
                &mut fused_modules,
                &mut generated,
            )
            .map_err(unsupported)?,
            Kernel::Node => match &node.op {
                Op::Unary { .. } | Op::Binary { .. } | Op::Where | Op::Cast { .. } => {
                    let instr = single_instruction(&node.op, node.ty.dtype, step.inputs.len());
                    fused(
                        device,
                        program,
                        step,
                        &[instr],
                        &mut fused_modules,
                        &mut generated,
                    )
                    .map_err(unsupported)?
                }
                Op::Reshape { .. } => StepPlan::Alias,
                Op::RmsNorm { eps, weight_offset } => StepPlan::RmsNorm {
                    eps: *eps,
                    offset: *weight_offset,
                },
                Op::LayerNorm { eps } => StepPlan::LayerNorm(*eps),
                Op::Rope { interleaved, scale } => StepPlan::Rope {
                    interleaved: *interleaved,
                    scale: *scale,
                    with: None,
                    cache_write: None,
                    in_group: None,
                    head_norms: None,
                },
                Op::Softmax { axis } | Op::LogSoftmax { axis } => StepPlan::Softmax {
                    axis: *axis,
                    log: matches!(node.op, Op::LogSoftmax { .. }),
                },
                Op::PagedAttention(spec) => {
                    let metadata_are_inputs = step.inputs[3..]
                        .iter()
                        .all(|&v| matches!(graph.nodes[v as usize].op, Op::Input { .. }));
                    if !metadata_are_inputs {
                        return Err(unsupported(
                            "row_offsets, context_lens and block_tables must be graph inputs"
                                .into(),
                        ));
                    }
                    StepPlan::Attention {
                        spec: spec.clone(),
                        cache_written: false,
                    }
                }
                Op::SequenceAttention(spec) => {
                    if !matches!(graph.nodes[step.inputs[3] as usize].op, Op::Input { .. }) {
                        return Err(unsupported("row_offsets must be a graph input".into()));
                    }
                    StepPlan::SequenceAttention(spec.clone())
                }
                Op::MatMul => {
                    let w = step.inputs[1] as usize;
                    match (&graph.nodes[w].op, graph.nodes[w].ty.rank()) {
                        (Op::Weight { index }, 2) => {
                            // The weight is a value input of this step, so it
                            // is on the device already, as f32 [k, n].
                            let Home::Persistent(ptr) = homes[w] else {
                                return Err(unsupported("the weight is not on the device".into()));
                            };
                            let shape = &weights[*index].spec.shape;
                            StepPlan::MatMul(DeviceMatrix {
                                ptr,
                                ty: kiln_kernels::cuda::GemmType::F32,
                                packed: None,
                                rows: shape[0] as usize,
                                cols: shape[1] as usize,
                                int8_activations: false,
                                dense_on_tensor_cores: false,
                                dense_gemv_rows: dense_gemv_rows.0,
                            })
                        }
                        _ if step.inputs.iter().all(|&v| {
                            graph.nodes[v as usize].ty.dtype == DType::F32
                                && graph.nodes[v as usize].ty.rank() >= 2
                        }) =>
                        {
                            StepPlan::BatchedMatMul
                        }
                        _ => {
                            return Err(unsupported(
                                "products of two values are supported in f32 only".into(),
                            ))
                        }
                    }
                }
                Op::Gather { axis } => StepPlan::Gather(*axis),
                Op::Slice {
                    axis, start, step, ..
                } => StepPlan::Slice {
                    axis: *axis,
                    start: *start as usize,
                    step: *step as usize,
                },
                Op::Permute { perm } => StepPlan::Permute(perm.clone()),
                Op::BroadcastTo { .. } => StepPlan::BroadcastTo,
                Op::Concat { axis } => StepPlan::Concat(*axis),
                Op::Print { label } => StepPlan::Print(label.clone()),
                _ => return Err(unsupported("no CUDA kernel yet".into())),
            },
        };
        if let StepPlan::Alias = plan {
            let input = step.inputs[0] as usize;
            homes[step.output as usize] = match homes[input] {
                Home::Nowhere => Home::Arena(step.output),
                other => other,
            };
        } else {
            homes[step.output as usize] = Home::Arena(step.output);
        }
        steps.push(plan);
    }
    let half = super::fusion::fuse(program, &homes, &mut steps);
    let folds = super::norm_fold::NormFolds::find(program, &steps);
    let logits_product = logits_product(program, &steps);
    weight_bytes_per_step += product_matrices.values().map(|m| m.0).sum::<usize>();
    let product_elements: usize = product_matrices.values().map(|m| m.1).sum();
    Ok(Lowered {
        steps,
        homes,
        half,
        folds,
        owned,
        generated,
        weight_bytes_per_step,
        product_flops_per_token: 2.0 * product_elements as f64,
        logits_product,
    })
}

/// The `Linear` step that writes the graph's first output (through
/// reshapes only): its output and matrix.
fn logits_product(program: &Program, steps: &[StepPlan]) -> Option<(ValueId, DeviceMatrix)> {
    let mut value = *program.graph.outputs.first()?;
    loop {
        let s = program.steps.iter().position(|step| step.output == value)?;
        match &steps[s] {
            StepPlan::Alias => value = *program.steps[s].inputs.first()?,
            StepPlan::Linear(w) => return Some((value, *w)),
            _ => return None,
        }
    }
}

/// An element-wise op as a one-instruction fused program.
fn single_instruction(op: &Op, dtype: kiln_plugin_api::graph::DType, inputs: usize) -> Instr {
    let op = match op {
        Op::Unary { op } => ElementOp::Unary { f: *op },
        Op::Binary { op } => ElementOp::Binary { f: *op },
        Op::Where => ElementOp::Where,
        _ => ElementOp::Cast,
    };
    Instr {
        op,
        args: (0..inputs).map(Operand::Input).collect(),
        dtype,
    }
}

/// Generates (or reuses) the kernel of a fused step.
fn fused(
    device: &dyn Device,
    program: &Program,
    step: &Step,
    instrs: &[Instr],
    modules: &mut HashMap<String, FunctionId>,
    generated: &mut Vec<(String, String)>,
) -> Result<StepPlan, String> {
    let graph = &program.graph;
    let out = &graph.nodes[step.output as usize].ty;
    if out.rank() > codegen::MAX_RANK {
        return Err(format!("rank {} exceeds {}", out.rank(), codegen::MAX_RANK));
    }
    let inputs: Vec<FusedInput> = step
        .inputs
        .iter()
        .map(|&v| {
            let ty = &graph.nodes[v as usize].ty;
            FusedInput {
                dtype: ty.dtype,
                same_shape: ty.shape == out.shape,
            }
        })
        .collect();
    let text = codegen::generate(instrs, &inputs, out.dtype)?;
    let function = match modules.get(&text) {
        Some(f) => *f,
        None => {
            let name = format!("fused_{}.cu", short_hash(&text));
            let f = device
                .load(&name, &text, &[codegen::KERNEL])
                .map_err(|e| e.to_string())?[0];
            generated.push((name, text.clone()));
            modules.insert(text, f);
            f
        }
    };
    Ok(StepPlan::Fused(function, inputs))
}

fn short_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}
