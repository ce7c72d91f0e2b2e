//! Runs a compiled program on the CPU.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use kiln_kernels::dense::attention::{
    self, AttentionParams, CacheElement, CacheLayout, SequenceRows,
};
use kiln_kernels::dense::matmul::{self, HalfFormat};
use kiln_kernels::quant::{Precision, QuantMatrix};
use kiln_plugin_api::graph::{AttentionSpec, Dim, Op, ValueId};
use kiln_plugin_api::Encoding;

use super::backend::Backend;
use super::cpu_ops;
use super::fused;
use super::kv_cache::{HostKvDtype, HostLayer, KvCache};
use super::pool::BufferPool;
use super::precision::ProductPrecisions;
use super::tensor::{storage_of, Tensor};
use super::weights::{WeightData, WeightStore};
use crate::compiler::{Kernel, Program, Step};

/// A failure while running a graph, naming the op and module when it is one
/// op's fault.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An input does not fit the graph.
    #[error("input `{name}`: {message}")]
    Input {
        /// The input's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A weight is missing or does not match the graph.
    #[error("weight `{name}`: {message}")]
    Weight {
        /// The weight's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The device failed or ran out of memory.
    #[error("device: {0}")]
    Device(String),
    /// An op failed (e.g. an index out of range).
    #[error("`{op}`{}: {message}", if module.is_empty() { String::new() } else { format!(" in module `{module}`") })]
    Op {
        /// The op.
        op: String,
        /// The module that created it.
        module: String,
        /// What went wrong.
        message: String,
    },
}

impl RuntimeError {
    /// The failure of the op producing value `id` of `graph`.
    pub(crate) fn op(
        graph: &kiln_plugin_api::graph::GraphIr,
        id: ValueId,
        message: String,
    ) -> Self {
        let node = &graph.nodes[id as usize];
        RuntimeError::Op {
            op: format!("%{id} = {}", node.op.name()),
            module: node.module.clone(),
            message,
        }
    }
}

/// A program bound to its weights, ready to run many times.
pub struct Executor {
    program: Arc<Program>,
    /// Weight data by the graph's weight index.
    weights: Vec<WeightData>,
    /// Weights decoded to f32, made on first use by a generic kernel.
    dense: Vec<OnceLock<Tensor>>,
    /// Constants by value id.
    constants: HashMap<ValueId, Tensor>,
    precision: Precision,
    /// Each weight product's precision.
    products: ProductPrecisions,
    /// What the KV caches it makes store.
    kv_dtype: HostKvDtype,
    /// Buffers of dead values, reused for new ones (across runs too).
    pool: BufferPool,
}

impl Executor {
    /// Binds `program` to weights from `store`, checking that each weight the
    /// graph reads exists with the expected name, shape and type, and
    /// computes the steps that read only weights once, now.
    pub fn new(
        program: Arc<Program>,
        store: &WeightStore,
        precision: Precision,
    ) -> Result<Self, RuntimeError> {
        let weights = bind_weights(&program, store)?;
        let (program, weights) = super::hoist::hoist_weight_steps(program, weights)?;
        let constants = program
            .graph
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(id, node)| match &node.op {
                Op::Constant(c) => {
                    let shape = node
                        .ty
                        .static_shape()?
                        .iter()
                        .map(|&d| d as usize)
                        .collect();
                    Some((
                        id as ValueId,
                        Tensor::from_f64(node.ty.dtype, shape, &c.values),
                    ))
                }
                _ => None,
            })
            .collect();
        let dense = weights.iter().map(|_| OnceLock::new()).collect();
        let products = ProductPrecisions::new(&program, precision);
        Ok(Self {
            program,
            weights,
            dense,
            constants,
            precision,
            products,
            kv_dtype: HostKvDtype::F32,
            pool: BufferPool::default(),
        })
    }

    /// Makes its KV caches store `dtype`.
    pub fn with_kv_dtype(self, dtype: HostKvDtype) -> Self {
        Self {
            kv_dtype: dtype,
            ..self
        }
    }

    fn run_in_pool(
        &self,
        inputs: Vec<Tensor>,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let graph = &self.program.graph;
        let symbols = bind_symbols(graph, &inputs)?;
        let mut values: Vec<Option<Tensor>> = vec![None; graph.nodes.len()];
        let mut inputs = inputs.into_iter();
        for (id, node) in graph.nodes.iter().enumerate() {
            if let Op::Input { .. } = node.op {
                values[id] = inputs.next();
            }
        }
        for (index, step) in self.program.steps.iter().enumerate() {
            let output = match self.reuse_for_reshape(index, step, &mut values, &symbols) {
                Some(reshaped) => reshaped,
                None => self.run_step(step, &values, &symbols, cache.as_deref_mut())?,
            };
            values[step.output as usize] = Some(output);
            for &input in &step.inputs {
                if self.program.last_use[input as usize] == Some(index) {
                    if let Some(dead) = values[input as usize].take() {
                        self.pool.give(dead);
                    }
                }
            }
        }
        graph
            .outputs
            .iter()
            .map(|&o| {
                self.value(o, &values)
                    .map(|t| t.into_owned())
                    .map_err(|message| self.op_error(o, message))
            })
            .collect()
    }

    /// A reshape of a value that dies here takes the value's buffer instead
    /// of copying it.
    fn reuse_for_reshape(
        &self,
        index: usize,
        step: &Step,
        values: &mut [Option<Tensor>],
        symbols: &HashMap<String, usize>,
    ) -> Option<Tensor> {
        let node = &self.program.graph.nodes[step.output as usize];
        let (Kernel::Node, Op::Reshape { .. }) = (&step.kernel, &node.op) else {
            return None;
        };
        let input = step.inputs[0] as usize;
        if self.program.last_use[input] != Some(index) {
            return None;
        }
        let mut tensor = values[input].take()?;
        tensor.shape = resolve(&node.ty.shape, symbols);
        Some(tensor)
    }

    fn value<'a>(
        &'a self,
        id: ValueId,
        values: &'a [Option<Tensor>],
    ) -> Result<std::borrow::Cow<'a, Tensor>, String> {
        if let Some(t) = &values[id as usize] {
            return Ok(std::borrow::Cow::Borrowed(t));
        }
        if let Some(t) = self.constants.get(&id) {
            return Ok(std::borrow::Cow::Borrowed(t));
        }
        if let Op::Weight { index } = self.program.graph.nodes[id as usize].op {
            let dense = match self.dense[index].get() {
                Some(t) => t,
                None => {
                    let t =
                        self.weights[index].to_tensor(self.program.graph.weights[index].dtype)?;
                    self.dense[index].get_or_init(|| t)
                }
            };
            return Ok(std::borrow::Cow::Borrowed(dense));
        }
        Err(format!("value %{id} is not available (freed too early?)"))
    }

    fn op_error(&self, id: ValueId, message: String) -> RuntimeError {
        RuntimeError::op(&self.program.graph, id, message)
    }

    fn run_step(
        &self,
        step: &Step,
        values: &[Option<Tensor>],
        symbols: &HashMap<String, usize>,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor, RuntimeError> {
        let node = &self.program.graph.nodes[step.output as usize];
        let fail = |message: String| self.op_error(step.output, message);
        let inputs = step
            .inputs
            .iter()
            .map(|&i| self.value(i, values))
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let inputs: Vec<&Tensor> = inputs.iter().map(|t| t.as_ref()).collect();
        let shape = resolve(&node.ty.shape, symbols);
        let dtype = node.ty.dtype;
        let result = match &step.kernel {
            Kernel::Node => match &node.op {
                Op::PagedAttention(spec) => {
                    let cache =
                        cache.ok_or_else(|| fail("paged attention needs a KV cache".to_owned()))?;
                    paged_attention(spec, &inputs, cache, &self.pool)
                        .map(|out| Tensor::from_f32(dtype, shape, out))
                }
                Op::Print { label } => {
                    print_tensor(label, inputs[0]);
                    Ok(inputs[0].clone())
                }
                op => cpu_ops::eval(op, &inputs, dtype, shape, &self.pool),
            },
            Kernel::Linear { weight } => {
                let precision = self.products.of(step.output);
                self.linear(*weight, inputs[0], shape, dtype, precision)
            }
            Kernel::Embedding { weight } => self.embedding(*weight, inputs[0], shape, dtype),
            Kernel::MixtureOfExperts { gate, up, down } => {
                let Op::MixtureOfExperts(spec) = &node.op else {
                    return Err(fail("a mixture-of-experts step on another op".to_owned()));
                };
                let experts = super::moe::Experts { gate, up, down };
                self.mixture_of_experts(spec, &experts, &inputs)
                    .map(|out| Tensor::from_f32(dtype, shape, out))
            }
            Kernel::Fused { program } => fused::run(program, &inputs, dtype, shape, &self.pool),
        };
        result.map_err(fail)
    }

    fn linear(
        &self,
        index: usize,
        x: &Tensor,
        shape: Vec<usize>,
        dtype: kiln_plugin_api::graph::DType,
        precision: Precision,
    ) -> Result<Tensor, String> {
        let y = self.linear_rows(index, x.as_f32(), precision)?;
        Ok(Tensor::from_f32(dtype, shape, y))
    }

    /// `xs [m, k] · Wᵀ` for weight `index` (`[n, k]`) in its stored
    /// encoding: `[m, n]` in a buffer of the pool.
    pub(super) fn linear_rows(
        &self,
        index: usize,
        xs: &[f32],
        precision: Precision,
    ) -> Result<Vec<f32>, String> {
        let weight = &self.weights[index];
        let (n, k) = (weight.spec.shape[0] as usize, weight.spec.shape[1] as usize);
        let m = xs.len() / k.max(1);
        // Every product below writes all of `y`.
        let mut y = self.pool.take_for_overwrite(m * n);
        match weight.spec.encoding {
            Encoding::Float32 => {
                let dense = self.value_of_weight(index)?;
                matmul::linear(xs, dense.as_f32(), &mut y, m, k, n);
            }
            Encoding::Float16 | Encoding::BFloat16 => {
                let format = if weight.spec.encoding == Encoding::Float16 {
                    HalfFormat::F16
                } else {
                    HalfFormat::BF16
                };
                // Fast products of bf16 weights round the activations to
                // bf16 where the CPU multiplies pairs; fast-residual's keep
                // f32 activations.
                let product = if precision == Precision::Fast {
                    matmul::linear_half_fast
                } else {
                    matmul::linear_half
                };
                product(xs, weight.bytes(), format, &mut y, m, k, n);
            }
            _ => {
                let ty = weight
                    .quant_type()
                    .expect("non-float encodings are quantized");
                QuantMatrix::new(ty, n, k, weight.bytes())
                    .and_then(|w| w.matmul(precision, xs, m, &mut y))
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(y)
    }

    /// The activation precision of weight products.
    pub(super) fn precision(&self) -> Precision {
        self.precision
    }

    /// The buffers reused across steps.
    pub(super) fn pool(&self) -> &BufferPool {
        &self.pool
    }

    fn value_of_weight(&self, index: usize) -> Result<&Tensor, String> {
        match self.dense[index].get() {
            Some(t) => Ok(t),
            None => {
                let t = self.weights[index].to_tensor(self.program.graph.weights[index].dtype)?;
                Ok(self.dense[index].get_or_init(|| t))
            }
        }
    }

    fn embedding(
        &self,
        index: usize,
        ids: &Tensor,
        shape: Vec<usize>,
        dtype: kiln_plugin_api::graph::DType,
    ) -> Result<Tensor, String> {
        let weight = &self.weights[index];
        let (rows, cols) = (weight.spec.shape[0] as usize, weight.spec.shape[1] as usize);
        let mut out = self.pool.take(ids.len() * cols);
        for (i, &id) in ids.as_i64().iter().enumerate() {
            let row = usize::try_from(id)
                .ok()
                .filter(|&r| r < rows)
                .ok_or_else(|| format!("token id {id} is outside the vocabulary of {rows}"))?;
            weight.decode_rows(row..row + 1, &mut out[i * cols..(i + 1) * cols])?;
        }
        Ok(Tensor::from_f32(dtype, shape, out))
    }
}

/// The weights `program` reads, from `store`, checked against the graph's
/// names, shapes and encodings.
pub(crate) fn bind_weights(
    program: &Program,
    store: &WeightStore,
) -> Result<Vec<WeightData>, RuntimeError> {
    program
        .graph
        .weights
        .iter()
        .map(|spec| {
            let data = store.get(&spec.name).ok_or_else(|| RuntimeError::Weight {
                name: spec.name.clone(),
                message: "not in the checkpoint".to_owned(),
            })?;
            if data.spec.shape != spec.shape || data.spec.encoding != spec.encoding {
                return Err(RuntimeError::Weight {
                    name: spec.name.clone(),
                    message: format!(
                        "the graph expects {:?} {}, the checkpoint has {:?} {}",
                        spec.shape, spec.encoding, data.spec.shape, data.spec.encoding
                    ),
                });
            }
            Ok(data.clone())
        })
        .collect()
}

impl Backend for Executor {
    fn program(&self) -> &Program {
        &self.program
    }

    fn device_name(&self) -> String {
        "cpu".to_owned()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn new_kv_cache(
        &self,
        num_layers: usize,
        num_blocks: usize,
        layout: attention::CacheLayout,
    ) -> Result<KvCache, RuntimeError> {
        Ok(KvCache::new(num_layers, num_blocks, layout, self.kv_dtype))
    }

    fn kv_bytes(&self, values: usize) -> usize {
        self.kv_dtype.bytes(values)
    }

    fn reserve(&self, _: Vec<Tensor>, _: f64) -> Result<Option<usize>, RuntimeError> {
        Ok(None)
    }

    fn roofline(&self) -> Result<Option<super::Roofline>, RuntimeError> {
        Ok(None)
    }

    /// The step runs on a worker of the CPU thread pool, so the kernels split
    /// their work from inside the pool, which costs about a microsecond per
    /// parallel region instead of a cross-thread wake-up.
    fn run(
        &self,
        inputs: Vec<Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        cpu_thread_pool().install(|| {
            let _awake = super::spin::KeepAwake::start();
            self.run_in_pool(inputs, cache)
        })
    }
}

/// Binds symbolic dimensions from the actual inputs and checks the rest.
pub(crate) fn bind_symbols(
    graph: &kiln_plugin_api::graph::GraphIr,
    inputs: &[Tensor],
) -> Result<HashMap<String, usize>, RuntimeError> {
    if inputs.len() != graph.inputs.len() {
        return Err(RuntimeError::Input {
            name: "(all)".to_owned(),
            message: format!(
                "the graph takes {} inputs, got {}",
                graph.inputs.len(),
                inputs.len()
            ),
        });
    }
    let mut symbols = HashMap::new();
    for (spec, tensor) in graph.inputs.iter().zip(inputs) {
        let fail = |message: String| RuntimeError::Input {
            name: spec.name.clone(),
            message,
        };
        if storage_of(spec.ty.dtype) != storage_of(tensor.dtype) {
            return Err(fail(format!(
                "expected {}, got {}",
                spec.ty.dtype, tensor.dtype
            )));
        }
        if spec.ty.rank() != tensor.shape.len() {
            return Err(fail(format!(
                "expected {}, got shape {:?}",
                spec.ty, tensor.shape
            )));
        }
        for (dim, &actual) in spec.ty.shape.iter().zip(&tensor.shape) {
            match dim {
                Dim::Static(n) if *n as usize != actual => {
                    return Err(fail(format!(
                        "expected {}, got shape {:?}",
                        spec.ty, tensor.shape
                    )))
                }
                Dim::Symbolic(name) => match symbols.insert(name.clone(), actual) {
                    Some(bound) if bound != actual => {
                        return Err(fail(format!(
                            "`{name}` is {bound} in an earlier input but {actual} here"
                        )))
                    }
                    _ => {}
                },
                Dim::Static(_) => {}
            }
        }
    }
    Ok(symbols)
}

pub(crate) fn resolve(shape: &[Dim], symbols: &HashMap<String, usize>) -> Vec<usize> {
    shape
        .iter()
        .map(|d| match d {
            Dim::Static(n) => *n as usize,
            Dim::Symbolic(name) => symbols[name],
        })
        .collect()
}

fn paged_attention(
    spec: &AttentionSpec,
    inputs: &[&Tensor],
    cache: &mut KvCache,
    pool: &BufferPool,
) -> Result<Vec<f32>, String> {
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let (row_offsets, context_lens, block_tables) =
        (inputs[3].as_i64(), inputs[4].as_i64(), inputs[5]);
    let layout = cache.layout();
    let (num_heads, kv_heads, head_dim) = (q.shape[1], k.shape[1], k.shape[2]);
    if kv_heads != layout.num_kv_heads || head_dim != layout.head_dim {
        return Err(format!(
            "k is [.., {kv_heads}, {head_dim}] but the cache holds {} heads of {}",
            layout.num_kv_heads, layout.head_dim
        ));
    }
    check_ragged_batch(
        q.shape[0],
        row_offsets,
        context_lens,
        block_tables,
        cache.num_blocks(),
        layout.block_size,
    )?;
    let blocks_per_seq = block_tables.shape[1];
    let tables: Vec<usize> = block_tables.as_i64().iter().map(|&b| b as usize).collect();
    let sequences: Vec<SequenceRows<'_>> = (0..context_lens.len())
        .map(|b| SequenceRows {
            rows: row_offsets[b] as usize..row_offsets[b + 1] as usize,
            context_len: context_lens[b] as usize,
            block_table: &tables[b * blocks_per_seq..(b + 1) * blocks_per_seq],
        })
        .collect();
    let params = AttentionParams {
        scale: spec.scale,
        sliding_window: spec.sliding_window.map(|w| w as usize),
        softcap: spec.softcap,
    };
    let layer = cache
        .layer_mut(spec.layer as usize)
        .ok_or_else(|| format!("the cache has no layer {}", spec.layer))?;
    let mut out = pool.take(q.len());
    let (k, v, q) = (k.as_f32(), v.as_f32(), q.as_f32());
    match layer {
        HostLayer::F32(k_cache, v_cache) => attend_cached(
            layout, k_cache, v_cache, k, v, q, &mut out, num_heads, &sequences, params,
        ),
        HostLayer::F16(k_cache, v_cache) => attend_cached(
            layout, k_cache, v_cache, k, v, q, &mut out, num_heads, &sequences, params,
        ),
        HostLayer::Bf16(k_cache, v_cache) => attend_cached(
            layout, k_cache, v_cache, k, v, q, &mut out, num_heads, &sequences, params,
        ),
        HostLayer::Q8_0(k_cache, v_cache) => attend_cached(
            layout, k_cache, v_cache, k, v, q, &mut out, num_heads, &sequences, params,
        ),
    }
    Ok(out)
}

/// Writes this step's keys and values into a layer's cache, then attends
/// over it.
#[allow(clippy::too_many_arguments)]
fn attend_cached<T: CacheElement>(
    layout: CacheLayout,
    k_cache: &mut [T],
    v_cache: &mut [T],
    k: &[f32],
    v: &[f32],
    q: &[f32],
    out: &mut [f32],
    num_heads: usize,
    sequences: &[SequenceRows<'_>],
    params: AttentionParams,
) {
    attention::write_kv(layout, k_cache, v_cache, k, v, sequences);
    attention::paged_attention(
        layout, k_cache, v_cache, q, out, num_heads, sequences, params,
    );
}

/// Checks a ragged batch's description against `tokens` query rows and a
/// cache of `num_blocks` blocks of `block_size` positions: rows in order and
/// in range, each context covering its rows and fitting its block table,
/// every block in the cache. Both backends check this before attention
/// reads the cache.
pub(crate) fn check_ragged_batch(
    tokens: usize,
    row_offsets: &[i64],
    context_lens: &[i64],
    block_tables: &Tensor,
    num_blocks: usize,
    block_size: usize,
) -> Result<(), String> {
    let batch = context_lens.len();
    if row_offsets.len() != batch + 1 || block_tables.shape.first() != Some(&batch) {
        return Err(format!(
            "row_offsets has {} entries and block_tables {} rows for {batch} sequences",
            row_offsets.len(),
            block_tables.shape.first().copied().unwrap_or(0)
        ));
    }
    if row_offsets.first() != Some(&0) || row_offsets.last() != Some(&(tokens as i64)) {
        return Err(format!(
            "row_offsets must run from 0 to the {tokens} rows, got {row_offsets:?}"
        ));
    }
    let blocks_per_seq = block_tables.shape.get(1).copied().unwrap_or(0);
    if let Some(b) = block_tables
        .as_i64()
        .iter()
        .find(|&&b| usize::try_from(b).map_or(true, |b| b >= num_blocks))
    {
        return Err(format!("block {b} is not in the cache"));
    }
    for b in 0..batch {
        let (start, end) = (row_offsets[b], row_offsets[b + 1]);
        let context = context_lens[b];
        if start < 0 || end < start || end as usize > tokens || context < end - start {
            return Err(format!(
                "sequence {b}: rows {start}..{end} and context {context} are inconsistent"
            ));
        }
        if context as usize > blocks_per_seq * block_size {
            return Err(format!(
                "sequence {b}: {context} positions do not fit {blocks_per_seq} blocks"
            ));
        }
    }
    Ok(())
}

/// The pool every graph runs in: `RAYON_NUM_THREADS` threads, else one per
/// logical CPU.
fn cpu_thread_pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("kiln-cpu-{i}"))
            .build()
            .expect("the CPU thread pool starts")
    })
}

/// The `print` op's output: label, shape and (up to 64) values.
pub(crate) fn print_tensor(label: &str, t: &Tensor) {
    let values = t.to_f64();
    let shown: Vec<String> = values.iter().take(64).map(|v| format!("{v:.6}")).collect();
    let more = if values.len() > 64 {
        format!(", … ({} values)", values.len())
    } else {
        String::new()
    };
    eprintln!(
        "{label}: {}{:?} [{}{more}]",
        t.dtype,
        t.shape,
        shown.join(", ")
    );
}
