//! Built-in plugin: Gemma 3 (text) and Gemma 2. What sets them apart from
//! Llama: embeddings scaled by √hidden, RMSNorms of the form `(1 + w)`, a
//! norm after attention and around the MLP, GELU-tanh, a query scale from
//! `query_pre_attn_scalar`, and sliding-window layers interleaved with global
//! ones. Gemma 3 adds q/k norms and a rotary base of its own for the sliding
//! layers; Gemma 2 (`gemma2.rs`) has neither, but soft-caps attention scores
//! and the final logits by default.

mod gemma2;

use kiln_plugin_api::graph::{ops, DType, GraphIr};
use kiln_plugin_api::nn::{
    build_decoder_graph, Activation, AttentionConfig, AttentionWithRope, Embedding, Linear, Mlp,
    Norm, RmsNorm, RopeScaling, RotaryEmbedding, Transformer, TransformerBlock,
};
use kiln_plugin_api::{
    adapters, ArchConfig, ConfigRequest, Encoding, Error, GraphRequest, HfConfig, Plugin, Result,
    SupportedArchitecture, Task, WeightsFormat,
};
use serde_json::Value;

/// Which generation of Gemma a config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmaFamily {
    /// Gemma 2: no q/k norms, one rotary base, every other layer sliding,
    /// soft caps on by default.
    Gemma2,
    /// Gemma 3 (text).
    Gemma3,
}

/// Gemma's hyper-parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmaParams {
    vocab_size: u64,
    hidden_size: u64,
    intermediate_size: u64,
    num_heads: u64,
    num_kv_heads: u64,
    head_dim: u64,
    eps: f32,
    global_rope: RotaryEmbedding,
    local_rope: RotaryEmbedding,
    sliding_window: Option<u32>,
    /// Per layer: true for sliding-window attention.
    sliding: Vec<bool>,
    query_scale: f32,
    attn_softcap: Option<f32>,
    final_softcap: Option<f32>,
    /// The LM head is the embedding (Gemma's default); else `lm_head`.
    tie_word_embeddings: bool,
    /// RMSNorms of each head's queries and keys (Gemma 3).
    qk_norm: bool,
}

impl GemmaParams {
    /// Reads the parameters from a Hugging Face `Gemma3TextConfig` or
    /// `Gemma2Config`, with that family's defaults.
    pub fn parse(config: &HfConfig<'_>, raw: &Value, family: GemmaFamily) -> Result<Self> {
        let gemma2 = family == GemmaFamily::Gemma2;
        if config.opt_bool("use_bidirectional_attention")? == Some(true) {
            return Err(Error::invalid(
                "config.json `use_bidirectional_attention` is not supported (Kiln's Gemma is causal)",
            ));
        }
        let kv = config.decoder_kv_params()?;
        let layers = kv.num_layers as usize;
        // transformers 5 nests the two rotary setups under `rope_parameters`
        // by attention type; earlier configs have `rope_theta`/`rope_scaling`
        // and `rope_local_base_freq`.
        let nested = |kind: &str| {
            raw.get("rope_parameters")
                .and_then(|p| p.get(kind))
                .filter(|p| p.is_object())
        };
        let (theta, scaling) = match nested("full_attention") {
            Some(full) => {
                let mut flat = raw.clone();
                flat["rope_parameters"] = full.clone();
                HfConfig::new(&flat)?.rope()?
            }
            None => config.rope()?,
        };
        let local_theta = match nested("sliding_attention")
            .and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
        {
            Some(theta) => theta,
            None if gemma2 => theta,
            None => config.opt_f64("rope_local_base_freq")?.unwrap_or(10_000.0),
        };
        let sliding = match raw.get("layer_types").and_then(Value::as_array) {
            Some(types) if types.len() == layers => types
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect(),
            Some(types) => {
                return Err(Error::invalid(format!(
                    "config.json `layer_types` has {} entries for {layers} layers",
                    types.len()
                )))
            }
            None => {
                let pattern = match family {
                    GemmaFamily::Gemma2 => 2,
                    GemmaFamily::Gemma3 => config.opt_u32("sliding_window_pattern")?.unwrap_or(6),
                }
                .max(1) as usize;
                (0..layers).map(|i| (i + 1) % pattern != 0).collect()
            }
        };
        let mut global_rope = RotaryEmbedding::new(u64::from(kv.head_dim), theta);
        global_rope.scaling = scaling;
        let local_rope = if gemma2 {
            global_rope.clone()
        } else {
            RotaryEmbedding {
                scaling: RopeScaling::Default,
                ..RotaryEmbedding::new(u64::from(kv.head_dim), local_theta)
            }
        };
        // Gemma 2 soft-caps unless the config says otherwise (null: off).
        let softcap = |key: &str, gemma2_default: f64| -> Result<Option<f32>> {
            Ok(match raw.get(key) {
                None if gemma2 => Some(gemma2_default as f32),
                _ => config.opt_f64(key)?.map(|c| c as f32),
            })
        };
        let query_pre_attn_scalar = config
            .opt_f64("query_pre_attn_scalar")?
            .unwrap_or(f64::from(kv.head_dim));
        Ok(Self {
            vocab_size: u64::from(config.u32("vocab_size")?),
            hidden_size: u64::from(config.u32("hidden_size")?),
            intermediate_size: u64::from(config.u32("intermediate_size")?),
            num_heads: u64::from(config.u32("num_attention_heads")?),
            num_kv_heads: u64::from(kv.num_kv_heads),
            head_dim: u64::from(kv.head_dim),
            eps: config.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            global_rope,
            local_rope,
            sliding_window: match config.opt_u32("sliding_window")? {
                None if gemma2 => Some(4096),
                window => window,
            },
            sliding,
            query_scale: query_pre_attn_scalar.powf(-0.5) as f32,
            attn_softcap: softcap("attn_logit_softcapping", 50.0)?,
            final_softcap: softcap("final_logit_softcapping", 30.0)?,
            tie_word_embeddings: config.opt_bool("tie_word_embeddings")?.unwrap_or(true),
            qk_norm: !gemma2,
        })
    }

    /// The decoder. `norm_offset` is 1 for Hugging Face weights (the norms
    /// multiply by `1 + w`) and 0 for GGUF, which stores `1 + w`.
    pub fn transformer(&self, norm_offset: f32) -> Transformer {
        let dtype = DType::F32;
        let norm = |dim| RmsNorm::new(dim, dtype, self.eps).with_weight_offset(norm_offset);
        let layers = self
            .sliding
            .iter()
            .enumerate()
            .map(|(layer, &sliding)| {
                let config = AttentionConfig {
                    hidden_size: self.hidden_size,
                    num_heads: self.num_heads,
                    num_kv_heads: self.num_kv_heads,
                    head_dim: self.head_dim,
                    qkv_bias: false,
                    o_bias: false,
                    qk_norm_eps: self.qk_norm.then_some(self.eps),
                    scale: Some(self.query_scale),
                    sliding_window: if sliding { self.sliding_window } else { None },
                    softcap: self.attn_softcap,
                    dtype,
                };
                let rope = if sliding {
                    self.local_rope.clone()
                } else {
                    self.global_rope.clone()
                };
                let mut attention = AttentionWithRope::new(config, rope, layer as u32);
                if self.qk_norm {
                    attention.q_norm = Some(norm(self.head_dim));
                    attention.k_norm = Some(norm(self.head_dim));
                }
                TransformerBlock {
                    input_layernorm: Norm::Rms(norm(self.hidden_size)),
                    self_attn: attention,
                    post_attention_layernorm: Norm::Rms(norm(self.hidden_size)),
                    pre_feedforward_layernorm: Some(Norm::Rms(norm(self.hidden_size))),
                    post_feedforward_layernorm: Some(Norm::Rms(norm(self.hidden_size))),
                    mlp: Mlp::gated(
                        self.hidden_size,
                        self.intermediate_size,
                        dtype,
                        Activation::GeluTanh,
                    ),
                }
            })
            .collect();
        Transformer {
            embed_tokens: Embedding::new(self.vocab_size, self.hidden_size, dtype),
            layers,
            norm: Norm::Rms(norm(self.hidden_size)),
            lm_head: (!self.tie_word_embeddings)
                .then(|| Linear::new(self.hidden_size, self.vocab_size, dtype, false)),
            embedding_scale: Some((self.hidden_size as f32).sqrt()),
        }
    }
}

/// Parses a `family` config: KV shape and sequence limit (and checks the rest).
pub fn gemma_config(request: &ConfigRequest, family: GemmaFamily) -> Result<ArchConfig> {
    let config = HfConfig::new(&request.hf_config)?;
    GemmaParams::parse(&config, &request.hf_config, family)?;
    Ok(ArchConfig {
        max_seq_len: config.max_seq_len(request.max_length)?,
        kv: config.decoder_kv_params()?,
        model: request.hf_config.clone(),
    })
}

/// The graph of a `family` model.
pub fn gemma_graph(request: &GraphRequest, family: GemmaFamily) -> Result<GraphIr> {
    let params = GemmaParams::parse(
        &HfConfig::new(&request.config.model)?,
        &request.config.model,
        family,
    )?;
    let offset = if request.weights_format == Some(WeightsFormat::Gguf) {
        0.0
    } else {
        1.0
    };
    let model = params.transformer(offset);
    let name = match family {
        GemmaFamily::Gemma2 => "gemma2",
        GemmaFamily::Gemma3 => "gemma3",
    };
    build_decoder_graph(name, &model, request.state_dict.as_ref(), |batch| {
        let logits = model.forward(batch);
        match params.final_softcap {
            Some(cap) => &ops::tanh(&(&logits * (1.0 / f64::from(cap)))) * f64::from(cap),
            None => logits,
        }
    })
}

/// Parses a Gemma 3 config.
pub fn gemma3_config(request: &ConfigRequest) -> Result<ArchConfig> {
    gemma_config(request, GemmaFamily::Gemma3)
}

/// The Gemma 3 graph.
pub fn gemma3_graph(request: &GraphRequest) -> Result<GraphIr> {
    gemma_graph(request, GemmaFamily::Gemma3)
}

/// llama.cpp's Gemma 2 and 3 names: like Llama's, but its `ffn_norm` is the
/// norm before the MLP (Gemma has one after attention too).
pub fn gemma3_gguf_name(name: &str) -> Option<String> {
    let mapped = adapters::gguf_decoder_name(name)?;
    if name.ends_with(".ffn_norm.weight") {
        Some(mapped.replace("post_attention_layernorm", "pre_feedforward_layernorm"))
    } else {
        Some(mapped)
    }
}

/// The plugin.
pub fn plugin() -> Plugin {
    Plugin::new("gemma", env!("CARGO_PKG_VERSION"))
        .with_architecture(gemma2::architecture())
        .with_architecture(
            SupportedArchitecture::new("Gemma3ForCausalLM", Task::TextGeneration)
                .with_aliases(["gemma3"])
                .with_encodings(Encoding::BFloat16, Encoding::ALL.iter().copied())
                .with_example_repo_ids(["google/gemma-3-270m", "google/gemma-3-1b-it"])
                .with_config(gemma3_config)
                .with_graph(gemma3_graph)
                .with_weight_adapter(WeightsFormat::Safetensors, |r| {
                    Ok(adapters::rename(r, adapters::hf_decoder_name))
                })
                .with_weight_adapter(WeightsFormat::Gguf, |r| {
                    Ok(adapters::rename(r, gemma3_gguf_name))
                }),
        )
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gemma_270m() -> Value {
        json!({
            "architectures": ["Gemma3ForCausalLM"], "vocab_size": 262144, "hidden_size": 640,
            "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 32768,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "sliding_window": 512, "query_pre_attn_scalar": 256
        })
    }

    #[test]
    fn five_of_six_layers_slide_by_default() {
        let raw = gemma_270m();
        let params =
            GemmaParams::parse(&HfConfig::new(&raw).unwrap(), &raw, GemmaFamily::Gemma3).unwrap();
        let globals: Vec<usize> = params
            .sliding
            .iter()
            .enumerate()
            .filter(|(_, s)| !**s)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(globals, [5, 11, 17]);
        assert_eq!(params.query_scale, 1.0 / 16.0);
    }

    #[test]
    fn gguf_norm_names_follow_gemma() {
        assert_eq!(
            gemma3_gguf_name("blk.2.ffn_norm.weight").unwrap(),
            "layers.2.pre_feedforward_layernorm.weight"
        );
        assert_eq!(
            gemma3_gguf_name("blk.2.post_attention_norm.weight").unwrap(),
            "layers.2.post_attention_layernorm.weight"
        );
        assert_eq!(
            gemma3_gguf_name("blk.2.post_ffw_norm.weight").unwrap(),
            "layers.2.post_feedforward_layernorm.weight"
        );
    }

    #[test]
    fn the_graph_has_post_norms_and_no_lm_head() {
        let request = ConfigRequest {
            hf_config: gemma_270m(),
            max_length: Some(1024),
        };
        let config = gemma3_config(&request).unwrap();
        let ir = gemma3_graph(&GraphRequest {
            config,
            weights_format: None,
            state_dict: None,
            task: None,
        })
        .unwrap();
        let names: Vec<&str> = ir.weights.iter().map(|w| w.name.as_str()).collect();
        assert!(names.contains(&"layers.0.post_feedforward_layernorm.weight"));
        assert!(names.contains(&"layers.0.self_attn.k_norm.weight"));
        assert!(!names.iter().any(|n| n.starts_with("lm_head")));
    }

    #[test]
    fn untied_embeddings_have_their_own_lm_head() {
        let mut hf_config = gemma_270m();
        hf_config["tie_word_embeddings"] = json!(false);
        let config = gemma3_config(&ConfigRequest {
            hf_config,
            max_length: Some(1024),
        })
        .unwrap();
        let ir = gemma3_graph(&GraphRequest {
            config,
            weights_format: None,
            state_dict: None,
            task: None,
        })
        .unwrap();
        assert!(ir.weights.iter().any(|w| w.name == "lm_head.weight"));
    }

    #[test]
    fn plugin_is_valid() {
        plugin().validate().unwrap();
    }
}
