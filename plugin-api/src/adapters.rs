//! Weight adaptation (MAX's weight adapters): mapping a checkpoint's tensor
//! names onto the module tree's, per weights format.
//!
//! The host describes the checkpoint's tensors ([`AdaptRequest`]); the
//! architecture answers which module weight each one becomes
//! ([`AdaptResponse`]). Renames and drops cost nothing; taking a row range of
//! a tensor (splitting a fused qkv projection) is a zero-copy view of the
//! row-major data, quantized or not. Tensors not mentioned are unused.

use serde::{Deserialize, Serialize};

use crate::architecture::{Encoding, WeightsFormat};
use crate::error::Result;

/// One tensor of the checkpoint, as the host describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointTensor {
    /// Name in the checkpoint.
    pub name: String,
    /// Shape, outermost first (PyTorch order, also for GGUF).
    pub shape: Vec<u64>,
    /// Storage type as the file names it (`F32`, `BF16`, `Q4_1`, `I64`, …).
    pub storage: String,
    /// The encoding, for tensors that can be weights (floats and GGUF blocks).
    pub encoding: Option<Encoding>,
}

/// What the host hands an architecture's weight adapter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdaptRequest {
    /// The checkpoint's format.
    pub format: WeightsFormat,
    /// Every tensor in the checkpoint.
    pub tensors: Vec<CheckpointTensor>,
    /// The model's (Hugging Face shaped) config.
    #[serde(default)]
    pub config: serde_json::Value,
}

/// One module weight and where its data comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptedWeight {
    /// Fully qualified module name, e.g. `layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// The checkpoint tensor that holds the data.
    pub source: String,
    /// Only rows `start..end` of the source as a matrix (e.g. one part of a
    /// fused projection): the rows of a 2-D tensor; of a stacked `[E, N, K]`
    /// tensor, the `E·N` rows of `K` (one expert's matrix is `e·N..(e+1)·N`,
    /// since 1.3), the result being `[end - start, K]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<(u64, u64)>,
}

/// The adapter's answer: the module weights, by source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptResponse {
    /// Module weights and their sources.
    pub weights: Vec<AdaptedWeight>,
}

/// A weight adapter for one weights format.
pub type WeightAdapterFn = dyn Fn(&AdaptRequest) -> Result<AdaptResponse> + Send + Sync;

/// Renames every tensor with `rename`; tensors it maps to `None` are dropped.
pub fn rename(request: &AdaptRequest, rename: impl Fn(&str) -> Option<String>) -> AdaptResponse {
    AdaptResponse {
        weights: request
            .tensors
            .iter()
            .filter_map(|t| {
                rename(&t.name).map(|name| AdaptedWeight {
                    name,
                    source: t.name.clone(),
                    rows: None,
                })
            })
            .collect(),
    }
}

/// Hugging Face safetensors names for decoder models: strips the `model.`
/// prefix and drops non-weight buffers (`rotary_emb.inv_freq`).
pub fn hf_decoder_name(name: &str) -> Option<String> {
    if name.ends_with("rotary_emb.inv_freq") {
        return None;
    }
    Some(name.strip_prefix("model.").unwrap_or(name).to_owned())
}

/// GGUF names of llama.cpp's decoder families (llama, qwen2, qwen3,
/// gemma3, …) mapped to the module names that Hugging Face checkpoints
/// adapt to with [`hf_decoder_name`], so one module tree serves both.
pub fn gguf_decoder_name(name: &str) -> Option<String> {
    let top = match name {
        "token_embd.weight" => Some("embed_tokens.weight"),
        "output_norm.weight" => Some("norm.weight"),
        "output_norm.bias" => Some("norm.bias"),
        "output.weight" => Some("lm_head.weight"),
        "output.bias" => Some("lm_head.bias"),
        _ => None,
    };
    if let Some(top) = top {
        return Some(top.to_owned());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    layer.parse::<u32>().ok()?;
    let (part, suffix) = rest.rsplit_once('.')?;
    let module = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "attn_qkv" => "self_attn.qkv_proj",
        "ffn_norm" => "post_attention_layernorm",
        "post_attention_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "post_ffw_norm" => "post_feedforward_layernorm",
        _ => return None,
    };
    Some(format!("layers.{layer}.{module}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_and_hf_names_meet_in_one_module_tree() {
        for (gguf, hf) in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            (
                "blk.3.attn_q.weight",
                "model.layers.3.self_attn.q_proj.weight",
            ),
            ("blk.3.attn_k.bias", "model.layers.3.self_attn.k_proj.bias"),
            (
                "blk.12.ffn_down.weight",
                "model.layers.12.mlp.down_proj.weight",
            ),
            (
                "blk.0.ffn_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
        ] {
            assert_eq!(gguf_decoder_name(gguf), hf_decoder_name(hf), "{gguf}");
        }
        assert_eq!(gguf_decoder_name("blk.x.attn_q.weight"), None);
        assert_eq!(gguf_decoder_name("rope_freqs.weight"), None);
        assert_eq!(
            hf_decoder_name("model.layers.0.self_attn.rotary_emb.inv_freq"),
            None
        );
    }
}
