//! Broadcasting operands onto an output shape, and element-wise float
//! arithmetic over them: the output in chunks shared by the pool's threads,
//! each operand's values for a chunk gathered by its [`Broadcast`] pattern,
//! the operation chosen once per call so that each chunk is a tight loop the
//! compiler vectorizes (a residual add, a bias over rows, a gated product).

use kiln_plugin_api::graph::BinaryOp;
use rayon::prelude::*;

use super::cpu_ops::arithmetic_f32;
use super::tensor::strides;

/// Output elements computed at a time: a chunk's operands stay in L1.
pub(crate) const CHUNK: usize = 2048;

/// How an operand's elements map onto the output's, in row-major order.
#[derive(Debug, PartialEq)]
pub(crate) enum Broadcast {
    /// A contiguous block of this many values repeats along the output: the
    /// whole operand when its shape is the output's, a bias over rows, a
    /// scalar.
    Repeat(usize),
    /// Any other pattern: the operand's offset for each output element.
    Offsets(Vec<usize>),
}

impl Broadcast {
    /// The pattern of an operand of `in_shape` broadcast to `out_shape`.
    pub(crate) fn of(in_shape: &[usize], out_shape: &[usize]) -> Self {
        let in_len: usize = in_shape.iter().product();
        if in_shape == out_shape || in_len <= 1 {
            return Self::Repeat(in_len.max(1));
        }
        let rank = out_shape.len();
        let padded: Vec<usize> = std::iter::repeat_n(1, rank - in_shape.len())
            .chain(in_shape.iter().copied())
            .collect();
        let first_real = padded.iter().position(|&d| d != 1).unwrap_or(rank);
        if padded[first_real..] == out_shape[first_real..] {
            return Self::Repeat(in_len);
        }
        let in_strides = strides(&padded);
        let effective: Vec<usize> = (0..rank)
            .map(|d| if padded[d] == 1 { 0 } else { in_strides[d] })
            .collect();
        Self::Offsets(strided_offsets(out_shape, &effective))
    }

    /// Writes into `out` the operand's values (`src`) for the output
    /// elements from `start` on, one for each element of `out`.
    pub(crate) fn gather<T: Copy>(&self, src: &[T], start: usize, out: &mut [T]) {
        match self {
            Self::Repeat(1) => out.fill(src[0]),
            Self::Repeat(len) => {
                let mut at = start % len;
                let mut done = 0;
                while done < out.len() {
                    let n = (len - at).min(out.len() - done);
                    out[done..done + n].copy_from_slice(&src[at..at + n]);
                    done += n;
                    at = 0;
                }
            }
            Self::Offsets(offsets) => {
                let offsets = &offsets[start..start + out.len()];
                for (o, &i) in out.iter_mut().zip(offsets) {
                    *o = src[i];
                }
            }
        }
    }
}

/// For each element of `out_shape`, the offset of the element of `in_shape`
/// that broadcasts to it.
pub fn broadcast_offsets(in_shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    match Broadcast::of(in_shape, out_shape) {
        Broadcast::Repeat(len) => {
            let total: usize = out_shape.iter().product();
            (0..total).map(|i| i % len).collect()
        }
        Broadcast::Offsets(offsets) => offsets,
    }
}

/// The offset of every element of `shape`, in row-major order, in a buffer
/// that steps by `strides` along each axis (0 for a broadcast axis).
pub(crate) fn strided_offsets(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let total: usize = shape.iter().product();
    let rank = shape.len();
    let mut offsets = Vec::with_capacity(total);
    let mut index = vec![0usize; rank];
    let mut offset = 0usize;
    for _ in 0..total {
        offsets.push(offset);
        for d in (0..rank).rev() {
            index[d] += 1;
            offset += strides[d];
            if index[d] < shape[d] {
                break;
            }
            offset -= strides[d] * index[d];
            index[d] = 0;
        }
    }
    offsets
}

/// An operand: its values and how they broadcast onto the output.
pub(crate) type Operand<'a> = (&'a [f32], &'a Broadcast);

/// `out[i] = op(a[i], b[i])` for an arithmetic (not predicate) `op`, with
/// both operands broadcast onto `out`, in parallel chunks.
pub(crate) fn arithmetic(op: BinaryOp, a: Operand, b: Operand, out: &mut [f32]) {
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, out)| {
        let start = c * CHUNK;
        a.1.gather(a.0, start, out);
        let mut right = [0f32; CHUNK];
        let right = &mut right[..out.len()];
        b.1.gather(b.0, start, right);
        combine(op, out, right);
    });
}

/// `a[i] = op(a[i], b[i])` for an arithmetic `op`, matched once so that
/// the common ops run as vectorized loops.
pub(crate) fn combine(op: BinaryOp, a: &mut [f32], b: &[f32]) {
    fn each(a: &mut [f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
        a.iter_mut().zip(b).for_each(|(x, &y)| *x = f(*x, y));
    }
    match op {
        BinaryOp::Add => each(a, b, |x, y| x + y),
        BinaryOp::Sub => each(a, b, |x, y| x - y),
        BinaryOp::Mul => each(a, b, |x, y| x * y),
        BinaryOp::Div => each(a, b, |x, y| x / y),
        _ => each(a, b, arithmetic_f32(op)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The input offset of each output element by the definition of
    /// broadcasting: the output index's coordinates, right-aligned on the
    /// input's axes, 0 on an axis of size 1.
    fn by_definition(input: &[usize], output: &[usize]) -> Vec<usize> {
        let total: usize = output.iter().product();
        let skip = output.len() - input.len();
        (0..total)
            .map(|mut flat| {
                let mut coords = vec![0; output.len()];
                for d in (0..output.len()).rev() {
                    coords[d] = flat % output[d];
                    flat /= output[d];
                }
                input.iter().enumerate().fold(0, |offset, (d, &size)| {
                    offset * size + if size == 1 { 0 } else { coords[skip + d] }
                })
            })
            .collect()
    }

    /// Every pattern gathers, and `broadcast_offsets` lists, what the
    /// definition of broadcasting says.
    #[test]
    fn patterns_gather_what_broadcasting_defines() {
        let cases: [(&[usize], &[usize]); 7] = [
            (&[2, 3], &[2, 3]),
            (&[3], &[4, 3]),
            (&[1, 3], &[2, 2, 3]),
            (&[1], &[5, 2]),
            (&[4, 1], &[4, 3]),
            (&[2, 1, 3], &[2, 4, 3]),
            (&[3, 1], &[2, 3, 2]),
        ];
        for (input, output) in cases {
            let pattern = Broadcast::of(input, output);
            let len: usize = input.iter().product();
            let total: usize = output.iter().product();
            let src: Vec<i64> = (0..len as i64).map(|v| v * 10).collect();
            let offsets = by_definition(input, output);
            assert_eq!(
                broadcast_offsets(input, output),
                offsets,
                "{input:?} -> {output:?}"
            );
            let expected: Vec<i64> = offsets.iter().map(|&o| src[o]).collect();
            // Every start and length, so chunk edges fall everywhere.
            for start in 0..total {
                for end in start..=total {
                    let mut got = vec![-1; end - start];
                    pattern.gather(&src, start, &mut got);
                    assert_eq!(got, expected[start..end], "{input:?} -> {output:?}");
                }
            }
        }
        assert_eq!(
            Broadcast::of(&[2, 1], &[2, 3]),
            Broadcast::Offsets(vec![0, 0, 0, 1, 1, 1])
        );
        assert_eq!(Broadcast::of(&[1, 3], &[2, 2, 3]), Broadcast::Repeat(3));
    }

    /// The chunked arithmetic gives, element for element, the bits of the
    /// scalar op, across chunk edges and with NaN-aware maxima.
    #[test]
    fn arithmetic_matches_the_scalar_ops() {
        let rows = 3;
        let cols = CHUNK / 2 + 7;
        let a: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut bias: Vec<f32> = (0..cols).map(|i| (i as f32 * 1.3).cos()).collect();
        bias[5] = f32::NAN;
        let same = Broadcast::of(&[rows, cols], &[rows, cols]);
        let over_rows = Broadcast::of(&[cols], &[rows, cols]);
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Maximum,
            BinaryOp::Pow,
        ] {
            let mut out = vec![0.0; rows * cols];
            arithmetic(op, (&a, &same), (&bias, &over_rows), &mut out);
            let f = arithmetic_f32(op);
            for (i, &o) in out.iter().enumerate() {
                let want = f(a[i], bias[i % cols]);
                assert!(
                    o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()),
                    "{op:?} at {i}: {o} vs {want}"
                );
            }
        }
    }
}
