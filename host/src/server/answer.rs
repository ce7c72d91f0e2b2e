//! What a chat's output says, read with the server's parsers: its thinking
//! (`--reasoning-parser`), its answer and its tool calls, whole or as it
//! streams. The chat and Responses endpoints shape the same reading.

use super::reasoning::{self, ReasoningSplitter};
use super::tools::{self, Piece, ToolCall, ToolFormat, ToolSplitter};

/// How a request's output is read.
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    /// With a reasoning parser: whether the output starts in its thinking.
    pub thinks: Option<bool>,
    /// With tools that may be called: their format, and whether several
    /// calls may come (else the first is kept).
    pub calls: Option<(ToolFormat, bool)>,
}

/// A whole output, read.
#[derive(Debug, Default, PartialEq)]
pub struct Answer {
    pub thinking: Option<String>,
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
}

impl Reading {
    /// Reads a whole output: the thinking first, then calls in the answer.
    pub fn whole(&self, text: String) -> Answer {
        let (thinking, content) = match self.thinks {
            Some(true) => reasoning::split(&text),
            _ => (None, Some(text)),
        };
        let Some((format, parallel)) = self.calls else {
            return Answer {
                thinking,
                content,
                calls: Vec::new(),
            };
        };
        let (content, mut calls) =
            tools::parse_tool_calls(format, content.as_deref().unwrap_or(""));
        if !parallel {
            calls.truncate(1);
        }
        Answer {
            thinking,
            content,
            calls,
        }
    }
}

/// A streamed output's next part.
#[derive(Debug, PartialEq)]
pub enum Part {
    Thinking(String),
    Content(String),
    Call(ToolCall),
}

/// One streamed output's reading: its thinking's splitter and its tool
/// calls', as the request asks.
pub struct AnswerStream {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<(ToolSplitter, bool)>,
    /// The calls sent so far.
    pub calls: usize,
}

impl AnswerStream {
    pub fn new(reading: Reading) -> Self {
        Self {
            reasoning: reading.thinks.map(ReasoningSplitter::new),
            tools: reading
                .calls
                .map(|(format, parallel)| (ToolSplitter::new(format), parallel)),
            calls: 0,
        }
    }

    /// The parts of the next chunk of text, or (`None`) of the end of the
    /// output. Without parsers, a chunk is one content part, empty or not.
    pub fn parts(&mut self, text: Option<&str>) -> Vec<Part> {
        let (thinking, answer) = match (&mut self.reasoning, text) {
            (Some(splitter), Some(text)) => splitter.push(text),
            (Some(splitter), None) => (splitter.finish(), String::new()),
            (None, Some(text)) if self.tools.is_none() => {
                return vec![Part::Content(text.to_owned())]
            }
            (None, text) => (String::new(), text.unwrap_or_default().to_owned()),
        };
        let mut parts = Vec::new();
        if !thinking.is_empty() {
            parts.push(Part::Thinking(thinking));
        }
        let Some((splitter, parallel)) = &mut self.tools else {
            if !answer.is_empty() {
                parts.push(Part::Content(answer));
            }
            return parts;
        };
        let pieces = match text {
            Some(_) => splitter.push(&answer),
            None => splitter.finish(),
        };
        for piece in pieces {
            match piece {
                Piece::Content(text) => parts.push(Part::Content(text)),
                Piece::Call(call) if *parallel || self.calls == 0 => {
                    parts.push(Part::Call(call));
                    self.calls += 1;
                }
                Piece::Call(_) => {}
            }
        }
        parts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thinking, then an answer with a Hermes call, read whole and
    /// streamed in pieces of every size alike.
    #[test]
    fn thinking_answer_and_calls_read_whole_and_streamed_alike() {
        let call = r#"<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>"#;
        let text = format!("<think>Call f.</think>Sure. {call}");
        let reading = Reading {
            thinks: Some(true),
            calls: Some((ToolFormat::Hermes, true)),
        };
        let whole = reading.whole(text.clone());
        assert_eq!(whole.thinking.as_deref(), Some("Call f."));
        assert_eq!(whole.calls.len(), 1);
        for size in [1, 3, 7, 1000] {
            let mut stream = AnswerStream::new(reading);
            let chars: Vec<char> = text.chars().collect();
            let mut parts: Vec<Part> = chars
                .chunks(size)
                .flat_map(|c| stream.parts(Some(&c.iter().collect::<String>())))
                .collect();
            parts.extend(stream.parts(None));
            let (mut thinking, mut content, mut calls) = (String::new(), String::new(), Vec::new());
            for part in parts {
                match part {
                    Part::Thinking(t) => thinking.push_str(&t),
                    Part::Content(c) => content.push_str(&c),
                    Part::Call(call) => calls.push(call),
                }
            }
            assert_eq!(Some(thinking), whole.thinking, "pieces of {size}");
            assert_eq!(
                content.trim(),
                whole.content.as_deref().unwrap_or("").trim()
            );
            assert_eq!(calls, whole.calls, "pieces of {size}");
        }
    }
}
