//! Quantized GGUF weights on the CPU: the block formats, dequantization, and
//! matrix products computed straight from the blocks.
//!
//! # Formats
//!
//! [`QuantType`] covers ggml's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (blocks
//! of 32 values) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (super-blocks of
//! 256), with ggml's exact byte layouts. [`dequantize_row`] is the reference
//! dequantization (bit-exact with ggml and gguf-py);
//! [`quantize_row`] ggml's quantizers of Q4_0, Q5_0, Q5_1, Q8_0, Q2_K to
//! Q6_K, IQ4_NL and IQ4_XS, without an importance matrix.
//!
//! # Products
//!
//! [`QuantMatrix::matmul`] computes `y = x · Wᵀ` for a `rows x cols`
//! quantized `W` (row-major, each row `ty.row_bytes(cols)` bytes) and `m`
//! rows of f32 activations: `y[i][r] = dot(W[r], x[i])`, with `y` row-major
//! `m x rows`. It works block by block and never dequantizes the matrix.
//! [`Precision`] picks the arithmetic:
//!
//! - [`Precision::Exact`] dequantizes one block at a time in registers and
//!   accumulates in f32: the result matches dequantize-then-dot up to f32
//!   rounding (about 1e-7 relative to `Σ|w·x|`).
//! - [`Precision::Fast`] quantizes each activation row once to 8 bits (blocks
//!   of 32 with an f32 scale and the quants' sum, or Q8_K super-blocks with
//!   run sums for the K-quants), then takes integer dot products, as
//!   llama.cpp does. The error is that of 8-bit activations: a few 1e-3
//!   relative to `Σ|w·x|` for random data.
//!
//! # Kernels
//!
//! The instruction set is chosen at run time ([`Isa::detect`]; tests and
//! benchmarks can force one with [`QuantMatrix::matmul_with`]):
//!
//! | | Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL | Q8_0 | Q4_K | Q5_K | Q6_K | IQ4_XS | Q2_K Q3_K |
//! | --- | --- | --- | --- | --- | --- | --- | --- |
//! | AMX (int8 tiles) | fast, ≥ 16 rows | fast, ≥ 16 rows | fast, ≥ 16 rows | — | fast, ≥ 16 rows | — | — |
//! | AVX-512 (VBMI, VNNI) | both | fast | exact | — | exact | exact; fast ≥ 16 rows | — |
//! | AVX2 + FMA + F16C | both | both | both | both | both | both | exact |
//! | portable | both | both | both | both | both | both | both |
//!
//! A format without a kernel for the detected instruction set uses the best
//! one below it. The portable kernels are always compiled and are the
//! reference the others are tested against.
//!
//! With several activation rows (prefill), the AVX-512 and AVX2 kernels
//! also have multi-row (GEMM micro-) kernels (all but those of Q2_K/Q3_K),
//! which decode each weight block once for 8, 4 or 2 activation rows (the
//! rows left over take the single-row kernel). They compute exactly what
//! the single-row kernels compute, so a product's bits do not depend on how
//! many rows it has. From 16 activation rows, AVX-512's exact kernels become
//! panel kernels (weights decoded to f32 once per tile of rows), and the
//! fast ones of the 32-value formats and IQ4_XS int8 panel kernels
//! (weights decoded to bytes once per tile of rows): AMX tile products
//! where the CPU has AMX and Linux grants its state (also for Q4_K and
//! Q6_K), else `vpdpbusd` (`avx512::vnni`, and IQ4_XS's everywhere): again
//! the single-row kernel's bits.
//!
//! # Threads
//!
//! Output rows are split over the rayon pool (the only parallelism when
//! `m = 1`). Call from inside the pool (for instance under
//! `ThreadPool::install`), as a runtime does: splitting then costs about a
//! microsecond. From another thread, handing work to the pool and waiting
//! for it costs tens of microseconds (about 40 µs on a 2-vCPU VM), so products
//! under 2 MiB of weights then run on the calling thread alone.

mod act;
mod aligned;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod format;
mod matmul;
mod prefetch;
mod quantize;
mod quantize_iq4;
mod quantize_k;
mod scalar;
#[cfg(test)]
mod tests;

pub use act::BlockQ8_0;
pub use format::QuantType;
pub use matmul::{Isa, QuantMatrix};
pub use quantize::quantize_row;

/// Errors from the quantized kernels; they never panic on bad input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// A GGUF type id this crate has no format for.
    #[error("unsupported GGUF tensor type id {0}")]
    UnsupportedTypeId(u32),
    /// A row length that is not a whole number of blocks.
    #[error("{ty} rows need a multiple of {} values, got {cols}", ty.block_elems())]
    UnalignedCols {
        /// The format.
        ty: QuantType,
        /// The requested row length.
        cols: usize,
    },
    /// A format [`quantize_row`] cannot write.
    #[error("no quantizer writes {0}")]
    NoQuantizer(QuantType),
    /// A buffer of the wrong size.
    #[error("{what} buffer has {actual} elements, expected {expected}")]
    WrongLength {
        /// Which buffer.
        what: &'static str,
        /// The size the shapes call for.
        expected: usize,
        /// The size given.
        actual: usize,
    },
    /// Shapes whose size overflows `usize`.
    #[error("tensor shape too large")]
    TooLarge,
    /// An instruction set this CPU lacks.
    #[error("this CPU does not support {0:?}")]
    IsaUnavailable(Isa),
}

/// The arithmetic of a quantized matrix product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 activations and accumulation: dequantize-then-dot up to rounding.
    #[default]
    Exact,
    /// 8-bit quantized activations and integer dot products (llama.cpp's way).
    Fast,
    /// [`Fast`](Self::Fast) with each activation carried as two 8-bit
    /// digits: its 8-bit quantization and the 8-bit quantization of what
    /// that left. Two integer products (one over twice the activation rows),
    /// activations good to about 15 bits: for inputs with outliers, whose
    /// blocks 8 bits alone serve worst (a gated MLP's down projection, the
    /// attention projections).
    FastResidual,
}

/// Dequantizes one row: `src` holds `dst.len()` values of format `ty`
/// (`ty.row_bytes(dst.len())` bytes), as ggml's `dequantize_row_*` does.
pub fn dequantize_row(ty: QuantType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    matmul::check_len("quantized row", ty.row_bytes(dst.len())?, src.len())?;
    let mut u = format::Unpacked::default();
    for (block, out) in src
        .chunks_exact(ty.block_bytes())
        .zip(dst.chunks_exact_mut(ty.block_elems()))
    {
        ty.dequantize_block(block, &mut u, out);
    }
    Ok(())
}
