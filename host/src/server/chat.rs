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

use super::openai::{ApiError, ChatRequest, Usage};
use super::reasoning::{self, ReasoningSplitter};
use super::tools::{self, Piece, ToolFormat, ToolSplitter};
use super::{
    check_model, collect, merged, new_group, now, prompt, prompt_logprobs_json, request_id, sse,
    structured, submit, ApiJson, AppState, Choice,
};
use crate::engine::service::{Event, StopReason, TokenLogprob};
use crate::engine::structured::Constraint;

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    check_model(&state, &request.common.model)?;
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
    prompt::check_sequences(&state, 1, request.common.n.unwrap_or(1))?;
    let options = prompt::TemplateOptions::new(
        request.add_generation_prompt,
        request.continue_final_message,
        request.chat_template_kwargs.as_ref(),
    )?;
    let prompt = prompt::chat_prompt(
        &state,
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
    params.bad_words = prompt::bad_words(&state, &request.common.bad_words).await?;
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
        .and_then(|(t, format)| t.grammar(format, parallel(&request)))
    {
        Some(_) if structured::requested_grammar(&request.common)?.is_some() => {
            return Err(ApiError::invalid(
                "a required or named tool_choice and structured output cannot be asked together",
                Some("tool_choice"),
            ))
        }
        Some(grammar) => Some(structured::compile(&state, grammar).await?),
        None => structured::constraint(&state, &request.common).await?,
    };
    // The grammar constrains the answer, after the thinking.
    let constraint = matcher.map(|matcher| Constraint {
        matcher,
        after: match (&state.reasoning, thinks) {
            (Some(r), Some(true)) => r.end_ids().to_vec(),
            _ => Vec::new(),
        },
    });
    let choices = submit(
        &state,
        &prompt,
        &params,
        n,
        0,
        new_group(),
        constraint.as_ref(),
    )?;
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
            thinks,
            tools: tools
                .as_ref()
                .filter(|t| t.calls())
                .and(format)
                .map(|format| (format, parallel(&request))),
        };
        return Ok(sse(stream_chat(
            choices,
            chunks,
            prompt.len(),
            include_usage,
        )));
    }
    let mut results = Vec::new();
    let mut usage = Usage {
        prompt_tokens: prompt.len(),
        ..Usage::default()
    };
    // vLLM's `prompt_logprobs`, once for the response (its choices share the
    // prompt).
    let mut scored_prompt = Value::Null;
    for choice in choices {
        let index = choice.index;
        let c = collect(choice).await?;
        usage.completion_tokens += c.completion_tokens;
        if let Some(scores) = &c.prompt_logprobs {
            scored_prompt = prompt_logprobs_json(scores);
        }
        let (thinking, answer) = match thinks {
            Some(true) => reasoning::split(&c.text),
            _ => (None, Some(c.text)),
        };
        let mut message = json!({"role": "assistant", "content": answer});
        if thinks.is_some() {
            message["reasoning_content"] = json!(thinking);
            message["reasoning"] = json!(thinking);
        }
        let mut finish_reason = c.finish_reason;
        if let Some(format) = format.filter(|_| tools.as_ref().is_some_and(tools::Tools::calls)) {
            let (content, mut calls) =
                tools::parse_tool_calls(format, answer.as_deref().unwrap_or(""));
            if !parallel(&request) {
                calls.truncate(1);
            }
            message["content"] = json!(content);
            if !calls.is_empty() {
                let ids = request_id("call");
                message["tool_calls"] = calls
                    .iter()
                    .enumerate()
                    .map(|(i, call)| tool_call_json(call.to_json(i, &ids)))
                    .collect();
                if finish_reason == Some("stop") {
                    finish_reason = Some("tool_calls");
                }
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
    /// With a reasoning parser: whether the output starts in its thinking.
    thinks: Option<bool>,
    /// With tools: their format, and whether several calls may come (else
    /// at most one).
    tools: Option<(ToolFormat, bool)>,
}

impl ChunkMaker {
    fn chunk(&self, choices: Value) -> Value {
        json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model, "choices": choices})
    }

    fn delta(&self, index: usize, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        self.chunk(json!([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]))
    }
}

/// Per choice while streaming: its thinking's splitter and its tool calls',
/// as the server and the request ask for them.
struct ChoiceStream {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolStream>,
}

impl ChoiceStream {
    fn new(maker: &ChunkMaker) -> Self {
        Self {
            reasoning: maker.thinks.map(ReasoningSplitter::new),
            tools: maker.tools.map(|(format, _)| ToolStream {
                splitter: ToolSplitter::new(format),
                calls: 0,
            }),
        }
    }

    /// The deltas for a chunk of text (its log-probabilities with the
    /// first), or for the end of the output (`text` `None`).
    fn deltas(
        &mut self,
        maker: &ChunkMaker,
        index: usize,
        text: Option<&str>,
        logprobs: Value,
    ) -> Vec<Value> {
        let (thinking, answer) = match (&mut self.reasoning, text) {
            (Some(splitter), Some(text)) => splitter.push(text),
            (Some(splitter), None) => (splitter.finish(), String::new()),
            (None, text) => (String::new(), text.unwrap_or_default().to_owned()),
        };
        let mut out = Vec::new();
        if let Some(tools) = &mut self.tools {
            if !thinking.is_empty() {
                let delta = json!({"reasoning_content": thinking, "reasoning": thinking});
                out.push(maker.delta(index, delta, Value::Null, None));
            }
            let pieces = match text {
                Some(_) => tools.splitter.push(&answer),
                None => tools.splitter.finish(),
            };
            let parallel = maker.tools.is_some_and(|(_, parallel)| parallel);
            out.extend(tools.deltas(maker, index, pieces, parallel));
            return out;
        }
        let mut delta = json!({});
        if !thinking.is_empty() {
            delta["reasoning_content"] = json!(thinking);
            delta["reasoning"] = json!(thinking);
        }
        // Without a reasoning parser every chunk is content, as before.
        if !answer.is_empty() || (self.reasoning.is_none() && text.is_some()) {
            delta["content"] = json!(answer);
        }
        if delta.as_object().is_some_and(|d| !d.is_empty()) || !logprobs.is_null() {
            out.push(maker.delta(index, delta, logprobs, None));
        }
        out
    }
}

/// Per choice while streaming with tools: the splitter and the calls so far.
struct ToolStream {
    splitter: ToolSplitter,
    calls: usize,
}

impl ToolStream {
    /// The deltas for `pieces` of choice `index`.
    fn deltas(
        &mut self,
        maker: &ChunkMaker,
        index: usize,
        pieces: Vec<Piece>,
        parallel: bool,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Content(text) => {
                    out.push(maker.delta(index, json!({"content": text}), Value::Null, None))
                }
                Piece::Call(call) if parallel || self.calls == 0 => {
                    let call = call.to_json(self.calls, &maker.id);
                    out.push(maker.delta(index, json!({"tool_calls": [call]}), Value::Null, None));
                    self.calls += 1;
                }
                Piece::Call(_) => {}
            }
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
    let mut streams: HashMap<usize, ChoiceStream> = HashMap::new();
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
                    .or_insert_with(|| ChoiceStream::new(maker));
                stream.deltas(maker, index, Some(&text), logprobs)
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
                    .or_insert_with(|| ChoiceStream::new(maker));
                let mut values = stream.deltas(maker, index, None, Value::Null);
                let mut reason = finish_reason.as_str();
                if stream.tools.as_ref().is_some_and(|t| t.calls > 0) && reason == "stop" {
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
