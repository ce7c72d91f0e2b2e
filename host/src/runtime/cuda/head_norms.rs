//! q's and k's per-head RMS norms (Qwen3's and Gemma 3's `q_norm` and
//! `k_norm`, before the rotary embedding) taken by the launch of their
//! paired rotation (`KilnHeadNorms` in rope.cu): each head's scale worked
//! out in the rotary block, the norms' outputs never written. Two launches
//! a layer fewer at any batch.

use std::collections::HashMap;

use kiln_plugin_api::graph::ValueId;

use super::fusion::{norms_after_producers, read_only_by, readers, step_of_output};
use super::plan::{HeadNorms, Home, RowNorm, StepPlan};
use crate::compiler::Program;

/// Heads a rotary block normalizes at most (`KILN_ROPE_NORMED_HEADS`).
const MOST_HEADS: usize = 256;

/// Moves the RMS norms whose outputs only a paired rotation of q and k
/// reads (through a reshape or not), both of one epsilon and offset over
/// whole heads, into it (after the rotations are paired).
pub fn fuse_head_norms(program: &Program, homes: &[Home], steps: &mut [StepPlan]) {
    let graph = &program.graph;
    let readers = readers(program);
    let norm_of: HashMap<ValueId, (usize, RowNorm)> = norms_after_producers(program, homes, steps)
        .into_iter()
        .map(|(j, _, norm)| (norm.output, (j, norm)))
        .collect();
    let producer = step_of_output(program);
    let last_dim = |v: ValueId| graph.nodes[v as usize].ty.shape.last().cloned();
    // The norm whose output reaches rotation `r`'s input `v`, which only
    // `r` reads: directly, or through a reshape (a projection of one head,
    // Gemma 3 1B's k, normalized before its split into heads), over rows
    // of one head.
    let norm_reaching = |v: ValueId, r: usize, steps: &[StepPlan]| {
        if !read_only_by(&readers, steps, v, r) {
            return None;
        }
        let found = norm_of.get(&v).copied().or_else(|| {
            let a = *producer.get(&v)?;
            let u = program.steps[a].inputs.first().copied()?;
            let through =
                matches!(steps[a], StepPlan::Alias) && read_only_by(&readers, steps, u, a);
            through.then(|| norm_of.get(&u).copied()).flatten()
        })?;
        (last_dim(found.1.output) == last_dim(v)).then_some(found)
    };
    for r in 0..steps.len() {
        let StepPlan::Rope {
            with: Some((k_normed, _)),
            in_group: None,
            head_norms: None,
            ..
        } = steps[r]
        else {
            continue;
        };
        let q_normed = program.steps[r].inputs[0];
        let (Some((qj, q)), Some((kj, k))) = (
            norm_reaching(q_normed, r, steps),
            norm_reaching(k_normed, r, steps),
        ) else {
            continue;
        };
        // [T, heads, head_dim], normalized over each head.
        let heads = |v: ValueId| match graph.nodes[v as usize].ty.rank() {
            3 => graph.nodes[v as usize].ty.shape[1].as_static(),
            _ => None,
        };
        let (Some(q_heads), Some(k_heads)) = (heads(q_normed), heads(k_normed)) else {
            continue;
        };
        let alike = q.eps == k.eps && q.offset == k.offset;
        if alike && q_heads + k_heads <= MOST_HEADS as u64 {
            let norms = HeadNorms {
                q,
                q_in: program.steps[qj].inputs[0],
                k,
                k_in: program.steps[kj].inputs[0],
            };
            if let StepPlan::Rope { head_norms, .. } = &mut steps[r] {
                *head_norms = Some(norms);
            }
            steps[qj] = StepPlan::ComputedAt { at: r };
            steps[kj] = StepPlan::ComputedAt { at: r };
        }
    }
}
