//! GPT-NeoX and Pythia (`GPTNeoXForCausalLM`), as a variant of the Llama
//! decoder: LayerNorms, biases, a plain GELU MLP, rotary on part of each head
//! (`rotary_pct`, a quarter in Pythia), and q/k/v from one fused projection.
//! With `use_parallel_residual` (the default) attention and the MLP read the
//! same input through their own norms: `x + attn(ln1(x)) + mlp(ln2(x))`;
//! without it the layer is the library's sequential [`PreNormBlock`].
//!
//! Hugging Face's `query_key_value` interleaves the heads (`[heads, 3, D]`
//! rows), llama.cpp's converter stacks q, k and v; the graph splits either
//! layout after one matmul, so the weights load as they are.

use kiln_plugin_api::graph::{ops, AttentionSpec, DType, GraphIr, RaggedBatch, TensorValue};
use kiln_plugin_api::nn::{
    build_decoder_graph, rotary_attention, Activation, Decoder, DecoderLayer, Layer, LayerNorm,
    Linear, Mlp, Module, Norm, PreNormBlock, Registry, RotaryEmbedding, SelfAttention,
};
use kiln_plugin_api::{
    adapters, Error, GraphRequest, HfConfig, Result, SupportedArchitecture, WeightsFormat,
};
use serde_json::Value;

use crate::{partial_rotary_factor, split_activation, LlamaParams};

/// The config with GPT-NeoX's legacy keys under Llama's names: the rotary
/// base (`rotary_emb_base`) and the rotated share (`rotary_pct`, 0.25 by
/// default) as `rope_theta` and `partial_rotary_factor`.
pub fn gpt_neox_config(config: &Value) -> Value {
    let mut llama = config.clone();
    if let Some(object) = llama.as_object_mut() {
        if let Some(base) = object.remove("rotary_emb_base") {
            object.entry("rope_theta").or_insert(base);
        }
        if let Some(pct) = object.remove("rotary_pct") {
            object.entry("partial_rotary_factor").or_insert(pct);
        }
    }
    llama
}

/// Attention with one fused q/k/v projection (`qkv_proj`) and an output
/// projection (`o_proj`).
struct FusedAttention {
    qkv_proj: Linear,
    o_proj: Linear,
    rope: RotaryEmbedding,
    heads: u64,
    head_dim: u64,
    /// Rows grouped per head (`[heads, 3, D]`, Hugging Face) instead of
    /// stacked (`[3, heads, D]`, GGUF).
    per_head: bool,
    layer: u32,
}

impl SelfAttention for FusedAttention {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let (h, d) = (self.heads as i64, self.head_dim as i64);
        let qkv = self.qkv_proj.forward(x);
        let parts = if self.per_head {
            ops::split(&ops::reshape(&qkv, [-1, h, 3 * d]), &[d as u64; 3], -1)
        } else {
            let stacked = ops::split(&qkv, &[(h * d) as u64; 3], -1);
            stacked
                .iter()
                .map(|t| ops::reshape(t, [-1, h, d]))
                .collect()
        };
        let spec = AttentionSpec {
            layer: self.layer,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            sliding_window: None,
            softcap: None,
        };
        let attended = rotary_attention(&parts[0], &parts[1], &parts[2], batch, &self.rope, spec);
        self.o_proj.forward(&attended)
    }
}

impl Module for FusedAttention {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("qkv_proj", &self.qkv_proj);
        registry.module("o_proj", &self.o_proj);
    }
}

/// A parallel GPT-NeoX layer: attention and the MLP on the same input,
/// each through its own LayerNorm, both added to the residual.
struct ParallelNeoxLayer {
    input_layernorm: Norm,
    post_attention_layernorm: Norm,
    self_attn: FusedAttention,
    mlp: Mlp,
}

impl Module for ParallelNeoxLayer {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("input_layernorm", &self.input_layernorm);
        registry.module("post_attention_layernorm", &self.post_attention_layernorm);
        registry.module("self_attn", &self.self_attn);
        registry.module("mlp", &self.mlp);
    }
}

impl DecoderLayer for ParallelNeoxLayer {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let attended = self
            .self_attn
            .forward(&self.input_layernorm.forward(x), batch);
        let out = self.mlp.forward(&self.post_attention_layernorm.forward(x));
        &(x + &attended) + &out
    }
}

/// The GPT-NeoX graph: Llama's embeddings and head around GPT-NeoX layers.
pub fn gpt_neox_graph(request: &GraphRequest) -> Result<GraphIr> {
    let config = gpt_neox_config(&request.config.model);
    let hf = HfConfig::new(&config)?;
    let (llama, activation) = split_activation(&config, Activation::Gelu)?;
    let mut params = LlamaParams::parse(&HfConfig::new(&llama)?)?;
    if params.num_kv_heads != params.num_heads {
        return Err(Error::invalid(
            "GPT-NeoX has as many key/value heads as query heads",
        ));
    }
    params.rope.head_dim = (params.head_dim as f64 * partial_rotary_factor(&config, 0.25)) as u64;
    let bias = hf.opt_bool("attention_bias")?.unwrap_or(true);
    let parallel = hf.opt_bool("use_parallel_residual")?.unwrap_or(true);
    let eps = hf.opt_f64("layer_norm_eps")?.unwrap_or(1e-5) as f32;
    let (width, inner, heads) = (
        params.hidden_size,
        params.intermediate_size,
        params.num_heads,
    );
    let norm = || Norm::Layer(LayerNorm::new(width, DType::F32, eps, true));
    let mut model = params.transformer(DType::F32);
    model.norm = norm();
    let per_head = request.weights_format != Some(WeightsFormat::Gguf);
    let decoder = Decoder::from_blocks(model, |layer, _| -> Box<dyn DecoderLayer> {
        let q_dim = heads * params.head_dim;
        let self_attn = FusedAttention {
            qkv_proj: Linear::new(width, 3 * q_dim, DType::F32, bias),
            o_proj: Linear::new(q_dim, width, DType::F32, bias),
            rope: params.rope.clone(),
            heads,
            head_dim: params.head_dim,
            per_head,
            layer: layer as u32,
        };
        let mlp = Mlp::plain(width, inner, DType::F32, activation, true);
        if parallel {
            Box::new(ParallelNeoxLayer {
                input_layernorm: norm(),
                post_attention_layernorm: norm(),
                self_attn,
                mlp,
            })
        } else {
            Box::new(PreNormBlock::new(
                norm(),
                Box::new(self_attn),
                norm(),
                Box::new(mlp),
            ))
        }
    });
    build_decoder_graph("gpt_neox", &decoder, request.state_dict.as_ref(), |batch| {
        decoder.forward(batch)
    })
}

/// Hugging Face names (`gpt_neox.embed_in`, `attention.query_key_value`,
/// `mlp.dense_h_to_4h`, `embed_out`, …) onto the Llama tree; the causal-mask
/// and rotary buffers of old checkpoints are dropped. llama.cpp's names are
/// the decoder's (`attn_qkv` is `self_attn.qkv_proj`).
pub fn with_gpt_neox_adapters(arch: SupportedArchitecture) -> SupportedArchitecture {
    arch.with_weight_adapter(WeightsFormat::Safetensors, |r| {
        Ok(adapters::rename(r, hf_gpt_neox_name))
    })
    .with_weight_adapter(WeightsFormat::Gguf, |r| {
        Ok(adapters::rename(r, adapters::gguf_decoder_name))
    })
}

fn hf_gpt_neox_name(name: &str) -> Option<String> {
    let buffer = [".attention.bias", ".attention.masked_bias", ".inv_freq"];
    if buffer.iter().any(|b| name.ends_with(b)) {
        return None;
    }
    let name = name.strip_prefix("gpt_neox.").unwrap_or(name);
    Some(
        name.replace("embed_in.", "embed_tokens.")
            .replace("final_layer_norm.", "norm.")
            .replace("embed_out.", "lm_head.")
            .replace(".attention.query_key_value.", ".self_attn.qkv_proj.")
            .replace(".attention.dense.", ".self_attn.o_proj.")
            .replace(".mlp.dense_h_to_4h.", ".mlp.up_proj.")
            .replace(".mlp.dense_4h_to_h.", ".mlp.down_proj."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_hugging_face_names_and_drops_buffers() {
        let map = |n: &str| hf_gpt_neox_name(n);
        assert_eq!(
            map("gpt_neox.layers.3.attention.query_key_value.weight").as_deref(),
            Some("layers.3.self_attn.qkv_proj.weight")
        );
        assert_eq!(map("embed_out.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(map("gpt_neox.layers.0.attention.masked_bias"), None);
        assert_eq!(map("gpt_neox.layers.0.attention.rotary_emb.inv_freq"), None);
    }

    #[test]
    fn reads_the_legacy_rotary_keys() {
        let config = gpt_neox_config(&serde_json::json!({
            "rotary_pct": 0.25, "rotary_emb_base": 10000
        }));
        assert_eq!(partial_rotary_factor(&config, 1.0), 0.25);
        assert_eq!(config["rope_theta"], 10000);
    }
}
