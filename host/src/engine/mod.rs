//! Running models: sampling, and generating for a single sequence.

pub mod batch;
pub mod defaults;
pub mod generator;
pub mod npy;
pub mod sampling;

pub use generator::Generator;
pub use sampling::{Sampler, SamplingParams};
