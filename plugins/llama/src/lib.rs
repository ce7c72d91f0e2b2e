//! Built-in plugin: the Llama family.
//!
//! Registers `LlamaForCausalLM`, `MistralForCausalLM`,
//! `Starcoder2ForCausalLM`, `GraniteForCausalLM`, `SmolLM3ForCausalLM`,
//! `Olmo2ForCausalLM` and `MixtralForCausalLM` with their config and graph
//! entry points, built from the `kiln-plugin-api` module library. Each
//! variant has its own module and replaces only what differs from Llama:
//! StarCoder2 the norms and the MLP, Granite the residual wiring and three
//! scales, SmolLM3 some layers' rotary embedding, OLMo 2 the wiring
//! (post-norms) and the q/k norms, Mixtral the MLPs (mixtures of experts).

use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{
    build_decoder_graph, Activation, AttentionConfig, AttentionWithRope, DecoderClassifier,
    Embedding, Linear, Mlp, Norm, RmsNorm, RotaryEmbedding, Transformer, TransformerBlock,
};
use kiln_plugin_api::{
    adapters, ArchConfig, ConfigRequest, Encoding, Error, GraphRequest, HfConfig, Plugin, Result,
    ServingDefaults, ServingRequest, SupportedArchitecture, Task, WeightsFormat,
};
use serde_json::Value;

mod gpt_neox;
mod granite;
mod mixtral;
mod olmo2;
mod smollm3;
mod starcoder2;

pub use gpt_neox::{gpt_neox_config, gpt_neox_graph, with_gpt_neox_adapters};
pub use granite::granite_graph;
pub use mixtral::{
    adapt_moe_gguf, adapt_moe_safetensors, expert_counts, mixtral_graph, moe_decoder_graph,
    with_moe_adapters,
};
pub use olmo2::olmo2_graph;
pub use smollm3::smollm3_graph;
pub use starcoder2::{starcoder2_graph, with_starcoder2_adapters};

/// Parses a Llama-style `config.json`: KV shape and sequence limit.
pub fn llama_config(request: &ConfigRequest) -> Result<ArchConfig> {
    let config = HfConfig::new(&request.hf_config)?;
    // Parse everything the graph needs now, so a bad config fails early.
    LlamaParams::parse(&config)?;
    Ok(ArchConfig {
        max_seq_len: config.max_seq_len(request.max_length)?,
        kv: config.decoder_kv_params()?,
        model: request.hf_config.clone(),
    })
}

/// For a variant whose MLP activation is not SiLU: the config as Llama's
/// parser reads it (without `hidden_act`, which it limits to SiLU) and the
/// activation `hidden_act` names (`default` when it names none).
pub fn split_activation(config: &Value, default: Activation) -> Result<(Value, Activation)> {
    let mut llama = config.clone();
    let activation = match llama.as_object_mut().and_then(|c| c.remove("hidden_act")) {
        None => default,
        Some(name) => name
            .as_str()
            .and_then(Activation::from_hf_name)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "hidden_act {name} is not supported (silu, gelu, gelu_pytorch_tanh, relu)"
                ))
            })?,
    };
    Ok((llama, activation))
}

/// The share of each head that rotates (`partial_rotary_factor`, in
/// `rope_parameters` as transformers 5 writes it or at the top level as
/// older configs do), `default` when absent.
pub fn partial_rotary_factor(config: &Value, default: f64) -> f64 {
    config
        .get("rope_parameters")
        .and_then(|p| p.get("partial_rotary_factor"))
        .or_else(|| config.get("partial_rotary_factor"))
        .and_then(Value::as_f64)
        .unwrap_or(default)
}

/// [`llama_config`] for such a variant: the activation is checked, and the
/// config it returns keeps `hidden_act`.
pub fn variant_config(request: &ConfigRequest, default: Activation) -> Result<ArchConfig> {
    let (hf_config, _) = split_activation(&request.hf_config, default)?;
    let mut config = llama_config(&ConfigRequest {
        hf_config,
        ..request.clone()
    })?;
    config.model = request.hf_config.clone();
    Ok(config)
}

/// The hyper-parameters of a Llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaParams {
    /// Vocabulary size.
    pub vocab_size: u64,
    /// Model width.
    pub hidden_size: u64,
    /// MLP width.
    pub intermediate_size: u64,
    /// Blocks.
    pub num_layers: u64,
    /// Query heads.
    pub num_heads: u64,
    /// Key/value heads.
    pub num_kv_heads: u64,
    /// Head size.
    pub head_dim: u64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Rotary embedding.
    pub rope: RotaryEmbedding,
    /// LM head tied to the embeddings.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k, v projections.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// RMSNorm of queries and keys per head (Qwen3).
    pub qk_norm: bool,
    /// Biases on the MLP projections.
    pub mlp_bias: bool,
    /// Mistral's sliding window.
    pub sliding_window: Option<u32>,
}

impl LlamaParams {
    /// Reads the parameters from a Hugging Face config.
    pub fn parse(config: &HfConfig<'_>) -> Result<Self> {
        let kv = config.decoder_kv_params()?;
        let (theta, scaling) = config.rope()?;
        if let Some(act) = config.opt_string("hidden_act")? {
            if act != "silu" {
                return Err(Error::invalid(format!(
                    "hidden_act `{act}` is not supported (expected silu)"
                )));
            }
        }
        let mut rope = RotaryEmbedding::new(u64::from(kv.head_dim), theta);
        rope.scaling = scaling;
        Ok(Self {
            vocab_size: u64::from(config.u32("vocab_size")?),
            hidden_size: u64::from(config.u32("hidden_size")?),
            intermediate_size: u64::from(config.u32("intermediate_size")?),
            num_layers: u64::from(kv.num_layers),
            num_heads: u64::from(config.u32("num_attention_heads")?),
            num_kv_heads: u64::from(kv.num_kv_heads),
            head_dim: u64::from(kv.head_dim),
            rms_norm_eps: config.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope,
            tie_word_embeddings: config.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: config.opt_bool("attention_bias")?.unwrap_or(false),
            o_bias: config.opt_bool("attention_bias")?.unwrap_or(false),
            qk_norm: false,
            mlp_bias: config.opt_bool("mlp_bias")?.unwrap_or(false),
            sliding_window: config.opt_u32("sliding_window")?,
        })
    }

    /// These parameters for `request`'s weights: llama.cpp's converter stores
    /// the Q and K rows of Llama and the families converted as Llama
    /// (Mixtral, Granite, SmolLM3) permuted for adjacent-pair rotation, so a
    /// GGUF rotates adjacent pairs and reads them as they are, zero-copy.
    pub fn rotated_for(mut self, request: &GraphRequest) -> Self {
        self.rope.interleaved = request.weights_format == Some(WeightsFormat::Gguf);
        self
    }

    /// The decoder as modules of `dtype`.
    pub fn transformer(&self, dtype: DType) -> Transformer {
        let norm = || Norm::Rms(RmsNorm::new(self.hidden_size, dtype, self.rms_norm_eps));
        let layers = (0..self.num_layers)
            .map(|layer| {
                let attention = AttentionConfig {
                    hidden_size: self.hidden_size,
                    num_heads: self.num_heads,
                    num_kv_heads: self.num_kv_heads,
                    head_dim: self.head_dim,
                    qkv_bias: self.qkv_bias,
                    o_bias: self.o_bias,
                    qk_norm_eps: self.qk_norm.then_some(self.rms_norm_eps),
                    scale: None,
                    sliding_window: self.sliding_window,
                    softcap: None,
                    dtype,
                };
                let mut mlp = Mlp::gated(
                    self.hidden_size,
                    self.intermediate_size,
                    dtype,
                    Activation::Silu,
                );
                if self.mlp_bias {
                    mlp = Mlp {
                        gate_proj: Some(Linear::new(
                            self.hidden_size,
                            self.intermediate_size,
                            dtype,
                            true,
                        )),
                        up_proj: Linear::new(self.hidden_size, self.intermediate_size, dtype, true),
                        down_proj: Linear::new(
                            self.intermediate_size,
                            self.hidden_size,
                            dtype,
                            true,
                        ),
                        activation: Activation::Silu,
                    };
                }
                TransformerBlock {
                    input_layernorm: norm(),
                    self_attn: AttentionWithRope::new(attention, self.rope.clone(), layer as u32),
                    post_attention_layernorm: norm(),
                    pre_feedforward_layernorm: None,
                    post_feedforward_layernorm: None,
                    mlp,
                }
            })
            .collect();
        Transformer {
            embed_tokens: Embedding::new(self.vocab_size, self.hidden_size, dtype),
            layers,
            norm: norm(),
            lm_head: (!self.tie_word_embeddings)
                .then(|| Linear::new(self.hidden_size, self.vocab_size, dtype, false)),
            embedding_scale: None,
        }
    }
}

/// Builds the decoder graph: ragged-batch inputs in, last-token logits out.
pub fn llama_graph(request: &GraphRequest) -> Result<GraphIr> {
    let params = LlamaParams::parse(&HfConfig::new(&request.config.model)?)?.rotated_for(request);
    decoder_graph(&params, request)
}

/// Hugging Face checkpoints: strip `model.`; GGUF: llama.cpp names.
pub fn with_decoder_adapters(arch: SupportedArchitecture) -> SupportedArchitecture {
    arch.with_weight_adapter(WeightsFormat::Safetensors, |r| {
        Ok(adapters::rename(r, adapters::hf_decoder_name))
    })
    .with_weight_adapter(WeightsFormat::Gguf, |r| {
        Ok(adapters::rename(r, adapters::gguf_decoder_name))
    })
}

/// The decoder graph of any Llama-shaped family, from its parameters: the
/// logits, or for an embedding model ([`GraphRequest::wants_hidden_states`])
/// the final hidden states, with no LM head (a causal LM's is left unread).
pub fn decoder_graph(params: &LlamaParams, request: &GraphRequest) -> Result<GraphIr> {
    let mut model = params.transformer(DType::F32);
    let hidden = request.wants_hidden_states();
    // Only an embedding run copies the state dict, to drop the head.
    let without_head;
    let state = if hidden {
        model.lm_head = None;
        without_head = request.state_dict.clone().map(|mut state| {
            state.remove("lm_head.weight");
            state
        });
        without_head.as_ref()
    } else {
        request.state_dict.as_ref()
    };
    build_decoder_graph("decoder", &model, state, |batch| {
        if hidden {
            model.hidden_states(batch)
        } else {
            model.forward(batch)
        }
    })
}

/// The `…ForSequenceClassification` graph of a Llama-shaped family: the
/// decoder (no LM head) with a `score` head on each text's last token, one
/// row of class logits a text.
pub fn decoder_classifier_graph(params: &LlamaParams, request: &GraphRequest) -> Result<GraphIr> {
    let mut decoder = params.transformer(DType::F32);
    decoder.lm_head = None;
    let labels = HfConfig::new(&request.config.model)?.num_labels()?;
    let model = DecoderClassifier {
        decoder,
        score: Linear::new(params.hidden_size, labels, DType::F32, false),
    };
    build_decoder_graph("classifier", &model, request.state_dict.as_ref(), |batch| {
        model.forward(batch)
    })
}

/// A `…ForSequenceClassification` architecture of a Llama-shaped family
/// built by `graph`: a decoder read from Hugging Face names (`model.`
/// stripped, `score` as it is), run over the paged cache like any decoder.
pub fn decoder_classifier_architecture(
    name: &str,
    graph: fn(&GraphRequest) -> Result<GraphIr>,
) -> SupportedArchitecture {
    with_decoder_adapters(
        SupportedArchitecture::new(name, Task::SequenceClassification)
            .with_encodings(Encoding::BFloat16, Encoding::ALL.iter().copied())
            .with_default_weights_format(WeightsFormat::Safetensors)
            .with_config(llama_config)
            .with_graph(graph),
    )
}

/// Llama's classifier graph.
fn llama_classifier_graph(request: &GraphRequest) -> Result<GraphIr> {
    let params = LlamaParams::parse(&HfConfig::new(&request.config.model)?)?.rotated_for(request);
    decoder_classifier_graph(&params, request)
}

/// Llama 3's tokenizer has 128,256 tokens; its models (3.1 and later) write
/// tool calls as JSON objects (vLLM's `llama3_json`). Other Llama-shaped
/// models (SmolLM2, Llama 2) name no format.
fn llama_serving(request: &ServingRequest) -> Result<ServingDefaults> {
    let vocab = HfConfig::new(&request.config.model)?.u32("vocab_size")?;
    Ok(match vocab {
        128_256 => ServingDefaults::with_tool_call_parser("llama3_json"),
        _ => ServingDefaults::default(),
    })
}

/// A text-generation architecture `name` (alias `alias`) as this family
/// and its variants declare one: weights computed in bf16 by default, every
/// encoding accepted, safetensors checkpoints by default. Config, graph and
/// weight adapters are the caller's.
pub fn decoder_architecture(name: &str, alias: &str) -> SupportedArchitecture {
    SupportedArchitecture::new(name, Task::TextGeneration)
        .with_aliases([alias])
        .with_encodings(Encoding::BFloat16, Encoding::ALL.iter().copied())
        .with_default_weights_format(WeightsFormat::Safetensors)
}

/// The plugin: the family's architectures and their descriptors.
pub fn plugin() -> Plugin {
    let variant = |name: &str, alias: &str, graph: fn(&GraphRequest) -> Result<GraphIr>| {
        with_decoder_adapters(
            decoder_architecture(name, alias)
                .with_config(llama_config)
                .with_graph(graph),
        )
    };
    // Llama and Mistral run as embedding models too (e5-mistral, ...).
    let base =
        |name: &str, alias: &str| variant(name, alias, llama_graph).converts_to([Task::Embeddings]);
    Plugin::new("llama", env!("CARGO_PKG_VERSION"))
        .with_architecture(
            base("LlamaForCausalLM", "llama")
                .with_example_repo_ids([
                    "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "meta-llama/Llama-3.2-1B-Instruct",
                ])
                .with_serving_defaults(llama_serving),
        )
        .with_architecture(
            base("MistralForCausalLM", "mistral")
                .with_example_repo_ids(["mistralai/Mistral-7B-Instruct-v0.3"])
                .with_serving_defaults(|_| Ok(ServingDefaults::with_tool_call_parser("mistral"))),
        )
        .with_architecture(with_starcoder2_adapters(
            decoder_architecture("Starcoder2ForCausalLM", "starcoder2")
                .with_example_repo_ids(["bigcode/starcoder2-3b"])
                .with_config(|r| variant_config(r, Activation::GeluTanh))
                .with_graph(starcoder2_graph),
        ))
        .with_architecture(
            variant("GraniteForCausalLM", "granite", granite_graph)
                .with_example_repo_ids(["ibm-granite/granite-3.3-2b-instruct"]),
        )
        .with_architecture(
            variant("SmolLM3ForCausalLM", "smollm3", smollm3_graph)
                .with_example_repo_ids(["HuggingFaceTB/SmolLM3-3B"]),
        )
        .with_architecture(
            variant("Olmo2ForCausalLM", "olmo2", olmo2_graph)
                .with_example_repo_ids(["allenai/OLMo-2-0425-1B-Instruct"]),
        )
        .with_architecture(with_gpt_neox_adapters(
            decoder_architecture("GPTNeoXForCausalLM", "gpt_neox")
                .with_example_repo_ids(["EleutherAI/pythia-160m"])
                .with_config(|r| {
                    let hf_config = gpt_neox_config(&r.hf_config);
                    variant_config(
                        &ConfigRequest {
                            hf_config,
                            ..r.clone()
                        },
                        Activation::Gelu,
                    )
                })
                .with_graph(gpt_neox_graph),
        ))
        .with_architecture(with_moe_adapters(
            decoder_architecture("MixtralForCausalLM", "mixtral")
                .with_config(llama_config)
                .with_graph(mixtral_graph)
                .with_example_repo_ids(["mistralai/Mixtral-8x7B-Instruct-v0.1"])
                .with_serving_defaults(|_| Ok(ServingDefaults::with_tool_call_parser("mistral"))),
        ))
        .with_architecture(decoder_classifier_architecture(
            "LlamaForSequenceClassification",
            llama_classifier_graph,
        ))
        .with_architecture(decoder_classifier_architecture(
            "MistralForSequenceClassification",
            llama_classifier_graph,
        ))
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smollm2() -> serde_json::Value {
        json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "max_position_embeddings": 8192, "vocab_size": 49152, "rms_norm_eps": 1e-5,
            "rope_theta": 100000, "tie_word_embeddings": true, "hidden_act": "silu"
        })
    }

    #[test]
    fn parses_smollm2_config() {
        let request = ConfigRequest {
            hf_config: smollm2(),
            max_length: Some(4096),
        };
        let config = llama_config(&request).unwrap();
        assert_eq!(config.max_seq_len, 4096);
        assert_eq!(
            (
                config.kv.num_layers,
                config.kv.num_kv_heads,
                config.kv.head_dim
            ),
            (30, 3, 64)
        );
    }

    #[test]
    fn builds_the_smollm2_graph_with_hugging_face_names() {
        let request = ConfigRequest {
            hf_config: smollm2(),
            max_length: None,
        };
        let config = llama_config(&request).unwrap();
        let ir = llama_graph(&GraphRequest {
            config,
            weights_format: None,
            state_dict: None,
            task: None,
        })
        .unwrap();
        let names: Vec<&str> = ir.weights.iter().map(|w| w.name.as_str()).collect();
        assert!(names.contains(&"embed_tokens.weight"));
        assert!(names.contains(&"layers.29.mlp.down_proj.weight"));
        assert!(
            !names.iter().any(|n| n.starts_with("lm_head")),
            "tied embeddings"
        );
        // 30 layers × 9 weights + embeddings + final norm.
        assert_eq!(ir.weights.len(), 30 * 9 + 2);
    }

    #[test]
    fn rejects_unsupported_activations() {
        let mut config = smollm2();
        config["hidden_act"] = json!("gelu");
        let error = llama_config(&ConfigRequest {
            hf_config: config,
            max_length: None,
        })
        .unwrap_err();
        assert!(error.to_string().contains("hidden_act `gelu`"), "{error}");
    }

    #[test]
    fn plugin_is_valid() {
        plugin().validate().unwrap();
    }
}
