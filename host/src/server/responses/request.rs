//! A Responses request read as the chat request it asks for: `input` (a
//! text, or items: messages, function calls and their outputs, reasoning)
//! and `instructions` become the conversation; function tools,
//! `tool_choice` and `text.format` take the chat API's shapes; sampling
//! fields pass through. What has no counterpart is refused by name.

use serde_json::{json, Map, Value};

use super::super::openai::{joined_text, ApiError, ChatRequest, EndpointFields};
use super::super::tools::as_chat_tools;

/// `POST /v1/responses`, as sent.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct ResponsesRequest {
    #[serde(flatten)]
    pub body: Map<String, Value>,
}

impl EndpointFields for ResponsesRequest {
    const FIELDS: &'static [&'static str] = &[
        "input",
        "instructions",
        "max_output_tokens",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "truncation",
    ];
}

impl ResponsesRequest {
    /// Whether the response streams as events.
    pub fn stream(&self) -> bool {
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// The chat request this one asks for (not streamed: the Responses
    /// endpoint streams its own events).
    pub fn to_chat(&self) -> Result<ChatRequest, ApiError> {
        for (field, why) in [
            ("n", "a response has one output"),
            (
                "stream_options",
                "a streamed response ends with its usage anyway",
            ),
            ("prompt_logprobs", "a response has no place for them"),
            (
                "return_tokens_as_token_ids",
                "a response has no log-probabilities",
            ),
        ] {
            if self
                .body
                .get(field)
                .is_some_and(|v| !(v.is_null() || field == "n" && v == &json!(1)))
            {
                return Err(ApiError::invalid(
                    format!("`{field}` is not part of the Responses API: {why}"),
                    Some(field),
                ));
            }
        }
        if let Some(truncation) = self.body.get("truncation").filter(|v| !v.is_null()) {
            if truncation != "disabled" {
                return Err(ApiError::invalid(
                    "truncation: only \"disabled\" (the default) is supported",
                    Some("truncation"),
                ));
            }
        }
        let mut chat = self.body.clone();
        for field in [
            "input",
            "instructions",
            "max_output_tokens",
            "tools",
            "tool_choice",
            "text",
            "truncation",
            "stream",
        ] {
            chat.remove(field);
        }
        let input = self
            .body
            .get("input")
            .ok_or_else(|| ApiError::invalid("input is required", Some("input")))?;
        let instructions = match self.body.get("instructions") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.as_str()),
            Some(_) => {
                return Err(ApiError::invalid(
                    "instructions must be a string",
                    Some("instructions"),
                ))
            }
        };
        chat.insert(
            "messages".into(),
            Value::Array(messages(instructions, input)?),
        );
        if let Some(max) = self.body.get("max_output_tokens").filter(|v| !v.is_null()) {
            chat.insert("max_completion_tokens".into(), max.clone());
        }
        if let Some(tools) = self.body.get("tools").filter(|v| !v.is_null()) {
            chat.insert("tools".into(), as_chat_tools(tools, chat_function)?);
        }
        if let Some(choice) = self.body.get("tool_choice").filter(|v| !v.is_null()) {
            chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
        }
        if let Some(format) = response_format(self.body.get("text"))? {
            if chat.get("response_format").is_some_and(|v| !v.is_null()) {
                return Err(ApiError::invalid(
                    "ask for structured output in one way only: text.format or response_format",
                    Some("response_format"),
                ));
            }
            chat.insert("response_format".into(), format);
        }
        serde_json::from_value(Value::Object(chat))
            .map_err(|e| ApiError::invalid(format!("invalid request: {e}"), None))
    }
}

/// The conversation: `instructions` as the system message, then `input`.
fn messages(instructions: Option<&str>, input: &Value) -> Result<Vec<Value>, ApiError> {
    let mut messages: Vec<Value> = instructions
        .map(|text| json!({"role": "system", "content": text}))
        .into_iter()
        .collect();
    let items = match input {
        Value::String(text) => {
            messages.push(json!({"role": "user", "content": text}));
            return Ok(messages);
        }
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid(
                "input must be a string or a list of items",
                Some("input"),
            ))
        }
    };
    // A reasoning item's text, for the assistant turn after it.
    let mut thinking: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let field = |name: &str| {
            item.get(name).and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(format!("input[{i}].{name} must be a string"), Some("input"))
            })
        };
        match item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message")
        {
            "message" => {
                let role = match field("role")? {
                    "developer" => "system",
                    role @ ("system" | "user" | "assistant") => role,
                    role => {
                        return Err(ApiError::invalid(
                            format!("input[{i}].role {role:?} is not one of user, system, developer, assistant"),
                            Some("input"),
                        ))
                    }
                };
                let mut message =
                    json!({"role": role, "content": text_of(item.get("content"), i)?});
                // A reasoning item belongs to the assistant turn after it.
                match thinking.take() {
                    Some(text) if role == "assistant" => message["reasoning_content"] = json!(text),
                    _ => {}
                }
                messages.push(message);
            }
            "function_call" => {
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls after an assistant message (or calls) are its turn's.
                let last = messages
                    .last_mut()
                    .filter(|m| m["role"] == "assistant" && thinking.is_none());
                match last {
                    Some(turn) => match turn["tool_calls"].as_array_mut() {
                        Some(calls) => calls.push(call),
                        None => turn["tool_calls"] = json!([call]),
                    },
                    None => {
                        let mut turn =
                            json!({"role": "assistant", "content": null, "tool_calls": [call]});
                        if let Some(text) = thinking.take() {
                            turn["reasoning_content"] = json!(text);
                        }
                        messages.push(turn);
                    }
                }
            }
            "function_call_output" => {
                thinking = None;
                let output = match item.get("output") {
                    Some(Value::String(text)) => text.clone(),
                    other => text_of(other, i)?,
                };
                messages.push(
                    json!({"role": "tool", "tool_call_id": field("call_id")?, "content": output}),
                );
            }
            "reasoning" => {
                let parts = item
                    .get("content")
                    .filter(|c| !c.is_null())
                    .or(item.get("summary"));
                thinking = Some(text_of(parts, i)?);
            }
            other => {
                return Err(ApiError::invalid(
                    format!("input[{i}]: items of type {other:?} are not supported"),
                    Some("input"),
                ))
            }
        }
    }
    Ok(messages)
}

/// A content's text: a string, or text parts joined.
fn text_of(content: Option<&Value>, i: usize) -> Result<String, ApiError> {
    const TEXT: &[&str] = &[
        "input_text",
        "output_text",
        "text",
        "reasoning_text",
        "summary_text",
    ];
    content.and_then(|c| joined_text(c, TEXT)).ok_or_else(|| {
        ApiError::invalid(
            format!("input[{i}]: content must be a string or a list of text parts"),
            Some("input"),
        )
    })
}

/// A function tool as the chat API's function (its fields but `type`).
fn chat_function(tool: &Value) -> Result<Value, String> {
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {
            let mut function = tool.as_object().cloned().unwrap_or_default();
            function.remove("type");
            Ok(Value::Object(function))
        }
        kind => Err(format!("only function tools are supported, not {kind:?}")),
    }
}

/// `tool_choice` in the chat API's shape.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(_) => Ok(choice.clone()),
        _ if choice.get("type") == Some(&json!("function")) => {
            let name = choice.get("name").cloned().unwrap_or(Value::Null);
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::invalid(
            "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": ...}",
            Some("tool_choice"),
        )),
    }
}

/// `text.format` as the chat API's `response_format` (none for plain text).
fn response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(text) = text.filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let refuse = |message: &str| Err(ApiError::invalid(message.to_owned(), Some("text")));
    let Some(fields) = text.as_object() else {
        return refuse("text must be an object");
    };
    if let Some(other) = fields.keys().find(|k| *k != "format") {
        return refuse(&format!("text.{other} is not supported"));
    }
    let Some(format) = fields.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let mut schema = format.as_object().cloned().unwrap_or_default();
            schema.remove("type");
            Ok(Some(json!({"type": "json_schema", "json_schema": schema})))
        }
        _ => refuse("text.format.type must be text, json_object or json_schema"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> ResponsesRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn items_become_the_chat_they_stand_for() {
        let input = json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ]);
        let got = messages(Some("You help."), &input).unwrap();
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "You help."}),
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Weather in Paris?"}),
                json!({"role": "assistant", "content": null, "reasoning_content": "Call it.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "18 C"}),
            ]
        );
        // This server's own output replayed: one assistant turn.
        let replayed = json!([
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        ]);
        let got = messages(None, &replayed).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1]["content"], json!("Let me see."));
        assert_eq!(got[1]["tool_calls"][0]["id"], json!("c1"));
        assert!(messages(None, &json!([{"type": "input_image", "image_url": "x"}])).is_err());
        assert!(messages(None, &json!(3)).is_err());
    }

    #[test]
    fn tools_choice_and_format_take_the_chat_shapes() {
        let chat = request(json!({
            "model": "m", "input": "hi", "max_output_tokens": 5, "temperature": 0,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
        }))
        .to_chat()
        .unwrap();
        assert_eq!(chat.max_completion_tokens, Some(5));
        assert_eq!(
            chat.tools.unwrap()[0],
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
        );
        assert_eq!(
            chat.tool_choice.unwrap(),
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert_eq!(
            chat.common.response_format.unwrap(),
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}})
        );
        for (body, field) in [
            (json!({"model": "m", "input": "hi", "n": 2}), "n"),
            (
                json!({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}),
                "tools",
            ),
            (
                json!({"model": "m", "input": "hi", "truncation": "auto"}),
                "truncation",
            ),
            (
                json!({"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}},
                    "response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (json!({"model": "m"}), "input"),
            (
                json!({"model": "m", "input": "hi", "instructions": ["x"]}),
                "instructions",
            ),
            (
                json!({"model": "m", "input": "hi", "prompt_logprobs": 1}),
                "prompt_logprobs",
            ),
        ] {
            let error = request(body).to_chat().unwrap_err();
            assert_eq!(error.body()["error"]["param"], json!(field));
        }
    }
}
