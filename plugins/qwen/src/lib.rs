//! Built-in plugin: the Qwen family, reusing the Llama family's pieces and
//! overriding only what differs: Qwen2 has q/k/v biases (no output bias),
//! Qwen3 has per-head q/k RMSNorms and a head size independent of the width.

use kiln_arch_llama::{
    decoder_architecture, decoder_graph, llama_config, with_decoder_adapters, LlamaParams,
};
use kiln_plugin_api::graph::GraphIr;
use kiln_plugin_api::{GraphRequest, HfConfig, Plugin, Result, ServingDefaults};

/// Qwen2: Llama with biases on the q, k and v projections.
pub fn qwen2_graph(request: &GraphRequest) -> Result<GraphIr> {
    let mut params = LlamaParams::parse(&HfConfig::new(&request.config.model)?)?;
    params.qkv_bias = true;
    params.o_bias = false;
    // `sliding_window` is only in effect with `use_sliding_window`.
    let hf = HfConfig::new(&request.config.model)?;
    if !hf.opt_bool("use_sliding_window")?.unwrap_or(false) {
        params.sliding_window = None;
    }
    decoder_graph(&params, request)
}

/// Qwen3: Llama with per-head RMSNorm of queries and keys.
pub fn qwen3_graph(request: &GraphRequest) -> Result<GraphIr> {
    let mut params = LlamaParams::parse(&HfConfig::new(&request.config.model)?)?;
    params.qk_norm = true;
    let hf = HfConfig::new(&request.config.model)?;
    if !hf.opt_bool("use_sliding_window")?.unwrap_or(false) {
        params.sliding_window = None;
    }
    decoder_graph(&params, request)
}

/// The plugin: Qwen2 and Qwen3.
pub fn plugin() -> Plugin {
    let base = |name: &str, alias: &str| {
        let arch = decoder_architecture(name, alias)
            .with_config(llama_config)
            // Qwen2.5 and Qwen3 write `<tool_call>` JSON blocks.
            .with_serving_defaults(|_| Ok(ServingDefaults::with_tool_call_parser("hermes")));
        with_decoder_adapters(arch)
    };
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
