//! `POST /v1/messages`: Anthropic's Messages API over the chat pipeline
//! (as llama.cpp's server and vLLM offer it, for clients written against
//! Anthropic's SDK). The request becomes a chat ([`request`]); the
//! output's reading becomes content blocks: `thinking` (with a reasoning
//! parser), `text` and `tool_use`, whole or streamed as the API's events.

mod request;

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};

use super::answer::{AnswerStream, Part};
use super::chat::submit_chat;
use super::openai::ApiError;
use super::tools::ToolCall;
use super::{collect, request_id, typed_sse, ApiJson, AppState};
use crate::engine::service::{Event, StopReason};
pub use request::MessagesRequest;

pub async fn create(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<MessagesRequest>,
) -> Result<Response, ApiError> {
    let chat = request.to_chat()?;
    let mut submitted = submit_chat(&state, &chat).await?;
    let id = request_id("msg");
    let model = state.model_name.clone();
    let choice = submitted
        .choices
        .pop()
        .ok_or_else(|| ApiError::internal("no output was submitted"))?;
    let input_tokens = submitted.prompt_tokens;
    if request.stream() {
        let writer = BlockWriter::new(&id, AnswerStream::new(submitted.reading));
        let start = json!({"type": "message_start", "message": message(&id, &model, Vec::new(),
            None, (input_tokens, 0))});
        return Ok(typed_sse(events(start, writer, choice)));
    }
    let collected = collect(choice).await?;
    let answer = submitted.reading.whole(collected.text);
    let mut content = Vec::new();
    if let Some(thinking) = answer.thinking {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    let text = answer.content.unwrap_or_default();
    if answer.calls.is_empty() || !text.trim().is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for (i, call) in answer.calls.iter().enumerate() {
        content.push(tool_use(&id, i, call));
    }
    let stop = stop(
        collected.finish_reason.unwrap_or("stop"),
        &collected.stop_reason,
        !answer.calls.is_empty(),
    );
    let usage = (input_tokens, collected.completion_tokens);
    Ok(Json(message(&id, &model, content, Some(stop), usage)).into_response())
}

/// The message object; `stop` is its stop reason and sequence (`None`
/// while streaming starts).
fn message(
    id: &str,
    model: &str,
    content: Vec<Value>,
    stop: Option<(&str, Value)>,
    usage: (usize, usize),
) -> Value {
    let (reason, sequence) = stop.map_or((Value::Null, Value::Null), |(r, s)| (json!(r), s));
    json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": sequence,
        "usage": {"input_tokens": usage.0, "output_tokens": usage.1}})
}

/// Anthropic's stop reason, and the stop sequence that ended the output.
fn stop(finish_reason: &str, stop_reason: &Value, called: bool) -> (&'static str, Value) {
    match (finish_reason, stop_reason) {
        ("length", _) => ("max_tokens", Value::Null),
        (_, Value::String(sequence)) => ("stop_sequence", json!(sequence)),
        _ if called => ("tool_use", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

fn tool_use(id: &str, index: usize, call: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&call.arguments).unwrap_or(json!({}));
    json!({"type": "tool_use", "id": format!("toolu_{id}_{index}"), "name": call.name, "input": input})
}

/// The message's events as its output streams in.
fn events(
    start: Value,
    mut writer: BlockWriter,
    choice: super::Choice,
) -> impl Stream<Item = Value> + Send {
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(choice.events).flat_map(move |event| {
        let values = match event {
            Event::Chunk { text, .. } => writer.chunk(Some(&text)),
            Event::Done {
                finish_reason,
                stop_reason,
                completion_tokens,
                ..
            } => {
                                let mut values = writer.chunk(None);
                values.extend(writer.finish());
                let stop_reason = stop_reason.as_ref().map_or(Value::Null, StopReason::to_json);
                let (reason, sequence) = stop(finish_reason.as_str(), &stop_reason, writer.calls > 0);
                values.push(json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {"output_tokens": completion_tokens}}));
                values.push(json!({"type": "message_stop"}));
                values
            }
            Event::Error(message) => {
                vec![json!({"type": "error", "error": {"type": "api_error", "message": message}})]
            }
            Event::PromptLogprobs(_) => Vec::new(),
        };
        stream::iter(values)
    });
    stream::iter([start]).chain(body)
}

/// Writes one streamed message's content blocks: a block opens as its
/// parts come and stops when another kind (or the end) comes.
struct BlockWriter {
    id: String,
    reading: AnswerStream,
    /// The open block's kind (`thinking` or `text`).
    open: Option<&'static str>,
    next_index: usize,
    calls: usize,
    /// Whether a text block was sent.
    texted: bool,
    /// White space no text block holds yet: it opens none, and is dropped
    /// if only calls follow (as the whole message then has no text block).
    pending_space: String,
}

impl BlockWriter {
    fn new(id: &str, reading: AnswerStream) -> Self {
        Self {
            id: id.to_owned(),
            reading,
            open: None,
            next_index: 0,
            calls: 0,
            texted: false,
            pending_space: String::new(),
        }
    }

    /// The events of the next chunk of text, or (`None`) of the end.
    fn chunk(&mut self, text: Option<&str>) -> Vec<Value> {
        let mut events = Vec::new();
        for part in self.reading.parts(text) {
            let (kind, delta) = match part {
                Part::Thinking(text) => (
                    "thinking",
                    json!({"type": "thinking_delta", "thinking": text}),
                ),
                Part::Content(text) if self.open != Some("text") && text.trim().is_empty() => {
                    self.pending_space.push_str(&text);
                    continue;
                }
                Part::Content(text) => {
                    let text = std::mem::take(&mut self.pending_space) + &text;
                    ("text", json!({"type": "text_delta", "text": text}))
                }
                Part::Call(call) => {
                    events.extend(self.close());
                    events.extend(self.call(&call));
                    continue;
                }
            };
            if self.open != Some(kind) {
                events.extend(self.close());
                events.extend(self.open(kind));
            }
            events.push(json!({"type": "content_block_delta", "index": self.next_index - 1, "delta": delta}));
        }
        events
    }

    fn open(&mut self, kind: &'static str) -> Vec<Value> {
        let block = match kind {
            "thinking" => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        self.open = Some(kind);
        self.texted |= kind == "text";
        self.next_index += 1;
        vec![
            json!({"type": "content_block_start", "index": self.next_index - 1, "content_block": block}),
        ]
    }

    /// The end of the content: the open block closed, and without calls a
    /// text block, empty or not, as the whole message has.
    fn finish(&mut self) -> Vec<Value> {
        let mut events = self.close();
        if !self.texted && self.calls == 0 {
            events.extend(self.open("text"));
            let space = std::mem::take(&mut self.pending_space);
            if !space.is_empty() {
                let delta = json!({"type": "text_delta", "text": space});
                events.push(json!({"type": "content_block_delta", "index": self.next_index - 1, "delta": delta}));
            }
            events.extend(self.close());
        }
        events
    }

    fn close(&mut self) -> Vec<Value> {
        match self.open.take() {
            Some(_) => vec![json!({"type": "content_block_stop", "index": self.next_index - 1})],
            None => Vec::new(),
        }
    }

    /// A whole call's events: its block, its input as one JSON delta, stop.
    fn call(&mut self, call: &ToolCall) -> Vec<Value> {
        let index = self.next_index;
        let mut block = tool_use(&self.id, self.calls, call);
        let input = std::mem::replace(&mut block["input"], json!({}));
        self.next_index += 1;
        self.calls += 1;
        vec![
            json!({"type": "content_block_start", "index": index, "content_block": block}),
            json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}),
            json!({"type": "content_block_stop", "index": index}),
        ]
    }
}
