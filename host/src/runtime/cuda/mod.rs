//! The CUDA backend: runs a compiled [`Program`] on a [`Device`], the real
//! GPU (driver, NVRTC, cuBLAS) or the kernel emulator on the CPU.
//!
//! At load, [`plan::lower`] uploads the weights once, generates and compiles
//! the fused element-wise kernels and picks a kernel for every step. At run
//! time, a step batch binds the symbolic dimensions; the arena offsets for
//! that binding are planned from the program's liveness ([`memory`]) and
//! cached, the inputs are uploaded, every step is launched, and only the
//! graph's outputs come back.

mod arena;
mod attention;
mod backend;
mod buckets;
mod codegen;
mod end_norms;
mod fusion;
mod gemv;
mod graphs;
mod head_norms;
mod launch;
mod measure;
mod memory;
mod moe;
mod norm_fold;
mod plan;
mod post_norms;
mod products;
mod profile;
mod qmm;
mod sample;
mod stacked;
mod step;
mod tune;
mod weights;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kiln_kernels::cuda::{sources, Device, DevicePtr, FunctionId};
use kiln_kernels::dense::attention::CacheLayout;
use kiln_plugin_api::graph::{DType, Op, ValueId};

pub use codegen::generate as generate_fused_kernel;
pub use gemv::DenseGemvRows;
pub use qmm::DenseRows;
pub use tune::GemvSplits;
pub use weights::WeightDtype;

use super::executor::{check_ragged_batch, resolve};
use super::tensor::{storage_of, Storage, Tensor};
use super::{KvCache, KvCacheDtype, RuntimeError, WeightStore};
use crate::compiler::Program;
use arena::RunPlan;
use attention::KvElement;
use plan::{HandKernels, Home, StepPlan};
use step::download;

/// Why the CUDA backend could not load a program.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The device failed.
    #[error("{0}")]
    Device(String),
    /// Device memory ran out.
    #[error("device memory: {0}")]
    Memory(String),
    /// A weight could not be decoded.
    #[error("weight `{0}`: {1}")]
    Weight(String, String),
    /// A step no CUDA kernel covers.
    #[error("`{op}`{}: {message} (CUDA backend)", if module.is_empty() { String::new() } else { format!(" in module `{module}`") })]
    Unsupported {
        /// The op.
        op: String,
        /// Its module.
        module: String,
        /// Why.
        message: String,
    },
}

impl From<CudaError> for RuntimeError {
    fn from(e: CudaError) -> Self {
        RuntimeError::Device(e.to_string())
    }
}

/// The KV cache in device memory: for each layer, keys then values.
pub struct DeviceKvCache {
    device: Arc<dyn Device>,
    base: DevicePtr,
    layer_bytes: usize,
    num_layers: usize,
    layout: CacheLayout,
    /// What its elements are.
    element: KvElement,
}

impl std::fmt::Debug for DeviceKvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceKvCache")
            .field("device", &self.device.name())
            .field("layers", &self.num_layers)
            .field("layer_bytes", &self.layer_bytes)
            .finish()
    }
}

impl DeviceKvCache {
    /// Keys and values of `layer`.
    fn layer(&self, layer: usize) -> Option<(DevicePtr, DevicePtr)> {
        (layer < self.num_layers).then(|| {
            let k = self.base + (2 * layer * self.layer_bytes) as u64;
            (k, k + self.layer_bytes as u64)
        })
    }
}

impl Drop for DeviceKvCache {
    fn drop(&mut self) {
        self.device.free(self.base);
    }
}

/// The arena and the plans made so far, by binding of the symbolic sizes.
struct RunState {
    arena: DevicePtr,
    capacity: usize,
    sampler: sample::SampleBuffers,
    plans: HashMap<Binding, Arc<RunPlan>>,
    graphs: graphs::GraphCache,
    /// Steps launched so far: a launched step's picks are queued only while
    /// its logits are still the arena's latest.
    steps_launched: u64,
    /// The steps a profiler sees (`KILN_PROFILE_STEPS`).
    profile: Option<profile::ProfileWindow>,
}

/// The symbolic sizes of a step, sorted by name: what its plan (and its
/// CUDA graph) depend on.
type Binding = Vec<(String, usize)>;

fn binding(symbols: &HashMap<String, usize>) -> Binding {
    let mut key: Binding = symbols.iter().map(|(k, &v)| (k.clone(), v)).collect();
    key.sort_unstable();
    key
}

/// A program bound to its weights on a CUDA device.
pub struct CudaExecutor {
    device: Arc<dyn Device>,
    label: String,
    program: Arc<Program>,
    hand: HandKernels,
    /// The hand-written kernels launched as programmatic dependents (those
    /// of sources that wait for their inputs); `None` with
    /// `KILN_NO_PROGRAMMATIC_LAUNCH` set.
    programmatic: Option<HashSet<FunctionId>>,
    /// The decode GEMV's split for each launch shape.
    gemv: tune::GemvChoices,
    steps: Vec<StepPlan>,
    homes: Vec<Home>,
    /// Values stored in a half type (products' x and outputs).
    half: fusion::HalfValues,
    /// Adds and norms folded into the decode GEMVs around them (none with
    /// `KILN_NO_NORM_FOLD` set).
    folds: norm_fold::NormFolds,
    owned: Vec<DevicePtr>,
    /// Capture and replay steps as CUDA graphs.
    graphs: bool,
    /// The graph takes the decoder's inputs: decode steps can be padded to
    /// buckets.
    paddable: bool,
    /// A server runs its step shapes at start-up even where the device's
    /// first use costs nothing extra ([`CudaExecutor::warm_up_always`]).
    warm_up_always: std::sync::atomic::AtomicBool,
    /// What KV caches hold: bf16 unless asked (f32 with `--dtype float32`).
    kv_element: KvElement,
    /// Attention may run on tensor cores (`AttentionBackend::Auto`).
    flash_attention: bool,
    /// Tensor-core decode attention may split a row's keys into less than
    /// a block's round (`KILN_SHORT_ATTENTION_SPLITS`, to time the policy
    /// against: `attention::whole_round_splits`).
    short_attention_splits: bool,
    /// The value of the graph's first input, where async scheduling feeds
    /// token ids.
    token_ids: Option<usize>,
    /// The product of the logits, whose decode GEMV also writes greedy's
    /// picks.
    logits: Option<LogitsProduct>,
    /// Bytes of weights one step reads.
    weight_bytes_per_step: usize,
    /// Floating-point operations of the matrix products per token.
    product_flops_per_token: f64,
    generated: Vec<(String, String)>,
    state: Mutex<RunState>,
}

/// The product whose output is the logits: its decode GEMV also finds each
/// row's greedy pick (`gemv::GreedyPicks`), written to `tokens`.
#[derive(Clone, Copy, Debug)]
struct LogitsProduct {
    /// Its output.
    value: ValueId,
    matrix: weights::DeviceMatrix,
    /// `[gemv::GEMV_MAX_M]` u32 token ids, a buffer of the executor's
    /// own (a captured graph holds its address).
    tokens: DevicePtr,
}

/// Which attention kernels the CUDA backend launches (`--attention-backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionBackend {
    /// Tensor-core flash attention (`flash_attention.cu`) for steps of
    /// prefill rows over a bf16 or fp8 cache with head_dim 64, 96 or 128,
    /// tensor-core decode attention (`decode_attention.cu`) for other steps
    /// over a bf16 or fp8 cache with head_dim 64, 128 or 256 and at most 8 query
    /// heads a key/value head; the portable kernels for everything else.
    #[default]
    Auto,
    /// The portable CUDA-core kernels (`attention.cu`) for every step: the
    /// reference the tensor-core kernel is tested against.
    Portable,
}

/// How the CUDA backend runs a program.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaOptions {
    /// How weights are stored for products (`--dtype`).
    pub dtype: WeightDtype,
    /// The activations of packed matrices' decode products (`--precision`:
    /// 8-bit in the fast modes).
    pub precision: super::Precision,
    /// The KV cache's element type (`--kv-cache-dtype`).
    pub kv_cache_dtype: KvCacheDtype,
    /// Capture steps as CUDA graphs and replay them (off: `--enforce-eager`).
    pub graphs: bool,
    /// Which attention kernels run (`--attention-backend`).
    pub attention: AttentionBackend,
    /// How the decode GEMV splits rows among warps.
    pub gemv_splits: GemvSplits,
    /// Where dense bf16 products of 3 to 64 rows run.
    pub dense_rows: DenseRows,
    /// Most rows of x the decode GEMV takes for dense matrices.
    pub dense_gemv_rows: gemv::DenseGemvRows,
    /// The device is a GPU (`Auto` splits are timed there).
    pub gpu: bool,
}

/// Compiles and loads every hand-written kernel source; also the kernels
/// that wait for their inputs (`Source::waits_for_inputs`).
fn load_hand_kernels(device: &dyn Device) -> Result<(HandKernels, HashSet<FunctionId>), CudaError> {
    let (mut hand, mut waiting) = (HashMap::new(), HashSet::new());
    let modules: Vec<(&str, &str)> = sources::ALL.iter().map(|s| (s.name, s.text)).collect();
    device.precompile(&modules);
    for source in sources::ALL {
        let names = sources::kernel_names(source.text);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let ids = device
            .load(source.name, source.text, &refs)
            .map_err(|e| CudaError::Device(e.to_string()))?;
        if source.waits_for_inputs {
            waiting.extend(ids.iter().copied());
        }
        hand.extend(names.into_iter().zip(ids));
    }
    Ok((hand, waiting))
}

impl CudaExecutor {
    /// Binds `program` to the weights of `store` on `device` (`label` names
    /// it in messages, e.g. `cuda:0`): computes the steps that read only
    /// weights, uploads the weights, compiles the kernels.
    pub fn new(
        program: Arc<Program>,
        store: &WeightStore,
        device: Arc<dyn Device>,
        label: String,
        options: CudaOptions,
    ) -> Result<Self, RuntimeError> {
        let dtype = options.dtype;
        let kv_element = match options.kv_cache_dtype {
            KvCacheDtype::Auto if dtype == WeightDtype::Float32 => KvElement::F32,
            KvCacheDtype::Auto | KvCacheDtype::BFloat16 => KvElement::Bf16,
            KvCacheDtype::Float32 => KvElement::F32,
            KvCacheDtype::Fp8E4m3 => KvElement::Fp8,
            cpu_only @ (KvCacheDtype::Float16 | KvCacheDtype::Q8_0) => {
                return Err(RuntimeError::Device(
                    cpu_only.unsupported_on(true).unwrap_or_default(),
                ))
            }
        };
        let weights = super::executor::bind_weights(&program, store)?;
        let (program, weights) = super::hoist::hoist_weight_steps(program, weights)?;
        let (hand, waiting) = load_hand_kernels(device.as_ref())?;
        let lowered = plan::lower(
            device.as_ref(),
            &program,
            &weights,
            (dtype, options.precision),
            (options.dense_rows, options.dense_gemv_rows),
            &hand,
        )?;
        let gemv = tune::choose(
            device.as_ref(),
            &hand,
            &lowered.steps,
            options.gemv_splits,
            options.gpu,
        )
        .map_err(CudaError::Device)?;
        let paddable = buckets::paddable(&program.graph);
        let token_ids = program
            .graph
            .nodes
            .iter()
            .position(|n| matches!(n.op, Op::Input { index: 0 }));
        let profile = profile::ProfileWindow::from_env().map_err(CudaError::Device)?;
        if let Some(dir) = std::env::var_os("KILN_DUMP_KERNELS") {
            dump_kernels(std::path::Path::new(&dir), &lowered.generated)?;
        }
        let mut owned = lowered.owned;
        let logits = match lowered.logits_product {
            Some((value, matrix)) => {
                let tokens = device
                    .alloc(4 * gemv::GEMV_MAX_M)
                    .map_err(|e| CudaError::Memory(e.to_string()))?;
                owned.push(tokens);
                Some(LogitsProduct {
                    value,
                    matrix,
                    tokens,
                })
            }
            None => None,
        };
        // A step that prints downloads mid-step: it cannot be captured.
        let graphs = options.graphs
            && !lowered
                .steps
                .iter()
                .any(|s| matches!(s, StepPlan::Print(_)));
        Ok(Self {
            label: format!("{label} ({})", device.name()),
            device,
            program,
            hand,
            programmatic: std::env::var_os("KILN_NO_PROGRAMMATIC_LAUNCH")
                .is_none()
                .then_some(waiting),
            gemv,
            steps: lowered.steps,
            homes: lowered.homes,
            half: lowered.half,
            folds: match std::env::var_os("KILN_NO_NORM_FOLD") {
                Some(_) => norm_fold::NormFolds::default(),
                None => lowered.folds,
            },
            owned,
            graphs,
            paddable,
            warm_up_always: Default::default(),
            kv_element,
            flash_attention: options.attention == AttentionBackend::Auto,
            short_attention_splits: std::env::var_os("KILN_SHORT_ATTENTION_SPLITS").is_some(),
            token_ids,
            logits,
            weight_bytes_per_step: lowered.weight_bytes_per_step,
            product_flops_per_token: lowered.product_flops_per_token,
            generated: lowered.generated,
            state: Mutex::new(RunState {
                arena: 0,
                capacity: 0,
                sampler: sample::SampleBuffers::default(),
                plans: HashMap::new(),
                graphs: graphs::GraphCache::default(),
                steps_launched: 0,
                profile,
            }),
        })
    }

    /// How many step bindings are captured as CUDA graphs so far.
    pub fn captured_graphs(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .graphs
            .captured()
    }

    /// How many program steps run inside an earlier step's launch: products
    /// grouped with others that share their input (k and v with q; up with
    /// gate), RMS norms fused with the residual add before them.
    pub fn merged_steps(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, StepPlan::ComputedAt { .. }))
            .count()
    }

    /// How many products' post-norms run with the residual add and the norm
    /// after them (`post_norms.rs`: Gemma 2's and 3's sandwich norms).
    pub fn post_norms_fused(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, StepPlan::NormAddRmsNorm { .. }))
            .count()
    }

    /// The embeddings' launches that scale their rows and that take the
    /// first norm (`end_norms.rs`): (scaled, normed).
    pub fn embeddings_fused(&self) -> (usize, usize) {
        let count = |f: fn(&StepPlan) -> bool| self.steps.iter().filter(|s| f(s)).count();
        (
            count(|s| matches!(s, StepPlan::Embedding { scale: Some(_), .. })),
            count(|s| matches!(s, StepPlan::Embedding { norm: Some(_), .. })),
        )
    }

    /// How many rotations of q and k take their per-head norms
    /// (`head_norms.rs`: Qwen3's and Gemma 3's q_norm and k_norm).
    pub fn rotations_with_head_norms(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    StepPlan::Rope {
                        head_norms: Some(_),
                        ..
                    }
                )
            })
            .count()
    }

    /// How many gated MLP activations the decode GEMV of their gate and up
    /// products writes (one launch a layer fewer at up to 8 rows).
    pub fn gated_activations_in_gemv(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, StepPlan::GatedActivation { .. }))
            .count()
    }

    /// How many products store their output in W's half type where cuBLAS
    /// computes it, for the generated kernels that alone read it (a gated
    /// MLP's gate and up).
    pub fn half_product_outputs(&self) -> usize {
        self.half
            .values()
            .filter(|h| matches!(h, fusion::HalfStore::ProductOutput(_)))
            .count()
    }

    /// How many rotations of q and k (with their cache writes) the decode
    /// GEMV of q, k and v applies (one launch a layer fewer at up to 8 rows).
    pub fn rotations_in_gemv(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    StepPlan::Rope {
                        in_group: Some(_),
                        ..
                    }
                )
            })
            .count()
    }

    /// How many paged attentions have their KV-cache write done by the
    /// rotary launch of their q and k (one launch a layer fewer).
    pub fn cache_writes_with_rotary(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    StepPlan::Attention {
                        cache_written: true,
                        ..
                    }
                )
            })
            .count()
    }

    /// How many decode GEMV launch shapes run with 1, 2 and 4 warps per row
    /// (see [`GemvSplits`]).
    pub fn gemv_split_counts(&self) -> [usize; 3] {
        self.gemv.counts()
    }

    /// How many times the host has waited for the device so far (see
    /// [`Device::host_waits`]): a sampled step waits once, for its tokens.
    pub fn host_waits(&self) -> u64 {
        self.device.host_waits()
    }

    /// Has a server run its step shapes once at start-up
    /// ([`crate::engine::warm_up`]) even where the device's first use of a
    /// shape costs nothing extra (the emulator, the null device): to test
    /// the warm-up, or to time its host side.
    pub fn warm_up_always(&self, on: bool) {
        self.warm_up_always
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The device it runs on (shared with its KV caches).
    pub fn device(&self) -> Arc<dyn Device> {
        self.device.clone()
    }

    /// The generated kernel sources (file name, CUDA C), e.g. to compile them
    /// with NVRTC in a test.
    pub fn generated_kernels(&self) -> &[(String, String)] {
        &self.generated
    }

    /// Where a step planned as `plan` left each logits row's greedy pick:
    /// the logits' product ran as the decode GEMV, which writes them.
    fn greedy_picked(&self, plan: &RunPlan) -> Option<DevicePtr> {
        let logits = self.logits.filter(|_| plan.greedy_picks.is_some())?;
        let outputs: usize = plan.shapes[logits.value as usize].iter().product();
        let m = outputs / logits.matrix.rows.max(1);
        gemv::GemvGroup::single(&logits.matrix)
            .kernel(m)
            .map(|_| logits.tokens)
    }

    /// The plan for `symbols` (whose [`binding`] is `key`), with an arena
    /// large enough for it.
    fn prepare(
        &self,
        state: &mut RunState,
        symbols: &HashMap<String, usize>,
        key: &Binding,
    ) -> Result<Arc<RunPlan>, RuntimeError> {
        let plan = match state.plans.get(key) {
            Some(p) => p.clone(),
            None => {
                let p = Arc::new(arena::plan(
                    &self.program,
                    (&self.steps, &self.folds),
                    &self.homes,
                    symbols,
                    self.logits.is_some(),
                ));
                state.plans.insert(key.clone(), p.clone());
                p
            }
        };
        if plan.total > state.capacity {
            let grown = plan.total.max(state.capacity + state.capacity / 2);
            if state.arena != 0 {
                // A launched step may still use it.
                self.device
                    .synchronize()
                    .map_err(|e| RuntimeError::Device(e.to_string()))?;
                self.device.free(state.arena);
            }
            state.graphs.clear(self.device.as_ref());
            state.arena = 0;
            state.capacity = 0;
            state.arena = self.device.alloc(grown).map_err(|e| {
                RuntimeError::Device(format!("activations need {grown} bytes: {e}"))
            })?;
            state.capacity = grown;
        }
        Ok(plan)
    }

    fn op_error(&self, id: ValueId, message: String) -> RuntimeError {
        RuntimeError::op(&self.program.graph, id, message)
    }

    /// Checks each distinct batch description of the attention steps (host
    /// values; every layer usually shares one) before any kernel reads the
    /// cache through it.
    fn check_attention_inputs(
        &self,
        inputs: &[Tensor],
        symbols: &HashMap<String, usize>,
        cache: Option<&KvCache>,
    ) -> Result<(), RuntimeError> {
        let graph = &self.program.graph;
        let input_of = |v: ValueId| match graph.nodes[v as usize].op {
            Op::Input { index } => Some(&inputs[index]),
            _ => None,
        };
        let mut checked: Vec<(usize, &[ValueId])> = Vec::new();
        for (step, plan) in self.program.steps.iter().zip(&self.steps) {
            let rows_here = || resolve(&graph.nodes[step.inputs[0] as usize].ty.shape, symbols)[0];
            if let StepPlan::SequenceAttention(_) = plan {
                let offsets = input_of(step.inputs[3]).ok_or_else(|| {
                    self.op_error(step.output, "row_offsets must be a graph input".into())
                })?;
                crate::runtime::cpu_ops::check_row_offsets(rows_here(), offsets.as_i64())
                    .map_err(|m| self.op_error(step.output, m))?;
                continue;
            }
            if !matches!(plan, StepPlan::Attention { .. }) {
                continue;
            }
            let rows_here = rows_here();
            let description = (rows_here, &step.inputs[3..6]);
            if checked.contains(&description) {
                continue;
            }
            checked.push(description);
            let fail = |m: String| self.op_error(step.output, m);
            let cache = cache.ok_or_else(|| fail("paged attention needs a KV cache".into()))?;
            let (Some(rows), Some(contexts), Some(tables)) = (
                input_of(step.inputs[3]),
                input_of(step.inputs[4]),
                input_of(step.inputs[5]),
            ) else {
                return Err(fail("the batch description must be graph inputs".into()));
            };
            check_ragged_batch(
                rows_here,
                rows.as_i64(),
                contexts.as_i64(),
                tables,
                cache.num_blocks(),
                cache.layout().block_size,
            )
            .map_err(fail)?;
        }
        Ok(())
    }
}

fn element_bytes(dtype: DType) -> usize {
    match storage_of(dtype) {
        Storage::F32 => 4,
        Storage::I64 => 8,
        Storage::Bool => 1,
    }
}

fn dump_kernels(dir: &std::path::Path, generated: &[(String, String)]) -> Result<(), CudaError> {
    std::fs::create_dir_all(dir)
        .and_then(|()| {
            generated
                .iter()
                .try_for_each(|(name, text)| std::fs::write(dir.join(name), text))
        })
        .map_err(|e| CudaError::Device(format!("KILN_DUMP_KERNELS={}: {e}", dir.display())))
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        for &ptr in &self.owned {
            self.device.free(ptr);
        }
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.arena != 0 {
            self.device.free(state.arena);
        }
        state.sampler.free(self.device.as_ref());
    }
}
