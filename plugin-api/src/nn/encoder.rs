//! BERT-style encoders (since 1.4): summed word, position and token-type
//! embeddings, then post-norm layers of bidirectional attention and a plain
//! MLP. BERT, RoBERTa, MiniLM, BGE and E5 share this layout; the modules take
//! Hugging Face's `BertModel` names (`embeddings.*`, `encoder.layer.N.*`).

use super::layers::{Activation, Embedding, LayerNorm, Linear};
use super::module::{Layer, Module, Registry};
use crate::graph::{ops, ClassifierBatch, DType, EncoderBatch, SequenceAttentionSpec, TensorValue};

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

/// A sequence classifier's head (since 1.7): `out_proj(tanh(dense(x)))` on
/// each sequence's first token. BERT's pooler and classifier and RoBERTa's
/// `classifier` are both this. Sub-modules: `dense`, `out_proj`.
pub struct ClassificationHead {
    /// The first projection (BERT's `pooler.dense`), before the tanh.
    pub dense: Linear,
    /// The projection to the class logits.
    pub out_proj: Linear,
}

impl ClassificationHead {
    /// A head from `hidden_size` to `num_labels`.
    pub fn new(hidden_size: u64, num_labels: u64, dtype: DType) -> Self {
        Self {
            dense: Linear::new(hidden_size, hidden_size, dtype, true),
            out_proj: Linear::new(hidden_size, num_labels, dtype, true),
        }
    }

    /// The class logits `[B, num_labels]` of `hidden [T, hidden]`, read at
    /// `first_rows [B]`.
    pub fn forward(&self, hidden: &TensorValue, first_rows: &TensorValue) -> TensorValue {
        let first = ops::gather(hidden, first_rows, 0);
        self.out_proj
            .forward(&ops::tanh(&self.dense.forward(&first)))
    }
}

impl Module for ClassificationHead {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("dense", &self.dense);
        registry.module("out_proj", &self.out_proj);
    }
}

/// A BERT-style encoder with a [`ClassificationHead`] (since 1.7): cross-
/// encoder rerankers and text classifiers. The encoder keeps its names; the
/// head is `classifier` (RoBERTa's `classifier.dense` / `.out_proj`).
pub struct SequenceClassifier {
    /// The encoder.
    pub encoder: Encoder,
    /// The head.
    pub head: ClassificationHead,
}

impl SequenceClassifier {
    /// The classifier of `config` into `num_labels` classes.
    pub fn new(config: &EncoderConfig, num_labels: u64) -> Self {
        Self {
            encoder: Encoder::new(config),
            head: ClassificationHead::new(config.hidden_size, num_labels, config.dtype),
        }
    }

    /// The class logits `[B, num_labels]` of `batch`.
    pub fn forward(&self, batch: &ClassifierBatch) -> TensorValue {
        self.head
            .forward(&self.encoder.forward(&batch.encoder), &batch.first_rows)
    }
}

impl Module for SequenceClassifier {
    fn visit(&self, registry: &mut Registry<'_>) {
        self.encoder.visit(registry);
        registry.module("classifier", &self.head);
    }
}
