//! The decoder as pieces a variant replaces one at a time (MAX's way, since
//! 1.2): a family builds its default [`Transformer`], turns it into a
//! [`Decoder`], and swaps what differs (a layer's wiring, its attention or
//! MLP, a norm, the head's scaling) while everything else stays the
//! family's. Nothing here copies a forward pass: each piece has one.

use super::attention::{
    embed, final_states, logits, AttentionWithRope, Transformer, TransformerBlock,
};
use super::layers::{Embedding, Linear, Mlp, Norm};
use super::module::{Layer, Module, Registry};
use crate::graph::{RaggedBatch, TensorValue};

/// One decoder layer: maps the residual stream `x [T, hidden]` to the next
/// layer's. [`TransformerBlock`] is the pre-norm wiring; a variant with
/// another wiring (post-norms, scaled or parallel residuals) implements this
/// over the library's attention, MLP and norm pieces.
pub trait DecoderLayer: Module {
    /// The layer applied to `x` for the tokens of `batch`.
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue;
}

impl DecoderLayer for TransformerBlock {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        TransformerBlock::forward(self, x, batch)
    }
}

/// A decoder-only model made of replaceable pieces: embeddings (optionally
/// scaled), layers of any wiring, the final norm, and the LM head (tied to
/// the embeddings when `lm_head` is `None`) with an optional scale of its
/// logits. Weight names are [`Transformer`]'s: `embed_tokens`, `layers.N`,
/// `norm`, `lm_head`. Built with [`Decoder::from_blocks`] from a family's
/// transformer; new pieces arrive as new fields, so it is never built field
/// by field.
#[non_exhaustive]
pub struct Decoder {
    /// Token embeddings.
    pub embed_tokens: Embedding,
    /// Multiplies the embeddings (Gemma: `sqrt(hidden)`; Granite:
    /// `embedding_multiplier`).
    pub embedding_scale: Option<f32>,
    /// The layers, in order.
    pub layers: Vec<Box<dyn DecoderLayer>>,
    /// Final norm.
    pub norm: Norm,
    /// Output projection; `None` reuses the embeddings.
    pub lm_head: Option<Linear>,
    /// Multiplies the logits (Granite: `1 / logits_scaling`).
    pub logit_scale: Option<f32>,
}

impl Decoder {
    /// The family's `model` with each layer rewired: `rewire` receives layer
    /// `i`'s block by value (its attention, MLP and norms) and returns the
    /// layer to run, e.g. the same pieces with post-norms.
    pub fn from_blocks(
        model: Transformer,
        mut rewire: impl FnMut(usize, TransformerBlock) -> Box<dyn DecoderLayer>,
    ) -> Self {
        let Transformer {
            embed_tokens,
            layers,
            norm,
            lm_head,
            embedding_scale,
        } = model;
        Self {
            embed_tokens,
            embedding_scale,
            layers: layers
                .into_iter()
                .enumerate()
                .map(|(i, block)| rewire(i, block))
                .collect(),
            norm,
            lm_head,
            logit_scale: None,
        }
    }

    /// Logits `[R, vocab]` for the rows `batch.logit_rows`.
    pub fn forward(&self, batch: &RaggedBatch) -> TensorValue {
        let last = self.hidden_states(batch);
        let logits = logits(&last, self.lm_head.as_ref(), &self.embed_tokens);
        match self.logit_scale {
            Some(scale) => {
                let _scope = last.graph().scope("lm_head");
                &logits * f64::from(scale)
            }
            None => logits,
        }
    }

    /// The final hidden states `[R, hidden]` (after the final norm) of the
    /// rows `batch.logit_rows`, where [`Decoder::forward`] applies the LM
    /// head (since 1.8).
    pub fn hidden_states(&self, batch: &RaggedBatch) -> TensorValue {
        let mut h = embed(&self.embed_tokens, self.embedding_scale, batch);
        for layer in &self.layers {
            h = layer.forward(&h, batch);
        }
        final_states(&h, batch, &self.norm)
    }
}

/// A decoder's final hidden states `[R, hidden]` (after the final norm) at
/// the rows `batch.logit_rows` (since 1.8): what an embedding model pools and
/// a [`DecoderClassifier`] scores.
pub trait HiddenStates: Module {
    /// The states, where the LM head would apply.
    fn hidden_states(&self, batch: &RaggedBatch) -> TensorValue;
}

impl HiddenStates for Decoder {
    fn hidden_states(&self, batch: &RaggedBatch) -> TensorValue {
        Decoder::hidden_states(self, batch)
    }
}

impl HiddenStates for Transformer {
    fn hidden_states(&self, batch: &RaggedBatch) -> TensorValue {
        Transformer::hidden_states(self, batch)
    }
}

/// A decoder with transformers' `…ForSequenceClassification` head (since
/// 1.8): a linear `score` without bias on each sequence's last token's
/// final hidden state (rerankers such as Qwen3-Reranker converted to a
/// classifier, reward models). Sub-modules: the decoder's (with no LM head),
/// and `score`.
pub struct DecoderClassifier<D> {
    /// The decoder.
    pub decoder: D,
    /// The head: `hidden → num_labels`.
    pub score: Linear,
}

impl<D: HiddenStates> DecoderClassifier<D> {
    /// The class logits `[R, num_labels]` of the rows `batch.logit_rows`.
    pub fn forward(&self, batch: &RaggedBatch) -> TensorValue {
        self.score.forward(&self.decoder.hidden_states(batch))
    }
}

impl<D: Module> Module for DecoderClassifier<D> {
    fn visit(&self, registry: &mut Registry<'_>) {
        self.decoder.visit(registry);
        registry.module("score", &self.score);
    }
}

impl Module for Decoder {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("embed_tokens", &self.embed_tokens);
        registry.list("layers", &self.layers);
        registry.module("norm", &self.norm);
        registry.optional("lm_head", self.lm_head.as_ref().map(|m| m as &dyn Module));
    }
}

impl Module for Box<dyn DecoderLayer> {
    fn visit(&self, registry: &mut Registry<'_>) {
        self.as_ref().visit(registry);
    }
}

/// Attention and the MLP side by side on one norm, both added to the
/// residual: `out = x + attn(norm(x)) + mlp(norm(x))` (Phi-2, GPT-J).
/// Sub-modules: `input_layernorm`, `self_attn`, `mlp`.
#[non_exhaustive]
pub struct ParallelBlock {
    /// Norm before attention and the MLP.
    pub input_layernorm: Norm,
    /// Attention.
    pub self_attn: AttentionWithRope,
    /// Feed-forward block.
    pub mlp: Mlp,
}

impl ParallelBlock {
    /// A parallel block.
    pub fn new(input_layernorm: Norm, self_attn: AttentionWithRope, mlp: Mlp) -> Self {
        Self {
            input_layernorm,
            self_attn,
            mlp,
        }
    }
}

impl Module for ParallelBlock {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("input_layernorm", &self.input_layernorm);
        registry.module("self_attn", &self.self_attn);
        registry.module("mlp", &self.mlp);
    }
}

impl DecoderLayer for ParallelBlock {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let normed = self.input_layernorm.forward(x);
        let attended = self.self_attn.forward(&normed, batch);
        &(x + &attended) + &self.mlp.forward(&normed)
    }
}

/// Self-attention as a decoder layer calls it (since 1.5): `x [T, hidden]`
/// to `[T, hidden]` over the paged KV cache. [`AttentionWithRope`] is one;
/// a family with other projections (fused, latent) implements it and reuses
/// the layer wirings here.
pub trait SelfAttention: Module {
    /// Attention of `x` for the tokens of `batch`.
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue;
}

impl SelfAttention for AttentionWithRope {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        AttentionWithRope::forward(self, x, batch)
    }
}

/// The pre-norm wiring: `h = x + attn(norm1(x))`, `out = h + ff(norm2(h))`.
pub(super) fn pre_norm(
    x: &TensorValue,
    batch: &RaggedBatch,
    (input_norm, attention): (&Norm, &dyn SelfAttention),
    (mlp_norm, feed_forward): (&Norm, &dyn Layer),
) -> TensorValue {
    let h = x + &attention.forward(&input_norm.forward(x), batch);
    &h + &feed_forward.forward(&mlp_norm.forward(&h))
}

/// A pre-norm layer over any attention and any feed-forward layer (since
/// 1.5): Llama's wiring for a family whose attention or MLP is not
/// [`TransformerBlock`]'s (multi-head latent attention, a fused q/k/v
/// projection, a mixture of experts). Sub-modules: `input_layernorm`,
/// `self_attn`, `post_attention_layernorm`, `mlp`.
#[non_exhaustive]
pub struct PreNormBlock {
    /// Norm before attention.
    pub input_layernorm: Norm,
    /// Attention.
    pub self_attn: Box<dyn SelfAttention>,
    /// Norm before the feed-forward layer.
    pub post_attention_layernorm: Norm,
    /// Feed-forward layer.
    pub mlp: Box<dyn Layer>,
}

impl PreNormBlock {
    /// A pre-norm layer.
    pub fn new(
        input_layernorm: Norm,
        self_attn: Box<dyn SelfAttention>,
        post_attention_layernorm: Norm,
        mlp: Box<dyn Layer>,
    ) -> Self {
        Self {
            input_layernorm,
            self_attn,
            post_attention_layernorm,
            mlp,
        }
    }
}

impl Module for PreNormBlock {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("input_layernorm", &self.input_layernorm);
        registry.module("self_attn", self.self_attn.as_ref());
        registry.module("post_attention_layernorm", &self.post_attention_layernorm);
        registry.module("mlp", self.mlp.as_ref());
    }
}

impl DecoderLayer for PreNormBlock {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        pre_norm(
            x,
            batch,
            (&self.input_layernorm, self.self_attn.as_ref()),
            (&self.post_attention_layernorm, self.mlp.as_ref()),
        )
    }
}
