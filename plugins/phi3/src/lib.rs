//! Built-in plugin: the Phi family on the Llama family's module tree: Phi-3
//! here, and Phi-2 (`phi2.rs`), whose layers run attention and the MLP in
//! parallel.
//!
//! Phi-3 is Llama-shaped (RMSNorm, SiLU-gated MLP, rotate-half rope, an
//! optional sliding window) but its checkpoints fuse q/k/v into
//! `self_attn.qkv_proj` (`[(H + 2·KV)·D, hidden]`) and gate/up into
//! `mlp.gate_up_proj` (`[2·I, hidden]`, gate first). The weight adapters
//! split them onto `q_proj`/`k_proj`/`v_proj` and `gate_proj`/`up_proj` as
//! zero-copy row ranges, for safetensors and for llama.cpp's GGUF names
//! (`attn_qkv`, and `ffn_up` holding gate + up), so the graph is Llama's.
//! Partial rotary embeddings (`partial_rotary_factor`, Phi-4-mini) rotate
//! the first part of each head. LongRoPE (`longrope`/`su`, the 128k-context
//! variants) is refused.

use std::collections::BTreeSet;

use kiln_arch_llama::{
    decoder_architecture, decoder_graph, partial_rotary_factor, variant_config, LlamaParams,
};
use kiln_plugin_api::adapters::{
    self, AdaptRequest, AdaptResponse, AdaptedWeight, CheckpointTensor,
};
use kiln_plugin_api::graph::GraphIr;
use kiln_plugin_api::nn::Activation;
use kiln_plugin_api::{
    ArchConfig, ConfigRequest, Error, GraphRequest, HfConfig, Plugin, Result, WeightsFormat,
};
use serde_json::Value;

mod phi2;

pub use phi2::{phi2_graph, with_phi2_adapters};

/// Refuses what the Llama graph cannot compute for Phi-3: LongRoPE scaling.
fn check_rope(raw: &Value) -> Result<()> {
    for key in ["rope_parameters", "rope_scaling"] {
        let Some(params) = raw.get(key).filter(|p| p.is_object()) else {
            continue;
        };
        let kind = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        match kind {
            "default" => {}
            // transformers maps Phi-3's legacy `su` and `yarn` onto `longrope`.
            "longrope" | "su" | "yarn" => {
                return Err(Error::unsupported(format!(
                    "Phi-3 rope scaling `{kind}` (LongRoPE, the long-context Phi-3 variants) \
                     is not supported; only the default rotary embedding is"
                )))
            }
            other => {
                return Err(Error::unsupported(format!(
                    "Phi-3 rope scaling `{other}` is not supported; only the default rotary \
                     embedding is"
                )))
            }
        }
    }
    Ok(())
}

/// Phi-3's hyper-parameters, as the Llama family's; rotary on part of each
/// head with `partial_rotary_factor` (Phi-4-mini: 0.75).
pub fn phi3_params(raw: &Value) -> Result<LlamaParams> {
    check_rope(raw)?;
    let mut params = LlamaParams::parse(&HfConfig::new(raw)?)?;
    let factor = partial_rotary_factor(raw, 1.0);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(Error::invalid(format!(
            "partial_rotary_factor {factor} is not in (0, 1]"
        )));
    }
    params.rope.head_dim = (params.head_dim as f64 * factor) as u64;
    // Phi-3 has no biases, and llama.cpp does not permute its Q/K rows (its
    // rope is NeoX-style), so GGUF weights rotate halves too.
    params.qkv_bias = false;
    params.o_bias = false;
    params.mlp_bias = false;
    params.rope.interleaved = false;
    Ok(params)
}

/// Parses the config: KV shape and sequence limit (and checks the rest).
pub fn phi3_config(request: &ConfigRequest) -> Result<ArchConfig> {
    let config = HfConfig::new(&request.hf_config)?;
    phi3_params(&request.hf_config)?;
    Ok(ArchConfig {
        max_seq_len: config.max_seq_len(request.max_length)?,
        kv: config.decoder_kv_params()?,
        model: request.hf_config.clone(),
    })
}

/// The Phi-3 graph: the Llama decoder over the split projections.
pub fn phi3_graph(request: &GraphRequest) -> Result<GraphIr> {
    decoder_graph(&phi3_params(&request.config.model)?, request)
}

/// The sizes that split the fused projections.
struct FusedRows {
    /// Query rows `H·D`.
    q: u64,
    /// Key (and value) rows `KV·D`.
    kv: u64,
    /// MLP width `I`.
    intermediate: u64,
}

impl FusedRows {
    fn of(config: &Value) -> Result<Self> {
        let params = phi3_params(config)?;
        Ok(Self {
            q: params.num_heads * params.head_dim,
            kv: params.num_kv_heads * params.head_dim,
            intermediate: params.intermediate_size,
        })
    }

    /// The module weights of `tensor`, named `name` on the Llama tree, with
    /// the fused `…qkv_proj.*` and `…gate_up_proj.*` split into row ranges.
    fn split(&self, name: String, tensor: &CheckpointTensor) -> Result<Vec<AdaptedWeight>> {
        let (fused, parts): (&str, Vec<(&str, u64)>) = if name.contains(".self_attn.qkv_proj.") {
            (
                "qkv_proj",
                vec![("q_proj", self.q), ("k_proj", self.kv), ("v_proj", self.kv)],
            )
        } else if name.contains(".mlp.gate_up_proj.") {
            (
                "gate_up_proj",
                vec![
                    ("gate_proj", self.intermediate),
                    ("up_proj", self.intermediate),
                ],
            )
        } else {
            return Ok(vec![AdaptedWeight {
                name,
                source: tensor.name.clone(),
                rows: None,
            }]);
        };
        let total: u64 = parts.iter().map(|(_, rows)| rows).sum();
        let rows = tensor.shape.first().copied().unwrap_or(0);
        if rows != total {
            let sizes: Vec<String> = parts.iter().map(|(p, n)| format!("{p} {n}")).collect();
            return Err(Error::invalid(format!(
                "`{}` has {rows} rows, the config implies {total} ({})",
                tensor.name,
                sizes.join(" + ")
            )));
        }
        let mut start = 0;
        Ok(parts
            .into_iter()
            .map(|(part, len)| {
                let weight = AdaptedWeight {
                    name: name.replacen(fused, part, 1),
                    source: tensor.name.clone(),
                    rows: Some((start, start + len)),
                };
                start += len;
                weight
            })
            .collect())
    }
}

/// Renames with `rename`, then splits the fused projections.
fn adapt(request: &AdaptRequest, rename: impl Fn(&str) -> Option<String>) -> Result<AdaptResponse> {
    let rows = FusedRows::of(&request.config)?;
    let mut weights = Vec::new();
    for tensor in &request.tensors {
        if let Some(name) = rename(&tensor.name) {
            weights.extend(rows.split(name, tensor)?);
        }
    }
    Ok(AdaptResponse { weights })
}

/// Hugging Face checkpoints: strip `model.`, split `qkv_proj`/`gate_up_proj`.
pub fn adapt_safetensors(request: &AdaptRequest) -> Result<AdaptResponse> {
    adapt(request, adapters::hf_decoder_name)
}

/// llama.cpp's names: `attn_qkv` fused, `ffn_up` holding gate and up (unless
/// the layer has its own `ffn_gate`). Files with LongRoPE factors are refused.
pub fn adapt_gguf(request: &AdaptRequest) -> Result<AdaptResponse> {
    let names: BTreeSet<&str> = request.tensors.iter().map(|t| t.name.as_str()).collect();
    if let Some(factors) = names.iter().find(|n| n.starts_with("rope_factors_")) {
        return Err(Error::unsupported(format!(
            "this Phi-3 GGUF has LongRoPE factors (`{factors}`): LongRoPE (the long-context \
             Phi-3 variants) is not supported"
        )));
    }
    adapt(request, |name| {
        let mapped = adapters::gguf_decoder_name(name)?;
        let fused_up = name.contains(".ffn_up.")
            && !names.contains(name.replacen(".ffn_up.", ".ffn_gate.", 1).as_str());
        Some(if fused_up {
            mapped.replacen(".mlp.up_proj.", ".mlp.gate_up_proj.", 1)
        } else {
            mapped
        })
    })
}

/// The plugin.
pub fn plugin() -> Plugin {
    Plugin::new("phi3", env!("CARGO_PKG_VERSION"))
        .with_architecture(
            decoder_architecture("Phi3ForCausalLM", "phi3")
                .with_example_repo_ids(["microsoft/Phi-3-mini-4k-instruct"])
                .with_config(phi3_config)
                .with_graph(phi3_graph)
                .with_weight_adapter(WeightsFormat::Safetensors, adapt_safetensors)
                .with_weight_adapter(WeightsFormat::Gguf, adapt_gguf),
        )
        .with_architecture(with_phi2_adapters(
            decoder_architecture("PhiForCausalLM", "phi")
                .with_example_repo_ids(["microsoft/phi-2"])
                .with_config(|r| variant_config(r, Activation::GeluTanh))
                .with_graph(phi2_graph),
        ))
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_plugin_api::Encoding;
    use serde_json::json;

    fn mini() -> Value {
        json!({
            "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "max_position_embeddings": 4096, "vocab_size": 32064, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "rope_scaling": null, "sliding_window": 2047,
            "hidden_act": "silu", "tie_word_embeddings": false
        })
    }

    fn tensor(name: &str, shape: &[u64]) -> CheckpointTensor {
        CheckpointTensor {
            name: name.into(),
            shape: shape.to_vec(),
            storage: "F32".into(),
            encoding: Some(Encoding::Float32),
        }
    }

    fn request(format: WeightsFormat, tensors: Vec<CheckpointTensor>) -> AdaptRequest {
        AdaptRequest {
            format,
            tensors,
            config: mini(),
        }
    }

    /// Module name, source and row range of each adapted weight.
    type Mapping = Vec<(String, String, Option<(u64, u64)>)>;

    fn mapping(response: &AdaptResponse) -> Mapping {
        response
            .weights
            .iter()
            .map(|w| (w.name.clone(), w.source.clone(), w.rows))
            .collect()
    }

    #[test]
    fn splits_hugging_face_fused_projections_into_row_ranges() {
        let response = adapt_safetensors(&request(
            WeightsFormat::Safetensors,
            vec![
                tensor("model.layers.0.self_attn.qkv_proj.weight", &[9216, 3072]),
                tensor("model.layers.0.mlp.gate_up_proj.weight", &[16384, 3072]),
                tensor("model.layers.0.mlp.down_proj.weight", &[3072, 8192]),
            ],
        ))
        .unwrap();
        let qkv = "model.layers.0.self_attn.qkv_proj.weight".to_owned();
        let gate_up = "model.layers.0.mlp.gate_up_proj.weight".to_owned();
        assert_eq!(
            mapping(&response),
            [
                (
                    "layers.0.self_attn.q_proj.weight".into(),
                    qkv.clone(),
                    Some((0, 3072))
                ),
                (
                    "layers.0.self_attn.k_proj.weight".into(),
                    qkv.clone(),
                    Some((3072, 6144))
                ),
                (
                    "layers.0.self_attn.v_proj.weight".into(),
                    qkv,
                    Some((6144, 9216))
                ),
                (
                    "layers.0.mlp.gate_proj.weight".into(),
                    gate_up.clone(),
                    Some((0, 8192))
                ),
                (
                    "layers.0.mlp.up_proj.weight".into(),
                    gate_up,
                    Some((8192, 16384))
                ),
                (
                    "layers.0.mlp.down_proj.weight".into(),
                    "model.layers.0.mlp.down_proj.weight".into(),
                    None
                ),
            ]
        );
    }

    #[test]
    fn splits_gguf_attn_qkv_and_fused_ffn_up() {
        let mut req = request(
            WeightsFormat::Gguf,
            vec![
                tensor("blk.1.attn_qkv.weight", &[9216, 3072]),
                tensor("blk.1.ffn_up.weight", &[16384, 3072]),
                // A layer converted with separate gate and up stays as it is.
                tensor("blk.2.ffn_gate.weight", &[8192, 3072]),
                tensor("blk.2.ffn_up.weight", &[8192, 3072]),
                tensor("output.weight", &[32064, 3072]),
            ],
        );
        let response = adapt_gguf(&req).unwrap();
        let names: Vec<_> = mapping(&response)
            .into_iter()
            .map(|(n, _, rows)| (n, rows))
            .collect();
        assert_eq!(
            names,
            [
                ("layers.1.self_attn.q_proj.weight".into(), Some((0, 3072))),
                (
                    "layers.1.self_attn.k_proj.weight".into(),
                    Some((3072, 6144))
                ),
                (
                    "layers.1.self_attn.v_proj.weight".into(),
                    Some((6144, 9216))
                ),
                ("layers.1.mlp.gate_proj.weight".into(), Some((0, 8192))),
                ("layers.1.mlp.up_proj.weight".into(), Some((8192, 16384))),
                ("layers.2.mlp.gate_proj.weight".into(), None),
                ("layers.2.mlp.up_proj.weight".into(), None),
                ("lm_head.weight".into(), None),
            ]
        );

        req.tensors = vec![tensor("blk.0.attn_qkv.weight", &[9000, 3072])];
        let error = adapt_gguf(&req).unwrap_err().to_string();
        assert!(
            error.contains("has 9000 rows, the config implies 9216"),
            "{error}"
        );
    }

    #[test]
    fn refuses_longrope() {
        let mut config = mini();
        config["rope_scaling"] =
            json!({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]});
        let error = phi3_config(&ConfigRequest {
            hf_config: config,
            max_length: None,
        })
        .unwrap_err()
        .to_string();
        assert!(error.contains("LongRoPE"), "{error}");

        let req = request(
            WeightsFormat::Gguf,
            vec![tensor("rope_factors_long.weight", &[48])],
        );
        let error = adapt_gguf(&req).unwrap_err().to_string();
        assert!(error.contains("LongRoPE"), "{error}");
    }

    #[test]
    fn the_graph_is_llama_with_a_sliding_window() {
        let config = phi3_config(&ConfigRequest {
            hf_config: mini(),
            max_length: None,
        })
        .unwrap();
        assert_eq!(
            phi3_params(&config.model).unwrap().sliding_window,
            Some(2047)
        );
        let ir = phi3_graph(&GraphRequest {
            config,
            weights_format: None,
            state_dict: None,
            task: None,
        })
        .unwrap();
        let names: Vec<&str> = ir.weights.iter().map(|w| w.name.as_str()).collect();
        assert!(names.contains(&"layers.31.self_attn.k_proj.weight"));
        assert!(names.contains(&"layers.31.mlp.gate_proj.weight"));
        assert!(names.contains(&"lm_head.weight"));
    }

    #[test]
    fn plugin_is_valid() {
        plugin().validate().unwrap();
    }
}
