//! Qwen2-MoE and Qwen3-MoE, as variants of Qwen2 and Qwen3 whose MLPs are
//! mixtures of experts on the layers the config makes sparse: every
//! `decoder_sparse_step`-th layer not in `mlp_only_layers`. Qwen2-MoE adds a
//! shared expert scaled by a sigmoid gate; the picked weights are
//! renormalized when `norm_topk_prob` says so.

use kiln_arch_llama::{expert_counts, moe_decoder_graph, LlamaParams};
use kiln_plugin_api::graph::{DType, GraphIr, MoeSpec};
use kiln_plugin_api::nn::MixtureOfExperts;
use kiln_plugin_api::{Error, GraphRequest, HfConfig, Result};
use serde_json::Value;

use crate::qwen_params;

/// Which layers are sparse, and their mixture.
struct Sparse {
    step: usize,
    dense_layers: Vec<usize>,
    spec: MoeSpec,
    intermediate: u64,
    shared: Option<u64>,
}

impl Sparse {
    fn parse(hf: &HfConfig<'_>, raw: &Value) -> Result<Self> {
        let (experts, top_k) = expert_counts(hf)?;
        let renormalize = hf.opt_bool("norm_topk_prob")?.unwrap_or(false);
        let dense_layers = match raw.get("mlp_only_layers") {
            None | Some(Value::Null) => Vec::new(),
            Some(list) => list
                .as_array()
                .and_then(|l| l.iter().map(|v| v.as_u64().map(|i| i as usize)).collect())
                .ok_or_else(|| Error::invalid("mlp_only_layers must be a list of layer indices"))?,
        };
        let step = hf.opt_u32("decoder_sparse_step")?.unwrap_or(1).max(1) as usize;
        Ok(Self {
            step,
            dense_layers,
            spec: MoeSpec::softmax(experts, top_k, renormalize),
            intermediate: u64::from(hf.u32("moe_intermediate_size")?),
            shared: hf
                .opt_u32("shared_expert_intermediate_size")?
                .map(u64::from),
        })
    }

    /// Layer `i`'s mixture, if it is sparse.
    fn layer(&self, i: usize, params: &LlamaParams) -> Option<MixtureOfExperts> {
        let sparse = (i + 1).is_multiple_of(self.step) && !self.dense_layers.contains(&i);
        sparse.then(|| {
            let moe = MixtureOfExperts::new(
                params.hidden_size,
                self.intermediate,
                DType::F32,
                self.spec.clone(),
            );
            match self.shared {
                Some(width) if width > 0 => moe.with_shared_expert(width, true),
                _ => moe,
            }
        })
    }
}

/// The Qwen2-MoE graph (Qwen2-MoE's q/k/v biases follow `qkv_bias`).
pub fn qwen2_moe_graph(request: &GraphRequest) -> Result<GraphIr> {
    moe_graph("qwen2_moe", request, |params, hf| {
        params.qkv_bias = hf.opt_bool("qkv_bias")?.unwrap_or(true);
        params.o_bias = false;
        Ok(())
    })
}

/// The Qwen3-MoE graph.
pub fn qwen3_moe_graph(request: &GraphRequest) -> Result<GraphIr> {
    moe_graph("qwen3_moe", request, |params, _| {
        params.qk_norm = true;
        Ok(())
    })
}

fn moe_graph(
    name: &str,
    request: &GraphRequest,
    adjust: impl FnOnce(&mut LlamaParams, &HfConfig<'_>) -> Result<()>,
) -> Result<GraphIr> {
    let raw = &request.config.model;
    let hf = HfConfig::new(raw)?;
    let mut params = qwen_params(&hf)?;
    adjust(&mut params, &hf)?;
    let sparse = Sparse::parse(&hf, raw)?;
    moe_decoder_graph(name, &params, request, |i| sparse.layer(i, &params))
}
