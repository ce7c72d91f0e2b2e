//! `--quantization q8_0|q4_0`: a checkpoint's float matrices quantized at
//! load.
//!
//! The exact products of the quantized model equal (up to summation order)
//! those of the same model whose matrices were quantized and dequantized
//! beforehand with ggml's rounding (Q4_0's vocabulary matrices in Q8_0),
//! and differ from the unquantized model's: the quantization happened, with
//! ggml's blocks. The CUDA backend reads the same blocks through its packed
//! kernels and agrees with the CPU step by step. A dense model and one with
//! experts.

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

/// `weights` with every matrix whose rows are whole blocks of 32 replaced
/// by its blocks decoded (what the quantized model computes with): `ty`'s,
/// or Q8_0's for the `vocab` rows of Q4_0's vocabulary matrices.
fn rounded_through(
    weights: &BTreeMap<String, FixtureTensor>,
    ty: QuantType,
    vocab: usize,
) -> BTreeMap<String, FixtureTensor> {
    weights
        .iter()
        .map(|(name, tensor)| {
            let cols = *tensor.shape.last().unwrap();
            if tensor.shape.len() < 2 || !cols.is_multiple_of(32) {
                return (name.clone(), tensor.clone());
            }
            let ty = if tensor.shape[0] == vocab {
                QuantType::Q8_0
            } else {
                ty
            };
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

fn check(fixture: &str) {
    let (config, weights) = tiny_model(fixture);
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    let original = tempfile::tempdir().unwrap();
    write_model_dir(&config, &weights, original.path(), false);
    let cpu = DeviceChoice::Cpu;
    let unquantized = logits(&load(original.path(), cpu, LoadQuantization::None));
    for (how, ty) in [
        (LoadQuantization::Q8_0, QuantType::Q8_0),
        (LoadQuantization::Q4_0, QuantType::Q4_0),
    ] {
        let rounded = tempfile::tempdir().unwrap();
        write_model_dir(
            &config,
            &rounded_through(&weights, ty, vocab),
            rounded.path(),
            false,
        );
        let quantized = logits(&load(original.path(), cpu, how));
        let want = logits(&load(rounded.path(), cpu, LoadQuantization::None));
        for (position, ((q, w), u)) in quantized.iter().zip(&want).zip(&unquantized).enumerate() {
            let d = relative_difference(w, q);
            assert!(
                d < 1e-5,
                "{fixture} {ty} {position}: at load vs rounded weights {d:.2e}"
            );
            let moved = relative_difference(u, q);
            assert!(
                moved > 1e-4,
                "{fixture} {ty} {position}: quantizing moved the logits by only {moved:.2e}"
            );
        }

        let device = cuda_test_device();
        let on_cuda = logits(&load(original.path(), device, how));
        for (position, (c, q)) in on_cuda.iter().zip(&quantized).enumerate() {
            let d = relative_difference(q, c);
            assert!(
                d < 1e-4,
                "{fixture} {ty} {position}: {device:?} vs CPU {d:.2e}"
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
