//! `--quantization q8_0|q4_0|q5_k_m|q4_k_m|q3_k_m|q2_k|iq4_xs`: a
//! checkpoint's float matrices quantized at load.
//!
//! The exact products of the quantized model equal (up to summation order)
//! those of the same model whose matrices were quantized and dequantized
//! beforehand with ggml's rounding, in the formats llama-quantize would
//! pick (stated here independently for two-layer models), and differ from
//! the unquantized model's: the quantization happened, with ggml's blocks.
//! The CUDA backend reads the same blocks through its packed kernels and
//! agrees with the CPU step by step. A dense model, one with experts (whose
//! routers stay as stored), and a dense one whose rows fill the K-quants'
//! super-blocks of 256 (the tiny ones fall back to 32-value formats).

use std::collections::BTreeMap;
use std::path::Path;

use kiln_host::engine::Generator;
use kiln_host::model::{LoadOptions, LoadQuantization, Model};
use kiln_kernels::quant::{dequantize_row, quantize_row, QuantType};
use kiln_tests::models::{
    cuda_test_device, relative_difference, shape_options, tiny_model, write_model_dir, DeviceChoice,
};
use kiln_tests::reference::FixtureTensor;

const PROMPT: [u32; 6] = [3, 17, 42, 5, 88, 9];

/// Loads the model directory `dir` on `device`, quantized as `quantization`
/// (an f32 KV cache, so that the CUDA backend's steps are the CPU's).
fn load(dir: &Path, device: DeviceChoice, quantization: LoadQuantization) -> Model {
    let registry = kiln_host::plugins::ArchitectureRegistry::load(&[]).unwrap();
    let resolved = kiln_host::model::resolve(dir.to_str().unwrap(), None, None).unwrap();
    let options = LoadOptions {
        max_length: None,
        quantization,
        kv_cache_dtype: kiln_host::runtime::KvCacheDtype::Float32,
        ..shape_options(device)
    };
    kiln_host::model::load(&registry, resolved, &options).unwrap()
}

/// The logits of every prompt position, one decode step each.
fn logits(model: &Model) -> Vec<Vec<f32>> {
    let mut generator = Generator::new(model, PROMPT.len()).unwrap();
    PROMPT
        .iter()
        .map(|&token| generator.feed(&[token], false).unwrap().remove(0))
        .collect()
}

/// The format llama-quantize stores the weight `name` of a two-layer model
/// in, for `how` (`None`: kept as stored), `gqa` query heads sharing a
/// key/value head. Of two layers, `use_more_bits` holds for layer 1 only,
/// and Q3_K_M's early layers are both layers for value projections and
/// none for down projections.
fn expected_format(
    how: LoadQuantization,
    name: &str,
    shape: &[usize],
    vocab: usize,
    gqa: usize,
) -> Option<QuantType> {
    use LoadQuantization as L;
    let cols = *shape.last().unwrap();
    if shape.len() < 2 || name.ends_with(".mlp.gate.weight") {
        return None;
    }
    let lm_head = name == "lm_head.weight";
    let (v, down, o) = (
        name.contains(".v_proj."),
        name.contains(".down_proj."),
        name.contains(".o_proj."),
    );
    let widened = (v || down) && name.contains(".layers.1.");
    let wanted = match how {
        L::None => return None,
        L::Q8_0 => QuantType::Q8_0,
        L::Q4_0 if shape[0] == vocab => QuantType::Q8_0,
        L::Q4_0 => QuantType::Q4_0,
        _ if lm_head && !cols.is_multiple_of(256) => QuantType::Q8_0,
        _ if lm_head => QuantType::Q6K,
        L::Q4KM | L::Q5KM if widened => QuantType::Q6K,
        L::Q4KM => QuantType::Q4K,
        L::Q5KM => QuantType::Q5K,
        L::Q3KM if v => QuantType::Q5K,
        L::Q3KM if down || o => QuantType::Q4K,
        L::Q3KM => QuantType::Q3K,
        L::Q2K if v && gqa >= 4 => QuantType::Q4K,
        L::Q2K if v || down || o => QuantType::Q3K,
        L::Q2K => QuantType::Q2K,
        // No early eighth of two layers; value projections need four
        // query heads a key/value head.
        L::IQ4XS if v && gqa >= 4 => QuantType::Q5K,
        L::IQ4XS => QuantType::IQ4XS,
    };
    let ty = match wanted {
        QuantType::Q2K | QuantType::Q3K if !cols.is_multiple_of(256) => QuantType::Q4_0,
        QuantType::Q4K if !cols.is_multiple_of(256) => QuantType::Q5_0,
        QuantType::Q5K if !cols.is_multiple_of(256) => QuantType::Q5_1,
        QuantType::Q6K if !cols.is_multiple_of(256) => QuantType::Q8_0,
        QuantType::IQ4XS if !cols.is_multiple_of(256) => QuantType::IQ4NL,
        ty => ty,
    };
    cols.is_multiple_of(ty.block_elems()).then_some(ty)
}

/// Query heads per key/value head in `config`.
fn gqa(config: &serde_json::Value) -> usize {
    let heads = config["num_attention_heads"].as_u64().unwrap();
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(heads);
    (heads / kv_heads) as usize
}

/// `weights` with every matrix `how` quantizes replaced by its blocks
/// decoded (what the quantized model computes with).
fn rounded_through(
    weights: &BTreeMap<String, FixtureTensor>,
    how: LoadQuantization,
    config: &serde_json::Value,
) -> BTreeMap<String, FixtureTensor> {
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    weights
        .iter()
        .map(|(name, tensor)| {
            let Some(ty) = expected_format(how, name, &tensor.shape, vocab, gqa(config)) else {
                return (name.clone(), tensor.clone());
            };
            let cols = *tensor.shape.last().unwrap();
            let values: Vec<f32> = tensor.values().iter().map(|&v| v as f32).collect();
            let mut rounded = Vec::with_capacity(values.len());
            let mut blocks = vec![0u8; ty.row_bytes(cols).unwrap()];
            let mut row = vec![0f32; cols];
            for x in values.chunks_exact(cols) {
                quantize_row(ty, x, &mut blocks).unwrap();
                dequantize_row(ty, &blocks, &mut row).unwrap();
                rounded.extend(row.iter().map(|&v| f64::from(v)));
            }
            (
                name.clone(),
                FixtureTensor::f32(tensor.shape.clone(), &rounded),
            )
        })
        .collect()
}

/// tiny_llama widened to rows of 256 and 512 values, random weights of
/// matrices' scale.
fn wide_llama() -> (serde_json::Value, BTreeMap<String, FixtureTensor>) {
    let (mut config, weights) = tiny_model("tiny_llama.json");
    let (hidden, inter, heads, kv_heads, head_dim) = (256, 512, 4, 2, 64);
    config["hidden_size"] = hidden.into();
    config["intermediate_size"] = inter.into();
    config["num_attention_heads"] = heads.into();
    config["num_key_value_heads"] = kv_heads.into();
    config["head_dim"] = head_dim.into();
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = |n: usize, scale: f64| -> Vec<f64> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
            })
            .collect()
    };
    let wide = weights
        .keys()
        .map(|name| {
            let shape = match name.rsplit('.').nth(1).unwrap() {
                "lm_head" | "embed_tokens" => vec![vocab, hidden],
                "q_proj" => vec![heads * head_dim, hidden],
                "k_proj" | "v_proj" => vec![kv_heads * head_dim, hidden],
                "o_proj" => vec![hidden, heads * head_dim],
                "gate_proj" | "up_proj" => vec![inter, hidden],
                "down_proj" => vec![hidden, inter],
                _ => vec![hidden],
            };
            let values = if shape.len() == 1 {
                vec![1.0; hidden]
            } else {
                random(shape.iter().product(), 1.0 / (shape[1] as f64).sqrt())
            };
            (name.clone(), FixtureTensor::f32(shape, &values))
        })
        .collect();
    (config, wide)
}

fn check(fixture: &str) {
    let (config, weights) = tiny_model(fixture);
    check_model(fixture, &config, &weights);
}

fn check_model(
    fixture: &str,
    config: &serde_json::Value,
    weights: &BTreeMap<String, FixtureTensor>,
) {
    let original = tempfile::tempdir().unwrap();
    write_model_dir(config, weights, original.path(), false);
    let cpu = DeviceChoice::Cpu;
    let unquantized = logits(&load(original.path(), cpu, LoadQuantization::None));
    for how in [
        LoadQuantization::Q8_0,
        LoadQuantization::Q4_0,
        LoadQuantization::Q5KM,
        LoadQuantization::Q4KM,
        LoadQuantization::Q3KM,
        LoadQuantization::Q2K,
        LoadQuantization::IQ4XS,
    ] {
        let rounded = tempfile::tempdir().unwrap();
        write_model_dir(
            config,
            &rounded_through(weights, how, config),
            rounded.path(),
            false,
        );
        let quantized = logits(&load(original.path(), cpu, how));
        let want = logits(&load(rounded.path(), cpu, LoadQuantization::None));
        for (position, ((q, w), u)) in quantized.iter().zip(&want).zip(&unquantized).enumerate() {
            let d = relative_difference(w, q);
            assert!(
                d < 1e-5,
                "{fixture} {how:?} {position}: at load vs rounded weights {d:.2e}"
            );
            let moved = relative_difference(u, q);
            assert!(
                moved > 1e-4,
                "{fixture} {how:?} {position}: quantizing moved the logits by only {moved:.2e}"
            );
        }

        let device = cuda_test_device();
        let on_cuda = logits(&load(original.path(), device, how));
        for (position, (c, q)) in on_cuda.iter().zip(&quantized).enumerate() {
            let d = relative_difference(q, c);
            assert!(
                d < 1e-4,
                "{fixture} {how:?} {position}: {device:?} vs CPU {d:.2e}"
            );
        }
    }
}

#[test]
fn a_dense_model_quantized_at_load_computes_with_ggml_blocks() {
    check("tiny_llama.json");
}

#[test]
fn a_model_with_experts_quantized_at_load_computes_with_ggml_blocks() {
    check("tiny_qwen3_moe_step1.json");
}

#[test]
fn a_model_of_whole_super_blocks_quantized_at_load_computes_with_k_quants_and_iq4_xs() {
    let (config, weights) = wide_llama();
    // The mixes do reach every K-quant here.
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    let mut formats = std::collections::BTreeSet::new();
    for how in [
        LoadQuantization::Q5KM,
        LoadQuantization::Q4KM,
        LoadQuantization::Q3KM,
        LoadQuantization::Q2K,
        LoadQuantization::IQ4XS,
    ] {
        for (name, tensor) in &weights {
            formats.extend(
                expected_format(how, name, &tensor.shape, vocab, gqa(&config)).map(|ty| ty.name()),
            );
        }
    }
    for ty in [
        QuantType::Q2K,
        QuantType::Q3K,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::IQ4XS,
    ] {
        assert!(formats.contains(ty.name()), "{ty}");
    }
    check_model("wide llama", &config, &weights);
}
