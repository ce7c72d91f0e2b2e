//! Embeddings: an encoder's token states pooled into one vector per text
//! (`host embed`, `/v1/embeddings`).

pub mod pooling;
pub mod service;

use kiln_plugin_api::pipeline::{StepBatch, StepSequence};
use kiln_plugin_api::Task;

use crate::engine::batch::{run_encoder_step, StepError};
use crate::model::Model;
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

/// A loaded embedding model with its pooling.
pub struct Embedder {
    model: Model,
    pooling: Pooling,
    /// The longest text, in tokens.
    max_tokens: usize,
    /// Tokens per step.
    batch_tokens: usize,
}

impl Embedder {
    /// Wraps `model`, reading its pooling from its directory. Refuses a
    /// model that is not an embedding model.
    pub fn new(model: Model, batch_tokens: usize) -> Result<Self, String> {
        if model.architecture.info.task != Task::Embeddings {
            return Err(format!(
                "`{}` is a {} model, not an embedding model",
                model.architecture.info.name, model.architecture.info.task
            ));
        }
        let pooling = Pooling::from_dir(model.resolved.dir.as_deref())?;
        let max_tokens = pooling
            .max_seq_length
            .map_or(model.config.max_seq_len as usize, |n| {
                n.min(model.config.max_seq_len as usize)
            });
        Ok(Self {
            model,
            pooling,
            max_tokens,
            batch_tokens: batch_tokens.max(max_tokens),
        })
    }

    /// The pooling.
    pub fn pooling(&self) -> &Pooling {
        &self.pooling
    }

    /// The longest text accepted, in tokens.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokens per step.
    pub fn batch_tokens(&self) -> usize {
        self.batch_tokens
    }

    /// The length of each embedding: the graph's hidden width (a static
    /// dimension of its output) times the pooling modes concatenated.
    pub fn dimensions(&self) -> Option<usize> {
        let graph = &self.model.backend.program().graph;
        let output = graph.outputs.first()?;
        let hidden = graph.nodes[*output as usize].ty.shape.last()?.as_static()?;
        Some(hidden as usize * self.pooling.modes.len())
    }

    /// One embedding per tokenized text, in order. Texts run together in
    /// steps of up to the batch's token budget.
    pub fn embed(&self, texts: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, EmbedError> {
        for (index, tokens) in texts.iter().enumerate() {
            check_text(index, tokens, self.max_tokens)?;
        }
        let mut embeddings = Vec::with_capacity(texts.len());
        let mut start = 0;
        while start < texts.len() {
            let mut end = start;
            let mut tokens = 0;
            while end < texts.len()
                && (end == start || tokens + texts[end].len() <= self.batch_tokens)
            {
                tokens += texts[end].len();
                end += 1;
            }
            let states = run_encoder_step(
                self.model.backend.as_ref(),
                &self.model.pipeline,
                &encoder_batch(&texts[start..end]),
            )?;
            embeddings.extend(states.iter().map(|rows| self.pooling.pool(rows)));
            start = end;
        }
        Ok(embeddings)
    }
}

/// Checks one tokenized text (input `index`): not empty, at most
/// `max_tokens` long. Texts are refused, never truncated.
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
pub fn encoder_batch(texts: &[Vec<u32>]) -> StepBatch {
    StepBatch {
        sequences: texts
            .iter()
            .map(|tokens| StepSequence {
                tokens: tokens.clone(),
                start: 0,
                blocks: Vec::new(),
                wants_logits: true,
            })
            .collect(),
        all_logits: true,
    }
}
