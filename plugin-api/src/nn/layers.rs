//! Basic layers: Linear, Embedding, RMSNorm, LayerNorm and MLP.

use serde::{Deserialize, Serialize};

use super::module::{Layer, Module, Registry, Weight};
use crate::graph::{ops, DType, TensorValue};

/// `y = x Wᵀ (+ b)` with `W [out, in]` (the PyTorch layout); no bias unless asked.
pub struct Linear {
    /// `[out_dim, in_dim]`; may be quantized.
    pub weight: Weight,
    /// `[out_dim]`.
    pub bias: Option<Weight>,
}

impl Linear {
    /// A linear layer of `dtype`.
    pub fn new(in_dim: u64, out_dim: u64, dtype: DType, has_bias: bool) -> Self {
        Self {
            weight: Weight::new("weight", dtype, &[out_dim, in_dim]).quantizable(),
            bias: has_bias.then(|| Weight::new("bias", dtype, &[out_dim])),
        }
    }
}

impl Module for Linear {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.weight("weight", &self.weight);
        if let Some(bias) = &self.bias {
            registry.weight("bias", bias);
        }
    }
}

impl Layer for Linear {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        let graph = x.graph();
        let _scope = graph.scope(self.weight.module_path());
        let y = ops::matmul(x, &ops::transpose(&self.weight.value(graph), 0, 1));
        match &self.bias {
            Some(bias) => &y + &bias.value(graph),
            None => y,
        }
    }
}

/// Token embedding: rows of `weight [vocab, dim]` picked by id.
pub struct Embedding {
    /// `[vocab_size, dim]`; may be quantized.
    pub weight: Weight,
}

impl Embedding {
    /// An embedding table of `dtype`.
    pub fn new(vocab_size: u64, dim: u64, dtype: DType) -> Self {
        Self {
            weight: Weight::new("weight", dtype, &[vocab_size, dim]).quantizable(),
        }
    }

    /// The rows for `ids` (any shape of integers): `ids.shape + [dim]`.
    pub fn forward(&self, ids: &TensorValue) -> TensorValue {
        let graph = ids.graph();
        let _scope = graph.scope(self.weight.module_path());
        ops::gather(&self.weight.value(graph), ids, 0)
    }
}

impl Module for Embedding {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.weight("weight", &self.weight);
    }
}

/// RMS normalization over the last axis, `x / rms(x) * (offset + w)`;
/// `weight_offset = 1` gives Gemma's `(1 + w)` form.
pub struct RmsNorm {
    /// `[dim]`.
    pub weight: Weight,
    /// Variance epsilon.
    pub eps: f32,
    /// Added to the weight.
    pub weight_offset: f32,
}

impl RmsNorm {
    /// An RMSNorm of `dim` with the plain `w` form.
    pub fn new(dim: u64, dtype: DType, eps: f32) -> Self {
        Self {
            weight: Weight::new("weight", dtype, &[dim]),
            eps,
            weight_offset: 0.0,
        }
    }

    /// Uses `(offset + w)` instead of `w` (Gemma: 1).
    pub fn with_weight_offset(mut self, offset: f32) -> Self {
        self.weight_offset = offset;
        self
    }
}

impl Module for RmsNorm {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.weight("weight", &self.weight);
    }
}

impl Layer for RmsNorm {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        let graph = x.graph();
        let _scope = graph.scope(self.weight.module_path());
        ops::rms_norm(x, &self.weight.value(graph), self.eps, self.weight_offset)
    }
}

/// Layer normalization over the last axis, with a learned scale and
/// (optionally) a learned shift.
pub struct LayerNorm {
    /// Scale `[dim]`.
    pub weight: Weight,
    /// Shift `[dim]`.
    pub bias: Option<Weight>,
    /// Variance epsilon.
    pub eps: f32,
}

impl LayerNorm {
    /// A LayerNorm of `dim`.
    pub fn new(dim: u64, dtype: DType, eps: f32, has_bias: bool) -> Self {
        Self {
            weight: Weight::new("weight", dtype, &[dim]),
            bias: has_bias.then(|| Weight::new("bias", dtype, &[dim])),
            eps,
        }
    }
}

impl Module for LayerNorm {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.weight("weight", &self.weight);
        if let Some(bias) = &self.bias {
            registry.weight("bias", bias);
        }
    }
}

impl Layer for LayerNorm {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        let graph = x.graph();
        let _scope = graph.scope(self.weight.module_path());
        let gamma = self.weight.value(graph);
        let beta = match &self.bias {
            Some(bias) => bias.value(graph),
            None => ops::broadcast_to(&graph.scalar(0.0, gamma.dtype()), gamma.shape().to_vec()),
        };
        ops::layer_norm(x, &gamma, &beta, self.eps)
    }
}

/// A normalization layer of either kind.
pub enum Norm {
    /// RMSNorm.
    Rms(RmsNorm),
    /// LayerNorm.
    Layer(LayerNorm),
}

impl Module for Norm {
    fn visit(&self, registry: &mut Registry<'_>) {
        match self {
            Norm::Rms(norm) => norm.visit(registry),
            Norm::Layer(norm) => norm.visit(registry),
        }
    }
}

impl Layer for Norm {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        match self {
            Norm::Rms(norm) => norm.forward(x),
            Norm::Layer(norm) => norm.forward(x),
        }
    }
}

/// Activation functions of MLPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SiLU (Llama, Qwen, Mistral).
    Silu,
    /// Exact GELU.
    Gelu,
    /// Tanh-approximated GELU (Gemma, GPT-2's `gelu_new`).
    GeluTanh,
    /// ReLU.
    Relu,
}

impl Activation {
    /// The activation a Hugging Face config names (`hidden_act`,
    /// `activation_function`): `silu`, `gelu`, `gelu_pytorch_tanh` or
    /// `gelu_new`, `relu`; `None` for any other name.
    pub fn from_hf_name(name: &str) -> Option<Self> {
        Some(match name {
            "silu" => Activation::Silu,
            "gelu" => Activation::Gelu,
            "gelu_pytorch_tanh" | "gelu_new" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            _ => return None,
        })
    }

    /// Applies the activation.
    pub fn apply(self, x: &TensorValue) -> TensorValue {
        match self {
            Activation::Silu => ops::silu(x),
            Activation::Gelu => ops::gelu(x),
            Activation::GeluTanh => ops::gelu_tanh(x),
            Activation::Relu => ops::relu(x),
        }
    }
}

/// Feed-forward block. Gated: `down(act(gate(x)) * up(x))`; plain:
/// `down(act(up(x)))`. Sub-modules are named `gate_proj`, `up_proj`, `down_proj`.
pub struct Mlp {
    /// The gate projection (gated MLPs only).
    pub gate_proj: Option<Linear>,
    /// The up projection.
    pub up_proj: Linear,
    /// The down projection.
    pub down_proj: Linear,
    /// The activation.
    pub activation: Activation,
}

impl Mlp {
    /// A gated MLP (SwiGLU/GeGLU) without biases.
    pub fn gated(dim: u64, hidden: u64, dtype: DType, activation: Activation) -> Self {
        Self {
            gate_proj: Some(Linear::new(dim, hidden, dtype, false)),
            up_proj: Linear::new(dim, hidden, dtype, false),
            down_proj: Linear::new(hidden, dim, dtype, false),
            activation,
        }
    }

    /// A plain two-layer MLP, optionally with biases.
    pub fn plain(
        dim: u64,
        hidden: u64,
        dtype: DType,
        activation: Activation,
        has_bias: bool,
    ) -> Self {
        Self {
            gate_proj: None,
            up_proj: Linear::new(dim, hidden, dtype, has_bias),
            down_proj: Linear::new(hidden, dim, dtype, has_bias),
            activation,
        }
    }
}

impl Module for Mlp {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.optional(
            "gate_proj",
            self.gate_proj.as_ref().map(|m| m as &dyn Module),
        );
        registry.module("up_proj", &self.up_proj);
        registry.module("down_proj", &self.down_proj);
    }
}

impl Layer for Mlp {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        let up = self.up_proj.forward(x);
        let hidden = match &self.gate_proj {
            Some(gate) => &self.activation.apply(&gate.forward(x)) * &up,
            None => self.activation.apply(&up),
        };
        self.down_proj.forward(&hidden)
    }
}
