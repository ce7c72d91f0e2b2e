//! The activation precision of each weight product of a program, chosen
//! once from the program's graph and the executor's [`Precision`].
//!
//! - The product producing the logits (the graph's first output) always
//!   keeps f32 activations: in fast mode that costs a few percent of decode
//!   speed and cuts the mean KL divergence from transformers by 7-22 % on
//!   the real models.
//! - With [`Precision::FastResidual`], the products where 8-bit activations
//!   lose most carry theirs as two 8-bit digits: a gated MLP's down
//!   projection (a gated activation's outliers are fast mode's largest
//!   error) and the attention projections, the products whose outputs reach
//!   an attention op (queries, keys, values) or that read its output. The
//!   others, an MLP's gate and up projections, run [`Precision::Fast`].
//!
//! Measurements in bench/cpu/NOTES.md.

use kiln_kernels::quant::Precision;
use kiln_plugin_api::graph::{BinaryOp, GraphIr, Op, ValueId};

use crate::compiler::{Kernel, Program};

/// Ops between a product and an attention op that leave the product's
/// values attention's operand: shape changes, rotary embedding, the norms
/// of queries and keys, biases and scalings.
fn carries_to_attention(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Permute { .. }
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Cast { .. }
            | Op::Rope { .. }
            | Op::RmsNorm { .. }
            | Op::LayerNorm { .. }
            | Op::Binary {
                op: BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
            }
    )
}

/// The most carrying ops followed from a product to an attention op.
const MAX_CARRIERS: usize = 8;

fn is_attention(op: &Op) -> bool {
    matches!(op, Op::PagedAttention(_) | Op::SequenceAttention(_))
}

/// Each weight product's precision, by the value it produces.
pub(crate) struct ProductPrecisions {
    by_output: Vec<Precision>,
}

impl ProductPrecisions {
    /// The precisions of `program`'s products for an executor of
    /// `precision`.
    pub(crate) fn new(program: &Program, precision: Precision) -> Self {
        let graph = &program.graph;
        let mut by_output = vec![single_digit(precision); graph.nodes.len()];
        if precision == Precision::FastResidual {
            let users = users(graph);
            for step in &program.steps {
                let (Kernel::Linear { .. }, Some(&input)) = (&step.kernel, step.inputs.first())
                else {
                    continue;
                };
                if is_gated(graph, input)
                    || reads_attention(graph, input)
                    || feeds_attention(graph, &users, step.output)
                {
                    by_output[step.output as usize] = precision;
                }
            }
        }
        if let Some(&logits) = graph.outputs.first() {
            by_output[logits as usize] = Precision::Exact;
        }
        Self { by_output }
    }

    /// The precision of the product producing `output`.
    pub(crate) fn of(&self, output: ValueId) -> Precision {
        self.by_output[output as usize]
    }
}

/// `precision` without [`Precision::FastResidual`]'s second digit: the
/// precision of the products that do not carry one.
pub(crate) fn single_digit(precision: Precision) -> Precision {
    match precision {
        Precision::FastResidual => Precision::Fast,
        precision => precision,
    }
}

/// The readers of each value.
fn users(graph: &GraphIr) -> Vec<Vec<ValueId>> {
    let mut users = vec![Vec::new(); graph.nodes.len()];
    for (id, node) in graph.nodes.iter().enumerate() {
        for &input in &node.inputs {
            users[input as usize].push(id as ValueId);
        }
    }
    users
}

/// `value` without the reshapes that produced it.
fn through_reshapes(graph: &GraphIr, mut value: ValueId) -> ValueId {
    while let Op::Reshape { .. } | Op::Permute { .. } = graph.nodes[value as usize].op {
        value = graph.nodes[value as usize].inputs[0];
    }
    value
}

/// Whether `value` is (a reshape of) an element-wise product of two
/// activations of its shape, rather than a scaling by a weight or a
/// constant.
fn is_gated(graph: &GraphIr, value: ValueId) -> bool {
    let node = &graph.nodes[through_reshapes(graph, value) as usize];
    matches!(node.op, Op::Binary { op: BinaryOp::Mul })
        && node.inputs.iter().all(|&i| {
            let operand = &graph.nodes[i as usize];
            !matches!(operand.op, Op::Weight { .. } | Op::Constant(_))
                && operand.ty.shape == node.ty.shape
        })
}

/// Whether `value` is (a reshape of) an attention op's output.
fn reads_attention(graph: &GraphIr, value: ValueId) -> bool {
    is_attention(&graph.nodes[through_reshapes(graph, value) as usize].op)
}

/// Whether `value` reaches an attention op through at most
/// [`MAX_CARRIERS`] carrying ops.
fn feeds_attention(graph: &GraphIr, users: &[Vec<ValueId>], value: ValueId) -> bool {
    let mut frontier = vec![value];
    for _ in 0..=MAX_CARRIERS {
        let mut next = Vec::new();
        for &v in &frontier {
            for &user in &users[v as usize] {
                let op = &graph.nodes[user as usize].op;
                if is_attention(op) {
                    return true;
                }
                if carries_to_attention(op) {
                    next.push(user);
                }
            }
        }
        if next.is_empty() {
            return false;
        }
        frontier = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use kiln_plugin_api::graph::DType;
    use kiln_plugin_api::nn::{
        build_decoder_graph, Activation, AttentionConfig, AttentionWithRope, Embedding, Linear,
        Mlp, Norm, RmsNorm, RotaryEmbedding, Transformer, TransformerBlock,
    };

    use super::*;

    /// A two-layer Llama-style decoder; `qwen` adds q/k/v biases, `gemma`
    /// query and key norms and post-norms.
    fn decoder(qwen: bool, gemma: bool) -> Program {
        let (width, heads, head_dim) = (32, 4, 8);
        let norm = || Norm::Rms(RmsNorm::new(width, DType::F32, 1e-6));
        let layers = (0..2)
            .map(|layer| TransformerBlock {
                input_layernorm: norm(),
                self_attn: AttentionWithRope::new(
                    AttentionConfig {
                        hidden_size: width,
                        num_heads: heads,
                        num_kv_heads: 2,
                        head_dim,
                        qkv_bias: qwen,
                        o_bias: false,
                        qk_norm_eps: gemma.then_some(1e-6),
                        scale: None,
                        sliding_window: None,
                        softcap: None,
                        dtype: DType::F32,
                    },
                    RotaryEmbedding::new(head_dim, 10_000.0),
                    layer,
                ),
                post_attention_layernorm: norm(),
                pre_feedforward_layernorm: gemma.then(norm),
                post_feedforward_layernorm: gemma.then(norm),
                mlp: Mlp::gated(width, 64, DType::F32, Activation::Silu),
            })
            .collect();
        let model = Transformer {
            embed_tokens: Embedding::new(100, width, DType::F32),
            layers,
            norm: norm(),
            lm_head: Some(Linear::new(width, 100, DType::F32, false)),
            embedding_scale: gemma.then_some(5.0),
        };
        let ir = build_decoder_graph("t", &model, None, |batch| model.forward(batch)).unwrap();
        crate::compiler::compile(&ir).unwrap()
    }

    /// Each product's weight name and precision.
    fn precisions(program: &Program, precision: Precision) -> Vec<(String, Precision)> {
        let products = ProductPrecisions::new(program, precision);
        program
            .steps
            .iter()
            .filter_map(|step| match step.kernel {
                Kernel::Linear { weight } => Some((
                    program.graph.weights[weight].name.clone(),
                    products.of(step.output),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn fast_residual_gives_two_digits_to_the_attention_and_down_projections() {
        for (qwen, gemma) in [(false, false), (true, false), (false, true)] {
            let program = decoder(qwen, gemma);
            let products = precisions(&program, Precision::FastResidual);
            assert_eq!(products.len(), 2 * 7 + 1, "{products:?}");
            for (name, precision) in products {
                let expected = if name.starts_with("lm_head") {
                    Precision::Exact
                } else if ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]
                    .iter()
                    .any(|p| name.contains(p))
                {
                    Precision::FastResidual
                } else {
                    Precision::Fast
                };
                assert_eq!(precision, expected, "{name} (qwen {qwen}, gemma {gemma})");
            }
            for (name, precision) in precisions(&program, Precision::Fast) {
                let expected = if name.starts_with("lm_head") {
                    Precision::Exact
                } else {
                    Precision::Fast
                };
                assert_eq!(precision, expected, "{name} in fast mode");
            }
        }
    }
}
