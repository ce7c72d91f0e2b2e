//! GGUF files made by llama.cpp's own converter (`convert_hf_to_gguf.py`,
//! from the llama-cpp-python 0.3.36 sdist) from the tiny random fixtures
//! (`tests/fixtures/reference/tiny_*.{f32,q8_0}.gguf`, made by
//! `gen_tiny_gguf.py`, described by `tiny_gguf.json`), loaded like a user's
//! `--model file.gguf` (config from the GGUF metadata, llama.cpp's tensor names
//! and layouts) and run against Hugging Face transformers' logits: every
//! position of each prompt in one prefill, token by token through the cache,
//! and greedy generation.
//!
//! The reference is the fixture's own (`tiny_*.json`) where the GGUF holds the
//! fixture's model exactly (the f32 files); for Q8_0 files it is transformers
//! run on the dequantized weights, and for Gemma 3 transformers with the layer
//! pattern llama.cpp assigns (the GGUF stores none): both recorded in the
//! manifest. Either way the tolerance is the fixtures' atol = rtol = 1e-4.

use std::collections::BTreeSet;

use kiln_host::engine::sampling::argmax;
use kiln_host::engine::Generator;
use kiln_host::model::Model;
use kiln_host::runtime::Tensor;
use kiln_tests::models::{DeviceChoice, WeightDtype};
use kiln_tests::reference::{compare, FixtureTensor};
use serde::Deserialize;

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

#[derive(Deserialize)]
struct Manifest {
    files: Vec<Entry>,
}

/// One GGUF file of `tiny_gguf.json`.
#[derive(Deserialize)]
struct Entry {
    file: String,
    fixture: String,
    outtype: String,
    bytes: u64,
    /// `fixture`, or what the recorded logits were computed from.
    reference: String,
    #[serde(default)]
    logits: Option<Vec<FixtureTensor>>,
    #[serde(default)]
    greedy: Option<Vec<i64>>,
}

#[derive(Deserialize)]
struct Fixture {
    architecture: String,
    prompts: Vec<Vec<i64>>,
    logits: Vec<FixtureTensor>,
    greedy: Vec<i64>,
}

fn fixture_dir() -> std::path::PathBuf {
    kiln_tests::workspace_root().join("tests/fixtures/reference")
}

fn manifest() -> Manifest {
    let text = std::fs::read_to_string(fixture_dir().join("tiny_gguf.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Loads a `.gguf` file the way `--model file.gguf` does, with exact
/// arithmetic, onto `device` (f32 products on CUDA).
fn load_gguf(path: &std::path::Path, device: DeviceChoice) -> Model {
    let model = kiln_tests::models::load_model_on(path, device, WeightDtype::Float32);
    assert!(
        model.resolved.dir.is_none(),
        "no config.json: the GGUF metadata only"
    );
    model
}

/// Largest |actual - expected| so far and how many rows had the same argmax.
#[derive(Default)]
struct Stats {
    max_abs_diff: f64,
    rows: usize,
    argmax_agree: usize,
}

impl Stats {
    fn check(&mut self, actual: &[f32], expected: &FixtureTensor, what: &str) {
        let want = expected.values();
        for (&a, &e) in actual.iter().zip(&want) {
            self.max_abs_diff = self.max_abs_diff.max((f64::from(a) - e).abs());
        }
        let top = |v: &[f64]| {
            v.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i)
        };
        let actual64: Vec<f64> = actual.iter().map(|&v| f64::from(v)).collect();
        self.rows += 1;
        self.argmax_agree += usize::from(top(&actual64) == top(&want));
        let tensor = Tensor::f32(vec![actual.len()], actual.to_vec());
        if let Err(e) = compare(&tensor, expected, ATOL, RTOL) {
            panic!("{what}: {e}");
        }
    }
}

fn gguf_matches_transformers(file: &str) {
    gguf_matches_transformers_on(file, DeviceChoice::Cpu);
}

/// Prefill (every position), token-by-token decode and greedy generation of
/// the GGUF `file` on `device`, against transformers.
fn gguf_matches_transformers_on(file: &str, device: DeviceChoice) {
    let manifest = manifest();
    let entry = manifest
        .files
        .iter()
        .find(|e| e.file == file)
        .unwrap_or_else(|| panic!("{file} is not in tiny_gguf.json"));
    let path = fixture_dir().join(&entry.file);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        entry.bytes,
        "{file} is not the file tiny_gguf.json describes; rerun gen_tiny_gguf.py"
    );
    let fixture: Fixture =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join(&entry.fixture)).unwrap())
            .unwrap();
    let (logits, greedy) = match entry.reference.as_str() {
        "fixture" => (&fixture.logits, &fixture.greedy),
        other => (
            entry
                .logits
                .as_ref()
                .unwrap_or_else(|| panic!("{file}: reference `{other}` without logits")),
            entry.greedy.as_ref().unwrap(),
        ),
    };

    let model = load_gguf(&path, device);
    assert_eq!(model.architecture.info.name, fixture.architecture);
    assert!(
        model.unused_tensors.is_empty(),
        "{:?}",
        model.unused_tensors
    );
    assert!(model.tokenizer.is_some(), "the GGUF's vocabulary loads");

    let mut stats = Stats::default();
    for (p, (prompt, expected)) in fixture.prompts.iter().zip(logits).enumerate() {
        let prompt: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
        // One prefill, every position's logits.
        let mut generator = Generator::new(&model, prompt.len()).unwrap();
        let out = generator.feed(&prompt, true).unwrap();
        assert_eq!(out.len(), prompt.len());
        for (i, actual) in out.iter().enumerate() {
            stats.check(
                actual,
                &expected.row(i),
                &format!("{file} prompt {p} prefill position {i}"),
            );
        }
        // Token by token, through the cache.
        let mut generator = Generator::new(&model, prompt.len()).unwrap();
        for (i, &token) in prompt.iter().enumerate() {
            let actual = generator.feed(&[token], false).unwrap().remove(0);
            stats.check(
                &actual,
                &expected.row(i),
                &format!("{file} prompt {p} decode position {i}"),
            );
        }
    }

    // Greedy generation from the longest prompt.
    let prompt: Vec<u32> = fixture
        .prompts
        .iter()
        .max_by_key(|p| p.len())
        .unwrap()
        .iter()
        .map(|&t| t as u32)
        .collect();
    let mut generator = Generator::new(&model, prompt.len() + greedy.len()).unwrap();
    let mut next_logits = generator.feed(&prompt, false).unwrap().remove(0);
    let mut generated = Vec::new();
    for _ in 0..greedy.len() {
        let next = argmax(&next_logits);
        generated.push(i64::from(next));
        next_logits = generator.feed(&[next], false).unwrap().remove(0);
    }
    assert_eq!(&generated, greedy, "{file}: greedy tokens");
    eprintln!(
        "{file} on {device} ({}, reference: {}): max |logit diff| {:.3e}, argmax agreement {}/{}, greedy {:?}",
        entry.outtype,
        entry.reference,
        stats.max_abs_diff,
        stats.argmax_agree,
        stats.rows,
        generated
    );
}

const TESTED: [&str; 23] = [
    "tiny_llama.f32.gguf",
    "tiny_llama_tied.f32.gguf",
    "tiny_qwen2.f32.gguf",
    "tiny_qwen3.f32.gguf",
    "tiny_gemma3.f32.gguf",
    "tiny_gemma2.f32.gguf",
    "tiny_phi3.f32.gguf",
    "tiny_phi3.q8_0.gguf",
    "tiny_gpt2.f32.gguf",
    "tiny_gpt2.q8_0.gguf",
    "tiny_starcoder2.f32.gguf",
    "tiny_gpt_neox.f32.gguf",
    "tiny_granite.f32.gguf",
    "tiny_olmo2.f32.gguf",
    "tiny_smollm3.f32.gguf",
    "tiny_phi2_mha.f32.gguf",
    "tiny_mixtral_no_window.f32.gguf",
    "tiny_qwen2_moe_every_layer.f32.gguf",
    "tiny_qwen3_moe_step1.f32.gguf",
    "tiny_qwen3_moe_step1.q8_0.gguf",
    "tiny_deepseek_v3.f32.gguf",
    "tiny_deepseek_v3.q8_0.gguf",
    "tiny_deepseek_v3_lite.f32.gguf",
];

/// Every GGUF fixture (llama.cpp's converter: permuted Q/K with adjacent-pair
/// rotation, rope factors, q8_0 blocks dequantized at load) through the CUDA
/// backend (the kernel emulator, or a GPU with KILN_TEST_CUDA_DEVICE).
#[test]
fn every_gguf_fixture_on_the_cuda_backend_matches_transformers() {
    for file in TESTED {
        gguf_matches_transformers_on(file, kiln_tests::models::cuda_test_device());
    }
}

#[test]
fn every_gguf_fixture_has_a_test() {
    let listed: BTreeSet<String> = manifest().files.into_iter().map(|e| e.file).collect();
    let tested: BTreeSet<String> = TESTED.iter().map(|s| s.to_string()).collect();
    assert_eq!(listed, tested);
    for file in TESTED {
        assert!(fixture_dir().join(file).is_file(), "{file} is missing");
    }
}

/// Llama 3 rope scaling: llama.cpp's converter stores it as the per-frequency
/// divisors `rope_freqs.weight`, which Kiln reads into the config.
#[test]
fn tiny_llama_f32_gguf_with_llama3_rope_factors_matches_transformers() {
    gguf_matches_transformers("tiny_llama.f32.gguf");
}

/// llama.cpp permutes Llama's q/k rows for its interleaved rope (here with a
/// single kv head) and leaves out the tied `output.weight`.
#[test]
fn tiny_llama_tied_f32_gguf_with_permuted_qk_matches_transformers() {
    gguf_matches_transformers("tiny_llama_tied.f32.gguf");
}

#[test]
fn tiny_qwen2_f32_gguf_with_qkv_biases_matches_transformers() {
    gguf_matches_transformers("tiny_qwen2.f32.gguf");
}

#[test]
fn tiny_qwen3_f32_gguf_with_qk_norms_matches_transformers() {
    gguf_matches_transformers("tiny_qwen3.f32.gguf");
}

/// Norms stored as `1 + w`, `ffn_norm` before the MLP, the local rope base in
/// `rope.freq_base_swa`; every layer slides (llama.cpp's pattern for 4 layers).
#[test]
fn tiny_gemma2_f32_gguf_with_soft_caps_matches_transformers() {
    gguf_matches_transformers("tiny_gemma2.f32.gguf");
}

#[test]
fn tiny_gemma3_f32_gguf_with_shifted_norms_matches_transformers() {
    gguf_matches_transformers("tiny_gemma3.f32.gguf");
}

/// Fused `attn_qkv` and `ffn_up` (gate and up), `sliding_window` 0 meaning none.
#[test]
fn tiny_phi3_f32_gguf_with_fused_projections_matches_transformers() {
    gguf_matches_transformers("tiny_phi3.f32.gguf");
}

#[test]
fn tiny_starcoder2_f32_gguf_with_layernorm_biases_matches_transformers() {
    gguf_matches_transformers("tiny_starcoder2.f32.gguf");
}

/// GPT-NeoX: llama.cpp's converter stacks the per-head q/k/v rows of
/// `query_key_value`; the rotated share comes from `rope.dimension_count`.
#[test]
fn tiny_gpt_neox_f32_gguf_with_stacked_qkv_matches_transformers() {
    gguf_matches_transformers("tiny_gpt_neox.f32.gguf");
}

#[test]
fn tiny_phi3_q8_0_gguf_matches_transformers_on_dequantized_weights() {
    gguf_matches_transformers("tiny_phi3.q8_0.gguf");
}

/// Conv1D weights stored transposed, learned positions kept in f32.
#[test]
fn tiny_gpt2_f32_gguf_with_transposed_projections_matches_transformers() {
    gguf_matches_transformers("tiny_gpt2.f32.gguf");
}

#[test]
fn tiny_gpt2_q8_0_gguf_matches_transformers_on_dequantized_weights() {
    gguf_matches_transformers("tiny_gpt2.q8_0.gguf");
}

/// Granite's four multipliers from `granite.{attention.scale, embedding_scale,
/// residual_scale, logit_scale}`; q/k rows and biases permuted.
#[test]
fn tiny_granite_f32_gguf_with_multipliers_and_biases_matches_transformers() {
    gguf_matches_transformers("tiny_granite.f32.gguf");
}

/// OLMo 2: post-norms and whole-projection q/k norms, Q/K not permuted.
#[test]
fn tiny_olmo2_f32_gguf_with_post_norms_matches_transformers() {
    gguf_matches_transformers("tiny_olmo2.f32.gguf");
}

/// SmolLM3: the file stores no rotary pattern; llama.cpp's (every fourth
/// layer without rotary, no sliding window) is the reference.
#[test]
fn tiny_smollm3_f32_gguf_with_llama_cpp_rope_pattern_matches_transformers() {
    gguf_matches_transformers("tiny_smollm3.f32.gguf");
}

/// Phi-2: partial rotary from `rope.dimension_count`, biases on the LM head.
#[test]
fn tiny_phi2_f32_gguf_with_partial_rotary_matches_transformers() {
    gguf_matches_transformers("tiny_phi2_mha.f32.gguf");
}

/// Mixtral, converted as `llama` with `expert_count`: stacked experts split
/// per expert, Q/K permuted.
#[test]
fn tiny_mixtral_f32_gguf_with_stacked_experts_matches_transformers() {
    gguf_matches_transformers("tiny_mixtral_no_window.f32.gguf");
}

/// Qwen2-MoE: stacked experts and the gated shared expert.
#[test]
fn tiny_qwen2_moe_f32_gguf_with_shared_expert_matches_transformers() {
    gguf_matches_transformers("tiny_qwen2_moe_every_layer.f32.gguf");
}

#[test]
fn tiny_qwen3_moe_f32_gguf_with_renormalized_experts_matches_transformers() {
    gguf_matches_transformers("tiny_qwen3_moe_step1.f32.gguf");
}

#[test]
fn tiny_qwen3_moe_q8_0_gguf_matches_transformers_on_dequantized_weights() {
    gguf_matches_transformers("tiny_qwen3_moe_step1.q8_0.gguf");
}

/// DeepSeek-V3 as `deepseek2`: latent attention with `kv_b_proj` split per
/// head (`attn_k_b`, `attn_v_b`), the low-rank query path, YaRN's
/// `mscale_all_dim` from `yarn_log_multiplier`, grouped sigmoid routing with
/// the correction bias `exp_probs_b`, a shared expert, one dense layer.
#[test]
fn tiny_deepseek_v3_f32_gguf_with_split_latent_projections_matches_transformers() {
    gguf_matches_transformers("tiny_deepseek_v3.f32.gguf");
}

#[test]
fn tiny_deepseek_v3_q8_0_gguf_matches_transformers_on_dequantized_weights() {
    gguf_matches_transformers("tiny_deepseek_v3.q8_0.gguf");
}

/// DeepSeek-V2-Lite's query path (`attn_q`, no `q_lora_rank`), one expert
/// group, weights not renormalized, two shared experts; adjacent-pair
/// rotary, as llama.cpp runs every `deepseek2` file.
#[test]
fn tiny_deepseek_v3_lite_f32_gguf_with_direct_queries_matches_transformers() {
    gguf_matches_transformers("tiny_deepseek_v3_lite.f32.gguf");
}
