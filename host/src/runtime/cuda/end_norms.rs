//! The RMS norms at a decoder's two ends, taken by the launches beside
//! them: the first layer's by the embedding that writes its input (the
//! embedding kernels' `KilnRowNorm`), and the last layer's add and norm
//! with the gather of the rows whose logits are asked for
//! (`kiln_add_rms_norm_rows`, norm.cu), which normalizes those rows alone.
//! Two launches a step fewer at any batch; neither norm sits between two
//! decode GEMVs, so `norm_fold.rs` leaves both.

use std::collections::HashMap;

use kiln_plugin_api::graph::{DType, ValueId};

use super::fusion::{computed_at, read_only_by, readers};
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
    let graph = &program.graph;
    let producer: HashMap<ValueId, usize> = program
        .steps
        .iter()
        .enumerate()
        .map(|(s, step)| (step.output, s))
        .collect();
    let is_f32 = |v: ValueId| graph.nodes[v as usize].ty.dtype == DType::F32;
    for (j, step) in program.steps.iter().enumerate() {
        let StepPlan::RmsNorm { eps, offset } = steps[j] else {
            continue;
        };
        let (x, weight) = (step.inputs[0], step.inputs[1]);
        let Some(&i) = producer.get(&x) else {
            continue;
        };
        let weight_ready = matches!(homes[weight as usize], Home::Persistent(_));
        if !(weight_ready && is_f32(x) && is_f32(step.output)) {
            continue;
        }
        if let StepPlan::Embedding(_, _, norm @ None) = &mut steps[i] {
            *norm = Some(RowNorm {
                eps,
                offset,
                weight,
                output: step.output,
            });
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
        let StepPlan::AddRmsNorm {
            eps,
            offset,
            weight,
            norm,
        } = steps[i]
        else {
            continue;
        };
        let sum = program.steps[i].output;
        let rows_of_rank_2 = [data, step.output]
            .iter()
            .all(|&v| graph.nodes[v as usize].ty.rank() == 2);
        let ids_ready = computed_at.get(&ids).is_none_or(|&at| at < i);
        if norm == data
            && rows_of_rank_2
            && ids_ready
            && read_only_by(&readers, steps, sum, i)
            && read_only_by(&readers, steps, data, g)
        {
            steps[i] = StepPlan::AddRmsNormRows {
                norm: RowNorm {
                    eps,
                    offset,
                    weight,
                    output: step.output,
                },
                ids,
            };
            steps[g] = StepPlan::ComputedAt { at: i };
        }
    }
}
