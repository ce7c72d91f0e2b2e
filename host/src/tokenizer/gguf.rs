//! Building a tokenizer from a GGUF file's tokenizer metadata, the way
//! transformers does (`transformers/integrations/gguf/gguf_tokenizer_mapping.py`
//! plus the tokenizer classes it hands the vocabulary to), so that ids match
//! `AutoTokenizer.from_pretrained(dir, gguf_file=...)`.
//!
//! - `gpt2` vocabularies: byte-level BPE with the file's merges; tokens not
//!   spelled in the byte alphabet are respelled; the split regex comes from
//!   `tokenizer.ggml.pre` (GPT-2's when the type is not one transformers knows).
//! - `llama` (SentencePiece) vocabularies: BPE with byte fallback over merges
//!   rebuilt from the scores; Gemma files instead rebuild them from the token
//!   order, spell space runs with `▁`, and use Gemma's normalizer; Phi-3 puts the
//!   prefix space in the normalizer.
//! - Control tokens (type 3) become special added tokens, user-defined ones
//!   (type 4) plain added tokens, and the named BOS/EOS/UNK/PAD tokens are
//!   added as special tokens.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Deserialize;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{
    NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence,
};
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, Model, SplitDelimiterBehavior};

use super::{SpecialTokens, Tokenizer, TokenizerError};
use crate::checkpoint::gguf::{GgufArray, GgufValue};

/// The tokenizer metadata of a GGUF file (`tokenizer.ggml.*`), as plain values.
///
/// Field names follow the GGUF keys; it deserializes from a JSON object with
/// these field names (absent optional fields are `None`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GgufVocab {
    /// `general.architecture` (e.g. `llama`, `qwen2`, `gemma3`): transformers
    /// picks Gemma's and Phi-3's SentencePiece variants by architecture.
    #[serde(default)]
    pub architecture: Option<String>,
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer type (`smollm`, `qwen2`, `llama-bpe`, ...).
    #[serde(default)]
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte.
    #[serde(default)]
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.scores` (SentencePiece vocabularies).
    #[serde(default)]
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.merges`, each `"left right"` (byte-level vocabularies).
    #[serde(default)]
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    #[serde(default)]
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    #[serde(default)]
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    #[serde(default)]
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token` (SentencePiece vocabularies default to true).
    #[serde(default)]
    pub add_bos_token: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    #[serde(default)]
    pub add_eos_token: Option<bool>,
    /// `tokenizer.chat_template`.
    #[serde(default)]
    pub chat_template: Option<String>,
}

impl GgufVocab {
    /// The vocabulary in a GGUF file's metadata, read from its typed values
    /// (each array copied once, never through JSON: a 262k-token vocabulary
    /// is tens of megabytes as JSON values).
    pub fn from_metadata(metadata: &BTreeMap<String, GgufValue>) -> Result<Self, TokenizerError> {
        let read = Metadata(metadata);
        let required = |key: &str| TokenizerError::InvalidVocab(format!("`{key}` is missing"));
        Ok(Self {
            architecture: read.string("general.architecture")?,
            model: read
                .string("tokenizer.ggml.model")?
                .ok_or_else(|| required("tokenizer.ggml.model"))?,
            pre: read.string("tokenizer.ggml.pre")?,
            tokens: read
                .strings("tokenizer.ggml.tokens")?
                .ok_or_else(|| required("tokenizer.ggml.tokens"))?,
            token_types: read.array("tokenizer.ggml.token_type", "32-bit integers", int_array)?,
            scores: read.array("tokenizer.ggml.scores", "floats", float_array)?,
            merges: read.strings("tokenizer.ggml.merges")?,
            bos_token_id: read.id("tokenizer.ggml.bos_token_id")?,
            eos_token_id: read.id("tokenizer.ggml.eos_token_id")?,
            unknown_token_id: read.id("tokenizer.ggml.unknown_token_id")?,
            padding_token_id: read.id("tokenizer.ggml.padding_token_id")?,
            add_bos_token: read.value(
                "tokenizer.ggml.add_bos_token",
                "a bool",
                GgufValue::as_bool,
            )?,
            add_eos_token: read.value(
                "tokenizer.ggml.add_eos_token",
                "a bool",
                GgufValue::as_bool,
            )?,
            chat_template: read.string("tokenizer.chat_template")?,
        })
    }
}

/// Typed reads of GGUF metadata for [`GgufVocab::from_metadata`]: absent keys
/// are `None`, values of another type an error naming the key.
struct Metadata<'a>(&'a BTreeMap<String, GgufValue>);

impl Metadata<'_> {
    fn value<T>(
        &self,
        key: &str,
        expected: &str,
        read: impl Fn(&GgufValue) -> Option<T>,
    ) -> Result<Option<T>, TokenizerError> {
        let Some(value) = self.0.get(key) else {
            return Ok(None);
        };
        read(value).map(Some).ok_or_else(|| {
            let found = match value {
                GgufValue::Array(a) => format!("an array of {}", a.element_type()),
                other => other.type_name().to_owned(),
            };
            TokenizerError::InvalidVocab(format!("`{key}` is {found}, expected {expected}"))
        })
    }

    fn string(&self, key: &str) -> Result<Option<String>, TokenizerError> {
        self.value(key, "a string", |v| v.as_str().map(str::to_owned))
    }

    fn id(&self, key: &str) -> Result<Option<u32>, TokenizerError> {
        self.value(key, "a token id", |v| {
            v.as_u64().and_then(|id| u32::try_from(id).ok())
        })
    }

    fn array<T>(
        &self,
        key: &str,
        expected: &str,
        read: impl Fn(&GgufArray) -> Option<Vec<T>>,
    ) -> Result<Option<Vec<T>>, TokenizerError> {
        self.value(key, &format!("an array of {expected}"), |v| {
            v.as_array().and_then(&read)
        })
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
        self.array(key, "strings", |a| match a {
            GgufArray::String(v) => Some(v.clone()),
            _ => None,
        })
    }
}

/// An array of any integer type, each element within `i32`.
fn int_array(array: &GgufArray) -> Option<Vec<i32>> {
    fn each<T: Copy>(v: &[T]) -> Option<Vec<i32>>
    where
        i32: TryFrom<T>,
    {
        v.iter().map(|&x| i32::try_from(x).ok()).collect()
    }
    match array {
        GgufArray::I32(v) => Some(v.clone()),
        GgufArray::U8(v) => each(v),
        GgufArray::I8(v) => each(v),
        GgufArray::U16(v) => each(v),
        GgufArray::I16(v) => each(v),
        GgufArray::U32(v) => each(v),
        GgufArray::U64(v) => each(v),
        GgufArray::I64(v) => each(v),
        _ => None,
    }
}

/// An array of float32 (or float64, rounded to f32).
fn float_array(array: &GgufArray) -> Option<Vec<f32>> {
    match array {
        GgufArray::F32(v) => Some(v.clone()),
        GgufArray::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
        _ => None,
    }
}

const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// The SentencePiece word boundary marker.
const SPIECE: char = '\u{2581}';

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex transformers uses for a `tokenizer.ggml.pre` type
/// (`GGUF_PRE_TOKENIZER_SPLITS`); `None` keeps the tokenizer's own.
fn split_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// Which tokenizer transformers builds for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavour {
    /// `gpt2`: byte-level BPE (`GPT2Tokenizer`).
    ByteLevel,
    /// `llama`: SentencePiece BPE (`LlamaTokenizer`).
    SentencePiece,
    /// `llama` on a Gemma architecture (`GemmaTokenizer`).
    Gemma,
    /// `llama` on Phi-3.
    Phi3,
}

impl Flavour {
    fn of(vocab: &GgufVocab) -> Result<Self, TokenizerError> {
        let architecture = vocab.architecture.as_deref().unwrap_or_default();
        match vocab.model.as_str() {
            "gpt2" => Ok(Self::ByteLevel),
            "llama" => Ok(match architecture {
                "gemma" | "gemma2" | "gemma3" => Self::Gemma,
                "phi3" => Self::Phi3,
                _ => Self::SentencePiece,
            }),
            other => Err(TokenizerError::UnsupportedModel {
                model: other.to_owned(),
            }),
        }
    }
}

/// Builds the tokenizer a GGUF file describes, as transformers does.
pub fn tokenizer_from_gguf(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let flavour = Flavour::of(vocab)?;
    check_lengths(vocab)?;
    let spelled = spelled_tokens(vocab, flavour);
    // Like Python's `{token: index for ...}`: a repeated token keeps its last id.
    let ids: Vocab = spelled.iter().cloned().zip(0u32..).collect();
    let merges = match &vocab.merges {
        Some(merges) => parse_merges(merges)?,
        None => generate_merges(&spelled, &ids, merge_score(vocab, flavour)?),
    };
    drop(spelled);

    let model = build_model(ids, merges, flavour)?;
    let mut inner = tokenizers::Tokenizer::new(model);
    inner
        .with_normalizer(normalizer(flavour)?)
        .map_err(|e| TokenizerError::backend("cannot set the normalizer", e))?;
    inner.with_pre_tokenizer(pre_tokenizer(vocab.pre.as_deref(), flavour)?);
    inner.with_decoder(Some(decoder(flavour)?));

    add_tokens(&mut inner, vocab, flavour)?;
    let special = special_tokens(&mut inner, vocab, flavour)?;
    inner.with_post_processor(Some(special.post_processor()?));
    Ok(Tokenizer {
        inner,
        special,
        chat_template: vocab.chat_template.clone(),
        clean_up_spaces: false,
        derived: Default::default(),
    })
}

fn check_lengths(vocab: &GgufVocab) -> Result<(), TokenizerError> {
    if vocab.tokens.is_empty() {
        return Err(TokenizerError::InvalidVocab(
            "tokenizer.ggml.tokens is empty".into(),
        ));
    }
    let n = vocab.tokens.len();
    let mismatch = |what: &str, len: usize| {
        TokenizerError::InvalidVocab(format!("{what} has {len} entries for {n} tokens"))
    };
    match (&vocab.token_types, &vocab.scores) {
        (Some(types), _) if types.len() != n => {
            Err(mismatch("tokenizer.ggml.token_type", types.len()))
        }
        (_, Some(scores)) if scores.len() != n => {
            Err(mismatch("tokenizer.ggml.scores", scores.len()))
        }
        _ => Ok(()),
    }
}

/// The tokens as the model's vocabulary spells them.
fn spelled_tokens(vocab: &GgufVocab, flavour: Flavour) -> Vec<String> {
    match flavour {
        // Tokens must be written in the byte alphabet; respell those that are not.
        Flavour::ByteLevel => {
            let alphabet = ByteAlphabet::new();
            vocab
                .tokens
                .iter()
                .map(|t| {
                    if alphabet.spells(t) {
                        t.clone()
                    } else {
                        alphabet.respell(t)
                    }
                })
                .collect()
        }
        // Gemma files store space runs as spaces; the tokenizer looks them up as `▁▁..`.
        Flavour::Gemma => vocab
            .tokens
            .iter()
            .map(|t| {
                if t.contains(' ') && t.trim().is_empty() {
                    SPIECE.to_string().repeat(t.chars().count())
                } else {
                    t.clone()
                }
            })
            .collect(),
        Flavour::SentencePiece | Flavour::Phi3 => vocab.tokens.clone(),
    }
}

fn parse_merges(merges: &[String]) -> Result<Vec<(String, String)>, TokenizerError> {
    merges
        .iter()
        .enumerate()
        .map(|(i, merge)| match merge.split_once(' ') {
            Some((left, right)) if !right.contains(' ') => Ok((left.to_owned(), right.to_owned())),
            _ => Err(TokenizerError::InvalidVocab(format!(
                "tokenizer.ggml.merges[{i}] is not two tokens separated by a space: {merge:?}"
            ))),
        })
        .collect()
}

/// The score a token's merges are ranked by, as a function of the token's id
/// (the id of its last occurrence, as in a Python dict built from the list):
/// the file's score, or for Gemma (whose scores do not follow its merge
/// order) minus that position.
fn merge_score(
    vocab: &GgufVocab,
    flavour: Flavour,
) -> Result<impl Fn(u32) -> f64 + Sync + '_, TokenizerError> {
    let scores = match flavour {
        Flavour::Gemma => None,
        _ => Some(vocab.scores.as_deref().ok_or_else(|| {
            TokenizerError::InvalidVocab(
                "the file has neither tokenizer.ggml.merges nor tokenizer.ggml.scores".into(),
            )
        })?),
    };
    Ok(move |id: u32| match scores {
        Some(scores) => f64::from(scores[id as usize]),
        None => -f64::from(id),
    })
}

/// transformers' `generate_merges(vocab, vocab_scores)`: every split of every
/// token into two tokens of the vocabulary, best score first, then longer left
/// part, then longer right part; ties keep vocabulary order.
///
/// Works on ids and runs on the thread pool: Gemma's 262k tokens give about
/// half a million merges, and this was most of its start-up time.
fn generate_merges(
    tokens: &[String],
    ids: &Vocab,
    score: impl Fn(u32) -> f64 + Sync,
) -> Vec<(String, String)> {
    struct Candidate {
        left: u32,
        right: u32,
        score: f64,
        left_chars: u32,
        right_chars: u32,
    }
    // Python iterates the dict in first-insertion order, each token once.
    let mut seen = vec![false; tokens.len()];
    let firsts: Vec<(&str, u32)> = tokens
        .iter()
        .filter_map(|token| {
            let id = ids[token.as_str()];
            (!std::mem::replace(&mut seen[id as usize], true)).then_some((token.as_str(), id))
        })
        .collect();
    let mut candidates: Vec<Candidate> = firsts
        .par_iter()
        .flat_map_iter(|&(token, id)| {
            let score = score(id);
            let mut local: Vec<Candidate> = token
                .char_indices()
                .skip(1)
                .filter_map(|(at, _)| {
                    let (left, right) = token.split_at(at);
                    Some(Candidate {
                        left: *ids.get(left)?,
                        right: *ids.get(right)?,
                        score,
                        left_chars: left.chars().count() as u32,
                        right_chars: right.chars().count() as u32,
                    })
                })
                .collect();
            local.sort_by_key(|c| (c.left, c.right));
            local
        })
        .collect();
    // Python's `sorted(..., reverse=True)` is stable: equal keys keep their order.
    candidates.par_sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    candidates
        .into_par_iter()
        .map(|c| {
            (
                tokens[c.left as usize].clone(),
                tokens[c.right as usize].clone(),
            )
        })
        .collect()
}

fn build_model(
    vocab: Vocab,
    merges: Vec<(String, String)>,
    flavour: Flavour,
) -> Result<BPE, TokenizerError> {
    let builder = BPE::builder().vocab_and_merges(vocab, merges);
    let builder = match flavour {
        Flavour::ByteLevel => builder
            .continuing_subword_prefix(String::new())
            .end_of_word_suffix(String::new())
            .fuse_unk(false),
        Flavour::SentencePiece | Flavour::Phi3 => builder.fuse_unk(true).byte_fallback(true),
        Flavour::Gemma => builder
            .fuse_unk(true)
            .byte_fallback(true)
            .unk_token("<unk>".to_owned()),
    };
    builder
        .build()
        .map_err(|e| TokenizerError::backend("cannot build the BPE model", e))
}

fn normalizer(flavour: Flavour) -> Result<Option<NormalizerWrapper>, TokenizerError> {
    let replace = || {
        Replace::new(" ", SPIECE.to_string())
            .map_err(|e| TokenizerError::backend("cannot build the normalizer", e))
    };
    Ok(match flavour {
        Flavour::ByteLevel | Flavour::SentencePiece => None,
        Flavour::Gemma => Some(replace()?.into()),
        Flavour::Phi3 => Some(
            NormalizerSequence::new(vec![
                Prepend::new(SPIECE.to_string()).into(),
                replace()?.into(),
            ])
            .into(),
        ),
    })
}

fn pre_tokenizer(
    pre: Option<&str>,
    flavour: Flavour,
) -> Result<Option<PreTokenizerWrapper>, TokenizerError> {
    let split = |pattern: SplitPattern, behavior| {
        Split::new(pattern, behavior, false)
            .map_err(|e| TokenizerError::backend("cannot build the split pre-tokenizer", e))
    };
    if let Some(regex) = pre.and_then(split_regex) {
        return Ok(Some(
            PreTokenizerSequence::new(vec![
                split(
                    SplitPattern::Regex(regex.to_owned()),
                    SplitDelimiterBehavior::Isolated,
                )?
                .into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into(),
        ));
    }
    Ok(match flavour {
        Flavour::ByteLevel => Some(ByteLevel::new(false, true, true).into()),
        Flavour::SentencePiece => Some(Metaspace::new(SPIECE, PrependScheme::First, false).into()),
        Flavour::Gemma => Some(
            split(
                SplitPattern::String(" ".to_owned()),
                SplitDelimiterBehavior::MergedWithPrevious,
            )?
            .into(),
        ),
        Flavour::Phi3 => None,
    })
}

fn decoder(flavour: Flavour) -> Result<DecoderWrapper, TokenizerError> {
    if flavour == Flavour::ByteLevel {
        return Ok(ByteLevel::default().into());
    }
    let replace = Replace::new(SPIECE.to_string(), " ")
        .map_err(|e| TokenizerError::backend("cannot build the decoder", e))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    // `LlamaTokenizer` strips the prefix space; `GemmaTokenizer` adds none to strip.
    if flavour != Flavour::Gemma {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    Ok(DecoderSequence::new(decoders).into())
}

/// Control tokens as special added tokens, then user-defined tokens as plain
/// added tokens (`add_gguf_special_tokens`).
fn add_tokens(
    inner: &mut tokenizers::Tokenizer,
    vocab: &GgufVocab,
    flavour: Flavour,
) -> Result<(), TokenizerError> {
    let Some(types) = &vocab.token_types else {
        return Ok(());
    };
    let alphabet = (flavour == Flavour::ByteLevel).then(ByteAlphabet::new);
    let typed = |wanted: i32| {
        vocab
            .tokens
            .iter()
            .zip(types)
            .filter(move |(_, &kind)| kind == wanted)
            .map(|(token, _)| token)
    };
    // A byte-level control token spelled outside the byte alphabet is a
    // llama.cpp mislabel; transformers skips it.
    let special: Vec<AddedToken> = typed(CONTROL)
        .filter(|t| alphabet.as_ref().is_none_or(|a| a.spells(t)))
        .map(|t| AddedToken::from(t.as_str(), true).normalized(false))
        .collect();
    inner
        .add_special_tokens(special)
        .map_err(|e| TokenizerError::backend("cannot add the control tokens", e))?;
    let model = inner.get_model();
    let user: Vec<AddedToken> = typed(USER_DEFINED)
        .filter(|t| model.token_to_id(t).is_some())
        .map(|t| AddedToken::from(t.as_str(), false).normalized(false))
        .collect();
    inner
        .add_tokens(user)
        .map_err(|e| TokenizerError::backend("cannot add the user-defined tokens", e))?;
    Ok(())
}

/// The named special tokens, added as special tokens when they are not yet,
/// and the BOS/EOS flags, as transformers' tokenizer classes set them up.
fn special_tokens(
    inner: &mut tokenizers::Tokenizer,
    vocab: &GgufVocab,
    flavour: Flavour,
) -> Result<SpecialTokens, TokenizerError> {
    let token = |id: Option<u32>| -> Result<Option<String>, TokenizerError> {
        id.map(|id| {
            vocab.tokens.get(id as usize).cloned().ok_or_else(|| {
                TokenizerError::InvalidVocab(format!(
                    "special token id {id} is out of range for {} tokens",
                    vocab.tokens.len()
                ))
            })
        })
        .transpose()
    };
    let mut named = vec![
        token(vocab.bos_token_id)?,
        token(vocab.eos_token_id)?,
        token(vocab.unknown_token_id)?,
        token(vocab.padding_token_id)?,
    ];
    // `GemmaTokenizer` has a mask token by default, which the file does not override.
    if flavour == Flavour::Gemma {
        named.push(Some("<mask>".to_owned()));
    }
    let mut tokens =
        super::register_named_tokens(inner, &named, "cannot add the named special tokens")?
            .into_iter();
    let (bos, eos, unk, pad) = (
        tokens.next().flatten(),
        tokens.next().flatten(),
        tokens.next().flatten(),
        tokens.next().flatten(),
    );
    // Older SentencePiece files have no flag, and llama.cpp adds BOS to them.
    let add_bos_default = vocab.model == "llama";
    Ok(SpecialTokens {
        add_bos: vocab.add_bos_token.unwrap_or(add_bos_default) && bos.is_some(),
        add_eos: vocab.add_eos_token.unwrap_or(false) && eos.is_some(),
        bos,
        eos,
        unk,
        pad,
    })
}

/// GPT-2's byte-to-character alphabet (`bytes_to_unicode`).
struct ByteAlphabet {
    chars: [char; 256],
}

impl ByteAlphabet {
    fn new() -> Self {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut chars = ['\0'; 256];
        let mut next = 256u32;
        for byte in 0..=255u8 {
            chars[usize::from(byte)] = if printable(byte) {
                char::from(byte)
            } else {
                next += 1;
                // 256..=323: always a valid scalar value.
                char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
        }
        Self { chars }
    }

    /// Whether every character of `token` is in the alphabet.
    fn spells(&self, token: &str) -> bool {
        token.chars().all(|c| self.chars.contains(&c))
    }

    /// `token`'s UTF-8 bytes written in the alphabet.
    fn respell(&self, token: &str) -> String {
        token.bytes().map(|b| self.chars[usize::from(b)]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Typed metadata reads: integer arrays of any width, absent keys as
    /// `None`, and a value of the wrong type named in the error.
    #[test]
    fn vocab_from_typed_metadata() {
        let strings = |v: &[&str]| GgufArray::String(v.iter().map(|s| s.to_string()).collect());
        let mut metadata = BTreeMap::from([
            (
                "tokenizer.ggml.model".to_owned(),
                GgufValue::String("llama".into()),
            ),
            (
                "tokenizer.ggml.tokens".to_owned(),
                GgufValue::Array(strings(&["<unk>", "a"])),
            ),
            (
                "tokenizer.ggml.token_type".to_owned(),
                GgufValue::Array(GgufArray::U8(vec![2, 1])),
            ),
            (
                "tokenizer.ggml.scores".to_owned(),
                GgufValue::Array(GgufArray::F32(vec![0.0, -1.5])),
            ),
            ("tokenizer.ggml.bos_token_id".to_owned(), GgufValue::U32(1)),
            (
                "tokenizer.ggml.add_bos_token".to_owned(),
                GgufValue::Bool(false),
            ),
        ]);
        let vocab = GgufVocab::from_metadata(&metadata).unwrap();
        assert_eq!(vocab.model, "llama");
        assert_eq!(vocab.tokens, ["<unk>", "a"]);
        assert_eq!(vocab.token_types, Some(vec![2, 1]));
        assert_eq!(vocab.scores, Some(vec![0.0, -1.5]));
        assert_eq!((vocab.bos_token_id, vocab.eos_token_id), (Some(1), None));
        assert_eq!(vocab.add_bos_token, Some(false));
        assert_eq!(vocab.merges, None);

        metadata.insert(
            "tokenizer.ggml.scores".into(),
            GgufValue::Array(strings(&["x", "y"])),
        );
        let error = GgufVocab::from_metadata(&metadata).unwrap_err().to_string();
        assert!(
            error.contains(
                "`tokenizer.ggml.scores` is an array of string, expected an array of floats"
            ),
            "{error}"
        );
        metadata.remove("tokenizer.ggml.tokens");
        let error = GgufVocab::from_metadata(&metadata).unwrap_err().to_string();
        assert!(
            error.contains("`tokenizer.ggml.tokens` is missing"),
            "{error}"
        );
    }

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let alphabet = ByteAlphabet::new();
        assert_eq!(alphabet.respell(" "), "Ġ");
        assert_eq!(alphabet.respell("\n"), "Ċ");
        assert_eq!(alphabet.respell("é"), "Ã©");
        assert!(alphabet.spells("Ġhello"));
        assert!(!alphabet.spells("hello world"));
    }

    #[test]
    fn merges_follow_score_then_length() {
        let tokens: Vec<String> = ["a", "b", "ab", "abb", "bb"].map(String::from).to_vec();
        let ids: Vocab = tokens.iter().cloned().zip(0..).collect();
        let scores = [0.0, 0.0, -1.0, -2.0, -1.0];
        let merges = generate_merges(&tokens, &ids, |id| scores[id as usize]);
        let pairs: Vec<(&str, &str)> = merges
            .iter()
            .map(|(l, r)| (l.as_str(), r.as_str()))
            .collect();
        // "ab" and "bb" tie on score and lengths and keep vocabulary order;
        // "abb" = "ab"+"b" (longer left) before "a"+"bb".
        assert_eq!(pairs, [("a", "b"), ("b", "b"), ("ab", "b"), ("a", "bb")]);
    }

    #[test]
    fn bad_metadata_is_an_error() {
        let vocab = GgufVocab {
            model: "gpt2".into(),
            tokens: vec!["a".into(), "b".into()],
            merges: Some(vec!["ab".into()]),
            ..GgufVocab::default()
        };
        let err = tokenizer_from_gguf(&vocab).unwrap_err().to_string();
        assert!(err.contains("tokenizer.ggml.merges[0]"), "{err}");

        let vocab = GgufVocab {
            model: "bert".into(),
            tokens: vec!["a".into()],
            ..GgufVocab::default()
        };
        assert!(matches!(
            tokenizer_from_gguf(&vocab),
            Err(TokenizerError::UnsupportedModel { .. })
        ));

        let vocab = GgufVocab {
            model: "llama".into(),
            tokens: vec!["a".into()],
            bos_token_id: Some(7),
            scores: Some(vec![0.0]),
            ..GgufVocab::default()
        };
        let err = tokenizer_from_gguf(&vocab).unwrap_err().to_string();
        assert!(err.contains("out of range"), "{err}");
    }
}
