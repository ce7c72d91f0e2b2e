//! `POST /v1/embeddings` (OpenAI's shape): a text, texts, or token ids in;
//! one vector each out, as floats or base64 little-endian float32. Also
//! what the scoring endpoints share with it: texts to encoder inputs, vLLM's
//! `truncate_prompt_tokens`, and checked runs on the encoder worker.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};

use super::openai::{check_only_fields, ApiError, Prompt};
use super::{check_model, prompt, AppState, Served};
use crate::embedding::service::EmbedderHandle;
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
    let truncate = truncation(&state, embedder, request.truncate_prompt_tokens, false)?;
    let inputs = match request.input {
        Prompt::Ids(_) | Prompt::IdLists(_) if truncate.is_some() => {
            return Err(ApiError::invalid(
                "`truncate_prompt_tokens` cuts texts; token ids are embedded as given",
                Some("truncate_prompt_tokens"),
            ))
        }
        Prompt::Ids(ids) => vec![EncoderText::from(ids)],
        Prompt::IdLists(lists) => lists.into_iter().map(EncoderText::from).collect(),
        Prompt::Text(text) => text_inputs(&state, vec![text], truncate).await?,
        Prompt::Texts(texts) => text_inputs(&state, texts, truncate).await?,
    };
    let (vectors, prompt_tokens) = run_encoder(&state, embedder, inputs).await?;
    count_finished(&state, arrived, prompt_tokens);
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

/// Each text's input with special tokens, cut to `truncate` tokens when
/// given.
pub(super) async fn text_inputs(
    state: &Arc<AppState>,
    texts: Vec<String>,
    truncate: Option<usize>,
) -> Result<Vec<EncoderText>, ApiError> {
    let texts = texts.into_iter().map(|text| (text, None)).collect();
    prompt::encoder_inputs(state, texts, truncate).await
}

/// Runs inputs on the encoder worker once each is checked (in the
/// vocabulary, within the model's length): the outputs and the tokens run.
pub(super) async fn run_encoder(
    state: &AppState,
    encoder: &EmbedderHandle,
    inputs: Vec<EncoderText>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    for (index, input) in inputs.iter().enumerate() {
        prompt::check_vocabulary(state, &input.tokens, "input")?;
        check_text(index, &input.tokens, encoder.max_tokens())
            .map_err(|e| ApiError::invalid(e.to_string(), Some("input")))?;
    }
    let tokens = inputs.iter().map(|i| i.tokens.len()).sum();
    let outputs = encoder.run(inputs).await.map_err(|e| match &*e {
        EmbedError::Invalid(message) => ApiError::invalid(message.clone(), Some("input")),
        EmbedError::Step(_) | EmbedError::Stopped => ApiError::internal(e.to_string()),
    })?;
    Ok((outputs, tokens))
}

/// Counts a request that `arrived` and ran `tokens` in the metrics.
pub(super) fn count_finished(state: &AppState, arrived: Instant, tokens: usize) {
    state.metrics.finished(
        FinishReason::Stop,
        arrived.elapsed().as_secs_f64(),
        tokens,
        0,
    );
}

/// vLLM's `truncate_prompt_tokens` as the tokens each input is cut to:
/// -1 is the model's length, `k` is `k` (at most the model's length, and
/// more than the special tokens a text, or a `pair`, gets).
pub(super) fn truncation(
    state: &AppState,
    encoder: &EmbedderHandle,
    requested: Option<i64>,
    pair: bool,
) -> Result<Option<usize>, ApiError> {
    let Some(requested) = requested else {
        return Ok(None);
    };
    let (max, special) = (
        encoder.max_tokens(),
        state.tokenizer.added_special_tokens(pair),
    );
    let refuse = |message: String| Err(ApiError::invalid(message, Some("truncate_prompt_tokens")));
    let tokens = match requested {
        -1 => max,
        k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        k => {
            return refuse(format!(
                "`truncate_prompt_tokens` must be -1 or positive, got {k}"
            ))
        }
    };
    if tokens > max {
        return refuse(format!(
            "`truncate_prompt_tokens` ({tokens}) is more than this model's {max} tokens"
        ));
    }
    if tokens <= special {
        return refuse(format!(
            "`truncate_prompt_tokens` ({tokens}) leaves no room besides the {special} special tokens"
        ));
    }
    Ok(Some(tokens))
}
