//! Loading a Hugging Face `tokenizer.json` with its `tokenizer_config.json`.
//!
//! As transformers does for a tokenizer with a `tokenizer.json`: the pipeline
//! (and so whether BOS/EOS are added) is the file's, since transformers drops
//! `add_bos_token`/`add_eos_token` from the config when that file exists; the
//! named special tokens of the config are added as special tokens when the file
//! does not have them; the chat template comes from `chat_template.jinja`, or
//! else the config. (transformers' model-specific tokenizer classes may
//! rebuild the pipeline instead; this follows the file.)

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{SpecialTokens, Tokenizer, TokenizerError};

const CONFIG_FILE: &str = "tokenizer_config.json";
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// transformers' `SPECIAL_TOKENS_ATTRIBUTES`, in its order.
const NAMED_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

pub(super) fn load(path: PathBuf) -> Result<Tokenizer, TokenizerError> {
    let bytes = fs::read(&path).map_err(|source| TokenizerError::Io {
        path: path.clone(),
        source,
    })?;
    let mut inner = tokenizers::Tokenizer::from_bytes(bytes)
        .map_err(|e| TokenizerError::backend(format!("cannot load {}", path.display()), e))?;
    // As transformers encodes by default: no padding and no truncation, even
    // where the file sets them (sentence-transformers' files pad to 128).
    inner.with_padding(None);
    inner
        .with_truncation(None)
        .map_err(|e| TokenizerError::backend("cannot turn truncation off", e))?;
    let dir = path.parent().unwrap_or(Path::new(""));
    let config_path = dir.join(CONFIG_FILE);
    let config = read_config(&config_path)?;
    let token = |name: &str| token_content(&config_path, name, config.get(name));

    let mut named = Vec::new();
    for name in NAMED_TOKENS {
        named.push(token(name)?);
    }
    for key in ["additional_special_tokens", "extra_special_tokens"] {
        if let Some(Value::Array(tokens)) = config.get(key) {
            for value in tokens {
                named.push(token_content(&config_path, key, Some(value))?);
            }
        }
    }
    let tokens = super::register_named_tokens(
        &mut inner,
        &named,
        "cannot add the configured special tokens",
    )?;
    let token = |i: usize| tokens.get(i).cloned().flatten();
    let (bos, eos, unk, pad) = (token(0), token(1), token(2), token(4));
    // What the file's post-processor adds around a text.
    let framing = inner
        .encode_fast("", true)
        .map_err(|e| TokenizerError::backend("cannot encode an empty text", e))?;
    let framing = framing.get_ids();
    let special = SpecialTokens {
        add_bos: bos.as_ref().is_some_and(|b| framing.first() == Some(&b.id)),
        add_eos: eos.as_ref().is_some_and(|e| framing.last() == Some(&e.id)),
        bos,
        eos,
        unk,
        pad,
    };

    let clean_up_spaces = config
        .get("clean_up_tokenization_spaces")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        && !matches!(inner.get_model(), tokenizers::models::ModelWrapper::BPE(_));
    Ok(Tokenizer {
        inner,
        special,
        chat_template: chat_template(dir, &config_path, &config)?,
        clean_up_spaces,
        derived: Default::default(),
    })
}

/// The config object, or an empty one when there is no config file.
fn read_config(path: &Path) -> Result<Map<String, Value>, TokenizerError> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(source) => {
            return Err(TokenizerError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(TokenizerError::Config {
            path: path.to_owned(),
            message: "not a JSON object".into(),
        }),
        Err(source) => Err(TokenizerError::Json {
            path: path.to_owned(),
            source,
        }),
    }
}

/// A special token entry: a string, an `AddedToken` object, or null.
fn token_content(
    path: &Path,
    name: &str,
    value: Option<&Value>,
) -> Result<Option<String>, TokenizerError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizerError::Config {
                path: path.to_owned(),
                message: format!("{name} has no string \"content\""),
            }),
        },
        Some(other) => Err(TokenizerError::Config {
            path: path.to_owned(),
            message: format!("{name} is neither a string nor a token object: {other}"),
        }),
    }
}

/// `chat_template.jinja` if present, else the config's `chat_template`: a
/// string, or a list of `{name, template}` of which the one named `default`.
fn chat_template(
    dir: &Path,
    config_path: &Path,
    config: &Map<String, Value>,
) -> Result<Option<String>, TokenizerError> {
    let file = dir.join(CHAT_TEMPLATE_FILE);
    match fs::read_to_string(&file) {
        Ok(text) => return Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(TokenizerError::Io { path: file, source }),
    }
    let invalid = |message: &str| TokenizerError::Config {
        path: config_path.to_owned(),
        message: message.to_owned(),
    };
    match config.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(templates)) => {
            for entry in templates {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(template)) => return Ok(Some(template.to_owned())),
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(invalid(
                            "chat_template entries need a string name and template",
                        ))
                    }
                }
            }
            Ok(None)
        }
        Some(_) => Err(invalid(
            "chat_template is neither a string nor a list of named templates",
        )),
    }
}
