//! The backend seam: everything above it (engine, scheduler, sampling,
//! server) runs a compiled program through [`Backend`] without knowing
//! whether the CPU executor or the CUDA executor is behind it.

use std::sync::Arc;

use kiln_kernels::cuda::{Device, DriverSeconds};
use kiln_kernels::dense::attention::CacheLayout;

use super::sampling::{sample_row, RowSampling, Sampled};
use super::{KvCache, RuntimeError, Tensor};
use crate::compiler::Program;

/// Reads a device's count of kernels run so far ([`Device::kernels_run`]),
/// of bytes read back ([`Device::bytes_read`]) and of time in the driver
/// ([`Device::driver_seconds`]), from any thread: a benchmark's kernels,
/// readback and driver time per step.
#[derive(Clone)]
pub struct KernelCounter(pub(crate) Arc<dyn Device>);

impl KernelCounter {
    /// Launches and GEMMs run so far.
    pub fn kernels_run(&self) -> u64 {
        self.0.kernels_run()
    }

    /// Bytes the device copied to the host so far.
    pub fn bytes_read(&self) -> u64 {
        self.0.bytes_read()
    }

    /// Seconds spent in the driver's calls so far by kind, where a driver is
    /// called ([`Device::driver_seconds`]).
    pub fn driver_seconds(&self) -> Option<DriverSeconds> {
        self.0.driver_seconds()
    }
}

/// The rooflines of a device: a decode step at batch 1 is bound by reading
/// the weights, so it can run at most `copy_bytes_per_s ÷
/// weight_bytes_per_step` times a second; prefill is bound by the matrix
/// products' arithmetic, at most `gemm_flops_per_s ÷
/// product_flops_per_token` tokens a second.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Roofline {
    /// Bytes of weights one decode step reads (every product's matrix and
    /// every other weight once; the embedding table only where a product
    /// reads it too).
    pub weight_bytes_per_step: usize,
    /// The device's measured copy bandwidth, bytes read plus written per
    /// second.
    pub copy_bytes_per_s: f64,
    /// Floating-point operations of the matrix products per token (two per
    /// matrix element; attention's own products are not counted).
    pub product_flops_per_token: f64,
    /// The device's measured bf16 GEMM rate, operations a second: the
    /// prefill roofline.
    pub gemm_flops_per_s: f64,
}

impl Roofline {
    /// The most decode steps a second the bandwidth allows.
    pub fn steps_per_s(&self) -> f64 {
        self.copy_bytes_per_s / self.weight_bytes_per_step.max(1) as f64
    }

    /// The most prompt tokens a second the GEMM rate allows.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.gemm_flops_per_s / self.product_flops_per_token.max(1.0)
    }
}

/// An input token of a step taken, on the device, from the previous
/// launched step's picks (async scheduling): input 0 (the token ids) at
/// `index` gets the token picked for that step's sampled row `row`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenFeed {
    /// The previous step's sampled row.
    pub row: usize,
    /// The position in this step's token ids.
    pub index: usize,
}

/// A step after [`Backend::launch_step`], whose picks are not launched yet:
/// its logits, or the backend's hold on a step still running.
pub enum LaunchedStep {
    /// The step has run: its first output, the logits `[rows, vocab]`.
    Logits(Tensor),
    /// The step runs on the device; [`Backend::launch_picks`] queues its
    /// picks behind it.
    Running(Box<dyn std::any::Any + Send>),
}

/// The error for a step handed to a backend other than the one that
/// launched it.
pub(crate) fn foreign_step() -> RuntimeError {
    RuntimeError::Device("a step launched on another backend".to_owned())
}

/// A sampled step after [`Backend::launch_picks`]: its picks, or the
/// backend's hold on a step still running.
pub enum PendingSample {
    /// The step has run.
    Ready(Vec<Sampled>),
    /// The step runs on the device; [`Backend::finish_sampled`] waits for it.
    Running(Box<dyn std::any::Any + Send>),
}

/// A compiled program bound to its weights on one device.
pub trait Backend: Send + Sync {
    /// The program being run.
    fn program(&self) -> &Program;

    /// The backend itself, to reach what only one backend has (e.g. the
    /// CUDA backend's generated kernels).
    fn as_any(&self) -> &dyn std::any::Any;

    /// Where it runs, e.g. `cpu` or `cuda:0 (NVIDIA H100 80GB HBM3 (sm_90))`.
    fn device_name(&self) -> String;

    /// Bytes the KV cache stores `values` numbers in (4 each for f32, 2 for
    /// bf16, 34 per 32 for Q8_0), to size the cache.
    fn kv_bytes(&self, values: usize) -> usize {
        4 * values
    }

    /// Zeroed KV-cache storage on this backend's device.
    fn new_kv_cache(
        &self,
        num_layers: usize,
        num_blocks: usize,
        layout: CacheLayout,
    ) -> Result<KvCache, RuntimeError>;

    /// Prepares for the largest step the server will run (`worst_case`: the
    /// graph inputs of such a step), so that no later step allocates, and
    /// returns the bytes a KV cache may then take within `utilization`, the
    /// fraction of the device's memory this process may use
    /// (`--gpu-memory-utilization`). `None` on the CPU, whose cache is sized
    /// by `--kv-cache-memory`.
    fn reserve(
        &self,
        worst_case: Vec<Tensor>,
        utilization: f64,
    ) -> Result<Option<usize>, RuntimeError>;

    /// The decode batch sizes (sequences of one new token each) that a
    /// server runs once at start-up, before requests arrive, up to
    /// `max_sequences`, where the first run of a step shape costs far more
    /// than the next (the CUDA driver times its products' algorithms then);
    /// none (the default) where first use costs nothing extra.
    fn warm_up_batches(&self, max_sequences: usize) -> Vec<usize> {
        let _ = max_sequences;
        Vec::new()
    }

    /// The decode-step memory roofline of the device, measured now (`None`
    /// on the CPU and on a device that runs nothing).
    fn roofline(&self) -> Result<Option<Roofline>, RuntimeError>;

    /// The device's count of kernels run (`None` on the CPU).
    fn kernel_counter(&self) -> Option<KernelCounter> {
        None
    }

    /// Runs the graph on `inputs` (in the graph's input order), reading and
    /// writing `cache` for paged attention. Returns the graph's outputs.
    fn run(
        &self,
        inputs: Vec<Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Vec<Tensor>, RuntimeError>;

    /// The most top log-probabilities a row may ask for (`None`: no limit).
    fn max_logprobs(&self) -> Option<usize> {
        None
    }

    /// Whether [`Backend::launch_step`] returns while the step still runs
    /// and takes [`TokenFeed`]s, so that the host can read the previous
    /// step's picks, and decide how this step's rows are picked, meanwhile
    /// (async scheduling).
    fn overlaps_steps(&self) -> bool {
        false
    }

    /// Queues the graph, whose first output is logits `[rows, vocab]`;
    /// `feed` first writes picks of the previously launched step into this
    /// step's token ids (only a backend that overlaps steps takes one). By
    /// default the graph runs to the end here.
    fn launch_step(
        &self,
        inputs: Vec<Tensor>,
        cache: Option<&mut KvCache>,
        feed: &[TokenFeed],
    ) -> Result<LaunchedStep, RuntimeError> {
        if !feed.is_empty() {
            return Err(RuntimeError::Input {
                name: "feed".to_owned(),
                message: "this backend runs each step to the end: it has no picks to feed"
                    .to_owned(),
            });
        }
        Ok(LaunchedStep::Logits(
            self.run(inputs, cache)?.swap_remove(0),
        ))
    }

    /// Queues the pick of each row's token of the step launched last, where
    /// its logits are, as `rows` say: only the tokens and the
    /// log-probabilities asked for leave the device. By default the host
    /// picks them from the logits ([`sample_row`]).
    fn launch_picks(
        &self,
        step: LaunchedStep,
        rows: &[RowSampling],
    ) -> Result<PendingSample, RuntimeError> {
        let LaunchedStep::Logits(logits) = step else {
            return Err(foreign_step());
        };
        let vocab = logits.shape.last().copied().unwrap_or(0);
        if logits.len() != rows.len() * vocab {
            return Err(RuntimeError::Input {
                name: "logits".to_owned(),
                message: format!(
                    "{} rows of logits for {} sampled rows",
                    logits.len() / vocab.max(1),
                    rows.len()
                ),
            });
        }
        Ok(PendingSample::Ready(
            logits
                .as_f32()
                .chunks(vocab.max(1))
                .zip(rows)
                .map(|(l, row)| sample_row(l, row))
                .collect(),
        ))
    }

    /// Waits for a launched step's picks.
    fn finish_sampled(&self, pending: PendingSample) -> Result<Vec<Sampled>, RuntimeError> {
        match pending {
            PendingSample::Ready(sampled) => Ok(sampled),
            PendingSample::Running(_) => Err(foreign_step()),
        }
    }
}
