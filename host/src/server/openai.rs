//! The OpenAI API's request and response shapes (with vLLM's extensions:
//! `top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `min_tokens`,
//! `ignore_eos`), and their validation. Every field a request sets is one
//! Kiln honours: a field of OpenAI's or vLLM's API that Kiln does not
//! implement, or one neither API has, is refused with a 400 naming it
//! ([`check_fields`]), never accepted and ignored.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::penalties::Penalties;
use crate::engine::sampling::SamplingParams;
use crate::engine::service::GenerationParams;

/// An API error: status code, OpenAI-shaped body.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// `error.type`.
    pub kind: &'static str,
    /// `error.message`.
    pub message: String,
    /// `error.param`.
    pub param: Option<String>,
}

impl ApiError {
    /// 400: the request is invalid.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// 404: no such model.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: 404,
            kind: "invalid_request_error",
            message: format!("The model `{model}` does not exist."),
            param: Some("model".to_owned()),
        }
    }

    /// 404: no route at this path.
    pub fn no_route(method: &str, path: &str) -> Self {
        Self {
            status: 404,
            kind: "invalid_request_error",
            message: format!("Invalid URL ({method} {path})"),
            param: None,
        }
    }

    /// 405: the path exists, not with this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self {
            status: 405,
            kind: "invalid_request_error",
            message: format!("Method {method} is not allowed for {path}"),
            param: None,
        }
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self {
            status: 401,
            kind: "authentication_error",
            message: "Invalid or missing API key (send `Authorization: Bearer <key>`).".into(),
            param: None,
        }
    }

    /// Any status with a message: 4xx are the client's error, 5xx the
    /// server's.
    pub fn status(status: u16, message: String) -> Self {
        Self {
            status,
            kind: if status < 500 {
                "invalid_request_error"
            } else {
                "server_error"
            },
            message,
            param: None,
        }
    }

    /// 500/503: the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            kind: "server_error",
            message: message.into(),
            param: None,
        }
    }

    /// The response body.
    pub fn body(&self) -> Value {
        serde_json::json!({
            "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.status }
        })
    }
}

/// `stop`: one string or several.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// No stop strings.
    #[default]
    None,
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Parameters shared by both endpoints.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SamplingFields {
    /// Model name.
    pub model: String,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus threshold.
    pub top_p: Option<f32>,
    /// Top-k (vLLM extension; -1 or 0: off).
    pub top_k: Option<i64>,
    /// Min-p (vLLM extension).
    pub min_p: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Repetition penalty (vLLM extension).
    pub repetition_penalty: Option<f32>,
    /// Seed.
    pub seed: Option<i64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Stop,
    /// Stop token ids (vLLM extension).
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// Number of choices.
    pub n: Option<usize>,
    /// Stream with server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Minimum new tokens (vLLM extension).
    pub min_tokens: Option<usize>,
    /// Generate past end-of-sequence (vLLM extension).
    #[serde(default)]
    pub ignore_eos: bool,
    /// End the text with the stop string or stop token's text that ended
    /// it (vLLM extension).
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// Leave special tokens out of the text (vLLM extension; default true).
    pub skip_special_tokens: Option<bool>,
    /// Keep only the prompt's last this many tokens (-1: the model's
    /// context; vLLM extension).
    pub truncate_prompt_tokens: Option<i64>,
    /// Only these tokens may be generated (vLLM extension).
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Log-probabilities name tokens `token_id:ID` (vLLM extension).
    #[serde(default)]
    pub return_tokens_as_token_ids: bool,
    /// Each prompt token's log-probability with this many alternatives
    /// (vLLM extension; not with `stream`).
    pub prompt_logprobs: Option<usize>,
    /// Words the output must not contain (vLLM extension).
    #[serde(default)]
    pub bad_words: Vec<String>,
    /// `max_tokens`.
    pub max_tokens: Option<usize>,
    /// `user`: an end-user id for the client's own tracking; it has no
    /// effect on the output (as with OpenAI).
    pub user: Option<String>,
    /// Token id (as a string) → bias in [-100, 100] added to its logit.
    pub logit_bias: Option<HashMap<String, f32>>,
    /// OpenAI's structured output (`json_object`, `json_schema`).
    pub response_format: Option<Value>,
    /// vLLM's structured output (`json`, `regex`, `choice`, `grammar`).
    pub structured_outputs: Option<Value>,
    /// vLLM's older spelling of `structured_outputs.json`.
    pub guided_json: Option<Value>,
    /// vLLM's older spelling of `structured_outputs.regex`.
    pub guided_regex: Option<Value>,
    /// vLLM's older spelling of `structured_outputs.choice`.
    pub guided_choice: Option<Value>,
    /// vLLM's older spelling of `structured_outputs.grammar`.
    pub guided_grammar: Option<Value>,
}

/// A request body type and the fields of its endpoint beyond
/// [`SAMPLING_FIELDS`].
pub trait EndpointFields {
    /// The endpoint's own fields.
    const FIELDS: &'static [&'static str];
}

impl EndpointFields for ChatRequest {
    const FIELDS: &'static [&'static str] = CHAT_FIELDS;
}

impl EndpointFields for CompletionRequest {
    const FIELDS: &'static [&'static str] = COMPLETION_FIELDS;
}

/// The fields both endpoints honour.
const SAMPLING_FIELDS: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "stream",
    "stream_options",
    "min_tokens",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "truncate_prompt_tokens",
    "add_special_tokens",
    "allowed_token_ids",
    "return_tokens_as_token_ids",
    "prompt_logprobs",
    "bad_words",
    "max_tokens",
    "user",
    "logit_bias",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];

/// The fields of `/v1/chat/completions` beyond [`SAMPLING_FIELDS`].
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
];

/// The fields of `/v1/completions` beyond [`SAMPLING_FIELDS`].
pub const COMPLETION_FIELDS: &[&str] = &["prompt", "echo", "logprobs", "suffix"];

/// Fields of OpenAI's or vLLM's API that Kiln does not implement, with the
/// one value (as compact JSON) each may carry because it asks for what Kiln
/// does anyway (`None`: no value is accepted).
const NOT_IMPLEMENTED: &[(&str, Option<&str>)] = &[
    ("functions", None),
    ("function_call", None),
    ("best_of", None),
    ("use_beam_search", Some("false")),
    ("store", Some("false")),
    ("audio", None),
    ("modalities", Some(r#"["text"]"#)),
    ("prediction", None),
    ("web_search_options", None),
    ("reasoning_effort", None),
    ("verbosity", None),
    ("metadata", None),
    ("service_tier", None),
    ("prompt_cache_key", None),
    ("safety_identifier", None),
    ("chat_template", None),
    ("documents", None),
    ("length_penalty", None),
    ("spaces_between_special_tokens", None),
    ("logits_processors", None),
    ("priority", None),
    ("cache_salt", None),
    ("kv_transfer_params", None),
    ("vllm_xargs", None),
    // The Responses API's: nothing is stored, no hosted tools run.
    ("previous_response_id", None),
    ("conversation", None),
    ("background", None),
    ("include", None),
    ("max_tool_calls", None),
    ("reasoning", None),
];

/// Refuses a request body that sets a field Kiln does not honour: `honoured`
/// are the endpoint's own fields (with [`SAMPLING_FIELDS`]); a null value
/// counts as absent. The error names the field, as OpenAI's does.
pub fn check_fields(body: &Value, honoured: &[&str]) -> Result<(), ApiError> {
    let Some(fields) = body.as_object() else {
        return Err(ApiError::invalid(
            "the request body must be a JSON object",
            None,
        ));
    };
    for (name, value) in fields {
        let name = name.as_str();
        if value.is_null() || honoured.contains(&name) || SAMPLING_FIELDS.contains(&name) {
            continue;
        }
        let message = match NOT_IMPLEMENTED.iter().find(|(known, _)| *known == name) {
            Some((_, Some(accepted))) if serde_json::from_str::<Value>(accepted).is_ok_and(|a| &a == value) => continue,
            Some((_, Some(accepted))) => format!(
                "`{name}` is only accepted with the value {accepted}: Kiln does not implement others"
            ),
            Some((_, None)) => format!("`{name}` is not supported by this server"),
            None => format!("Unrecognized request argument supplied: {name}"),
        };
        return Err(ApiError::invalid(message, Some(name)));
    }
    Ok(())
}

/// Refuses, by name, any field of `body` outside `honoured`: for the
/// endpoints that take no sampling fields (embeddings, scoring).
pub fn check_only_fields(body: &Value, honoured: &[&str]) -> Result<(), ApiError> {
    let Some(fields) = body.as_object() else {
        return Err(ApiError::invalid(
            "the request body must be a JSON object",
            None,
        ));
    };
    match fields
        .iter()
        .find(|(name, value)| !value.is_null() && !honoured.contains(&name.as_str()))
    {
        Some((name, _)) => Err(ApiError::invalid(
            format!("Unrecognized request argument supplied: {name}"),
            Some(name),
        )),
        None => Ok(()),
    }
}

/// `stream_options`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with token usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// A chat message as clients send it. Other message fields (`name`) are
/// refused: they would not reach the template.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InMessage {
    /// `system`, `user`, `assistant`, `tool`.
    pub role: String,
    /// A string, or a list of parts of which text parts are used.
    #[serde(default)]
    pub content: Option<Value>,
    /// An assistant message's calls (OpenAI's shape).
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// A tool message's answer to this call.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// An assistant message's thinking, as a reasoning parser returned it
    /// (vLLM's): the chat template's to render or drop (Qwen3's renders
    /// the latest turns').
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// The same under vLLM's newer name (a returned message has both).
    #[serde(default)]
    reasoning: Option<String>,
}

impl InMessage {
    /// Its thinking, under either name; both given must agree.
    pub fn thinking(&self) -> Result<Option<&str>, ApiError> {
        match (&self.reasoning_content, &self.reasoning) {
            (Some(a), Some(b)) if a != b => Err(ApiError::invalid(
                "a message's reasoning_content and reasoning differ",
                Some("messages"),
            )),
            (a, b) => Ok(a.as_deref().or(b.as_deref())),
        }
    }

    /// The text content (`None` when the message has none).
    pub fn text(&self) -> Result<Option<String>, ApiError> {
        match &self.content {
            None | Some(Value::Null) => Ok(None),
            Some(content @ (Value::String(_) | Value::Array(_))) => {
                joined_text(content, &["text"]).map(Some).ok_or_else(|| {
                    ApiError::invalid("only text content parts are supported", Some("messages"))
                })
            }
            Some(_) => Err(ApiError::invalid(
                "message content must be a string or a list of parts",
                Some("messages"),
            )),
        }
    }
}

/// A content's text: a string, or the `text` of parts whose `type` is one
/// of `kinds`, joined; `None` for anything else (the caller names it).
pub fn joined_text(content: &Value, kinds: &[&str]) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| {
                let kind = part.get("type").and_then(Value::as_str)?;
                kinds.contains(&kind).then_some(())?;
                part.get("text").and_then(Value::as_str)
            })
            .collect(),
        _ => None,
    }
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<InMessage>,
    /// Newer name of `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// Return log-probabilities.
    #[serde(default)]
    pub logprobs: bool,
    /// Alternatives per token (0–20).
    pub top_logprobs: Option<usize>,
    /// Functions the model may call.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one message (default true).
    pub parallel_tool_calls: Option<bool>,
    /// End the rendered chat with the assistant's header (vLLM's; default
    /// true).
    pub add_generation_prompt: Option<bool>,
    /// Leave the final message open for the model to continue (vLLM's).
    #[serde(default)]
    pub continue_final_message: bool,
    /// Extra variables for the chat template (vLLM's; e.g.
    /// `{"enable_thinking": false}`).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Add the tokenizer's BOS/EOS to the rendered chat (vLLM's; default
    /// false: the template writes them).
    pub add_special_tokens: Option<bool>,
    /// Everything else.
    #[serde(flatten)]
    pub common: SamplingFields,
}

/// `prompt` of `/v1/completions`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: Prompt,
    /// Echo the prompt before the completion.
    #[serde(default)]
    pub echo: bool,
    /// Alternatives per token (legacy: an integer 0–5).
    pub logprobs: Option<usize>,
    /// Text appended after the completion (accepted when empty only).
    pub suffix: Option<String>,
    /// Add the tokenizer's BOS/EOS to text prompts (vLLM's; default true).
    pub add_special_tokens: Option<bool>,
    /// Everything else.
    #[serde(flatten)]
    pub common: SamplingFields,
}

/// Server limits the validation applies.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Longest sequence.
    pub max_model_len: usize,
    /// Largest `max_tokens` accepted.
    pub max_tokens: usize,
    /// Largest `n`.
    pub max_n: usize,
    /// Token ids must be below it (`logit_bias`, `stop_token_ids`).
    pub vocab_size: usize,
    /// Most sequences (prompts × `n`) one request may make.
    pub max_seqs_per_request: usize,
    /// Longer prompt text must have more tokens than the context holds: it
    /// is refused before it is tokenized.
    pub max_prompt_bytes: usize,
    /// Special-token text in message content is read as special tokens
    /// (else as plain text).
    pub allow_special_tokens_in_messages: bool,
}

impl SamplingFields {
    /// Validates the fields and builds the generation parameters for a prompt
    /// of `prompt_len` tokens; `defaults` fill what the request leaves out.
    pub fn params(
        &self,
        max_tokens: Option<usize>,
        default_max_tokens: Option<usize>,
        logprobs: Option<usize>,
        prompt_len: usize,
        limits: &Limits,
        defaults: &SamplingParams,
    ) -> Result<GenerationParams, ApiError> {
        if prompt_len == 0 {
            return Err(ApiError::invalid("the prompt is empty", Some("prompt")));
        }
        if prompt_len >= limits.max_model_len {
            return Err(ApiError::invalid(
                format!("This model's maximum context length is {} tokens. However, your prompt has {prompt_len} tokens.", limits.max_model_len),
                Some("messages"),
            ));
        }
        let room = limits.max_model_len - prompt_len;
        let max_tokens = match max_tokens.or(default_max_tokens) {
            Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1", Some("max_tokens"))),
            Some(n) if n > limits.max_tokens => {
                return Err(ApiError::invalid(format!("max_tokens must be at most {}, got {n}", limits.max_tokens), Some("max_tokens")))
            }
            Some(n) if n > room => {
                return Err(ApiError::invalid(
                    format!("max_tokens ({n}) plus the prompt ({prompt_len} tokens) exceeds the context length of {}", limits.max_model_len),
                    Some("max_tokens"),
                ))
            }
            Some(n) => n,
            None => room.min(limits.max_tokens),
        };
        let n = self.n.unwrap_or(1);
        if n == 0 || n > limits.max_n {
            return Err(ApiError::invalid(
                format!("n must be between 1 and {}", limits.max_n),
                Some("n"),
            ));
        }
        if logprobs.is_some_and(|k| k > 20) {
            return Err(ApiError::invalid(
                "at most 20 top log-probabilities per token",
                Some("top_logprobs"),
            ));
        }
        if let Some(k) = self.prompt_logprobs.filter(|&k| k > 20) {
            return Err(ApiError::invalid(
                format!("prompt_logprobs: at most 20 top log-probabilities per token, got {k}"),
                Some("prompt_logprobs"),
            ));
        }
        if let Some(k) = self.top_k.filter(|&k| k < -1) {
            return Err(ApiError::invalid(
                format!("top_k must be -1 or 0 (off) or at least 1, got {k}"),
                Some("top_k"),
            ));
        }
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: match self.top_k {
                // At least the whole vocabulary: every token stays, as off.
                Some(k) if k <= 0 || k as u64 >= limits.vocab_size as u64 => 0,
                Some(k) => k as usize,
                None => defaults.top_k,
            },
            min_p: self.min_p.unwrap_or(defaults.min_p),
            seed: self.seed.map(|s| s as u64),
        };
        sampling
            .validate()
            .map_err(|m| ApiError::invalid(m, None))?;
        if sampling.temperature > 2.0 {
            return Err(ApiError::invalid(
                format!(
                    "temperature must be at most 2, got {}",
                    sampling.temperature
                ),
                Some("temperature"),
            ));
        }
        let penalties = Penalties {
            frequency: self.frequency_penalty.unwrap_or(0.0),
            presence: self.presence_penalty.unwrap_or(0.0),
            repetition: self.repetition_penalty.unwrap_or(1.0),
        };
        penalties
            .validate()
            .map_err(|m| ApiError::invalid(m, None))?;
        let stop = match &self.stop {
            Stop::None => Vec::new(),
            Stop::One(s) => vec![s.clone()],
            Stop::Many(list) if list.len() > 16 => {
                return Err(ApiError::invalid("at most 16 stop strings", Some("stop")))
            }
            Stop::Many(list) => list.clone(),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid(
                "stop strings must not be empty",
                Some("stop"),
            ));
        }
        if let Some(bad) = self
            .stop_token_ids
            .iter()
            .find(|&&t| t as usize >= limits.vocab_size)
        {
            return Err(ApiError::invalid(
                format!(
                    "stop_token_ids has {bad}, outside the vocabulary of {}",
                    limits.vocab_size
                ),
                Some("stop_token_ids"),
            ));
        }
        let logit_bias = self.logit_bias(limits.vocab_size)?;
        let allowed_tokens = self.allowed_tokens(limits.vocab_size)?;
        let min_tokens = self.min_tokens.unwrap_or(0);
        if min_tokens > max_tokens {
            return Err(ApiError::invalid(
                "min_tokens must not exceed max_tokens",
                Some("min_tokens"),
            ));
        }
        Ok(GenerationParams {
            sampling,
            penalties,
            max_tokens,
            min_tokens,
            stop,
            include_stop_str_in_output: self.include_stop_str_in_output,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            logprobs,
            prompt_logprobs: self.prompt_logprobs,
            return_tokens_as_token_ids: self.return_tokens_as_token_ids,
            logit_bias,
            allowed_tokens,
            bad_words: Vec::new(),
        })
    }

    /// `allowed_token_ids` as a mask (bit `t % 32` of word `t / 32`): ids
    /// below `vocab_size`, at least one.
    fn allowed_tokens(&self, vocab_size: usize) -> Result<Option<Vec<u32>>, ApiError> {
        let Some(ids) = &self.allowed_token_ids else {
            return Ok(None);
        };
        let refuse = |why: String| Err(ApiError::invalid(why, Some("allowed_token_ids")));
        if ids.is_empty() {
            return refuse("allowed_token_ids must not be empty".into());
        }
        let mut mask = vec![0u32; vocab_size.div_ceil(32)];
        for &id in ids {
            if id as usize >= vocab_size {
                return refuse(format!(
                    "allowed_token_ids has {id}, outside the vocabulary of {vocab_size}"
                ));
            }
            mask[id as usize / 32] |= 1 << (id % 32);
        }
        Ok(Some(mask))
    }

    /// `prompt` cut to its last `truncate_prompt_tokens` tokens (-1: the
    /// model's context), as vLLM cuts it.
    pub fn truncate(
        &self,
        mut prompt: Vec<u32>,
        max_model_len: usize,
    ) -> Result<Vec<u32>, ApiError> {
        let keep = match self.truncate_prompt_tokens {
            None => return Ok(prompt),
            Some(-1) => max_model_len,
            Some(k) if k >= 1 && k as usize <= max_model_len => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    format!("truncate_prompt_tokens is {k}; it must be -1 or between 1 and the model's context of {max_model_len}"),
                    Some("truncate_prompt_tokens"),
                ))
            }
        };
        if prompt.len() > keep {
            prompt.drain(..prompt.len() - keep);
        }
        Ok(prompt)
    }

    /// Whether a stream ends with a usage chunk (`stream_options`).
    pub fn include_usage(&self) -> bool {
        self.stream_options.is_some_and(|o| o.include_usage)
    }

    /// `logit_bias` as (token, bias) pairs: keys are token ids below
    /// `vocab_size`, values in [-100, 100] (OpenAI's range).
    fn logit_bias(&self, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        if map.len() > 300 {
            return Err(ApiError::invalid(
                format!("logit_bias sets {} tokens, at most 300", map.len()),
                Some("logit_bias"),
            ));
        }
        let mut bias = Vec::with_capacity(map.len());
        for (key, &value) in map {
            let token = key
                .parse::<u32>()
                .ok()
                .filter(|&t| (t as usize) < vocab_size);
            let Some(token) = token else {
                return Err(ApiError::invalid(
                    format!("logit_bias key `{key}` is not a token id below {vocab_size}"),
                    Some("logit_bias"),
                ));
            };
            if !(-100.0..=100.0).contains(&value) {
                return Err(ApiError::invalid(
                    format!("logit_bias for token {token} is {value}: it must be in [-100, 100]"),
                    Some("logit_bias"),
                ));
            }
            bias.push((token, value));
        }
        bias.sort_by_key(|&(token, _)| token);
        Ok(bias)
    }
}

/// Token counts.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(body: Value, honoured: &[&str]) -> (String, Option<String>) {
        let e = check_fields(&body, honoured).unwrap_err();
        (e.message, e.param)
    }

    #[test]
    fn every_field_is_honoured_or_refused_by_name() {
        let chat = |extra: Value| {
            let mut body = json!({"model": "m", "messages": [], "temperature": 0.5});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            check_fields(&body, CHAT_FIELDS).map_err(|e| (e.message, e.param))
        };
        assert!(chat(json!({"logit_bias": {"1": 2}, "user": "u"})).is_ok());
        // Null is absent; a default-only field with its default is accepted.
        assert!(chat(json!({"tools": null, "store": false, "skip_special_tokens": true})).is_ok());
        let (message, param) = chat(json!({"frobnicate": 1})).unwrap_err();
        assert_eq!(
            message,
            "Unrecognized request argument supplied: frobnicate"
        );
        assert_eq!(param.as_deref(), Some("frobnicate"));
        for field in ["best_of", "priority", "functions", "audio"] {
            let (message, param) = chat(json!({ field: {"x": 1} })).unwrap_err();
            assert!(
                message.contains(field) && message.contains("not supported"),
                "{message}"
            );
            assert_eq!(param.as_deref(), Some(field));
        }
        let (message, _) = chat(json!({"store": true})).unwrap_err();
        assert!(
            message.contains("only accepted with the value false"),
            "{message}"
        );
        // An endpoint's own fields belong to it only.
        let (message, _) = refused(json!({"prompt": "p", "messages": []}), COMPLETION_FIELDS);
        assert!(message.contains("messages"), "{message}");
        let (message, _) = refused(json!([1]), CHAT_FIELDS);
        assert!(message.contains("JSON object"), "{message}");
    }

    #[test]
    fn logit_bias_takes_token_ids_below_the_vocabulary_and_bounded_values() {
        let limits = Limits {
            max_model_len: 100,
            max_tokens: 100,
            max_n: 4,
            vocab_size: 10,
            max_seqs_per_request: 8,
            max_prompt_bytes: 1000,
            allow_special_tokens_in_messages: false,
        };
        let params = |bias: Value| {
            let fields: SamplingFields =
                serde_json::from_value(json!({"model": "m", "logit_bias": bias})).unwrap();
            let defaults = SamplingParams::default();
            fields.params(Some(4), None, None, 3, &limits, &defaults)
        };
        let ok = params(json!({"7": -100, "2": 5.5})).unwrap();
        assert_eq!(ok.logit_bias, vec![(2, 5.5), (7, -100.0)]);
        for (bias, needle) in [
            (json!({"10": 1}), "below 10"),
            (json!({"x": 1}), "`x`"),
            (json!({"3": 101}), "[-100, 100]"),
        ] {
            let e = params(bias).unwrap_err();
            assert!(e.message.contains(needle), "{}", e.message);
            assert_eq!(e.param.as_deref(), Some("logit_bias"));
        }
    }
}
