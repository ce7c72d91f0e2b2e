//! `{{arch}}`: a Llama variant that changes one block, the MLP's activation,
//! which follows the config's `hidden_act` (`gelu_pytorch_tanh`, `gelu`,
//! `relu` or `silu`). Everything else (config parsing, checkpoint names,
//! rotary, attention, norms) is the built-in Llama family's, and so are the
//! helpers that read a config whose activation is not SiLU. Scaffolded by
//! `host new-plugin {{crate}} --from llama`; change `replace_block` to change
//! another piece.

use kiln_arch_llama::{split_activation, variant_config, with_decoder_adapters, LlamaParams};
use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{build_decoder_graph, Activation, Transformer};
use kiln_plugin_api::{Encoding, GraphRequest, HfConfig, Plugin, Result, SupportedArchitecture, Task};

/// The one block this variant replaces.
fn replace_block(model: &mut Transformer, activation: Activation) {
    for layer in &mut model.layers {
        layer.mlp.activation = activation;
    }
}

fn graph(request: &GraphRequest) -> Result<GraphIr> {
    let (llama, activation) = split_activation(&request.config.model, Activation::Silu)?;
    let mut model = LlamaParams::parse(&HfConfig::new(&llama)?)?.transformer(DType::F32);
    replace_block(&mut model, activation);
    build_decoder_graph("{{crate}}", &model, request.state_dict.as_ref(), |batch| {
        model.forward(batch)
    })
}

fn plugin() -> Plugin {
    let arch = SupportedArchitecture::new("{{arch}}", Task::TextGeneration)
        .with_encodings(Encoding::Float32, [Encoding::Float32, Encoding::BFloat16])
        .with_config(|request| variant_config(request, Activation::Silu))
        .with_graph(graph);
    Plugin::new("{{crate}}", env!("CARGO_PKG_VERSION")).with_architecture(with_decoder_adapters(arch))
}

kiln_plugin_api::export_plugin!(plugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mlp_activation_follows_hidden_act() {
        let hf_config = serde_json::json!({
            "architectures": ["{{arch}}"], "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64, "vocab_size": 96, "hidden_act": "gelu_pytorch_tanh"
        });
        let request = kiln_plugin_api::ConfigRequest { hf_config, max_length: None };
        let config = variant_config(&request, Activation::Silu).unwrap();
        let ir = graph(&GraphRequest { config, weights_format: None, state_dict: None, task: None }).unwrap();
        let listing = ir.to_string();
        assert!(listing.contains("gelu"), "{listing}");
        assert!(!listing.contains("silu"), "{listing}");
    }
}
