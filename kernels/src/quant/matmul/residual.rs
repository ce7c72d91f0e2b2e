//! [`Precision::FastResidual`]: a fast product whose activations are
//! carried as two 8-bit digits.
//!
//! The activation rows are followed by their residuals (each value minus
//! its 8-bit quantization, as the fast kernels quantize it), and the fast
//! kernels multiply all of them at once, decoding each weight block once
//! for both; a row's output is the sum of its two products. Each product
//! is the fast kernels' own, bit for bit whatever the number of rows, so
//! the sums are too: decode and prefill still agree exactly.

#[cfg(target_arch = "x86_64")]
use super::BlockQ8x2;
use super::{
    quantize_acts, select, ActBlock, Arithmetic, BlockQ8, BlockQ8K, Isa, Precision, QuantError,
    QuantMatrix, Selected,
};

impl QuantMatrix<'_> {
    /// [`matmul_with`](Self::matmul_with) in [`Precision::FastResidual`];
    /// the caller checked the lengths and the instruction set.
    pub(super) fn matmul_residual(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        y: &mut [f32],
    ) -> Result<(), QuantError> {
        let mut rows = Vec::with_capacity(2 * x.len());
        rows.extend_from_slice(x);
        rows.extend_from_slice(x);
        let residual = &mut rows[x.len()..];
        match select(self.ty, Arithmetic::Fast, isa) {
            Selected::Q8(_) => subtract_quantized::<BlockQ8>(isa, residual, self.cols),
            Selected::Q8K(_) => subtract_quantized::<BlockQ8K>(isa, residual, self.cols),
            #[cfg(target_arch = "x86_64")]
            Selected::Q8KAmx(..) => subtract_quantized::<BlockQ8K>(isa, residual, self.cols),
            #[cfg(target_arch = "x86_64")]
            Selected::Q8x2(_) | Selected::Q8x2Amx(..) => {
                subtract_quantized::<BlockQ8x2>(isa, residual, self.cols)
            }
            // Every format has fast kernels; were it not so, the product of
            // the first rows would be exact and the residuals add nothing.
            Selected::Exact(_) | Selected::ExactPanel(..) => residual.fill(0.0),
        }
        let mut both = vec![0f32; 2 * y.len()];
        self.matmul_with(isa, Precision::Fast, &rows, 2 * m, &mut both)?;
        let (first, second) = both.split_at(y.len());
        for ((y, a), b) in y.iter_mut().zip(first).zip(second) {
            *y = a + b;
        }
        Ok(())
    }
}

/// Replaces each value of the rows `x` (of `cols` values) by what its
/// quantization to blocks `B` leaves: the value minus scale × quant.
fn subtract_quantized<B: ActBlock>(isa: Isa, x: &mut [f32], cols: usize) {
    let (blocks, per_row) = quantize_acts::<B>(isa, x, cols, 1);
    for (row, blocks) in x.chunks_exact_mut(cols).zip(blocks.chunks_exact(per_row)) {
        for (values, block) in row.chunks_mut(B::ELEMS).zip(blocks) {
            block.subtract_from(values);
        }
    }
}
