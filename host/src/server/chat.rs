//! `POST /v1/chat/completions`: the conversation through the chat template,
//! the choices through the engine, and the answer as one message or a
//! stream of chunks; with `tools`, the model's calls (in the server's
//! tool-call format) become `tool_calls` (whole, or one delta per call when
//! streaming); with `--reasoning-parser`, the thinking comes back as
//! `reasoning_content` and only the answer is read for calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

use super::answer::{AnswerStream, Part, Reading};
use super::openai::{ApiError, ChatRequest, Usage};
use super::{
    check_model, collect, merged, new_group, now, prompt, prompt_logprobs_json, request_id, sse,
    structured, submit, ApiJson, AppState, Choice,
};
use super::{reasoning, tools};
use crate::engine::service::{Event, StopReason, TokenLogprob};
use crate::engine::structured::Constraint;

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let submitted = submit_chat(&state, &request).await?;
    let id = request_id("chatcmpl");
    let created = now();
    let model = state.model_name.clone();
    if request.common.stream {
        let include_usage = request.common.include_usage();
        let chunks = ChunkMaker {
            id,
            created,
            model,
            logprobs: request.logprobs,
            reading: submitted.reading,
        };
        return Ok(sse(stream_chat(
            submitted.choices,
            chunks,
            submitted.prompt_tokens,
            include_usage,
        )));
    }
    let mut results = Vec::new();
    let mut usage = Usage {
        prompt_tokens: submitted.prompt_tokens,
        ..Usage::default()
    };
    // vLLM's `prompt_logprobs`, once for the response (its choices share the
    // prompt).
    let mut scored_prompt = Value::Null;
    for choice in submitted.choices {
        let index = choice.index;
        let c = collect(choice).await?;
        usage.completion_tokens += c.completion_tokens;
        if let Some(scores) = &c.prompt_logprobs {
            scored_prompt = prompt_logprobs_json(scores);
        }
        let answer = submitted.reading.whole(c.text);
        let mut message = json!({"role": "assistant", "content": answer.content});
        if submitted.reading.thinks.is_some() {
            message["reasoning_content"] = json!(answer.thinking);
            message["reasoning"] = json!(answer.thinking);
        }
        let mut finish_reason = c.finish_reason;
        if !answer.calls.is_empty() {
            let ids = request_id("call");
            message["tool_calls"] = answer
                .calls
                .iter()
                .enumerate()
                .map(|(i, call)| tool_call_json(call.to_json(i, &ids)))
                .collect();
            if finish_reason == Some("stop") {
                finish_reason = Some("tool_calls");
            }
        }
        results.push(json!({
            "index": index,
            "message": message,
            "logprobs": if request.logprobs { chat_logprobs(&c.tokens) } else { Value::Null },
            "finish_reason": finish_reason,
            "stop_reason": c.stop_reason,
        }));
    }
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    let mut body = json!({"id": id, "object": "chat.completion", "created": created, "model": model, "choices": results, "usage": usage});
    if request.common.prompt_logprobs.is_some() {
        body["prompt_logprobs"] = scored_prompt;
    }
    Ok(Json(body).into_response())
}

/// A chat request checked, rendered and submitted to the engine.
pub(super) struct SubmittedChat {
    pub choices: Vec<Choice>,
    pub prompt_tokens: usize,
    /// How its outputs are read.
    pub reading: Reading,
}

/// Checks a chat request, renders its conversation through the chat
/// template and submits its choices (their grammar, if any, constraining
/// the answer after the thinking).
pub(super) async fn submit_chat(
    state: &Arc<AppState>,
    request: &ChatRequest,
) -> Result<SubmittedChat, ApiError> {
    check_model(state, &request.common.model)?;
    state.generator()?;
    if request.top_logprobs.is_some() && !request.logprobs {
        return Err(ApiError::invalid(
            "top_logprobs requires logprobs to be true",
            Some("top_logprobs"),
        ));
    }
    let tools = tools::requested_tools(request.tools.as_deref(), request.tool_choice.as_ref())?;
    if tools.is_some() && request.logprobs {
        return Err(ApiError::invalid(
            "logprobs together with tools is not supported",
            Some("logprobs"),
        ));
    }
    prompt::check_sequences(state, 1, request.common.n.unwrap_or(1))?;
    let options = prompt::TemplateOptions::new(
        request.add_generation_prompt,
        request.continue_final_message,
        request.chat_template_kwargs.as_ref(),
    )?;
    let prompt = prompt::chat_prompt(
        state,
        &request.messages,
        tools.as_ref().map(|t| t.tools.as_slice()),
        &options,
        request.add_special_tokens.unwrap_or(false),
    )
    .await?;
    let prompt = request
        .common
        .truncate(prompt, state.limits.max_model_len)?;
    // With a reasoning parser: whether the output starts in its thinking.
    let thinks = state.reasoning.as_ref().map(|r| {
        r.thinks(
            &prompt,
            &state.tokenizer,
            request.chat_template_kwargs.as_ref(),
        )
    });
    let logprobs = request.logprobs.then(|| request.top_logprobs.unwrap_or(0));
    if request.common.stream && request.common.prompt_logprobs.is_some() {
        return Err(ApiError::invalid(
            "prompt_logprobs: the prompt's log-probabilities of a chat are not streamed; ask without stream",
            Some("prompt_logprobs"),
        ));
    }
    let mut params = request.common.params(
        request.max_completion_tokens.or(request.common.max_tokens),
        None,
        logprobs,
        prompt.len(),
        &state.limits,
        &state.defaults,
    )?;
    params.bad_words = prompt::bad_words(state, &request.common.bad_words).await?;
    let n = request.common.n.unwrap_or(1);
    let format = match (&tools, state.tool_format) {
        (Some(t), None) if t.calls() => {
            return Err(ApiError::invalid(
                "tools need a tool-call format, and neither this model's architecture nor its \
                 chat template names one: start the server with --tool-call-parser \
                 (hermes, llama3_json or mistral), or send tool_choice \"none\"",
                Some("tool_choice"),
            ))
        }
        // Known whenever the output is read for calls.
        (_, format) => format,
    };
    let matcher = match tools
        .as_ref()
        .zip(format)
        .and_then(|(t, format)| t.grammar(format, parallel(request)))
    {
        Some(_) if structured::requested_grammar(&request.common)?.is_some() => {
            return Err(ApiError::invalid(
                "a required or named tool_choice and structured output cannot be asked together",
                Some("tool_choice"),
            ))
        }
        Some(grammar) => Some(structured::compile(state, grammar).await?),
        None => structured::constraint(state, &request.common).await?,
    };
    // The grammar constrains the answer, after the thinking.
    let constraint = matcher.map(|matcher| Constraint {
        matcher,
        after: (thinks == Some(true)).then(|| reasoning::END.to_owned()),
    });
    let choices = submit(
        state,
        &prompt,
        &params,
        n,
        0,
        new_group(),
        constraint.as_ref(),
    )?;
    let calls = tools
        .as_ref()
        .filter(|t| t.calls())
        .and(format)
        .map(|format| (format, parallel(request)));
    Ok(SubmittedChat {
        choices,
        prompt_tokens: prompt.len(),
        reading: Reading { thinks, calls },
    })
}

/// Whether several calls may come in one message (OpenAI's default: yes).
fn parallel(request: &ChatRequest) -> bool {
    request.parallel_tool_calls.unwrap_or(true)
}

/// A whole message's call: OpenAI's shape without the streaming `index`.
fn tool_call_json(mut call: Value) -> Value {
    if let Some(fields) = call.as_object_mut() {
        fields.remove("index");
    }
    call
}

fn chat_logprobs(tokens: &[TokenLogprob]) -> Value {
    let entry = |text: &str, logprob: f32| json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()});
    json!({
        "content": tokens.iter().map(|t| {
            let mut e = entry(&t.text, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(_, text, lp)| entry(text, *lp)).collect();
            e
        }).collect::<Vec<_>>()
    })
}

/// What every chunk of one streamed answer shares.
struct ChunkMaker {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    reading: Reading,
}

impl ChunkMaker {
    fn chunk(&self, choices: Value) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model, "choices": choices})
    }

    fn delta(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        self.chunk(json!([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]))
    }

    /// The deltas of choice `index` for `parts` (a chunk's log-probabilities
    /// with its last): thinking and content together, each call apart.
    fn deltas(
        &self,
        stream: &AnswerStream,
        index: usize,
        parts: Vec<Part>,
        logprobs: Value,
    ) -> Vec<Value> {
        // The stream has counted these parts' calls.
        let mut call_index =
            stream.calls - parts.iter().filter(|p| matches!(p, Part::Call(_))).count();
        let mut out = Vec::new();
        let mut delta = json!({});
        for part in parts {
            match part {
                Part::Thinking(text) => {
                    delta["reasoning_content"] = json!(text);
                    delta["reasoning"] = json!(text);
                }
                Part::Content(text) => {
                    let before = delta["content"].as_str().unwrap_or_default();
                    delta["content"] = json!(before.to_owned() + &text);
                }
                Part::Call(call) => {
                    if delta.as_object().is_some_and(|d| !d.is_empty()) {
                        out.push(self.delta(index, std::mem::take(&mut delta), Value::Null, None));
                        delta = json!({});
                    }
                    let call = call.to_json(call_index, &self.id);
                    call_index += 1;
                    out.push(self.delta(index, json!({"tool_calls": [call]}), Value::Null, None));
                }
            }
        }
        if delta.as_object().is_some_and(|d| !d.is_empty()) || !logprobs.is_null() {
            out.push(self.delta(index, delta, logprobs, None));
        }
        out
    }
}

fn stream_chat(
    choices: Vec<Choice>,
    maker: ChunkMaker,
    prompt_tokens: usize,
    include_usage: bool,
) -> impl Stream<Item = Value> + Send {
    let maker = Arc::new(maker);
    let first: Vec<Value> = choices
        .iter()
        .map(|c| {
            maker.delta(
                c.index,
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                None,
            )
        })
        .collect();
    let completion_tokens = Arc::new(AtomicUsize::new(0));
    let counter = completion_tokens.clone();
    let mut streams: HashMap<usize, AnswerStream> = HashMap::new();
    let body_maker = maker.clone();
    let body = merged(choices).flat_map(move |(index, event)| {
        let maker = &body_maker;
        let values = match event {
            Event::Chunk { text, logprob, .. } => {
                // Log-probabilities are refused with tools.
                let logprobs = if maker.logprobs {
                    chat_logprobs(&logprob.into_iter().collect::<Vec<_>>())
                } else {
                    Value::Null
                };
                let stream = streams
                    .entry(index)
                    .or_insert_with(|| AnswerStream::new(maker.reading));
                let parts = stream.parts(Some(&text));
                maker.deltas(stream, index, parts, logprobs)
            }
            Event::Done {
                finish_reason,
                stop_reason,
                completion_tokens: c,
                ..
            } => {
                counter.fetch_add(c, Ordering::Relaxed);
                let stream = streams
                    .entry(index)
                    .or_insert_with(|| AnswerStream::new(maker.reading));
                let parts = stream.parts(None);
                let mut values = maker.deltas(stream, index, parts, Value::Null);
                let mut reason = finish_reason.as_str();
                if stream.calls > 0 && reason == "stop" {
                    reason = "tool_calls";
                }
                let mut last = maker.delta(index, json!({}), Value::Null, Some(reason));
                last["choices"][0]["stop_reason"] = stop_reason
                    .as_ref()
                    .map_or(Value::Null, StopReason::to_json);
                values.push(last);
                values
            }
            Event::Error(message) => {
                vec![json!({"error": {"message": message, "type": "server_error"}})]
            }
            // Not asked for when streaming (refused up front).
            Event::PromptLogprobs(_) => Vec::new(),
        };
        stream::iter(values)
    });
    // Polled after the body ends, when every choice has reported its count.
    let usage = stream::once(async move { completion_tokens.load(Ordering::Relaxed) }).filter_map(
        move |completion_tokens| {
            let usage = Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
            };
            let mut chunk = maker.chunk(json!([]));
            chunk["usage"] = json!(usage);
            std::future::ready(include_usage.then_some(chunk))
        },
    );
    stream::iter(first).chain(body).chain(usage)
}
