//! Built-in plugin: the Qwen family, reusing the Llama family's pieces and
//! overriding only what differs: Qwen2 has q/k/v biases (no output bias),
//! Qwen3 has per-head q/k RMSNorms and a head size independent of the width.
//! Their mixture-of-experts variants (`moe.rs`) replace the MLPs.

use kiln_arch_llama::{
    decoder_architecture, decoder_classifier_architecture, decoder_classifier_graph, decoder_graph,
    llama_config, with_decoder_adapters, with_moe_adapters, LlamaParams,
};
use kiln_plugin_api::graph::GraphIr;
use kiln_plugin_api::{GraphRequest, HfConfig, Plugin, Result, ServingDefaults, Task};

mod moe;

pub use moe::{qwen2_moe_graph, qwen3_moe_graph};

/// The Llama parameters of a Qwen config: `sliding_window` is only in
/// effect with `use_sliding_window`.
pub fn qwen_params(hf: &HfConfig<'_>) -> Result<LlamaParams> {
    let mut params = LlamaParams::parse(hf)?;
    if !hf.opt_bool("use_sliding_window")?.unwrap_or(false) {
        params.sliding_window = None;
    }
    Ok(params)
}

/// Qwen2's parameters: Llama with biases on the q, k and v projections.
fn qwen2_params(request: &GraphRequest) -> Result<LlamaParams> {
    let mut params = qwen_params(&HfConfig::new(&request.config.model)?)?;
    params.qkv_bias = true;
    params.o_bias = false;
    Ok(params)
}

/// Qwen3's parameters: Llama with per-head RMSNorm of queries and keys.
fn qwen3_params(request: &GraphRequest) -> Result<LlamaParams> {
    let mut params = qwen_params(&HfConfig::new(&request.config.model)?)?;
    params.qk_norm = true;
    Ok(params)
}

/// Qwen2's graph.
pub fn qwen2_graph(request: &GraphRequest) -> Result<GraphIr> {
    decoder_graph(&qwen2_params(request)?, request)
}

/// Qwen3's graph.
pub fn qwen3_graph(request: &GraphRequest) -> Result<GraphIr> {
    decoder_graph(&qwen3_params(request)?, request)
}

/// Qwen2's sequence classifier.
fn qwen2_classifier_graph(request: &GraphRequest) -> Result<GraphIr> {
    decoder_classifier_graph(&qwen2_params(request)?, request)
}

/// Qwen3's sequence classifier (Qwen3-Reranker converted to one).
fn qwen3_classifier_graph(request: &GraphRequest) -> Result<GraphIr> {
    decoder_classifier_graph(&qwen3_params(request)?, request)
}

/// The plugin: Qwen2, Qwen3 and their mixture-of-experts variants.
pub fn plugin() -> Plugin {
    let declared = |name: &str, alias: &str| {
        decoder_architecture(name, alias)
            .with_config(llama_config)
            // Qwen2.5 and Qwen3 write `<tool_call>` JSON blocks.
            .with_serving_defaults(|_| Ok(ServingDefaults::with_tool_call_parser("hermes")))
    };
    // Qwen2 and Qwen3 also run as embedding models (gte-Qwen2,
    // Qwen3-Embedding: the final hidden state of the last token).
    let base = |name: &str, alias: &str| {
        with_decoder_adapters(declared(name, alias)).converts_to([Task::Embeddings])
    };
    let moe = |name: &str, alias: &str| with_moe_adapters(declared(name, alias));
    Plugin::new("qwen", env!("CARGO_PKG_VERSION"))
        .with_architecture(
            base("Qwen2ForCausalLM", "qwen2")
                .with_graph(qwen2_graph)
                .with_example_repo_ids([
                    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
                    "Qwen/Qwen2.5-0.5B-Instruct",
                ]),
        )
        .with_architecture(
            base("Qwen3ForCausalLM", "qwen3")
                .with_graph(qwen3_graph)
                .with_example_repo_ids(["Qwen/Qwen3-0.6B"]),
        )
        .with_architecture(
            moe("Qwen2MoeForCausalLM", "qwen2moe")
                .with_graph(qwen2_moe_graph)
                .with_example_repo_ids(["Qwen/Qwen1.5-MoE-A2.7B-Chat"]),
        )
        .with_architecture(
            moe("Qwen3MoeForCausalLM", "qwen3moe")
                .with_graph(qwen3_moe_graph)
                .with_example_repo_ids(["Qwen/Qwen3-30B-A3B"]),
        )
        .with_architecture(decoder_classifier_architecture(
            "Qwen2ForSequenceClassification",
            qwen2_classifier_graph,
        ))
        .with_architecture(decoder_classifier_architecture(
            "Qwen3ForSequenceClassification",
            qwen3_classifier_graph,
        ))
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_plugin_api::ConfigRequest;
    use serde_json::json;

    #[test]
    fn qwen3_has_qk_norms_and_its_own_head_dim() {
        let hf_config = json!({
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
            "max_position_embeddings": 128, "vocab_size": 50, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "tie_word_embeddings": true
        });
        let config = llama_config(&ConfigRequest {
            hf_config,
            max_length: None,
        })
        .unwrap();
        assert_eq!(config.kv.head_dim, 32);
        let ir = qwen3_graph(&GraphRequest {
            config,
            weights_format: None,
            state_dict: None,
            task: None,
        })
        .unwrap();
        let names: Vec<&str> = ir.weights.iter().map(|w| w.name.as_str()).collect();
        assert!(
            names.contains(&"layers.0.self_attn.q_norm.weight"),
            "{names:?}"
        );
        let q = ir
            .weights
            .iter()
            .find(|w| w.name == "layers.0.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(q.shape, [128, 64]);
    }

    #[test]
    fn plugin_is_valid() {
        plugin().validate().unwrap();
    }
}
