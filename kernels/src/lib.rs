//! # kiln-kernels
//!
//! Compute kernels shared by every architecture, knowing nothing about plugins
//! or models. CPU kernels pick their instruction set at run time from
//! [`cpu::CpuFeatures`]; the matmul, quantized and attention kernels and the
//! CUDA sources land with the compiler and backend issues (see
//! `docs/ARCHITECTURE.md`).

pub mod cpu;
