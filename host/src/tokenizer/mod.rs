//! Tokenizers and chat templates.
//!
//! A [`Tokenizer`] wraps a Hugging Face [`tokenizers::Tokenizer`] together with
//! what transformers keeps beside it: the named special tokens, whether BOS/EOS
//! are added, and the chat template. It comes from one of two places:
//!
//! - a GGUF file's tokenizer metadata ([`GgufVocab`], [`tokenizer_from_gguf`]),
//!   converted the way transformers' GGUF loader does it, so that token ids
//!   match `AutoTokenizer.from_pretrained(dir, gguf_file=...)`;
//! - a Hugging Face `tokenizer.json` with its `tokenizer_config.json`
//!   ([`Tokenizer::from_file`]).
//!
//! [`DecodeStream`] turns generated ids into text deltas as they arrive, and
//! [`ChatTemplate`] renders conversations with minijinja exactly like
//! transformers' `apply_chat_template`.

mod chat;
mod content;
mod gguf;
mod hf;
mod pyjson;
mod stream;

use std::path::PathBuf;
use std::sync::OnceLock;

use tokenizers::processors::template::TemplateProcessing;
use tokenizers::Model as _;

pub use self::chat::{ChatMessage, ChatRequest, ChatTemplate};
pub use self::gguf::{tokenizer_from_gguf, GgufVocab};
pub use self::stream::DecodeStream;

/// Why a tokenizer or chat template could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not the JSON it should be.
    #[error("{}: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A configuration file has a value of the wrong shape.
    #[error("{}: {message}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// GGUF tokenizer metadata that cannot describe a tokenizer.
    #[error("GGUF tokenizer metadata: {0}")]
    InvalidVocab(String),
    /// A GGUF tokenizer type this converter does not handle.
    #[error("unsupported GGUF tokenizer {model:?} (supported: \"gpt2\", \"llama\")")]
    UnsupportedModel {
        /// `tokenizer.ggml.model`.
        model: String,
    },
    /// The `tokenizers` library refused an operation.
    #[error("{context}: {source}")]
    Backend {
        /// What was being done.
        context: String,
        /// The library's error.
        source: tokenizers::Error,
    },
    /// Incremental decoding met a decoder whose output for more ids does not
    /// extend its output for fewer.
    #[error("incremental decoding: {text:?} does not continue {prefix:?}")]
    InvalidStream {
        /// The text decoded before.
        prefix: String,
        /// The text decoded now.
        text: String,
    },
    /// A chat template does not compile.
    #[error("invalid chat template: {0}")]
    TemplateSyntax(#[source] minijinja::Error),
    /// A chat template failed while rendering (including `raise_exception`).
    #[error("chat template failed: {0}")]
    TemplateRender(#[source] minijinja::Error),
    /// The final message cannot be continued (`continue_final_message`).
    #[error("continue_final_message: {0}")]
    ContinueFinalMessage(String),
    /// Chat template input (messages, tools, extra variables) is not valid JSON.
    #[error("invalid chat template input: {0}")]
    TemplateInput(#[source] serde_json::Error),
    /// A message's content has special-token text that the chat template
    /// did not write out as given, so it cannot be kept plain text.
    #[error("message {message} contains the special token `{token}`, which the chat template transformed; it cannot be kept as plain text")]
    SpecialTokenInContent {
        /// The message's index.
        message: usize,
        /// The special token's text.
        token: String,
    },
}

impl TokenizerError {
    fn backend(context: impl Into<String>, source: tokenizers::Error) -> Self {
        Self::Backend {
            context: context.into(),
            source,
        }
    }
}

/// A named special token: its text and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// The token's text, e.g. `<|im_end|>`.
    pub content: String,
    /// The token's id.
    pub id: u32,
}

/// The named special tokens, and whether encoding adds BOS/EOS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<SpecialToken>,
    /// End of sequence (the usual stop token).
    pub eos: Option<SpecialToken>,
    /// Unknown token.
    pub unk: Option<SpecialToken>,
    /// Padding token.
    pub pad: Option<SpecialToken>,
    /// Whether `encode(.., add_special_tokens: true)` prepends BOS.
    pub add_bos: bool,
    /// Whether `encode(.., add_special_tokens: true)` appends EOS.
    pub add_eos: bool,
}

impl SpecialTokens {
    /// The variables transformers passes to a chat template for these tokens
    /// (its `special_tokens_map`): `bos_token`, `eos_token`, `unk_token`,
    /// `pad_token`, for those that are set.
    pub fn template_variables(&self) -> Vec<(&'static str, String)> {
        [
            ("bos_token", &self.bos),
            ("eos_token", &self.eos),
            ("unk_token", &self.unk),
            ("pad_token", &self.pad),
        ]
        .into_iter()
        .filter_map(|(name, token)| token.as_ref().map(|t| (name, t.content.clone())))
        .collect()
    }

    /// The post-processor transformers installs for these flags
    /// (`TokenizersBackend.update_post_processor`): `[BOS] $A [EOS]`, and for
    /// pairs `[BOS] $A [EOS] [BOS] $B [EOS]`, each part only when enabled.
    fn post_processor(&self) -> Result<TemplateProcessing, TokenizerError> {
        let bos = self.bos.as_ref().filter(|_| self.add_bos);
        let eos = self.eos.as_ref().filter(|_| self.add_eos);
        let piece = |token: Option<&SpecialToken>, type_id: u8| {
            token.map(|t| format!("{}:{type_id}", t.content))
        };
        let sequence = |name: &str, type_id: u8| {
            [
                piece(bos, type_id),
                Some(format!("${name}:{type_id}")),
                piece(eos, type_id),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
        };
        let single = sequence("A", 0);
        let pair = [single.clone(), sequence("B", 1)].concat();
        let special: Vec<(String, u32)> = bos
            .into_iter()
            .chain(eos)
            .map(|t| (t.content.clone(), t.id))
            .collect();
        let invalid = |e: &dyn std::fmt::Display| {
            TokenizerError::InvalidVocab(format!("cannot build the BOS/EOS post-processor: {e}"))
        };
        let mut builder = TemplateProcessing::builder();
        builder.try_single(single).map_err(|e| invalid(&e))?;
        builder.try_pair(pair).map_err(|e| invalid(&e))?;
        builder.special_tokens(special);
        builder.build().map_err(|e| invalid(&e))
    }
}

/// A tokenizer: the `tokenizers` pipeline plus special tokens and chat template.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    chat_template: Option<String>,
    /// transformers' `clean_up_tokenization_spaces`, applied only to non-BPE
    /// models (transformers ignores it for BPE).
    clean_up_spaces: bool,
    /// What is derived from `inner` on first use.
    derived: Derived,
}

/// What a tokenizer derives once, when first needed.
#[derive(Debug, Clone, Default)]
struct Derived {
    /// The pipeline with special-token text read as plain text.
    plain: OnceLock<tokenizers::Tokenizer>,
    /// The special tokens' texts, as one matcher.
    specials: OnceLock<content::SpecialTexts>,
    /// The ids `decode` leaves out when it skips special tokens.
    skipped: OnceLock<std::collections::HashSet<u32>>,
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`, and the `tokenizer_config.json`
    /// (named special tokens, chat template, `clean_up_tokenization_spaces`)
    /// and `chat_template.jinja` beside it when present. As in transformers,
    /// BOS/EOS are added as the file's post-processor says.
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Self, TokenizerError> {
        hf::load(path.into())
    }

    /// Token ids for `text`; with `add_special_tokens`, BOS/EOS as configured.
    ///
    /// Special tokens written in the text (such as `<|im_start|>`) are
    /// recognised, as in transformers.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|e| TokenizerError::backend("cannot encode text", e))
    }

    /// Token ids and token types (segments) for the pair `first`, `second`,
    /// joined as the file's post-processor says (BERT's `[CLS] a [SEP] b
    /// [SEP]`, types 0 then 1; RoBERTa's `<s> a </s></s> b </s>`): what
    /// cross-encoders read, as transformers' `tokenizer(a, b)`.
    pub fn encode_pair(
        &self,
        first: &str,
        second: &str,
    ) -> Result<(Vec<u32>, Vec<u32>), TokenizerError> {
        self.inner
            .encode_fast((first, second), true)
            .map(|encoding| {
                (
                    encoding.get_ids().to_vec(),
                    encoding.get_type_ids().to_vec(),
                )
            })
            .map_err(|e| TokenizerError::backend("cannot encode a pair of texts", e))
    }

    /// The special tokens the post-processor adds to one text, or to a pair.
    pub fn added_special_tokens(&self, pair: bool) -> usize {
        use tokenizers::PostProcessor as _;
        self.inner
            .get_post_processor()
            .map_or(0, |processor| processor.added_tokens(pair))
    }

    /// The ids and token types of `first` (and `second`, as a pair) with
    /// special tokens, cut to `max_tokens` in all as transformers'
    /// `tokenizer(a, b, truncation=True, max_length=n)` cuts them: the
    /// longer text loses its last tokens first. `max_tokens` must leave room
    /// for a token besides the [special ones](Self::added_special_tokens).
    pub fn encode_truncated(
        &self,
        first: &str,
        second: Option<&str>,
        max_tokens: usize,
    ) -> Result<(Vec<u32>, Vec<u32>), TokenizerError> {
        use tokenizers::utils::truncation::{truncate_encodings, TruncationParams};
        let raw = |text: &str| {
            self.inner
                .encode_fast(text, false)
                .map_err(|e| TokenizerError::backend("cannot encode text", e))
        };
        let (first, second) = (raw(first)?, second.map(raw).transpose()?);
        let params = TruncationParams {
            max_length: max_tokens.saturating_sub(self.added_special_tokens(second.is_some())),
            ..TruncationParams::default()
        };
        let (first, second) = truncate_encodings(first, second, &params)
            .map_err(|e| TokenizerError::backend("cannot truncate", e))?;
        let encoding = self
            .inner
            .post_process(first, second, true)
            .map_err(|e| TokenizerError::backend("cannot add the special tokens", e))?;
        Ok((
            encoding.get_ids().to_vec(),
            encoding.get_type_ids().to_vec(),
        ))
    }

    /// The text for `ids`, optionally leaving out special tokens.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        let text = self
            .inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::backend("cannot decode ids", e))?;
        Ok(if self.clean_up_spaces {
            clean_up_tokenization(&text)
        } else {
            text
        })
    }

    /// Whether `decode` with `skip_special_tokens` leaves `id` out: its
    /// token's text is a special token's (the test `tokenizers` makes per
    /// id; the detokenizer asks it of every generated token, so the ids are
    /// found once: the added tokens and the model's ids of special texts).
    pub fn skips_when_decoding(&self, id: u32) -> bool {
        self.derived
            .skipped
            .get_or_init(|| {
                let added = self.inner.get_added_vocabulary();
                let tokens = self.inner.get_added_tokens_decoder();
                let model = self.inner.get_model();
                let specials = tokens.values().filter(|t| t.special);
                tokens
                    .keys()
                    .copied()
                    .chain(specials.filter_map(|t| model.token_to_id(&t.content)))
                    .filter(|&id| {
                        self.inner
                            .id_to_token(id)
                            .is_some_and(|token| added.is_special_token(&token))
                    })
                    .collect()
            })
            .contains(&id)
    }

    /// An incremental detokenizer for generated ids.
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream<'_> {
        DecodeStream::new(self, skip_special_tokens)
    }

    /// The named special tokens and the BOS/EOS flags.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// The chat template's source, if the tokenizer has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The compiled chat template with this tokenizer's special tokens, if it
    /// has one.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, TokenizerError> {
        self.chat_template
            .as_deref()
            .map(|source| self.chat_template_from(source))
            .transpose()
    }

    /// `source` compiled as a chat template with this tokenizer's special
    /// tokens (a template given instead of the model's).
    pub fn chat_template_from(&self, source: &str) -> Result<ChatTemplate, TokenizerError> {
        ChatTemplate::new(source).map(|t| t.with_variables(self.special.template_variables()))
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The most bytes of text one token can stand for, bounded by the
    /// longest token string (a byte-level token's string is at least as
    /// long as its bytes; a SentencePiece `▁` is longer than its space).
    pub fn longest_token_bytes(&self) -> usize {
        self.inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// The id of a token, added tokens included.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token with an id, added tokens included.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// A tokenizer for a model that has none (`host benchmark --shape`):
    /// `vocab_size` word-level tokens named `<id>`, no special tokens and no
    /// chat template. Only ids pass through it.
    pub fn placeholder(vocab_size: u32) -> Result<Self, TokenizerError> {
        let vocab = (0..vocab_size).map(|id| (format!("<{id}>"), id)).collect();
        let model = tokenizers::models::wordlevel::WordLevel::builder()
            .vocab(vocab)
            .unk_token("<0>".to_owned())
            .build()
            .map_err(|e| TokenizerError::backend("cannot build a placeholder vocabulary", e))?;
        Ok(Self {
            inner: tokenizers::Tokenizer::new(model),
            special: SpecialTokens::default(),
            chat_template: None,
            clean_up_spaces: false,
            derived: Derived::default(),
        })
    }

    /// The underlying `tokenizers` pipeline.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The pipeline with special-token text (`<|im_end|>`) read as plain
    /// text, made on first use.
    pub fn plain(&self) -> &tokenizers::Tokenizer {
        self.derived.plain.get_or_init(|| {
            let mut plain = self.inner.clone();
            plain.set_encode_special_tokens(true);
            plain
        })
    }

    fn special_texts(&self) -> &content::SpecialTexts {
        self.derived
            .specials
            .get_or_init(|| content::SpecialTexts::of(&self.inner))
    }
}

/// transformers' `clean_up_tokenization`: drops the spaces that WordPiece-style
/// decoding leaves before punctuation and contractions.
fn clean_up_tokenization(text: &str) -> String {
    [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ]
    .into_iter()
    .fold(text.to_owned(), |text, (from, to)| text.replace(from, to))
}

/// Adds the named special tokens (BOS, EOS, …) the vocabulary lacks as special
/// added tokens, and returns each one's text and id, in the order given.
fn register_named_tokens(
    inner: &mut tokenizers::Tokenizer,
    named: &[Option<String>],
    context: &'static str,
) -> Result<Vec<Option<SpecialToken>>, TokenizerError> {
    let missing: Vec<tokenizers::AddedToken> = named
        .iter()
        .flatten()
        .filter(|t| {
            !inner
                .get_added_vocabulary()
                .get_vocab()
                .contains_key(t.as_str())
        })
        .map(|t| tokenizers::AddedToken::from(t.as_str(), true))
        .collect();
    inner
        .add_tokens(missing)
        .map_err(|e| TokenizerError::backend(context, e))?;
    Ok(named
        .iter()
        .map(|content| {
            let content = content.as_ref()?;
            inner.token_to_id(content).map(|id| SpecialToken {
                content: content.clone(),
                id,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_up_matches_transformers() {
        assert_eq!(
            clean_up_tokenization("Hello , world ! I 'm sure it 's fine . Do n't ' ok"),
            "Hello, world! I'm sure it's fine. Don't'ok"
        );
    }
}
