//! The runtime: executes compiled [`Program`](crate::compiler::Program)s
//! through a [`Backend`]: the CPU [`Executor`] (weights in their stored
//! encodings) or the [`cuda::CudaExecutor`], each with its paged KV cache.

mod backend;
mod broadcast;
pub mod cpu_ops;
pub mod cuda;
mod executor;
mod fused;
mod hoist;
mod kv_cache;
mod moe;
mod pool;
mod precision;
pub mod sampling;
mod spin;
mod tensor;
mod weights;

pub use backend::{Backend, KernelCounter, LaunchedStep, PendingSample, Roofline, TokenFeed};
pub use executor::{Executor, RuntimeError};
pub use kiln_kernels::dense::attention::CacheLayout;
pub use kiln_kernels::quant::Precision;
pub use kv_cache::{HostKvDtype, HostLayer, KvCache, KvCacheDtype};
pub use pool::BufferPool;
pub use tensor::{Data, Tensor};
pub use weights::{quant_encoding, quant_type, WeightData, WeightStore};
