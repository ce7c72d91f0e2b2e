//! The RMS norms at a decoder's two ends, taken by the launches beside
//! them: the first layer's by the embedding that writes its input (the
//! embedding kernels' `KilnRowNorm`), and the last layer's add and norm
//! with the gather of the rows whose logits are asked for
//! (`kiln_add_rms_norm_rows`, norm.cu), which normalizes those rows alone.
//! Two launches a step fewer at any batch; neither norm sits between two
//! decode GEMVs, so `norm_fold.rs` leaves both.

use kiln_plugin_api::graph::{DType, ValueId};

use super::fusion::{computed_at, norms_after_producers, read_only_by, readers};
use super::plan::{Home, RowNorm, StepPlan};
use crate::compiler::Program;

/// Runs both fusions over `steps` (after the residual adds are fused into
/// their norms).
pub fn fuse_end_norms(program: &Program, homes: &[Home], steps: &mut [StepPlan]) {
    norm_embeddings(program, homes, steps);
    gather_last_norms(program, steps);
}

/// An RMS norm of an embedding's rows (its output, f32, the weight on the
/// device) becomes part of the embedding's launch.
fn norm_embeddings(program: &Program, homes: &[Home], steps: &mut [StepPlan]) {
    let is_f32 = |v: ValueId| program.graph.nodes[v as usize].ty.dtype == DType::F32;
    for (j, i, norm) in norms_after_producers(program, homes, steps) {
        if !(is_f32(program.steps[i].output) && is_f32(norm.output)) {
            continue;
        }
        if let StepPlan::Embedding(_, _, taken @ None) = &mut steps[i] {
            *taken = Some(norm);
            steps[j] = StepPlan::ComputedAt { at: i };
        }
    }
}

/// A fused add and norm whose sum only the norm reads and whose norm only a
/// gather of rows reads (the last layer's, before the logits) becomes a
/// [`StepPlan::AddRmsNormRows`] writing the gather's output.
fn gather_last_norms(program: &Program, steps: &mut [StepPlan]) {
    let graph = &program.graph;
    let readers = readers(program);
    let computed_at = computed_at(program, steps);
    for (g, step) in program.steps.iter().enumerate() {
        let StepPlan::Gather(0) = steps[g] else {
            continue;
        };
        let (data, ids) = (step.inputs[0], step.inputs[1]);
        let Some(&i) = computed_at.get(&data) else {
            continue;
        };
        let StepPlan::AddRmsNorm(norm) = steps[i] else {
            continue;
        };
        let sum = program.steps[i].output;
        let rows_of_rank_2 = [data, step.output]
            .iter()
            .all(|&v| graph.nodes[v as usize].ty.rank() == 2);
        let ids_ready = computed_at.get(&ids).is_none_or(|&at| at < i);
        if norm.output == data
            && rows_of_rank_2
            && ids_ready
            && read_only_by(&readers, steps, sum, i)
            && read_only_by(&readers, steps, data, g)
        {
            let norm = RowNorm {
                output: step.output,
                ..norm
            };
            steps[i] = StepPlan::AddRmsNormRows { norm, ids };
            steps[g] = StepPlan::ComputedAt { at: i };
        }
    }
}
