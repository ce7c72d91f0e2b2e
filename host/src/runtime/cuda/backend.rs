//! The CUDA executor behind the [`Backend`] seam: its KV cache, memory
//! reservation and rooflines, and a sampled step in two launches (the graph,
//! then its picks behind it) that come back by one readback.

use kiln_kernels::cuda::{DevicePtr, Readback};
use kiln_kernels::dense::attention::CacheLayout;

use super::step::{check_error_flag, download};
use super::{binding, buckets, measure, sample, CudaExecutor, DeviceKvCache};
use crate::compiler::Program;
use crate::runtime::backend::foreign_step;
use crate::runtime::executor::bind_symbols;
use crate::runtime::sampling::{RowSampling, Sampled};
use crate::runtime::{
    Backend, KernelCounter, KvCache, LaunchedStep, PendingSample, Roofline, RuntimeError, Tensor,
    TokenFeed,
};

impl Backend for CudaExecutor {
    fn program(&self) -> &Program {
        &self.program
    }

    fn device_name(&self) -> String {
        self.label.clone()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn kv_bytes(&self, values: usize) -> usize {
        self.kv_element.bytes() * values
    }

    fn new_kv_cache(
        &self,
        num_layers: usize,
        num_blocks: usize,
        layout: CacheLayout,
    ) -> Result<KvCache, RuntimeError> {
        let layer_bytes = self.kv_bytes(num_blocks * layout.block_size * layout.position_stride());
        let total = 2 * num_layers * layer_bytes;
        let base = self.device.alloc(total).map_err(|e| {
            RuntimeError::Device(format!(
                "the KV cache ({num_blocks} blocks × {num_layers} layers, {total} bytes): {e}"
            ))
        })?;
        let device = DeviceKvCache {
            device: self.device.clone(),
            base,
            layer_bytes,
            num_layers,
            layout,
            element: self.kv_element,
        };
        Ok(KvCache::on_device(num_layers, num_blocks, layout, device))
    }

    fn reserve(
        &self,
        worst_case: Vec<Tensor>,
        utilization: f64,
    ) -> Result<Option<usize>, RuntimeError> {
        let symbols = bind_symbols(&self.program.graph, &worst_case)?;
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let plan = self.prepare(&mut state, &symbols, &binding(&symbols))?;
            let logits = &plan.shapes[self.program.graph.outputs[0] as usize];
            let vocab = logits.last().copied().unwrap_or(0);
            let rows = logits.iter().product::<usize>() / vocab.max(1);
            state
                .sampler
                .reserve(self.device.as_ref(), rows, vocab, 1)
                .map_err(RuntimeError::Device)?;
        }
        let (free, total) = self
            .device
            .memory()
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        let allowed = (total as f64 * utilization) as usize;
        let used = total - free;
        Ok(Some(allowed.saturating_sub(used)))
    }

    fn kernel_counter(&self) -> Option<KernelCounter> {
        Some(KernelCounter(self.device.clone()))
    }

    fn warm_up_batches(&self, max_sequences: usize) -> Vec<usize> {
        let always = self
            .warm_up_always
            .load(std::sync::atomic::Ordering::Relaxed);
        if self.paddable && (always || self.device.times_products()) {
            buckets::batch_buckets(max_sequences)
        } else {
            Vec::new()
        }
    }

    fn roofline(&self) -> Result<Option<Roofline>, RuntimeError> {
        let device = self.device.as_ref();
        if !device.computes() {
            return Ok(None);
        }
        let copy_bytes_per_s = measure::copy_bandwidth(device)
            .map_err(|e| RuntimeError::Device(format!("measuring the copy bandwidth: {e}")))?;
        let gemm_flops_per_s = measure::gemm_rate(device)
            .map_err(|e| RuntimeError::Device(format!("measuring the GEMM rate: {e}")))?;
        Ok(Some(Roofline {
            weight_bytes_per_step: self.weight_bytes_per_step,
            copy_bytes_per_s,
            product_flops_per_token: self.product_flops_per_token,
            gemm_flops_per_s,
        }))
    }

    fn run(
        &self,
        inputs: Vec<Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let graph = &self.program.graph;
        // The arena stays locked until the outputs are downloaded.
        let executed = self.execute(&inputs, cache, &[], false)?;
        let outputs = graph
            .outputs
            .iter()
            .map(|&o| {
                let node = &graph.nodes[o as usize];
                download(
                    self.device.as_ref(),
                    node.ty.dtype,
                    executed.output_shape(o as usize),
                    executed.addrs[o as usize],
                )
            })
            .collect::<Result<_, _>>()
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        executed.check_error_flag(self.device.as_ref())?;
        Ok(outputs)
    }

    fn overlaps_steps(&self) -> bool {
        true
    }

    fn max_logprobs(&self) -> Option<usize> {
        Some(sample::MAX_TOP)
    }

    fn launch_step(
        &self,
        inputs: Vec<Tensor>,
        cache: Option<&mut KvCache>,
        feed: &[TokenFeed],
    ) -> Result<LaunchedStep, RuntimeError> {
        let executed = self.execute(&inputs, cache, feed, true)?;
        let logits = self.program.graph.outputs[0] as usize;
        let shape = &executed.output_shape(logits);
        let vocab = shape.last().copied().unwrap_or(0);
        Ok(LaunchedStep::Running(Box::new(LaunchedLogits {
            step: executed.state.steps_launched,
            logits: executed.addrs[logits],
            rows: shape.iter().product::<usize>() / vocab.max(1),
            vocab,
            greedy: self.greedy_picked(&executed.plan),
            error_flag: executed.error_flag,
        })))
    }

    fn launch_picks(
        &self,
        step: LaunchedStep,
        rows: &[RowSampling],
    ) -> Result<PendingSample, RuntimeError> {
        let step = match step {
            LaunchedStep::Running(step) => step.downcast::<LaunchedLogits>().ok(),
            LaunchedStep::Logits(_) => None,
        }
        .ok_or_else(foreign_step)?;
        if let Some(row) = rows
            .iter()
            .find(|r| r.logprobs.unwrap_or(0) > sample::MAX_TOP)
        {
            return Err(RuntimeError::Input {
                name: "logprobs".to_owned(),
                message: format!(
                    "{} top log-probabilities asked, at most {}",
                    row.logprobs.unwrap_or(0),
                    sample::MAX_TOP
                ),
            });
        }
        if step.rows != rows.len() {
            return Err(RuntimeError::Input {
                name: "logits".to_owned(),
                message: format!(
                    "{} rows of logits for {} sampled rows",
                    step.rows,
                    rows.len()
                ),
            });
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.steps_launched != step.step {
            return Err(RuntimeError::Device(
                "another step ran over this step's logits before its picks were launched".into(),
            ));
        }
        let device = self.device.as_ref();
        let queued = state
            .sampler
            .launch(
                device,
                self.hand["kiln_sample"],
                (step.logits, step.vocab),
                rows,
                step.greedy,
            )
            .map_err(RuntimeError::Device)?;
        // The error flag comes back first, the picks after it.
        let mut parts = vec![(step.error_flag, 4)];
        parts.extend_from_slice(queued.parts());
        let readback = device
            .download_async(&parts)
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        Ok(PendingSample::Running(Box::new(LaunchedSample {
            readback,
            queued,
        })))
    }

    fn finish_sampled(&self, pending: PendingSample) -> Result<Vec<Sampled>, RuntimeError> {
        let launched = match pending {
            PendingSample::Ready(sampled) => return Ok(sampled),
            PendingSample::Running(launched) => launched
                .downcast::<LaunchedSample>()
                .map_err(|_| foreign_step())?,
        };
        let bytes = self
            .device
            .wait_readback(launched.readback)
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        // A flagged index explains a bad sample: it is reported first.
        check_error_flag(&bytes[..4])?;
        launched
            .queued
            .picks(&bytes[4..])
            .map_err(RuntimeError::Device)
    }
}

/// A step launched whose picks are not: where its logits and its greedy
/// picks are, and which step it was.
struct LaunchedLogits {
    /// Its number among the executor's steps (`RunState::steps_launched`).
    step: u64,
    logits: DevicePtr,
    rows: usize,
    vocab: usize,
    /// Where the logits' GEMV left each row's greedy pick, if it did.
    greedy: Option<DevicePtr>,
    error_flag: DevicePtr,
}

/// A sampled step on its way: the readback of its error flag and picks.
struct LaunchedSample {
    readback: Readback,
    queued: sample::QueuedSample,
}
