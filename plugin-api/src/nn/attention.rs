//! Attention with rotary embeddings over the paged KV cache, transformer
//! blocks, and the decoder-only transformer.

use super::decoder::pre_norm;
use super::layers::{Embedding, Linear, Mlp, Norm, RmsNorm};
use super::module::{Layer, Module, Registry};
use super::rotary::RotaryEmbedding;
use crate::graph::{ops, AttentionSpec, DType, RaggedBatch, TensorValue};

/// The shape of an attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionConfig {
    /// Model width.
    pub hidden_size: u64,
    /// Query heads.
    pub num_heads: u64,
    /// Key/value heads (equal: MHA; fewer: GQA; one: MQA).
    pub num_kv_heads: u64,
    /// Size of one head.
    pub head_dim: u64,
    /// Biases on the q, k, v projections (Qwen2).
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// RMSNorm of queries and keys per head, with this epsilon (Qwen3, Gemma 3).
    pub qk_norm_eps: Option<f32>,
    /// Score scale; `None` is `1/sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Attend to at most this many most recent positions.
    pub sliding_window: Option<u32>,
    /// Soft cap on attention logits.
    pub softcap: Option<f32>,
    /// Weight type.
    pub dtype: DType,
}

/// Multi-head attention (MHA/GQA/MQA) with rotary embeddings, writing to and
/// reading from layer `layer`'s paged KV cache. Sub-modules: `q_proj`,
/// `k_proj`, `v_proj`, `o_proj`, and `q_norm`/`k_norm` when configured.
pub struct AttentionWithRope {
    /// Query projection.
    pub q_proj: Linear,
    /// Key projection.
    pub k_proj: Linear,
    /// Value projection.
    pub v_proj: Linear,
    /// Output projection.
    pub o_proj: Linear,
    /// Query norm: per head (`[head_dim]`), or over all query heads together
    /// (`[num_heads * head_dim]`, OLMo 2).
    pub q_norm: Option<RmsNorm>,
    /// Key norm: per head, or over all key heads together.
    pub k_norm: Option<RmsNorm>,
    /// Rotary embedding.
    pub rope: RotaryEmbedding,
    /// Shape and options.
    pub config: AttentionConfig,
    /// Which KV-cache layer.
    pub layer: u32,
}

impl AttentionWithRope {
    /// An attention layer for cache layer `layer`.
    pub fn new(config: AttentionConfig, rope: RotaryEmbedding, layer: u32) -> Self {
        let c = &config;
        let (q_dim, kv_dim) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let norm = |eps| RmsNorm::new(c.head_dim, c.dtype, eps);
        Self {
            q_proj: Linear::new(c.hidden_size, q_dim, c.dtype, c.qkv_bias),
            k_proj: Linear::new(c.hidden_size, kv_dim, c.dtype, c.qkv_bias),
            v_proj: Linear::new(c.hidden_size, kv_dim, c.dtype, c.qkv_bias),
            o_proj: Linear::new(q_dim, c.hidden_size, c.dtype, c.o_bias),
            q_norm: c.qk_norm_eps.map(norm),
            k_norm: c.qk_norm_eps.map(norm),
            rope,
            layer,
            config,
        }
    }

    /// Attention of `x [T, hidden]` for the tokens of `batch`.
    pub fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let c = &self.config;
        // A norm as wide as one head normalizes each head (Qwen3, Gemma 3);
        // one as wide as the projection normalizes all heads together (OLMo 2).
        let heads = |proj: &Linear, n: u64, norm: Option<&RmsNorm>| {
            let projected = proj.forward(x);
            let split = |t: &TensorValue| ops::reshape(t, [-1, n as i64, c.head_dim as i64]);
            match norm {
                Some(norm) if norm.weight.spec().shape == [n * c.head_dim] => {
                    split(&norm.forward(&projected))
                }
                Some(norm) => norm.forward(&split(&projected)),
                None => split(&projected),
            }
        };
        let q = heads(&self.q_proj, c.num_heads, self.q_norm.as_ref());
        let k = heads(&self.k_proj, c.num_kv_heads, self.k_norm.as_ref());
        let v = heads(&self.v_proj, c.num_kv_heads, None);
        let spec = AttentionSpec {
            layer: self.layer,
            scale: c.scale.unwrap_or(1.0 / (c.head_dim as f32).sqrt()),
            sliding_window: c.sliding_window,
            softcap: c.softcap,
        };
        let graph = x.graph();
        let path = self.q_proj.weight.module_path();
        let _scope = graph.scope(path.rsplit_once('.').map_or("", |(parent, _)| parent));
        self.o_proj
            .forward(&rotary_attention(&q, &k, &v, batch, &self.rope, spec))
    }
}

/// The part every rotary attention shares, whatever its projections (since
/// 1.5): rotates `q [T, heads, D]` and `k [T, kv_heads, D]`, writes `k` and
/// `v` to layer `spec.layer`'s paged cache and attends over it; returns the
/// heads side by side, `[T, heads·D]`, for the output projection.
pub fn rotary_attention(
    q: &TensorValue,
    k: &TensorValue,
    v: &TensorValue,
    batch: &RaggedBatch,
    rope: &RotaryEmbedding,
    spec: AttentionSpec,
) -> TensorValue {
    let q = rope.forward(q, &batch.positions);
    let k = rope.forward(k, &batch.positions);
    let attended = ops::paged_attention(&q, &k, v, batch, spec);
    let width: u64 = attended.shape()[1..]
        .iter()
        .map(|d| d.as_static().unwrap_or(0))
        .product();
    ops::reshape(&attended, [-1, width as i64])
}

impl Module for AttentionWithRope {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("q_proj", &self.q_proj);
        registry.module("k_proj", &self.k_proj);
        registry.module("v_proj", &self.v_proj);
        registry.module("o_proj", &self.o_proj);
        registry.optional("q_norm", self.q_norm.as_ref().map(|m| m as &dyn Module));
        registry.optional("k_norm", self.k_norm.as_ref().map(|m| m as &dyn Module));
    }
}

/// A pre-norm transformer block with optional post-norms (Gemma):
/// `h = x + post_attn(attn(input_norm(x)))`, `out = h + post_mlp(mlp(pre_mlp(h)))`.
/// Sub-modules follow Hugging Face names: `input_layernorm`, `self_attn`,
/// `post_attention_layernorm` (the pre-MLP norm in Llama), `mlp`, and for
/// post-norm models `pre_feedforward_layernorm` / `post_feedforward_layernorm`.
pub struct TransformerBlock {
    /// Norm before attention.
    pub input_layernorm: Norm,
    /// Attention.
    pub self_attn: AttentionWithRope,
    /// In pre-norm models the norm before the MLP; with post-norms, the norm
    /// after attention.
    pub post_attention_layernorm: Norm,
    /// With post-norms: the norm before the MLP.
    pub pre_feedforward_layernorm: Option<Norm>,
    /// With post-norms: the norm after the MLP.
    pub post_feedforward_layernorm: Option<Norm>,
    /// Feed-forward block.
    pub mlp: Mlp,
}

impl TransformerBlock {
    /// The block applied to `x [T, hidden]`.
    pub fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        self.forward_with(x, batch, &self.mlp)
    }

    /// The block's wiring with `feed_forward` in place of its MLP (since
    /// 1.3; a mixture of experts, see [`super::MoeBlock`]).
    pub fn forward_with(
        &self,
        x: &TensorValue,
        batch: &RaggedBatch,
        feed_forward: &dyn Layer,
    ) -> TensorValue {
        let Some(pre) = &self.pre_feedforward_layernorm else {
            return pre_norm(
                x,
                batch,
                (&self.input_layernorm, &self.self_attn),
                (&self.post_attention_layernorm, feed_forward),
            );
        };
        let attended = self
            .self_attn
            .forward(&self.input_layernorm.forward(x), batch);
        let h = x + &self.post_attention_layernorm.forward(&attended);
        let out = feed_forward.forward(&pre.forward(&h));
        let out = match &self.post_feedforward_layernorm {
            Some(post) => post.forward(&out),
            None => out,
        };
        &h + &out
    }
}

impl Module for TransformerBlock {
    fn visit(&self, registry: &mut Registry<'_>) {
        self.visit_with(registry, &self.mlp);
    }
}

impl TransformerBlock {
    /// Registers the block's modules with `feed_forward` as its `mlp`.
    pub(super) fn visit_with(&self, registry: &mut Registry<'_>, feed_forward: &dyn Module) {
        registry.module("input_layernorm", &self.input_layernorm);
        registry.module("self_attn", &self.self_attn);
        registry.module("post_attention_layernorm", &self.post_attention_layernorm);
        registry.optional(
            "pre_feedforward_layernorm",
            self.pre_feedforward_layernorm
                .as_ref()
                .map(|m| m as &dyn Module),
        );
        registry.optional(
            "post_feedforward_layernorm",
            self.post_feedforward_layernorm
                .as_ref()
                .map(|m| m as &dyn Module),
        );
        registry.module("mlp", feed_forward);
    }
}

/// A decoder-only transformer: embeddings, blocks, final norm and LM head
/// (tied to the embeddings when `lm_head` is `None`). Sub-modules:
/// `embed_tokens`, `layers.N`, `norm`, `lm_head`.
pub struct Transformer {
    /// Token embeddings.
    pub embed_tokens: Embedding,
    /// The blocks.
    pub layers: Vec<TransformerBlock>,
    /// Final norm.
    pub norm: Norm,
    /// Output projection; `None` reuses the embeddings.
    pub lm_head: Option<Linear>,
    /// Multiplies the embeddings (Gemma: `sqrt(hidden)`).
    pub embedding_scale: Option<f32>,
}

impl Transformer {
    /// Logits `[R, vocab]` for the rows `batch.logit_rows` (usually each
    /// sequence's last token).
    pub fn forward(&self, batch: &RaggedBatch) -> TensorValue {
        logits(
            &final_states(&self.last_layer(batch), batch, &self.norm),
            self.lm_head.as_ref(),
            &self.embed_tokens,
        )
    }

    /// The final hidden states `[R, hidden]` (after the final norm) of the
    /// rows `batch.logit_rows`, where [`Transformer::forward`] applies the LM
    /// head (since 1.8: an embedding model's output, with no `lm_head`).
    pub fn hidden_states(&self, batch: &RaggedBatch) -> TensorValue {
        final_states(&self.last_layer(batch), batch, &self.norm)
    }

    /// The residual stream after the last layer, `[T, hidden]`.
    fn last_layer(&self, batch: &RaggedBatch) -> TensorValue {
        let mut h = embed(&self.embed_tokens, self.embedding_scale, batch);
        for layer in &self.layers {
            h = layer.forward(&h, batch);
        }
        h
    }
}

/// The token embeddings of `batch`, times `scale` if any (the decoder's
/// first step, shared with [`super::Decoder`]).
pub(super) fn embed(
    embed_tokens: &Embedding,
    scale: Option<f32>,
    batch: &RaggedBatch,
) -> TensorValue {
    let h = embed_tokens.forward(&batch.tokens);
    match scale {
        Some(scale) => &h * f64::from(scale),
        None => h,
    }
}

/// The rows `batch.logit_rows` of the last layer's output `h`, after the
/// final norm.
pub(super) fn final_states(h: &TensorValue, batch: &RaggedBatch, norm: &Norm) -> TensorValue {
    ops::gather(&norm.forward(h), &batch.logit_rows, 0)
}

/// The logits of the [`final_states`] `last`: `lm_head` or the tied
/// embeddings.
pub(super) fn logits(
    last: &TensorValue,
    lm_head: Option<&Linear>,
    embed_tokens: &Embedding,
) -> TensorValue {
    match lm_head {
        Some(head) => head.forward(last),
        None => {
            let graph = last.graph();
            let _scope = graph.scope("lm_head");
            ops::matmul(
                last,
                &ops::transpose(&embed_tokens.weight.value(graph), 0, 1),
            )
        }
    }
}

impl Module for Transformer {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("embed_tokens", &self.embed_tokens);
        registry.list("layers", &self.layers);
        registry.module("norm", &self.norm);
        registry.optional("lm_head", self.lm_head.as_ref().map(|m| m as &dyn Module));
    }
}
