//! Built-in plugin: the Llama family.
//!
//! Registers `LlamaForCausalLM` and `MistralForCausalLM` (GGUF names `llama`
//! and `mistral`). The config entry point is implemented; weight adaptation,
//! graph building and the pipeline arrive with the built-in architectures
//! (the host reports them as unsupported until then).

use kiln_plugin_api::{
    ArchConfig, ConfigRequest, Encoding, HfConfig, Plugin, Result, SupportedArchitecture, Task,
    WeightsFormat,
};

/// Every encoding the Llama family is meant to run.
const ENCODINGS: [Encoding; 13] = [
    Encoding::Float32,
    Encoding::Float16,
    Encoding::BFloat16,
    Encoding::Q8_0,
    Encoding::Q4_0,
    Encoding::Q4_1,
    Encoding::Q5_0,
    Encoding::Q5_1,
    Encoding::Q2K,
    Encoding::Q3K,
    Encoding::Q4K,
    Encoding::Q5K,
    Encoding::Q6K,
];

/// Parses a Llama-style `config.json`: KV shape, sequence limit, and the
/// sliding window where the model has one (Mistral).
pub fn llama_config(request: &ConfigRequest) -> Result<ArchConfig> {
    let config = HfConfig::new(&request.hf_config)?;
    Ok(ArchConfig {
        max_seq_len: config.max_seq_len(request.max_length)?,
        kv: config.decoder_kv_params()?,
        model: request.hf_config.clone(),
    })
}

/// The plugin: the family's architectures and their descriptors.
pub fn plugin() -> Plugin {
    let base = |name: &str, alias: &str| {
        SupportedArchitecture::new(name, Task::TextGeneration)
            .with_aliases([alias])
            .with_encodings(Encoding::BFloat16, ENCODINGS)
            .with_default_weights_format(WeightsFormat::Safetensors)
            .with_config(llama_config)
    };
    Plugin::new("llama", env!("CARGO_PKG_VERSION"))
        .with_architecture(base("LlamaForCausalLM", "llama").with_example_repo_ids([
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "meta-llama/Llama-3.2-1B-Instruct",
        ]))
        .with_architecture(
            base("MistralForCausalLM", "mistral")
                .with_example_repo_ids(["mistralai/Mistral-7B-Instruct-v0.3"]),
        )
}

kiln_plugin_api::declare_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_smollm2_config() {
        let request = ConfigRequest {
            hf_config: json!({
                "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "max_position_embeddings": 8192
            }),
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
    fn plugin_is_valid() {
        plugin().validate().unwrap();
    }
}
