//! Chat prompts whose message content cannot forge special tokens.
//!
//! A chat template writes the turn markers (`<|im_start|>`, `<|eot_id|>`…)
//! around each message's content. Encoding the rendered text as a whole
//! would also turn marker text *inside* a message into special tokens, so a
//! user could close their turn and open a forged `system` turn. Here the
//! content is located in the rendered text and encoded with special tokens
//! read as plain text; the template's own markers stay special. A prompt
//! whose content has no special-token text is encoded exactly as before.

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::Encoding;

use super::{Tokenizer, TokenizerError};

/// A matcher of every special token's text, built once per tokenizer.
#[derive(Clone, Debug)]
pub(super) struct SpecialTexts {
    texts: Vec<String>,
    matcher: AhoCorasick,
}

impl SpecialTexts {
    /// The special tokens of `tokenizer`.
    pub(super) fn of(tokenizer: &tokenizers::Tokenizer) -> Self {
        let texts: Vec<String> = tokenizer
            .get_added_tokens_decoder()
            .into_values()
            .filter(|t| t.special && !t.content.is_empty())
            .map(|t| t.content)
            .collect();
        let matcher = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&texts)
            .expect("literal patterns always build");
        Self { texts, matcher }
    }

    /// The first special token written in `text`, if any.
    fn first_in(&self, text: &str) -> Option<&str> {
        self.matcher
            .find(text)
            .map(|m| self.texts[m.pattern().as_usize()].as_str())
    }
}

impl Tokenizer {
    /// Token ids for a rendered chat prompt in which `contents` are the
    /// messages' contents, in order. Special-token text inside a content is
    /// encoded as plain text; special tokens elsewhere (the template's) are
    /// special. A content with special-token text that the template did not
    /// write out verbatim cannot be kept apart: it is refused.
    pub fn encode_chat(
        &self,
        rendered: &str,
        contents: &[&str],
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let specials = self.special_texts();
        let guarded: Vec<(usize, &str)> = contents
            .iter()
            .enumerate()
            .filter(|(_, c)| specials.first_in(c).is_some())
            .map(|(i, c)| (i, *c))
            .collect();
        if guarded.is_empty() {
            return self.encode(rendered, add_special_tokens);
        }
        // Where each guarded content lies, in order.
        let mut ranges = Vec::new();
        let mut cursor = 0;
        for (message, content) in guarded {
            let at = [content, content.trim()].into_iter().find_map(|c| {
                rendered[cursor..]
                    .find(c)
                    .map(|at| (cursor + at, cursor + at + c.len()))
            });
            let Some((start, end)) = at else {
                return Err(TokenizerError::SpecialTokenInContent {
                    message,
                    token: specials.first_in(content).unwrap_or_default().to_owned(),
                });
            };
            ranges.push((start, end));
            cursor = end;
        }
        let plain = self.plain();
        let encode = |tokenizer: &tokenizers::Tokenizer, text: &str| {
            tokenizer
                .encode_fast(text, false)
                .map_err(|e| TokenizerError::backend("cannot encode text", e))
        };
        let mut pieces: Vec<Encoding> = Vec::new();
        let mut from = 0;
        for (start, end) in ranges {
            pieces.push(encode(&self.inner, &rendered[from..start])?);
            pieces.push(encode(plain, &rendered[start..end])?);
            from = end;
        }
        pieces.push(encode(&self.inner, &rendered[from..])?);
        let merged = Encoding::merge(pieces, false);
        let encoding = self
            .inner
            .post_process(merged, None, add_special_tokens)
            .map_err(|e| TokenizerError::backend("cannot add special tokens", e))?;
        Ok(encoding.get_ids().to_vec())
    }
}
