//! Tool calls (OpenAI's `tools` and `tool_choice`) in the Hermes format
//! that Qwen2.5 and most ChatML templates use: the template shows the model
//! the tools, the model writes `<tool_call>\n{"name": ..., "arguments":
//! {...}}\n</tool_call>`, and that text becomes the message's `tool_calls`
//! (whole, or as deltas when streaming). `required` and a named function
//! are enforced with a grammar, so the call always parses.

use serde_json::{json, Value};

use super::openai::ApiError;
use crate::engine::structured::Grammar;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Which calls the model may or must make.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    /// No call: the template still shows the tools (as vLLM does), the
    /// output is plain content.
    None,
    /// The model decides.
    Auto,
    /// At least one call to any tool.
    Required,
    /// One call to this function.
    Named(String),
}

/// A request's tools and its choice.
#[derive(Clone, Debug)]
pub struct Tools {
    /// The tool schemas as the client sent them (for the template).
    pub tools: Vec<Value>,
    /// The choice.
    pub choice: ToolChoice,
}

/// One call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// The call as OpenAI's `tool_calls[i]`.
    pub fn to_json(&self, index: usize, id: &str) -> Value {
        json!({"index": index, "id": format!("call_{id}_{index}"), "type": "function",
            "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// The tools a chat request offers, checked, or `None` when it offers none.
pub fn requested_tools(
    tools: Option<&[Value]>,
    choice: Option<&Value>,
) -> Result<Option<Tools>, ApiError> {
    let invalid = |message: String, param: &str| ApiError::invalid(message, Some(param));
    let tools = tools.unwrap_or_default();
    let mut names = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let name = tool
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str);
        match (tool.get("type").and_then(Value::as_str), name) {
            (Some("function"), Some(name)) if !name.is_empty() => names.push(name.to_owned()),
            _ => {
                return Err(invalid(
                    format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                    "tools",
                ))
            }
        }
        if let Some(parameters) = tool["function"].get("parameters") {
            if !parameters.is_object() {
                return Err(invalid(
                    format!("tools[{i}].function.parameters must be a JSON schema object"),
                    "tools",
                ));
            }
        }
    }
    let choice = match choice {
        None if tools.is_empty() => return Ok(None),
        None => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(named) => match named["function"]["name"].as_str() {
            Some(name) if named["type"] == "function" => ToolChoice::Named(name.to_owned()),
            _ => {
                return Err(invalid(
                    format!(
                        "tool_choice must be none, auto, required or a named function, got {named}"
                    ),
                    "tool_choice",
                ))
            }
        },
    };
    if tools.is_empty() {
        return Err(invalid("tool_choice needs tools".into(), "tool_choice"));
    }
    if let ToolChoice::Named(name) = &choice {
        if !names.contains(name) {
            return Err(invalid(
                format!("tool_choice names `{name}`, which is not among the tools"),
                "tool_choice",
            ));
        }
    }
    Ok(Some(Tools {
        tools: tools.to_vec(),
        choice,
    }))
}

impl Tools {
    /// Whether the output is read for calls (not with `tool_choice: none`).
    pub fn calls(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The grammar that enforces `required` or a named function: one or
    /// more calls in the Hermes format, arguments valid under the
    /// function's parameters.
    /// With `parallel` false, exactly one call.
    pub fn grammar(&self, parallel: bool) -> Option<Grammar> {
        let names: Vec<&Value> = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Required => self.tools.iter().collect(),
            ToolChoice::Named(name) => self
                .tools
                .iter()
                .filter(|t| t["function"]["name"] == name.as_str())
                .collect(),
        };
        let separators =
            json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false});
        let mut rules = Vec::new();
        let mut alternatives = Vec::new();
        for (i, tool) in names.iter().enumerate() {
            let mut parameters = tool["function"]
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            parameters["x-guidance"] = separators.clone();
            let head = format!(
                "{OPEN}\n{{\"name\": {}, \"arguments\": ",
                tool["function"]["name"]
            );
            rules.push(format!("args{i}: %json {parameters}"));
            alternatives.push(format!(
                "{} args{i} {}",
                Value::from(head),
                Value::from(format!("}}\n{CLOSE}"))
            ));
        }
        let call = alternatives.join(" | ");
        let repeat = if !parallel || matches!(self.choice, ToolChoice::Named(_)) {
            ""
        } else {
            " (\"\\n\" call)*"
        };
        Some(Grammar::Lark(format!(
            "start: call{repeat}\ncall: {call}\n{}\n",
            rules.join("\n")
        )))
    }
}

/// A Hermes call's JSON, or `None` when it is not one.
fn parse_call(text: &str) -> Option<ToolCall> {
    let call: Value = serde_json::from_str(text.trim()).ok()?;
    let name = call.get("name")?.as_str()?.to_owned();
    let arguments = call.get("arguments").cloned().unwrap_or(json!({}));
    Some(ToolCall {
        name,
        arguments: arguments.to_string(),
    })
}

/// A finished output split into its content (`None` when only calls) and
/// its calls. A block that does not parse stays in the content.
pub fn parse_tool_calls(text: &str) -> (Option<String>, Vec<ToolCall>) {
    let mut stream = StreamingToolCalls::default();
    let mut pieces = stream.push(text);
    pieces.extend(stream.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Content(text) => content.push_str(&text),
            Piece::Call(call) => calls.push(call),
        }
    }
    let content = if calls.is_empty() {
        Some(content)
    } else {
        Some(content.trim().to_owned()).filter(|c| !c.is_empty())
    };
    (content, calls)
}

/// What streamed text turns into.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// Text for `content`.
    Content(String),
    /// A complete call.
    Call(ToolCall),
}

/// Splits streamed output into content and calls, holding back text that
/// may be the start of a `<tool_call>` until it is known.
#[derive(Debug, Default)]
pub struct StreamingToolCalls {
    pending: String,
    in_call: bool,
}

impl StreamingToolCalls {
    /// Takes the next text; returns what is now known.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_call {
                let Some(end) = self.pending.find(CLOSE) else {
                    break;
                };
                let body: String = self.pending.drain(..end + CLOSE.len()).collect();
                let inner = &body[..end];
                match parse_call(inner) {
                    Some(call) => out.push(Piece::Call(call)),
                    None => out.push(Piece::Content(format!("{OPEN}{body}"))),
                }
                self.in_call = false;
                continue;
            }
            match self.pending.find(OPEN) {
                Some(start) => {
                    let before: String = self.pending.drain(..start).collect();
                    self.pending.drain(..OPEN.len());
                    if !before.is_empty() {
                        out.push(Piece::Content(before));
                    }
                    self.in_call = true;
                }
                None => {
                    // Keep a tail that could still grow into `<tool_call>`.
                    let keep = (1..OPEN.len())
                        .rev()
                        .find(|&n| self.pending.ends_with(&OPEN[..n]))
                        .unwrap_or(0);
                    let release = self.pending.len() - keep;
                    if release > 0 {
                        out.push(Piece::Content(self.pending.drain(..release).collect()));
                    }
                    break;
                }
            }
        }
        out
    }

    /// The end of the output: what is still held back, as content.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        let rest = if std::mem::take(&mut self.in_call) {
            format!("{OPEN}{rest}")
        } else {
            rest
        };
        if rest.is_empty() {
            Vec::new()
        } else {
            vec![Piece::Content(rest)]
        }
    }
}

/// Messages as the chat template takes them: tool calls' `arguments`
/// (JSON text in OpenAI's API) become objects, as transformers' templates
/// expect.
pub fn template_messages(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for call in calls {
                    if let Some(arguments) = call.pointer_mut("/function/arguments") {
                        if let Some(parsed) = arguments
                            .as_str()
                            .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        {
                            *arguments = parsed;
                        }
                    }
                }
            }
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_split_from_content_whole_or_streamed() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse_tool_calls(text);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(
            calls,
            [ToolCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]
        );
        // Streamed a few bytes at a time: the same pieces, no tag leaked.
        let mut stream = StreamingToolCalls::default();
        let mut pieces = Vec::new();
        for chunk in text.as_bytes().chunks(3) {
            pieces.extend(stream.push(std::str::from_utf8(chunk).unwrap()));
        }
        pieces.extend(stream.finish());
        let content: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Content(c) => Some(c.as_str()),
                Piece::Call(_) => None,
            })
            .collect();
        assert_eq!(content.trim(), "Let me check.");
        assert_eq!(
            pieces
                .iter()
                .filter(|p| matches!(p, Piece::Call(_)))
                .count(),
            1
        );
        // A block that is not a call stays text.
        let (content, calls) = parse_tool_calls("a <tool_call>oops</tool_call> b");
        assert!(calls.is_empty());
        assert_eq!(content.as_deref(), Some("a <tool_call>oops</tool_call> b"));
    }

    #[test]
    fn tool_choice_is_checked_and_required_becomes_a_grammar() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}),
        ];
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let request = requested_tools(Some(&tools), Some(&named))
            .unwrap()
            .unwrap();
        let Some(Grammar::Lark(lark)) = request.grammar(true) else {
            panic!("no grammar");
        };
        assert!(
            lark.contains("get_weather") && lark.contains("%json"),
            "{lark}"
        );
        let none = requested_tools(Some(&tools), Some(&json!("none")))
            .unwrap()
            .unwrap();
        assert!(!none.calls() && none.grammar(true).is_none());
        assert!(requested_tools(Some(&tools), Some(&json!("auto")))
            .unwrap()
            .unwrap()
            .grammar(true)
            .is_none());
        let other = json!({"type": "function", "function": {"name": "nope"}});
        assert!(requested_tools(Some(&tools), Some(&other)).is_err());
        assert!(requested_tools(Some(&[json!({"type": "x"})]), None).is_err());
        assert!(requested_tools(None, Some(&json!("required"))).is_err());
    }
}
