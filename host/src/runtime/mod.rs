//! The CPU runtime: executes compiled [`Program`](crate::compiler::Program)s
//! on concrete tensors, with weights in their stored encodings and a paged KV
//! cache.

pub mod cpu_ops;
mod executor;
mod fused;
mod kv_cache;
mod pool;
mod tensor;
mod weights;

pub use executor::{Executor, RuntimeError};
pub use kiln_kernels::dense::attention::CacheLayout;
pub use kiln_kernels::quant::Precision;
pub use kv_cache::KvCache;
pub use pool::BufferPool;
pub use tensor::{Data, Tensor};
pub use weights::{WeightData, WeightStore};
