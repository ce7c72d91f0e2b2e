//! The module library (MAX's `max.nn`): modules with registered weights and
//! the built-in layers a transformer is made of. Each layer is usable alone.

mod attention;
mod layers;
mod module;
mod rotary;

pub use attention::{AttentionConfig, AttentionWithRope, Transformer, TransformerBlock};
pub use layers::{Activation, Embedding, LayerNorm, Linear, Mlp, Norm, RmsNorm};
pub use module::{Layer, Module, Registry, Sequential, StateDict, Weight};
pub use rotary::{RopeScaling, RotaryEmbedding};
