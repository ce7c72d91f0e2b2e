//! One model step for a ragged batch: the pipeline model turns the
//! scheduler's plan into graph inputs, and the logits come back per sequence.

use kiln_plugin_api::pipeline::{
    ClassifierPipeline, DecoderPipeline, EncoderPipeline, PipelineModel, PreparedStep, StepBatch,
    StepData, StepSequence, StepTensor,
};

use kiln_plugin_api::Task;

use crate::plugins::{Architecture, EntryPointError};
use crate::runtime::sampling::{RowSampling, Sampled};
use crate::runtime::{Backend, KvCache, LaunchedStep, RuntimeError, Tensor, TokenFeed};

/// The pipeline model a loaded model runs each step through.
#[derive(Clone, Debug)]
pub enum Pipeline {
    /// The default decoder pipeline, run in the host.
    Decoder,
    /// The default pipeline of embedding models (encoders), run in the host.
    Encoder,
    /// The default pipeline of sequence classifiers, run in the host.
    Classifier,
    /// The architecture's own pipeline model, called across the plugin boundary.
    Plugin(Architecture),
}

impl Pipeline {
    /// The architecture's own pipeline if it has one, else the decoder's
    /// for a graph that reads the paged cache (`reads_cache`: a decoder
    /// whatever its task, e.g. a decoder's sequence classifier), else the
    /// default for its task.
    pub fn for_architecture(
        architecture: &Architecture,
        reads_cache: bool,
    ) -> Result<Self, EntryPointError> {
        Ok(if architecture.has_own_pipeline()? {
            Pipeline::Plugin(architecture.clone())
        } else if reads_cache {
            Pipeline::Decoder
        } else {
            match architecture.info.task {
                Task::Embeddings => Pipeline::Encoder,
                Task::SequenceClassification => Pipeline::Classifier,
                Task::TextGeneration => Pipeline::Decoder,
            }
        })
    }

    /// Whether the device can write picks into this pipeline's token ids:
    /// the host's decoder pipeline lays each sequence's tokens out one after
    /// another in input 0.
    pub fn feeds_tokens(&self) -> bool {
        matches!(self, Pipeline::Decoder)
    }

    fn prepare(&self, batch: &StepBatch) -> Result<PreparedStep, StepError> {
        match self {
            Pipeline::Decoder => DecoderPipeline
                .prepare_step(batch)
                .map_err(|e| StepError::Batch(e.to_string())),
            Pipeline::Encoder => EncoderPipeline
                .prepare_step(batch)
                .map_err(|e| StepError::Batch(e.to_string())),
            Pipeline::Classifier => ClassifierPipeline
                .prepare_step(batch)
                .map_err(|e| StepError::Batch(e.to_string())),
            Pipeline::Plugin(architecture) => Ok(architecture.prepare_step(batch)?),
        }
    }
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The batch cannot be run (e.g. a sequence that wants logits feeds nothing).
    #[error("invalid step: {0}")]
    Batch(String),
    /// The architecture's pipeline model failed.
    #[error("pipeline: {0}")]
    Pipeline(#[from] EntryPointError),
    /// The graph failed to run.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Runs one step. Returns, for each sequence that wants logits, in order,
/// its logits rows (one row, or one per fed token with `all_logits`).
pub fn run_step(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    cache: &mut KvCache,
    batch: &StepBatch,
) -> Result<Vec<Vec<Vec<f32>>>, StepError> {
    run_rows(backend, pipeline, Some(cache), batch)
}

/// Runs one step of an encoder, which keeps no cache. Returns each
/// sequence's hidden-state rows, in order.
pub fn run_encoder_step(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    batch: &StepBatch,
) -> Result<Vec<Vec<Vec<f32>>>, StepError> {
    run_rows(backend, pipeline, None, batch)
}

/// Runs one step and splits the graph's first output into the rows the
/// pipeline assigned to each sequence.
fn run_rows(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    cache: Option<&mut KvCache>,
    batch: &StepBatch,
) -> Result<Vec<Vec<Vec<f32>>>, StepError> {
    let prepared = pipeline.prepare(batch)?;
    let inputs = prepared.inputs.into_iter().map(to_tensor).collect();
    let logits = backend.run(inputs, cache)?.remove(0);
    let vocab = logits.shape.get(1).copied().unwrap_or(0).max(1);
    let rows = logits.as_f32();
    let needed: usize = prepared.logit_rows.iter().sum();
    if rows.len() != needed * vocab {
        return Err(StepError::Batch(format!(
            "the graph returned {} logits rows, the pipeline assigned {needed}",
            rows.len() / vocab
        )));
    }
    let mut all_rows = rows.chunks(vocab).map(<[f32]>::to_vec);
    Ok(prepared
        .logit_rows
        .into_iter()
        .map(|n| all_rows.by_ref().take(n).collect())
        .collect())
}

/// Runs one step and picks the next token of each sequence that wants logits
/// where the logits are (on the device for CUDA), as `rows` say, in order.
pub fn run_sampled_step(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    cache: &mut KvCache,
    batch: &StepBatch,
    rows: &[RowSampling],
) -> Result<Vec<Sampled>, StepError> {
    let step = launch_step(backend, pipeline, cache, batch, rows.len(), &[])?;
    let pending = backend.launch_picks(step, rows)?;
    Ok(backend.finish_sampled(pending)?)
}

/// Launches one step whose `sampled` sequences want logits, without waiting
/// where the backend allows; [`Backend::launch_picks`] then picks their
/// tokens. `feed` writes the previous launched step's picks into the token
/// ids first (only for pipelines that [`Pipeline::feeds_tokens`]).
pub fn launch_step(
    backend: &dyn Backend,
    pipeline: &Pipeline,
    cache: &mut KvCache,
    batch: &StepBatch,
    sampled: usize,
    feed: &[TokenFeed],
) -> Result<LaunchedStep, StepError> {
    if !feed.is_empty() && !pipeline.feeds_tokens() {
        return Err(StepError::Batch(
            "only the decoder pipeline's token ids can be fed on the device".to_owned(),
        ));
    }
    let prepared = pipeline.prepare(batch)?;
    if batch.all_logits || prepared.logit_rows.iter().any(|&n| n > 1) {
        return Err(StepError::Batch(
            "sampling takes one logits row per sequence".to_owned(),
        ));
    }
    let needed: usize = prepared.logit_rows.iter().sum();
    if needed != sampled {
        return Err(StepError::Batch(format!(
            "the pipeline assigned {needed} logits rows for {sampled} sampled sequences"
        )));
    }
    let inputs = prepared.inputs.into_iter().map(to_tensor).collect();
    Ok(backend.launch_step(inputs, Some(cache), feed)?)
}

/// The graph inputs of the largest step a server with these limits runs:
/// `max_tokens` tokens over `max_sequences` sequences (one long prefill
/// chunk, the rest decoding), each with a full block table of
/// `blocks_per_sequence` blocks. Backends plan their memory from it.
pub fn worst_case_inputs(
    pipeline: &Pipeline,
    max_tokens: usize,
    max_sequences: usize,
    blocks_per_sequence: usize,
) -> Result<Vec<Tensor>, StepError> {
    let sequences = max_sequences.clamp(1, max_tokens.max(1));
    let batch = StepBatch {
        sequences: (0..sequences)
            .map(|i| StepSequence {
                tokens: vec![
                    0;
                    if i == 0 {
                        max_tokens + 1 - sequences
                    } else {
                        1
                    }
                ],
                start: 0,
                blocks: vec![0; blocks_per_sequence.max(1)],
                wants_logits: true,
                token_types: Vec::new(),
            })
            .collect(),
        all_logits: false,
    };
    Ok(pipeline
        .prepare(&batch)?
        .inputs
        .into_iter()
        .map(to_tensor)
        .collect())
}

fn to_tensor(input: StepTensor) -> Tensor {
    match input.data {
        StepData::I64(values) => Tensor::i64(input.shape, values),
        StepData::F32(values) => Tensor::f32(input.shape, values),
    }
}
