//! Gemma 2 (`Gemma2ForCausalLM`): Gemma 3's modules without the q/k norms
//! and the local rotary base, every other layer sliding (from the first),
//! and attention and final logits soft-capped (50 and 30 unless the config
//! says otherwise). Only the parameters differ: [`GemmaFamily::Gemma2`].

use kiln_plugin_api::graph::GraphIr;
use kiln_plugin_api::{
    adapters, ArchConfig, ConfigRequest, Encoding, GraphRequest, Result, SupportedArchitecture,
    Task, WeightsFormat,
};

use super::{gemma3_gguf_name, gemma_config, gemma_graph, GemmaFamily};

/// Parses a Gemma 2 config.
pub fn gemma2_config(request: &ConfigRequest) -> Result<ArchConfig> {
    gemma_config(request, GemmaFamily::Gemma2)
}

/// The Gemma 2 graph.
pub fn gemma2_graph(request: &GraphRequest) -> Result<GraphIr> {
    gemma_graph(request, GemmaFamily::Gemma2)
}

/// The architecture: Hugging Face checkpoints and llama.cpp's `gemma2` GGUFs.
pub fn architecture() -> SupportedArchitecture {
    SupportedArchitecture::new("Gemma2ForCausalLM", Task::TextGeneration)
        .with_aliases(["gemma2"])
        .with_encodings(Encoding::BFloat16, Encoding::ALL.iter().copied())
        .with_example_repo_ids(["google/gemma-2-2b-it", "google/gemma-2-9b-it"])
        .with_config(gemma2_config)
        .with_graph(gemma2_graph)
        .with_weight_adapter(WeightsFormat::Safetensors, |r| {
            Ok(adapters::rename(r, adapters::hf_decoder_name))
        })
        .with_weight_adapter(WeightsFormat::Gguf, |r| {
            Ok(adapters::rename(r, gemma3_gguf_name))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GemmaParams;
    use kiln_plugin_api::HfConfig;
    use serde_json::{json, Value};

    fn gemma2_2b() -> Value {
        json!({
            "architectures": ["Gemma2ForCausalLM"], "vocab_size": 256000, "hidden_size": 2304,
            "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "query_pre_attn_scalar": 256
        })
    }

    fn parse(raw: &Value) -> GemmaParams {
        GemmaParams::parse(&HfConfig::new(raw).unwrap(), raw, GemmaFamily::Gemma2).unwrap()
    }

    #[test]
    fn defaults_slide_every_other_layer_and_soft_cap() {
        let params = parse(&gemma2_2b());
        assert!(params.sliding.iter().step_by(2).all(|&s| s));
        assert!(params.sliding.iter().skip(1).step_by(2).all(|&s| !s));
        assert_eq!(params.sliding_window, Some(4096));
        assert_eq!(params.attn_softcap, Some(50.0));
        assert_eq!(params.final_softcap, Some(30.0));
        assert_eq!(params.local_rope, params.global_rope);
        assert!(!params.qk_norm);
    }

    #[test]
    fn a_null_soft_cap_is_off() {
        let mut raw = gemma2_2b();
        raw["attn_logit_softcapping"] = Value::Null;
        raw["final_logit_softcapping"] = json!(20.0);
        let params = parse(&raw);
        assert_eq!(params.attn_softcap, None);
        assert_eq!(params.final_softcap, Some(20.0));
    }

    #[test]
    fn the_graph_has_no_qk_norms() {
        let config = gemma2_config(&ConfigRequest {
            hf_config: gemma2_2b(),
            max_length: Some(512),
        })
        .unwrap();
        let ir = gemma2_graph(&GraphRequest {
            config,
            weights_format: None,
            state_dict: None,
            task: None,
        })
        .unwrap();
        assert!(!ir.weights.iter().any(|w| w.name.contains("q_norm")));
        assert!(ir
            .weights
            .iter()
            .any(|w| w.name == "layers.1.post_feedforward_layernorm.weight"));
    }
}
