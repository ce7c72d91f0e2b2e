//! Running models: sampling, and generating for a single sequence.

pub mod batch;
pub mod defaults;
pub mod generator;
pub mod npy;
pub mod penalties;
mod request;
pub mod sampling;
mod scoring;
mod sequence;
pub mod service;
pub mod speculative;
pub mod stats;
pub mod stop;
pub mod structured;
pub mod warm_up;

pub use generator::Generator;
pub use sampling::{Sampler, SamplingParams};
