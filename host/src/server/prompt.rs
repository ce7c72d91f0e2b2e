//! Requests to token ids, with the work bounded before any is done: message
//! roles and contents are checked, the number of sequences a request makes
//! is capped, a text too long for the context is refused by its size before
//! it is tokenized, and tokenizing runs on the blocking pool, never on the
//! threads that answer other requests.

use std::sync::Arc;

use super::openai::{ApiError, InMessage, Prompt};
use super::AppState;
use crate::tokenizer::{ChatMessage, TokenizerError};

/// Roles a message may have (the chat template decides what each means).
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// Refuses a request that would make more than the server's
/// `--max-seqs-per-request` sequences (`prompts` × `n`).
pub fn check_sequences(state: &AppState, prompts: usize, n: usize) -> Result<(), ApiError> {
    let limit = state.limits.max_seqs_per_request;
    if prompts.saturating_mul(n) > limit {
        return Err(ApiError::invalid(
            format!(
                "this request makes {prompts} prompt(s) × n {n} = {} sequences; the server allows at most {limit} per request",
                prompts.saturating_mul(n)
            ),
            Some("n"),
        ));
    }
    Ok(())
}

/// Refuses text of `bytes` bytes that must be longer than the context:
/// every token stands for at most [`Limits::max_prompt_bytes`]'s share.
///
/// [`Limits::max_prompt_bytes`]: super::openai::Limits::max_prompt_bytes
fn check_size(state: &AppState, bytes: usize, param: &str) -> Result<(), ApiError> {
    if bytes > state.limits.max_prompt_bytes {
        return Err(ApiError::invalid(
            format!(
                "the prompt is {bytes} bytes, more than {} tokens of this model's maximum context length can hold",
                state.limits.max_model_len
            ),
            Some(param),
        ));
    }
    Ok(())
}

/// Runs `work` on the blocking pool.
pub(super) async fn off_the_async_threads<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
}

/// The messages as the chat template takes them, after checking each one's
/// role and content.
fn chat_messages(messages: &[InMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ApiError::invalid(
                    format!(
                        "messages[{i}].role is {:?}; it must be one of {}",
                        m.role,
                        ROLES.join(", ")
                    ),
                    Some("messages"),
                ));
            }
            let Some(text) = m.text()? else {
                return Err(ApiError::invalid(
                    format!("messages[{i}] ({}) has no content", m.role),
                    Some("messages"),
                ));
            };
            Ok(ChatMessage::new(m.role.as_str(), text))
        })
        .collect()
}

/// `messages` through the chat template, then to token ids (the template
/// writes the special tokens; `add_special_tokens` adds the tokenizer's
/// own). Special-token text in a message's content stays plain text unless
/// the server allows it (`--allow-special-tokens-in-messages`).
pub async fn chat_prompt(
    state: &Arc<AppState>,
    messages: &[InMessage],
    add_generation_prompt: bool,
    add_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    if state.chat_template.is_none() {
        return Err(ApiError::invalid(
            "this model has no chat template; use /v1/completions",
            None,
        ));
    }
    let messages = chat_messages(messages)?;
    check_size(
        state,
        messages.iter().map(|m| m.content.len()).sum(),
        "messages",
    )?;
    let state = state.clone();
    off_the_async_threads(move || {
        let template = state.chat_template.as_ref().expect("checked above");
        let rendered = template
            .render(&messages, add_generation_prompt)
            .map_err(|e| ApiError::invalid(format!("chat template: {e}"), Some("messages")))?;
        let encoded = if state.limits.allow_special_tokens_in_messages {
            state.tokenizer.encode(&rendered, add_special_tokens)
        } else {
            let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
            state
                .tokenizer
                .encode_chat(&rendered, &contents, add_special_tokens)
        };
        encoded.map_err(|e| match e {
            TokenizerError::SpecialTokenInContent { .. } => {
                ApiError::invalid(e.to_string(), Some("messages"))
            }
            e => ApiError::internal(e.to_string()),
        })
    })
    .await
}

/// The token ids of each of a completion request's prompts, after the
/// sequence cap (`n` choices each) and the size check.
pub async fn completion_prompts(
    state: &Arc<AppState>,
    prompt: &Prompt,
    n: usize,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let count = match prompt {
        Prompt::Text(_) | Prompt::Ids(_) => 1,
        Prompt::Texts(texts) => texts.len(),
        Prompt::IdLists(lists) => lists.len(),
    };
    if count == 0 {
        return Err(ApiError::invalid(
            "prompt must not be empty",
            Some("prompt"),
        ));
    }
    check_sequences(state, count, n)?;
    let prompts = match prompt {
        Prompt::Ids(ids) => vec![ids.clone()],
        Prompt::IdLists(lists) => lists.clone(),
        Prompt::Text(text) => tokenize(state, vec![text.clone()], true).await?,
        Prompt::Texts(texts) => tokenize(state, texts.clone(), true).await?,
    };
    for prompt in &prompts {
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= state.vocab_size) {
            return Err(ApiError::invalid(
                format!(
                    "token id {bad} is outside the vocabulary of {}",
                    state.vocab_size
                ),
                Some("prompt"),
            ));
        }
    }
    Ok(prompts)
}

/// Prompt texts to ids (special-token text in them is read as special
/// tokens: a completion prompt is the client's own raw prompt);
/// `add_special_tokens` adds BOS/EOS as the tokenizer is configured.
pub async fn tokenize(
    state: &Arc<AppState>,
    texts: Vec<String>,
    add_special_tokens: bool,
) -> Result<Vec<Vec<u32>>, ApiError> {
    for text in &texts {
        check_size(state, text.len(), "prompt")?;
    }
    let state = state.clone();
    off_the_async_threads(move || {
        texts
            .iter()
            .map(|t| {
                state
                    .tokenizer
                    .encode(t, add_special_tokens)
                    .map_err(|e| ApiError::internal(e.to_string()))
            })
            .collect()
    })
    .await
}
