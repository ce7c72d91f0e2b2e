//! StarCoder2, as a variant of the Llama decoder: LayerNorms (with biases),
//! biases on every projection, and a plain MLP (`c_fc` → GELU-tanh →
//! `c_proj`) instead of the gated one. Rotary, grouped-query attention and
//! the sliding window are Llama's; only those blocks are replaced.

use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{build_decoder_graph, Activation, LayerNorm, Mlp, Norm};
use kiln_plugin_api::{
    adapters, ArchConfig, ConfigRequest, Error, GraphRequest, HfConfig, Result,
    SupportedArchitecture, WeightsFormat,
};
use serde_json::Value;

use crate::{llama_config, LlamaParams};

/// The config without `hidden_act` (which Llama's parser limits to SiLU),
/// and the activation it names.
fn split_activation(config: &Value) -> Result<(Value, Activation)> {
    let mut llama = config.clone();
    let name = llama.as_object_mut().and_then(|c| c.remove("hidden_act"));
    let activation = match name.as_ref().and_then(Value::as_str) {
        None | Some("gelu_pytorch_tanh" | "gelu_new") => Activation::GeluTanh,
        Some("gelu") => Activation::Gelu,
        Some(other) => {
            return Err(Error::invalid(format!(
                "hidden_act `{other}` is not supported (expected gelu_pytorch_tanh or gelu)"
            )))
        }
    };
    Ok((llama, activation))
}

/// Parses a StarCoder2 `config.json`.
pub fn starcoder2_config(request: &ConfigRequest) -> Result<ArchConfig> {
    let (hf_config, _) = split_activation(&request.hf_config)?;
    let mut config = llama_config(&ConfigRequest {
        hf_config,
        ..request.clone()
    })?;
    config.model = request.hf_config.clone();
    Ok(config)
}

/// The StarCoder2 graph: Llama's modules with the norms and the MLP replaced.
pub fn starcoder2_graph(request: &GraphRequest) -> Result<GraphIr> {
    let hf = HfConfig::new(&request.config.model)?;
    let (llama, activation) = split_activation(&request.config.model)?;
    let mut params = LlamaParams::parse(&HfConfig::new(&llama)?)?;
    let bias = hf.opt_bool("use_bias")?.unwrap_or(true);
    (params.qkv_bias, params.o_bias) = (bias, bias);
    params.tie_word_embeddings = hf.opt_bool("tie_word_embeddings")?.unwrap_or(true);
    let eps = hf.opt_f64("norm_epsilon")?.unwrap_or(1e-5) as f32;
    let width = params.hidden_size;
    let norm = || Norm::Layer(LayerNorm::new(width, DType::F32, eps, bias));
    let mut model = params.transformer(DType::F32);
    for layer in &mut model.layers {
        layer.input_layernorm = norm();
        layer.post_attention_layernorm = norm();
        layer.mlp = Mlp::plain(
            width,
            params.intermediate_size,
            DType::F32,
            activation,
            bias,
        );
    }
    model.norm = norm();
    build_decoder_graph("starcoder2", &model, request.state_dict.as_ref(), |batch| {
        model.forward(batch)
    })
}

/// Hugging Face names (`mlp.c_fc`/`mlp.c_proj` are the MLP's up and down
/// projections) and llama.cpp's `starcoder2` names.
pub fn with_starcoder2_adapters(arch: SupportedArchitecture) -> SupportedArchitecture {
    arch.with_weight_adapter(WeightsFormat::Safetensors, |r| {
        Ok(adapters::rename(r, |name| {
            adapters::hf_decoder_name(name).map(|n| {
                n.replace(".mlp.c_fc.", ".mlp.up_proj.")
                    .replace(".mlp.c_proj.", ".mlp.down_proj.")
            })
        }))
    })
    .with_weight_adapter(WeightsFormat::Gguf, |r| {
        Ok(adapters::rename(r, adapters::gguf_decoder_name))
    })
}
