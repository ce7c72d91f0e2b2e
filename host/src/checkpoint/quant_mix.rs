//! Which GGUF format each weight gets: at load (`--quantization`), every
//! float matrix one format (`q8_0`, `q4_0`) or one of llama-quantize's
//! mixes, and in random models of a shape (`--shape-dtype`). The mixes
//! reproduce `llama_tensor_get_type` (llama.cpp's `llama-quant.cpp`) for
//! dense decoders, spending more bits where quantization hurts most:
//! - Q4_K_M (Q5_K_M): Q4_K (Q5_K), with Q6_K for the LM head (the token
//!   embeddings where tied to it) and for the value projections (fused
//!   q/k/v ones too) and MLP down projections of the first and last eighth
//!   of the layers and every third layer between;
//! - Q3_K_M: Q3_K, with Q6_K for the LM head, Q4_K for the output and value
//!   projections and down projections, Q5_K for the first two layers' value
//!   projections and the first sixteenth's down projections;
//! - Q2_K: Q2_K, with Q6_K for the LM head and Q3_K for the output, value
//!   and down projections (Q4_K for the value projections where a key/value
//!   head serves four query heads or more);
//! - IQ4_XS: IQ4_XS, with Q6_K for the LM head, Q5_K for the first eighth
//!   of the layers' down projections and, where a key/value head serves four
//!   query heads or more, for the value projections;
//! - at load, rows that are not whole super-blocks of 256 fall back to a
//!   32-value format as llama-quantize's do: Q2_K and Q3_K to Q4_0, Q4_K to
//!   Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, IQ4_XS to IQ4_NL (the LM head
//!   straight to Q8_0).
//!
//! Roles come from Kiln's module paths (`lm_head`, `embed_tokens`,
//! `layers.N.self_attn.v_proj`, `mlp.down_proj`, ...); a plugin whose
//! modules are named otherwise gets the default format for them. Not
//! modelled: llama.cpp's extra bits for 8-expert models and for 70B ones.
//! Routers of mixtures of experts (`mlp.gate`) keep their floats, as
//! llama.cpp keeps `ffn_gate_inp`.

use kiln_kernels::quant::QuantType;
use kiln_plugin_api::Encoding;

use super::quantize::LoadQuantization;
use crate::runtime::WeightData;

/// A weight's part in a mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The LM head.
    Output,
    /// The token embeddings.
    TokenEmbeddings,
    /// A value projection, or q/k/v fused, of layer `.0`.
    AttentionValues(Option<usize>),
    /// An attention's output projection.
    AttentionOutput,
    /// An MLP's down projection (an expert's too) of layer `.0`.
    FfnDown(Option<usize>),
    /// A mixture of experts' router.
    Router,
    /// Anything else.
    Other,
}

/// The role of the weight `name` of `rows` rows.
fn role(name: &str, rows: u64, vocab: Option<u64>) -> Role {
    let module = name.strip_suffix(".weight").unwrap_or(name);
    let last = module.rsplit('.').next().unwrap_or(module);
    let layer = layer_of(name);
    match last {
        "lm_head" => Role::Output,
        "embed_tokens" => Role::TokenEmbeddings,
        "v_proj" | "qkv_proj" | "kv_b_proj" => Role::AttentionValues(layer),
        "down_proj" => Role::FfnDown(layer),
        "o_proj" => Role::AttentionOutput,
        "gate" => Role::Router,
        _ if Some(rows) == vocab && name.contains("embed") => Role::TokenEmbeddings,
        _ if Some(rows) == vocab => Role::Output,
        _ => Role::Other,
    }
}

/// `N` of a weight under `layers.N.`.
fn layer_of(name: &str) -> Option<usize> {
    let (_, rest) = name.split_once("layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers,
/// and every third one between.
fn use_more_bits(layer: usize, layers: usize) -> bool {
    let (layer, layers) = (layer as i64, layers as i64);
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2
}

/// A file type of `llama-quantize` that mixes formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileMix {
    /// IQ4_XS.
    IQ4XS,
    /// Q4_K_M.
    Q4KM,
    /// Q5_K_M.
    Q5KM,
    /// Q3_K_M.
    Q3KM,
    /// Q2_K.
    Q2K,
}

/// The sizes of a model's config the mixes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSizes {
    /// Rows of the vocabulary's matrices (`vocab_size`).
    pub vocab: Option<u64>,
    /// Query heads per key/value head.
    pub gqa: u64,
}

impl ModelSizes {
    /// The sizes `hf_config` gives.
    pub fn of(hf_config: &serde_json::Value) -> Self {
        let get = |key| hf_config.get(key).and_then(serde_json::Value::as_u64);
        let heads = get("num_attention_heads");
        let kv_heads = get("num_key_value_heads").or(heads);
        let gqa = heads.zip(kv_heads).and_then(|(h, kv)| h.checked_div(kv));
        Self {
            vocab: get("vocab_size"),
            gqa: gqa.unwrap_or(1),
        }
    }
}

/// What the mixes need to know of a model beyond a weight's own name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MixedModel {
    /// Rows of the vocabulary's matrices, query heads per key/value head.
    sizes: ModelSizes,
    /// Decoder layers.
    layers: usize,
    /// Whether the LM head is the token embeddings (no `lm_head`).
    tied: bool,
}

impl MixedModel {
    /// The model of the weights `(name, rows)`.
    pub(crate) fn of<'a>(
        weights: impl IntoIterator<Item = (&'a str, u64)> + Clone,
        sizes: ModelSizes,
    ) -> Self {
        let layers = weights
            .clone()
            .into_iter()
            .filter_map(|(name, _)| layer_of(name))
            .max()
            .map_or(0, |last| last + 1);
        let tied = !weights
            .into_iter()
            .any(|(name, rows)| role(name, rows, sizes.vocab) == Role::Output);
        Self {
            sizes,
            layers,
            tied,
        }
    }

    fn role(&self, name: &str, rows: u64) -> Role {
        match role(name, rows, self.sizes.vocab) {
            Role::TokenEmbeddings if self.tied => Role::Output,
            role => role,
        }
    }

    fn more_bits(&self, layer: Option<usize>) -> bool {
        layer.is_some_and(|l| use_more_bits(l, self.layers))
    }
}

impl FileMix {
    /// What `llama-quantize` stores the weight `name` of `rows` rows of
    /// `cols` values as, before [`fitting`]; `None` for a router, kept as
    /// stored.
    pub(crate) fn choose(
        self,
        name: &str,
        (rows, cols): (u64, u64),
        model: &MixedModel,
    ) -> Option<QuantType> {
        let role = model.role(name, rows);
        let early = |layer: Option<usize>, before: usize| layer.is_some_and(|l| l < before);
        Some(match (self, role) {
            (_, Role::Router) => return None,
            (_, Role::Output) if !cols.is_multiple_of(256) => QuantType::Q8_0,
            (_, Role::Output) => QuantType::Q6K,
            (Self::IQ4XS, Role::AttentionValues(_)) if model.sizes.gqa >= 4 => QuantType::Q5K,
            (Self::IQ4XS, Role::FfnDown(l)) if early(l, model.layers / 8) => QuantType::Q5K,
            (Self::IQ4XS, _) => QuantType::IQ4XS,
            (Self::Q4KM | Self::Q5KM, Role::AttentionValues(l) | Role::FfnDown(l))
                if model.more_bits(l) =>
            {
                QuantType::Q6K
            }
            (Self::Q4KM, _) => QuantType::Q4K,
            (Self::Q5KM, _) => QuantType::Q5K,
            (Self::Q3KM, Role::AttentionValues(l)) if early(l, 2) => QuantType::Q5K,
            (Self::Q3KM, Role::FfnDown(l)) if early(l, model.layers / 16) => QuantType::Q5K,
            (Self::Q3KM, Role::AttentionValues(_) | Role::FfnDown(_) | Role::AttentionOutput) => {
                QuantType::Q4K
            }
            (Self::Q3KM, _) => QuantType::Q3K,
            (Self::Q2K, Role::AttentionValues(_)) if model.sizes.gqa >= 4 => QuantType::Q4K,
            (Self::Q2K, Role::AttentionValues(_) | Role::FfnDown(_) | Role::AttentionOutput) => {
                QuantType::Q3K
            }
            (Self::Q2K, _) => QuantType::Q2K,
        })
    }
}

/// `ty`, or the 32-value format `llama-quantize` falls back to for rows
/// of `cols` values that are not whole blocks of `ty`; `None` where even
/// that does not fit.
pub(crate) fn fitting(ty: QuantType, cols: u64) -> Option<QuantType> {
    let fits = |ty: QuantType| cols.is_multiple_of(ty.block_elems() as u64);
    let ty = if fits(ty) {
        ty
    } else {
        match ty {
            QuantType::Q2K | QuantType::Q3K => QuantType::Q4_0,
            QuantType::Q4K => QuantType::Q5_0,
            QuantType::Q5K => QuantType::Q5_1,
            QuantType::Q6K => QuantType::Q8_0,
            QuantType::IQ4XS => QuantType::IQ4NL,
            other => other,
        }
    };
    fits(ty).then_some(ty)
}

/// The format each of `weights` is written in at load (`None`: kept as
/// stored).
pub(super) fn plan_formats(
    weights: &[WeightData],
    how: LoadQuantization,
    sizes: ModelSizes,
) -> Vec<Option<QuantType>> {
    let rows = |w: &WeightData| w.spec.shape.first().copied().unwrap_or(0);
    let model = MixedModel::of(
        weights.iter().map(|w| (w.spec.name.as_str(), rows(w))),
        sizes,
    );
    weights
        .iter()
        .map(|weight| {
            let cols = matrix_cols(weight)?;
            let (name, rows) = (weight.spec.name.as_str(), rows(weight));
            let mixed = |mix: FileMix| mix.choose(name, (rows, cols), &model);
            let role = model.role(name, rows);
            let wanted = match how {
                _ if role == Role::Router => return None,
                LoadQuantization::None => return None,
                LoadQuantization::Q8_0 => QuantType::Q8_0,
                // The embeddings and the LM head keep 8 bits.
                LoadQuantization::Q4_0 if matches!(role, Role::Output | Role::TokenEmbeddings) => {
                    QuantType::Q8_0
                }
                LoadQuantization::Q4_0 => QuantType::Q4_0,
                LoadQuantization::Q5KM => mixed(FileMix::Q5KM)?,
                LoadQuantization::Q4KM => mixed(FileMix::Q4KM)?,
                LoadQuantization::Q3KM => mixed(FileMix::Q3KM)?,
                LoadQuantization::Q2K => mixed(FileMix::Q2K)?,
                LoadQuantization::IQ4XS => mixed(FileMix::IQ4XS)?,
            };
            fitting(wanted, cols)
        })
        .collect()
}

/// The row length of a float tensor of two axes or more (matrices,
/// stacked experts); `None` for vectors and other encodings.
fn matrix_cols(weight: &WeightData) -> Option<u64> {
    let float = matches!(
        weight.spec.encoding,
        Encoding::Float32 | Encoding::Float16 | Encoding::BFloat16
    );
    let shape = &weight.spec.shape;
    let cols = *shape.last()?;
    (float && shape.len() >= 2 && cols > 0).then_some(cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_module_paths() {
        let vocab = Some(1000);
        for (name, rows, want) in [
            ("lm_head.weight", 1000, Role::Output),
            ("embed_tokens.weight", 1000, Role::TokenEmbeddings),
            (
                "layers.3.self_attn.v_proj.weight",
                64,
                Role::AttentionValues(Some(3)),
            ),
            (
                "layers.12.self_attn.qkv_proj.weight",
                192,
                Role::AttentionValues(Some(12)),
            ),
            ("layers.0.mlp.down_proj.weight", 64, Role::FfnDown(Some(0))),
            (
                "layers.5.mlp.experts.7.down_proj.weight",
                64,
                Role::FfnDown(Some(5)),
            ),
            ("layers.5.mlp.gate.weight", 8, Role::Router),
            ("layers.5.mlp.gate_proj.weight", 256, Role::Other),
            ("layers.5.self_attn.q_proj.weight", 64, Role::Other),
            (
                "layers.5.self_attn.o_proj.weight",
                64,
                Role::AttentionOutput,
            ),
            ("output.weight", 1000, Role::Output),
            ("tok_embeddings.weight", 1000, Role::TokenEmbeddings),
        ] {
            assert_eq!(role(name, rows, vocab), want, "{name}");
        }
    }

    /// llama.cpp's layers of more bits for 30 and 32 layers.
    #[test]
    fn more_bits_where_llama_cpp_spends_them() {
        let chosen = |n| (0..n).filter(|&i| use_more_bits(i, n)).collect::<Vec<_>>();
        assert_eq!(
            chosen(30),
            [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
        );
        assert_eq!(
            chosen(32),
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    /// A 32-layer model with an LM head of its own.
    fn model() -> MixedModel {
        let last = ("layers.31.mlp.down_proj.weight", 4096);
        let sizes = ModelSizes {
            vocab: Some(100),
            gqa: 1,
        };
        MixedModel::of([("lm_head.weight", 100), last], sizes)
    }

    /// The layers whose `v_proj` and `down_proj` a 32-layer Q4_K_M file
    /// keeps at Q6_K (layers 0-3, 28-31 and every third from 6), and Q5_K_M
    /// by the same rule.
    #[test]
    fn k_m_files_widen_half_the_layers() {
        let model = model();
        let widened: Vec<usize> = (0..32)
            .filter(|i| {
                let name = format!("layers.{i}.self_attn.v_proj.weight");
                FileMix::Q4KM.choose(&name, (1024, 4096), &model) == Some(QuantType::Q6K)
            })
            .collect();
        assert_eq!(
            widened,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        let choose = |mix: FileMix, name: &str| mix.choose(name, (4096, 14336), &model);
        assert_eq!(
            choose(FileMix::Q5KM, "layers.6.mlp.down_proj.weight"),
            Some(QuantType::Q6K)
        );
        assert_eq!(
            choose(FileMix::Q5KM, "layers.7.mlp.down_proj.weight"),
            Some(QuantType::Q5K)
        );
        assert_eq!(
            choose(FileMix::Q4KM, "layers.7.self_attn.v_proj.weight"),
            Some(QuantType::Q4K)
        );
        assert_eq!(choose(FileMix::Q4KM, "layers.7.mlp.gate.weight"), None);
        assert_eq!(
            FileMix::Q4KM.choose("lm_head.weight", (100, 4096), &model),
            Some(QuantType::Q6K)
        );
        assert_eq!(
            FileMix::Q4KM.choose("embed_tokens.weight", (100, 4096), &model),
            Some(QuantType::Q4K)
        );
    }

    /// A 32-layer Q3_K_M file's and Q2_K file's choices per matrix.
    #[test]
    fn low_bit_files_mix_formats() {
        let model = model();
        let q3 = |name: &str| FileMix::Q3KM.choose(name, (1024, 4096), &model).unwrap();
        assert_eq!(
            FileMix::Q3KM.choose("lm_head.weight", (100, 4096), &model),
            Some(QuantType::Q6K)
        );
        assert_eq!(q3("layers.1.self_attn.v_proj.weight"), QuantType::Q5K);
        assert_eq!(q3("layers.2.self_attn.v_proj.weight"), QuantType::Q4K);
        assert_eq!(q3("layers.1.mlp.down_proj.weight"), QuantType::Q5K);
        assert_eq!(q3("layers.2.mlp.down_proj.weight"), QuantType::Q4K);
        assert_eq!(q3("layers.5.self_attn.o_proj.weight"), QuantType::Q4K);
        assert_eq!(q3("layers.5.self_attn.q_proj.weight"), QuantType::Q3K);
        assert_eq!(q3("layers.5.mlp.gate_proj.weight"), QuantType::Q3K);
        let q2 = |name: &str| FileMix::Q2K.choose(name, (1024, 4096), &model).unwrap();
        assert_eq!(
            FileMix::Q2K.choose("lm_head.weight", (100, 4096), &model),
            Some(QuantType::Q6K)
        );
        assert_eq!(q2("layers.0.self_attn.v_proj.weight"), QuantType::Q3K);
        assert_eq!(q2("layers.9.self_attn.o_proj.weight"), QuantType::Q3K);
        assert_eq!(q2("layers.9.mlp.down_proj.weight"), QuantType::Q3K);
        assert_eq!(q2("layers.9.self_attn.k_proj.weight"), QuantType::Q2K);
        assert_eq!(q2("layers.9.mlp.up_proj.weight"), QuantType::Q2K);
        let grouped = MixedModel {
            sizes: ModelSizes {
                gqa: 4,
                ..model.sizes
            },
            ..model
        };
        let v = FileMix::Q2K.choose("layers.0.self_attn.v_proj.weight", (1024, 4096), &grouped);
        assert_eq!(v, Some(QuantType::Q4K));
        let iq4 = |name: &str, model: &MixedModel| FileMix::IQ4XS.choose(name, (1024, 4096), model);
        assert_eq!(
            iq4("layers.3.mlp.down_proj.weight", &model),
            Some(QuantType::Q5K)
        );
        assert_eq!(
            iq4("layers.4.mlp.down_proj.weight", &model),
            Some(QuantType::IQ4XS)
        );
        assert_eq!(
            iq4("layers.9.self_attn.v_proj.weight", &model),
            Some(QuantType::IQ4XS)
        );
        assert_eq!(
            iq4("layers.9.self_attn.v_proj.weight", &grouped),
            Some(QuantType::Q5K)
        );
        let head = FileMix::IQ4XS.choose("lm_head.weight", (100, 576), &model);
        assert_eq!(head, Some(QuantType::Q8_0));
        assert_eq!(fitting(QuantType::IQ4XS, 576), Some(QuantType::IQ4NL));
        assert_eq!(fitting(QuantType::Q6K, 576), Some(QuantType::Q8_0));
        assert_eq!(fitting(QuantType::Q4K, 100), None);
        let config = serde_json::json!({"vocab_size": 7, "num_attention_heads": 32, "num_key_value_heads": 8});
        assert_eq!(
            ModelSizes::of(&config),
            ModelSizes {
                vocab: Some(7),
                gqa: 4
            }
        );
        assert_eq!(ModelSizes::of(&serde_json::json!({})).gqa, 1);
    }
}
