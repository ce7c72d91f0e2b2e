//! The OpenAI API's request and response shapes (with vLLM's extensions:
//! `top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `min_tokens`,
//! `ignore_eos`), and their validation.

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
    pub param: Option<&'static str>,
}

impl ApiError {
    /// 400: the request is invalid.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            message: message.into(),
            param,
        }
    }

    /// 404: no such model.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: 404,
            kind: "invalid_request_error",
            message: format!("The model `{model}` does not exist."),
            param: Some("model"),
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
    /// `max_tokens`.
    pub max_tokens: Option<usize>,
    /// `user` (accepted, unused).
    pub user: Option<String>,
}

/// `stream_options`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with token usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// A chat message as clients send it.
#[derive(Clone, Debug, Deserialize)]
pub struct InMessage {
    /// `system`, `user`, `assistant`, `tool`.
    pub role: String,
    /// A string, or a list of parts of which text parts are used.
    #[serde(default)]
    pub content: Option<Value>,
}

impl InMessage {
    /// The text content.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Array(parts)) => parts
                .iter()
                .map(|part| {
                    match (
                        part.get("type").and_then(Value::as_str),
                        part.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(text)) => Ok(text.to_owned()),
                        _ => Err(ApiError::invalid(
                            "only text content parts are supported",
                            Some("messages"),
                        )),
                    }
                })
                .collect(),
            Some(_) => Err(ApiError::invalid(
                "message content must be a string or a list of parts",
                Some("messages"),
            )),
        }
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
        let sampling = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: match self.top_k {
                Some(k) if k <= 0 => 0,
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
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            logprobs,
        })
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
