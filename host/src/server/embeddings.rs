//! `POST /v1/embeddings` (OpenAI's shape): a text, texts, or token ids in;
//! one vector each out, as floats or base64 little-endian float32.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::openai::{ApiError, Prompt};
use super::{check_model, prompt, AppState, Served};
use crate::embedding::EmbedError;
use crate::engine::service::{EngineObserver, FinishReason};

/// The fields this endpoint honours. `user` identifies the caller to the
/// operator and changes no output.
const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// The most inputs in one request (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

#[derive(Deserialize)]
struct EmbeddingRequest {
    model: String,
    input: Prompt,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

/// The handler.
pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let arrived = Instant::now();
    let Served::Embedder(embedder) = &state.served else {
        return Err(ApiError::invalid(
            format!(
                "`{}` is a text generation model; /v1/embeddings needs an embedding model",
                state.model_name
            ),
            Some("model"),
        ));
    };
    let Json(body) = body.map_err(|e| ApiError::invalid(e.body_text(), None))?;
    if let Some(fields) = body.as_object() {
        if let Some(name) = fields
            .iter()
            .find(|(name, value)| !value.is_null() && !FIELDS.contains(&name.as_str()))
            .map(|(name, _)| name)
        {
            return Err(ApiError::invalid(
                format!("Unrecognized request argument supplied: {name}"),
                Some(name),
            ));
        }
    }
    let request: EmbeddingRequest = serde_json::from_value(body)
        .map_err(|e| ApiError::invalid(format!("invalid request: {e}"), None))?;
    check_model(&state, &request.model)?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("encoding_format must be `float` or `base64`, got `{other}`"),
                Some("encoding_format"),
            ))
        }
    };
    let inputs = match request.input {
        Prompt::Ids(ids) => vec![ids],
        Prompt::IdLists(lists) => lists,
        Prompt::Text(text) => prompt::tokenize(&state, vec![text], true).await?,
        Prompt::Texts(texts) => {
            if texts.len() > MAX_INPUTS {
                return Err(too_many(texts.len()));
            }
            prompt::tokenize(&state, texts, true).await?
        }
    };
    if inputs.is_empty() || inputs.len() > MAX_INPUTS {
        return Err(match inputs.len() {
            0 => ApiError::invalid("input must not be empty", Some("input")),
            n => too_many(n),
        });
    }
    for (index, ids) in inputs.iter().enumerate() {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= state.vocab_size) {
            return Err(ApiError::invalid(
                format!(
                    "input {index}: token id {bad} is outside the vocabulary of {}",
                    state.vocab_size
                ),
                Some("input"),
            ));
        }
        if ids.is_empty() || ids.len() > embedder.max_tokens() {
            return Err(ApiError::invalid(
                format!(
                    "input {index} has {} tokens; this model embeds 1 to {} tokens per input",
                    ids.len(),
                    embedder.max_tokens()
                ),
                Some("input"),
            ));
        }
    }
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let vectors = embedder.embed(inputs).await.map_err(|e| match &*e {
        EmbedError::Invalid(message) => ApiError::invalid(message.clone(), Some("input")),
        EmbedError::Step(step) => ApiError::internal(step.to_string()),
    })?;
    if let Some(wanted) = request.dimensions {
        let native = vectors.first().map_or(0, Vec::len);
        if wanted != native {
            return Err(ApiError::invalid(
                format!("this model's embeddings have {native} dimensions; `dimensions` {wanted} would need truncation, which it was not trained for"),
                Some("dimensions"),
            ));
        }
    }
    state.metrics.finished(
        FinishReason::Stop,
        arrived.elapsed().as_secs_f64(),
        prompt_tokens,
        0,
    );
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, vector)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": state.model_name,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })))
}

fn too_many(n: usize) -> ApiError {
    ApiError::invalid(
        format!("input has {n} entries; at most {MAX_INPUTS} are accepted"),
        Some("input"),
    )
}
