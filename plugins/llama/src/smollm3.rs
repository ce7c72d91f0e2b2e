//! SmolLM3, as a variant of the Llama decoder: layers whose
//! `no_rope_layers` entry is 0 (every fourth by default) attend without
//! rotary embeddings, and with `use_sliding_window` only those layers attend
//! through the window (`layer_types`). One piece replaced: those layers'
//! rotary embedding.

use kiln_plugin_api::graph::{DType, GraphIr};
use kiln_plugin_api::nn::{build_decoder_graph, RotaryEmbedding};
use kiln_plugin_api::{Error, GraphRequest, HfConfig, Result};
use serde_json::Value;

use crate::LlamaParams;

/// The SmolLM3 graph.
pub fn smollm3_graph(request: &GraphRequest) -> Result<GraphIr> {
    let config = &request.config.model;
    let hf = HfConfig::new(config)?;
    let mut params = LlamaParams::parse(&hf)?.rotated_for(request);
    params.tie_word_embeddings = hf.opt_bool("tie_word_embeddings")?.unwrap_or(true);
    let window = params.sliding_window.take();
    let layers = params.num_layers as usize;
    let list = |key: &str| config.get(key).and_then(Value::as_array);
    let with_rope: Vec<bool> = match list("no_rope_layers") {
        Some(flags) => flags.iter().map(|f| f.as_u64() != Some(0)).collect(),
        None => {
            let interval = hf.opt_u32("no_rope_layer_interval")?.unwrap_or(4).max(1) as usize;
            (0..layers).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    let sliding: Vec<bool> = match list("layer_types") {
        Some(types) => types
            .iter()
            .map(|t| t.as_str() == Some("sliding_attention"))
            .collect(),
        None => vec![false; layers],
    };
    if with_rope.len() != layers || sliding.len() != layers {
        return Err(Error::invalid(format!(
            "no_rope_layers and layer_types need one entry per layer ({layers})"
        )));
    }
    let mut model = params.transformer(DType::F32);
    for (i, layer) in model.layers.iter_mut().enumerate() {
        if !with_rope[i] {
            layer.self_attn.rope = RotaryEmbedding::new(0, params.rope.theta);
        }
        layer.self_attn.config.sliding_window = window.filter(|_| sliding[i]);
    }
    build_decoder_graph("smollm3", &model, request.state_dict.as_ref(), |batch| {
        model.forward(batch)
    })
}
