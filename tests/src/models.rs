//! Model directories for tests, written the way Hugging Face saves them.

use std::collections::BTreeMap;
use std::path::Path;

pub use kiln_host::device::DeviceChoice;
pub use kiln_host::runtime::cuda::WeightDtype;

use safetensors::tensor::{Dtype, TensorView};

use crate::reference::FixtureTensor;

/// Writes `config.json` and the weights as f32 safetensors into `dir`: one
/// `model.safetensors`, or two shards and `model.safetensors.index.json`.
pub fn write_model_dir(
    config: &serde_json::Value,
    weights: &BTreeMap<String, FixtureTensor>,
    dir: &Path,
    sharded: bool,
) {
    write_model_dir_as(config, weights, dir, sharded, Dtype::F32);
}

/// [`write_model_dir`] with the weights stored as `dtype` (F32, F16 or BF16).
pub fn write_model_dir_as(
    config: &serde_json::Value,
    weights: &BTreeMap<String, FixtureTensor>,
    dir: &Path,
    sharded: bool,
    dtype: Dtype,
) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let encode = |v: f64| -> Vec<u8> {
        match dtype {
            Dtype::BF16 => half::bf16::from_f64(v).to_le_bytes().to_vec(),
            Dtype::F16 => half::f16::from_f64(v).to_le_bytes().to_vec(),
            _ => (v as f32).to_le_bytes().to_vec(),
        }
    };
    let tensors: Vec<(String, Vec<u8>, Vec<usize>)> = weights
        .iter()
        .map(|(name, t)| {
            (
                name.clone(),
                t.values().iter().flat_map(|&v| encode(v)).collect(),
                t.shape.clone(),
            )
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, bytes, shape)| {
            (
                name.clone(),
                TensorView::new(dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    if sharded {
        let (first, second) = views.split_at(views.len() / 2);
        let mut weight_map = serde_json::Map::new();
        for (file, part) in [
            ("model-00001-of-00002.safetensors", first),
            ("model-00002-of-00002.safetensors", second),
        ] {
            safetensors::serialize_to_file(part.iter().cloned(), None, &dir.join(file)).unwrap();
            for (name, _) in part {
                weight_map.insert(name.clone(), file.into());
            }
        }
        let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    } else {
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }
}

/// Every tiny decoder fixture of `gen_tiny_models.py`, one per family and
/// config switch.
pub const TINY_FAMILIES: [&str; 22] = [
    "tiny_llama.json",
    "tiny_llama_tied.json",
    "tiny_mistral.json",
    "tiny_qwen2.json",
    "tiny_qwen3.json",
    "tiny_gemma3.json",
    "tiny_gemma2.json",
    "tiny_phi3.json",
    "tiny_gpt2.json",
    "tiny_starcoder2.json",
    "tiny_granite.json",
    "tiny_smollm3.json",
    "tiny_olmo2.json",
    "tiny_phi2.json",
    "tiny_mixtral.json",
    "tiny_qwen2_moe.json",
    "tiny_qwen3_moe.json",
    "tiny_phi3_partial.json",
    "tiny_gpt_neox.json",
    "tiny_gpt_neox_sequential.json",
    "tiny_deepseek_v3.json",
    "tiny_deepseek_v3_lite.json",
];

/// The tiny model fixture `name` (config and weights).
pub fn tiny_model(name: &str) -> (serde_json::Value, BTreeMap<String, FixtureTensor>) {
    #[derive(serde::Deserialize)]
    struct Parts {
        config: serde_json::Value,
        weights: BTreeMap<String, FixtureTensor>,
    }
    let path = crate::workspace_root()
        .join("tests/fixtures/reference")
        .join(name);
    let parts: Parts = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    (parts.config, parts.weights)
}

/// Loads `--model PATH` (a model directory or a `.gguf` file) with the
/// built-in plugins, exact arithmetic and no compile cache, like a user's run.
pub fn load_model(path: &Path) -> kiln_host::model::Model {
    load_model_on(path, DeviceChoice::Cpu, WeightDtype::Auto)
}

/// The device of the CUDA backend tests: the kernel emulator, unless
/// `KILN_TEST_CUDA_DEVICE` names a GPU (`cuda`, `cuda:N`: the GPU suite runs
/// the same tests on the real driver that way).
pub fn cuda_test_device() -> DeviceChoice {
    std::env::var("KILN_TEST_CUDA_DEVICE").map_or(DeviceChoice::CudaEmulated, |name| {
        name.parse()
            .unwrap_or_else(|e| panic!("KILN_TEST_CUDA_DEVICE: {e}"))
    })
}

/// [`load_model`] on `device`, with weights for products stored as `dtype`.
pub fn load_model_on(
    path: &Path,
    device: DeviceChoice,
    dtype: WeightDtype,
) -> kiln_host::model::Model {
    load_model_as(path, device, dtype, Default::default()).unwrap()
}

/// [`load_model_on`], run as `runner` says (`--runner`).
pub fn load_model_as(
    path: &Path,
    device: DeviceChoice,
    dtype: WeightDtype,
    runner: kiln_host::model::Runner,
) -> Result<kiln_host::model::Model, kiln_host::model::ModelError> {
    let registry = kiln_host::plugins::ArchitectureRegistry::load(&[]).unwrap();
    let resolved = kiln_host::model::resolve(path.to_str().unwrap(), None, None).unwrap();
    let options = kiln_host::model::LoadOptions {
        max_length: None,
        precision: kiln_host::runtime::Precision::Exact,
        compile_cache: kiln_host::compiler::CompileCache::disabled(),
        device,
        dtype,
        enforce_eager: false,
        kv_cache_dtype: Default::default(),
        attention_backend: Default::default(),
        check_weights: false,
        gemv_splits: Default::default(),
        dense_rows: None,
        runner,
        quantization: Default::default(),
    };
    kiln_host::model::load(&registry, resolved, &options)
}

/// The real SmolLM2-135M GGUF that `.ci/setup` fetches (or
/// `KILN_SMOLLM2_GGUF`), when it is there.
pub fn smollm2_gguf() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("KILN_SMOLLM2_GGUF")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            crate::workspace_root().join("target/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    path.is_file().then_some(path)
}

/// The real all-MiniLM-L6-v2 directory that `.ci/setup` unpacks (or
/// `KILN_MINILM_DIR`); the embedding tests require it.
pub fn minilm_dir() -> std::path::PathBuf {
    let path = std::env::var_os("KILN_MINILM_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target/models/all-MiniLM-L6-v2"));
    assert!(
        path.join("model.safetensors").is_file(),
        "all-MiniLM-L6-v2 is missing at {}: run .ci/setup (or set KILN_MINILM_DIR)",
        path.display()
    );
    path
}

/// Options for loading the tiny shape onto `device`: exact arithmetic, no
/// compile cache, up to 512 positions, every CUDA choice at its default
/// (callers change the ones they test).
pub fn shape_options(device: DeviceChoice) -> kiln_host::model::LoadOptions {
    kiln_host::model::LoadOptions {
        max_length: Some(512),
        precision: kiln_host::runtime::Precision::Exact,
        compile_cache: kiln_host::compiler::CompileCache::disabled(),
        device,
        dtype: WeightDtype::Auto,
        enforce_eager: false,
        kv_cache_dtype: Default::default(),
        attention_backend: Default::default(),
        check_weights: false,
        gemv_splits: Default::default(),
        dense_rows: None,
        runner: Default::default(),
        quantization: Default::default(),
    }
}

/// The tiny Llama shape of `tests/fixtures/shapes/tiny-llama.json` (2
/// layers of width 256, 4 heads of 64 over 2 key/value heads, a vocabulary
/// of 768, up to 512 positions) with random weights stored as `weights`,
/// loaded with `options`.
pub fn tiny_llama_shape(
    weights: kiln_host::model::synthetic::ShapeDtype,
    options: &kiln_host::model::LoadOptions,
) -> kiln_host::model::Model {
    shape_model("tiny-llama.json", weights, options)
}

/// The shape `tests/fixtures/shapes/<file>` with random weights stored as
/// `weights`, loaded with `options`.
pub fn shape_model(
    file: &str,
    weights: kiln_host::model::synthetic::ShapeDtype,
    options: &kiln_host::model::LoadOptions,
) -> kiln_host::model::Model {
    let registry = kiln_host::plugins::ArchitectureRegistry::load(&[]).unwrap();
    let shape = crate::workspace_root()
        .join("tests/fixtures/shapes")
        .join(file);
    let shape = shape.to_str().unwrap();
    let config = kiln_host::model::synthetic::shape_config(shape).unwrap();
    kiln_host::model::synthetic::load(&registry, shape, config, weights, options).unwrap()
}

/// Largest |a - b| over the largest |a| (infinite when a value is NaN).
pub fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    let scale = a.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    if worst.is_nan() {
        f32::INFINITY
    } else {
        worst / scale
    }
}

/// Feeds `prompt` one token a step to both models and checks each step's
/// logits agree within a relative 1e-4 (`what` names the case).
pub fn decode_agrees(
    cpu: &kiln_host::model::Model,
    cuda: &kiln_host::model::Model,
    prompt: &[u32],
    what: &str,
) {
    use kiln_host::engine::Generator;
    let mut on_cpu = Generator::new(cpu, prompt.len()).unwrap();
    let mut on_cuda = Generator::new(cuda, prompt.len()).unwrap();
    for (position, &token) in prompt.iter().enumerate() {
        let a = on_cpu.feed(&[token], false).unwrap().remove(0);
        let b = on_cuda.feed(&[token], false).unwrap().remove(0);
        let d = relative_difference(&a, &b);
        assert!(d < 1e-4, "{what} decode {position}: relative |Δ| {d:.2e}");
    }
}
