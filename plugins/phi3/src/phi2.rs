//! Phi-2 (`PhiForCausalLM`), as a variant of the Llama decoder: attention
//! and the MLP in parallel on one LayerNorm (the wiring replaced by
//! [`ParallelBlock`]), rotary on part of each head (`partial_rotary_factor`),
//! biases everywhere including the LM head, a plain GELU MLP (`fc1`/`fc2`)
//! and a LayerNorm at the end. `qk_layernorm` (LayerNorms per head, in no
//! released checkpoint) is refused.

use kiln_arch_llama::{partial_rotary_factor, split_activation, LlamaParams};
use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{
    build_decoder_graph, Activation, Decoder, LayerNorm, Linear, Mlp, Norm, ParallelBlock,
};
use kiln_plugin_api::{
    adapters, Error, GraphRequest, HfConfig, Result, SupportedArchitecture, WeightsFormat,
};

/// The Phi-2 graph.
pub fn phi2_graph(request: &GraphRequest) -> Result<GraphIr> {
    let config = &request.config.model;
    let hf = HfConfig::new(config)?;
    if hf.opt_bool("qk_layernorm")?.unwrap_or(false) {
        return Err(Error::unsupported(
            "Phi with qk_layernorm (LayerNorms of each query and key head) is not supported",
        ));
    }
    let (llama, activation) = split_activation(config, Activation::GeluTanh)?;
    let mut params = LlamaParams::parse(&HfConfig::new(&llama)?)?;
    (params.qkv_bias, params.o_bias) = (true, true);
    params.rope.head_dim = (params.head_dim as f64 * partial_rotary_factor(config, 0.5)) as u64;
    let eps = hf.opt_f64("layer_norm_eps")?.unwrap_or(1e-5) as f32;
    let (width, inner) = (params.hidden_size, params.intermediate_size);
    let norm = || Norm::Layer(LayerNorm::new(width, DType::F32, eps, true));
    let mut model = params.transformer(DType::F32);
    model.norm = norm();
    if model.lm_head.is_some() {
        model.lm_head = Some(Linear::new(width, params.vocab_size, DType::F32, true));
    }
    let decoder = Decoder::from_blocks(model, |_, block| {
        let mlp = Mlp::plain(width, inner, DType::F32, activation, true);
        Box::new(ParallelBlock::new(norm(), block.self_attn, mlp))
    });
    build_decoder_graph("phi2", &decoder, request.state_dict.as_ref(), |batch| {
        decoder.forward(batch)
    })
}

/// Hugging Face names: `self_attn.dense` is the output projection,
/// `mlp.fc1`/`mlp.fc2` the up and down projections, `final_layernorm` the
/// last norm. GGUF: llama.cpp's decoder names (`phi2`, Q/K not permuted).
pub fn with_phi2_adapters(arch: SupportedArchitecture) -> SupportedArchitecture {
    arch.with_weight_adapter(WeightsFormat::Safetensors, |r| {
        Ok(adapters::rename(r, |name| {
            adapters::hf_decoder_name(name).map(|n| {
                n.replace(".self_attn.dense.", ".self_attn.o_proj.")
                    .replace(".mlp.fc1.", ".mlp.up_proj.")
                    .replace(".mlp.fc2.", ".mlp.down_proj.")
                    .replace("final_layernorm.", "norm.")
            })
        }))
    })
    .with_weight_adapter(WeightsFormat::Gguf, |r| {
        Ok(adapters::rename(r, adapters::gguf_decoder_name))
    })
}
