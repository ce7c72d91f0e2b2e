//! Requests to token ids, with the work bounded before any is done: message
//! roles and contents are checked, the number of sequences a request makes
//! is capped, a text too long for the context is refused by its size before
//! it is tokenized, and tokenizing runs on the blocking pool, never on the
//! threads that answer other requests.

use std::sync::Arc;

use serde_json::{json, Value};

use super::openai::{ApiError, InMessage, Prompt};
use super::{tools, AppState};
use crate::embedding::EncoderText;
use crate::tokenizer::{ChatMessage, ChatRequest, TokenizerError};

/// Roles a message may have (the chat template decides what each means).
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// How a conversation goes through the chat template: vLLM's
/// `add_generation_prompt`, `continue_final_message` and
/// `chat_template_kwargs`.
#[derive(Clone, Debug)]
pub struct TemplateOptions {
    /// End with the assistant's header.
    pub add_generation_prompt: bool,
    /// End where the final message's text does, for the model to continue.
    pub continue_final_message: bool,
    /// Extra template variables, a JSON object's text.
    pub kwargs: Option<String>,
}

impl TemplateOptions {
    /// From a request's fields (a generation prompt unless asked not to).
    /// Continuing the final message with a generation prompt after it is
    /// refused, as transformers refuses it.
    pub fn new(
        add_generation_prompt: Option<bool>,
        continue_final_message: bool,
        kwargs: Option<&serde_json::Map<String, Value>>,
    ) -> Result<Self, ApiError> {
        let add_generation_prompt = add_generation_prompt.unwrap_or(true);
        if continue_final_message && add_generation_prompt {
            return Err(ApiError::invalid(
                "cannot both continue the final message and add a generation prompt after it: \
                 send add_generation_prompt false with continue_final_message true",
                Some("continue_final_message"),
            ));
        }
        Ok(Self {
            add_generation_prompt,
            continue_final_message,
            kwargs: kwargs.map(|k| Value::from(k.clone()).to_string()),
        })
    }

    /// Whether the plain `{role, content}` rendering cannot do it.
    fn needs_json(&self) -> bool {
        self.continue_final_message || self.kwargs.is_some()
    }
}

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

/// A message's role and text after checking them; `None` text for an
/// assistant message that only calls tools.
fn checked_text(i: usize, m: &InMessage) -> Result<Option<String>, ApiError> {
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
    let calls = m.role == "assistant" && m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
    match m.text()? {
        Some(text) => Ok(Some(text)),
        None if calls => Ok(None),
        None => Err(ApiError::invalid(
            format!("messages[{i}] ({}) has no content", m.role),
            Some("messages"),
        )),
    }
}

/// The conversation as the template takes it: plain `{role, content}`
/// messages, or (with tools, tool calls or tool answers) JSON messages
/// with the tools beside them.
enum Conversation {
    Plain(Vec<ChatMessage>),
    Json {
        messages: String,
        tools: Option<String>,
    },
}

fn conversation(
    messages: &[InMessage],
    tools: Option<&[Value]>,
    as_json: bool,
) -> Result<(Conversation, Vec<String>), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let texts = messages
        .iter()
        .enumerate()
        .map(|(i, m)| checked_text(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    // Every text a client wrote, in the order templates write them (an
    // assistant's thinking before its answer), so none is read as special
    // tokens.
    let thinking = messages
        .iter()
        .map(InMessage::thinking)
        .collect::<Result<Vec<_>, _>>()?;
    let contents: Vec<String> = thinking
        .iter()
        .zip(&texts)
        .flat_map(|(thinking, text)| thinking.map(str::to_owned).into_iter().chain(text.clone()))
        .collect();
    let with_tools = as_json
        || tools.is_some()
        || thinking.iter().any(Option::is_some)
        || messages
            .iter()
            .any(|m| m.tool_calls.is_some() || m.tool_call_id.is_some());
    if !with_tools {
        let plain = messages
            .iter()
            .zip(texts)
            .map(|(m, text)| ChatMessage::new(m.role.as_str(), text.unwrap_or_default()))
            .collect();
        return Ok((Conversation::Plain(plain), contents));
    }
    let json: Vec<Value> = messages
        .iter()
        .zip(texts)
        .zip(thinking)
        .map(|((m, text), thinking)| {
            let mut message = json!({"role": m.role, "content": text});
            if let Some(calls) = &m.tool_calls {
                message["tool_calls"] = Value::from(calls.clone());
            }
            if let Some(id) = &m.tool_call_id {
                message["tool_call_id"] = Value::from(id.as_str());
            }
            if let Some(thinking) = thinking {
                message["reasoning_content"] = Value::from(thinking);
            }
            message
        })
        .collect();
    let messages = Value::from(tools::template_messages(&json)).to_string();
    let tools = tools.map(|t| Value::from(t.to_vec()).to_string());
    Ok((Conversation::Json { messages, tools }, contents))
}

/// `messages` (and the `tools` they may call) through the chat template,
/// then to token ids (the template writes the special tokens;
/// `add_special_tokens` adds the tokenizer's own). Special-token text in a
/// message's content stays plain text unless the server allows it
/// (`--allow-special-tokens-in-messages`).
pub async fn chat_prompt(
    state: &Arc<AppState>,
    messages: &[InMessage],
    tools: Option<&[Value]>,
    options: &TemplateOptions,
    add_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    if state.chat_template.is_none() {
        return Err(ApiError::invalid(
            "this model has no chat template; use /v1/completions",
            None,
        ));
    }
    let (conversation, contents) = conversation(messages, tools, options.needs_json())?;
    check_size(state, contents.iter().map(String::len).sum(), "messages")?;
    let (state, options) = (state.clone(), options.clone());
    off_the_async_threads(move || {
        let template = state.chat_template.as_ref().expect("checked above");
        let add_generation_prompt = options.add_generation_prompt;
        let rendered = match &conversation {
            Conversation::Plain(messages) => template.render(messages, add_generation_prompt),
            Conversation::Json { messages, tools } => template.render_request(&ChatRequest {
                messages,
                tools: tools.as_deref(),
                add_generation_prompt,
                variables: options.kwargs.as_deref(),
                continue_final_message: options.continue_final_message,
                ..ChatRequest::default()
            }),
        }
        .map_err(|e| {
            let param = match e {
                TokenizerError::ContinueFinalMessage(_) => "continue_final_message",
                _ => "messages",
            };
            ApiError::invalid(format!("chat template: {e}"), Some(param))
        })?;
        let encoded = if state.limits.allow_special_tokens_in_messages {
            state.tokenizer.encode(&rendered, add_special_tokens)
        } else {
            let contents: Vec<&str> = contents.iter().map(String::as_str).collect();
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
/// sequence cap (`n` choices each) and the size check; `add_special_tokens`
/// adds BOS/EOS to text prompts as the tokenizer is configured.
pub async fn completion_prompts(
    state: &Arc<AppState>,
    prompt: &Prompt,
    n: usize,
    add_special_tokens: bool,
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
        Prompt::Text(text) => tokenize(state, vec![text.clone()], add_special_tokens).await?,
        Prompt::Texts(texts) => tokenize(state, texts.clone(), add_special_tokens).await?,
    };
    for prompt in &prompts {
        check_vocabulary(state, prompt, "prompt")?;
    }
    Ok(prompts)
}

/// Refuses token ids outside the vocabulary, naming the request field.
pub fn check_vocabulary(state: &AppState, ids: &[u32], param: &str) -> Result<(), ApiError> {
    match ids.iter().find(|&&t| t as usize >= state.vocab_size) {
        Some(bad) => Err(ApiError::invalid(
            format!(
                "token id {bad} is outside the vocabulary of {}",
                state.vocab_size
            ),
            Some(param),
        )),
        None => Ok(()),
    }
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

/// An encoder's inputs: each a text, or a pair of texts read together as a
/// cross-encoder reads them ([`crate::tokenizer::Tokenizer::encode_pair`]),
/// cut to `truncate` tokens when given
/// ([`crate::tokenizer::Tokenizer::encode_truncated`]).
pub async fn encoder_inputs(
    state: &Arc<AppState>,
    texts: Vec<(String, Option<String>)>,
    truncate: Option<usize>,
) -> Result<Vec<EncoderText>, ApiError> {
    for (first, second) in &texts {
        check_size(
            state,
            first.len() + second.as_ref().map_or(0, String::len),
            "input",
        )?;
    }
    let state = state.clone();
    off_the_async_threads(move || {
        texts
            .iter()
            .map(|(first, second)| {
                let tokenizer = &state.tokenizer;
                let encoded = match (second, truncate) {
                    (_, Some(max)) => tokenizer.encode_truncated(first, second.as_deref(), max),
                    (Some(second), None) => tokenizer.encode_pair(first, second),
                    (None, None) => tokenizer.encode(first, true).map(|ids| (ids, Vec::new())),
                };
                let (tokens, token_types) =
                    encoded.map_err(|e| ApiError::internal(e.to_string()))?;
                Ok(EncoderText {
                    tokens,
                    token_types,
                })
            })
            .collect()
    })
    .await
}

/// vLLM's `bad_words` as token sequences whose last token is banned where
/// the output so far ends with the rest: each word (leading space trimmed)
/// as tokenized alone, and after a space where that is another sequence of
/// the same length, as vLLM reads them.
pub async fn bad_words(state: &Arc<AppState>, words: &[String]) -> Result<Vec<Vec<u32>>, ApiError> {
    if words.is_empty() {
        return Ok(Vec::new());
    }
    check_size(state, words.iter().map(String::len).sum(), "bad_words")?;
    if words.iter().any(|w| w.trim_start().is_empty()) {
        return Err(ApiError::invalid(
            "bad_words has an empty word",
            Some("bad_words"),
        ));
    }
    let (state, words) = (state.clone(), words.to_vec());
    off_the_async_threads(move || {
        let encode = |text: &str| {
            state
                .tokenizer
                .encode(text, false)
                .map_err(|e| ApiError::internal(e.to_string()))
        };
        let mut sequences = Vec::new();
        for word in &words {
            let word = word.trim_start();
            let alone = encode(word)?;
            let spaced = encode(&format!(" {word}"))?;
            let another = spaced.first() != alone.first() && spaced.len() == alone.len();
            sequences.push(alone);
            if another {
                sequences.push(spaced);
            }
        }
        Ok(sequences)
    })
    .await
}
