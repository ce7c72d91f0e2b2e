//! GGUF metadata and tensor names in Hugging Face terms.
//!
//! # Config
//!
//! [`GgufFile::hf_config`] rebuilds a `config.json` for `llama` (Mixtral
//! too), `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, `gemma2`, `gemma3`,
//! `phi2`, `phi3`, `gpt2`, `starcoder2`, `gptneox`, `granite`, `olmo2`,
//! `smollm3` and `deepseek2`, from the keys present (`{arch}` is
//! `general.architecture`; float32 values are written as their shortest
//! decimal, e.g. `1e-5`, as `config.json` had them):
//!
//! | config.json (GPT-2's name)               | GGUF                                                          |
//! | ---------------------------------------- | ------------------------------------------------------------- |
//! | `architectures`, `model_type`            | `general.architecture`: `LlamaForCausalLM`/`llama`, `Qwen2ForCausalLM`/`qwen2`, `Qwen3ForCausalLM`/`qwen3`, `Gemma2ForCausalLM`/`gemma2`, `Gemma3ForCausalLM`/`gemma3_text`, `Phi3ForCausalLM`/`phi3`, `GPT2LMHeadModel`/`gpt2`, `Starcoder2ForCausalLM`/`starcoder2`, `GPTNeoXForCausalLM`/`gpt_neox`, `GraniteForCausalLM`/`granite`, `Olmo2ForCausalLM`/`olmo2`, `SmolLM3ForCausalLM`/`smollm3`, `PhiForCausalLM`/`phi` (`phi2`), `Qwen2MoeForCausalLM`/`qwen2_moe`, `Qwen3MoeForCausalLM`/`qwen3_moe`, `DeepseekV3ForCausalLM`/`deepseek_v3`; `MixtralForCausalLM`/`mixtral` for `llama` with `llama.expert_count` |
//! | `vocab_size`                             | `{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens`, else the rows of `token_embd.weight` |
//! | `hidden_size` (`n_embd`)                 | `{arch}.embedding_length`                                     |
//! | `intermediate_size` (`n_inner`)          | `{arch}.feed_forward_length`                                  |
//! | `num_hidden_layers` (`n_layer`)          | `{arch}.block_count`                                          |
//! | `num_attention_heads` (`n_head`)         | `{arch}.attention.head_count`                                 |
//! | `num_key_value_heads`                    | `{arch}.attention.head_count_kv`                              |
//! | `head_dim`                               | `{arch}.attention.key_length`                                 |
//! | `max_position_embeddings` (`n_positions`, `n_ctx`) | `{arch}.context_length`                             |
//! | `rms_norm_eps`                           | `{arch}.attention.layer_norm_rms_epsilon`                     |
//! | `layer_norm_eps` (`layer_norm_epsilon`; StarCoder2's `norm_epsilon`) | `{arch}.attention.layer_norm_epsilon`      |
//! | `rope_theta`                             | `{arch}.rope.freq_base`                                       |
//! | `rope_scaling`                           | `{arch}.rope.scaling.type` (omitted when absent or `none`) as `rope_type`, `.factor` as `factor`, `.original_context_length` as `original_max_position_embeddings` |
//! | `rope_scaling` (llama)                   | the `rope_freqs.weight` tensor (Llama 3 scaling as per-frequency divisors) as `{"rope_type": "freq_factors", "factors": [...]}`, a Kiln rope type |
//! | `original_max_position_embeddings` (phi3)| `{arch}.rope.scaling.original_context_length`                 |
//! | `sliding_window`                         | `{arch}.attention.sliding_window` (left out when 0, llama.cpp's "none") |
//! | `attn_logit_softcapping`, `final_logit_softcapping` | `{arch}.attn_logit_softcapping`, `{arch}.final_logit_softcapping` |
//! | `tie_word_embeddings`                    | true when there is no `output.weight` tensor                  |
//! | `bos_token_id`, `eos_token_id`, `pad_token_id` | `tokenizer.ggml.bos_token_id`, `.eos_token_id`, `.padding_token_id` |
//! | `hidden_act` (`activation_function`)     | fixed: `silu` (llama, qwen2, qwen3, qwen2moe, qwen3moe, phi3, granite, olmo2, smollm3), `gelu_pytorch_tanh` (gemma2, gemma3, also as `hidden_activation`), `gelu_new` (gpt2, phi2) |
//! | `attention_bias`, `mlp_bias` (llama, granite, smollm3) | whether `blk.0.attn_q.bias` and `blk.0.ffn_up.bias` exist |
//! | `num_local_experts` (mixtral), `num_experts` (qwen2moe, qwen3moe), `num_experts_per_tok`, `moe_intermediate_size`, `shared_expert_intermediate_size` | `{arch}.expert_count`, `.expert_used_count`, `.expert_feed_forward_length`, `.expert_shared_feed_forward_length` |
//! | `norm_topk_prob`, `decoder_sparse_step`, `mlp_only_layers` (qwen2moe, qwen3moe) | as llama.cpp runs them: renormalized for qwen3moe only, every layer a mixture |
//! | `attention_multiplier`, `embedding_multiplier`, `residual_multiplier`, `logits_scaling` (granite) | `granite.attention.scale`, `.embedding_scale`, `.residual_scale`, `.logit_scale` |
//! | `no_rope_layer_interval`, `use_sliding_window` (smollm3) | 4 and false: llama.cpp's SmolLM3 leaves rotary out of every 4th layer and has no window |
//! | `partial_rotary_factor`, `qk_layernorm` (phi2) | `phi2.rope.dimension_count` over the head size; false |
//! | `rope_local_base_freq` (gemma3)          | `gemma3.rope.freq_base_swa`, else 10000                       |
//! | `query_pre_attn_scalar` (gemma2, gemma3) | llama.cpp's rule: `hidden_size / num_attention_heads` for the 27B model (46 layers in Gemma 2, 62 in Gemma 3), else `head_dim` |
//! | `sliding_window_pattern` (gemma3), `layer_types` (gemma2, gemma3) | with a sliding window: every 6th layer global (gemma3), every 2nd (gemma2), as llama.cpp |
//! | `hidden_act`, `use_bias` (starcoder2)    | `gelu_pytorch_tanh`; biases when `blk.0.attn_q.bias` exists (llama.cpp stores no sliding window for it and attends over the whole context) |
//! | `hidden_act`, `attention_bias`, `use_parallel_residual`, `partial_rotary_factor` (gptneox) | `gelu`; biases when `blk.0.attn_qkv.bias` exists; `gptneox.use_parallel_residual` (true when absent); `gptneox.rope.dimension_count` over the head size (the whole head when absent, as llama.cpp) |
//!
//! | `deepseek_v3` fields (deepseek2)         | see `hf/deepseek2.rs`: `head_count_kv` read as one key/value head per query head, `qk_nope_head_dim`/`v_head_dim` from `attention.key_length_mla`/`value_length_mla`, `kv_lora_rank`, `q_lora_rank`, `qk_rope_head_dim` (`rope.dimension_count`), `first_k_dense_replace` (`leading_dense_block_count`), expert counts and sizes, `n_group`/`topk_group` (`expert_group_count`/`_used_count`), `routed_scaling_factor` (`expert_weights_scale`), `norm_topk_prob` (`expert_weights_norm`), `scoring_func` (`expert_gating_func`, softmax when absent as llama.cpp), YaRN's `mscale` and `mscale_all_dim` (`rope.scaling.yarn_log_multiplier / 0.1`) with cos and sin unscaled |
//! | `rope_scaling.beta_fast`, `.beta_slow`   | `{arch}.rope.scaling.yarn_beta_fast`, `.yarn_beta_slow`       |
//!
//! Not mapped: Phi-3 "longrope" factors (stored as the `rope_factors_*`
//! tensors).
//!
//! [`hf_tensor_name`] maps tensor names (not the stacked `ffn_*_exps`
//! experts, which have no one Hugging Face name). It maps names only:
//! llama.cpp's converter permutes the query and key projections (and
//! biases) of `llama`, `granite` and `smollm3` for interleaved rotary
//! embedding, GPT-2's `Conv1D` weights are stored transposed
//! relative to the Hugging Face checkpoint, and GPT-NeoX's q/k/v rows are
//! stacked where Hugging Face groups them per head.

use kiln_plugin_api::graph::DType;
use serde_json::{json, Map, Value};

use super::{GgufError, GgufFile, GgufValue};

/// The architectures with a Hugging Face mapping.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
    Gpt2,
    Starcoder2,
    GptNeox,
    Granite,
    Olmo2,
    Smollm3,
    Phi2,
    Qwen2Moe,
    Qwen3Moe,
    Deepseek2,
}

impl Family {
    fn of(arch: &str) -> Option<Self> {
        Some(match arch {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gemma2" => Family::Gemma2,
            "gemma3" => Family::Gemma3,
            "phi3" => Family::Phi3,
            "gpt2" => Family::Gpt2,
            "starcoder2" => Family::Starcoder2,
            "gptneox" => Family::GptNeox,
            "granite" => Family::Granite,
            "olmo2" => Family::Olmo2,
            "smollm3" => Family::Smollm3,
            "phi2" => Family::Phi2,
            "qwen2moe" => Family::Qwen2Moe,
            "qwen3moe" => Family::Qwen3Moe,
            "deepseek2" => Family::Deepseek2,
            _ => return None,
        })
    }

    /// `architectures[0]` and `model_type`.
    fn hf_names(self) -> (&'static str, &'static str) {
        match self {
            Family::Llama => ("LlamaForCausalLM", "llama"),
            Family::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            Family::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
            Family::Gemma2 => ("Gemma2ForCausalLM", "gemma2"),
            Family::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
            Family::Phi3 => ("Phi3ForCausalLM", "phi3"),
            Family::Gpt2 => ("GPT2LMHeadModel", "gpt2"),
            Family::Starcoder2 => ("Starcoder2ForCausalLM", "starcoder2"),
            Family::GptNeox => ("GPTNeoXForCausalLM", "gpt_neox"),
            Family::Granite => ("GraniteForCausalLM", "granite"),
            Family::Olmo2 => ("Olmo2ForCausalLM", "olmo2"),
            Family::Smollm3 => ("SmolLM3ForCausalLM", "smollm3"),
            Family::Phi2 => ("PhiForCausalLM", "phi"),
            Family::Qwen2Moe => ("Qwen2MoeForCausalLM", "qwen2_moe"),
            Family::Qwen3Moe => ("Qwen3MoeForCausalLM", "qwen3_moe"),
            Family::Deepseek2 => ("DeepseekV3ForCausalLM", "deepseek_v3"),
        }
    }

    /// The config key for a standard one (GPT-2 and StarCoder2 have their
    /// own names).
    fn key(self, hf: &'static str) -> &'static str {
        if self == Family::Starcoder2 && hf == "layer_norm_eps" {
            return "norm_epsilon";
        }
        if self != Family::Gpt2 {
            return hf;
        }
        match hf {
            "hidden_size" => "n_embd",
            "intermediate_size" => "n_inner",
            "num_hidden_layers" => "n_layer",
            "num_attention_heads" => "n_head",
            "max_position_embeddings" => "n_positions",
            "layer_norm_eps" => "layer_norm_epsilon",
            other => other,
        }
    }
}

/// Whether a GGUF key holds an integer or a float.
#[derive(Clone, Copy)]
enum Kind {
    Int,
    Float,
}

/// `{arch}.` keys copied into the config: GGUF suffix, config key, kind.
const FIELDS: [(&str, &str, Kind); 13] = [
    ("embedding_length", "hidden_size", Kind::Int),
    ("feed_forward_length", "intermediate_size", Kind::Int),
    ("block_count", "num_hidden_layers", Kind::Int),
    ("attention.head_count", "num_attention_heads", Kind::Int),
    ("attention.head_count_kv", "num_key_value_heads", Kind::Int),
    ("attention.key_length", "head_dim", Kind::Int),
    ("context_length", "max_position_embeddings", Kind::Int),
    (
        "attention.layer_norm_rms_epsilon",
        "rms_norm_eps",
        Kind::Float,
    ),
    (
        "attention.layer_norm_epsilon",
        "layer_norm_eps",
        Kind::Float,
    ),
    ("rope.freq_base", "rope_theta", Kind::Float),
    ("attention.sliding_window", "sliding_window", Kind::Int),
    (
        "attn_logit_softcapping",
        "attn_logit_softcapping",
        Kind::Float,
    ),
    (
        "final_logit_softcapping",
        "final_logit_softcapping",
        Kind::Float,
    ),
];

/// Llama 3 rope scaling as per-frequency divisors, read into the config.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Gemma 3 alternates five sliding-window layers with one global layer.
const GEMMA3_SLIDING_PATTERN: u64 = 6;

/// Gemma 2 alternates one sliding-window layer with one global layer.
const GEMMA2_SLIDING_PATTERN: u64 = 2;

impl GgufFile {
    /// Tensors that [`hf_config`](Self::hf_config) reads into the config:
    /// hyperparameters stored as tensors, not model weights.
    pub fn config_tensor_names(&self) -> Vec<&'static str> {
        let llama = matches!(
            self.architecture().ok().and_then(Family::of),
            Some(Family::Llama)
        );
        if llama && self.tensor(ROPE_FREQS).is_some() {
            vec![ROPE_FREQS]
        } else {
            Vec::new()
        }
    }

    /// The model's hyperparameters as a Hugging Face `config.json` for
    /// the architectures of [`Family`] (see the module docs for the mapping);
    /// keys absent from the file are left out.
    pub fn hf_config(&self) -> Result<Value, GgufError> {
        let arch = self.architecture()?;
        let family =
            Family::of(arch).ok_or_else(|| GgufError::UnsupportedArchitecture(arch.to_owned()))?;
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let (class, model_type) = family.hf_names();
        let mut config = Map::new();
        config.insert("architectures".into(), json!([class]));
        config.insert("model_type".into(), json!(model_type));

        let vocab = match self.get_u64(&key("vocab_size"))? {
            Some(n) => Some(n),
            None => match self.get_array("tokenizer.ggml.tokens")? {
                Some(tokens) => Some(tokens.len() as u64),
                None => self
                    .tensor("token_embd.weight")
                    .and_then(|t| t.shape().first().copied()),
            },
        };
        if let Some(vocab) = vocab {
            config.insert("vocab_size".into(), json!(vocab));
        }
        for (suffix, hf, kind) in FIELDS {
            let value = match kind {
                // llama.cpp reads a sliding window of 0 as none (its Phi-3
                // converter writes 0 for `"sliding_window": null`).
                Kind::Int if hf == "sliding_window" => self
                    .get_u64(&key(suffix))?
                    .filter(|&w| w > 0)
                    .map(Value::from),
                // It sizes per-layer tables below: bounded first (the model
                // checks it against the tensors once they are bound).
                Kind::Int if hf == "num_hidden_layers" => match self.get_u64(&key(suffix))? {
                    Some(n) if n > crate::checkpoint::MAX_LAYERS => {
                        return Err(GgufError::Implausible {
                            key: key(suffix),
                            value: n.to_string(),
                            reason: format!("at most {} layers", crate::checkpoint::MAX_LAYERS),
                        })
                    }
                    n => n.map(Value::from),
                },
                Kind::Int => self.get_u64(&key(suffix))?.map(Value::from),
                Kind::Float => self.config_float(&key(suffix))?.map(Value::from),
            };
            if let Some(value) = value {
                config.insert(family.key(hf).into(), value);
            }
        }
        let original_context = self.get_u64(&key("rope.scaling.original_context_length"))?;
        if let Some(kind) = self
            .get_str(&key("rope.scaling.type"))?
            .filter(|&kind| kind != "none")
        {
            let mut scaling = Map::new();
            scaling.insert("rope_type".into(), json!(kind));
            if let Some(factor) = self.config_float(&key("rope.scaling.factor"))? {
                scaling.insert("factor".into(), json!(factor));
            }
            if let Some(n) = original_context {
                scaling.insert("original_max_position_embeddings".into(), json!(n));
            }
            for (suffix, hf) in [
                ("yarn_beta_fast", "beta_fast"),
                ("yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(beta) = self.config_float(&key(&format!("rope.scaling.{suffix}")))? {
                    scaling.insert(hf.into(), json!(beta));
                }
            }
            config.insert("rope_scaling".into(), Value::Object(scaling));
        }
        config.insert(
            "tie_word_embeddings".into(),
            json!(self.tensor("output.weight").is_none()),
        );
        for (gguf, hf) in [
            ("bos_token_id", "bos_token_id"),
            ("eos_token_id", "eos_token_id"),
            ("padding_token_id", "pad_token_id"),
        ] {
            if let Some(id) = self.get_u64(&format!("tokenizer.ggml.{gguf}"))? {
                config.insert(hf.into(), json!(id));
            }
        }

        match family {
            Family::Llama => {
                config.insert("hidden_act".into(), json!("silu"));
                if let Some(factors) = self.rope_freq_factors()? {
                    if config.contains_key("rope_scaling") {
                        return Err(GgufError::Unsupported(
                            "`rope_freqs.weight` together with a rope scaling type".into(),
                        ));
                    }
                    config.insert(
                        "rope_scaling".into(),
                        json!({"rope_type": "freq_factors", "factors": factors}),
                    );
                }
                self.llama_biases(&mut config);
                // Mixtral is converted as `llama` with experts.
                if self.moe_fields(arch, &mut config, "num_local_experts")? {
                    config.insert("architectures".into(), json!(["MixtralForCausalLM"]));
                    config.insert("model_type".into(), json!("mixtral"));
                }
            }
            Family::Qwen2 | Family::Qwen3 => {
                config.insert("hidden_act".into(), json!("silu"));
            }
            Family::Qwen2Moe | Family::Qwen3Moe => {
                config.insert("hidden_act".into(), json!("silu"));
                self.moe_fields(arch, &mut config, "num_experts")?;
                // llama.cpp renormalizes the picked weights for Qwen3-MoE,
                // not for Qwen2-MoE, and makes every layer a mixture.
                let renormalized = family == Family::Qwen3Moe;
                config.insert("norm_topk_prob".into(), json!(renormalized));
                config.insert("decoder_sparse_step".into(), json!(1));
                config.insert("mlp_only_layers".into(), json!([]));
            }
            Family::Granite => {
                config.insert("hidden_act".into(), json!("silu"));
                self.llama_biases(&mut config);
                for (suffix, hf) in [
                    ("attention.scale", "attention_multiplier"),
                    ("embedding_scale", "embedding_multiplier"),
                    ("residual_scale", "residual_multiplier"),
                    ("logit_scale", "logits_scaling"),
                ] {
                    if let Some(value) = self.config_float(&key(suffix))? {
                        config.insert(hf.into(), json!(value));
                    }
                }
            }
            Family::Olmo2 => {
                config.insert("hidden_act".into(), json!("silu"));
            }
            Family::Smollm3 => {
                config.insert("hidden_act".into(), json!("silu"));
                // llama.cpp's SmolLM3 leaves out rotary on every fourth
                // layer and attends over the whole context.
                config.insert("no_rope_layer_interval".into(), json!(4));
                config.insert("use_sliding_window".into(), json!(false));
                self.llama_biases(&mut config);
            }
            Family::Phi2 => {
                config.insert("hidden_act".into(), json!("gelu_new"));
                config.insert("qk_layernorm".into(), json!(false));
                self.partial_rotary(arch, &mut config)?;
            }
            Family::Phi3 => {
                config.insert("hidden_act".into(), json!("silu"));
                if let Some(n) = original_context {
                    config.insert("original_max_position_embeddings".into(), json!(n));
                }
            }
            Family::Gpt2 => {
                config.insert("activation_function".into(), json!("gelu_new"));
                if let Some(n) = config.get("n_positions").cloned() {
                    config.insert("n_ctx".into(), n);
                }
            }
            Family::Deepseek2 => self.deepseek2_fields(&mut config)?,
            Family::Gemma2 => gemma_extras(&mut config, GEMMA2_SLIDING_PATTERN, 46),
            Family::Gemma3 => {
                let local_base = self.config_float("gemma3.rope.freq_base_swa")?;
                config.insert(
                    "rope_local_base_freq".into(),
                    json!(local_base.unwrap_or(10_000.0)),
                );
                config.insert(
                    "sliding_window_pattern".into(),
                    json!(GEMMA3_SLIDING_PATTERN),
                );
                gemma_extras(&mut config, GEMMA3_SLIDING_PATTERN, 62);
            }
            Family::Starcoder2 => {
                config.insert("hidden_act".into(), json!("gelu_pytorch_tanh"));
                let biases = self.tensor("blk.0.attn_q.bias").is_some();
                config.insert("use_bias".into(), json!(biases));
            }
            Family::GptNeox => {
                config.insert("hidden_act".into(), json!("gelu"));
                let biases = self.tensor("blk.0.attn_qkv.bias").is_some();
                config.insert("attention_bias".into(), json!(biases));
                let parallel = self.get_bool(&key("use_parallel_residual"))?;
                config.insert(
                    "use_parallel_residual".into(),
                    json!(parallel.unwrap_or(true)),
                );
                self.partial_rotary(arch, &mut config)?;
            }
        }
        Ok(Value::Object(config))
    }

    /// `partial_rotary_factor` from `{arch}.rope.dimension_count` over the
    /// head size (llama.cpp rotates the whole head when the count is absent).
    fn partial_rotary(&self, arch: &str, config: &mut Map<String, Value>) -> Result<(), GgufError> {
        let heads = config.get("num_attention_heads").and_then(Value::as_u64);
        let width = config.get("hidden_size").and_then(Value::as_u64);
        if let (Some(heads), Some(width)) = (heads, width) {
            let head_dim = (width / heads.max(1)).max(1);
            let rotated = self.get_u64(&format!("{arch}.rope.dimension_count"))?;
            config.insert(
                "partial_rotary_factor".into(),
                json!(rotated.unwrap_or(head_dim) as f64 / head_dim as f64),
            );
        }
        Ok(())
    }

    /// Llama's `attention_bias` and `mlp_bias`, from whether the first
    /// layer has those bias tensors (GGUF has no key for them).
    fn llama_biases(&self, config: &mut Map<String, Value>) {
        let has = |name: &str| self.tensor(name).is_some();
        config.insert("attention_bias".into(), json!(has("blk.0.attn_q.bias")));
        config.insert("mlp_bias".into(), json!(has("blk.0.ffn_up.bias")));
    }

    /// The expert counts and sizes of a mixture-of-experts model, the
    /// expert count under `experts_key`; false when the file has none.
    fn moe_fields(
        &self,
        arch: &str,
        config: &mut Map<String, Value>,
        experts_key: &str,
    ) -> Result<bool, GgufError> {
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let Some(experts) = self.get_u64(&key("expert_count"))?.filter(|&n| n > 0) else {
            return Ok(false);
        };
        config.insert(experts_key.into(), json!(experts));
        for (suffix, hf) in [
            ("expert_used_count", "num_experts_per_tok"),
            ("expert_feed_forward_length", "moe_intermediate_size"),
            (
                "expert_shared_feed_forward_length",
                "shared_expert_intermediate_size",
            ),
        ] {
            if let Some(n) = self.get_u64(&key(suffix))? {
                config.insert(hf.into(), json!(n));
            }
        }
        Ok(true)
    }

    /// The per-frequency rotary divisors llama.cpp's converter stores for
    /// Llama 3 rope scaling (`rope_freqs.weight`, f32 `[head_dim / 2]`).
    fn rope_freq_factors(&self) -> Result<Option<Vec<f32>>, GgufError> {
        let Some(tensor) = self.tensor(ROPE_FREQS) else {
            return Ok(None);
        };
        if tensor.shape().len() != 1 {
            return Err(GgufError::Unsupported(format!(
                "`{ROPE_FREQS}` has shape {:?} (expected one divisor per rotated pair)",
                tensor.shape()
            )));
        }
        let values = self
            .weight_data(ROPE_FREQS)?
            .to_tensor(DType::F32)
            .map_err(|e| GgufError::Unsupported(format!("`{ROPE_FREQS}`: {e}")))?;
        Ok(Some(values.as_f32().to_vec()))
    }

    /// A float; float32 values as their shortest decimal (`1e-5`, not
    /// `9.999999747378752e-6`), which is what the original config held.
    /// NaN and infinity are refused: JSON has no spelling for them, and a
    /// config value that silently became null would load with a default.
    fn config_float(&self, key: &str) -> Result<Option<f64>, GgufError> {
        let value = match self.get(key) {
            Some(GgufValue::F32(v)) => Some(v.to_string().parse().unwrap_or(f64::from(*v))),
            _ => self.get_f64(key)?,
        };
        match value {
            Some(v) if !v.is_finite() => Err(GgufError::WrongType {
                key: key.to_owned(),
                expected: "a finite number",
                found: if v.is_nan() { "NaN" } else { "infinite" },
            }),
            v => Ok(v),
        }
    }
}

/// Gemma's fixed activation, attention scale and layer pattern: every
/// `pattern`-th layer global, the rest sliding. llama.cpp scales queries by
/// `1/sqrt(head_dim)`, or `1/sqrt(hidden / heads)` for the 27B model
/// (`layers_27b` layers).
fn gemma_extras(config: &mut Map<String, Value>, pattern: u64, layers_27b: u64) {
    for key in ["hidden_act", "hidden_activation"] {
        config.insert(key.into(), json!("gelu_pytorch_tanh"));
    }
    let field = |key: &str| config.get(key).and_then(Value::as_u64);
    let layers = field("num_hidden_layers");
    let per_head = field("hidden_size")
        .zip(field("num_attention_heads"))
        .and_then(|(hidden, heads)| hidden.checked_div(heads));
    let scalar = match (layers, field("head_dim")) {
        (Some(n), _) if n == layers_27b => per_head,
        (_, None) => per_head,
        (_, head_dim) => head_dim,
    };
    if let Some(scalar) = scalar {
        config.insert("query_pre_attn_scalar".into(), json!(scalar));
    }
    if let (Some(layers), true) = (layers, config.contains_key("sliding_window")) {
        let layer_types: Vec<&str> = (1..=layers)
            .map(|i| {
                if i % pattern == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        config.insert("layer_types".into(), json!(layer_types));
    }
}

/// The Hugging Face name of GGUF tensor `gguf_name` in a model of
/// architecture `arch` (`general.architecture`), or `None` for names (or
/// architectures) without a mapping. Names only: see the module docs for the
/// tensors whose layout also differs.
pub fn hf_tensor_name(arch: &str, gguf_name: &str) -> Option<String> {
    let family = Family::of(arch)?;
    let (base, suffix) = gguf_name.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    let Some(block) = base.strip_prefix("blk.") else {
        let module = match (family, base) {
            (Family::Gpt2, "token_embd") => "transformer.wte",
            (Family::Gpt2, "position_embd") => "transformer.wpe",
            (Family::Gpt2, "output_norm") => "transformer.ln_f",
            (Family::GptNeox, "token_embd") => "gpt_neox.embed_in",
            (Family::GptNeox, "output_norm") => "gpt_neox.final_layer_norm",
            (Family::GptNeox, "output") => "embed_out",
            (Family::Phi2, "output_norm") => "model.final_layernorm",
            (_, "token_embd") => "model.embed_tokens",
            (_, "output_norm") => "model.norm",
            (_, "output") => "lm_head",
            _ => return None,
        };
        return Some(format!("{module}.{suffix}"));
    };
    let (layer, name) = block.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let layer: u32 = layer.parse().ok()?;
    if (family, name, suffix) == (Family::Deepseek2, "exp_probs_b", "bias") {
        return Some(format!(
            "model.layers.{layer}.mlp.gate.e_score_correction_bias"
        ));
    }
    let module = match (family, name) {
        (Family::Gpt2, name) => {
            let module = match name {
                "attn_norm" => "ln_1",
                "attn_qkv" => "attn.c_attn",
                "attn_output" => "attn.c_proj",
                "ffn_norm" => "ln_2",
                "ffn_up" => "mlp.c_fc",
                "ffn_down" => "mlp.c_proj",
                _ => return None,
            };
            return Some(format!("transformer.h.{layer}.{module}.{suffix}"));
        }
        (Family::GptNeox, name) => {
            let module = match name {
                "attn_norm" => "input_layernorm",
                "attn_qkv" => "attention.query_key_value",
                "attn_output" => "attention.dense",
                "ffn_norm" => "post_attention_layernorm",
                "ffn_up" => "mlp.dense_h_to_4h",
                "ffn_down" => "mlp.dense_4h_to_h",
                _ => return None,
            };
            return Some(format!("gpt_neox.layers.{layer}.{module}.{suffix}"));
        }
        (Family::Phi2, "attn_output") => "self_attn.dense",
        (Family::Phi2, "ffn_up") => "mlp.fc1",
        (Family::Phi2, "ffn_down") => "mlp.fc2",
        (_, "attn_norm") => "input_layernorm",
        (_, "attn_q") => "self_attn.q_proj",
        (_, "attn_k") => "self_attn.k_proj",
        (_, "attn_v") => "self_attn.v_proj",
        (_, "attn_output") => "self_attn.o_proj",
        (Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3 | Family::Olmo2, "attn_q_norm") => {
            "self_attn.q_norm"
        }
        (Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3 | Family::Olmo2, "attn_k_norm") => {
            "self_attn.k_norm"
        }
        (Family::Gemma2 | Family::Gemma3 | Family::Olmo2, "post_attention_norm") => {
            "post_attention_layernorm"
        }
        (Family::Olmo2, "post_ffw_norm") => "post_feedforward_layernorm",
        (Family::Gemma2 | Family::Gemma3, "ffn_norm") => "pre_feedforward_layernorm",
        (Family::Gemma2 | Family::Gemma3, "post_ffw_norm") => "post_feedforward_layernorm",
        (_, "ffn_norm") => "post_attention_layernorm",
        (Family::Phi3, "attn_qkv") => "self_attn.qkv_proj",
        (Family::Phi3, "ffn_up") => "mlp.gate_up_proj",
        (Family::Starcoder2, "ffn_up") => "mlp.c_fc",
        (Family::Starcoder2, "ffn_down") => "mlp.c_proj",
        // Mixtral's router, and Qwen-MoE's router and shared expert (the
        // stacked `ffn_*_exps` have no one Hugging Face name).
        (Family::Llama, "ffn_gate_inp") => "block_sparse_moe.gate",
        (Family::Qwen2Moe | Family::Qwen3Moe, "ffn_gate_inp") => "mlp.gate",
        (Family::Qwen2Moe, "ffn_gate_inp_shexp") => "mlp.shared_expert_gate",
        (Family::Qwen2Moe, "ffn_gate_shexp") => "mlp.shared_expert.gate_proj",
        (Family::Qwen2Moe, "ffn_up_shexp") => "mlp.shared_expert.up_proj",
        (Family::Qwen2Moe, "ffn_down_shexp") => "mlp.shared_expert.down_proj",
        // DeepSeek's latent attention and experts (`attn_k_b` and `attn_v_b`
        // are `kv_b_proj` split per head, with no one Hugging Face name).
        (Family::Deepseek2, "attn_q_a") => "self_attn.q_a_proj",
        (Family::Deepseek2, "attn_q_a_norm") => "self_attn.q_a_layernorm",
        (Family::Deepseek2, "attn_q_b") => "self_attn.q_b_proj",
        (Family::Deepseek2, "attn_kv_a_mqa") => "self_attn.kv_a_proj_with_mqa",
        (Family::Deepseek2, "attn_kv_a_norm") => "self_attn.kv_a_layernorm",
        (Family::Deepseek2, "ffn_gate_inp") => "mlp.gate",
        (Family::Deepseek2, "ffn_gate_shexp") => "mlp.shared_experts.gate_proj",
        (Family::Deepseek2, "ffn_up_shexp") => "mlp.shared_experts.up_proj",
        (Family::Deepseek2, "ffn_down_shexp") => "mlp.shared_experts.down_proj",
        (_, "ffn_gate") => "mlp.gate_proj",
        (_, "ffn_up") => "mlp.up_proj",
        (_, "ffn_down") => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}.{suffix}"))
}

mod deepseek2;
#[cfg(test)]
mod tests;
