//! An Anthropic Messages request read as the chat request it asks for:
//! `system` and the messages' blocks (text, `tool_use`, `tool_result`,
//! `thinking`) become the conversation, `tools` and `tool_choice` the chat
//! API's, `max_tokens` and `stop_sequences` the sampling fields. What has
//! no counterpart is refused by name.

use serde_json::{json, Map, Value};

use super::super::openai::{joined_text, ApiError, ChatRequest, EndpointFields};
use super::super::tools::as_chat_tools;

/// `POST /v1/messages`, as sent.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct MessagesRequest {
    #[serde(flatten)]
    pub body: Map<String, Value>,
}

/// The request's own fields; sampling fields beyond these are refused.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "tools",
    "tool_choice",
    "metadata",
];

impl EndpointFields for MessagesRequest {
    const FIELDS: &'static [&'static str] = FIELDS;
}

impl MessagesRequest {
    /// Whether the answer streams as events.
    pub fn stream(&self) -> bool {
        self.body.get("stream").and_then(Value::as_bool) == Some(true)
    }

    /// The chat request this one asks for (not streamed: the endpoint
    /// streams its own events).
    pub fn to_chat(&self) -> Result<ChatRequest, ApiError> {
        let body = &self.body;
        if let Some(name) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(ApiError::invalid(
                format!("`{name}` is not supported by this server"),
                Some(name),
            ));
        }
        if let Some(metadata) = body.get("metadata").and_then(Value::as_object) {
            if let Some(other) = metadata.keys().find(|k| *k != "user_id") {
                return Err(ApiError::invalid(
                    format!("metadata.{other} is not supported"),
                    Some("metadata"),
                ));
            }
        }
        let mut chat = Map::new();
        for field in ["model", "temperature", "top_p", "top_k"] {
            if let Some(value) = body.get(field) {
                chat.insert(field.into(), value.clone());
            }
        }
        let max_tokens = body.get("max_tokens").filter(|v| !v.is_null());
        let max_tokens = max_tokens
            .ok_or_else(|| ApiError::invalid("max_tokens is required", Some("max_tokens")))?;
        chat.insert("max_completion_tokens".into(), max_tokens.clone());
        if let Some(stop) = body.get("stop_sequences").filter(|v| !v.is_null()) {
            chat.insert("stop".into(), stop.clone());
        }
        let messages_field = body
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| ApiError::invalid("messages must be a list", Some("messages")))?;
        chat.insert(
            "messages".into(),
            Value::Array(messages(body.get("system"), messages_field)?),
        );
        // A last assistant turn is a prefill the answer continues.
        let prefill =
            messages_field.last().and_then(|m| m.get("role")) == Some(&json!("assistant"));
        if prefill {
            chat.insert("continue_final_message".into(), json!(true));
            chat.insert("add_generation_prompt".into(), json!(false));
        }
        if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
            chat.insert("tools".into(), as_chat_tools(tools, chat_function)?);
        }
        if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
            let (choice, parallel) = chat_tool_choice(choice)?;
            chat.insert("tool_choice".into(), choice);
            if !parallel {
                chat.insert("parallel_tool_calls".into(), json!(false));
            }
        }
        serde_json::from_value(Value::Object(chat))
            .map_err(|e| ApiError::invalid(format!("invalid request: {e}"), None))
    }
}

/// The conversation: `system` first, then each message's blocks (a user
/// turn's tool results as tool messages before its text).
fn messages(system: Option<&Value>, messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    match system {
        None | Some(Value::Null) => {}
        Some(system) => out.push(json!({"role": "system", "content": text_of(system, "system")?})),
    }
    for (i, message) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = message.get("role").and_then(Value::as_str);
        let blocks = match message.get("content") {
            Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
            Some(Value::Array(blocks)) => blocks.clone(),
            _ => {
                return Err(ApiError::invalid(
                    format!("{at}.content must be a string or a list of blocks"),
                    Some("messages"),
                ))
            }
        };
        let (mut text, mut thinking, mut calls) = (String::new(), None::<String>, Vec::new());
        let mut results = 0;
        for block in &blocks {
            let field = |name: &str| {
                block.get(name).ok_or_else(|| {
                    ApiError::invalid(format!("{at}: a block lacks {name}"), Some("messages"))
                })
            };
            let string = |name: &str| {
                field(name)?.as_str().ok_or_else(|| {
                    ApiError::invalid(
                        format!("{at}: a block's {name} must be a string"),
                        Some("messages"),
                    )
                })
            };
            match (role, block.get("type").and_then(Value::as_str)) {
                (_, Some("text")) => text.push_str(string("text")?),
                (Some("user"), Some("tool_result")) => {
                    results += 1;
                    let mut content = block
                        .get("content")
                        .map_or(Ok(String::new()), |c| text_of(c, &at))?;
                    // A failed call's result says so to the model.
                    if block.get("is_error") == Some(&json!(true)) {
                        content = format!("Error: {content}");
                    }
                    out.push(json!({"role": "tool", "tool_call_id": field("tool_use_id")?, "content": content}));
                }
                (Some("assistant"), Some("tool_use")) => calls.push(json!({
                    "id": field("id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("input")?.to_string()},
                })),
                (Some("assistant"), Some("thinking")) => {
                    thinking = Some(string("thinking")?.to_owned())
                }
                (_, kind) => {
                    return Err(ApiError::invalid(
                        format!("{at}: blocks of type {kind:?} are not supported here"),
                        Some("messages"),
                    ))
                }
            }
        }
        let mut turn = match role {
            // A turn of tool results only.
            Some("user") if text.is_empty() && results > 0 => continue,
            Some("user") => json!({"role": "user", "content": text}),
            Some("assistant") => {
                json!({"role": "assistant", "content": (!text.is_empty()).then_some(text)})
            }
            _ => {
                return Err(ApiError::invalid(
                    format!("{at}.role must be user or assistant"),
                    Some("messages"),
                ))
            }
        };
        if !calls.is_empty() {
            turn["tool_calls"] = Value::Array(calls);
        }
        if let Some(thinking) = thinking {
            turn["reasoning_content"] = json!(thinking);
        }
        out.push(turn);
    }
    Ok(out)
}

/// A string, or text blocks joined.
fn text_of(content: &Value, at: &str) -> Result<String, ApiError> {
    joined_text(content, &["text"]).ok_or_else(|| {
        ApiError::invalid(
            format!("{at}: only text is supported there"),
            Some("messages"),
        )
    })
}

/// A client tool as the chat API's function.
fn chat_function(tool: &Value) -> Result<Value, String> {
    let custom = tool.get("type").is_none_or(|t| t == "custom");
    match (custom, tool.get("name"), tool.get("input_schema")) {
        (true, Some(name), Some(schema)) => Ok(json!({
            "name": name, "description": tool.get("description"), "parameters": schema,
        })),
        _ => Err("only client tools with a name and an input_schema are supported".into()),
    }
}

/// `tool_choice` in the chat API's shape, and whether several calls may
/// come.
fn chat_tool_choice(choice: &Value) -> Result<(Value, bool), ApiError> {
    let parallel = choice.get("disable_parallel_tool_use") != Some(&json!(true));
    let chat = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => json!({"type": "function", "function": {"name": choice.get("name")}}),
        _ => {
            return Err(ApiError::invalid(
                "tool_choice.type must be auto, any, tool or none",
                Some("tool_choice"),
            ))
        }
    };
    Ok((chat, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_become_the_chat_they_stand_for() {
        let conversation = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call it.", "signature": ""},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "18 C"}]},
                {"type": "tool_result", "tool_use_id": "t2", "content": "timeout", "is_error": true},
                {"type": "text", "text": "Thanks."},
            ]},
        ]);
        let got = messages(Some(&json!("Be brief.")), conversation.as_array().unwrap()).unwrap();
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Weather in Paris?"}),
                json!({"role": "assistant", "content": "Let me look.", "reasoning_content": "Call it.",
                    "tool_calls": [{"id": "t1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "t1", "content": "18 C"}),
                json!({"role": "tool", "tool_call_id": "t2", "content": "Error: timeout"}),
                json!({"role": "user", "content": "Thanks."}),
            ]
        );
        let image = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
        assert!(messages(None, image.as_array().unwrap()).is_err());
    }

    #[test]
    fn fields_take_the_chat_shapes_or_are_refused() {
        let request = |body: Value| serde_json::from_value::<MessagesRequest>(body).unwrap();
        let chat = request(json!({
            "model": "m", "max_tokens": 9, "stop_sequences": ["x"], "top_k": 5,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "metadata": {"user_id": "u"},
        }))
        .to_chat()
        .unwrap();
        assert_eq!(chat.max_completion_tokens, Some(9));
        assert_eq!(chat.tool_choice, Some(json!("required")));
        assert_eq!(chat.parallel_tool_calls, Some(false));
        assert_eq!(
            chat.tools.unwrap()[0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert!(!chat.continue_final_message);
        // A last assistant turn is continued.
        let prefill = request(json!({"model": "m", "max_tokens": 4, "messages": [
            {"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}]}))
        .to_chat()
        .unwrap();
        assert!(prefill.continue_final_message && prefill.add_generation_prompt == Some(false));
        let hi = json!([{"role": "user", "content": "hi"}]);
        for (body, field) in [
            (json!({"model": "m", "messages": hi}), "max_tokens"),
            (
                json!({"model": "m", "max_tokens": 4, "messages": hi, "thinking": {"type": "enabled"}}),
                "thinking",
            ),
            (
                json!({"model": "m", "max_tokens": 4, "messages": hi, "tools": [{"type": "web_search_20250305", "name": "w"}]}),
                "tools",
            ),
            (
                json!({"model": "m", "max_tokens": 4, "messages": hi, "metadata": {"x": 1}}),
                "metadata",
            ),
        ] {
            let error = request(body).to_chat().unwrap_err();
            assert_eq!(error.body()["error"]["param"], json!(field));
        }
    }
}
