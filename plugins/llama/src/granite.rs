//! Granite, as a variant of the Llama decoder: the same modules, with four
//! multipliers: the embeddings are scaled (`embedding_multiplier`), each
//! residual branch is scaled before it is added (`residual_multiplier`, the
//! one piece replaced: the layer's wiring), attention scores use
//! `attention_multiplier` instead of `1/sqrt(head_dim)`, and the logits are
//! divided by `logits_scaling`.

use kiln_plugin_api::graph::{DType, GraphIr, RaggedBatch, TensorValue};
use kiln_plugin_api::nn::{
    build_decoder_graph, Decoder, DecoderLayer, Layer, Module, Registry, TransformerBlock,
};
use kiln_plugin_api::{GraphRequest, HfConfig, Result};

use crate::LlamaParams;

/// Llama's block with each branch scaled before the residual add.
struct ScaledResidual {
    block: TransformerBlock,
    multiplier: f64,
}

impl Module for ScaledResidual {
    fn visit(&self, registry: &mut Registry<'_>) {
        self.block.visit(registry);
    }
}

impl DecoderLayer for ScaledResidual {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let b = &self.block;
        let attended = b.self_attn.forward(&b.input_layernorm.forward(x), batch);
        let h = x + &(&attended * self.multiplier);
        let out = b.mlp.forward(&b.post_attention_layernorm.forward(&h));
        &h + &(&out * self.multiplier)
    }
}

/// The Granite graph.
pub fn granite_graph(request: &GraphRequest) -> Result<GraphIr> {
    let hf = HfConfig::new(&request.config.model)?;
    let params = LlamaParams::parse(&hf)?.rotated_for(request);
    let mut model = params.transformer(DType::F32);
    let attention = hf.opt_f64("attention_multiplier")?.unwrap_or(1.0) as f32;
    for layer in &mut model.layers {
        layer.self_attn.config.scale = Some(attention);
    }
    let residual = hf.opt_f64("residual_multiplier")?.unwrap_or(1.0);
    let mut decoder = Decoder::from_blocks(model, |_, block| {
        Box::new(ScaledResidual {
            block,
            multiplier: residual,
        })
    });
    decoder.embedding_scale = Some(hf.opt_f64("embedding_multiplier")?.unwrap_or(1.0) as f32);
    decoder.logit_scale = Some((1.0 / hf.opt_f64("logits_scaling")?.unwrap_or(1.0)) as f32);
    build_decoder_graph("granite", &decoder, request.state_dict.as_ref(), |batch| {
        decoder.forward(batch)
    })
}
