//! `POST /v1/embeddings` (OpenAI's shape): a text, texts, or token ids in;
//! one vector each out, as floats or base64 little-endian float32.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::openai::{check_only_fields, ApiError, Prompt};
use super::{check_model, prompt, score, AppState, Served};
use crate::embedding::{check_text, EmbedError, EncoderText, Head};
use crate::engine::service::{EngineObserver, FinishReason};

/// The fields this endpoint honours. `user` identifies the caller to the
/// operator and changes no output.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "encoding_format",
    "dimensions",
    "truncate_prompt_tokens",
    "user",
];

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
    #[serde(default)]
    truncate_prompt_tokens: Option<i64>,
}

/// The handler.
pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let arrived = Instant::now();
    let embedder = match &state.served {
        Served::Embedder(embedder) if matches!(embedder.head(), Head::Pooling(_)) => embedder,
        _ => {
            return Err(ApiError::invalid(
                format!(
                    "`{}` is a {} model; /v1/embeddings needs an embedding model",
                    state.model_name,
                    state.task()
                ),
                Some("model"),
            ))
        }
    };
    let Json(body) = body.map_err(|e| ApiError::invalid(e.body_text(), None))?;
    check_only_fields(&body, FIELDS)?;
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
    let count = match &request.input {
        Prompt::Text(_) | Prompt::Ids(_) => 1,
        Prompt::Texts(texts) => texts.len(),
        Prompt::IdLists(lists) => lists.len(),
    };
    if count == 0 || count > MAX_INPUTS {
        return Err(ApiError::invalid(
            format!("input has {count} entries; 1 to {MAX_INPUTS} are accepted"),
            Some("input"),
        ));
    }
    if let Some(wanted) = request.dimensions {
        let native = embedder.dimensions();
        if native != Some(wanted) {
            let native = native.map_or("a dynamic number of".to_owned(), |n| n.to_string());
            return Err(ApiError::invalid(
                format!("this model's embeddings have {native} dimensions; `dimensions` {wanted} would need truncation, which it was not trained for"),
                Some("dimensions"),
            ));
        }
    }
    let truncate = score::truncation(&state, embedder, request.truncate_prompt_tokens, false)?;
    let inputs = match request.input {
        Prompt::Ids(_) | Prompt::IdLists(_) if truncate.is_some() => {
            return Err(ApiError::invalid(
                "`truncate_prompt_tokens` cuts texts; token ids are embedded as given",
                Some("truncate_prompt_tokens"),
            ))
        }
        Prompt::Ids(ids) => vec![ids],
        Prompt::IdLists(lists) => lists,
        Prompt::Text(text) => token_ids(&state, vec![text], truncate).await?,
        Prompt::Texts(texts) => token_ids(&state, texts, truncate).await?,
    };
    for (index, ids) in inputs.iter().enumerate() {
        prompt::check_vocabulary(&state, ids, "input")?;
        check_text(index, ids, embedder.max_tokens())
            .map_err(|e| ApiError::invalid(e.to_string(), Some("input")))?;
    }
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let vectors = embedder
        .run(inputs.into_iter().map(EncoderText::from).collect())
        .await
        .map_err(|e| match &*e {
            EmbedError::Invalid(message) => ApiError::invalid(message.clone(), Some("input")),
            EmbedError::Step(_) | EmbedError::Stopped => ApiError::internal(e.to_string()),
        })?;
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

/// Each text's token ids with special tokens, cut to `truncate` tokens when
/// given.
async fn token_ids(
    state: &Arc<AppState>,
    texts: Vec<String>,
    truncate: Option<usize>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let texts = texts.into_iter().map(|text| (text, None)).collect();
    Ok(prompt::encoder_inputs(state, texts, truncate)
        .await?
        .into_iter()
        .map(|input| input.tokens)
        .collect())
}
