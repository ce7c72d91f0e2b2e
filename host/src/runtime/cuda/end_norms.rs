//! The RMS norms at a decoder's two ends, taken by the launches beside
//! them: the first layer's by the embedding that writes its input (the
//! embedding kernels' `KilnRowNorm`, which also scales the rows where the
//! model does: Gemma's √hidden, Granite's embedding multiplier), and the
//! last layer's add and norm with the gather of the rows whose logits are
//! asked for (`kiln_add_rms_norm_rows`, norm.cu), which normalizes those
//! rows alone. Two launches a step fewer at any batch, three with a
//! scaling; neither norm sits between two decode GEMVs, so `norm_fold.rs`
//! leaves both.

use kiln_plugin_api::graph::{BinaryOp, DType, Op, ValueId};

use super::fusion::{binary_f32, computed_at, norms_after_producers, read_only_by, readers};
use super::plan::{Home, RowNorm, StepPlan};
use crate::compiler::Program;

/// Runs the fusions over `steps` (after the residual adds are fused into
/// their norms).
pub fn fuse_end_norms(program: &Program, homes: &[Home], steps: &mut [StepPlan]) {
    scale_embeddings(program, steps);
    norm_embeddings(program, homes, steps);
    gather_last_norms(program, steps);
}

/// An f32 element-wise step that alone reads an embedding's rows and
/// multiplies them by a scalar constant (other than 0) becomes part of the
/// embedding's launch, which writes the product in its place.
fn scale_embeddings(program: &Program, steps: &mut [StepPlan]) {
    let graph = &program.graph;
    let readers = readers(program);
    let computed_at = computed_at(program, steps);
    for (j, step) in program.steps.iter().enumerate() {
        let Some(factor) = scalar_multiple(program, j) else {
            continue;
        };
        let x = step.inputs[0];
        let Some(&i) = computed_at.get(&x) else {
            continue;
        };
        let same_type = graph.nodes[x as usize].ty == graph.nodes[step.output as usize].ty;
        if !(same_type
            && matches!(steps[j], StepPlan::Fused(..))
            && read_only_by(&readers, steps, x, j))
        {
            continue;
        }
        if let StepPlan::Embedding {
            scale: scale @ None,
            norm: None,
            ..
        } = &mut steps[i]
        {
            *scale = Some((factor, step.output));
            steps[j] = StepPlan::ComputedAt { at: i };
        }
    }
}

/// The factor of step `s` where it is `inputs[0] · c` in f32 with
/// `inputs[1]` a one-element constant `c` other than 0.
fn scalar_multiple(program: &Program, s: usize) -> Option<f32> {
    let Some((BinaryOp::Mul, _)) = binary_f32(program, s) else {
        return None;
    };
    match &program.graph.nodes[program.steps[s].inputs[1] as usize].op {
        Op::Constant(c) if c.values.len() == 1 && c.values[0] != 0.0 => Some(c.values[0] as f32),
        _ => None,
    }
}

/// An RMS norm of an embedding's rows (its output, or its scaling's, f32,
/// the weight on the device) becomes part of the embedding's launch.
fn norm_embeddings(program: &Program, homes: &[Home], steps: &mut [StepPlan]) {
    let is_f32 = |v: ValueId| program.graph.nodes[v as usize].ty.dtype == DType::F32;
    for (j, i, norm) in norms_after_producers(program, homes, steps) {
        if !(is_f32(program.steps[i].output) && is_f32(norm.output)) {
            continue;
        }
        let launch = match steps[i] {
            StepPlan::ComputedAt { at } => at,
            _ => i,
        };
        if let StepPlan::Embedding {
            norm: taken @ None,
            scale,
            ..
        } = &mut steps[launch]
        {
            let writes = scale.map_or(program.steps[launch].output, |(_, scaled)| scaled);
            if writes == program.steps[i].output {
                *taken = Some(norm);
                steps[j] = StepPlan::ComputedAt { at: launch };
            }
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
