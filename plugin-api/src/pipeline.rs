//! Pipeline models: how one scheduled step becomes the graph's inputs, and
//! which rows of the graph's output are whose logits (MAX's `PipelineModel`).
//!
//! The host owns scheduling, the paged KV cache, sampling and streaming. Each
//! step it hands the pipeline a [`StepBatch`] (every scheduled sequence's new
//! tokens, first position and cache blocks) and runs the graph on the
//! [`PreparedStep`] it gets back. The graph's first output must be logits
//! `[R, vocab]`, whose rows are handed out in order: `logit_rows[i]` rows to
//! the i-th sequence that wants logits.
//!
//! [`DecoderPipeline`] is the default and needs no code in a plugin: it feeds
//! the [`RaggedBatch`](crate::graph::ops::RaggedBatch) inputs that
//! [`build_decoder_graph`](crate::nn::build_decoder_graph) declares. A plugin
//! whose graph takes other inputs registers its own [`PipelineModel`] with
//! [`SupportedArchitecture::with_pipeline`](crate::SupportedArchitecture::with_pipeline);
//! the host then calls it across the plugin boundary once per step.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The version of the pipeline payloads below; bumped on incompatible changes.
pub const PIPELINE_PAYLOAD_VERSION: u32 = 1;

/// One sequence's part of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSequence {
    /// The tokens fed this step (a prompt chunk, or one generated token).
    pub tokens: Vec<u32>,
    /// The position of the first of them in the sequence.
    pub start: usize,
    /// The sequence's KV-cache blocks, in order.
    pub blocks: Vec<u32>,
    /// Whether the host wants logits for this sequence this step.
    pub wants_logits: bool,
    /// Each token's segment (BERT's token types: 1 for the second text of a
    /// pair), or empty when all are 0 (since 1.7; only encoders read it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub token_types: Vec<u32>,
}

impl StepSequence {
    /// Tokens in the cache once this step has run.
    pub fn context_len(&self) -> usize {
        self.start + self.tokens.len()
    }
}

/// One scheduled step of a ragged batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepBatch {
    /// The scheduled sequences, in the order their logits come back.
    /// Entries may share blocks: sequences with a common cached prefix, and
    /// speculative decoding's drafts, each fed as an entry of its own one
    /// position after the one before on the same blocks (so a graph must
    /// write every entry's keys and values before attention reads them, as
    /// the paged attention op does).
    pub sequences: Vec<StepSequence>,
    /// Logits of every fed token of each sequence that wants logits (scoring a
    /// prompt), instead of only the last one.
    pub all_logits: bool,
}

/// The values of a step input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepData {
    /// 64-bit integers.
    I64(Vec<i64>),
    /// 32-bit floats.
    F32(Vec<f32>),
}

impl StepData {
    fn len(&self) -> usize {
        match self {
            StepData::I64(values) => values.len(),
            StepData::F32(values) => values.len(),
        }
    }
}

/// One graph input for a step, in the order the graph declares its inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTensor {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Elements, row-major.
    pub data: StepData,
}

impl StepTensor {
    /// An i64 tensor.
    pub fn i64(shape: Vec<usize>, values: Vec<i64>) -> Self {
        Self {
            shape,
            data: StepData::I64(values),
        }
    }

    /// An f32 tensor.
    pub fn f32(shape: Vec<usize>, values: Vec<f32>) -> Self {
        Self {
            shape,
            data: StepData::F32(values),
        }
    }
}

/// What the graph runs on for one step, and how to split its logits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreparedStep {
    /// The graph's inputs, in declaration order.
    pub inputs: Vec<StepTensor>,
    /// For each sequence that wants logits, in order: how many logits rows
    /// are its.
    pub logit_rows: Vec<usize>,
}

impl PreparedStep {
    /// Checks what the host relies on: every tensor's element count matches
    /// its shape, and each sequence that wants logits gets at least one row.
    pub fn validate(&self, batch: &StepBatch) -> Result<()> {
        for (index, input) in self.inputs.iter().enumerate() {
            let expected: usize = input.shape.iter().product();
            if input.data.len() != expected {
                return Err(Error::invalid(format!(
                    "step input {index} has {} values for shape {:?}",
                    input.data.len(),
                    input.shape
                )));
            }
        }
        let wanting = batch.sequences.iter().filter(|s| s.wants_logits).count();
        if self.logit_rows.len() != wanting || self.logit_rows.contains(&0) {
            return Err(Error::invalid(format!(
                "the pipeline assigned logits rows {:?} to {wanting} sequences that want logits",
                self.logit_rows
            )));
        }
        Ok(())
    }
}

/// Turns a scheduled step into graph inputs.
pub trait PipelineModel: Send + Sync {
    /// The inputs of one step, and the logits rows of each sequence.
    fn prepare_step(&self, batch: &StepBatch) -> Result<PreparedStep>;
}

/// The default pipeline for decoders over the paged KV cache: the
/// [`RaggedBatch`](crate::graph::ops::RaggedBatch) inputs `tokens [T]`,
/// `positions [T]`, `row_offsets [B+1]`, `context_lens [B]`,
/// `block_tables [B, M]` (padded with block 0) and `logit_rows [R]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DecoderPipeline;

impl PipelineModel for DecoderPipeline {
    fn prepare_step(&self, batch: &StepBatch) -> Result<PreparedStep> {
        let sequences = &batch.sequences;
        let tokens: usize = sequences.iter().map(|s| s.tokens.len()).sum();
        let width = sequences
            .iter()
            .map(|s| s.blocks.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut ids = Vec::with_capacity(tokens);
        let mut positions = Vec::with_capacity(tokens);
        let mut offsets = Vec::with_capacity(sequences.len() + 1);
        offsets.push(0);
        let mut context = Vec::with_capacity(sequences.len());
        let mut tables = Vec::with_capacity(sequences.len() * width);
        let mut rows = Vec::new();
        let mut logit_rows = Vec::new();
        for seq in sequences {
            let first_row = ids.len() as i64;
            ids.extend(seq.tokens.iter().map(|&t| i64::from(t)));
            positions.extend((seq.start..seq.context_len()).map(|p| p as i64));
            offsets.push(ids.len() as i64);
            context.push(seq.context_len() as i64);
            tables.extend(seq.blocks.iter().map(|&b| i64::from(b)));
            tables.extend(std::iter::repeat_n(0, width - seq.blocks.len()));
            if seq.wants_logits {
                if seq.tokens.is_empty() {
                    return Err(Error::invalid(
                        "a sequence that wants logits feeds no tokens",
                    ));
                }
                let last = ids.len() as i64;
                let first = if batch.all_logits {
                    first_row
                } else {
                    last - 1
                };
                rows.extend(first..last);
                logit_rows.push((last - first) as usize);
            }
        }
        let batch_size = sequences.len();
        Ok(PreparedStep {
            inputs: vec![
                StepTensor::i64(vec![tokens], ids),
                StepTensor::i64(vec![tokens], positions),
                StepTensor::i64(vec![batch_size + 1], offsets),
                StepTensor::i64(vec![batch_size], context),
                StepTensor::i64(vec![batch_size, width], tables),
                StepTensor::i64(vec![rows.len()], rows),
            ],
            logit_rows,
        })
    }
}

/// The pipeline of encoders (since 1.4): the
/// [`EncoderBatch`](crate::graph::EncoderBatch) inputs `tokens [T]`,
/// `positions [T]` (from each sequence's `start`), `token_types [T]` (each
/// sequence's, 0 where it has none) and `row_offsets [B+1]`. Every sequence
/// gets all its rows of the graph's output (its hidden states), whatever
/// `all_logits` says; blocks are ignored, since an encoder keeps no cache.
#[derive(Clone, Copy, Debug, Default)]
pub struct EncoderPipeline;

impl PipelineModel for EncoderPipeline {
    fn prepare_step(&self, batch: &StepBatch) -> Result<PreparedStep> {
        let tokens: usize = batch.sequences.iter().map(|s| s.tokens.len()).sum();
        let mut ids = Vec::with_capacity(tokens);
        let mut positions = Vec::with_capacity(tokens);
        let mut types = Vec::with_capacity(tokens);
        let mut offsets = vec![0];
        let mut logit_rows = Vec::new();
        for seq in &batch.sequences {
            if seq.tokens.is_empty() {
                return Err(Error::invalid("an encoder sequence feeds no tokens"));
            }
            match seq.token_types.len() {
                0 => types.extend(std::iter::repeat_n(0, seq.tokens.len())),
                n if n == seq.tokens.len() => {
                    types.extend(seq.token_types.iter().map(|&t| i64::from(t)))
                }
                n => {
                    return Err(Error::invalid(format!(
                        "an encoder sequence has {n} token types for {} tokens",
                        seq.tokens.len()
                    )))
                }
            }
            ids.extend(seq.tokens.iter().map(|&t| i64::from(t)));
            positions.extend((seq.start..seq.context_len()).map(|p| p as i64));
            offsets.push(ids.len() as i64);
            if seq.wants_logits {
                logit_rows.push(seq.tokens.len());
            }
        }
        Ok(PreparedStep {
            inputs: vec![
                StepTensor::i64(vec![tokens], ids),
                StepTensor::i64(vec![tokens], positions),
                StepTensor::i64(vec![tokens], types),
                StepTensor::i64(vec![offsets.len()], offsets),
            ],
            logit_rows,
        })
    }
}

/// The pipeline of sequence classifiers (since 1.7): the
/// [`ClassifierBatch`](crate::graph::ClassifierBatch) inputs, the encoder's
/// four and `first_rows [B]` (each sequence's first row, where BERT's `[CLS]`
/// token is). The graph's output has one row per sequence (its class
/// logits), and each sequence that wants logits gets its row.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClassifierPipeline;

impl PipelineModel for ClassifierPipeline {
    fn prepare_step(&self, batch: &StepBatch) -> Result<PreparedStep> {
        let mut step = EncoderPipeline.prepare_step(batch)?;
        let first_rows: Vec<i64> = batch
            .sequences
            .iter()
            .scan(0, |row, seq| {
                let first = *row;
                *row += seq.tokens.len() as i64;
                Some(first)
            })
            .collect();
        step.inputs
            .push(StepTensor::i64(vec![first_rows.len()], first_rows));
        step.logit_rows = batch
            .sequences
            .iter()
            .filter(|s| s.wants_logits)
            .map(|_| 1)
            .collect();
        Ok(step)
    }
}

/// A request to a plugin's pipeline entry point. An architecture without a
/// pipeline of its own answers every request with an `unsupported` error.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineRequest {
    /// Asks whether the architecture has its own pipeline; answered with a
    /// [`PipelineDescription`].
    Describe,
    /// Prepare one step; answered with a [`PreparedStep`].
    PrepareStep {
        /// [`PIPELINE_PAYLOAD_VERSION`] of the sender.
        version: u32,
        /// The step.
        batch: StepBatch,
    },
}

/// The answer to [`PipelineRequest::Describe`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineDescription {
    /// [`PIPELINE_PAYLOAD_VERSION`] of the plugin.
    pub version: u32,
}

/// Answers a pipeline request with `pipeline` (the plugin side of the entry point).
pub(crate) fn serve(pipeline: &dyn PipelineModel, request: &[u8]) -> Result<Vec<u8>> {
    let request: PipelineRequest = serde_json::from_slice(request)
        .map_err(|e| Error::invalid(format!("malformed pipeline request: {e}")))?;
    let response = match request {
        PipelineRequest::Describe => serde_json::to_vec(&PipelineDescription {
            version: PIPELINE_PAYLOAD_VERSION,
        }),
        PipelineRequest::PrepareStep { version, batch } => {
            if !(1..=PIPELINE_PAYLOAD_VERSION).contains(&version) {
                return Err(Error::invalid(format!(
                    "pipeline payload version {version} is not one this plugin reads (1 to {PIPELINE_PAYLOAD_VERSION})"
                )));
            }
            let step = pipeline.prepare_step(&batch)?;
            step.validate(&batch)?;
            serde_json::to_vec(&step)
        }
    };
    response.map_err(|e| Error::internal(format!("cannot serialize the pipeline's answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(tokens: &[u32], start: usize, blocks: &[u32], wants_logits: bool) -> StepSequence {
        StepSequence {
            tokens: tokens.to_vec(),
            start,
            blocks: blocks.to_vec(),
            wants_logits,
            token_types: Vec::new(),
        }
    }

    fn values(tensor: &StepTensor) -> &[i64] {
        match &tensor.data {
            StepData::I64(values) => values,
            StepData::F32(_) => panic!("expected i64"),
        }
    }

    #[test]
    fn decoder_pipeline_packs_a_ragged_batch() {
        let batch = StepBatch {
            sequences: vec![
                seq(&[7, 8, 9], 0, &[3], true),
                seq(&[5], 6, &[1, 4], true),
                seq(&[2, 2], 4, &[0, 6], false),
            ],
            all_logits: false,
        };
        let step = DecoderPipeline.prepare_step(&batch).unwrap();
        step.validate(&batch).unwrap();
        let inputs: Vec<&[i64]> = step.inputs.iter().map(values).collect();
        assert_eq!(inputs[0], [7, 8, 9, 5, 2, 2]);
        assert_eq!(inputs[1], [0, 1, 2, 6, 4, 5]);
        assert_eq!(inputs[2], [0, 3, 4, 6]);
        assert_eq!(inputs[3], [3, 7, 6]);
        assert_eq!(inputs[4], [3, 0, 1, 4, 0, 6]);
        assert_eq!(step.inputs[4].shape, [3, 2]);
        assert_eq!(inputs[5], [2, 3]);
        assert_eq!(step.logit_rows, [1, 1]);

        let all = StepBatch {
            all_logits: true,
            ..batch
        };
        let step = DecoderPipeline.prepare_step(&all).unwrap();
        assert_eq!(values(&step.inputs[5]), [0, 1, 2, 3]);
        assert_eq!(step.logit_rows, [3, 1]);
    }

    #[test]
    fn classifier_pipeline_feeds_token_types_and_first_rows() {
        let mut pair = seq(&[1, 5, 2, 6, 2], 0, &[], true);
        pair.token_types = vec![0, 0, 0, 1, 1];
        let batch = StepBatch {
            sequences: vec![seq(&[1, 4, 2], 0, &[], true), pair],
            all_logits: false,
        };
        let encoder = EncoderPipeline.prepare_step(&batch).unwrap();
        assert_eq!(values(&encoder.inputs[2]), [0, 0, 0, 0, 0, 0, 1, 1]);
        assert_eq!(values(&encoder.inputs[3]), [0, 3, 8]);
        assert_eq!(encoder.logit_rows, [3, 5]);
        let step = ClassifierPipeline.prepare_step(&batch).unwrap();
        assert_eq!(step.inputs.len(), 5);
        assert_eq!(values(&step.inputs[4]), [0, 3]);
        assert_eq!(step.logit_rows, [1, 1]);
        step.validate(&batch).unwrap();
        // Token types that do not cover the tokens are refused.
        let mut bad = batch.clone();
        bad.sequences[1].token_types.pop();
        let error = ClassifierPipeline.prepare_step(&bad).unwrap_err();
        assert!(
            error.to_string().contains("4 token types for 5 tokens"),
            "{error}"
        );
    }

    #[test]
    fn validation_catches_inconsistent_steps() {
        let batch = StepBatch {
            sequences: vec![seq(&[1], 0, &[0], true)],
            all_logits: false,
        };
        let bad_shape = PreparedStep {
            inputs: vec![StepTensor::i64(vec![2], vec![1])],
            logit_rows: vec![1],
        };
        let err = bad_shape.validate(&batch).unwrap_err().to_string();
        assert!(err.contains("1 values for shape [2]"), "{err}");
        let no_rows = PreparedStep {
            inputs: vec![],
            logit_rows: vec![],
        };
        let err = no_rows.validate(&batch).unwrap_err().to_string();
        assert!(err.contains("to 1 sequences"), "{err}");
    }
}
