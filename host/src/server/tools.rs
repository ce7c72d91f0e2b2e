//! Tool calls (OpenAI's `tools` and `tool_choice`): the template shows the
//! model the tools, the model writes its calls in its family's format
//! ([`ToolFormat`]: Hermes `<tool_call>` blocks for Qwen2.5 and ChatML,
//! Llama 3's JSON, Mistral's `[TOOL_CALLS]`), and that text becomes the
//! message's `tool_calls` (whole, or as deltas when streaming). `required`
//! and a named function are enforced with a grammar, so the call always
//! parses.

use serde_json::{json, Value};

use super::openai::ApiError;
use crate::engine::structured::Grammar;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const MISTRAL: &str = "[TOOL_CALLS]";
const PYTHON_TAG: &str = "<|python_tag|>";

/// How a model writes its calls (vLLM's `--tool-call-parser` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
    /// (Qwen2.5, Hermes, ChatML templates).
    Hermes,
    /// `{"name": ..., "parameters": {...}}`, several joined by `; `
    /// (Llama 3.1 and later).
    #[value(name = "llama3_json")]
    Llama3Json,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
    Mistral,
}

impl ToolFormat {
    /// The format a chat template teaches, by the markers it writes; `None`
    /// when it writes none of them.
    pub fn detect(template: Option<&str>) -> Option<Self> {
        match template? {
            t if t.contains(MISTRAL) => Some(ToolFormat::Mistral),
            t if t.contains(OPEN) => Some(ToolFormat::Hermes),
            t if t.contains("ipython") || t.contains(PYTHON_TAG) => Some(ToolFormat::Llama3Json),
            _ => None,
        }
    }

    /// The format of a `--tool-call-parser` name (vLLM's spelling).
    pub fn from_name(name: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(name, true).ok()
    }

    /// The format tool calls are read in, and where that came from:
    /// `--tool-call-parser`, else the parser the architecture's plugin names,
    /// else the chat template's markers. `None` when nothing names one.
    pub fn resolve(
        flag: Option<Self>,
        plugin: Option<&str>,
        template: Option<&str>,
    ) -> Option<(Self, &'static str)> {
        if let Some(format) = flag {
            return Some((format, "--tool-call-parser"));
        }
        if let Some(name) = plugin {
            match Self::from_name(name) {
                Some(format) => return Some((format, "the architecture's plugin")),
                None => tracing::warn!(
                    "the architecture's plugin names the tool-call parser `{name}`, which this \
                     host does not have (hermes, llama3_json, mistral); reading the chat template"
                ),
            }
        }
        Self::detect(template).map(|format| (format, "the chat template"))
    }

    /// What comes before the calls, between two and after them.
    fn frame(self) -> (&'static str, &'static str, &'static str) {
        match self {
            ToolFormat::Hermes => ("", "\n", ""),
            ToolFormat::Llama3Json => ("", "; ", ""),
            ToolFormat::Mistral => ("[TOOL_CALLS][", ", ", "]"),
        }
    }

    /// One call's text before and after its arguments.
    fn call(self, name: &Value) -> (String, &'static str) {
        match self {
            ToolFormat::Hermes => (
                format!("{OPEN}\n{{\"name\": {name}, \"arguments\": "),
                "}\n</tool_call>",
            ),
            ToolFormat::Llama3Json => (format!("{{\"name\": {name}, \"parameters\": "), "}"),
            ToolFormat::Mistral => (format!("{{\"name\": {name}, \"arguments\": "), "}"),
        }
    }
}

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

/// Another API's `tools` (the Responses or Messages API's) in the chat
/// API's shape: `function` gives each tool's `function` object, or says why
/// it refuses the tool.
pub fn as_chat_tools(
    tools: &Value,
    function: impl Fn(&Value) -> Result<Value, String>,
) -> Result<Value, ApiError> {
    let Some(tools) = tools.as_array() else {
        return Err(ApiError::invalid("tools must be a list", Some("tools")));
    };
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| match function(tool) {
            Ok(function) => Ok(json!({"type": "function", "function": function})),
            Err(why) => Err(ApiError::invalid(
                format!("tools[{i}]: {why}"),
                Some("tools"),
            )),
        })
        .collect()
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

    /// The grammar that enforces `required` or a named function: calls in
    /// `format`, arguments valid under the function's parameters; with
    /// `parallel` false (or a named function), exactly one call.
    pub fn grammar(&self, format: ToolFormat, parallel: bool) -> Option<Grammar> {
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
        let literal = |text: &str| Value::from(text).to_string();
        let mut rules = Vec::new();
        let mut alternatives = Vec::new();
        for (i, tool) in names.iter().enumerate() {
            let mut parameters = tool["function"]
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            parameters["x-guidance"] = separators.clone();
            let (head, tail) = format.call(&tool["function"]["name"]);
            rules.push(format!("args{i}: %json {parameters}"));
            alternatives.push(format!("{} args{i} {}", literal(&head), literal(tail)));
        }
        let (open, separator, close) = format.frame();
        let mut start = vec!["call".to_owned()];
        if parallel && !matches!(self.choice, ToolChoice::Named(_)) {
            start.push(format!("({} call)*", literal(separator)));
        }
        if !open.is_empty() {
            start.insert(0, literal(open));
        }
        if !close.is_empty() {
            start.push(literal(close));
        }
        Some(Grammar::Lark(format!(
            "start: {}\ncall: {}\n{}\n",
            start.join(" "),
            alternatives.join(" | "),
            rules.join("\n")
        )))
    }
}

/// A call's JSON object (`arguments`, or Llama's `parameters`).
fn call_of(call: &Value) -> Option<ToolCall> {
    let name = call.get("name")?.as_str()?.to_owned();
    let arguments = call
        .get("arguments")
        .or_else(|| call.get("parameters"))
        .cloned()
        .unwrap_or(json!({}));
    Some(ToolCall {
        name,
        arguments: arguments.to_string(),
    })
}

/// A Hermes call's JSON, or `None` when it is not one.
fn parse_call(text: &str) -> Option<ToolCall> {
    call_of(&serde_json::from_str(text.trim()).ok()?)
}

/// Llama 3's calls: JSON objects joined by `;` (after an optional
/// `<|python_tag|>`), or `None` unless the whole text is that.
fn parse_llama3(text: &str) -> Option<Vec<ToolCall>> {
    let mut rest = text
        .trim_start()
        .trim_start_matches(PYTHON_TAG)
        .trim_start();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        calls.push(call_of(&value)?);
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// Mistral's calls: the JSON array after `[TOOL_CALLS]`.
fn parse_mistral(text: &str) -> Option<Vec<ToolCall>> {
    let array: Vec<Value> = serde_json::Deserializer::from_str(text.trim())
        .into_iter::<Vec<Value>>()
        .next()?
        .ok()?;
    array.iter().map(call_of).collect()
}

/// A finished output in `format` split into its content (`None` when only
/// calls) and its calls. Text that does not parse stays content.
pub fn parse_tool_calls(format: ToolFormat, text: &str) -> (Option<String>, Vec<ToolCall>) {
    let mut stream = ToolSplitter::new(format);
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

/// Splits streamed output in a format into content and calls.
#[derive(Debug)]
pub enum ToolSplitter {
    /// Hermes blocks, each released when it closes.
    Hermes(StreamingToolCalls),
    /// Llama 3 or Mistral: content until the calls start (at the start for
    /// Llama 3, at `[TOOL_CALLS]` for Mistral), then held to the end.
    Trailing {
        /// Which of the two.
        format: ToolFormat,
        /// Text not yet released.
        pending: String,
        /// The calls have started.
        in_calls: bool,
        /// Some text was released as content (Llama 3 calls come first).
        released: bool,
    },
}

impl ToolSplitter {
    /// A splitter for `format`.
    pub fn new(format: ToolFormat) -> Self {
        match format {
            ToolFormat::Hermes => ToolSplitter::Hermes(StreamingToolCalls::default()),
            format => ToolSplitter::Trailing {
                format,
                pending: String::new(),
                in_calls: false,
                released: false,
            },
        }
    }

    /// Takes the next text; returns what is now known.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        let (format, pending, in_calls, released) = match self {
            ToolSplitter::Hermes(stream) => return stream.push(text),
            ToolSplitter::Trailing {
                format,
                pending,
                in_calls,
                released,
            } => (*format, pending, in_calls, released),
        };
        pending.push_str(text);
        if *in_calls {
            return Vec::new();
        }
        let marker = match format {
            ToolFormat::Mistral => MISTRAL,
            _ => PYTHON_TAG,
        };
        if format == ToolFormat::Llama3Json && !*released {
            let head = pending.trim_start();
            if head.starts_with('{') || head.starts_with(PYTHON_TAG) {
                *in_calls = true;
                return Vec::new();
            }
            if head.is_empty() || PYTHON_TAG.starts_with(head) {
                return Vec::new();
            }
        }
        if let Some(at) = pending
            .find(marker)
            .filter(|_| format == ToolFormat::Mistral)
        {
            let before: String = pending.drain(..at).collect();
            *in_calls = true;
            *released |= !before.is_empty();
            return if before.is_empty() {
                Vec::new()
            } else {
                vec![Piece::Content(before)]
            };
        }
        let keep = (1..marker.len())
            .rev()
            .find(|&n| pending.ends_with(&marker[..n]))
            .unwrap_or(0);
        let release: String = pending.drain(..pending.len() - keep).collect();
        *released |= !release.is_empty();
        if release.is_empty() {
            Vec::new()
        } else {
            vec![Piece::Content(release)]
        }
    }

    /// The end of the output: the calls, or what is held back as content.
    pub fn finish(&mut self) -> Vec<Piece> {
        let (format, pending, in_calls) = match self {
            ToolSplitter::Hermes(stream) => return stream.finish(),
            ToolSplitter::Trailing {
                format,
                pending,
                in_calls,
                ..
            } => (*format, std::mem::take(pending), std::mem::take(in_calls)),
        };
        let calls = match format {
            _ if !in_calls => None,
            ToolFormat::Mistral => parse_mistral(&pending[MISTRAL.len()..]),
            _ => parse_llama3(&pending),
        };
        match calls {
            Some(calls) => calls.into_iter().map(Piece::Call).collect(),
            None if pending.is_empty() => Vec::new(),
            None => vec![Piece::Content(pending)],
        }
    }
}

/// Splits streamed Hermes output into content and calls, holding back text
/// that may be the start of a `<tool_call>` until it is known. An output that
/// opens with a bare JSON object is held to the end and read as calls when it
/// is only calls (small Qwen2.5 models often drop the tags), else as content.
#[derive(Debug, Default)]
pub struct StreamingToolCalls {
    pending: String,
    in_call: bool,
    /// Some content was released: a bare JSON object can no longer open the output.
    released: bool,
    /// The output opened with `{`: held to the end.
    bare: bool,
}

impl StreamingToolCalls {
    /// Takes the next text; returns what is now known.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        if !self.released && !self.in_call {
            let head = self.pending.trim_start();
            self.bare |= head.starts_with('{');
            if self.bare || head.is_empty() {
                return Vec::new();
            }
        }
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
                    self.released = true;
                }
                None => {
                    // Keep a tail that could still grow into `<tool_call>`.
                    let keep = (1..OPEN.len())
                        .rev()
                        .find(|&n| self.pending.ends_with(&OPEN[..n]))
                        .unwrap_or(0);
                    let release = self.pending.len() - keep;
                    if release > 0 {
                        self.released = true;
                        out.push(Piece::Content(self.pending.drain(..release).collect()));
                    }
                    break;
                }
            }
        }
        out
    }

    /// The end of the output: bare calls, or what is still held back, as content.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        if std::mem::take(&mut self.bare) {
            if let Some(calls) = parse_llama3(&rest) {
                return calls.into_iter().map(Piece::Call).collect();
            }
        }
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
    fn hermes_reads_an_output_of_bare_json_calls_and_keeps_other_json_as_content() {
        let bare = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";
        for pieces in [
            streamed(ToolFormat::Hermes, bare),
            streamed(ToolFormat::Hermes, &format!(" {bare}\n{bare}")),
        ] {
            assert!(!pieces.is_empty());
            for piece in pieces {
                assert!(
                    matches!(&piece, Piece::Call(c) if c.name == "get_weather"),
                    "{piece:?}"
                );
            }
        }
        let (content, calls) = parse_tool_calls(ToolFormat::Hermes, "{\"city\": \"Paris\"}");
        assert!(calls.is_empty());
        assert_eq!(content.as_deref(), Some("{\"city\": \"Paris\"}"));
        // After some text, a JSON object is content (only tags make calls there).
        let (content, calls) = parse_tool_calls(ToolFormat::Hermes, &format!("Sure: {bare}"));
        assert!(calls.is_empty(), "{calls:?}");
        assert_eq!(content, Some(format!("Sure: {bare}")));
    }

    #[test]
    fn the_format_comes_from_the_flag_then_the_plugin_then_the_template() {
        let qwen = Some("{{ '<tool_call>' }}");
        let resolve = ToolFormat::resolve;
        assert_eq!(
            resolve(Some(ToolFormat::Mistral), Some("hermes"), qwen),
            Some((ToolFormat::Mistral, "--tool-call-parser"))
        );
        assert_eq!(
            resolve(None, Some("llama3_json"), qwen),
            Some((ToolFormat::Llama3Json, "the architecture's plugin"))
        );
        // A name this host lacks falls back to the template.
        assert_eq!(
            resolve(None, Some("pythonic"), qwen),
            Some((ToolFormat::Hermes, "the chat template"))
        );
        // A template without tool markers (SmolLM2's ChatML) names nothing.
        assert_eq!(resolve(None, None, Some("<|im_start|>")), None);
        assert_eq!(resolve(None, None, None), None);
    }

    #[test]
    fn calls_are_split_from_content_whole_or_streamed() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = parse_tool_calls(ToolFormat::Hermes, text);
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
        let (content, calls) =
            parse_tool_calls(ToolFormat::Hermes, "a <tool_call>oops</tool_call> b");
        assert!(calls.is_empty());
        assert_eq!(content.as_deref(), Some("a <tool_call>oops</tool_call> b"));
    }

    fn streamed(format: ToolFormat, text: &str) -> Vec<Piece> {
        let mut splitter = ToolSplitter::new(format);
        let mut pieces = Vec::new();
        for chunk in text.as_bytes().chunks(2) {
            pieces.extend(splitter.push(std::str::from_utf8(chunk).unwrap()));
        }
        pieces.extend(splitter.finish());
        pieces
    }

    #[test]
    fn llama3_and_mistral_calls_are_read() {
        let paris = ToolCall {
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        };
        let rome = ToolCall {
            name: "get_time".into(),
            arguments: r#"{"city":"Rome"}"#.into(),
        };
        let llama = r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {"city": "Rome"}}"#;
        assert_eq!(
            parse_tool_calls(ToolFormat::Llama3Json, llama),
            (None, vec![paris.clone(), rome.clone()])
        );
        assert_eq!(
            streamed(ToolFormat::Llama3Json, llama),
            [Piece::Call(paris.clone()), Piece::Call(rome.clone())]
        );
        // Prose is content, streamed as it comes.
        let prose = streamed(ToolFormat::Llama3Json, "It is sunny; {not a call}");
        assert!(prose.len() > 1 && prose.iter().all(|p| matches!(p, Piece::Content(_))));
        let mistral =
            r#"Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]"#;
        assert_eq!(
            parse_tool_calls(ToolFormat::Mistral, mistral),
            (Some("Sure.".into()), vec![paris])
        );
        // A broken call stays content.
        let (content, calls) = parse_tool_calls(ToolFormat::Mistral, "[TOOL_CALLS][{oops");
        assert!(calls.is_empty());
        assert_eq!(content.as_deref(), Some("[TOOL_CALLS][{oops"));
    }

    #[test]
    fn every_format_has_a_grammar_that_accepts_its_own_calls() {
        use llguidance::toktrie::ApproximateTokEnv;
        use llguidance::{Matcher, ParserFactory};
        let tools = vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"], "additionalProperties": false}}}),
        ];
        let request = requested_tools(Some(&tools), Some(&json!("required")))
            .unwrap()
            .unwrap();
        let env = ApproximateTokEnv::single_byte_env();
        let factory = ParserFactory::new_simple(&env).unwrap();
        for (format, text) in [
            (ToolFormat::Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            (ToolFormat::Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}"),
            (ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]"),
        ] {
            let Some(Grammar::Lark(lark)) = request.grammar(format, true) else {
                panic!("{format:?}: no grammar");
            };
            let grammar = llguidance::api::TopLevelGrammar::from_lark(lark.clone());
            let mut matcher = Matcher::new(factory.create_parser(grammar));
            assert!(matcher.get_error().is_none(), "{format:?}: {:?}\n{lark}", matcher.get_error());
            let tokens = env.tokenize_bytes(text.as_bytes());
            matcher.consume_tokens(&tokens).unwrap_or_else(|e| panic!("{format:?}: {e}\n{lark}"));
            assert!(matcher.is_accepting().unwrap(), "{format:?}: {text}");
            // The calls the grammar lets through are the ones the parser reads.
            assert!(!parse_tool_calls(format, text).1.is_empty(), "{format:?}");
        }
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
        let Some(Grammar::Lark(lark)) = request.grammar(ToolFormat::Hermes, true) else {
            panic!("no grammar");
        };
        assert!(
            lark.contains("get_weather") && lark.contains("%json"),
            "{lark}"
        );
        let none = requested_tools(Some(&tools), Some(&json!("none")))
            .unwrap()
            .unwrap();
        assert!(!none.calls() && none.grammar(ToolFormat::Hermes, true).is_none());
        assert!(requested_tools(Some(&tools), Some(&json!("auto")))
            .unwrap()
            .unwrap()
            .grammar(ToolFormat::Hermes, true)
            .is_none());
        let other = json!({"type": "function", "function": {"name": "nope"}});
        assert!(requested_tools(Some(&tools), Some(&other)).is_err());
        assert!(requested_tools(Some(&[json!({"type": "x"})]), None).is_err());
        assert!(requested_tools(None, Some(&json!("required"))).is_err());
    }
}
