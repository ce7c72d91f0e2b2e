//! # kiln-kernels
//!
//! Compute kernels shared by every architecture, knowing nothing about plugins
//! or models. CPU kernels pick their instruction set at run time from
//! [`cpu::CpuFeatures`].
//!
//! - [`quant`]: the GGUF quantized block formats, their dequantization, and
//!   matrix-vector / matrix-matrix products straight from the blocks (exact or
//!   llama.cpp-style 8-bit), with AVX-512 VNNI, AVX2 and portable kernels.
//!
//! The f32 matmul and attention kernels and the CUDA sources land with the
//! compiler and backend issues (see `docs/ARCHITECTURE.md`).

pub mod cpu;
pub mod dense;
pub mod quant;
