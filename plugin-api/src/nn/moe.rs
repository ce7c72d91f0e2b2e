//! Mixture-of-experts feed-forward layers (since 1.3): a router, gated
//! expert MLPs computed only for the tokens routed to them (one
//! [`ops::mixture_of_experts`] node), and optional shared experts.

use super::attention::TransformerBlock;
use super::decoder::DecoderLayer;
use super::layers::{Activation, Linear, Mlp};
use super::module::{Layer, Module, Registry, Weight};
use crate::graph::{ops, DType, MoeRouting, MoeSpec, RaggedBatch, TensorValue, UnaryOp};

impl Activation {
    /// The element-wise op computing this activation.
    pub fn unary_op(self) -> UnaryOp {
        match self {
            Activation::Silu => UnaryOp::Silu,
            Activation::Gelu => UnaryOp::Gelu,
            Activation::GeluTanh => UnaryOp::GeluTanh,
            Activation::Relu => UnaryOp::Relu,
        }
    }
}

impl MoeSpec {
    /// Softmax routing to `top_k` of `num_experts` SiLU-gated experts
    /// (Mixtral renormalizes the picked weights; Qwen-MoE as configured).
    pub fn softmax(num_experts: u32, top_k: u32, renormalize: bool) -> Self {
        Self {
            num_experts,
            top_k,
            routing: MoeRouting::Softmax,
            renormalize,
            scale: 1.0,
            activation: UnaryOp::Silu,
        }
    }
}

/// A mixture of experts: `gate` (the router, `[E, hidden]`) scores the
/// experts, each token runs through its `top_k` experts, and their outputs
/// are summed with the routing weights; a shared expert (optionally scaled
/// by `sigmoid(shared_expert_gate(x))`, Qwen2-MoE) is added for every
/// token. Sub-modules follow Hugging Face's Qwen-MoE names: `gate`,
/// `experts.N.{gate,up,down}_proj`, `shared_expert`, `shared_expert_gate`,
/// and the weight `e_score_correction_bias` with a biased sigmoid router.
#[non_exhaustive]
pub struct MixtureOfExperts {
    /// The router.
    pub gate: Linear,
    /// The routed experts (gated MLPs without biases).
    pub experts: Vec<Mlp>,
    /// An expert every token runs through.
    pub shared_expert: Option<Mlp>,
    /// Scales the shared expert by `sigmoid(shared_expert_gate(x))`.
    pub shared_expert_gate: Option<Linear>,
    /// Added to the scores when picking experts (DeepSeek-V3), `[E]`.
    pub correction_bias: Option<Weight>,
    /// Routing and activation.
    pub spec: MoeSpec,
}

impl MixtureOfExperts {
    /// `spec.num_experts` gated experts of width `intermediate` over
    /// `hidden`, with the router `spec` describes (and a correction bias
    /// weight if its routing has one).
    pub fn new(hidden: u64, intermediate: u64, dtype: DType, spec: MoeSpec) -> Self {
        // Type inference refuses an op no activation computes.
        let activation = [
            Activation::Silu,
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Relu,
        ]
        .into_iter()
        .find(|a| a.unary_op() == spec.activation)
        .unwrap_or(Activation::Silu);
        let experts = u64::from(spec.num_experts);
        let has_bias = matches!(
            spec.routing,
            MoeRouting::Sigmoid {
                correction_bias: true,
                ..
            }
        );
        Self {
            gate: Linear::new(hidden, experts, dtype, false),
            experts: (0..experts)
                .map(|_| Mlp::gated(hidden, intermediate, dtype, activation))
                .collect(),
            shared_expert: None,
            shared_expert_gate: None,
            correction_bias: has_bias
                .then(|| Weight::new("e_score_correction_bias", DType::F32, &[experts])),
            spec,
        }
    }

    /// Adds a shared expert of width `intermediate`, scaled by a learned
    /// sigmoid gate when `gated`.
    pub fn with_shared_expert(mut self, intermediate: u64, gated: bool) -> Self {
        let gate = &self.gate.weight.spec();
        let (hidden, dtype) = (gate.shape[1], gate.dtype);
        let activation = self
            .experts
            .first()
            .map_or(Activation::Silu, |e| e.activation);
        self.shared_expert = Some(Mlp::gated(hidden, intermediate, dtype, activation));
        self.shared_expert_gate = gated.then(|| Linear::new(hidden, 1, dtype, false));
        self
    }
}

impl Module for MixtureOfExperts {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("gate", &self.gate);
        registry.list("experts", &self.experts);
        registry.optional(
            "shared_expert",
            self.shared_expert.as_ref().map(|m| m as &dyn Module),
        );
        registry.optional(
            "shared_expert_gate",
            self.shared_expert_gate.as_ref().map(|m| m as &dyn Module),
        );
        if let Some(bias) = &self.correction_bias {
            registry.weight("e_score_correction_bias", bias);
        }
    }
}

impl Layer for MixtureOfExperts {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        let graph = x.graph();
        let logits = self.gate.forward(x);
        let routed = {
            let path = self.gate.weight.module_path();
            let _scope = graph.scope(path.rsplit_once('.').map_or("", |(parent, _)| parent));
            let weights = |pick: fn(&Mlp) -> &Linear| -> Vec<TensorValue> {
                self.experts
                    .iter()
                    .map(|e| pick(e).weight.value(graph))
                    .collect()
            };
            let gate = weights(|e| e.gate_proj.as_ref().expect("experts are gated"));
            let (up, down) = (weights(|e| &e.up_proj), weights(|e| &e.down_proj));
            let bias = self.correction_bias.as_ref().map(|b| b.value(graph));
            ops::mixture_of_experts(
                x,
                &logits,
                bias.as_ref(),
                ops::ExpertWeights {
                    gate: &gate,
                    up: &up,
                    down: &down,
                },
                self.spec.clone(),
            )
        };
        let Some(shared) = &self.shared_expert else {
            return routed;
        };
        let out = shared.forward(x);
        let out = match &self.shared_expert_gate {
            Some(gate) => &ops::sigmoid(&gate.forward(x)) * &out,
            None => out,
        };
        &routed + &out
    }
}

/// A transformer block whose MLP is a mixture of experts: the block's
/// norms, attention and wiring, with `moe` in place of the block's `mlp`
/// (which is not used). Sub-modules are the block's, `mlp` being the mixture.
#[non_exhaustive]
pub struct MoeBlock {
    /// The block (its `mlp` unused).
    pub block: TransformerBlock,
    /// The feed-forward layer.
    pub moe: MixtureOfExperts,
}

impl MoeBlock {
    /// `block` with its MLP replaced by `moe`.
    pub fn new(block: TransformerBlock, moe: MixtureOfExperts) -> Self {
        Self { block, moe }
    }
}

impl Module for MoeBlock {
    fn visit(&self, registry: &mut Registry<'_>) {
        self.block.visit_with(registry, &self.moe);
    }
}

impl DecoderLayer for MoeBlock {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        self.block.forward_with(x, batch, &self.moe)
    }
}
