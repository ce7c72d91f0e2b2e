//! The module library (MAX's `max.nn`): modules with registered weights and
//! the built-in layers a transformer is made of. Each layer is usable alone.

mod attention;
mod decoder;
mod encoder;
mod latent;
mod layers;
mod module;
mod moe;
mod rotary;

pub use attention::{
    rotary_attention, AttentionConfig, AttentionWithRope, Transformer, TransformerBlock,
};
pub use decoder::{
    Decoder, DecoderClassifier, DecoderLayer, HiddenStates, ParallelBlock, PreNormBlock,
    SelfAttention,
};
pub use encoder::{
    ClassificationHead, Encoder, EncoderConfig, EncoderEmbeddings, EncoderLayer, SequenceClassifier,
};
pub use latent::{LatentAttention, LatentAttentionConfig, QueryProjection, SplitUpProjections};
pub use layers::{Activation, Embedding, LayerNorm, Linear, Mlp, Norm, RmsNorm};
pub use module::{Layer, Module, Registry, Sequential, StateDict, Weight};
pub use moe::{MixtureOfExperts, MoeBlock};
pub use rotary::{RopeScaling, RotaryEmbedding};

use crate::graph::{ClassifierBatch, EncoderBatch, Graph, GraphIr, RaggedBatch, TensorValue};

/// Builds a decoder's graph: binds the checkpoint's weights to `model` (or,
/// without a checkpoint, only gives every weight its full name), declares the
/// ragged-batch inputs, and records `forward` as the graph's output.
pub fn build_decoder_graph(
    name: &str,
    model: &dyn Module,
    state_dict: Option<&StateDict>,
    forward: impl FnOnce(&RaggedBatch) -> TensorValue,
) -> crate::Result<GraphIr> {
    build_graph(name, model, state_dict, RaggedBatch::inputs, forward)
}

/// Builds an encoder's graph (since 1.4): like [`build_decoder_graph`], with
/// the [`EncoderBatch`] inputs; `forward` returns every token's last hidden
/// state `[T, hidden]`.
pub fn build_encoder_graph(
    name: &str,
    model: &dyn Module,
    state_dict: Option<&StateDict>,
    forward: impl FnOnce(&EncoderBatch) -> TensorValue,
) -> crate::Result<GraphIr> {
    build_graph(name, model, state_dict, EncoderBatch::inputs, forward)
}

/// Builds a sequence classifier's graph (since 1.7): like
/// [`build_encoder_graph`], with the [`ClassifierBatch`] inputs; `forward`
/// returns each sequence's class logits `[B, num_labels]`.
pub fn build_classifier_graph(
    name: &str,
    model: &dyn Module,
    state_dict: Option<&StateDict>,
    forward: impl FnOnce(&ClassifierBatch) -> TensorValue,
) -> crate::Result<GraphIr> {
    build_graph(name, model, state_dict, ClassifierBatch::inputs, forward)
}

/// Binds the weights, declares the inputs with `inputs`, and records
/// `forward`'s value as the graph's one output.
fn build_graph<B>(
    name: &str,
    model: &dyn Module,
    state_dict: Option<&StateDict>,
    inputs: fn(&Graph) -> B,
    forward: impl FnOnce(&B) -> TensorValue,
) -> crate::Result<GraphIr> {
    match state_dict {
        Some(state) => model.load_state_dict(state)?,
        None => drop(model.raw_state_dict()),
    }
    let graph = Graph::new(name);
    let output = forward(&inputs(&graph));
    graph.output(&[&output]);
    graph
        .build()
        .map_err(|e| crate::Error::invalid(format!("building the graph: {e}")))
}
