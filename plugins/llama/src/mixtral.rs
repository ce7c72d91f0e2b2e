//! Mixtral, as a variant of the Llama decoder whose MLPs are mixtures of
//! experts (softmax top-k, renormalized), and the pieces every
//! mixture-of-experts variant of the family shares: the decoder with some
//! layers' MLPs replaced, and weight adapters that give each expert its own
//! module weights from per-expert or stacked checkpoint tensors.

use kiln_plugin_api::adapters::{AdaptRequest, AdaptResponse, AdaptedWeight};
use kiln_plugin_api::graph::{DType, GraphIr, MoeSpec};
use kiln_plugin_api::nn::{build_decoder_graph, Decoder, DecoderLayer, MixtureOfExperts, MoeBlock};
use kiln_plugin_api::{adapters, GraphRequest, HfConfig, Result, SupportedArchitecture};
use kiln_plugin_api::{Error, WeightsFormat};

use crate::LlamaParams;

/// The decoder of `params` with layer `i`'s MLP replaced by `moe(i)` where
/// it gives one.
pub fn moe_decoder_graph(
    name: &str,
    params: &LlamaParams,
    request: &GraphRequest,
    moe: impl Fn(usize) -> Option<MixtureOfExperts>,
) -> Result<GraphIr> {
    let model = params.transformer(DType::F32);
    let decoder = Decoder::from_blocks(model, |i, block| -> Box<dyn DecoderLayer> {
        match moe(i) {
            Some(moe) => Box::new(MoeBlock::new(block, moe)),
            None => Box::new(block),
        }
    });
    build_decoder_graph(name, &decoder, request.state_dict.as_ref(), |batch| {
        decoder.forward(batch)
    })
}

/// The experts and picks per token a config names: `num_local_experts`
/// (Mixtral; transformers 5 writes it for Qwen-MoE too) or `num_experts`,
/// and `num_experts_per_tok`.
pub fn expert_counts(hf: &HfConfig<'_>) -> Result<(u32, u32)> {
    let experts = match hf.opt_u32("num_local_experts")? {
        Some(n) => n,
        None => hf.u32("num_experts")?,
    };
    Ok((experts, hf.u32("num_experts_per_tok")?))
}

/// The Mixtral graph: every layer's MLP is a mixture of `intermediate_size`
/// experts.
pub fn mixtral_graph(request: &GraphRequest) -> Result<GraphIr> {
    let hf = HfConfig::new(&request.config.model)?;
    let params = LlamaParams::parse(&hf)?.rotated_for(request);
    let (experts, top_k) = expert_counts(&hf)?;
    let spec = MoeSpec::softmax(experts, top_k, true);
    moe_decoder_graph("mixtral", &params, request, |_| {
        Some(MixtureOfExperts::new(
            params.hidden_size,
            params.intermediate_size,
            DType::F32,
            spec.clone(),
        ))
    })
}

/// One adapted weight: `name` from rows `rows` of `source`.
fn part(name: String, source: &str, rows: Option<(u64, u64)>) -> AdaptedWeight {
    AdaptedWeight {
        name,
        source: source.to_owned(),
        rows,
    }
}

/// Expert `e`'s `proj` weights of a stacked `[E, rows, cols]` tensor, as
/// rows of its `[E·rows, cols]` matrix view (`offset`..`offset + len`
/// within each expert's rows).
fn split_stacked(
    prefix: &str,
    proj: &str,
    source: &str,
    shape: &[u64],
    offset: u64,
    len: u64,
) -> Result<Vec<AdaptedWeight>> {
    let [experts, rows, _] = shape else {
        return Err(Error::invalid(format!(
            "`{source}` should be [experts, rows, cols], got {shape:?}"
        )));
    };
    Ok((0..*experts)
        .map(|e| {
            let start = e * rows + offset;
            part(
                format!("{prefix}experts.{e}.{proj}.weight"),
                source,
                Some((start, start + len)),
            )
        })
        .collect())
}

/// Hugging Face names: `model.` stripped; Mixtral's `block_sparse_moe`
/// (with experts' `w1`, `w3`, `w2`) read as `mlp` (`gate_proj`, `up_proj`,
/// `down_proj`); transformers 5's stacked `experts.gate_up_proj
/// [E, 2I, H]` and `experts.down_proj [E, H, I]` split per expert.
pub fn adapt_moe_safetensors(request: &AdaptRequest) -> Result<AdaptResponse> {
    let mut weights = Vec::new();
    for tensor in &request.tensors {
        let Some(name) = adapters::hf_decoder_name(&tensor.name) else {
            continue;
        };
        let name = name
            .replace(".block_sparse_moe.", ".mlp.")
            .replace(".w1.weight", ".gate_proj.weight")
            .replace(".w3.weight", ".up_proj.weight")
            .replace(".w2.weight", ".down_proj.weight");
        let source = tensor.name.as_str();
        if let Some(prefix) = name.strip_suffix("experts.gate_up_proj") {
            let intermediate = tensor.shape.get(1).copied().unwrap_or(0) / 2;
            weights.extend(split_stacked(
                prefix,
                "gate_proj",
                source,
                &tensor.shape,
                0,
                intermediate,
            )?);
            weights.extend(split_stacked(
                prefix,
                "up_proj",
                source,
                &tensor.shape,
                intermediate,
                intermediate,
            )?);
        } else if let Some(prefix) = name.strip_suffix("experts.down_proj") {
            let hidden = tensor.shape.get(1).copied().unwrap_or(0);
            weights.extend(split_stacked(
                prefix,
                "down_proj",
                source,
                &tensor.shape,
                0,
                hidden,
            )?);
        } else {
            weights.push(part(name, source, None));
        }
    }
    Ok(AdaptResponse { weights })
}

/// llama.cpp's names: the decoder's, plus the router `ffn_gate_inp`, the
/// stacked experts `ffn_{gate,up,down}_exps` split per expert, and the
/// shared expert `ffn_{gate,up,down}_shexp` with its gate
/// `ffn_gate_inp_shexp`.
pub fn adapt_moe_gguf(request: &AdaptRequest) -> Result<AdaptResponse> {
    let mut weights = Vec::new();
    for tensor in &request.tensors {
        let source = tensor.name.as_str();
        let Some((layer, part_name)) = source
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
        else {
            weights.extend(adapters::gguf_decoder_name(source).map(|n| part(n, source, None)));
            continue;
        };
        let prefix = format!("layers.{layer}.mlp.");
        // Whole rows per expert (a malformed shape is refused by split_stacked).
        let rows = tensor.shape.get(1).copied().unwrap_or(0);
        let stacked = |proj| split_stacked(&prefix, proj, source, &tensor.shape, 0, rows);
        match part_name {
            "ffn_gate_inp.weight" => {
                weights.push(part(format!("{prefix}gate.weight"), source, None))
            }
            "ffn_gate_inp_shexp.weight" => weights.push(part(
                format!("{prefix}shared_expert_gate.weight"),
                source,
                None,
            )),
            "ffn_gate_exps.weight" => weights.extend(stacked("gate_proj")?),
            "ffn_up_exps.weight" => weights.extend(stacked("up_proj")?),
            "ffn_down_exps.weight" => weights.extend(stacked("down_proj")?),
            "ffn_gate_shexp.weight" | "ffn_up_shexp.weight" | "ffn_down_shexp.weight" => {
                let proj = &part_name[4..part_name.len() - "_shexp.weight".len()];
                weights.push(part(
                    format!("{prefix}shared_expert.{proj}_proj.weight"),
                    source,
                    None,
                ));
            }
            _ => weights.extend(adapters::gguf_decoder_name(source).map(|n| part(n, source, None))),
        }
    }
    Ok(AdaptResponse { weights })
}

/// The mixture-of-experts adapters for both formats.
pub fn with_moe_adapters(arch: SupportedArchitecture) -> SupportedArchitecture {
    arch.with_weight_adapter(WeightsFormat::Safetensors, adapt_moe_safetensors)
        .with_weight_adapter(WeightsFormat::Gguf, adapt_moe_gguf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_plugin_api::adapters::CheckpointTensor;

    fn request(format: WeightsFormat, tensors: &[(&str, &[u64])]) -> AdaptRequest {
        AdaptRequest {
            format,
            tensors: tensors
                .iter()
                .map(|(name, shape)| CheckpointTensor {
                    name: (*name).to_owned(),
                    shape: shape.to_vec(),
                    storage: "F32".to_owned(),
                    encoding: None,
                })
                .collect(),
            config: serde_json::Value::Null,
        }
    }

    fn find<'a>(response: &'a AdaptResponse, name: &str) -> &'a AdaptedWeight {
        let found = response.weights.iter().find(|w| w.name == name);
        found.unwrap_or_else(|| panic!("no {name} in {:?}", response.weights))
    }

    #[test]
    fn mixtral_and_stacked_expert_names_meet_in_one_module_tree() {
        let response = adapt_moe_safetensors(&request(
            WeightsFormat::Safetensors,
            &[
                ("model.layers.0.block_sparse_moe.gate.weight", &[4, 16]),
                (
                    "model.layers.0.block_sparse_moe.experts.3.w3.weight",
                    &[24, 16],
                ),
                ("model.layers.1.mlp.experts.gate_up_proj", &[4, 48, 16]),
                ("model.layers.1.mlp.experts.down_proj", &[4, 16, 24]),
            ],
        ))
        .unwrap();
        assert_eq!(find(&response, "layers.0.mlp.gate.weight").rows, None);
        let up = find(&response, "layers.0.mlp.experts.3.up_proj.weight");
        assert_eq!(
            up.source,
            "model.layers.0.block_sparse_moe.experts.3.w3.weight"
        );
        // Expert 2 of [4, 2·24, 16]: gate rows 96..120, up rows 120..144.
        let gate = find(&response, "layers.1.mlp.experts.2.gate_proj.weight");
        assert_eq!(gate.rows, Some((96, 120)));
        let up = find(&response, "layers.1.mlp.experts.2.up_proj.weight");
        assert_eq!(up.rows, Some((120, 144)));
        let down = find(&response, "layers.1.mlp.experts.3.down_proj.weight");
        assert_eq!(down.rows, Some((48, 64)));
        assert_eq!(response.weights.len(), 2 + 3 * 4);
    }

    #[test]
    fn gguf_stacked_experts_are_split_per_expert() {
        let response = adapt_moe_gguf(&request(
            WeightsFormat::Gguf,
            &[
                ("blk.1.ffn_gate_inp.weight", &[8, 32]),
                ("blk.1.ffn_up_exps.weight", &[8, 16, 32]),
                ("blk.1.ffn_down_exps.weight", &[8, 32, 16]),
                ("blk.1.ffn_gate_shexp.weight", &[40, 32]),
                ("blk.1.ffn_gate_inp_shexp.weight", &[1, 32]),
                ("blk.1.attn_q.weight", &[64, 32]),
            ],
        ))
        .unwrap();
        assert_eq!(find(&response, "layers.1.mlp.gate.weight").rows, None);
        let up = find(&response, "layers.1.mlp.experts.5.up_proj.weight");
        assert_eq!(
            (up.source.as_str(), up.rows),
            ("blk.1.ffn_up_exps.weight", Some((80, 96)))
        );
        let down = find(&response, "layers.1.mlp.experts.7.down_proj.weight");
        assert_eq!(down.rows, Some((224, 256)));
        find(&response, "layers.1.mlp.shared_expert.gate_proj.weight");
        find(&response, "layers.1.mlp.shared_expert_gate.weight");
        find(&response, "layers.1.self_attn.q_proj.weight");
    }

    #[test]
    fn malformed_stacked_experts_are_refused_not_a_panic() {
        let error = adapt_moe_gguf(&request(
            WeightsFormat::Gguf,
            &[("blk.0.ffn_gate_exps.weight", &[8])],
        ))
        .unwrap_err();
        assert!(
            error.to_string().contains("[experts, rows, cols]"),
            "{error}"
        );
    }
}
