//! Generation defaults of a model: stop tokens and sampling parameters from
//! `generation_config.json`, `config.json` and the tokenizer, the way
//! transformers and vLLM apply them.

use serde_json::Value;

use super::sampling::SamplingParams;
use crate::model::Model;

/// What a request inherits unless it says otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationDefaults {
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Sampling: greedy unless `generation_config.json` has `do_sample`.
    pub sampling: SamplingParams,
}

fn ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_u64())
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// Where sampling defaults come from (vLLM's `--generation-config`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum GenerationConfig {
    /// The model's `generation_config.json`: its sampling if it asks to
    /// sample, else greedy.
    #[default]
    Auto,
    /// None: OpenAI's defaults (temperature 1, no filters).
    Vllm,
    /// The `generation_config.json` in this directory.
    Dir(std::path::PathBuf),
}

impl std::str::FromStr for GenerationConfig {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "vllm" => Ok(Self::Vllm),
            dir if std::path::Path::new(dir).is_dir() => Ok(Self::Dir(dir.into())),
            other => Err(format!(
                "`{other}` is not auto, vllm or a directory with a generation_config.json"
            )),
        }
    }
}

/// The model's defaults.
pub fn generation_defaults(model: &Model) -> GenerationDefaults {
    generation_defaults_from(model, &GenerationConfig::Auto)
}

/// The model's stop tokens, and sampling defaults from `source`.
pub fn generation_defaults_from(model: &Model, source: &GenerationConfig) -> GenerationDefaults {
    let read = |dir: &std::path::Path| {
        std::fs::read_to_string(dir.join("generation_config.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
    };
    let generation: Value = match source {
        GenerationConfig::Auto => model.resolved.dir.as_deref().and_then(read),
        GenerationConfig::Vllm => None,
        GenerationConfig::Dir(dir) => read(dir),
    }
    .unwrap_or(Value::Null);
    let mut eos_token_ids = ids(generation.get("eos_token_id"));
    eos_token_ids.extend(ids(model.hf_config.get("eos_token_id")));
    if let Some(eos) = model
        .tokenizer
        .as_ref()
        .and_then(|t| t.special_tokens().eos.as_ref())
    {
        eos_token_ids.push(eos.id);
    }
    eos_token_ids.sort_unstable();
    eos_token_ids.dedup();

    let mut sampling = SamplingParams {
        temperature: if *source == GenerationConfig::Vllm {
            1.0
        } else {
            0.0
        },
        ..SamplingParams::default()
    };
    if generation.get("do_sample").and_then(Value::as_bool) == Some(true) {
        let number = |key: &str| generation.get(key).and_then(Value::as_f64);
        sampling.temperature = number("temperature").unwrap_or(1.0) as f32;
        sampling.top_p = number("top_p").unwrap_or(1.0) as f32;
        sampling.top_k = number("top_k").unwrap_or(0.0) as usize;
        sampling.min_p = number("min_p").unwrap_or(0.0) as f32;
    }
    GenerationDefaults {
        eos_token_ids,
        sampling,
    }
}
