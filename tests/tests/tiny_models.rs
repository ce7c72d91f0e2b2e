//! Whole models against Hugging Face transformers: tiny random Llama
//! checkpoints (`tests/fixtures/reference/tiny_*.json`, made by
//! `gen_tiny_models.py`) run through the built-in plugin's graph, the
//! compiler and the CPU runtime — loaded from safetensors directories written
//! from the fixtures, through resolution and the weight adapters — in prefill, chunked prefill, token-by-token
//! decode, a ragged batch of all prompts, and greedy generation.

use kiln_host::engine::batch::run_step;
use kiln_host::runtime::cuda::CudaExecutor;
use kiln_host::runtime::{CacheLayout, Tensor};
use kiln_tests::models::{write_model_dir, DeviceChoice, WeightDtype};
use kiln_tests::reference::{compare, FixtureTensor};
use kiln_tests::tiny::{check, matches_transformers_on, on_cuda, read_fixture, Engine, ATOL};

fn matches_transformers(name: &str, sharded: bool) {
    matches_transformers_on(name, sharded, DeviceChoice::Cpu);
}

#[test]
fn tiny_llama_with_llama3_rope_matches_transformers() {
    matches_transformers("tiny_llama.json", false);
}

#[test]
fn tiny_llama_with_tied_embeddings_and_mqa_from_shards_matches_transformers() {
    matches_transformers("tiny_llama_tied.json", true);
}

#[test]
fn tiny_qwen2_with_qkv_biases_matches_transformers() {
    matches_transformers("tiny_qwen2.json", false);
}

/// Greedy continuation of `prompt` by a single-sequence generator.
fn greedy_alone(model: &kiln_host::model::Model, prompt: &[u32], new: usize) -> Vec<u32> {
    let mut generator = kiln_host::engine::Generator::new(model, prompt.len() + new).unwrap();
    let mut logits = generator.feed(prompt, false).unwrap().remove(0);
    let mut out = Vec::new();
    for _ in 0..new {
        let next = kiln_host::engine::sampling::argmax(&logits);
        out.push(next);
        logits = generator.feed(&[next], false).unwrap().remove(0);
    }
    out
}

#[test]
fn continuous_batching_with_chunked_prefill_and_prefix_caching_matches_single_sequences() {
    batching_matches_single_sequences(DeviceChoice::Cpu);
}

#[test]
fn continuous_batching_on_the_cuda_backend_matches_single_sequences() {
    batching_matches_single_sequences(kiln_tests::models::cuda_test_device());
}

/// Requests arriving mid-run, chunked prefill under a token budget and a
/// prefix-cache hit generate what each request generates alone.
fn batching_matches_single_sequences(device: DeviceChoice) {
    use kiln_host::scheduler::{BlockManager, Scheduler, SchedulerConfig};

    let (config, weights) = kiln_tests::models::tiny_model("tiny_llama.json");
    let dir = tempfile::tempdir().unwrap();
    write_model_dir(&config, &weights, dir.path(), false);
    let model = kiln_tests::models::load_model_on(dir.path(), device, WeightDtype::Float32);

    let long: Vec<u32> = (1..=13).map(|t| (t * 7) % 96).collect();
    let mut shared = long[..9].to_vec();
    shared.extend([5, 6]);
    let prompts: Vec<Vec<u32>> = vec![long.clone(), vec![3], (10..16).collect(), shared];
    let new = 6;
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| greedy_alone(&model, p, new))
        .collect();

    let block_size = 4;
    let kv = model.config.kv;
    let layout = CacheLayout {
        block_size,
        num_kv_heads: kv.num_kv_heads as usize,
        head_dim: kv.head_dim as usize,
    };
    let mut cache = model
        .backend
        .new_kv_cache(kv.num_layers as usize, 24, layout)
        .unwrap();
    let config = SchedulerConfig {
        max_batch_size: 3,
        max_batch_tokens: 7,
        max_seq_len: 64,
    };
    let mut scheduler = Scheduler::new(config, BlockManager::new(24, block_size, true));
    let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    // The first request alone first, so the one sharing its prefix finds it cached.
    scheduler.add(0, prompts[0].clone(), new).unwrap();
    let mut steps = 0;
    loop {
        let batch = scheduler.schedule();
        if batch.seqs.is_empty() {
            break;
        }
        assert!(batch.num_tokens() <= 7, "the token budget holds");
        let logits = run_step(
            model.backend.as_ref(),
            &model.pipeline,
            &mut cache,
            &batch.step_batch(),
        )
        .unwrap();
        scheduler.complete(&batch);
        let mut rows = logits.into_iter();
        for seq in batch.seqs.iter().filter(|s| s.wants_logits) {
            let next = kiln_host::engine::sampling::argmax(&rows.next().unwrap()[0]);
            let out = &mut outputs[seq.id as usize];
            out.push(next);
            if out.len() == new {
                scheduler.remove(seq.id);
            } else {
                scheduler.append_token(seq.id, next);
            }
        }
        steps += 1;
        if steps == 3 {
            for (id, prompt) in prompts.iter().enumerate().skip(1) {
                scheduler.add(id as u64, prompt.clone(), new).unwrap();
            }
        }
    }
    assert_eq!(outputs, expected);
    assert!(
        scheduler.blocks().stats().hits >= 2,
        "the shared prefix was reused: {:?}",
        scheduler.blocks().stats()
    );
    assert_eq!(scheduler.blocks().used(), 0, "no block leaked");
}

/// `tie_word_embeddings: false` with an `lm_head.weight` of its own.
#[test]
fn tiny_gemma3_with_untied_embeddings_uses_its_lm_head() {
    untied_uses_its_lm_head("tiny_gemma3.json");
}

/// An untied copy of a tied Gemma fixture whose head is twice the embedding
/// gives twice transformers' logits before the final soft cap `c` (if any):
/// `c·tanh(2·atanh(logit / c))`. So the head is the one read.
fn untied_uses_its_lm_head(name: &str) {
    let mut model = read_fixture(name);
    let cap = model.config["final_logit_softcapping"].as_f64();
    model.config["tie_word_embeddings"] = false.into();
    let embed = &model.weights["model.embed_tokens.weight"];
    let doubled: Vec<f64> = embed.values().iter().map(|v| 2.0 * v).collect();
    let head = FixtureTensor::f32(embed.shape.clone(), &doubled);
    model.weights.insert("lm_head.weight".into(), head);
    let twice = |logit: f64| match cap {
        Some(c) => c * (2.0 * (logit / c).atanh()).tanh(),
        None => 2.0 * logit,
    };
    let engine = Engine::from_model(&model, false, DeviceChoice::Cpu);
    for (p, (prompt, logits)) in model.prompts.iter().zip(&model.logits).enumerate() {
        let out = engine.prefill(prompt);
        let last = logits.row(prompt.len() - 1);
        let expected: Vec<f64> = last.values().iter().map(|&v| twice(v)).collect();
        check(
            &out,
            &FixtureTensor::f32(last.shape.clone(), &expected),
            &format!("{name} prompt {p}"),
        );
    }
}

#[test]
fn tiny_gemma3_with_sliding_windows_and_post_norms_matches_transformers() {
    matches_transformers("tiny_gemma3.json", false);
}

#[test]
fn tiny_gemma2_with_soft_caps_and_alternating_windows_matches_transformers() {
    matches_transformers("tiny_gemma2.json", false);
}

#[test]
fn tiny_gemma2_with_untied_embeddings_uses_its_lm_head() {
    untied_uses_its_lm_head("tiny_gemma2.json");
}

#[test]
fn tiny_qwen3_with_qk_norms_matches_transformers() {
    matches_transformers("tiny_qwen3.json", false);
}

#[test]
fn tiny_phi3_with_fused_qkv_and_gate_up_matches_transformers() {
    matches_transformers("tiny_phi3.json", false);
}

#[test]
fn tiny_gpt2_with_learned_positions_and_conv1d_matches_transformers() {
    matches_transformers("tiny_gpt2.json", false);
}

/// Mistral: Llama-shaped, but every layer attends through a sliding window of
/// 4 positions, which the 5- and 11-token prompts and the greedy continuation
/// run past (the generator checks that the window changes the logits).
#[test]
fn tiny_mistral_with_sliding_window_matches_transformers() {
    matches_transformers("tiny_mistral.json", false);
}

/// StarCoder2: the Llama decoder with LayerNorms and biases everywhere, a
/// plain GELU-tanh MLP (`c_fc`/`c_proj`), tied embeddings and a sliding
/// window of 4 (the generator checks that the window changes the logits).
#[test]
fn tiny_starcoder2_with_layernorms_biases_and_gelu_matches_transformers() {
    matches_transformers("tiny_starcoder2.json", false);
}

/// Granite: Llama with its embedding, residual, attention and logit
/// multipliers all away from 1, biases on attention and the MLP.
#[test]
fn tiny_granite_with_its_multipliers_matches_transformers() {
    matches_transformers("tiny_granite.json", false);
}

/// SmolLM3: every second layer attends without rotary embeddings and
/// through a sliding window of 4 (the generator checks that the window
/// changes the logits); tied embeddings.
#[test]
fn tiny_smollm3_with_nope_layers_matches_transformers() {
    matches_transformers("tiny_smollm3.json", false);
}

/// OLMo 2: norms after each branch, RMS norms over the whole q and k
/// projections.
#[test]
fn tiny_olmo2_with_post_norms_and_whole_qk_norms_matches_transformers() {
    matches_transformers("tiny_olmo2.json", false);
}

/// Phi-2: attention and the MLP in parallel on one LayerNorm, rotary on
/// half of each head, biases everywhere (the LM head too), GELU-tanh.
#[test]
fn tiny_phi2_with_parallel_layers_and_partial_rotary_matches_transformers() {
    matches_transformers("tiny_phi2.json", false);
}

/// Mixtral: every MLP a mixture of four experts, two per token
/// (renormalized), per-expert `block_sparse_moe.experts.N.w1/w2/w3`
/// tensors; a sliding window of 4. The generator checks each token's
/// routing has a clear margin.
#[test]
fn tiny_mixtral_with_routed_experts_matches_transformers() {
    matches_transformers("tiny_mixtral.json", false);
}

/// Mixtral from transformers 5's own layout: each layer's experts stacked
/// in `mlp.experts.gate_up_proj [E, 2I, H]` and `mlp.experts.down_proj
/// [E, H, I]`, which the adapter splits per expert as rows of the stacked
/// tensors. The prompts' prefill logits must not change.
#[test]
fn tiny_mixtral_from_stacked_experts_matches_transformers() {
    let mut model = read_fixture("tiny_mixtral.json");
    let layers = model.config["num_hidden_layers"].as_u64().unwrap();
    let experts = model.config["num_local_experts"].as_u64().unwrap();
    let mut take = |name: String| model.weights.remove(&name).unwrap();
    let mut stacked = Vec::new();
    for layer in 0..layers {
        let prefix = format!("model.layers.{layer}.block_sparse_moe.experts");
        let (mut gate_up, mut down) = (Vec::new(), Vec::new());
        let (mut rows, mut shape) = (0, vec![]);
        for e in 0..experts {
            let [w1, w3, w2] = ["w1", "w3", "w2"].map(|w| take(format!("{prefix}.{e}.{w}.weight")));
            rows = w1.shape[0];
            shape = w2.shape.clone();
            gate_up.extend(w1.data.into_iter().chain(w3.data));
            down.extend(w2.data);
        }
        let e = experts as usize;
        let hidden = shape[0];
        let tensor = |shape: Vec<usize>, data| FixtureTensor {
            dtype: "f32".into(),
            shape,
            data,
        };
        let at = format!("model.layers.{layer}.mlp.experts");
        stacked.push((
            format!("{at}.gate_up_proj"),
            tensor(vec![e, 2 * rows, hidden], gate_up),
        ));
        stacked.push((
            format!("{at}.down_proj"),
            tensor(vec![e, hidden, rows], down),
        ));
    }
    model.weights.extend(stacked);
    let engine = Engine::from_model(&model, false, DeviceChoice::Cpu);
    for (p, (prompt, logits)) in model.prompts.iter().zip(&model.logits).enumerate() {
        check(
            &engine.prefill(prompt),
            &logits.row(prompt.len() - 1),
            &format!("stacked prompt {p}"),
        );
    }
}

/// Qwen2-MoE: mixtures (not renormalized) with a sigmoid-gated shared
/// expert on layers 0 and 2, a dense MLP on layer 1 (`mlp_only_layers`),
/// q/k/v biases, tied embeddings.
#[test]
fn tiny_qwen2_moe_with_shared_expert_and_dense_layer_matches_transformers() {
    matches_transformers("tiny_qwen2_moe.json", false);
}

/// Qwen3-MoE: a mixture of eight experts, three per token (renormalized),
/// on every second layer (`decoder_sparse_step`), per-head q/k norms.
#[test]
fn tiny_qwen3_moe_with_sparse_step_matches_transformers() {
    matches_transformers("tiny_qwen3_moe.json", false);
}

/// The variants made for llama.cpp's converter (its GGUF tests are in
/// `tiny_gguf.rs`), from their Hugging Face checkpoints: Phi-2 with one
/// key/value head per query head, Mixtral without a window, Qwen-MoE with
/// every layer a mixture.
#[test]
fn tiny_gguf_variants_match_transformers() {
    for name in [
        "tiny_phi2_mha.json",
        "tiny_mixtral_no_window.json",
        "tiny_qwen2_moe_every_layer.json",
        "tiny_qwen3_moe_step1.json",
    ] {
        matches_transformers(name, false);
    }
}

/// `name`'s checkpoint in bf16 and in f16, on `device` with weights kept
/// in their stored type, gives transformers' logits within `tolerance`
/// (absolute and relative): the fixture's weights are multiples of 1/64 of
/// small magnitude, exact in either.
fn half_checkpoints_match(name: &str, device: DeviceChoice, tolerance: f64) {
    let (config, weights) = kiln_tests::models::tiny_model(name);
    let reference = read_fixture(name);
    for dtype in [safetensors::Dtype::BF16, safetensors::Dtype::F16] {
        let dir = tempfile::tempdir().unwrap();
        kiln_tests::models::write_model_dir_as(&config, &weights, dir.path(), false, dtype);
        let model = kiln_tests::models::load_model_on(dir.path(), device, WeightDtype::Auto);
        for (prompt, logits) in reference.prompts.iter().zip(&reference.logits) {
            let prompt: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
            let mut generator = kiln_host::engine::Generator::new(&model, prompt.len()).unwrap();
            let out = generator.feed(&prompt, false).unwrap().remove(0);
            let out = Tensor::f32(vec![out.len()], out);
            if let Err(e) = compare(&out, &logits.row(prompt.len() - 1), tolerance, tolerance) {
                panic!("{name} {dtype:?} checkpoint on {device:?}: {e}");
            }
        }
    }
}

#[test]
fn bf16_and_f16_checkpoints_are_decoded_on_use() {
    half_checkpoints_match("tiny_llama.json", DeviceChoice::Cpu, ATOL);
}

/// A gated MLP's products in bf16 and f16 on the CUDA backend: its 5- and
/// 11-token prompts take them past the decode GEMV (dense products of more
/// than two rows) to cuBLAS, which reads x rounded to the weights' type and
/// stores gate's and up's outputs in it for the generated activation that
/// reads them (`load_as`); the 1-token prompt takes the GEMV. Rounding x
/// to bf16's 8 bits moves the 5-token prompt's worst logit by 0.052 (0.458
/// against 0.510; 0.012 on the GEMV, which keeps x in f32), hence absolute
/// and relative tolerances of 4e-2 (0.060 allowed there); a misread weight
/// or a skipped activation is off by far more.
#[test]
fn bf16_and_f16_gated_mlps_match_transformers_on_cuda() {
    let cuda = kiln_tests::models::cuda_test_device();
    half_checkpoints_match("tiny_llama.json", cuda, 4e-2);
}

/// The experts' bf16 and f16 kernels (the CUDA backend keeps half experts
/// in their type with `--dtype auto`). CUDA products of more than a few rows
/// round the activations to the weights' type for the GEMM, hence its wider
/// tolerance (a wrong pick or a misread weight is off by far more).
#[test]
fn bf16_and_f16_experts_match_transformers_on_both_backends() {
    half_checkpoints_match("tiny_qwen2_moe.json", DeviceChoice::Cpu, ATOL);
    let cuda = kiln_tests::models::cuda_test_device();
    half_checkpoints_match("tiny_qwen2_moe.json", cuda, 2e-2);
}

// The CUDA backend (on the kernel emulator, or on a GPU with
// KILN_TEST_CUDA_DEVICE): every family through the same prefill, decode,
// chunked prefill, ragged batch and greedy checks, within the same 1e-4 of
// transformers (f32 weights), and within 2e-5 of the CPU backend.

#[test]
fn tiny_llama_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_llama.json", false);
}

#[test]
fn tiny_llama_tied_mqa_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_llama_tied.json", true);
}

#[test]
fn tiny_mistral_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_mistral.json", false);
}

#[test]
fn tiny_qwen2_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_qwen2.json", false);
}

#[test]
fn tiny_qwen3_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_qwen3.json", false);
}

#[test]
fn tiny_gemma3_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_gemma3.json", false);
}

#[test]
fn tiny_gemma2_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_gemma2.json", false);
}

/// The norms the CUDA backend runs inside other launches, by fixture:
/// Gemma 2's and 3's post-norms with the residual add and the norm after
/// them (twice a layer of the four but the last layer's second: that add's
/// norm runs with the last tokens' gather), Qwen3's and Gemma 3's q and k
/// norms in their rotation (a layer each; Gemma 3's one key/value head is
/// normalized before its reshape into heads), and the first layer's norm
/// in the embedding's launch, which scales the rows too where the model
/// does (Gemma's √hidden, Granite's embedding multiplier).
#[test]
fn norms_run_inside_the_launches_beside_them_on_cuda() {
    for (fixture, post_norms, head_norms, scaled) in [
        ("tiny_gemma2.json", 2 * 4 - 1, 0, 1),
        ("tiny_gemma3.json", 2 * 4 - 1, 4, 1),
        ("tiny_qwen3.json", 0, 2, 0),
        ("tiny_granite.json", 0, 0, 1),
    ] {
        let device = kiln_tests::models::cuda_test_device();
        let (cuda, _) = Engine::load(fixture, false, device);
        let executor: &CudaExecutor = cuda.backend().as_any().downcast_ref().unwrap();
        assert_eq!(executor.embeddings_fused(), (scaled, 1), "{fixture}");
        assert_eq!(executor.post_norms_fused(), post_norms, "{fixture}");
        assert_eq!(
            executor.rotations_with_head_norms(),
            head_norms,
            "{fixture}"
        );
    }
}

#[test]
fn tiny_phi3_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_phi3.json", false);
}

#[test]
fn tiny_gpt2_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_gpt2.json", false);
}

#[test]
fn tiny_starcoder2_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_starcoder2.json", false);
}

#[test]
fn tiny_granite_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_granite.json", false);
}

#[test]
fn tiny_smollm3_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_smollm3.json", false);
}

#[test]
fn tiny_olmo2_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_olmo2.json", false);
}

#[test]
fn tiny_phi2_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_phi2.json", false);
}

#[test]
fn tiny_mixtral_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_mixtral.json", false);
}

#[test]
fn tiny_qwen2_moe_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_qwen2_moe.json", false);
}

#[test]
fn tiny_qwen3_moe_on_the_cuda_backend_matches_transformers() {
    on_cuda("tiny_qwen3_moe.json", false);
}
