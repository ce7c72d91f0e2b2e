//! Multi-head latent attention (since 1.5), DeepSeek-V2/V3's attention:
//! keys and values come from one low-rank latent per token, and the KV
//! cache stores that latent rather than per-head keys and values.
//!
//! The cache holds one "head" per token: the normalized latent `c [rank]`
//! followed by the rotated key part `k_pe [rope]`, for keys and values
//! alike (the paged cache keeps both). Attention runs as multi-query
//! attention over it with the up-projection absorbed into the query and the
//! output (DeepSeek's inference form): head `h` scores
//! `(W_UK[h]ᵀ q_nope) · c + q_pe · k_pe`, the same number as
//! `q_nope · (W_UK[h] c) + q_pe · k_pe`, and its value is
//! `W_UV[h] (Σ p c)`. A token costs `rank + rope` numbers per layer
//! (576 for DeepSeek-V3, twice that with the value copy) instead of
//! `heads · (nope + rope + v)`.
//!
//! The per-head up-projections come from Hugging Face's joint `kv_b_proj`
//! or, since 1.6, from llama.cpp's split of it ([`SplitUpProjections`]).
//! Either way they are reshapes and transposes of weights alone, which the
//! host computes once when it loads the model, not at every step.

use super::decoder::SelfAttention;
use super::layers::{Linear, RmsNorm};
use super::module::{Layer, Module, Registry, Weight};
use super::rotary::RotaryEmbedding;
use crate::graph::{ops, AttentionSpec, DType, RaggedBatch, TensorValue};

/// The shape of a latent attention layer (Hugging Face's DeepSeek names).
#[derive(Clone, Debug, PartialEq)]
pub struct LatentAttentionConfig {
    /// Model width.
    pub hidden_size: u64,
    /// Query heads.
    pub num_heads: u64,
    /// Rank of the query projection (`q_a_proj` → `q_b_proj`); `None`
    /// projects queries in one matrix (`q_proj`).
    pub q_lora_rank: Option<u64>,
    /// Rank of the key/value latent.
    pub kv_lora_rank: u64,
    /// Per-head query/key dimensions without rotary.
    pub qk_nope_head_dim: u64,
    /// Per-head query/key dimensions with rotary (shared by all key heads).
    pub qk_rope_head_dim: u64,
    /// Per-head value dimensions.
    pub v_head_dim: u64,
    /// Score scale.
    pub scale: f32,
    /// Epsilon of the latent norms.
    pub norm_eps: f32,
    /// Biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`.
    pub bias: bool,
    /// Weight type.
    pub dtype: DType,
}

impl LatentAttentionConfig {
    /// What one cache "head" holds: the latent and the rotated key part.
    pub fn cache_head_dim(&self) -> u64 {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// How a latent attention projects its queries.
pub enum QueryProjection {
    /// One matrix, `q_proj` (DeepSeek-V2-Lite).
    Direct(Linear),
    /// Down-projection `q_a_proj`, its norm `q_a_layernorm`, up-projection
    /// `q_b_proj` (`q_lora_rank`, DeepSeek-V3).
    LowRank(Box<(Linear, RmsNorm, Linear)>),
}

impl QueryProjection {
    fn forward(&self, x: &TensorValue) -> TensorValue {
        match self {
            QueryProjection::Direct(proj) => proj.forward(x),
            QueryProjection::LowRank(parts) => {
                let (down, norm, up) = parts.as_ref();
                up.forward(&norm.forward(&down.forward(x)))
            }
        }
    }
}

impl Module for QueryProjection {
    fn visit(&self, registry: &mut Registry<'_>) {
        match self {
            QueryProjection::Direct(proj) => registry.module("q_proj", proj),
            QueryProjection::LowRank(parts) => {
                let (down, norm, up) = parts.as_ref();
                registry.module("q_a_proj", down);
                registry.module("q_a_layernorm", norm);
                registry.module("q_b_proj", up);
            }
        }
    }
}

/// llama.cpp's stored form of `kv_b_proj` (since 1.6): its GGUF converter
/// splits it per head into `attn_k_b` and `attn_v_b`, the key part
/// transposed, ready for the absorbed products.
pub struct SplitUpProjections {
    /// `k_b_proj.weight [heads, rank, nope]`: each head's key
    /// up-projection, transposed.
    pub k_b_proj: Weight,
    /// `v_b_proj.weight [heads, v, rank]`: each head's value up-projection.
    pub v_b_proj: Weight,
}

/// Multi-head latent attention over layer `layer`'s paged cache.
/// Sub-modules: the [`QueryProjection`]'s,
/// `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj` (or, split,
/// `k_b_proj` and `v_b_proj`), `o_proj`.
#[non_exhaustive]
pub struct LatentAttention {
    /// Query projection.
    pub query: QueryProjection,
    /// The latent and the rotated key part, `[rank + rope, hidden]`.
    pub kv_a_proj_with_mqa: Linear,
    /// Norm of the latent.
    pub kv_a_layernorm: RmsNorm,
    /// Keys without rotary and values from the latent, per head:
    /// `[heads · (nope + v), rank]`. Not a sub-module when
    /// [`split_up_projections`](Self::split_up_projections) is set.
    pub kv_b_proj: Linear,
    /// The same up-projections as llama.cpp stores them (since 1.6); see
    /// [`with_split_up_projections`](Self::with_split_up_projections).
    pub split_up_projections: Option<SplitUpProjections>,
    /// Output projection.
    pub o_proj: Linear,
    /// Rotary embedding of the `qk_rope_head_dim` part.
    pub rope: RotaryEmbedding,
    /// Shape and options.
    pub config: LatentAttentionConfig,
    /// Which KV-cache layer.
    pub layer: u32,
}

impl LatentAttention {
    /// A latent attention layer for cache layer `layer`.
    pub fn new(config: LatentAttentionConfig, rope: RotaryEmbedding, layer: u32) -> Self {
        let c = &config;
        let qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
        let q_width = c.num_heads * qk_head;
        let linear = |i, o, bias| Linear::new(i, o, c.dtype, bias);
        Self {
            query: match c.q_lora_rank {
                None => QueryProjection::Direct(linear(c.hidden_size, q_width, false)),
                Some(rank) => QueryProjection::LowRank(Box::new((
                    linear(c.hidden_size, rank, c.bias),
                    RmsNorm::new(rank, c.dtype, c.norm_eps),
                    linear(rank, q_width, false),
                ))),
            },
            kv_a_proj_with_mqa: linear(c.hidden_size, c.cache_head_dim(), c.bias),
            kv_a_layernorm: RmsNorm::new(c.kv_lora_rank, c.dtype, c.norm_eps),
            kv_b_proj: linear(
                c.kv_lora_rank,
                c.num_heads * (c.qk_nope_head_dim + c.v_head_dim),
                false,
            ),
            o_proj: linear(c.num_heads * c.v_head_dim, c.hidden_size, c.bias),
            split_up_projections: None,
            rope,
            layer,
            config,
        }
    }

    /// Reads the up-projections from llama.cpp's split `k_b_proj` and
    /// `v_b_proj` (GGUF's `attn_k_b`, `attn_v_b`) instead of `kv_b_proj`
    /// (since 1.6).
    pub fn with_split_up_projections(mut self) -> Self {
        let c = &self.config;
        let (heads, rank) = (c.num_heads, c.kv_lora_rank);
        let weight = |shape: &[u64]| Weight::new("weight", c.dtype, shape).quantizable();
        self.split_up_projections = Some(SplitUpProjections {
            k_b_proj: weight(&[heads, rank, c.qk_nope_head_dim]),
            v_b_proj: weight(&[heads, c.v_head_dim, rank]),
        });
        self
    }

    /// `W_UK [heads, nope, rank]` and `W_UVᵀ [heads, rank, v]`, from
    /// `kv_b_proj` (each head's key rows then its value rows) or from the
    /// split weights.
    fn up_projections(&self, graph: &crate::graph::Graph) -> (TensorValue, TensorValue) {
        let c = &self.config;
        if let Some(split) = &self.split_up_projections {
            return (
                ops::transpose(&split.k_b_proj.value(graph), 1, 2),
                ops::transpose(&split.v_b_proj.value(graph), 1, 2),
            );
        }
        let weight = self.kv_b_proj.weight.value(graph);
        let per_head = ops::reshape(
            &weight,
            [
                c.num_heads as i64,
                (c.qk_nope_head_dim + c.v_head_dim) as i64,
                c.kv_lora_rank as i64,
            ],
        );
        let parts = ops::split(&per_head, &[c.qk_nope_head_dim, c.v_head_dim], 1);
        (parts[0].clone(), ops::transpose(&parts[1], 1, 2))
    }
}

impl SelfAttention for LatentAttention {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let c = &self.config;
        let (heads, rank) = (c.num_heads as i64, c.kv_lora_rank);
        let q = ops::reshape(
            &self.query.forward(x),
            [-1, heads, (c.qk_nope_head_dim + c.qk_rope_head_dim) as i64],
        );
        let q = ops::split(&q, &[c.qk_nope_head_dim, c.qk_rope_head_dim], -1);
        let kv = ops::split(
            &self.kv_a_proj_with_mqa.forward(x),
            &[rank, c.qk_rope_head_dim],
            -1,
        );
        let latent = ops::unsqueeze(&self.kv_a_layernorm.forward(&kv[0]), 1);
        let k_pe = ops::unsqueeze(&kv[1], 1);

        let graph = x.graph();
        let path = self.o_proj.weight.module_path();
        let _scope = graph.scope(path.rsplit_once('.').map_or("", |(parent, _)| parent));
        let q_pe = self.rope.forward(&q[1], &batch.positions);
        let k_pe = self.rope.forward(&k_pe, &batch.positions);
        let (w_uk, w_uv_t) = self.up_projections(graph);
        // [H, T, nope] @ [H, nope, rank]: each head's query in latent space.
        let q_latent = ops::transpose(&ops::matmul(&ops::transpose(&q[0], 0, 1), &w_uk), 0, 1);
        let query = ops::concat(&[&q_latent, &q_pe], -1);
        let key = ops::concat(&[&latent, &k_pe], -1);
        let spec = AttentionSpec {
            layer: self.layer,
            scale: c.scale,
            sliding_window: None,
            softcap: None,
        };
        let attended = ops::paged_attention(&query, &key, &key, batch, spec);
        let latent_out = ops::slice(&attended, -1, 0, Some(rank as i64), 1);
        // [H, T, rank] @ [H, rank, v]: each head's value from its latent sum.
        let values = ops::matmul(&ops::transpose(&latent_out, 0, 1), &w_uv_t);
        let values = ops::reshape(
            &ops::transpose(&values, 0, 1),
            [-1, heads * c.v_head_dim as i64],
        );
        self.o_proj.forward(&values)
    }
}

impl Module for LatentAttention {
    fn visit(&self, registry: &mut Registry<'_>) {
        self.query.visit(registry);
        registry.module("kv_a_proj_with_mqa", &self.kv_a_proj_with_mqa);
        registry.module("kv_a_layernorm", &self.kv_a_layernorm);
        match &self.split_up_projections {
            Some(split) => {
                registry.weight("k_b_proj.weight", &split.k_b_proj);
                registry.weight("v_b_proj.weight", &split.v_b_proj);
            }
            None => registry.module("kv_b_proj", &self.kv_b_proj),
        }
        registry.module("o_proj", &self.o_proj);
    }
}
