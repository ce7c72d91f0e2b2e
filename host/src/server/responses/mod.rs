//! `POST /v1/responses`: OpenAI's Responses API over the chat pipeline.
//! The request becomes a chat ([`request`]); the output's reading (thinking,
//! answer, function calls) becomes output items: `reasoning`, `message`
//! and `function_call`, whole or streamed as the API's typed events.
//! Nothing is stored: `store` is refused unless false, and with it
//! `previous_response_id`.

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
use super::{collect, now, request_id, typed_sse, ApiJson, AppState};
use crate::engine::service::Event;
pub use request::ResponsesRequest;

pub async fn create(
    State(state): State<Arc<AppState>>,
    ApiJson(request): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    let chat = request.to_chat()?;
    let mut submitted = submit_chat(&state, &chat).await?;
    let shape = Shape {
        id: request_id("resp"),
        created_at: now(),
        model: state.model_name.clone(),
        echo: echoed(&request),
    };
    let choice = submitted
        .choices
        .pop()
        .ok_or_else(|| ApiError::internal("no output was submitted"))?;
    let prompt_tokens = submitted.prompt_tokens;
    if request.stream() {
        let writer = EventWriter::new(shape, AnswerStream::new(submitted.reading));
        return Ok(typed_sse(events(writer, choice, prompt_tokens)));
    }
    let collected = collect(choice).await?;
    let answer = submitted.reading.whole(collected.text);
    let mut output = Vec::new();
    if let Some(thinking) = answer.thinking {
        output.push(reasoning_item(&item_id("rs", &shape.id, 0), &thinking));
    }
    let content = answer.content.unwrap_or_default();
    if answer.calls.is_empty() || !content.trim().is_empty() {
        let id = item_id("msg", &shape.id, output.len());
        output.push(message_item(&id, &content, "completed"));
    }
    for (i, call) in answer.calls.iter().enumerate() {
        output.push(call_item(&shape.id, i, call, "completed"));
    }
    let usage = (prompt_tokens, collected.completion_tokens);
    let body = shape.response(collected.finish_reason, output, Some(usage));
    Ok(Json(body).into_response())
}

/// What every form of one response shares: its id, time and model, and
/// the request's settings it echoes (as OpenAI's response object does).
struct Shape {
    id: String,
    created_at: u64,
    model: String,
    echo: Value,
}

impl Shape {
    /// The response object; `finish` is the engine's finish reason (`None`
    /// while in progress).
    fn response(
        &self,
        finish: Option<&str>,
        output: Vec<Value>,
        usage: Option<(usize, usize)>,
    ) -> Value {
        let (status, incomplete) = match finish {
            None => ("in_progress", Value::Null),
            Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
            Some(_) => ("completed", Value::Null),
        };
        let mut body = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "error": null, "incomplete_details": incomplete,
            "model": self.model, "output": output, "store": false,
            "usage": usage.map(|(input, generated)| json!({
                "input_tokens": input, "output_tokens": generated,
                "total_tokens": input + generated,
            })),
        });
        if let (Some(body), Some(echo)) = (body.as_object_mut(), self.echo.as_object()) {
            body.extend(echo.clone());
        }
        body
    }
}

/// The request's settings a response object repeats, with their defaults.
fn echoed(request: &ResponsesRequest) -> Value {
    let field = |name: &str, default: Value| {
        request
            .body
            .get(name)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    json!({
        "instructions": field("instructions", Value::Null),
        "max_output_tokens": field("max_output_tokens", Value::Null),
        "temperature": field("temperature", Value::Null),
        "top_p": field("top_p", Value::Null),
        "tools": field("tools", json!([])),
        "tool_choice": field("tool_choice", json!("auto")),
        "parallel_tool_calls": field("parallel_tool_calls", json!(true)),
        "text": field("text", json!({"format": {"type": "text"}})),
        "truncation": "disabled",
        "previous_response_id": null,
        "metadata": {},
    })
}

/// An output item's id: its kind's prefix, the response's id and its place
/// in the output (the same whole or streamed).
fn item_id(prefix: &str, response: &str, index: usize) -> String {
    format!("{prefix}_{response}_{index}")
}

fn reasoning_item(id: &str, thinking: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [],
        "content": [{"type": "reasoning_text", "text": thinking}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = match status {
        "completed" => json!([output_text(text)]),
        _ => json!([]),
    };
    json!({"type": "message", "id": id, "status": status,
        "role": "assistant", "content": content})
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn call_item(id: &str, index: usize, call: &ToolCall, status: &str) -> Value {
    let arguments = if status == "completed" {
        call.arguments.as_str()
    } else {
        ""
    };
    json!({"type": "function_call", "id": format!("fc_{id}_{index}"),
        "call_id": format!("call_{id}_{index}"), "name": call.name,
        "arguments": arguments, "status": status})
}

/// The response's events as its one output streams in.
fn events(
    mut writer: EventWriter,
    choice: super::Choice,
    prompt_tokens: usize,
) -> impl Stream<Item = Value> + Send {
    let start = writer.start();
    let body = tokio_stream::wrappers::UnboundedReceiverStream::new(choice.events).flat_map(
        move |event| {
            let values = match event {
                Event::Chunk { text, .. } => writer.chunk(Some(&text)),
                Event::Done {
                    finish_reason,
                    completion_tokens,
                    ..
                } => {
                    let mut values = writer.chunk(None);
                    values.extend(
                        writer.finish(finish_reason.as_str(), (prompt_tokens, completion_tokens)),
                    );
                    values
                }
                Event::Error(message) => vec![writer.event(
                    "error",
                    json!({"code": "server_error", "message": message, "param": null}),
                )],
                Event::PromptLogprobs(_) => Vec::new(),
            };
            stream::iter(values)
        },
    );
    stream::iter(start).chain(body)
}

/// The item being streamed.
enum Open {
    Reasoning { text: String },
    Message { text: String },
}

/// Writes one streamed response's events: items open as their parts come
/// and close when another kind of part (or the end) comes.
struct EventWriter {
    shape: Shape,
    reading: AnswerStream,
    sequence: usize,
    /// Items done so far.
    output: Vec<Value>,
    open: Option<Open>,
    /// White space no message holds yet: it opens none, and is dropped if
    /// only calls follow (as the whole response then has no message).
    pending_space: String,
}

impl EventWriter {
    fn new(shape: Shape, reading: AnswerStream) -> Self {
        Self {
            shape,
            reading,
            sequence: 0,
            output: Vec::new(),
            open: None,
            pending_space: String::new(),
        }
    }

    fn event(&mut self, kind: &str, mut fields: Value) -> Value {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        fields
    }

    fn start(&mut self) -> Vec<Value> {
        let response = self.shape.response(None, Vec::new(), None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// The events of the next chunk of text, or (`None`) of the output's end.
    fn chunk(&mut self, text: Option<&str>) -> Vec<Value> {
        let parts = self.reading.parts(text);
        let mut events = Vec::new();
        for part in parts {
            match part {
                Part::Thinking(delta) => {
                    if !matches!(self.open, Some(Open::Reasoning { .. })) {
                        events.extend(self.close());
                        events.extend(self.open_item(Open::Reasoning {
                            text: String::new(),
                        }));
                    }
                    events.extend(self.delta(delta));
                }
                Part::Content(delta) => {
                    let open = matches!(self.open, Some(Open::Message { .. }));
                    if !open && delta.trim().is_empty() {
                        self.pending_space.push_str(&delta);
                        continue;
                    }
                    if !open {
                        events.extend(self.close());
                        events.extend(self.open_item(Open::Message {
                            text: String::new(),
                        }));
                    }
                    let delta = std::mem::take(&mut self.pending_space) + &delta;
                    events.extend(self.delta(delta));
                }
                Part::Call(call) => {
                    events.extend(self.close());
                    events.extend(self.call(&call));
                }
            }
        }
        events
    }

    fn output_index(&self) -> usize {
        self.output.len()
    }

    fn item_id(&self, prefix: &str) -> String {
        item_id(prefix, &self.shape.id, self.output_index())
    }

    fn open_item(&mut self, open: Open) -> Vec<Value> {
        let index = self.output_index();
        let (item, part) = match &open {
            Open::Reasoning { .. } => (
                json!({"type": "reasoning", "id": self.item_id("rs"), "summary": [], "content": []}),
                None,
            ),
            Open::Message { .. } => {
                let item = message_item(&self.item_id("msg"), "", "in_progress");
                (item, Some(output_text("")))
            }
        };
        self.open = Some(open);
        let mut events = vec![self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        )];
        if let Some(part) = part {
            let item_id = self.item_id("msg");
            events.push(self.event(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
            ));
        }
        events
    }

    fn delta(&mut self, delta: String) -> Vec<Value> {
        let index = self.output_index();
        let (kind, item_id) = match &mut self.open {
            Some(Open::Reasoning { text }) => {
                text.push_str(&delta);
                ("response.reasoning_text.delta", self.item_id("rs"))
            }
            Some(Open::Message { text }) => {
                text.push_str(&delta);
                ("response.output_text.delta", self.item_id("msg"))
            }
            None => return Vec::new(),
        };
        let mut fields =
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta});
        if kind == "response.output_text.delta" {
            fields["logprobs"] = json!([]);
        }
        vec![self.event(kind, fields)]
    }

    /// Closes the open item, if any: its text's `done` events and the item.
    fn close(&mut self) -> Vec<Value> {
        let index = self.output_index();
        let mut events = Vec::new();
        let item = match self.open.take() {
            None => return events,
            Some(Open::Reasoning { text }) => {
                let item_id = self.item_id("rs");
                events.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
                ));
                reasoning_item(&item_id, &text)
            }
            Some(Open::Message { text }) => {
                let item_id = self.item_id("msg");
                let fields = json!({"item_id": item_id, "output_index": index, "content_index": 0});
                let mut done = fields.clone();
                done["text"] = json!(text);
                done["logprobs"] = json!([]);
                events.push(self.event("response.output_text.done", done));
                let mut part = fields;
                part["part"] = output_text(&text);
                events.push(self.event("response.content_part.done", part));
                message_item(&item_id, &text, "completed")
            }
        };
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.output.push(item);
        events
    }

    /// A whole call's events: added, its arguments, done.
    fn call(&mut self, call: &ToolCall) -> Vec<Value> {
        let index = self.output_index();
        let calls_before = self
            .output
            .iter()
            .filter(|i| i["type"] == "function_call")
            .count();
        let added = call_item(&self.shape.id, calls_before, call, "in_progress");
        let done = call_item(&self.shape.id, calls_before, call, "completed");
        let item_id = added["id"].clone();
        let events = vec![
            self.event("response.output_item.added", json!({"output_index": index, "item": added})),
            self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": call.arguments}),
            ),
            self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "name": call.name, "arguments": call.arguments}),
            ),
            self.event("response.output_item.done", json!({"output_index": index, "item": done})),
        ];
        self.output.push(done);
        events
    }

    /// The end: the open item closed (an empty answer still gives a
    /// message), then the whole response.
    fn finish(&mut self, finish_reason: &str, usage: (usize, usize)) -> Vec<Value> {
        let mut events = self.close();
        if self.output.iter().all(|i| i["type"] == "reasoning") {
            events.extend(self.open_item(Open::Message {
                text: String::new(),
            }));
            let space = std::mem::take(&mut self.pending_space);
            if !space.is_empty() {
                events.extend(self.delta(space));
            }
            events.extend(self.close());
        }
        let response = self
            .shape
            .response(Some(finish_reason), self.output.clone(), Some(usage));
        let kind = match response["status"].as_str() {
            Some("incomplete") => "response.incomplete",
            _ => "response.completed",
        };
        events.push(self.event(kind, json!({"response": response})));
        events
    }
}
