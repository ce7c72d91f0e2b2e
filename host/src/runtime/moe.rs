//! The CPU mixture of experts: every token is routed, tokens are grouped
//! per expert, and each expert that has tokens runs its three products once
//! over its tokens' rows (weights in their stored encoding); the outputs are
//! added to the tokens' rows with their routing weights, in expert order as
//! transformers adds them.

use kiln_kernels::dense::moe::{route, Router, Scoring};
use kiln_plugin_api::graph::{MoeRouting, MoeSpec};

use super::cpu_ops::unary_f32_in_place;
use super::executor::Executor;
use super::tensor::Tensor;

/// The graph's weight indices of every expert's projections.
pub(super) struct Experts<'a> {
    pub gate: &'a [usize],
    pub up: &'a [usize],
    pub down: &'a [usize],
}

/// The kernels' router for `spec`, with the correction bias if it has one.
pub(crate) fn router<'a>(spec: &MoeSpec, bias: Option<&'a [f32]>) -> Router<'a> {
    let scoring = match spec.routing {
        MoeRouting::Softmax => Scoring::Softmax,
        MoeRouting::Sigmoid {
            groups, top_groups, ..
        } => Scoring::Sigmoid {
            bias,
            groups: groups as usize,
            top_groups: top_groups as usize,
        },
    };
    Router {
        top_k: spec.top_k as usize,
        scoring,
        renormalize: spec.renormalize,
        scale: spec.scale,
    }
}

impl Executor {
    /// `[T, hidden]`: the mixture over `inputs` (x, router logits, the
    /// correction bias if any).
    pub(super) fn mixture_of_experts(
        &self,
        spec: &MoeSpec,
        experts: &Experts<'_>,
        inputs: &[&Tensor],
    ) -> Result<Vec<f32>, String> {
        let (x, logits) = (inputs[0].as_f32(), inputs[1].as_f32());
        let bias = inputs.get(2).map(|b| b.as_f32());
        let hidden = inputs[0].shape[1];
        let num_experts = spec.num_experts as usize;
        let tokens = x.len() / hidden.max(1);
        let k = spec.top_k as usize;
        let router = router(spec, bias);

        // Route, then list each expert's (token, weight) pairs.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); num_experts];
        let (mut picked, mut weights) = (vec![0u32; k], vec![0f32; k]);
        for (t, row) in logits.chunks_exact(num_experts).enumerate() {
            route(&router, row, &mut picked, &mut weights);
            for (&e, &w) in picked.iter().zip(&weights) {
                routed[e as usize].push((t, w));
            }
        }

        let mut out = vec![0f32; tokens * hidden];
        let precision = self.precision();
        // Only the down projection, of a gated activation, carries two
        // digits (see `precision`).
        let input_precision = super::precision::single_digit(precision);
        for (e, rows) in routed.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            let mut xs = self.pool().take(rows.len() * hidden);
            for (dst, &(t, _)) in xs.chunks_exact_mut(hidden).zip(rows) {
                dst.copy_from_slice(&x[t * hidden..(t + 1) * hidden]);
            }
            let mut gate = self.linear_rows(experts.gate[e], &xs, input_precision)?;
            let up = self.linear_rows(experts.up[e], &xs, input_precision)?;
            unary_f32_in_place(spec.activation, &mut gate);
            gate.iter_mut().zip(&up).for_each(|(g, u)| *g *= u);
            let y = self.linear_rows(experts.down[e], &gate, precision)?;
            for (row, &(t, w)) in y.chunks_exact(hidden).zip(rows) {
                let dst = &mut out[t * hidden..(t + 1) * hidden];
                dst.iter_mut().zip(row).for_each(|(o, v)| *o += w * v);
            }
            for buffer in [xs, gate, up, y] {
                self.pool().give(Tensor::from_f32(
                    kiln_plugin_api::graph::DType::F32,
                    vec![buffer.len()],
                    buffer,
                ));
            }
        }
        Ok(out)
    }
}
