//! OLMo 2, as a variant of the Llama decoder: norms after each branch
//! instead of before it (`h = x + norm(attn(x))`, `out = h + norm(mlp(h))`:
//! the layer's wiring replaced), and RMS norms of the whole query and key
//! projections before the heads are split (the attention's q/k norms
//! replaced by wider ones).

use kiln_plugin_api::graph::{DType, GraphIr, RaggedBatch, TensorValue};
use kiln_plugin_api::nn::{
    build_decoder_graph, AttentionWithRope, Decoder, DecoderLayer, Layer, Mlp, Module, Norm,
    Registry, RmsNorm,
};
use kiln_plugin_api::{GraphRequest, HfConfig, Result};

use crate::LlamaParams;

/// A layer with its norms after attention and after the MLP.
struct PostNorms {
    self_attn: AttentionWithRope,
    post_attention_layernorm: Norm,
    mlp: Mlp,
    post_feedforward_layernorm: Norm,
}

impl Module for PostNorms {
    fn visit(&self, registry: &mut Registry<'_>) {
        registry.module("self_attn", &self.self_attn);
        registry.module("post_attention_layernorm", &self.post_attention_layernorm);
        registry.module("mlp", &self.mlp);
        registry.module(
            "post_feedforward_layernorm",
            &self.post_feedforward_layernorm,
        );
    }
}

impl DecoderLayer for PostNorms {
    fn forward(&self, x: &TensorValue, batch: &RaggedBatch) -> TensorValue {
        let attended = self.self_attn.forward(x, batch);
        let h = x + &self.post_attention_layernorm.forward(&attended);
        &h + &self
            .post_feedforward_layernorm
            .forward(&self.mlp.forward(&h))
    }
}

/// The OLMo 2 graph.
pub fn olmo2_graph(request: &GraphRequest) -> Result<GraphIr> {
    let params = LlamaParams::parse(&HfConfig::new(&request.config.model)?)?;
    let eps = params.rms_norm_eps;
    let norm = |width: u64| RmsNorm::new(width, DType::F32, eps);
    let model = params.transformer(DType::F32);
    let decoder = Decoder::from_blocks(model, |_, block| {
        let mut self_attn = block.self_attn;
        self_attn.q_norm = Some(norm(params.num_heads * params.head_dim));
        self_attn.k_norm = Some(norm(params.num_kv_heads * params.head_dim));
        Box::new(PostNorms {
            self_attn,
            post_attention_layernorm: block.post_attention_layernorm,
            mlp: block.mlp,
            post_feedforward_layernorm: Norm::Rms(norm(params.hidden_size)),
        })
    });
    build_decoder_graph("olmo2", &decoder, request.state_dict.as_ref(), |batch| {
        decoder.forward(batch)
    })
}
