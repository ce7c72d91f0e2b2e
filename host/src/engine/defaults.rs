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

/// The model's defaults.
pub fn generation_defaults(model: &Model) -> GenerationDefaults {
    let generation: Value = model
        .resolved
        .dir
        .as_ref()
        .and_then(|dir| std::fs::read_to_string(dir.join("generation_config.json")).ok())
        .and_then(|text| serde_json::from_str(&text).ok())
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
        temperature: 0.0,
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
