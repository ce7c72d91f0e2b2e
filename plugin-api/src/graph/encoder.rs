//! The inputs of an encoder's step and attention within each sequence
//! (since 1.4): what bidirectional models such as BERT are built from.

use super::builder::{Graph, TensorValue};
use super::ir::{Op, SequenceAttentionSpec};
use super::types::{DType, TensorType};

/// The inputs of an encoder over a ragged batch: every sequence's tokens
/// flattened, with no KV cache. Create them once per graph with
/// [`EncoderBatch::inputs`]; [`crate::pipeline::EncoderPipeline`] feeds them.
#[derive(Clone, Debug)]
pub struct EncoderBatch {
    /// Token ids `[T]` (i64).
    pub tokens: TensorValue,
    /// Position of each token in its sequence, from 0 (`[T]`, i64).
    pub positions: TensorValue,
    /// Segment of each token (BERT's token types; 0 for a single text)
    /// (`[T]`, i64).
    pub token_types: TensorValue,
    /// Sequence `b`'s tokens are rows `row_offsets[b]..row_offsets[b+1]`
    /// (`[B+1]`, i64).
    pub row_offsets: TensorValue,
}

impl EncoderBatch {
    /// Declares the batch inputs on `graph`, in this order (symbols `T`
    /// tokens and `B1` = sequences + 1).
    pub fn inputs(graph: &Graph) -> Self {
        let int = |name: &str, dim: &str| graph.input(name, TensorType::new(DType::I64, [dim]));
        Self {
            tokens: int("tokens", "T"),
            positions: int("positions", "T"),
            token_types: int("token_types", "T"),
            row_offsets: int("row_offsets", "B1"),
        }
    }
}

/// The inputs of a sequence classifier (since 1.7): the encoder's, then
/// each sequence's first row (`[B]`, i64), where the token the head reads
/// (BERT's `[CLS]`) is. [`crate::pipeline::ClassifierPipeline`] feeds them.
#[derive(Clone, Debug)]
pub struct ClassifierBatch {
    /// The encoder's inputs.
    pub encoder: EncoderBatch,
    /// Row of each sequence's first token (`[B]`, i64).
    pub first_rows: TensorValue,
}

impl ClassifierBatch {
    /// Declares the inputs on `graph`: [`EncoderBatch::inputs`], then
    /// `first_rows` (symbol `B`).
    pub fn inputs(graph: &Graph) -> Self {
        Self {
            encoder: EncoderBatch::inputs(graph),
            first_rows: graph.input("first_rows", TensorType::new(DType::I64, ["B"])),
        }
    }
}

/// Attention of `q [T, Hq, D]` over `k, v [T, Hkv, D]` within each sequence
/// of `row_offsets`: bidirectional, or causal when `spec.causal`.
pub fn sequence_attention(
    q: &TensorValue,
    k: &TensorValue,
    v: &TensorValue,
    row_offsets: &TensorValue,
    spec: SequenceAttentionSpec,
) -> TensorValue {
    q.graph()
        .apply(Op::SequenceAttention(spec), &[q, k, v, row_offsets])
}
