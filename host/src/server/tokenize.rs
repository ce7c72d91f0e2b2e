//! vLLM's `/tokenize` and `/detokenize`: a prompt (or chat messages rendered
//! through the model's template) to token ids, and ids back to text, with
//! vLLM's request and response shapes.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::openai::{ApiError, EndpointFields, InMessage};
use super::{check_model, prompt, ApiJson, AppState};

/// `POST /tokenize`: `prompt`, or `messages` for the chat template.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// The model (optional, as in vLLM).
    pub model: Option<String>,
    /// Text to tokenize as a completion prompt.
    pub prompt: Option<String>,
    /// A conversation to render through the chat template.
    pub messages: Option<Vec<InMessage>>,
    /// End the rendered chat with the assistant's header (default true).
    pub add_generation_prompt: Option<bool>,
    /// Leave the final message open for the model to continue.
    #[serde(default)]
    pub continue_final_message: bool,
    /// Extra variables for the chat template.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Add BOS/EOS as the tokenizer is configured (default: true for a
    /// prompt, false for messages, whose template writes them).
    pub add_special_tokens: Option<bool>,
    /// Also return each token's text.
    #[serde(default)]
    pub return_token_strs: bool,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// The model (optional, as in vLLM).
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

impl EndpointFields for TokenizeRequest {
    const FIELDS: &'static [&'static str] = &[
        "prompt",
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
        "add_special_tokens",
        "return_token_strs",
    ];
}

impl EndpointFields for DetokenizeRequest {
    const FIELDS: &'static [&'static str] = &["tokens"];
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<TokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    if let Some(model) = &request.model {
        check_model(&state, model)?;
    }
    let tokens = match (&request.prompt, &request.messages) {
        (Some(text), None) => prompt::tokenize(
            &state,
            vec![text.clone()],
            request.add_special_tokens.unwrap_or(true),
        )
        .await?
        .remove(0),
        (None, Some(messages)) => {
            let options = prompt::TemplateOptions::new(
                request.add_generation_prompt,
                request.continue_final_message,
                request.chat_template_kwargs.as_ref(),
            )?;
            let add_special_tokens = request.add_special_tokens.unwrap_or(false);
            prompt::chat_prompt(&state, messages, None, &options, add_special_tokens).await?
        }
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of `prompt` and `messages`",
                Some("prompt"),
            ))
        }
    };
    let token_strs = request
        .return_token_strs
        .then(|| {
            tokens
                .iter()
                .map(|&t| state.tokenizer.decode(&[t], false))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": state.limits.max_model_len,
        "tokens": tokens,
        "token_strs": token_strs,
    })))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<DetokenizeRequest>,
) -> Result<Json<Value>, ApiError> {
    if let Some(model) = &request.model {
        check_model(&state, model)?;
    }
    if let Some(bad) = request
        .tokens
        .iter()
        .find(|&&t| t as usize >= state.vocab_size)
    {
        return Err(ApiError::invalid(
            format!(
                "token id {bad} is outside the vocabulary of {}",
                state.vocab_size
            ),
            Some("tokens"),
        ));
    }
    let prompt = state
        .tokenizer
        .decode(&request.tokens, false)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(Json(json!({ "prompt": prompt })))
}
