//! Built-in plugin: DeepSeek-V3 (`DeepseekV3ForCausalLM`, and configs of the
//! same shape such as DeepSeek-V2-Lite's query path), as a variant of the
//! Llama decoder with two pieces replaced: the attention is multi-head
//! latent attention ([`LatentAttention`], whose KV cache holds one latent
//! per token), and the MLPs after the first `first_k_dense_replace` layers
//! are mixtures of experts routed by sigmoid scores with a correction bias
//! within the best expert groups, scaled by `routed_scaling_factor`, plus
//! shared experts. Embeddings, norms, the dense MLPs and the head are
//! Llama's. Rotary may use YaRN; DeepSeek's `mscale_all_dim` scales the
//! attention scores as transformers does.
//!
//! Refused by name: other routers (`scoring_func` other than `sigmoid`),
//! mixtures on only some later layers (`moe_layer_freq` other than 1) and
//! FP8 checkpoints (`quantization_config`). The multi-token-prediction layers
//! some checkpoints carry after the last layer are not loaded. Checkpoints:
//! safetensors, and llama.cpp's `deepseek2` GGUF files, whose `kv_b_proj` is
//! split per head.

use kiln_arch_llama::LlamaParams;
use kiln_plugin_api::adapters::{AdaptRequest, AdaptResponse, AdaptedWeight};
use kiln_plugin_api::graph::{DType, GraphIr, MoeRouting, MoeSpec, UnaryOp};
use kiln_plugin_api::nn::{
    build_decoder_graph, Decoder, LatentAttention, LatentAttentionConfig, Layer, MixtureOfExperts,
    PreNormBlock, RopeScaling,
};
use kiln_plugin_api::{
    ArchConfig, ConfigRequest, Encoding, Error, GraphRequest, HfConfig, KvCacheParams, Plugin,
    Result, SupportedArchitecture, Task, WeightsFormat,
};
use serde_json::Value;

/// DeepSeek's hyper-parameters beyond the Llama family's.
struct DeepseekParams {
    llama: LlamaParams,
    attention: LatentAttentionConfig,
    first_dense: usize,
    moe: MoeSpec,
    moe_intermediate: u64,
    shared_experts: u64,
}

impl DeepseekParams {
    fn parse(raw: &Value) -> Result<Self> {
        let hf = HfConfig::new(raw)?;
        if raw.get("quantization_config").is_some_and(|q| !q.is_null()) {
            return Err(Error::unsupported(
                "DeepSeek checkpoints with a quantization_config (FP8 weights) are not \
                 supported; convert them to bf16 first",
            ));
        }
        if let Some(kind) = hf.opt_string("scoring_func")? {
            if kind != "sigmoid" {
                return Err(Error::unsupported(format!(
                    "DeepSeek routing with scoring_func `{kind}` is not supported (sigmoid only)"
                )));
            }
        }
        if hf.opt_u32("moe_layer_freq")?.unwrap_or(1) != 1 {
            return Err(Error::unsupported(
                "DeepSeek with moe_layer_freq other than 1 is not supported",
            ));
        }
        let mut llama = LlamaParams::parse(&hf)?;
        let rope_dim = u64::from(hf.u32("qk_rope_head_dim")?);
        llama.rope.head_dim = rope_dim;
        llama.rope.interleaved = hf.opt_bool("rope_interleave")?.unwrap_or(true);
        let nope = u64::from(hf.u32("qk_nope_head_dim")?);
        let attention = LatentAttentionConfig {
            hidden_size: llama.hidden_size,
            num_heads: llama.num_heads,
            q_lora_rank: hf.opt_u32("q_lora_rank")?.map(u64::from),
            kv_lora_rank: u64::from(hf.u32("kv_lora_rank")?),
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope_dim,
            v_head_dim: u64::from(hf.u32("v_head_dim")?),
            scale: score_scale(nope + rope_dim, &llama.rope.scaling),
            norm_eps: 1e-6,
            bias: hf.opt_bool("attention_bias")?.unwrap_or(false),
            dtype: DType::F32,
        };
        let groups = hf.opt_u32("n_group")?.unwrap_or(1).max(1);
        let moe = MoeSpec {
            num_experts: hf.u32("n_routed_experts")?,
            top_k: hf.u32("num_experts_per_tok")?,
            routing: MoeRouting::Sigmoid {
                correction_bias: true,
                groups,
                top_groups: hf.opt_u32("topk_group")?.unwrap_or(groups),
            },
            renormalize: hf.opt_bool("norm_topk_prob")?.unwrap_or(true),
            scale: hf.opt_f64("routed_scaling_factor")?.unwrap_or(1.0) as f32,
            activation: UnaryOp::Silu,
        };
        Ok(Self {
            first_dense: hf.opt_u32("first_k_dense_replace")?.unwrap_or(0) as usize,
            moe_intermediate: u64::from(hf.u32("moe_intermediate_size")?),
            shared_experts: u64::from(hf.opt_u32("n_shared_experts")?.unwrap_or(0)),
            llama,
            attention,
            moe,
        })
    }

    /// Layer `i`'s mixture of experts, if it has one.
    fn moe(&self, i: usize) -> Option<MixtureOfExperts> {
        (i >= self.first_dense).then(|| {
            let moe = MixtureOfExperts::new(
                self.llama.hidden_size,
                self.moe_intermediate,
                DType::F32,
                self.moe.clone(),
            );
            match self.shared_experts {
                0 => moe,
                n => moe.with_shared_expert(n * self.moe_intermediate, false),
            }
        })
    }
}

/// `1/sqrt(qk_head_dim)`, times `mscale²` when YaRN has DeepSeek's
/// `mscale_all_dim` (`mscale = 0.1 · mscale_all_dim · ln(factor) + 1`).
fn score_scale(qk_head_dim: u64, scaling: &RopeScaling) -> f32 {
    let base = 1.0 / (qk_head_dim as f64).sqrt();
    let mscale = match scaling {
        RopeScaling::Yarn {
            factor,
            mscale_all_dim,
            ..
        } if *mscale_all_dim != 0.0 && *factor > 1.0 => 0.1 * mscale_all_dim * factor.ln() + 1.0,
        _ => 1.0,
    };
    (base * mscale * mscale) as f32
}

/// The config: the cache holds one latent "head" of `kv_lora_rank +
/// qk_rope_head_dim` per token and layer.
pub fn deepseek_config(request: &ConfigRequest) -> Result<ArchConfig> {
    let hf = HfConfig::new(&request.hf_config)?;
    let params = DeepseekParams::parse(&request.hf_config)?;
    Ok(ArchConfig {
        max_seq_len: hf.max_seq_len(request.max_length)?,
        kv: KvCacheParams {
            num_layers: params.llama.num_layers as u32,
            num_kv_heads: 1,
            head_dim: params.attention.cache_head_dim() as u32,
        },
        model: request.hf_config.clone(),
    })
}

/// The DeepSeek graph: Llama's pieces with latent attention in every layer
/// and mixtures of experts after the first dense layers.
pub fn deepseek_graph(request: &GraphRequest) -> Result<GraphIr> {
    let params = DeepseekParams::parse(&request.config.model)?;
    let model = params.llama.transformer(DType::F32);
    let split = request.weights_format == Some(WeightsFormat::Gguf);
    let decoder = Decoder::from_blocks(model, |i, block| {
        let attention = LatentAttention::new(
            params.attention.clone(),
            params.llama.rope.clone(),
            i as u32,
        );
        // llama.cpp stores `kv_b_proj` split per head.
        let attention = if split {
            attention.with_split_up_projections()
        } else {
            attention
        };
        let mlp: Box<dyn Layer> = match params.moe(i) {
            Some(moe) => Box::new(moe),
            None => Box::new(block.mlp),
        };
        Box::new(PreNormBlock::new(
            block.input_layernorm,
            Box::new(attention),
            block.post_attention_layernorm,
            mlp,
        ))
    });
    build_decoder_graph("deepseek", &decoder, request.state_dict.as_ref(), |batch| {
        decoder.forward(batch)
    })
}

/// Hugging Face names: the mixture-of-experts names of the Llama family
/// (per-expert or stacked), with DeepSeek's `shared_experts` and the
/// router's `gate.e_score_correction_bias`; layers past
/// `num_hidden_layers` (multi-token prediction) are left out.
pub fn adapt_safetensors(request: &AdaptRequest) -> Result<AdaptResponse> {
    let mut response = kiln_arch_llama::adapt_moe_safetensors(request)?;
    for weight in &mut response.weights {
        weight.name = weight
            .name
            .replace(".mlp.shared_experts.", ".mlp.shared_expert.")
            .replace(
                ".mlp.gate.e_score_correction_bias",
                ".mlp.e_score_correction_bias",
            );
    }
    main_layers_only(request, response)
}

/// llama.cpp's names (`deepseek2`): the mixture-of-experts names of the
/// Llama family with the correction bias `exp_probs_b`, and the latent
/// attention's `attn_q_a`, `attn_q_a_norm`, `attn_q_b`, `attn_kv_a_mqa`,
/// `attn_kv_a_norm` and `kv_b_proj` split per head as `attn_k_b` and
/// `attn_v_b` (read by [`LatentAttention::with_split_up_projections`]).
pub fn adapt_gguf(request: &AdaptRequest) -> Result<AdaptResponse> {
    let mut response = kiln_arch_llama::adapt_moe_gguf(request)?;
    for tensor in &request.tensors {
        let Some((layer, part)) = tensor
            .name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
        else {
            continue;
        };
        let module = match part {
            "exp_probs_b.bias" => "mlp.e_score_correction_bias",
            "attn_q_a.weight" => "self_attn.q_a_proj.weight",
            "attn_q_a_norm.weight" => "self_attn.q_a_layernorm.weight",
            "attn_q_b.weight" => "self_attn.q_b_proj.weight",
            "attn_kv_a_mqa.weight" => "self_attn.kv_a_proj_with_mqa.weight",
            "attn_kv_a_norm.weight" => "self_attn.kv_a_layernorm.weight",
            "attn_k_b.weight" => "self_attn.k_b_proj.weight",
            "attn_v_b.weight" => "self_attn.v_b_proj.weight",
            _ => continue,
        };
        response.weights.push(AdaptedWeight {
            name: format!("layers.{layer}.{module}"),
            source: tensor.name.clone(),
            rows: None,
        });
    }
    main_layers_only(request, response)
}

/// Leaves out the weights of layers past `num_hidden_layers` (DeepSeek's
/// multi-token prediction).
fn main_layers_only(request: &AdaptRequest, mut response: AdaptResponse) -> Result<AdaptResponse> {
    let layers = HfConfig::new(&request.config)?.u32("num_hidden_layers")?;
    response.weights.retain(|w| {
        let layer = w.name.strip_prefix("layers.").and_then(|rest| {
            rest.split_once('.')
                .and_then(|(layer, _)| layer.parse::<u32>().ok())
        });
        layer.is_none_or(|layer| layer < layers)
    });
    Ok(response)
}

/// The plugin.
pub fn plugin() -> Plugin {
    Plugin::new("deepseek", env!("CARGO_PKG_VERSION")).with_architecture(
        SupportedArchitecture::new("DeepseekV3ForCausalLM", Task::TextGeneration)
            .with_aliases(["deepseek_v3"])
            .with_encodings(Encoding::BFloat16, Encoding::ALL.iter().copied())
            .with_default_weights_format(WeightsFormat::Safetensors)
            .with_example_repo_ids(["deepseek-ai/DeepSeek-V3"])
            .with_config(deepseek_config)
            .with_graph(deepseek_graph)
            .with_weight_adapter(WeightsFormat::Safetensors, adapt_safetensors)
            .with_weight_adapter(WeightsFormat::Gguf, adapt_gguf),
    )
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v3_shape() -> Value {
        json!({
            "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
            "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
            "num_attention_heads": 128, "num_key_value_heads": 128, "head_dim": 64,
            "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
            "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "n_shared_experts": 1,
            "first_k_dense_replace": 3, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
            "vocab_size": 129280, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
            "hidden_act": "silu", "scoring_func": "sigmoid",
            "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
            "rope_theta": 10000
        })
    }

    #[test]
    fn the_cache_holds_one_latent_per_token() {
        let config = deepseek_config(&ConfigRequest {
            hf_config: v3_shape(),
            max_length: Some(4096),
        })
        .unwrap();
        assert_eq!(
            (
                config.kv.num_layers,
                config.kv.num_kv_heads,
                config.kv.head_dim
            ),
            (61, 1, 576)
        );
    }

    #[test]
    fn yarn_mscale_scales_the_scores() {
        let params = DeepseekParams::parse(&v3_shape()).unwrap();
        let mscale = 0.1 * 40f64.ln() + 1.0;
        let expected = mscale * mscale / 192f64.sqrt();
        assert!((f64::from(params.attention.scale) - expected).abs() < 1e-6);
    }

    #[test]
    fn refuses_what_it_cannot_compute() {
        for (key, value, needle) in [
            ("scoring_func", json!("softmax"), "scoring_func"),
            ("moe_layer_freq", json!(2), "moe_layer_freq"),
            ("quantization_config", json!({"quant_method": "fp8"}), "FP8"),
        ] {
            let mut config = v3_shape();
            config[key] = value;
            let error = DeepseekParams::parse(&config).err().unwrap().to_string();
            assert!(error.contains(needle), "{key}: {error}");
        }
    }

    #[test]
    fn plugin_is_valid() {
        plugin().validate().unwrap();
    }
}
