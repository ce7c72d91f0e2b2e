//! Quantizers of IQ4_NL and IQ4_XS: 4-bit indices into ggml's non-linear
//! table ([`IQ4_VALUES`]) times a block's scale, exactly as ggml's
//! `quantize_iq4_nl` and `quantize_iq4_xs` compute them without an
//! importance matrix (what `llama-quantize` writes): each block of 32
//! weighs its values by their squares and tries 15 scales around
//! `max / 127`; IQ4_XS then stores the blocks' scales as six-bit steps of
//! its super-block's.

use half::f16;

use super::format::IQ4_VALUES;
use super::quantize::signed_max;
use super::quantize_k::{nearest_int, GROUP_MAX_EPS};

/// Trial scales either side of the first guess (ggml's `ntry`).
const NTRY: i32 = 7;

/// The table value of index `i`.
fn value(i: usize) -> f32 {
    f32::from(IQ4_VALUES[i])
}

/// The index of the table value nearest `x`, the upper one on a tie
/// (ggml's `best_index_int8`, by bisection).
fn nearest_index(x: f32) -> u8 {
    if x <= value(0) {
        return 0;
    }
    if x >= value(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < value(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - value(hi - 1) < value(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// The scale of a block of 32 values: the best fit of 16 trials, weights
/// `x²`; 0 for a block of zeros.
fn block_scale(x: &[f32]) -> f32 {
    let max = signed_max(x);
    if max.abs() < GROUP_MAX_EPS {
        return 0.0;
    }
    // Σ w·q·x and Σ w·q² with the indices nearest `id·x`.
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for &v in x {
            let q = value(nearest_index(id * v) as usize);
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let (sumqx, sumq2) = sums(1.0 / (-max / value(0)));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for trial in -NTRY..=NTRY {
        let (sumqx, sumq2) = sums((trial + i32::from(IQ4_VALUES[0])) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 values' indices at `scale`'s inverse `id` into 16 bytes: value
/// `j` in the low nibble of byte `j`, value `j + 16` in its high nibble.
fn pack_indices(x: &[f32], id: f32, qs: &mut [u8]) {
    for (j, q) in qs.iter_mut().enumerate() {
        *q = nearest_index(id * x[j]) | (nearest_index(id * x[j + 16]) << 4);
    }
}

/// The inverse of a scale, 0 for 0.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// 32 values as an IQ4_NL block's 18 bytes.
pub(super) fn iq4_nl_block(x: &[f32], block: &mut [u8]) {
    let d = block_scale(x);
    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    pack_indices(x, inverse(d), &mut block[2..18]);
}

/// 256 values as an IQ4_XS block's 136 bytes: the f16 super-block scale,
/// the top two bits of the eight blocks' scales, their low four bits, the
/// indices.
pub(super) fn iq4_xs_block(x: &[f32], block: &mut [u8]) {
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for (scale, x) in scales.iter_mut().zip(x.chunks_exact(32)) {
        *scale = block_scale(x);
        if scale.abs() > amax_scale {
            amax_scale = scale.abs();
            max_scale = *scale;
        }
    }
    let d = -max_scale / 32.0;
    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    let id = inverse(d);
    let mut high = 0u16;
    let (low, qs) = block[4..].split_at_mut(4);
    for (ib, (&scale, x)) in scales.iter().zip(x.chunks_exact(32)).enumerate() {
        let l = nearest_int(id * scale).clamp(-32, 31);
        pack_indices(x, inverse(d * l as f32), &mut qs[16 * ib..16 * ib + 16]);
        let l = (l + 32) as u8;
        if ib % 2 == 0 {
            low[ib / 2] = l & 0xF;
        } else {
            low[ib / 2] |= (l & 0xF) << 4;
        }
        high |= u16::from(l >> 4) << (2 * ib);
    }
    block[2..4].copy_from_slice(&high.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_pick_the_nearest_value_and_the_upper_on_a_tie() {
        for (x, want) in [
            (-200.0, 0),
            (-127.0, 0),
            (0.0, 8),
            (-4.6, 7),
            (-4.5, 8),
            (6.9, 8),
            (7.0, 9),
            (500.0, 15),
        ] {
            assert_eq!(nearest_index(x), want, "{x}");
        }
    }

    #[test]
    fn a_block_of_zeros_has_no_scale() {
        assert_eq!(block_scale(&[0.0; 32]), 0.0);
        let mut block = [0xAAu8; 18];
        iq4_nl_block(&[0.0; 32], &mut block);
        assert_eq!(block[..2], [0, 0]);
        // Index 8 (value 1) is the nearest to 0.
        assert!(block[2..].iter().all(|&b| b == 0x88));
    }
}
