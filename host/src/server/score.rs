//! vLLM's scoring endpoints: `/v1/score` (pairs of texts scored),
//! `/v1/rerank` (documents ranked by relevance to a query, in Jina's and
//! Cohere's shape, also at `/rerank` and `/v2/rerank`) and `/v1/classify`
//! (class probabilities of each text).
//!
//! A cross-encoder (a sequence classifier with one class) reads each pair
//! together and scores it with its activation (sigmoid unless its config
//! says otherwise; `use_activation: false` gives the raw logit). An
//! embedding model scores a pair by the cosine similarity of the two texts'
//! embeddings, as vLLM's bi-encoders do.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use super::embeddings::{count_finished, run_encoder, text_inputs, truncation};
use super::openai::{check_only_fields, ApiError};
use super::{check_model, now, prompt, request_id, AppState, Served};
use crate::embedding::service::EmbedderHandle;
use crate::embedding::{Classes, Head};

/// The most texts or pairs in one request.
const MAX_INPUTS: usize = 2048;

/// One text or several.
#[derive(Deserialize)]
#[serde(untagged)]
enum Texts {
    One(String),
    Many(Vec<String>),
}

impl Texts {
    fn into_vec(self) -> Vec<String> {
        match self {
            Texts::One(text) => vec![text],
            Texts::Many(texts) => texts,
        }
    }
}

/// The fields every scoring endpoint honours, besides its own.
const COMMON_FIELDS: &[&str] = &["model", "use_activation", "truncate_prompt_tokens", "user"];

/// A request: the common fields and the endpoint's own (`T`).
#[derive(Deserialize)]
struct Request<T> {
    #[serde(flatten)]
    common: Common,
    #[serde(flatten)]
    fields: T,
}

/// The fields every scoring endpoint shares.
#[derive(Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    /// vLLM's: the classifier's activation (default true), else logits.
    #[serde(default)]
    use_activation: Option<bool>,
    /// vLLM's: cut each input to this many tokens (-1: the model's length).
    #[serde(default)]
    truncate_prompt_tokens: Option<i64>,
}

const SCORE_FIELDS: &[&str] = &["text_1", "text_2"];

#[derive(Deserialize)]
struct ScoreFields {
    text_1: Texts,
    text_2: Texts,
}

const RERANK_FIELDS: &[&str] = &["query", "documents", "top_n", "return_documents"];

#[derive(Deserialize)]
struct RerankFields {
    query: String,
    documents: Vec<Document>,
    #[serde(default)]
    top_n: Option<usize>,
    #[serde(default)]
    return_documents: Option<bool>,
}

/// A document: its text, or Cohere's `{"text": …}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Document {
    Text(String),
    Object { text: String },
}

const CLASSIFY_FIELDS: &[&str] = &["input"];

#[derive(Deserialize)]
struct ClassifyFields {
    input: Texts,
}

/// Reads a body whose fields must all be the common ones or in `fields`,
/// and checks `model`.
fn read<T: serde::de::DeserializeOwned>(
    state: &AppState,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
    fields: &[&str],
) -> Result<Request<T>, ApiError> {
    let Json(body) = body.map_err(|e| ApiError::invalid(e.body_text(), None))?;
    check_only_fields(&body, &[fields, COMMON_FIELDS].concat())?;
    let request: Request<T> = serde_json::from_value(body)
        .map_err(|e| ApiError::invalid(format!("invalid request: {e}"), None))?;
    if let Some(name) = &request.common.model {
        check_model(state, name)?;
    }
    Ok(request)
}

/// The encoder worker, or a 400 naming what `endpoint` needs.
fn encoder_worker<'a>(state: &'a AppState, endpoint: &str) -> Result<&'a EmbedderHandle, ApiError> {
    match &state.served {
        Served::Embedder(handle) => Ok(handle),
        Served::Generator(_) => Err(ApiError::invalid(
            format!(
                "`{}` is a text generation model; {endpoint} needs a cross-encoder or an embedding model",
                state.model_name
            ),
            Some("model"),
        )),
    }
}

/// `POST /v1/score`: `text_1` against each of `text_2` (one against many),
/// or pair by pair (lists of one length).
pub async fn score(
    State(state): State<Arc<AppState>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let arrived = Instant::now();
    let encoder = encoder_worker(&state, "/v1/score")?;
    let request: Request<ScoreFields> = read(&state, body, SCORE_FIELDS)?;
    let (firsts, seconds) = (
        request.fields.text_1.into_vec(),
        request.fields.text_2.into_vec(),
    );
    let pairs: Vec<(String, String)> = match (firsts.len(), seconds.len()) {
        (1, _) => seconds
            .into_iter()
            .map(|second| (firsts[0].clone(), second))
            .collect(),
        (n, m) if n == m => firsts.into_iter().zip(seconds).collect(),
        (n, m) => {
            return Err(ApiError::invalid(
                format!("`text_1` has {n} texts and `text_2` {m}: give one `text_1`, or as many as `text_2`"),
                Some("text_1"),
            ))
        }
    };
    let (scores, tokens) =
        score_pairs(&state, encoder, pairs, "text_2", &request.common, arrived).await?;
    let data: Vec<Value> = scores
        .iter()
        .enumerate()
        .map(|(index, score)| json!({"index": index, "object": "score", "score": score}))
        .collect();
    Ok(Json(json!({
        "id": request_id("score"),
        "object": "list",
        "created": now(),
        "model": state.model_name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    })))
}

/// `POST /v1/rerank`: the documents by relevance to the query, best first;
/// `top_n` of them when given (0 or absent: all).
pub async fn rerank(
    State(state): State<Arc<AppState>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let arrived = Instant::now();
    let encoder = encoder_worker(&state, "/v1/rerank")?;
    let Request { common, fields } = read::<RerankFields>(&state, body, RERANK_FIELDS)?;
    let documents: Vec<String> = fields
        .documents
        .into_iter()
        .map(|d| match d {
            Document::Text(text) | Document::Object { text } => text,
        })
        .collect();
    let pairs = documents
        .iter()
        .map(|d| (fields.query.clone(), d.clone()))
        .collect();
    let (scores, tokens) =
        score_pairs(&state, encoder, pairs, "documents", &common, arrived).await?;
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let keep = match fields.top_n {
        Some(n) if n > 0 => n.min(order.len()),
        _ => order.len(),
    };
    let with_documents = fields.return_documents.unwrap_or(true);
    let results: Vec<Value> = order[..keep]
        .iter()
        .map(|&index| {
            let mut result = json!({"index": index, "relevance_score": scores[index]});
            if with_documents {
                result["document"] = json!({"text": documents[index]});
            }
            result
        })
        .collect();
    Ok(Json(json!({
        "id": request_id("rerank"),
        "model": state.model_name,
        "usage": {"total_tokens": tokens},
        "results": results,
    })))
}

/// `POST /v1/classify`: each text's class probabilities and likeliest label.
pub async fn classify(
    State(state): State<Arc<AppState>>,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let arrived = Instant::now();
    let encoder = encoder_worker(&state, "/v1/classify")?;
    let Head::Classifier(classes) = encoder.head() else {
        return Err(ApiError::invalid(
            format!(
                "`{}` is an embedding model; /v1/classify needs a sequence classification model",
                state.model_name
            ),
            Some("model"),
        ));
    };
    let Request { common, fields } = read::<ClassifyFields>(&state, body, CLASSIFY_FIELDS)?;
    let texts = fields.input.into_vec();
    check_count(texts.len(), "input")?;
    let truncate = truncation(&state, encoder, common.truncate_prompt_tokens, false)?;
    let inputs = text_inputs(&state, texts, truncate).await?;
    let (logits, tokens) = run_encoder(&state, encoder, inputs).await?;
    count_finished(&state, arrived, tokens);
    let data: Vec<Value> = logits
        .iter()
        .enumerate()
        .map(|(index, logits)| {
            let probs = activated(classes, logits, common.use_activation);
            let best = (0..probs.len())
                .max_by(|&a, &b| probs[a].total_cmp(&probs[b]))
                .unwrap_or(0);
            json!({
                "index": index,
                "label": classes.labels.get(best),
                "probs": probs,
                "num_classes": probs.len(),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": request_id("classify"),
        "object": "list",
        "created": now(),
        "model": state.model_name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    })))
}

/// Each pair's score and the tokens run: a cross-encoder's (activated
/// unless `use_activation` is false) or the cosine similarity of an
/// embedding model's two embeddings; inputs cut as `truncate_prompt_tokens`
/// says. `param` names the pairs' field in errors; the request that
/// `arrived` is counted in the metrics.
async fn score_pairs(
    state: &Arc<AppState>,
    encoder: &EmbedderHandle,
    pairs: Vec<(String, String)>,
    param: &str,
    common: &Common,
    arrived: Instant,
) -> Result<(Vec<f32>, usize), ApiError> {
    check_count(pairs.len(), param)?;
    let (use_activation, truncate_prompt_tokens) =
        (common.use_activation, common.truncate_prompt_tokens);
    let (scores, tokens) = match encoder.head() {
        Head::Classifier(classes) => {
            if classes.labels.len() != 1 {
                return Err(ApiError::invalid(
                    format!(
                        "`{}` classifies into {} classes; scoring needs a cross-encoder with one",
                        state.model_name,
                        classes.labels.len()
                    ),
                    Some("model"),
                ));
            }
            let truncate = truncation(state, encoder, truncate_prompt_tokens, true)?;
            let pairs = pairs.into_iter().map(|(a, b)| (a, Some(b))).collect();
            let inputs = prompt::encoder_inputs(state, pairs, truncate).await?;
            let (logits, tokens) = run_encoder(state, encoder, inputs).await?;
            let scores = logits
                .iter()
                .map(|l| activated(classes, l, use_activation)[0])
                .collect();
            (scores, tokens)
        }
        Head::Pooling(_) => {
            if use_activation.is_some() {
                return Err(ApiError::invalid(
                    "`use_activation` applies to cross-encoders; an embedding model scores by cosine similarity",
                    Some("use_activation"),
                ));
            }
            // Each distinct text is embedded once (a query against many
            // documents is one query).
            let mut index: HashMap<String, usize> = HashMap::new();
            let mut texts = Vec::new();
            let mut slot = |text: String| match index.get(&text) {
                Some(&slot) => slot,
                None => {
                    index.insert(text.clone(), texts.len());
                    texts.push(text);
                    texts.len() - 1
                }
            };
            let slots: Vec<(usize, usize)> = pairs
                .into_iter()
                .map(|(first, second)| (slot(first), slot(second)))
                .collect();
            let truncate = truncation(state, encoder, truncate_prompt_tokens, false)?;
            let inputs = text_inputs(state, texts, truncate).await?;
            let (embeddings, tokens) = run_encoder(state, encoder, inputs).await?;
            let scores = slots
                .iter()
                .map(|&(a, b)| cosine(&embeddings[a], &embeddings[b]))
                .collect();
            (scores, tokens)
        }
    };
    count_finished(state, arrived, tokens);
    Ok((scores, tokens))
}

fn check_count(count: usize, param: &str) -> Result<(), ApiError> {
    if count == 0 || count > MAX_INPUTS {
        return Err(ApiError::invalid(
            format!("give 1 to {MAX_INPUTS} texts, got {count}"),
            Some(param),
        ));
    }
    Ok(())
}

fn activated(classes: &Classes, logits: &[f32], use_activation: Option<bool>) -> Vec<f32> {
    if use_activation.unwrap_or(true) {
        classes.activation.apply(logits)
    } else {
        logits.to_vec()
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(f32::MIN_POSITIVE)
}
