//! A product's post-norm joined to the residual add and norm after it
//! (Gemma 2's and 3's sandwich norms: `h = x + post(o)`, then the next
//! norm of `h`), run as one `kiln_norm_add_rms_norm` launch at the
//! post-norm's step: two launches a layer fewer at any batch, the post-norm's
//! output never written.

use kiln_plugin_api::graph::{DType, ValueId};

use super::fusion::{computed_at, norms_after_producers, readers, step_of_output};
use super::plan::{Home, StepPlan};
use crate::compiler::Program;

/// Fuses each RMS norm read only by a fused add and norm
/// ([`StepPlan::AddRmsNorm`]) whose other input is computed before it into
/// a [`StepPlan::NormAddRmsNorm`] (after the adds are fused into their
/// norms).
pub fn fuse_post_norms(program: &Program, homes: &[Home], steps: &mut [StepPlan]) {
    let readers = readers(program);
    let computed_at = computed_at(program, steps);
    let step_of = step_of_output(program);
    let is_f32 = |v: ValueId| program.graph.nodes[v as usize].ty.dtype == DType::F32;
    for (k, _, post) in norms_after_producers(program, homes, steps) {
        let Some(&[Some(a)]) = readers.get(&post.output).map(Vec::as_slice) else {
            continue;
        };
        let StepPlan::AddRmsNorm(norm) = steps[a] else {
            continue;
        };
        let add = &program.steps[a];
        let residual = match add.inputs[..] {
            [x, n] | [n, x] if n == post.output && x != post.output => x,
            _ => continue,
        };
        let residual_ready = computed_at.get(&residual).is_none_or(|&at| at < k);
        if !(residual_ready && is_f32(post.output) && is_f32(program.steps[k].inputs[0])) {
            continue;
        }
        steps[k] = StepPlan::NormAddRmsNorm {
            post,
            residual,
            sum: add.output,
            norm,
        };
        // The add and the norm it took (computed at the add's step) move here.
        steps[a] = StepPlan::ComputedAt { at: k };
        steps[step_of[&norm.output]] = StepPlan::ComputedAt { at: k };
    }
}
