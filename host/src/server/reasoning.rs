//! vLLM's `--reasoning-parser`: a reasoning model's thinking, written
//! between `<think>` and `</think>`, comes back apart from its answer, as
//! the message's `reasoning_content` (and `reasoning`, vLLM's newer name),
//! whole or streamed as deltas.
//!
//! Both formats read the same markers the same way (vLLM's current
//! parsers): the output's thinking runs to the first `</think>` (a leading
//! `<think>` dropped: DeepSeek-R1's and Qwen3's templates put it in the
//! prompt, older ones let the model write it), the answer after it; an
//! output cut before `</think>` is all thinking. A prompt that already ends
//! its thinking (`</think>` at its end: Qwen3's template with
//! `enable_thinking: false`) makes the whole output the answer.

use serde_json::{Map, Value};

use crate::tokenizer::Tokenizer;

/// What opens the thinking.
const START: &str = "<think>";
/// What closes it.
pub const END: &str = "</think>";

/// The model family whose thinking is read (vLLM's parser names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReasoningFormat {
    /// DeepSeek-R1, its distills and QwQ.
    #[value(name = "deepseek_r1")]
    DeepSeekR1,
    /// Qwen3 (and SmolLM3's `<think>` blocks); `enable_thinking: false` in
    /// `chat_template_kwargs` makes the output all answer.
    #[value(name = "qwen3")]
    Qwen3,
}

/// How many of a prompt's last tokens are read for a closing `</think>`.
const PROMPT_TAIL: usize = 16;

impl ReasoningFormat {
    /// Whether a chat's output starts in its thinking: not when its prompt
    /// ends with `</think>` (and white space), nor for Qwen3 with
    /// `enable_thinking: false`. Read as text, so a marker the tokenizer
    /// splits counts too.
    pub fn thinks(
        &self,
        prompt: &[u32],
        tokenizer: &Tokenizer,
        kwargs: Option<&Map<String, Value>>,
    ) -> bool {
        let disabled = kwargs
            .and_then(|k| k.get("enable_thinking"))
            .is_some_and(|v| v == &Value::Bool(false));
        if *self == ReasoningFormat::Qwen3 && disabled {
            return false;
        }
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_TAIL)..];
        !tokenizer
            .decode(tail, false)
            .is_ok_and(|text| text.trim_end().ends_with(END))
    }
}

/// A whole output that starts in its thinking, as (thinking, answer),
/// each `None` when empty.
pub fn split(text: &str) -> (Option<String>, Option<String>) {
    let text = match text.trim_start().strip_prefix(START) {
        Some(rest) => rest,
        None => text,
    };
    let (thinking, answer) = text.split_once(END).unwrap_or((text, ""));
    (non_empty(thinking), non_empty(answer))
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Streamed text split as [`split`] splits the whole: what a chunk adds to
/// the thinking, and to the answer. A chunk's end that may begin a marker
/// is held back until the next chunk tells.
pub struct ReasoningSplitter {
    thinking: bool,
    /// Whether anything but white space came (a `<think>` after it is text).
    started: bool,
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for an output that starts in its thinking, or not.
    pub fn new(thinking: bool) -> Self {
        Self {
            thinking,
            started: false,
            held: String::new(),
        }
    }

    /// The thinking and the answer in the next chunk of text.
    pub fn push(&mut self, text: &str) -> (String, String) {
        if !self.thinking {
            return (String::new(), text.to_owned());
        }
        self.held.push_str(text);
        if !self.started {
            let lead = self.held.trim_start();
            if lead.len() < START.len() && START.starts_with(lead) {
                return Default::default();
            }
            if let Some(rest) = lead.strip_prefix(START) {
                self.held = rest.to_owned();
            }
            self.started = true;
        }
        if let Some((thinking, answer)) = self.held.split_once(END) {
            let parts = (thinking.to_owned(), answer.to_owned());
            self.thinking = false;
            self.held.clear();
            return parts;
        }
        // Hold back the longest end of the text that begins `</think>`.
        let keep = (1..END.len())
            .rev()
            .find(|&k| self.held.ends_with(&END[..k]))
            .unwrap_or(0);
        let thinking = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        (thinking, String::new())
    }

    /// What is still held at the end of the output: thinking.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` streamed in pieces of `size` bytes (at char boundaries), the
    /// parts joined.
    fn streamed(text: &str, size: usize, thinking: bool) -> (String, String) {
        let mut splitter = ReasoningSplitter::new(thinking);
        let (mut all_thinking, mut all_answer) = (String::new(), String::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(size) {
            let (t, a) = splitter.push(&piece.iter().collect::<String>());
            all_thinking.push_str(&t);
            all_answer.push_str(&a);
        }
        all_thinking.push_str(&splitter.finish());
        (all_thinking, all_answer)
    }

    #[test]
    fn thinking_and_answer_are_split_whole_and_streamed_alike() {
        let cases: [(&str, Option<&str>, Option<&str>); 7] = [
            (
                "Hmm, 2+2.\n</think>\n\nIt is 4.",
                Some("Hmm, 2+2.\n"),
                Some("\n\nIt is 4."),
            ),
            ("<think>\nHmm.</think>Four.", Some("\nHmm."), Some("Four.")),
            ("\n<think>Hmm.</think>", Some("Hmm."), None),
            ("cut before the end <", Some("cut before the end <"), None),
            (
                "a <think> inside </think>b",
                Some("a <think> inside "),
                Some("b"),
            ),
            ("</think>only an answer", None, Some("only an answer")),
            (
                "two </think> ends </think>",
                Some("two "),
                Some(" ends </think>"),
            ),
        ];
        for (text, thinking, answer) in cases {
            let whole = split(text);
            assert_eq!(
                whole,
                (thinking.map(str::to_owned), answer.map(str::to_owned)),
                "{text:?}"
            );
            for size in [1, 2, 3, 5, 8, 100] {
                let (t, a) = streamed(text, size, true);
                assert_eq!(
                    (non_empty(&t), non_empty(&a)),
                    whole,
                    "{text:?} in pieces of {size}"
                );
            }
        }
    }

    #[test]
    fn an_output_that_starts_in_the_answer_is_all_answer() {
        assert_eq!(
            streamed("<think>x</think>y", 2, false),
            (String::new(), "<think>x</think>y".to_owned())
        );
    }

    #[test]
    fn a_prompt_that_ends_the_thinking_starts_the_answer() {
        let tokenizer = Tokenizer::from_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/tokenizer/tiny-gpt2/hf/tokenizer.json"
        ))
        .unwrap();
        let encode = |text: &str| tokenizer.encode(text, false).unwrap();
        let reasoning = ReasoningFormat::DeepSeekR1;
        let thinks = |prompt: &str| reasoning.thinks(&encode(prompt), &tokenizer, None);
        assert!(thinks("User: hi\nAssistant: <think>\n"));
        assert!(thinks("User: hi\nAssistant:"));
        assert!(!thinks("User: hi\nAssistant: <think>\n\n</think>\n\n"));
        // An earlier turn's end of thinking, then more conversation.
        assert!(thinks("A: <think>x</think>y\nUser: more\nAssistant:"));
        let disabled: Map<String, Value> =
            serde_json::from_str(r#"{"enable_thinking": false}"#).unwrap();
        let qwen3 = ReasoningFormat::Qwen3;
        let prompt = encode("User: hi\nAssistant:");
        assert!(qwen3.thinks(&prompt, &tokenizer, None));
        assert!(!qwen3.thinks(&prompt, &tokenizer, Some(&disabled)));
        assert!(reasoning.thinks(&prompt, &tokenizer, Some(&disabled)));
    }
}
