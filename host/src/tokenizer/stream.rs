//! Incremental detokenization.

use super::{Tokenizer, TokenizerError};

/// Turns ids arriving one by one into text deltas.
///
/// Concatenating the deltas (and what [`DecodeStream::flush`] returns) gives
/// exactly `Tokenizer::decode` of all the ids. A delta never ends inside a
/// character: while the text decoded so far ends in an incomplete UTF-8
/// sequence (shown by the decoder as U+FFFD), the ids are held back until
/// a later id completes it.
///
/// This is the algorithm of `tokenizers`' `DecodeStream` (decode a short window
/// of ids and emit what grew past the previously decoded prefix, so that
/// decoders that look at neighbouring tokens, like SentencePiece's leading
/// space, stay right), plus [`DecodeStream::flush`] for the end of generation.
#[derive(Debug)]
pub struct DecodeStream<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    /// The window: ids already emitted for context (`..prefix_index`) and ids
    /// not emitted yet.
    ids: Vec<u32>,
    /// The text of `ids[..prefix_index]`.
    prefix: String,
    prefix_index: usize,
}

impl<'a> DecodeStream<'a> {
    pub(super) fn new(tokenizer: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        }
    }

    /// Feeds one id; returns the new text, or `None` while it is held back.
    pub fn step(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        // A skipped special token adds nothing to any decode: kept out of the
        // window, where a run of them (a model emitting its end-of-turn
        // token past `ignore_eos`) would grow every later decode.
        if self.skip_special_tokens && self.tokenizer.skips_when_decoding(id) {
            return Ok(None);
        }
        if self.prefix.is_empty() && !self.ids.is_empty() {
            let prefix = self.decode(&self.ids)?;
            if !prefix.ends_with(char::REPLACEMENT_CHARACTER) {
                self.prefix = prefix;
                self.prefix_index = self.ids.len();
            }
        }
        self.ids.push(id);
        let text = self.decode(&self.ids)?;
        if text.len() <= self.prefix.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        let delta = self.delta(text)?;
        // Keep the ids just emitted as the context for the next ones.
        let emitted = self.ids.len() - self.prefix_index;
        self.ids.drain(..self.prefix_index);
        self.prefix = self.decode(&self.ids)?;
        self.prefix_index = emitted;
        Ok(Some(delta))
    }

    /// Emits whatever is still held back (an incomplete character comes out
    /// as U+FFFD, as `decode` shows it) and starts afresh.
    pub fn flush(&mut self) -> Result<Option<String>, TokenizerError> {
        let text = self.decode(&self.ids)?;
        let delta = if text.len() > self.prefix.len() {
            Some(self.delta(text)?)
        } else {
            None
        };
        self.ids.clear();
        self.prefix.clear();
        self.prefix_index = 0;
        Ok(delta)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.tokenizer.decode(ids, self.skip_special_tokens)
    }

    /// What `text` adds to the prefix.
    fn delta(&self, mut text: String) -> Result<String, TokenizerError> {
        if !text.starts_with(&self.prefix) {
            return Err(TokenizerError::InvalidStream {
                prefix: self.prefix.clone(),
                text,
            });
        }
        Ok(text.split_off(self.prefix.len()))
    }
}
