//! Structured output with llguidance: a grammar (a JSON schema, any JSON
//! object, a regular expression, a choice of strings or a Lark grammar)
//! becomes a [`Matcher`] per sequence, which gives the set of tokens that
//! keep the output inside the grammar before each step and takes each
//! sampled token after it. The engine turns that set into the row's
//! allowed-token mask, so it holds in every sampling mode and on every
//! backend.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::tokenizer::Tokenizer;

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON document valid under this schema.
    JsonSchema(serde_json::Value),
    /// A regular expression (the whole output matches it).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar (llguidance's dialect).
    Lark(String),
}

impl Grammar {
    /// Any JSON object (`response_format: json_object`).
    pub fn json_object() -> Self {
        Grammar::JsonSchema(serde_json::json!({"type": "object"}))
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(schema) => {
                // Compact JSON, as OpenAI writes it: whitespace between
                // tokens would let a model pad the output forever inside
                // the grammar. A schema's own `x-guidance` decides otherwise.
                let mut schema = schema.clone();
                if let Some(fields) = schema.as_object_mut() {
                    fields
                        .entry("x-guidance")
                        .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            Grammar::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Grammar::Choice(choices) => {
                let alternatives: Vec<String> = choices.iter().map(|c| regex_escape(c)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
            }
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        }
    }
}

/// `text` as a regular expression that matches only itself.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The model's vocabulary as llguidance sees it: each token's bytes in a
/// trie, and the tokenizer for text llguidance must tokenize itself (with
/// special-token text read as plain text).
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .plain()
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// Builds matchers for one model: the token trie is made once, on first
/// use (tens of milliseconds for a 50k vocabulary).
pub struct Grammars {
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    vocab_size: usize,
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl Grammars {
    /// Grammars over `tokenizer`'s tokens, for logits rows of `vocab_size`
    /// (rows beyond the tokenizer's vocabulary are never allowed); the
    /// grammar's end allows the `eos` tokens.
    pub fn new(tokenizer: Arc<Tokenizer>, eos: Vec<u32>, vocab_size: usize) -> Self {
        Self {
            tokenizer,
            eos,
            vocab_size,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| {
                let env = self.environment()?;
                let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                factory.quiet();
                Ok(factory)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn environment(&self) -> Result<TokEnv, String> {
        let inner = self.tokenizer.inner();
        let json: serde_json::Value = serde_json::from_str(
            &inner
                .to_string(false)
                .map_err(|e| format!("the tokenizer cannot be described: {e}"))?,
        )
        .map_err(|e| e.to_string())?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| format!("structured output needs each token's bytes: {e}"))?;
        // Logits rows the tokenizer has no token for: never allowed.
        while words.len() < self.vocab_size {
            let mut name = format!(".<[{}]>", words.len()).into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(name);
        }
        let eos = *self
            .eos
            .first()
            .ok_or("structured output needs an end-of-sequence token")?;
        let info = TokRxInfo::new(words.len() as u32, eos);
        let mut trie = TokTrie::from(&info, &words);
        if self.eos.len() > 1 {
            trie = trie.with_eos_tokens(&self.eos);
        }
        Ok(Arc::new(Vocabulary {
            trie,
            tokenizer: self.tokenizer.clone(),
        }))
    }

    /// A matcher for `grammar`, or why the grammar is not valid.
    pub fn matcher(&self, grammar: &Grammar) -> Result<Matcher, String> {
        let factory = self.factory()?;
        let parser = factory.create_parser(grammar.top_level());
        let matcher = Matcher::new(parser);
        match matcher.get_error() {
            Some(error) => Err(error),
            None => Ok(matcher),
        }
    }
}

/// The tokens `matcher` allows next, as a bit mask of `u32` words over the
/// vocabulary (bit `t % 32` of word `t / 32`).
pub fn allowed_tokens(matcher: &mut Matcher) -> Result<Vec<u32>, String> {
    let mask = matcher.compute_mask().map_err(|e| e.to_string())?;
    let words: &[u32] = mask.as_slice();
    Ok(words.to_vec())
}

/// A request's structured output: the grammar's matcher, and the text the
/// output must show before the grammar applies (a reasoning model's
/// `</think>`: vLLM constrains only the answer), from the token after the
/// one that completes it; with none, from the first token.
pub struct Constraint {
    pub matcher: Matcher,
    pub after: Option<String>,
}

impl Constraint {
    /// `matcher` from the first token.
    pub fn new(matcher: Matcher) -> Self {
        Self {
            matcher,
            after: None,
        }
    }

    /// An independent copy (each choice of a request advances its own).
    pub fn deep_clone(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            after: self.after.clone(),
        }
    }
}
