//! The families added since plugin-api 1.5 against transformers (see
//! `kiln_tests::tiny` for what each check runs): GPT-NeoX/Pythia with its
//! fused per-head q/k/v, DeepSeek-V3's multi-head latent attention over a
//! latent KV cache and its grouped sigmoid mixture of experts, and Phi-3
//! with partial rotary (Phi-4-mini) — on the CPU and on the CUDA backend.

use kiln_tests::models::DeviceChoice;
use kiln_tests::tiny::{matches_transformers_on, on_cuda};

fn on_cpu(name: &str) {
    matches_transformers_on(name, false, DeviceChoice::Cpu);
}

/// Pythia's layout: parallel residual with two LayerNorms, rotary on a
/// quarter of each head, `query_key_value` interleaved per head, biases,
/// exact GELU, untied.
#[test]
fn tiny_gpt_neox_with_parallel_residual_matches_transformers() {
    on_cpu("tiny_gpt_neox.json");
}

/// Sequential residual, no attention biases, half of each head rotated,
/// GELU-tanh, tied.
#[test]
fn tiny_gpt_neox_sequential_matches_transformers() {
    on_cpu("tiny_gpt_neox_sequential.json");
}

/// The low-rank query path, a value head size of its own, interleaved
/// rotary with YaRN and DeepSeek's mscale, a dense first layer, then eight
/// experts in four groups (two picked groups, two experts per token,
/// sigmoid scores with a correction bias, renormalized, scaled by 2.5) and
/// a shared expert. The generator checks every routing decision has a
/// clear margin.
#[test]
fn tiny_deepseek_v3_with_latent_attention_and_grouped_experts_matches_transformers() {
    on_cpu("tiny_deepseek_v3.json");
}

/// One query projection, rotary on halves, one expert group, weights not
/// renormalized, two shared experts, tied.
#[test]
fn tiny_deepseek_v3_lite_matches_transformers() {
    on_cpu("tiny_deepseek_v3_lite.json");
}

/// Phi-4-mini's switches: three quarters of each head rotated, tied.
#[test]
fn tiny_phi3_with_partial_rotary_matches_transformers() {
    on_cpu("tiny_phi3_partial.json");
}

#[test]
fn tiny_gpt_neox_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_gpt_neox.json", false);
    on_cuda("tiny_gpt_neox_sequential.json", false);
}

#[test]
fn tiny_deepseek_v3_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_deepseek_v3.json", false);
    on_cuda("tiny_deepseek_v3_lite.json", false);
}

#[test]
fn tiny_phi3_partial_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_phi3_partial.json", false);
}
