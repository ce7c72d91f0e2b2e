//! The arena plan of one binding of a program's symbolic sizes: each value's
//! concrete shape and offset, from the liveness of the lowered steps. The
//! graph inputs, the error flag, split attention's counters, the logits
//! GEMV's greedy keys and the folded norms' counter go first, one after
//! another, so one upload a step writes them all; then every other value,
//! each step's scratch and the folded norms' scales and partials, placed by
//! `memory::place`.

use std::collections::HashMap;

use kiln_plugin_api::graph::{Op, ValueId};

use super::memory::{self, Buffer};
use super::norm_fold::NormFolds;
use super::plan::{Home, StepPlan};
use super::{attention, element_bytes, products};
use crate::compiler::Program;
use crate::runtime::executor::resolve;

/// Addresses and shapes of one binding.
pub struct RunPlan {
    /// Concrete shape of each value.
    pub shapes: Vec<Vec<usize>>,
    /// Arena offset of each value (arena values only).
    pub offsets: Vec<Option<usize>>,
    /// Arena offset of each step's scratch buffer.
    pub scratch: Vec<Option<usize>>,
    /// Bytes at the start of the arena that one upload writes before a step:
    /// the graph inputs, then the error flag, the split counters and the
    /// greedy picks' counter and keys (zero).
    pub staged: usize,
    /// Arena offset of the flag a kernel sets on an out-of-range index.
    pub error_flag: usize,
    /// Arena offset of the counters of finished splits of split-K attention
    /// and tensor-core products (`attention::split_counter_bytes`,
    /// `products::split_counter_bytes`).
    pub split_counters: usize,
    /// Arena offset of the logits GEMV's count of blocks done and greedy
    /// keys (`gemv::GreedyPicks::at`), when the program has a logits
    /// product.
    pub greedy_picks: Option<usize>,
    /// Arena offsets of the folded norms' count of blocks done (in the
    /// upload) and of their scales and partials
    /// (`norm_fold::FoldScratch`), where a fold applies at this binding.
    pub folds: Option<(usize, usize)>,
    /// Bytes the arena needs.
    pub total: usize,
}

/// Plans the arena of `program` (lowered to `steps`, with `folds`, values
/// living at `homes`) for the sizes of `symbols`; `greedy_picks`: the
/// program has a logits product, whose GEMV finds greedy's picks.
pub fn plan(
    program: &Program,
    (steps, folds): (&[StepPlan], &NormFolds),
    homes: &[Home],
    symbols: &HashMap<String, usize>,
    greedy_picks: bool,
) -> RunPlan {
    let graph = &program.graph;
    let shapes: Vec<Vec<usize>> = graph
        .nodes
        .iter()
        .map(|n| resolve(&n.ty.shape, symbols))
        .collect();
    let bytes_of =
        |v: usize| shapes[v].iter().product::<usize>() * element_bytes(graph.nodes[v].ty.dtype);
    let end = steps.len();
    // Each arena root's life: from its first writer to its last reader.
    let mut life: HashMap<ValueId, (usize, usize)> = HashMap::new();
    let mut touch = |root: ValueId, at: usize| {
        let e = life.entry(root).or_insert((at, at));
        e.0 = e.0.min(at);
        e.1 = e.1.max(at);
    };
    for (id, node) in graph.nodes.iter().enumerate() {
        if let (Op::Input { .. }, Home::Arena(root)) = (&node.op, homes[id]) {
            touch(root, 0);
        }
    }
    for (s, (step, plan)) in program.steps.iter().zip(steps).enumerate() {
        if let Home::Arena(root) = homes[step.output as usize] {
            touch(root, s);
            // A grouped product or a fused norm is written earlier, as is a
            // gated activation when the GEMV of its products writes it.
            if let StepPlan::ComputedAt { at } | StepPlan::GatedActivation { at, .. } = plan {
                touch(root, *at);
            }
        }
        // A product into a folded norm writes the add's and the norm's
        // outputs.
        if let Some(fold) = folds.of_product(step.output) {
            for v in [fold.sum, fold.norm.output] {
                if let Home::Arena(root) = homes[v as usize] {
                    touch(root, s);
                }
            }
        }
        // A GEMV of q, k and v writes their rotations too.
        if let StepPlan::LinearGroup {
            rotation: Some(r), ..
        } = plan
        {
            for v in [r.q_out, r.k_out] {
                if let Home::Arena(root) = homes[v as usize] {
                    touch(root, s);
                }
            }
        }
        // A step computed by another launch reads its inputs there too
        // (later, for q's and k's norms taken by their rotation).
        for &i in &step.inputs {
            if let Home::Arena(root) = homes[i as usize] {
                touch(root, s);
                if let StepPlan::ComputedAt { at } = plan {
                    touch(root, *at);
                }
            }
        }
    }
    for &o in &graph.outputs {
        if let Home::Arena(root) = homes[o as usize] {
            touch(root, end);
        }
    }
    // Graph inputs go first, one after another, then the error flag: one
    // upload a step writes them all. They stay live through the step.
    let align = |bytes: usize| bytes.div_ceil(memory::ALIGN) * memory::ALIGN;
    let mut offsets = vec![None; graph.nodes.len()];
    let mut staged = 0;
    for (id, node) in graph.nodes.iter().enumerate() {
        if let (Op::Input { .. }, Home::Arena(root)) = (&node.op, homes[id]) {
            if life.remove(&root).is_some() {
                offsets[root as usize] = Some(staged);
                staged += align(bytes_of(root as usize));
            }
        }
    }
    let error_flag = staged;
    staged += 4;
    // The counters of split attention and split tensor-core products: zero
    // at the start of every step, as their kernels leave them (so a step
    // that failed midway leaves none behind); one kernel uses them at a time.
    let split_counters = staged;
    staged += program
        .steps
        .iter()
        .zip(steps)
        .map(|(step, plan)| {
            let shape = |i: usize| &shapes[step.inputs[i] as usize];
            match plan {
                StepPlan::Attention { .. } => attention::split_counter_bytes(shape(0), shape(5)),
                StepPlan::Linear(_) | StepPlan::LinearGroup { .. } => {
                    products::split_counter_bytes(plan, shape(0).iter().product())
                }
                _ => 0,
            }
        })
        .max()
        .unwrap_or(0);
    // The logits GEMV's counter and keys: zero at the start of every step.
    let greedy_picks = greedy_picks.then(|| {
        let at = staged.div_ceil(8) * 8;
        staged = at + super::gemv::GREEDY_PICKS_BYTES;
        at
    });
    // The folded norms' counter: zero at the start of every step, as their
    // producers leave it; one producer uses it at a time. Their scales and
    // partials live through the step.
    let fold_bytes = folds.scratch_bytes(|f| {
        let x = &shapes[program.steps[f.producer_step].inputs[0] as usize];
        x.iter().product::<usize>() / f.producer.cols.max(1)
    });
    let fold_counter = (fold_bytes > 0).then(|| {
        let at = staged.div_ceil(4) * 4;
        staged = at + 4;
        at
    });
    let base = align(staged);
    let mut roots: Vec<(ValueId, (usize, usize))> = life.into_iter().collect();
    roots.sort_unstable();
    let mut buffers: Vec<Buffer> = roots
        .iter()
        .map(|&(root, (first, last))| Buffer {
            bytes: bytes_of(root as usize),
            first,
            last,
        })
        .collect();
    // Step scratch: activations cast to a half type and matrices
    // expanded from GGUF blocks for GEMMs, split attention's partials.
    let mut scratch_steps = Vec::new();
    for (s, (step, plan)) in program.steps.iter().zip(steps).enumerate() {
        let x_elements = || shapes[step.inputs[0] as usize].iter().product();
        let bytes = match plan {
            StepPlan::Linear(_) | StepPlan::MatMul(_) | StepPlan::LinearGroup { .. } => {
                products::scratch_bytes(plan, x_elements())
            }
            StepPlan::MixtureOfExperts(moe) => {
                let x = &shapes[step.inputs[0] as usize];
                super::moe::scratch_bytes(moe, x_elements(), x.last().copied().unwrap_or(1))
            }
            StepPlan::Attention { .. } => attention::attention_scratch_bytes(
                &shapes[step.inputs[0] as usize],
                &shapes[step.inputs[5] as usize],
            ),
            _ => 0,
        };
        if bytes > 0 {
            scratch_steps.push(s);
            buffers.push(Buffer {
                bytes,
                first: s,
                last: s,
            });
        }
    }
    if fold_bytes > 0 {
        buffers.push(Buffer {
            bytes: fold_bytes,
            first: 0,
            last: end,
        });
    }
    let placement = memory::place(&buffers);
    for (i, &(root, _)) in roots.iter().enumerate() {
        offsets[root as usize] = Some(base + placement.offsets[i]);
    }
    let mut scratch = vec![None; steps.len()];
    for (j, &s) in scratch_steps.iter().enumerate() {
        scratch[s] = Some(base + placement.offsets[roots.len() + j]);
    }
    let folds = fold_counter.map(|counter| {
        let at = roots.len() + scratch_steps.len();
        (counter, base + placement.offsets[at])
    });
    RunPlan {
        shapes,
        offsets,
        scratch,
        staged,
        error_flag,
        split_counters,
        greedy_picks,
        folds,
        total: base + placement.total,
    }
}
