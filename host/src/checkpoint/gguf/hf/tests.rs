//! The config and tensor-name mappings.

use super::hf_tensor_name;
use crate::checkpoint::gguf::GgufFile;

/// A GGUF v3 file with no tensors and the given string and u32 metadata.
fn metadata_only(strings: &[(&str, &str)], ints: &[(&str, u32)]) -> tempfile::NamedTempFile {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(((strings.len() + ints.len()) as u64).to_le_bytes());
    let text = |bytes: &mut Vec<u8>, s: &str| {
        bytes.extend((s.len() as u64).to_le_bytes());
        bytes.extend(s.as_bytes());
    };
    for (key, value) in strings {
        text(&mut bytes, key);
        bytes.extend(8u32.to_le_bytes());
        text(&mut bytes, value);
    }
    for (key, value) in ints {
        text(&mut bytes, key);
        bytes.extend(4u32.to_le_bytes());
        bytes.extend(value.to_le_bytes());
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bytes).unwrap();
    file
}

#[test]
fn a_sliding_window_of_zero_is_none() {
    // llama.cpp's Phi-3 converter writes 0 for `"sliding_window": null`.
    for (window, expected) in [(0, None), (2047, Some(2047))] {
        let file = metadata_only(
            &[("general.architecture", "phi3")],
            &[("phi3.attention.sliding_window", window)],
        );
        let config = GgufFile::open(file.path()).unwrap().hf_config().unwrap();
        assert_eq!(
            config.get("sliding_window").and_then(|w| w.as_u64()),
            expected
        );
    }
}

#[test]
fn tensor_names() {
    let cases = [
        (
            "llama",
            "token_embd.weight",
            Some("model.embed_tokens.weight"),
        ),
        ("llama", "output_norm.weight", Some("model.norm.weight")),
        ("llama", "output.weight", Some("lm_head.weight")),
        (
            "llama",
            "blk.0.attn_norm.weight",
            Some("model.layers.0.input_layernorm.weight"),
        ),
        (
            "llama",
            "blk.12.attn_q.weight",
            Some("model.layers.12.self_attn.q_proj.weight"),
        ),
        (
            "qwen2",
            "blk.3.attn_k.bias",
            Some("model.layers.3.self_attn.k_proj.bias"),
        ),
        (
            "qwen2",
            "blk.3.attn_v.weight",
            Some("model.layers.3.self_attn.v_proj.weight"),
        ),
        (
            "llama",
            "blk.1.attn_output.weight",
            Some("model.layers.1.self_attn.o_proj.weight"),
        ),
        (
            "qwen3",
            "blk.0.attn_q_norm.weight",
            Some("model.layers.0.self_attn.q_norm.weight"),
        ),
        (
            "gemma3",
            "blk.0.attn_k_norm.weight",
            Some("model.layers.0.self_attn.k_norm.weight"),
        ),
        ("llama", "blk.0.attn_q_norm.weight", None),
        (
            "llama",
            "blk.0.ffn_norm.weight",
            Some("model.layers.0.post_attention_layernorm.weight"),
        ),
        (
            "llama",
            "blk.0.ffn_gate.weight",
            Some("model.layers.0.mlp.gate_proj.weight"),
        ),
        (
            "llama",
            "blk.0.ffn_up.weight",
            Some("model.layers.0.mlp.up_proj.weight"),
        ),
        (
            "llama",
            "blk.0.ffn_down.weight",
            Some("model.layers.0.mlp.down_proj.weight"),
        ),
        (
            "gemma3",
            "blk.2.post_attention_norm.weight",
            Some("model.layers.2.post_attention_layernorm.weight"),
        ),
        (
            "gemma3",
            "blk.2.ffn_norm.weight",
            Some("model.layers.2.pre_feedforward_layernorm.weight"),
        ),
        (
            "gemma3",
            "blk.2.post_ffw_norm.weight",
            Some("model.layers.2.post_feedforward_layernorm.weight"),
        ),
        (
            "phi3",
            "blk.0.attn_qkv.weight",
            Some("model.layers.0.self_attn.qkv_proj.weight"),
        ),
        (
            "phi3",
            "blk.0.ffn_up.weight",
            Some("model.layers.0.mlp.gate_up_proj.weight"),
        ),
        ("gpt2", "token_embd.weight", Some("transformer.wte.weight")),
        (
            "gpt2",
            "position_embd.weight",
            Some("transformer.wpe.weight"),
        ),
        (
            "gpt2",
            "blk.5.attn_qkv.bias",
            Some("transformer.h.5.attn.c_attn.bias"),
        ),
        (
            "gpt2",
            "blk.5.ffn_up.weight",
            Some("transformer.h.5.mlp.c_fc.weight"),
        ),
        ("gpt2", "output_norm.bias", Some("transformer.ln_f.bias")),
        ("gpt2", "output.weight", Some("lm_head.weight")),
        ("gptneox", "output.weight", Some("embed_out.weight")),
        (
            "gptneox",
            "blk.1.attn_qkv.bias",
            Some("gpt_neox.layers.1.attention.query_key_value.bias"),
        ),
        (
            "gptneox",
            "blk.1.ffn_down.weight",
            Some("gpt_neox.layers.1.mlp.dense_4h_to_h.weight"),
        ),
        (
            "olmo2",
            "blk.1.post_ffw_norm.weight",
            Some("model.layers.1.post_feedforward_layernorm.weight"),
        ),
        (
            "phi2",
            "output_norm.bias",
            Some("model.final_layernorm.bias"),
        ),
        (
            "phi2",
            "blk.0.ffn_up.bias",
            Some("model.layers.0.mlp.fc1.bias"),
        ),
        (
            "qwen2moe",
            "blk.2.ffn_gate_inp_shexp.weight",
            Some("model.layers.2.mlp.shared_expert_gate.weight"),
        ),
        ("qwen3moe", "blk.2.ffn_up_exps.weight", None),
        (
            "qwen3moe",
            "blk.2.ffn_gate_inp.weight",
            Some("model.layers.2.mlp.gate.weight"),
        ),
        (
            "llama",
            "blk.1.ffn_gate_inp.weight",
            Some("model.layers.1.block_sparse_moe.gate.weight"),
        ),
        (
            "deepseek2",
            "blk.1.attn_kv_a_mqa.weight",
            Some("model.layers.1.self_attn.kv_a_proj_with_mqa.weight"),
        ),
        (
            "deepseek2",
            "blk.1.exp_probs_b.bias",
            Some("model.layers.1.mlp.gate.e_score_correction_bias"),
        ),
        (
            "deepseek2",
            "blk.1.ffn_up_shexp.weight",
            Some("model.layers.1.mlp.shared_experts.up_proj.weight"),
        ),
        ("deepseek2", "blk.1.attn_k_b.weight", None),
        ("llama", "rope_freqs.weight", None),
        ("llama", "blk.x.attn_q.weight", None),
        ("llama", "blk.+1.attn_q.weight", None),
        ("llama", "blk.0.attn_q.scale", None),
        ("llama", "blk.0.unknown.weight", None),
        ("mamba", "token_embd.weight", None),
    ];
    for (arch, gguf, hf) in cases {
        assert_eq!(hf_tensor_name(arch, gguf).as_deref(), hf, "{arch} {gguf}");
    }
}

#[test]
fn deepseek2_latent_sizes_and_routing() {
    let arch = [("general.architecture", "deepseek2")];
    let shape = [
        ("deepseek2.attention.head_count", 4),
        ("deepseek2.attention.head_count_kv", 1),
        ("deepseek2.rope.dimension_count", 8),
        ("deepseek2.attention.kv_lora_rank", 16),
        ("deepseek2.expert_count", 8),
        ("deepseek2.expert_used_count", 2),
        ("deepseek2.expert_feed_forward_length", 16),
    ];
    // The MLA keys of today's converter, and the MHA-form sizes of older files.
    let mla = [
        ("deepseek2.attention.key_length", 24),
        ("deepseek2.attention.value_length", 16),
        ("deepseek2.attention.key_length_mla", 16),
        ("deepseek2.attention.value_length_mla", 12),
    ];
    let older = [
        ("deepseek2.attention.key_length", 16),
        ("deepseek2.attention.value_length", 12),
    ];
    for (sizes, gating, scoring) in [
        (&mla[..], None, "softmax"),
        (&older[..], Some(2), "sigmoid"),
        (&mla[..], Some(1), "softmax"),
    ] {
        let mut ints: Vec<(&str, u32)> = [&shape[..], sizes].concat();
        ints.extend(gating.map(|g| ("deepseek2.expert_gating_func", g)));
        let file = metadata_only(&arch, &ints);
        let config = GgufFile::open(file.path()).unwrap().hf_config().unwrap();
        let int = |key: &str| config.get(key).and_then(|v| v.as_u64());
        assert_eq!(config["architectures"][0], "DeepseekV3ForCausalLM");
        assert_eq!(int("num_key_value_heads"), Some(4));
        assert_eq!(int("qk_nope_head_dim"), Some(8));
        assert_eq!(int("qk_rope_head_dim"), Some(8));
        assert_eq!(int("v_head_dim"), Some(12));
        assert_eq!(int("kv_lora_rank"), Some(16));
        assert_eq!(int("first_k_dense_replace"), Some(0));
        assert_eq!(config["scoring_func"], scoring, "{gating:?}");
        assert_eq!(config["rope_interleave"], true);
        assert!(config.get("q_lora_rank").is_none());
    }
    let ints: Vec<(&str, u32)> =
        [&shape[..], &mla[..], &[("deepseek2.expert_gating_func", 4)]].concat();
    let file = metadata_only(&arch, &ints);
    let error = GgufFile::open(file.path())
        .unwrap()
        .hf_config()
        .unwrap_err();
    assert!(error.to_string().contains("expert_gating_func"), "{error}");
}
