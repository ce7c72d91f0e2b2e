//! `host serve`: an OpenAI-compatible HTTP server (axum) in front of the
//! serving engine.

mod answer;
mod chat;
mod embeddings;
mod listen;
pub mod messages;
pub mod metrics;
pub mod openai;
mod prompt;
pub mod reasoning;
pub mod responses;
mod score;
mod structured;
mod tokenize;
pub mod tools;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::embedding::service::EmbedderHandle;
use crate::embedding::Head;
use crate::engine::sampling::SamplingParams;
use crate::engine::service::{
    EngineHandle, Event, GenerationParams, PromptLogprob, Request as EngineRequest, StopReason,
    TokenLogprob,
};
use crate::engine::structured::Constraint;
use crate::engine::structured::Grammars;
use crate::tokenizer::{ChatTemplate, Tokenizer};
use kiln_plugin_api::Task;
pub use listen::{raise_descriptor_limit, serve};
use metrics::Metrics;
use openai::{ApiError, CompletionRequest, EndpointFields, Limits, Usage};

/// What runs the model behind the API.
pub enum Served {
    /// A text generation model's engine.
    Generator(EngineHandle),
    /// An embedding model's worker.
    Embedder(EmbedderHandle),
}

/// What every handler shares.
pub struct AppState {
    /// The engine or embedding worker.
    pub served: Served,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template, if it has one.
    pub chat_template: Option<ChatTemplate>,
    /// The name clients use in `model`.
    pub model_name: String,
    /// Vocabulary size (token ids must be below it).
    pub vocab_size: usize,
    /// Request limits.
    pub limits: Limits,
    /// Sampling defaults from the model's generation config.
    pub defaults: SamplingParams,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// Metrics.
    pub metrics: Metrics,
    /// Structured output's grammars over the model's vocabulary.
    pub grammars: Grammars,
    /// How the model writes tool calls; `None` when nothing names a format
    /// (requests that would read calls are then refused).
    pub tool_format: Option<tools::ToolFormat>,
    /// `--reasoning-parser`: chats' thinking comes back apart.
    pub reasoning: Option<reasoning::ReasoningFormat>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.body())).into_response()
    }
}

/// JSON bodies whose rejections are OpenAI-shaped errors, and whose fields
/// are all ones the endpoint honours ([`openai::check_fields`]).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + EndpointFields> FromRequest<S>
    for ApiJson<T>
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<Value>::from_request(req, state).await {
            Ok(Json(body)) => {
                openai::check_fields(&body, T::FIELDS)?;
                serde_json::from_value(body)
                    .map(ApiJson)
                    .map_err(|e| ApiError::invalid(format!("invalid request: {e}"), None))
            }
            Err(JsonRejection::JsonDataError(e)) => Err(ApiError::invalid(
                format!("invalid request: {}", e.body_text()),
                None,
            )),
            Err(JsonRejection::JsonSyntaxError(e)) => Err(ApiError::invalid(
                format!("invalid JSON: {}", e.body_text()),
                None,
            )),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::invalid(
                "expected `Content-Type: application/json`",
                None,
            )),
            Err(JsonRejection::BytesRejection(e)) => Err(ApiError {
                status: e.status().as_u16(),
                ..ApiError::invalid(e.body_text(), None)
            }),
            Err(e) => Err(ApiError::invalid(e.body_text(), None)),
        }
    }
}

/// The router: request bodies up to `max_body_bytes`, arriving within
/// `body_timeout`; browsers may call it from `allowed_origins` (CORS).
pub fn router(
    state: Arc<AppState>,
    max_body_bytes: usize,
    body_timeout: Duration,
    allowed_origins: &[String],
) -> Result<Router, String> {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses::create))
        .route("/v1/messages", post(messages::create))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_card))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/score", post(score::score))
        .route("/score", post(score::score))
        .route("/v1/rerank", post(score::rerank))
        .route("/rerank", post(score::rerank))
        .route("/v2/rerank", post(score::rerank))
        .route("/v1/classify", post(score::classify))
        .route("/classify", post(score::classify))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    let router = Router::new()
        .merge(api)
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/metrics", get(render_metrics))
        .fallback(|request: Request| async move {
            ApiError::no_route(request.method().as_str(), request.uri().path())
        })
        .method_not_allowed_fallback(|request: Request| async move {
            ApiError::method_not_allowed(request.method().as_str(), request.uri().path())
        })
        .layer(middleware::from_fn(echo_request_id))
        .layer(middleware::from_fn(move |request, next| {
            listen::read_body((max_body_bytes, body_timeout), request, next)
        }))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state);
    Ok(match cors(allowed_origins)? {
        Some(cors) => router.layer(cors),
        None => router,
    })
}

/// CORS for `origins` (`*`: any), or none when there are none.
fn cors(origins: &[String]) -> Result<Option<tower_http::cors::CorsLayer>, String> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::from(Any)
    } else {
        let values = origins
            .iter()
            .map(|o| {
                o.parse::<axum::http::HeaderValue>()
                    .map_err(|_| format!("--allowed-origins: `{o}` is not a valid origin"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(values)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(Any)
            .allow_headers(Any),
    ))
}

/// Sends a request's `x-request-id` back on its response (as vLLM does), so
/// a gateway can match the two.
async fn echo_request_id(request: Request, next: Next) -> Response {
    let id = request.headers().get("x-request-id").cloned();
    let mut response = next.run(request).await;
    if let Some(id) = id {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

async fn authorize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if let Some(key) = &state.api_key {
        // OpenAI's bearer token, or Anthropic's `x-api-key`.
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .or_else(|| headers.get("x-api-key").map(|v| v.as_bytes()));
        // Compared in constant time: the time taken says nothing of how
        // much of a guess was right.
        let matches = given.is_some_and(|given| bool::from(given.ct_eq(key.as_bytes())));
        if !matches {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

async fn render_metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}{:08x}",
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

/// The served model as `/v1/models` lists it.
fn card(state: &AppState) -> Value {
    json!({
        "id": state.model_name, "object": "model", "created": now(), "owned_by": "kiln",
        "max_model_len": state.limits.max_model_len,
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [card(&state)]}))
}

/// `GET /v1/models/{id}`: the served model, or 404 naming `id`.
async fn model_card(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    check_model(&state, &id)?;
    Ok(Json(card(&state)))
}

impl AppState {
    /// The generation engine, or a 400 for an encoder model.
    fn generator(&self) -> Result<&EngineHandle, ApiError> {
        match &self.served {
            Served::Generator(engine) => Ok(engine),
            Served::Embedder(handle) => Err(ApiError::invalid(
                format!(
                    "`{}` is a {} model: it serves {}, not text generation",
                    self.model_name,
                    self.task(),
                    match handle.head() {
                        Head::Pooling(_) => "/v1/embeddings, /v1/score and /v1/rerank",
                        Head::Classifier(_) => "/v1/score, /v1/rerank and /v1/classify",
                    }
                ),
                Some("model"),
            )),
        }
    }

    /// What the served model does.
    fn task(&self) -> Task {
        match &self.served {
            Served::Generator(_) => Task::TextGeneration,
            Served::Embedder(handle) => match handle.head() {
                Head::Pooling(_) => Task::Embeddings,
                Head::Classifier(_) => Task::SequenceClassification,
            },
        }
    }
}

fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    if model == state.model_name {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model))
    }
}

/// One generation submitted to the engine.
struct Choice {
    index: usize,
    events: UnboundedReceiver<Event>,
}

/// A new group id: the sequences of one API request share one, so the
/// scheduler shares the batch fairly between requests.
fn new_group() -> u64 {
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Submits `n` choices for `prompt`, numbered from `first_index`, in the
/// request's `group`, each with its own copy of the grammar's `constraint`.
fn submit(
    state: &AppState,
    prompt: &[u32],
    params: &GenerationParams,
    n: usize,
    first_index: usize,
    group: u64,
    constraint: Option<&Constraint>,
) -> Result<Vec<Choice>, ApiError> {
    (0..n)
        .map(|i| {
            let (tx, rx) = unbounded_channel();
            let mut params = params.clone();
            params.sampling.seed = params.sampling.seed.map(|s| s.wrapping_add(i as u64));
            state
                .generator()?
                .submit(EngineRequest {
                    prompt: prompt.to_vec(),
                    params,
                    events: tx,
                    arrived: Instant::now(),
                    group,
                    constraint: constraint.map(Constraint::deep_clone),
                })
                .map_err(ApiError::internal)?;
            Ok(Choice {
                index: first_index + i,
                events: rx,
            })
        })
        .collect()
}

/// A finished choice, collected from its events.
#[derive(Default)]
struct Collected {
    text: String,
    tokens: Vec<TokenLogprob>,
    /// The prompt's log-probabilities, when asked for.
    prompt_logprobs: Option<Vec<Option<PromptLogprob>>>,
    finish_reason: Option<&'static str>,
    /// vLLM's `stop_reason` (the stop string or token id), as JSON.
    stop_reason: Value,
    prompt_tokens: usize,
    completion_tokens: usize,
}

async fn collect(mut choice: Choice) -> Result<Collected, ApiError> {
    let mut out = Collected::default();
    while let Some(event) = choice.events.recv().await {
        match event {
            Event::Chunk { text, logprob, .. } => {
                out.text.push_str(&text);
                out.tokens.extend(logprob);
            }
            Event::PromptLogprobs(scores) => out.prompt_logprobs = Some(scores),
            Event::Done {
                finish_reason,
                stop_reason,
                prompt_tokens,
                completion_tokens,
            } => {
                out.finish_reason = Some(finish_reason.as_str());
                out.stop_reason = stop_reason
                    .as_ref()
                    .map_or(Value::Null, StopReason::to_json);
                out.prompt_tokens = prompt_tokens;
                out.completion_tokens = completion_tokens;
                return Ok(out);
            }
            Event::Error(message) => return Err(ApiError::invalid(message, None)),
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the request finished",
    ))
}

/// `logprobs` as the legacy completions give them: each token's text,
/// log-probability, alternatives (text → log-probability) and offset in
/// the text, counted from `start_offset`. An echoed prompt's tokens come
/// first (`echoed`: its first token's name, which nothing precedes and so
/// has none, then the others' log-probabilities).
fn completion_logprobs<'a>(
    echoed: Option<(&str, &'a [Option<PromptLogprob>])>,
    tokens: &'a [TokenLogprob],
    start_offset: usize,
) -> Value {
    let (mut texts, mut logprobs, mut top, mut offsets) = (vec![], vec![], vec![], vec![]);
    let mut offset = start_offset;
    let mut push = |text: &str, logprob: Value, alternatives: Value| {
        offsets.push(offset);
        offset += text.len();
        texts.push(text.to_owned());
        logprobs.push(logprob);
        top.push(alternatives);
    };
    let prompt = match echoed {
        Some((first, scores)) => {
            push(first, Value::Null, Value::Null);
            scores.get(1..).unwrap_or_default()
        }
        None => &[],
    };
    let prompt_tokens = prompt.iter().flatten().map(|s| &s.logprob);
    for t in prompt_tokens.chain(tokens) {
        let alternatives = t.top.iter().map(|(_, text, lp)| (text.clone(), json!(lp)));
        push(
            &t.text,
            json!(t.logprob),
            Value::Object(alternatives.collect()),
        );
    }
    json!({"tokens": texts, "token_logprobs": logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// vLLM's `prompt_logprobs`: for each prompt token, null for the first,
/// else its id's and the top alternatives' log-probability, rank and text,
/// by id.
fn prompt_logprobs_json(scores: &[Option<PromptLogprob>]) -> Value {
    let position = |s: &PromptLogprob| {
        let t = &s.logprob;
        let mut entries = serde_json::Map::new();
        for (rank, (id, text, lp)) in t.top.iter().enumerate() {
            let entry = json!({"logprob": lp, "rank": rank + 1, "decoded_token": text});
            entries.insert(id.to_string(), entry);
        }
        let own = json!({"logprob": t.logprob, "rank": s.rank, "decoded_token": t.text});
        entries.insert(t.token.to_string(), own);
        Value::Object(entries)
    };
    scores
        .iter()
        .map(|s| s.as_ref().map_or(Value::Null, position))
        .collect()
}

fn sse(events: impl Stream<Item = Value> + Send + 'static) -> Response {
    let events = events
        .map(|value| Ok::<_, Infallible>(SseEvent::default().data(value.to_string())))
        .chain(stream::once(async {
            Ok(SseEvent::default().data("[DONE]"))
        }));
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Typed events (the Responses and Messages APIs') as server-sent events,
/// `event:` naming each one's `type`; no `[DONE]`, as those streams end.
fn typed_sse(events: impl Stream<Item = Value> + Send + 'static) -> Response {
    let events = events.map(|value| {
        let kind = value["type"].as_str().unwrap_or("error").to_owned();
        Ok::<_, Infallible>(SseEvent::default().event(kind).data(value.to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Events of several choices, interleaved, tagged with their index.
fn merged(choices: Vec<Choice>) -> impl Stream<Item = (usize, Event)> + Send {
    stream::select_all(choices.into_iter().map(|c| {
        let index = c.index;
        UnboundedReceiverStream::new(c.events).map(move |e| (index, e))
    }))
}

async fn completions(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    check_model(&state, &request.common.model)?;
    state.generator()?;
    if request.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix is not supported", Some("suffix")));
    }
    if request.logprobs.is_some_and(|k| k > 5) {
        return Err(ApiError::invalid(
            "logprobs must be at most 5",
            Some("logprobs"),
        ));
    }
    // With `echo`, `logprobs` covers the prompt's tokens too (as OpenAI's
    // legacy completions and vLLM give them): the prompt is scored.
    let echo_scores = request.logprobs.filter(|_| request.echo);
    let scored = request.common.prompt_logprobs.max(echo_scores);
    let add_special_tokens = request.add_special_tokens.unwrap_or(true);
    let n = request.common.n.unwrap_or(1);
    let prompts = prompt::completion_prompts(&state, &request.prompt, n, add_special_tokens)
        .await?
        .into_iter()
        .map(|p| request.common.truncate(p, state.limits.max_model_len))
        .collect::<Result<Vec<_>, _>>()?;
    let group = new_group();
    let constraint = structured::constraint(&state, &request.common)
        .await?
        .map(Constraint::new);
    let bad_words = prompt::bad_words(&state, &request.common.bad_words).await?;
    let mut choices = Vec::new();
    let mut prompt_tokens = 0;
    let mut echoes = Vec::new();
    for (p, prompt) in prompts.iter().enumerate() {
        let params = GenerationParams {
            bad_words: bad_words.clone(),
            prompt_logprobs: scored,
            ..request.common.params(
                request.common.max_tokens,
                Some(16),
                request.logprobs,
                prompt.len(),
                &state.limits,
                &state.defaults,
            )?
        };
        choices.extend(submit(
            &state,
            prompt,
            &params,
            n,
            p * n,
            group,
            constraint.as_ref(),
        )?);
        prompt_tokens += prompt.len();
        // The echoed text, and its first token's name in log-probabilities.
        let echo = if request.echo {
            let text = state
                .tokenizer
                .decode(prompt, false)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            let as_ids = request.common.return_tokens_as_token_ids;
            (
                text,
                TokenLogprob::name(&state.tokenizer, prompt[0], as_ids),
            )
        } else {
            Default::default()
        };
        echoes.extend(std::iter::repeat_n(echo, n));
    }
    let id = request_id("cmpl");
    let created = now();
    let model = state.model_name.clone();
    if request.common.stream {
        let include_usage = request.common.include_usage();
        let logprobs = request.logprobs.is_some();
        let chunk = {
            let (id, model) = (id.clone(), model.clone());
            move |choices: Value| json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": choices})
        };
        // A scored prompt's echo comes with its log-probabilities, when the
        // engine has them; else every echo comes first.
        let first: Vec<Value> = echoes
            .iter()
            .enumerate()
            .filter(|(_, (text, _))| !text.is_empty() && scored.is_none())
            .map(|(i, (text, _))| {
                chunk(json!([{"index": i, "text": text, "logprobs": null, "finish_reason": null}]))
            })
            .collect();
        let scored_chunk = {
            let chunk = chunk.clone();
            let (echo_logprobs, prompt_logprobs) = (
                echo_scores.is_some(),
                request.common.prompt_logprobs.is_some(),
            );
            let echoes = echoes.clone();
            move |index: usize, scores: &[Option<PromptLogprob>]| {
                let (text, first) = &echoes[index];
                let logprobs = match echo_logprobs {
                    true => completion_logprobs(Some((first, scores)), &[], 0),
                    false => Value::Null,
                };
                let mut choice = json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": null});
                if prompt_logprobs {
                    choice["prompt_logprobs"] = prompt_logprobs_json(scores);
                }
                chunk(json!([choice]))
            }
        };
        let completion_tokens = Arc::new(AtomicUsize::new(0));
        let body = {
            let chunk = chunk.clone();
            let counter = completion_tokens.clone();
            merged(choices).filter_map(move |(index, event)| {
                std::future::ready(match event {
                    Event::Chunk { text, logprob, .. } => {
                        let lp = if logprobs { completion_logprobs(None, &logprob.into_iter().collect::<Vec<_>>(), 0) } else { Value::Null };
                        Some(chunk(json!([{"index": index, "text": text, "logprobs": lp, "finish_reason": null}])))
                    }
                    Event::Done { finish_reason, stop_reason, completion_tokens: c, .. } => {
                        counter.fetch_add(c, Ordering::Relaxed);
                        let stop_reason = stop_reason.as_ref().map_or(Value::Null, StopReason::to_json);
                        Some(chunk(json!([{"index": index, "text": "", "logprobs": null, "finish_reason": finish_reason.as_str(), "stop_reason": stop_reason}])))
                    }
                    Event::Error(message) => Some(json!({"error": {"message": message, "type": "server_error"}})),
                    Event::PromptLogprobs(scores) => Some(scored_chunk(index, &scores)),
                })
            })
        };
        let tail = stream::once(async move { completion_tokens.load(Ordering::Relaxed) })
            .filter_map(move |completion_tokens| {
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens,
                    total_tokens: prompt_tokens + completion_tokens,
                };
                std::future::ready(include_usage.then(|| {
                    let mut u = chunk(json!([]));
                    u["usage"] = json!(usage);
                    u
                }))
            });
        return Ok(sse(stream::iter(first).chain(body).chain(tail)));
    }
    let mut results = Vec::new();
    let mut completion_tokens = 0;
    for (choice, (echo, first)) in choices.into_iter().zip(echoes) {
        let index = choice.index;
        let c = collect(choice).await?;
        completion_tokens += c.completion_tokens;
        let scores = c.prompt_logprobs.as_deref().unwrap_or_default();
        let logprobs = match request.logprobs {
            None => Value::Null,
            Some(_) if request.echo => completion_logprobs(Some((&first, scores)), &c.tokens, 0),
            Some(_) => completion_logprobs(None, &c.tokens, 0),
        };
        let mut result = json!({
            "index": index,
            "text": format!("{echo}{}", c.text),
            "logprobs": logprobs,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        });
        if request.common.prompt_logprobs.is_some() {
            result["prompt_logprobs"] = c
                .prompt_logprobs
                .as_deref()
                .map_or(Value::Null, prompt_logprobs_json);
        }
        results.push(result);
    }
    let usage = Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    };
    Ok(Json(json!({"id": id, "object": "text_completion", "created": created, "model": model, "choices": results, "usage": usage})).into_response())
}
