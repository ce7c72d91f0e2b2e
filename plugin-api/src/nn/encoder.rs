//! BERT-style encoders (since 1.4): summed word, position and token-type
//! embeddings, then post-norm layers of bidirectional attention and a plain
//! MLP. BERT, RoBERTa, MiniLM, BGE and E5 share this layout; the modules take
//! Hugging Face's `BertModel` names (`embeddings.*`, `encoder.layer.N.*`).

use super::layers::{Activation, Embedding, LayerNorm, Linear};
use super::module::{Layer, Module, Registry};
use crate::graph::{ops, DType, EncoderBatch, SequenceAttentionSpec, TensorValue};

/// The shape of an encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Model width.
    pub hidden_size: u64,
    /// Layers.
    pub num_layers: u64,
    /// Attention heads.
    pub num_heads: u64,
    /// Width of the MLP.
    pub intermediate_size: u64,
    /// Learned absolute positions.
    pub max_positions: u64,
    /// Token types (segments); 0 for none.
    pub type_vocab_size: u64,
    /// LayerNorm epsilon.
    pub eps: f32,
    /// The MLP's activation.
    pub activation: Activation,
    /// Weight type.
    pub dtype: DType,
}

/// The input embeddings: `LayerNorm(word + position + token_type)`.
/// Sub-modules: `word_embeddings`, `position_embeddings`,
/// `token_type_embeddings`, `LayerNorm`.
pub struct EncoderEmbeddings {
    /// Token embeddings.
    pub word_embeddings: Embedding,
    /// Learned absolute position embeddings.
    pub position_embeddings: Embedding,
    /// Segment embeddings, when the model has token types.
    pub token_type_embeddings: Option<Embedding>,
    /// The norm over their sum.
    pub layer_norm: LayerNorm,
}

impl EncoderEmbeddings {
    /// The embeddings of `config`.
    pub fn new(c: &EncoderConfig) -> Self {
        Self {
            word_embeddings: Embedding::new(c.vocab_size, c.hidden_size, c.dtype),
            position_embeddings: Embedding::new(c.max_positions, c.hidden_size, c.dtype),
            token_type_embeddings: (c.type_vocab_size > 0)
                .then(|| Embedding::new(c.type_vocab_size, c.hidden_size, c.dtype)),
            layer_norm: LayerNorm::new(c.hidden_size, c.dtype, c.eps, true),
        }
    }

    /// The embedded batch `[T, hidden]`.
    pub fn forward(&self, batch: &EncoderBatch) -> TensorValue {
        let mut h = &self.word_embeddings.forward(&batch.tokens)
            + &self.position_embeddings.forward(&batch.positions);
        if let Some(types) = &self.token_type_embeddings {
            h = &h + &types.forward(&batch.token_types);
        }
        self.layer_norm.forward(&h)
    }
}

impl Module for EncoderEmbeddings {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("word_embeddings", &self.word_embeddings);
        registry.module("position_embeddings", &self.position_embeddings);
        registry.optional(
            "token_type_embeddings",
            self.token_type_embeddings
                .as_ref()
                .map(|m| m as &dyn Module),
        );
        registry.module("LayerNorm", &self.layer_norm);
    }
}

/// One post-norm encoder layer: `h = LN(x + attn(x))`, `out = LN(h +
/// mlp(h))`. Sub-modules: `attention.self.{query,key,value}`,
/// `attention.output.{dense,LayerNorm}`, `intermediate.dense`,
/// `output.{dense,LayerNorm}`.
pub struct EncoderLayer {
    /// Query projection.
    pub query: Linear,
    /// Key projection.
    pub key: Linear,
    /// Value projection.
    pub value: Linear,
    /// Attention's output projection.
    pub attention_output: Linear,
    /// The norm after attention.
    pub attention_norm: LayerNorm,
    /// The MLP's first projection.
    pub intermediate: Linear,
    /// The MLP's second projection.
    pub output: Linear,
    /// The norm after the MLP.
    pub output_norm: LayerNorm,
    num_heads: u64,
    hidden_size: u64,
    activation: Activation,
}

impl EncoderLayer {
    /// A layer of `config`.
    pub fn new(c: &EncoderConfig) -> Self {
        let linear = |i, o| Linear::new(i, o, c.dtype, true);
        let norm = || LayerNorm::new(c.hidden_size, c.dtype, c.eps, true);
        let h = c.hidden_size;
        Self {
            query: linear(h, h),
            key: linear(h, h),
            value: linear(h, h),
            attention_output: linear(h, h),
            attention_norm: norm(),
            intermediate: linear(h, c.intermediate_size),
            output: linear(c.intermediate_size, h),
            output_norm: norm(),
            num_heads: c.num_heads,
            hidden_size: c.hidden_size,
            activation: c.activation,
        }
    }

    /// The layer applied to `x [T, hidden]` of `batch`.
    pub fn forward(&self, x: &TensorValue, batch: &EncoderBatch) -> TensorValue {
        let (heads, hidden) = (self.num_heads as i64, self.hidden_size as i64);
        let head_dim = hidden / heads;
        let split = |proj: &Linear| ops::reshape(&proj.forward(x), [-1, heads, head_dim]);
        let (q, k, v) = (split(&self.query), split(&self.key), split(&self.value));
        let spec = SequenceAttentionSpec {
            scale: 1.0 / (head_dim as f32).sqrt(),
            causal: false,
        };
        let attended = ops::sequence_attention(&q, &k, &v, &batch.row_offsets, spec);
        let attended = ops::reshape(&attended, [-1, hidden]);
        let h = self
            .attention_norm
            .forward(&(x + &self.attention_output.forward(&attended)));
        let mlp = self
            .output
            .forward(&self.activation.apply(&self.intermediate.forward(&h)));
        self.output_norm.forward(&(&h + &mlp))
    }
}

impl Module for EncoderLayer {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("attention.self.query", &self.query);
        registry.module("attention.self.key", &self.key);
        registry.module("attention.self.value", &self.value);
        registry.module("attention.output.dense", &self.attention_output);
        registry.module("attention.output.LayerNorm", &self.attention_norm);
        registry.module("intermediate.dense", &self.intermediate);
        registry.module("output.dense", &self.output);
        registry.module("output.LayerNorm", &self.output_norm);
    }
}

/// A BERT-style encoder: `embeddings`, then `encoder.layer.N`. Its output
/// is the last hidden state of every token, `[T, hidden]`; pooling it into
/// one vector per text is the host's (as sentence-transformers configures).
pub struct Encoder {
    /// The input embeddings.
    pub embeddings: EncoderEmbeddings,
    /// The layers.
    pub layers: Vec<EncoderLayer>,
}

impl Encoder {
    /// The encoder of `config`.
    pub fn new(config: &EncoderConfig) -> Self {
        Self {
            embeddings: EncoderEmbeddings::new(config),
            layers: (0..config.num_layers)
                .map(|_| EncoderLayer::new(config))
                .collect(),
        }
    }

    /// The last hidden state `[T, hidden]` of `batch`.
    pub fn forward(&self, batch: &EncoderBatch) -> TensorValue {
        self.layers
            .iter()
            .fold(self.embeddings.forward(batch), |h, layer| {
                layer.forward(&h, batch)
            })
    }
}

impl Module for Encoder {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("embeddings", &self.embeddings);
        registry.list("encoder.layer", &self.layers);
    }
}
