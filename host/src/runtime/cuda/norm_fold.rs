//! A residual add and the RMS norm that reads it, between two decode GEMVs,
//! folded into them by linearity (`KilnGemvNorm` in gemv.cuh): `W · (h · s
//! · g) = s · (W · (h · g))`, with `s = 1 / rms(h)` a row of x. The product
//! the add reads (an o or down projection) adds its products to the
//! residual, writes the sum `h` and `h · g` and, in its last block, each
//! row's `s`; the products that read the norm (q, k and v; gate and up; the
//! logits) scale their sums by `s`. The norm's launch is saved: two a layer
//! of a Llama decode step. Found at load among the fused
//! [`StepPlan::AddRmsNorm`]s; a step applies it where both products run as
//! the decode GEMV at its rows of x ([`NormFold::applies`]), else the norm
//! runs as before.

use std::collections::HashMap;

use kiln_kernels::cuda::DevicePtr;
use kiln_plugin_api::graph::ValueId;

use super::fusion::{computed_at, read_only_by, readers};
use super::gemv::{GemvGroup, GemvNorm, GEMV_MAX_M};
use super::launch::Frame;
use super::plan::{RowNorm, StepPlan};
use super::weights::DeviceMatrix;
use crate::compiler::Program;

/// One add + norm folded into the products around it.
#[derive(Clone, Copy, Debug)]
pub struct NormFold {
    /// The product whose output the add reads, alone.
    pub producer: DeviceMatrix,
    /// Its step, whose launch writes `sum` and `norm` when the fold applies.
    pub producer_step: usize,
    /// The products that read the norm, alone, as one GEMV launch.
    pub consumer: GemvGroup,
    /// The add's other input: the residual stream so far.
    pub residual: ValueId,
    /// The add's output: the residual stream after.
    pub sum: ValueId,
    /// The norm, whose output is written as `sum · (offset + weight)`
    /// unscaled.
    pub norm: RowNorm,
    /// Its place among the folds: where its rows' scales go.
    pub slot: usize,
}

impl NormFold {
    /// Whether a step of `m` rows of x folds the norm: the producer and the
    /// consumer both run as the decode GEMV.
    pub fn applies(&self, m: usize) -> bool {
        GemvGroup::single(&self.producer).kernel(m).is_some() && self.consumer.kernel(m).is_some()
    }
}

/// The folds of a program, by the values that name them.
#[derive(Debug, Default)]
pub struct NormFolds {
    folds: Vec<NormFold>,
    by_product: HashMap<ValueId, usize>,
    by_sum: HashMap<ValueId, usize>,
    by_norm: HashMap<ValueId, usize>,
}

impl NormFolds {
    /// Finds every [`StepPlan::AddRmsNorm`] that folds: one of the add's
    /// inputs is a `Linear` product's output that only the add reads, the
    /// other computed before that product, and the norm's output is read by
    /// one `Linear` product or group alone, whose matrices one GEMV launch
    /// takes.
    pub fn find(program: &Program, steps: &[StepPlan]) -> Self {
        let computed_at = computed_at(program, steps);
        let readers = readers(program);
        let mut folds = Self::default();
        for (i, step) in program.steps.iter().enumerate() {
            let StepPlan::AddRmsNorm(norm) = steps[i] else {
                continue;
            };
            let Some(consumer) = consumer_of(program, steps, &readers, norm.output) else {
                continue;
            };
            // The input computed last, by a product only the add reads; the
            // other one before it.
            let producer = |a: ValueId| {
                let p = *computed_at.get(&a)?;
                match &steps[p] {
                    StepPlan::Linear(w)
                        if program.steps[p].output == a && read_only_by(&readers, steps, a, i) =>
                    {
                        Some((p, *w))
                    }
                    _ => None,
                }
            };
            let (a, b) = (step.inputs[0], step.inputs[1]);
            let before = |v: ValueId, p: usize| computed_at.get(&v).is_none_or(|&s| s < p);
            let found = [(a, b), (b, a)]
                .into_iter()
                .find_map(|(product, residual)| {
                    let (p, w) = producer(product)?;
                    before(residual, p).then_some((p, w, residual))
                });
            let Some((producer_step, producer, residual)) = found else {
                continue;
            };
            let slot = folds.folds.len();
            folds
                .by_product
                .insert(program.steps[producer_step].output, slot);
            folds.by_sum.insert(step.output, slot);
            folds.by_norm.insert(norm.output, slot);
            folds.folds.push(NormFold {
                producer,
                producer_step,
                consumer,
                residual,
                sum: step.output,
                norm,
                slot,
            });
        }
        folds
    }

    /// The fold whose producer writes `product` (the add's input).
    pub fn of_product(&self, product: ValueId) -> Option<&NormFold> {
        self.by_product.get(&product).map(|&f| &self.folds[f])
    }

    /// The fold of the add writing `sum`.
    pub fn of_sum(&self, sum: ValueId) -> Option<&NormFold> {
        self.by_sum.get(&sum).map(|&f| &self.folds[f])
    }

    /// The fold whose norm writes `norm` (the consumer's x).
    pub fn of_norm(&self, norm: ValueId) -> Option<&NormFold> {
        self.by_norm.get(&norm).map(|&f| &self.folds[f])
    }

    /// Bytes of the folds' scratch ([`FoldScratch`]) for a step where each
    /// fold's product has `rows_of(fold)` rows of x: each fold's
    /// [`GEMV_MAX_M`] row scales, then the producers' block partials (at
    /// most a block a row of the producer's matrix); none where no fold
    /// applies.
    pub fn scratch_bytes(&self, rows_of: impl Fn(&NormFold) -> usize) -> usize {
        let applying = self.folds.iter().filter(|f| f.applies(rows_of(f)));
        let rows = applying.map(|f| f.producer.rows).max();
        rows.map_or(0, |rows| self.partials_offset() + rows * GEMV_MAX_M * 4)
    }

    /// Where the producers' partials start in the folds' scratch.
    pub fn partials_offset(&self) -> usize {
        let scales = self.folds.len() * GEMV_MAX_M * 4;
        scales.div_ceil(super::memory::ALIGN) * super::memory::ALIGN
    }
}

/// The one launch reading `norm` (all its readers are that launch's steps,
/// `norm` their x), where it is a product or group one GEMV takes.
fn consumer_of(
    program: &Program,
    steps: &[StepPlan],
    readers: &HashMap<ValueId, Vec<Option<usize>>>,
    norm: ValueId,
) -> Option<GemvGroup> {
    let first = (*readers.get(&norm)?.first()?)?;
    let c = match steps[first] {
        StepPlan::ComputedAt { at } => at,
        _ => first,
    };
    let reads_as_x = program.steps[c].inputs.first() == Some(&norm)
        && program.steps[c].inputs[1..].iter().all(|&v| v != norm);
    if !reads_as_x || !read_only_by(readers, steps, norm, c) {
        return None;
    }
    match &steps[c] {
        StepPlan::Linear(w) => Some(GemvGroup::single(w)),
        StepPlan::LinearGroup { members, .. } => GemvGroup::of(members.iter().map(|(w, _)| w)),
        _ => None,
    }
}

/// Where a step's folds keep their state: the producers' count of blocks
/// done (in the step's upload, zero), each fold's row scales and the
/// producers' partials (the arena; [`NormFolds::scratch_bytes`]).
#[derive(Clone, Copy, Debug)]
pub struct FoldScratch {
    pub counter: DevicePtr,
    /// The scales of fold 0 ([`Self::scales_of`]).
    pub scales: DevicePtr,
    pub partials: DevicePtr,
}

impl FoldScratch {
    /// Where `fold`'s [`GEMV_MAX_M`] row scales are.
    fn scales_of(&self, fold: &NormFold) -> DevicePtr {
        self.scales + (fold.slot * GEMV_MAX_M * 4) as DevicePtr
    }
}

impl Frame<'_> {
    /// `fold` with this step's fold scratch, where it applies to `m` rows of
    /// x.
    fn applying(
        &self,
        fold: Option<&NormFold>,
        m: usize,
    ) -> Result<Option<(NormFold, FoldScratch)>, String> {
        let Some(fold) = fold.filter(|f| f.applies(m)) else {
            return Ok(None);
        };
        let scratch = self.folds.1.ok_or("no scratch planned for a folded norm")?;
        Ok(Some((*fold, scratch)))
    }

    /// The scales the products reading `x` multiply their sums by, where
    /// `x` is a folded norm's output at `m` rows.
    pub(super) fn row_scales(&self, x: ValueId, m: usize) -> Result<Option<DevicePtr>, String> {
        let applying = self.applying(self.folds.0.of_norm(x), m)?;
        Ok(applying.map(|(fold, s)| s.scales_of(&fold)))
    }

    /// The add and norm the product writing `product` does at `m` rows of
    /// x, where it folds them: its epilogue, and where its output goes
    /// instead (the norm's output).
    pub(super) fn folded_norm(
        &self,
        product: ValueId,
        m: usize,
    ) -> Result<Option<(GemvNorm, DevicePtr)>, String> {
        let Some((fold, s)) = self.applying(self.folds.0.of_product(product), m)? else {
            return Ok(None);
        };
        let addr = |v: ValueId| self.addrs[v as usize];
        let norm = GemvNorm {
            residual: addr(fold.residual),
            sum: addr(fold.sum),
            weight: addr(fold.norm.weight),
            partials: s.partials,
            counter: s.counter,
            scales: s.scales_of(&fold),
            offset: fold.norm.offset,
            eps: fold.norm.eps,
        };
        Ok(Some((norm, addr(fold.norm.output))))
    }

    /// Whether the add writing `sum` (and its norm) is done by the product
    /// it reads, at `m` rows of x.
    pub(super) fn norm_folded(&self, sum: ValueId, m: usize) -> bool {
        self.folds.0.of_sum(sum).is_some_and(|f| f.applies(m))
    }
}
