//! Encoder models: an embedding model's token states pooled into one vector
//! per text (`host embed`, `/v1/embeddings`), or a sequence classifier's
//! class logits per text or pair of texts (`/v1/score`, `/v1/rerank`,
//! `/v1/classify`).

pub mod classes;
pub mod pooling;
pub mod service;

mod decoder;

use kiln_plugin_api::pipeline::{StepBatch, StepSequence};
use kiln_plugin_api::Task;

use crate::engine::batch::{run_encoder_step, StepError};
use crate::model::Model;
pub use classes::{Activation, Classes};
use decoder::DecoderCache;
pub use pooling::{Pooling, PoolingMode};

/// Tokens per encoder step of `host embed`.
pub const DEFAULT_BATCH_TOKENS: usize = 8192;

/// Why texts could not be embedded.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The input is unusable (empty, too long): the caller's fault.
    #[error("{0}")]
    Invalid(String),
    /// The embedding worker is gone (the server is stopping).
    #[error("the embedding worker stopped")]
    Stopped,
    /// The model failed to run.
    #[error(transparent)]
    Step(#[from] StepError),
}

/// One text (or pair of texts) for an encoder: its token ids, and their
/// token types (empty: all 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncoderText {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Segment of each token (1 for a pair's second text), or empty.
    pub token_types: Vec<u32>,
}

impl From<Vec<u32>> for EncoderText {
    fn from(tokens: Vec<u32>) -> Self {
        Self {
            tokens,
            token_types: Vec::new(),
        }
    }
}

/// What an encoder model's output is made into.
#[derive(Clone, Debug, PartialEq)]
pub enum Head {
    /// An embedding model's token states, pooled.
    Pooling(Pooling),
    /// A sequence classifier's class logits, one row per text.
    Classifier(Classes),
}

impl std::fmt::Display for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Head::Pooling(pooling) => write!(
                f,
                "embeddings: pooling {:?} ({}), normalized: {}",
                pooling.modes, pooling.source, pooling.normalize
            ),
            Head::Classifier(classes) => write!(
                f,
                "sequence classification: classes {:?}, activation {:?}",
                classes.labels, classes.activation
            ),
        }
    }
}

/// A loaded encoder model (embeddings or sequence classification), or a
/// decoder run as an embedding model, with what its output is made into.
pub struct Embedder {
    model: Model,
    head: Head,
    /// The longest text, in tokens.
    max_tokens: usize,
    /// Tokens per step.
    batch_tokens: usize,
    /// A decoder's KV cache, which its steps' attention reads.
    decoder: Option<DecoderCache>,
}

impl Embedder {
    /// Wraps `model`: an embedding model with the pooling its directory
    /// describes, or a sequence classifier with the classes its config
    /// names. Refuses a text generation model.
    /// A decoder (`--runner pooling`) embeds texts of at most `batch_tokens`
    /// tokens, the size of its cache.
    pub fn new(model: Model, batch_tokens: usize) -> Result<Self, String> {
        let is_decoder = model.reads_cache();
        let model_max = model.config.max_seq_len as usize;
        let model_max = if is_decoder {
            model_max.min(batch_tokens)
        } else {
            model_max
        };
        let (head, max_tokens) = match model.task {
            Task::Embeddings => {
                let default = if is_decoder {
                    Pooling::default_for_decoders
                } else {
                    Pooling::default_for_encoders
                };
                let pooling = Pooling::from_dir(model.resolved.dir.as_deref(), default)?;
                let max = pooling
                    .max_seq_length
                    .map_or(model_max, |n| n.min(model_max));
                (Head::Pooling(pooling), max)
            }
            Task::SequenceClassification => (
                Head::Classifier(Classes::from_config(&model.config.model)?),
                model_max,
            ),
            task => {
                return Err(format!(
                    "`{}` is a {task} model, not an embedding or sequence classification model",
                    model.architecture.info.name
                ))
            }
        };
        let decoder = if is_decoder {
            Some(DecoderCache::new(&model, batch_tokens).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let embedder = Self {
            model,
            head,
            max_tokens,
            batch_tokens: batch_tokens.max(max_tokens),
            decoder,
        };
        if let (Head::Classifier(classes), Some(width)) = (&embedder.head, embedder.dimensions()) {
            if classes.labels.len() != width {
                return Err(format!(
                    "config.json names {} labels, but the graph gives {width} logits per text",
                    classes.labels.len()
                ));
            }
        }
        Ok(embedder)
    }

    /// What the output is made into.
    pub fn head(&self) -> &Head {
        &self.head
    }

    /// The longest text accepted, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokens per step.
    pub fn batch_tokens(&self) -> usize {
        self.batch_tokens
    }

    /// The length of each output: for embeddings the graph's hidden width
    /// (a static dimension of its output) times the pooling modes
    /// concatenated, for a classifier its classes.
    pub fn dimensions(&self) -> Option<usize> {
        let graph = &self.model.backend.program().graph;
        let output = graph.outputs.first()?;
        let width = graph.nodes[*output as usize].ty.shape.last()?.as_static()? as usize;
        Some(match &self.head {
            Head::Pooling(pooling) => width * pooling.modes.len(),
            Head::Classifier(_) => width,
        })
    }

    /// Whether pooling reads every token's state, not only the last one's
    /// (a decoder's step then returns them all).
    fn rows_pooled(&self) -> bool {
        match &self.head {
            Head::Pooling(pooling) => pooling.modes.iter().any(|m| *m != PoolingMode::LastToken),
            Head::Classifier(_) => false,
        }
    }

    /// One embedding per tokenized text, in order (see [`Embedder::run`]).
    pub fn embed(&self, texts: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let texts: Vec<EncoderText> = texts.iter().cloned().map(EncoderText::from).collect();
        self.run(&texts)
    }

    /// One output per text, in order: its pooled embedding, or its class
    /// logits (no activation). Texts run together in steps of up to the
    /// batch's token budget.
    pub fn run(&self, texts: &[EncoderText]) -> Result<Vec<Vec<f32>>, EmbedError> {
        for (index, text) in texts.iter().enumerate() {
            check_text(index, &text.tokens, self.max_tokens)?;
        }
        let mut outputs = Vec::with_capacity(texts.len());
        let max_texts = self
            .decoder
            .as_ref()
            .map_or(usize::MAX, |_| decoder::MAX_TEXTS);
        let mut start = 0;
        while start < texts.len() {
            let mut end = start;
            let mut tokens = 0;
            while end < texts.len()
                && (end == start
                    || (tokens + texts[end].tokens.len() <= self.batch_tokens
                        && end - start < max_texts))
            {
                tokens += texts[end].tokens.len();
                end += 1;
            }
            let batch = &texts[start..end];
            let states = match &self.decoder {
                Some(cache) => cache.run(&self.model, batch, self.rows_pooled())?,
                None => run_encoder_step(
                    self.model.backend.as_ref(),
                    &self.model.pipeline,
                    &encoder_batch(batch),
                )?,
            };
            outputs.extend(states.into_iter().map(|mut rows| match &self.head {
                Head::Pooling(pooling) => pooling.pool(&rows),
                Head::Classifier(_) => rows.swap_remove(0),
            }));
            start = end;
        }
        Ok(outputs)
    }
}

/// Checks one tokenized text (input `index`): not empty, at most
/// `max_tokens` long. Texts are refused here, never truncated (the server
/// cuts them first when a request asks).
pub fn check_text(index: usize, tokens: &[u32], max_tokens: usize) -> Result<(), EmbedError> {
    if tokens.is_empty() || tokens.len() > max_tokens {
        return Err(EmbedError::Invalid(format!(
            "input {index} has {} tokens; this model embeds 1 to {max_tokens} tokens per input",
            tokens.len()
        )));
    }
    Ok(())
}

/// One encoder step over `texts`, each a whole sequence from position 0.
pub fn encoder_batch(texts: &[EncoderText]) -> StepBatch {
    StepBatch {
        sequences: texts
            .iter()
            .map(|text| StepSequence {
                tokens: text.tokens.clone(),
                start: 0,
                blocks: Vec::new(),
                wants_logits: true,
                token_types: text.token_types.clone(),
            })
            .collect(),
        all_logits: true,
    }
}
