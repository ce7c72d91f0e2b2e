//! Models from a shape alone: a Hugging Face config (a named preset or a
//! `config.json`) with random weights in a chosen storage type, for
//! benchmarks at real shapes without downloading a checkpoint (`host
//! benchmark --shape llama3-8b`). Speed does not depend on weight values.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_kernels::quant::QuantType;
use kiln_plugin_api::graph::{DType, WeightSpec};
use kiln_plugin_api::nn::StateDict;
use kiln_plugin_api::{ConfigRequest, Encoding, GraphRequest, WeightsFormat};

use super::{ModelError, ResolvedModel};
use crate::checkpoint::quant_mix::{fitting, FileMix, MixedModel, ModelSizes};
use crate::checkpoint::BoundWeights;
use crate::plugins::ArchitectureRegistry;
use crate::runtime::{quant_encoding, quant_type, WeightData, WeightStore};

/// The shapes `--shape` knows by name, with their Hugging Face configs.
const PRESETS: [(&str, &str); 2] = [
    ("llama3-8b", include_str!("shapes/llama3-8b.json")),
    ("llama3.2-1b", include_str!("shapes/llama3.2-1b.json")),
];

/// How random weights are stored (`--shape-dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ShapeDtype {
    /// bfloat16, as Hugging Face checkpoints ship.
    Bf16,
    /// 32-bit floats.
    F32,
    /// GGUF Q8_0 blocks for every matrix.
    #[value(name = "q8_0")]
    Q8_0,
    /// GGUF Q4_0 blocks for every matrix.
    #[value(name = "q4_0")]
    Q4_0,
    /// GGUF Q5_0 blocks for every matrix.
    #[value(name = "q5_0")]
    Q5_0,
    /// GGUF Q4_1 blocks for every matrix.
    #[value(name = "q4_1")]
    Q4_1,
    /// GGUF Q5_1 blocks for every matrix.
    #[value(name = "q5_1")]
    Q5_1,
    /// llama.cpp's Q4_K_M (`llama-quantize`'s choice per tensor, see
    /// [`crate::checkpoint::quant_mix`]): Q4_K matrices, Q6_K for the
    /// logits' and half the layers' `v_proj` and `down_proj`.
    #[value(name = "q4_k_m")]
    Q4KM,
    /// llama.cpp's Q5_K_M: as Q4_K_M with Q5_K for Q4_K.
    #[value(name = "q5_k_m")]
    Q5KM,
    /// llama.cpp's Q3_K_M: Q3_K matrices, Q6_K for the logits', Q4_K for
    /// `o_proj`, `v_proj` and `down_proj` (Q5_K for the first two layers'
    /// `v_proj` and the first sixteenth's `down_proj`).
    #[value(name = "q3_k_m")]
    Q3KM,
    /// llama.cpp's Q2_K: Q2_K matrices, Q6_K for the logits', Q3_K for
    /// `o_proj`, `v_proj` and `down_proj` (`v_proj` Q4_K where a key/value
    /// head serves four query heads or more).
    #[value(name = "q2_k")]
    Q2K,
    /// llama.cpp's IQ4_XS: IQ4_XS matrices (IQ4_NL for rows that do not
    /// fill super-blocks of 256), Q6_K for the logits', Q5_K for the first
    /// eighth's `down_proj` (and `v_proj` where a key/value head serves four
    /// query heads or more).
    #[value(name = "iq4_xs")]
    Iq4Xs,
}

impl ShapeDtype {
    /// The encoding of the weight `name` of `shape` in `model`: quantized
    /// types apply to matrices whose rows fill whole blocks (the mixes'
    /// after `llama-quantize`'s fallbacks), everything else stays f32.
    fn encoding(self, name: &str, shape: &[u64], model: &MixedModel) -> Encoding {
        let rows = shape.first().copied().unwrap_or(0);
        let cols = shape.last().copied().unwrap_or(0);
        let mixed = |file: FileMix| {
            file.choose(name, (rows, cols), model)
                .and_then(|ty| fitting(ty, cols))
                .map_or(Encoding::Float32, quant_encoding)
        };
        let quant = match self {
            Self::Bf16 => return Encoding::BFloat16,
            Self::F32 => return Encoding::Float32,
            Self::Q8_0 => Encoding::Q8_0,
            Self::Q4_0 => Encoding::Q4_0,
            Self::Q5_0 => Encoding::Q5_0,
            Self::Q4_1 => Encoding::Q4_1,
            Self::Q5_1 => Encoding::Q5_1,
            Self::Q4KM => mixed(FileMix::Q4KM),
            Self::Q5KM => mixed(FileMix::Q5KM),
            Self::Q3KM => mixed(FileMix::Q3KM),
            Self::Q2K => mixed(FileMix::Q2K),
            Self::Iq4Xs => mixed(FileMix::IQ4XS),
        };
        let block = quant_type(quant).map_or(1, |q| q.block_elems() as u64);
        if shape.len() == 2 && shape[1].is_multiple_of(block) {
            quant
        } else {
            Encoding::Float32
        }
    }

    /// The checkpoint format these weights would come in.
    fn format(self) -> WeightsFormat {
        match self {
            Self::Bf16 | Self::F32 => WeightsFormat::Safetensors,
            _ => WeightsFormat::Gguf,
        }
    }
}

/// A named preset or a path to a `config.json`, as a Hugging Face config.
pub fn shape_config(shape: &str) -> Result<serde_json::Value, ModelError> {
    let text = match PRESETS.iter().find(|(name, _)| *name == shape) {
        Some((_, text)) => text.to_string(),
        None => std::fs::read_to_string(shape).map_err(|e| {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            super::resolve::ResolveError::NotFound(format!(
                "--shape {shape}: not a preset ({}) and not a readable config.json: {e}",
                names.join(", ")
            ))
        })?,
    };
    serde_json::from_str(&text).map_err(|e| {
        ModelError::Resolve(super::resolve::ResolveError::NotFound(format!(
            "--shape {shape}: not a JSON config: {e}"
        )))
    })
}

/// The model of `hf_config`'s architecture with random weights stored as
/// `dtype`, ready to run as `options` say.
pub fn load(
    registry: &ArchitectureRegistry,
    name: &str,
    hf_config: serde_json::Value,
    dtype: ShapeDtype,
    options: &super::LoadOptions,
) -> Result<super::Model, ModelError> {
    let format = dtype.format();
    let architecture = super::find_registered(registry, &hf_config, None)?.clone();
    let config = architecture.config(&ConfigRequest {
        hf_config: hf_config.clone(),
        max_length: options.max_length,
    })?;
    // The module's own declarations give every weight's name and shape.
    let declared = architecture.build_graph(&GraphRequest {
        config: config.clone(),
        weights_format: Some(format),
        state_dict: None,
        task: None,
    })?;
    let vocab = hf_config
        .get("vocab_size")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| {
            ModelError::Resolve(super::resolve::ResolveError::NotFound(format!(
                "--shape {name}: the config has no `vocab_size`"
            )))
        })?;
    let rows = |w: &WeightSpec| w.shape.first().copied().unwrap_or(0);
    let names_rows = declared.weights.iter().map(|w| (w.name.as_str(), rows(w)));
    let mix = MixedModel::of(names_rows, ModelSizes::of(&hf_config));
    // The CPU backend runs on the host's bytes: shared ones would stay in
    // its caches and overstate decode's speed.
    let own_bytes = !options.device.is_cuda();
    let bound = random_weights(&declared.weights, own_bytes, |name, shape| {
        dtype.encoding(name, shape, &mix)
    })?;
    let compiled = super::compile(architecture, config, bound, format, options)?;
    let tokenizer =
        crate::tokenizer::Tokenizer::placeholder(u32::try_from(vocab).unwrap_or(u32::MAX))?;
    Ok(super::Model::assemble(
        ResolvedModel {
            name: format!("random {name}"),
            dir: None,
            weights: std::path::PathBuf::new(),
            format,
        },
        hf_config,
        compiled,
        Some(tokenizer),
    ))
}

/// Random weights for `declared`, each stored as `encoding(name, shape)`
/// says. Weights of one shape and encoding have the same values. Unless
/// `own_bytes`, they share their bytes on the host (each is still its own
/// copy on a CUDA device), so an 8B shape needs about one layer's worth of
/// host memory beyond the vocabulary matrices; with it, each weight has a
/// copy of its own.
fn random_weights(
    declared: &[WeightSpec],
    own_bytes: bool,
    encoding: impl Fn(&str, &[u64]) -> Encoding,
) -> Result<BoundWeights, ModelError> {
    let mut shared: BTreeMap<(String, Vec<u64>), Arc<Vec<u8>>> = BTreeMap::new();
    let mut state_dict = StateDict::new();
    let mut store = WeightStore::new();
    for (index, spec) in declared.iter().enumerate() {
        let encoding = encoding(&spec.name, &spec.shape);
        let spec = WeightSpec {
            dtype: DType::of_encoding(encoding).unwrap_or(spec.dtype),
            encoding,
            ..spec.clone()
        };
        let values = shared
            .entry((encoding.to_string(), spec.shape.clone()))
            .or_insert_with(|| Arc::new(random_bytes(&spec, index as u64)));
        let bytes = if own_bytes {
            Arc::new(values.as_ref().clone())
        } else {
            values.clone()
        };
        let len = bytes.len();
        let spec_name = spec.name.clone();
        state_dict.insert(spec.name.clone(), spec.clone());
        store
            .insert(WeightData::new(spec, bytes, 0..len))
            .map_err(|message| {
                ModelError::Runtime(crate::runtime::RuntimeError::Weight {
                    name: spec_name.clone(),
                    message,
                })
            })?;
    }
    Ok(BoundWeights {
        state_dict,
        store,
        unused: Vec::new(),
    })
}

/// Bytes of a random weight: floats uniform in ±0.05 (vectors are 1, as
/// norm scales are), quantized blocks with random quants and small finite
/// scales.
fn random_bytes(spec: &WeightSpec, seed: u64) -> Vec<u8> {
    let mut rng = SplitMix(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed);
    let elements = spec.shape.iter().product::<u64>() as usize;
    let vector = spec.shape.len() < 2;
    let value = |rng: &mut SplitMix| {
        if vector {
            1.0
        } else {
            (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 0.1 - 0.05
        }
    };
    match spec.encoding {
        Encoding::Float32 => (0..elements)
            .flat_map(|_| value(&mut rng).to_le_bytes())
            .collect(),
        Encoding::BFloat16 => (0..elements)
            .flat_map(|_| half::bf16::from_f32(value(&mut rng)).to_le_bytes())
            .collect(),
        Encoding::Float16 => (0..elements)
            .flat_map(|_| half::f16::from_f32(value(&mut rng)).to_le_bytes())
            .collect(),
        quantized => {
            let ty = quant_type(quantized).expect("a quantized encoding");
            let blocks = elements / ty.block_elems();
            let mut bytes: Vec<u8> = (0..blocks * ty.block_bytes())
                .map(|_| rng.next() as u8)
                .collect();
            let scale = half::f16::from_f32(block_scale(ty)).to_le_bytes();
            let minimum = block_minimum(ty).map(|m| half::f16::from_f32(m).to_le_bytes());
            for block in bytes.chunks_exact_mut(ty.block_bytes()) {
                for &offset in ty.f16_fields() {
                    block[offset..offset + 2].copy_from_slice(&scale);
                }
                if let Some(minimum) = minimum {
                    block[2..4].copy_from_slice(&minimum);
                }
            }
            bytes
        }
    }
}

/// The f16 scale written into every random block: 0.002, less for the IQ4
/// formats, whose table values reach ±127 (and IQ4_XS's sub-block scales
/// ±32), and for Q3_K (sub-block scales ±32, quants ±4), so that their
/// weights span about what Q4_0's do (±0.016). With 0.002, tiny IQ4_XS
/// Llama's weights reached ±8, and rounding them to bf16 (as the GPU's
/// expansion does) moved one decode step's logits by 60 %; tiny Q3_K_M
/// Llama's reached ±0.26, and rounding a prompt's activations to bf16 moved
/// one position's logits by 9 % (2e-3 at the others, and at every position
/// with 0.002 / 16).
fn block_scale(ty: QuantType) -> f32 {
    match ty {
        QuantType::IQ4NL => 0.002 * 8.0 / 127.0,
        QuantType::IQ4XS => 0.002 * 8.0 / 127.0 / 16.0,
        QuantType::Q3K => 0.002 / 16.0,
        _ => 0.002,
    }
}

/// The f16 minimum (bytes 2..4) of a random Q4_1 or Q5_1 block, whose value
/// is d · n + m: the middle quant's value less, so that the weights center
/// on zero as Q4_0's and Q5_0's do.
fn block_minimum(ty: QuantType) -> Option<f32> {
    match ty {
        QuantType::Q4_1 => Some(-8.0 * block_scale(ty)),
        QuantType::Q5_1 => Some(-16.0 * block_scale(ty)),
        _ => None,
    }
}

/// SplitMix64: a fast generator for bulk random bytes.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_blocks_decode_to_finite_values() {
        for (encoding, cols) in [
            (Encoding::Q4K, 512),
            (Encoding::Q6K, 256),
            (Encoding::Q8_0, 64),
            (Encoding::Q4_0, 64),
            (Encoding::Q4_1, 64),
            (Encoding::Q5_1, 64),
            (Encoding::Q2K, 256),
            (Encoding::Q3K, 256),
            (Encoding::BFloat16, 8),
        ] {
            let spec = WeightSpec {
                name: "w".into(),
                dtype: DType::F32,
                shape: vec![3, cols],
                encoding,
                device: Default::default(),
            };
            let bytes = random_bytes(&spec, 1);
            let len = bytes.len();
            let weight = WeightData::new(spec, Arc::new(bytes), 0..len);
            weight.validate().unwrap();
            let mut out = vec![0.0; 3 * cols as usize];
            weight.decode_rows(0..3, &mut out).unwrap();
            assert!(out.iter().all(|v| v.is_finite()), "{encoding}");
            assert!(out.iter().any(|v| *v != 0.0), "{encoding}");
            // Weights of either sign (Q4_1's and Q5_1's minimums too).
            assert!(out.iter().any(|v| *v < 0.0), "{encoding}");
            assert!(out.iter().any(|v| *v > 0.0), "{encoding}");
        }
    }

    #[test]
    fn q4_k_m_keeps_vectors_in_f32_and_falls_back_for_odd_rows() {
        let q = ShapeDtype::Q4KM;
        let last_layer = ("layers.31.mlp.down_proj.weight", 4096);
        let sizes = ModelSizes::of(&serde_json::json!({"vocab_size": 100}));
        let model = MixedModel::of([("lm_head.weight", 100), last_layer], sizes);
        let encoding = |name: &str, shape: &[u64]| q.encoding(name, shape, &model);
        assert_eq!(encoding("lm_head.weight", &[100, 4096]), Encoding::Q6K);
        assert_eq!(encoding("embed_tokens.weight", &[100, 4096]), Encoding::Q4K);
        let tied = MixedModel::of([("embed_tokens.weight", 100), last_layer], sizes);
        let embedding = q.encoding("embed_tokens.weight", &[100, 4096], &tied);
        assert_eq!(embedding, Encoding::Q6K);
        let q_proj = "layers.0.self_attn.q_proj.weight";
        assert_eq!(encoding(q_proj, &[4096, 4096]), Encoding::Q4K);
        assert_eq!(
            encoding("layers.0.mlp.up_proj.bias", &[4096]),
            Encoding::Float32
        );
        // Odd rows: llama-quantize's fallback, or f32 where even that does
        // not fit.
        let up = "layers.0.mlp.up_proj.weight";
        assert_eq!(encoding(up, &[64, 96]), Encoding::Q5_0);
        assert_eq!(encoding(up, &[64, 100]), Encoding::Float32);
        assert!(shape_config("llama3-8b").is_ok());
        assert!(shape_config("no-such-shape").is_err());
    }
}
