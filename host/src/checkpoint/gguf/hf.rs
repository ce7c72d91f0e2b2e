//! GGUF metadata and tensor names in Hugging Face terms (the mapping tables
//! are in the parent module's docs).

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
    /// `llama`, `qwen2`, `qwen3`, `gemma2`, `gemma3`, `phi3`, `gpt2`, `starcoder2` and `gptneox` (see the module
    /// docs for the mapping); keys absent from the file are left out.
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
            }
            Family::Qwen2 | Family::Qwen3 => {
                config.insert("hidden_act".into(), json!("silu"));
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
                // llama.cpp rotates the whole head when the count is absent.
                let heads = config.get("num_attention_heads").and_then(Value::as_u64);
                let width = config.get("hidden_size").and_then(Value::as_u64);
                if let (Some(heads), Some(width)) = (heads, width) {
                    let head_dim = (width / heads.max(1)).max(1);
                    let rotated = self.get_u64(&key("rope.dimension_count"))?;
                    config.insert(
                        "partial_rotary_factor".into(),
                        json!(rotated.unwrap_or(head_dim) as f64 / head_dim as f64),
                    );
                }
            }
        }
        Ok(Value::Object(config))
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
        (_, "attn_norm") => "input_layernorm",
        (_, "attn_q") => "self_attn.q_proj",
        (_, "attn_k") => "self_attn.k_proj",
        (_, "attn_v") => "self_attn.v_proj",
        (_, "attn_output") => "self_attn.o_proj",
        (Family::Qwen3 | Family::Gemma3, "attn_q_norm") => "self_attn.q_norm",
        (Family::Qwen3 | Family::Gemma3, "attn_k_norm") => "self_attn.k_norm",
        (Family::Gemma2 | Family::Gemma3, "post_attention_norm") => "post_attention_layernorm",
        (Family::Gemma2 | Family::Gemma3, "ffn_norm") => "pre_feedforward_layernorm",
        (Family::Gemma2 | Family::Gemma3, "post_ffw_norm") => "post_feedforward_layernorm",
        (_, "ffn_norm") => "post_attention_layernorm",
        (Family::Phi3, "attn_qkv") => "self_attn.qkv_proj",
        (Family::Phi3, "ffn_up") => "mlp.gate_up_proj",
        (Family::Starcoder2, "ffn_up") => "mlp.c_fc",
        (Family::Starcoder2, "ffn_down") => "mlp.c_proj",
        (_, "ffn_gate") => "mlp.gate_proj",
        (_, "ffn_up") => "mlp.up_proj",
        (_, "ffn_down") => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}.{suffix}"))
}

#[cfg(test)]
mod tests {
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
}
