//! StarCoder2, as a variant of the Llama decoder: LayerNorms (with biases),
//! biases on every projection, and a plain MLP (`c_fc` → GELU-tanh →
//! `c_proj`) instead of the gated one. Rotary, grouped-query attention and
//! the sliding window are Llama's; only those blocks are replaced.

use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{build_decoder_graph, Activation, LayerNorm, Mlp, Norm};
use kiln_plugin_api::{
    adapters, GraphRequest, HfConfig, Result, SupportedArchitecture, WeightsFormat,
};

use crate::{split_activation, LlamaParams};

/// The StarCoder2 graph: Llama's modules with the norms and the MLP replaced.
pub fn starcoder2_graph(request: &GraphRequest) -> Result<GraphIr> {
    let hf = HfConfig::new(&request.config.model)?;
    let (llama, activation) = split_activation(&request.config.model, Activation::GeluTanh)?;
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
