//! Running one planned step: the launch of its kernel(s) with this step's
//! shapes and buffer addresses.

use kiln_kernels::cuda::{Device, DevicePtr, KernelArg, LaunchConfig, WeightLayout};
use kiln_plugin_api::graph::{AttentionSpec, DType};

use super::codegen::MAX_RANK;
use super::plan::{HandKernels, StepPlan};
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
    /// The decode GEMV's kernel for each launch shape.
    pub gemv: &'a GemvChoices,
    /// Concrete shape of each value (empty for values never materialized).
    pub shapes: &'a [Vec<usize>],
    /// Device address of each value (0 where none).
    pub addrs: &'a [DevicePtr],
    /// Where a kernel reports an out-of-range index.
    pub error_flag: DevicePtr,
    /// The KV cache, when the step batch has one.
    pub cache: Option<&'a DeviceKvCache>,
    /// Prefill attention may run on tensor cores.
    pub flash_attention: bool,
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Threads for a kernel that loops over `n` items per block: a multiple of
/// 32, at most 256.
fn block_threads(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// Threads for a kernel whose block takes a row of `n` items, as many as
/// the items up to 1024: a decode step's single row is one block, whose
/// items are then read in one round rather than a loop of round trips.
fn row_threads(n: usize) -> u32 {
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
    fn kernel(&self, name: &str) -> kiln_kernels::cuda::FunctionId {
        self.hand[name]
    }

    pub(super) fn launch(
        &self,
        name: &str,
        config: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), String> {
        self.device
            .launch(self.kernel(name), config, args)
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
            let config = LaunchConfig {
                grid: (tiles(n), tiles(m), z as u32),
                block: (16, 16, 1),
                shared_bytes: 0,
            };
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
        match plan {
            StepPlan::Alias => Ok(()),
            StepPlan::Linear(w) | StepPlan::MatMul(w) => {
                let layout = match plan {
                    StepPlan::Linear(_) => WeightLayout::OutIn,
                    _ => WeightLayout::InOut,
                };
                self.product(w, layout, input(0), numel(in_shape(0)), out, scratch)
            }
            StepPlan::BatchedMatMul => self.batched_matmul(
                (input(0), in_shape(0)),
                (input(1), in_shape(1)),
                (out, out_shape),
            ),
            StepPlan::LinearGroup(members) => {
                let members: Vec<(DeviceMatrix, DevicePtr)> = members
                    .iter()
                    .map(|(w, value)| (*w, self.addrs[*value as usize]))
                    .collect();
                self.product_group(&members, input(0), numel(in_shape(0)), scratch)
            }
            StepPlan::ComputedAt { .. } => Ok(()),
            StepPlan::AddRmsNorm {
                eps,
                offset,
                weight,
                norm,
            } => {
                let cols = *out_shape.last().unwrap_or(&1);
                self.launch_rms_norm(
                    ("kiln_add_rms_norm", "kiln_add_rms_norm_chunks"),
                    rows_of(out_shape),
                    cols,
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(self.addrs[*weight as usize]),
                        KernelArg::Ptr(out),
                        KernelArg::Ptr(self.addrs[*norm as usize]),
                        KernelArg::I32(cols as i32),
                        KernelArg::F32(*eps),
                        KernelArg::F32(*offset),
                    ],
                )
            }
            StepPlan::Embedding(table, function) => {
                let ids = numel(in_shape(0));
                if ids == 0 {
                    return Ok(());
                }
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
                        ],
                    )
                    .map_err(|e| e.to_string())
            }
            StepPlan::Fused(function, inputs) => {
                let n = numel(out_shape);
                if n == 0 {
                    return Ok(());
                }
                let mut words = vec![out_shape.len() as u64];
                let mut shape_words: Vec<u64> = out_shape.iter().map(|&d| d as u64).collect();
                shape_words.resize(MAX_RANK, 0);
                words.extend(shape_words);
                for (i, _) in inputs.iter().enumerate() {
                    let mut strides = broadcast_strides(in_shape(i), out_shape);
                    strides.resize(MAX_RANK, 0);
                    words.extend(strides.iter().map(|&s| s as u64));
                }
                if inputs.is_empty() {
                    words.extend([0u64; MAX_RANK]);
                }
                words.push(n as u64);
                let mut args = vec![KernelArg::Ptr(out)];
                args.extend((0..inputs.len()).map(|i| KernelArg::Ptr(input(i))));
                args.push(KernelArg::Struct(words));
                self.device
                    .launch(*function, LaunchConfig::elementwise(n), &args)
                    .map_err(|e| e.to_string())
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
            } => {
                let (tokens, heads, dim) = match out_shape.as_slice() {
                    [t, h, d] => (*t, *h, *d),
                    other => return Err(format!("rope expects [T, H, D], got {other:?}")),
                };
                let half = dim / 2;
                // The second tensor rotated in the same launch, if any.
                let (x2, y2, heads2) = match with {
                    Some((x2, y2)) => (
                        self.addrs[*x2 as usize],
                        self.addrs[*y2 as usize],
                        self.shapes[*y2 as usize].get(1).copied().unwrap_or(0),
                    ),
                    None => (0, 0, 0),
                };
                if tokens == 0 {
                    return Ok(());
                }
                self.launch(
                    "kiln_rope",
                    LaunchConfig::linear(tokens as u32, row_threads((heads + heads2) * half)),
                    &[
                        KernelArg::Ptr(input(0)),
                        KernelArg::Ptr(input(1)),
                        KernelArg::Ptr(input(2)),
                        KernelArg::Ptr(out),
                        KernelArg::I32(heads as i32),
                        KernelArg::I32(half as i32),
                        KernelArg::I32(i32::from(*interleaved)),
                        KernelArg::F32(*scale),
                        KernelArg::Ptr(x2),
                        KernelArg::Ptr(y2),
                        KernelArg::I32(heads2 as i32),
                    ],
                )
            }
            StepPlan::Attention(spec) => self.attention(step, spec, scratch),
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
                    LaunchConfig {
                        grid: (tokens as u32, heads as u32, 1),
                        block: (128, 1, 1),
                        shared_bytes: 0,
                    },
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

    fn attention(
        &self,
        step: &Step,
        spec: &AttentionSpec,
        scratch: Option<DevicePtr>,
    ) -> Result<(), String> {
        let cache = self.cache.ok_or("paged attention needs a KV cache")?;
        let addr = |i: usize| self.addrs[step.inputs[i] as usize];
        let shape = |i: usize| &self.shapes[step.inputs[i] as usize];
        let (tokens, num_heads, head_dim) = match shape(0).as_slice() {
            [t, h, d] => (*t, *h, *d),
            other => return Err(format!("q must be [T, H, D], got {other:?}")),
        };
        let kv_heads = shape(1)[1];
        let layout = cache.layout;
        if kv_heads != layout.num_kv_heads || head_dim != layout.head_dim {
            return Err(format!(
                "k is [.., {kv_heads}, {head_dim}] but the cache holds {} heads of {}",
                layout.num_kv_heads, layout.head_dim
            ));
        }
        if head_dim > WIDE_HEAD_DIM || num_heads % kv_heads != 0 {
            return Err(format!(
                "{num_heads} query heads over {kv_heads} key/value heads of {head_dim} are not \
                 supported (head_dim ≤ {WIDE_HEAD_DIM})"
            ));
        }
        if tokens == 0 {
            return Ok(());
        }
        let (k_cache, v_cache) = cache
            .layer(spec.layer as usize)
            .ok_or_else(|| format!("the cache has no layer {}", spec.layer))?;
        let batch = numel(shape(4));
        let blocks_per_seq = shape(5).get(1).copied().unwrap_or(0);
        let stride = kv_heads * head_dim;
        let metadata = [
            KernelArg::Ptr(addr(3)),
            KernelArg::Ptr(addr(4)),
            KernelArg::Ptr(addr(5)),
            KernelArg::I32(batch as i32),
            KernelArg::I32(blocks_per_seq as i32),
            KernelArg::I32(layout.block_size as i32),
        ];
        let mut args = vec![
            KernelArg::Ptr(addr(1)),
            KernelArg::Ptr(addr(2)),
            KernelArg::Ptr(k_cache),
            KernelArg::Ptr(v_cache),
        ];
        args.extend(metadata.iter().cloned());
        args.push(KernelArg::I32(stride as i32));
        let wide = head_dim > HEAD_DIM;
        let (write, attend) = match (cache.bf16, wide) {
            (true, false) => ("kiln_write_kv_bf16", "kiln_paged_attention_bf16"),
            (true, true) => ("kiln_write_kv_bf16", "kiln_paged_attention_wide_bf16"),
            (false, false) => ("kiln_write_kv", "kiln_paged_attention"),
            (false, true) => ("kiln_write_kv", "kiln_paged_attention_wide"),
        };
        self.launch(
            write,
            LaunchConfig::linear(tokens as u32, row_threads(stride)),
            &args,
        )?;
        let mut args = vec![
            KernelArg::Ptr(addr(0)),
            KernelArg::Ptr(k_cache),
            KernelArg::Ptr(v_cache),
            KernelArg::Ptr(self.addrs[step.output as usize]),
        ];
        args.extend(metadata);
        args.extend([
            KernelArg::I32(num_heads as i32),
            KernelArg::I32(kv_heads as i32),
        ]);
        let window = KernelArg::I32(spec.sliding_window.map_or(0, |w| w as i32));
        let softcap = KernelArg::F32(spec.softcap.unwrap_or(0.0));
        let flash = flash_kernel(head_dim).filter(|_| {
            self.flash_attention && cache.bf16 && tokens >= FLASH_ROWS_PER_SEQUENCE * batch
        });
        if let Some(flash) = flash {
            args.extend([KernelArg::F32(spec.scale), window, softcap]);
            let tiles = tokens.div_ceil(FLASH_TILE_ROWS) + batch;
            return self.launch(
                flash,
                LaunchConfig {
                    grid: (tiles as u32, num_heads as u32, 1),
                    block: (128, 1, 1),
                    shared_bytes: 0,
                },
                &args,
            );
        }
        args.extend([
            KernelArg::I32(head_dim as i32),
            KernelArg::F32(spec.scale),
            window,
            softcap,
        ]);
        let splits = attention_splits(tokens, blocks_per_seq);
        let split_keys = blocks_per_seq.div_ceil(splits) * layout.block_size;
        let partials = match splits {
            1 => 0,
            _ => scratch.ok_or("no scratch planned for split attention")?,
        };
        args.extend([KernelArg::I32(split_keys as i32), KernelArg::Ptr(partials)]);
        let grid = (tokens as u32, num_heads as u32, splits as u32);
        let block = (128, 1, 1);
        let config = |grid| LaunchConfig {
            grid,
            block,
            shared_bytes: 0,
        };
        self.launch(attend, config(grid), &args)?;
        if splits == 1 {
            return Ok(());
        }
        self.launch(
            "kiln_attention_combine",
            config((grid.0, grid.1, 1)),
            &[
                KernelArg::Ptr(partials),
                KernelArg::Ptr(self.addrs[step.output as usize]),
                KernelArg::I32(num_heads as i32),
                KernelArg::I32(head_dim as i32),
                KernelArg::I32(splits as i32),
            ],
        )
    }
}

/// The largest head of the attention kernels (`attention.cu`).
const HEAD_DIM: usize = 256;
/// The largest head of the `_wide` paged-attention kernels (DeepSeek's
/// latent head, 512 + 64).
const WIDE_HEAD_DIM: usize = 576;

/// Query rows per block of the tensor-core kernel (`flash_attention.cu`).
const FLASH_TILE_ROWS: usize = 64;
/// Rows per sequence, on average over a step, from which attention runs on
/// tensor cores: the kernel computes 16 rows per warp, so a decode row (or a
/// few) would waste most of each product.
const FLASH_ROWS_PER_SEQUENCE: usize = 16;

/// The tensor-core attention kernel for `head_dim`, where there is one.
fn flash_kernel(head_dim: usize) -> Option<&'static str> {
    match head_dim {
        64 => Some("kiln_flash_attention_bf16_d64"),
        96 => Some("kiln_flash_attention_bf16_d96"),
        128 => Some("kiln_flash_attention_bf16_d128"),
        _ => None,
    }
}

/// Rows of a step up to which attention splits each row's keys (decode
/// batches; more rows fill the GPU without splitting).
const SPLIT_ATTENTION_ROWS: usize = 16;
/// Cache blocks per split, at least (4 blocks of 16 positions: 64 keys, four
/// rounds of a block's 16 keys at a time; on an H200 a batch-1 step of 32
/// heads at 256 positions then fills 128 multiprocessors instead of 32).
const BLOCKS_PER_SPLIT: usize = 4;
/// Splits per row at most.
const MAX_SPLITS: usize = 32;

/// How many parts attention splits each row's keys into, for a step of
/// `tokens` rows over block tables `blocks_per_seq` wide (flash-decoding:
/// few rows over long contexts would leave most of the GPU idle).
fn attention_splits(tokens: usize, blocks_per_seq: usize) -> usize {
    if tokens > SPLIT_ATTENTION_ROWS {
        return 1;
    }
    blocks_per_seq
        .div_ceil(BLOCKS_PER_SPLIT)
        .clamp(1, MAX_SPLITS)
}

/// Scratch bytes of an attention step whose q is `q_shape` ([T, H, D]) and
/// block tables `tables_shape` ([B, M]): the splits' partial results.
pub fn attention_scratch_bytes(q_shape: &[usize], tables_shape: &[usize]) -> usize {
    let (&[tokens, heads, head_dim], Some(&width)) = (q_shape, tables_shape.get(1)) else {
        return 0;
    };
    match attention_splits(tokens, width) {
        1 => 0,
        splits => tokens * heads * splits * (head_dim + 2) * 4,
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
