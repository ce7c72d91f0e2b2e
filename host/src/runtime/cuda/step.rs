//! Running one step on the device: binding its sizes, planning (or
//! reusing) its arena offsets, uploading its inputs, launching every step
//! (or replaying its CUDA graph) and downloading what comes back.

use std::sync::{Arc, MutexGuard};

use kiln_kernels::cuda::{Device, DevicePtr};
use kiln_plugin_api::graph::{DType, Op};

use super::arena::RunPlan;
use super::gemv::GreedyPicks;
use super::launch::Frame;
use super::norm_fold::FoldScratch;
use super::plan::Home;
use super::profile::StepKind;
use super::{binding, buckets, element_bytes, graphs, weights, CudaExecutor, RunState};
use crate::runtime::executor::bind_symbols;
use crate::runtime::tensor::{storage_of, Data, Storage, Tensor};
use crate::runtime::{KvCache, RuntimeError, TokenFeed};

/// A step that has run: the run state (still locked, since the arena holds
/// the outputs), its plan and each value's address.
pub(super) struct Executed<'a> {
    pub(super) state: MutexGuard<'a, RunState>,
    pub(super) plan: Arc<RunPlan>,
    pub(super) addrs: Vec<DevicePtr>,
    /// The logits rows asked for, when the step ran padded to a bucket.
    pub(super) padded_from: Option<usize>,
    /// Where the kernels flag an index out of range.
    pub(super) error_flag: DevicePtr,
}

impl Executed<'_> {
    /// Fails if a kernel flagged an index out of range. Read after the
    /// outputs, whose download was the step's one wait for the device.
    pub(super) fn check_error_flag(&self, device: &dyn Device) -> Result<(), RuntimeError> {
        let mut flag = [0u8; 4];
        device
            .download(self.error_flag, &mut flag)
            .map_err(|e| RuntimeError::Device(e.to_string()))?;
        check_error_flag(&flag)
    }

    /// The shape of output value `o` as the caller asked for it: a padded
    /// step's logits lose their padding rows (they come first in memory).
    pub(super) fn output_shape(&self, o: usize) -> Vec<usize> {
        let mut shape = self.plan.shapes[o].clone();
        if let (Some(rows), Some(first)) = (self.padded_from, shape.first_mut()) {
            *first = rows;
        }
        shape
    }
}

/// Fails if a kernel flagged an index out of range (`flag`: the flag's
/// bytes as read back).
pub(super) fn check_error_flag(flag: &[u8]) -> Result<(), RuntimeError> {
    if flag.iter().any(|&b| b != 0) {
        return Err(RuntimeError::Device(
            "an index (a token id or a gathered row) was out of range".into(),
        ));
    }
    Ok(())
}

impl CudaExecutor {
    /// Writes the last launched step's picks into this step's token ids
    /// (input 0, already uploaded to `addrs`), before the launches.
    fn feed_tokens(
        &self,
        state: &mut RunState,
        addrs: &[DevicePtr],
        inputs: &[Tensor],
        feed: &[TokenFeed],
    ) -> Result<(), RuntimeError> {
        let tokens = self
            .token_ids
            .filter(|_| inputs.first().is_some_and(|t| t.dtype == DType::I64))
            .ok_or_else(|| RuntimeError::Input {
                name: "feed".to_owned(),
                message: "the graph's first input is not i64 token ids".to_owned(),
            })?;
        state
            .sampler
            .feed(
                self.device.as_ref(),
                self.hand["kiln_feed_tokens"],
                addrs[tokens],
                inputs[0].len(),
                feed,
            )
            .map_err(|message| RuntimeError::Input {
                name: "feed".to_owned(),
                message,
            })
    }

    /// Uploads the inputs and launches every step (or replays them).
    /// `picks`: the logits' decode GEMV writes greedy's picks into the
    /// executor's buffer, which the next step may be fed from (a sampled
    /// step's); a step without (`Backend::run`, e.g. a scored prompt chunk
    /// while a sampled step is in flight) leaves them as they are, and is
    /// a binding of its own for the graph cache.
    pub(super) fn execute(
        &self,
        inputs: &[Tensor],
        cache: Option<&mut KvCache>,
        feed: &[TokenFeed],
        picks: bool,
    ) -> Result<Executed<'_>, RuntimeError> {
        let graph = &self.program.graph;
        let symbols = bind_symbols(graph, inputs)?;
        let cache = cache.map(|c| &*c);
        let device_cache = match cache {
            Some(c) => Some(c.device().ok_or_else(|| {
                RuntimeError::Device("the KV cache is in host memory, not on the device".into())
            })?),
            None => None,
        };
        self.check_attention_inputs(inputs, &symbols, cache)?;
        // With graphs, a decode step runs at its bucket's shape.
        let padded = (self.graphs && self.paddable)
            .then(|| buckets::pad_decode_step(inputs))
            .flatten();
        let padded_from = padded.as_ref().map(|_| inputs[0].shape[0]);
        let (inputs, symbols) = match &padded {
            Some(padded) => (padded.as_slice(), bind_symbols(graph, padded)?),
            None => (inputs, symbols),
        };
        let mut key = binding(&symbols);
        if !picks {
            key.push(("(no greedy picks)".to_owned(), 1));
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.steps_launched += 1;
        if let Some(window) = &mut state.profile {
            let kind = if self.paddable && buckets::is_decode_step(inputs) {
                StepKind::Decode
            } else {
                StepKind::Prefill
            };
            window
                .before_step(kind, self.device.as_ref())
                .map_err(|e| RuntimeError::Device(e.to_string()))?;
        }
        let plan = self.prepare(&mut state, &symbols, &key)?;
        let device = self.device.as_ref();
        let device_error = |e: kiln_kernels::cuda::DeviceError| RuntimeError::Device(e.to_string());
        let arena = state.arena;
        let addrs: Vec<DevicePtr> = self
            .homes
            .iter()
            .map(|home| match home {
                Home::Arena(root) => plan.offsets[*root as usize].map_or(0, |o| arena + o as u64),
                Home::Persistent(ptr) => *ptr,
                Home::Nowhere => 0,
            })
            .collect();
        // The inputs, a zero error flag, zero split counters and greedy keys,
        // in one upload.
        let mut staged = vec![0u8; plan.staged];
        for (id, node) in graph.nodes.iter().enumerate() {
            if let (Op::Input { index }, Some(at)) = (&node.op, plan.offsets[id]) {
                let bytes = weights::tensor_bytes(&inputs[*index]);
                staged[at..at + bytes.len()].copy_from_slice(&bytes);
            }
        }
        device.upload(arena, &staged).map_err(device_error)?;
        if !feed.is_empty() {
            self.feed_tokens(&mut state, &addrs, inputs, feed)?;
        }
        let error_flag = arena + plan.error_flag as u64;
        let frame = Frame {
            device,
            hand: &self.hand,
            programmatic: self.programmatic.as_ref(),
            gemv: &self.gemv,
            shapes: &plan.shapes,
            addrs: &addrs,
            half: &self.half,
            error_flag,
            split_counters: arena + plan.split_counters as u64,
            cache: device_cache,
            flash_attention: self.flash_attention,
            short_attention_splits: self.short_attention_splits,
            folds: (
                &self.folds,
                plan.folds.map(|(counter, at)| FoldScratch {
                    counter: arena + counter as u64,
                    scales: arena + at as u64,
                    partials: arena + (at + self.folds.partials_offset()) as u64,
                }),
            ),
            greedy: self
                .logits
                .zip(plan.greedy_picks)
                .filter(|_| picks)
                .map(|(logits, at)| {
                    let picks = GreedyPicks::at(arena + at as u64, logits.tokens);
                    (logits.value, picks)
                }),
        };
        let launch_all = || -> Result<(), String> {
            for (s, (step, step_plan)) in self.program.steps.iter().zip(&self.steps).enumerate() {
                let scratch = plan.scratch[s].map(|o| arena + o as u64);
                let dtype = graph.nodes[step.output as usize].ty.dtype;
                frame
                    .run(step, step_plan, dtype, scratch)
                    .map_err(|m| self.op_error(step.output, m).to_string())?;
            }
            Ok(())
        };
        let rows = inputs
            .first()
            .and_then(|t| t.shape.first().copied())
            .unwrap_or(0);
        let launched = if self.graphs && graphs::capturable(rows) {
            let cache = device_cache.map_or([0; 4], |c| {
                [
                    c.base,
                    c.layer_bytes as u64,
                    c.num_layers as u64,
                    c.layout.block_size as u64,
                ]
            });
            state.graphs.run(device, (key, cache), launch_all)
        } else {
            launch_all()
        };
        launched.map_err(RuntimeError::Device)?;
        Ok(Executed {
            state,
            plan,
            addrs,
            padded_from,
            error_flag,
        })
    }
}

pub(super) fn download(
    device: &dyn Device,
    dtype: DType,
    shape: Vec<usize>,
    ptr: DevicePtr,
) -> Result<Tensor, kiln_kernels::cuda::DeviceError> {
    let n: usize = shape.iter().product();
    let mut bytes = vec![0u8; n * element_bytes(dtype)];
    if n > 0 {
        device.download(ptr, &mut bytes)?;
    }
    let data = match storage_of(dtype) {
        Storage::F32 => Data::F32(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        Storage::I64 => Data::I64(
            bytes
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
        ),
        Storage::Bool => Data::Bool(bytes.iter().map(|&b| b != 0).collect()),
    };
    Ok(Tensor { dtype, shape, data })
}
