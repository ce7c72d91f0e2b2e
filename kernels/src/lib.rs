//! # kiln-kernels
//!
//! Compute kernels shared by every architecture, knowing nothing about plugins
//! or models. CPU kernels pick their instruction set at run time from
//! [`cpu::CpuFeatures`].
//!
//! - [`quant`]: the GGUF quantized block formats, their dequantization, and
//!   matrix-vector / matrix-matrix products straight from the blocks (exact or
//!   llama.cpp-style 8-bit), with AVX-512, AVX2 and portable kernels.
//! - [`dense`]: dense f32 kernels: matrix products (f32, f16 and bf16
//!   weights), normalizations, softmax, rotary embeddings, paged attention.
//!
//! - [`HugePageBuffer`]: memory advised for huge pages, where weights that
//!   decode streams from memory are best held.
//!
//! - [`cuda`]: the CUDA C kernels, the device interface of the CUDA backend,
//!   the real driver (NVRTC, cuBLAS) and the kernel emulator that runs the
//!   same sources on the CPU.

pub mod cpu;
pub mod cuda;
pub mod dense;
mod huge_pages;
pub mod quant;
mod row_tasks;

pub use huge_pages::HugePageBuffer;
