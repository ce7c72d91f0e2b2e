//! Running models: sampling, and generating for a single sequence.

pub mod generator;
pub mod sampling;

pub use generator::Generator;
pub use sampling::{Sampler, SamplingParams};
