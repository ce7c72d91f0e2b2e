//! Reference quantizers of the K-quants (Q2_K to Q6_K): super-blocks of 256
//! values, exactly as ggml's `quantize_row_q{2,3,4,5,6}_K_ref` compute them
//! (what `llama-quantize` writes without an importance matrix). Each sub-block's scale (and minimum) is
//! searched for the least weighted squared error, then the super-block's
//! scales are themselves quantized and every value re-rounded against the
//! stored ones. The float operations keep ggml's order, so the bytes match.

use half::f16;

use super::format::{k4_scales_mins, q3k_scales};
use super::quantize::signed_max;

/// Values a super-block holds.
pub(super) const QK_K: usize = 256;

/// Below this, a group of values counts as all zero (ggml's `GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: rounds to the nearest integer, ties to even, by
/// adding 1.5·2²³ (exact for |v| < 2²²).
#[inline]
pub(super) fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// The f16 a block stores, and the f32 it reads back.
#[inline]
fn round_f16(v: f32) -> (f16, f32) {
    let h = f16::from_f32(v);
    (h, h.to_f32())
}

/// How [`fit_scale_min`] searches: `(rmin, rdelta, nstep)`, and whether
/// it weighs absolute errors (`true`) or squared ones.
type Search = ((f32, f32, i32), bool);

/// A scale and minimum search (ggml's `make_qkx2_quants`): levels `l` in
/// `0..=nmax` such that `scale·l − min` approximates `x` under `weights`,
/// trying `nstep + 1` scales from `(nmax + rmin) / range` in steps of
/// `rdelta / range`. Writes the levels, returns `(scale, min)` with
/// `min ≥ 0` the amount subtracted.
fn fit_scale_min(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    ((rmin, rdelta, nstep), mad): Search,
    levels: &mut [u8],
) -> (f32, f32) {
    let error = |diff: f32| if mad { diff.abs() } else { diff * diff };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let level = |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *l = level(iscale, min, v) as u8;
        best_error += w * error(scale * *l as f32 + min - v);
    }
    let mut trial = [0u8; 32];
    let trial = &mut trial[..x.len()];
    for step in 0..=nstep {
        iscale = (rmin + rdelta * step as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for ((t, &v), &w) in trial.iter_mut().zip(x).zip(weights) {
            let l = level(iscale, min, v);
            *t = l as u8;
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut trial_error = 0f32;
            for ((&t, &v), &w) in trial.iter().zip(x).zip(weights) {
                trial_error += w * error(this_scale * t as f32 + this_min - v);
            }
            if trial_error < best_error {
                levels.copy_from_slice(trial);
                best_error = trial_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// A symmetric scale search (ggml's `make_qx_quants` with weights `x²`):
/// levels `l + nmax`, `l` in `-nmax..nmax`, such that `scale·l`
/// approximates `x`, trying 19 scales around `nmax / max`. Writes the
/// levels, returns the scale (0 for a group of zeros).
fn fit_scale(x: &[f32], nmax: i32, levels: &mut [u8]) -> f32 {
    let max = signed_max(x);
    if max.abs() < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    // Σ w·x·l and Σ w·l² at `iscale`, w = x².
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let l = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let write = |iscale: f32, levels: &mut [u8]| {
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = (level(iscale, v) + nmax) as u8;
        }
    };
    let iscale = -(nmax as f32) / max;
    write(iscale, levels);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for step in (-9..=9).filter(|&s| s != 0) {
        let iscale = -(nmax as f32 + 0.1 * step as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            write(iscale, levels);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// A symmetric search refined level by level (ggml's `make_q3_quants`,
/// weights `x²`): levels `l + nmax`, `l` in `-nmax..nmax`, each moved to
/// where it best fits the others' scale, for up to five passes. Writes the
/// levels, returns the scale (0 for a group of zeros).
fn fit_scale_refined(x: &[f32], nmax: i32, levels: &mut [u8]) -> f32 {
    let max = signed_max(x);
    if max.abs() < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let l = &mut l[..x.len()];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (l, &v) in l.iter_mut().zip(x) {
        *l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * *l as f32;
        suml2 += w * *l as f32 * *l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (l, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let mut slx = sumlx - w * v * *l as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *l as f32 * *l as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *l {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (out, &l) in levels.iter_mut().zip(l.iter()) {
        *out = (l + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The 16 sub-block scales of a Q3_K or Q6_K super-block by `fit` (which
/// writes each sub-block's levels), and the first of the largest magnitude,
/// with its sign.
fn signed_scales(
    x: &[f32],
    levels: &mut [u8; QK_K],
    fit: impl Fn(&[f32], &mut [u8]) -> f32,
) -> ([f32; 16], f32) {
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs) = (0f32, 0f32);
    for ((scale, x), levels) in scales
        .iter_mut()
        .zip(x.chunks_exact(16))
        .zip(levels.chunks_exact_mut(16))
    {
        *scale = fit(x, levels);
        if scale.abs() > max_abs {
            max_abs = scale.abs();
            max_scale = *scale;
        }
    }
    (scales, max_scale)
}

/// Packs 256 two-bit levels as Q2_K and Q3_K store them: of each 128,
/// byte `l` holds levels `l`, `l + 32`, `l + 64` and `l + 96`, two bits each.
fn pack_two_bits(levels: &[u8; QK_K], qs: &mut [u8]) {
    for (q, levels) in qs.chunks_exact_mut(32).zip(levels.chunks_exact(128)) {
        for (l, q) in q.iter_mut().enumerate() {
            *q = levels[l] | (levels[l + 32] << 2) | (levels[l + 64] << 4) | (levels[l + 96] << 6);
        }
    }
}

/// 256 values as a Q2_K block's 84 bytes (ggml's `quantize_row_q2_K_ref`):
/// 16 bytes of four-bit scales and minimums, 64 of two-bit levels, the f16
/// scale and minimum scale.
pub(super) fn q2_k_block(x: &[f32], block: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    let mut weights = [0f32; 16];
    for (j, (x, levels)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        for (w, &v) in weights.iter_mut().zip(x) {
            *w = v.abs();
        }
        (scales[j], mins[j]) = fit_scale_min(x, &weights, 3, ((-0.5, 0.1, 15), true), levels);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let packed = &mut block[..16];
    packed.fill(0);
    let (mut d, mut dmin) = (f16::ZERO, f16::ZERO);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (p, &scale) in packed.iter_mut().zip(&scales) {
            *p = nearest_int(iscale * scale) as u8;
        }
        d = f16::from_f32(max_scale / Q4SCALE);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (p, &min) in packed.iter_mut().zip(&mins) {
            *p |= (nearest_int(iscale * min) << 4) as u8;
        }
        dmin = f16::from_f32(max_min / Q4SCALE);
    }
    for (j, (x, levels)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        let scale = d.to_f32() * (packed[j] & 0xF) as f32;
        if scale == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * (packed[j] >> 4) as f32;
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = nearest_int((v + dm) / scale).clamp(0, 3) as u8;
        }
    }
    pack_two_bits(&levels, &mut block[16..80]);
    block[80..82].copy_from_slice(&d.to_le_bytes());
    block[82..84].copy_from_slice(&dmin.to_le_bytes());
}

/// 256 values as a Q3_K block's 110 bytes (ggml's `quantize_row_q3_K_ref`):
/// 32 bytes of high bits, 64 of low two-bit levels, 12 of six-bit signed
/// scales, the f16 super-block scale.
pub(super) fn q3_k_block(x: &[f32], block: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let (scales, max_scale) = signed_scales(x, &mut levels, |x, l| fit_scale_refined(x, 4, l));
    let packed = &mut block[96..108];
    packed.fill(0);
    let mut d = f16::ZERO;
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &scale) in scales.iter().enumerate() {
            let l = ((nearest_int(iscale * scale) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                packed[j] = l & 0xF;
            } else {
                packed[j - 8] |= (l & 0xF) << 4;
            }
            packed[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        d = f16::from_f32(1.0 / iscale);
    }
    let sc = q3k_scales(packed);
    for (j, (x, levels)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        let scale = d.to_f32() * sc[j] as f32;
        if scale == 0.0 {
            continue;
        }
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = (nearest_int(v / scale).clamp(-4, 3) + 4) as u8;
        }
    }
    // Bit 2 of each level into the high-bit mask: level j's in bit j / 32
    // of byte j % 32.
    let (hmask, rest) = block.split_at_mut(32);
    hmask.fill(0);
    for (j, l) in levels.iter_mut().enumerate() {
        if *l > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *l -= 4;
        }
    }
    pack_two_bits(&levels, &mut rest[..64]);
    block[108..110].copy_from_slice(&d.to_le_bytes());
}

/// The levels of a Q4_K or Q5_K super-block (`nmax` 15 or 31), written
/// into `levels`; the f16 scale, minimum scale and 12 packed six-bit
/// scales and minimums into `head` (the block's first 16 bytes).
fn k4_super_block(
    x: &[f32],
    nmax: i32,
    search: (f32, f32, i32),
    head: &mut [u8],
    levels: &mut [u8; QK_K],
) {
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    let mut weights = [0f32; 32];
    for (j, (x, levels)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let mut sum_x2 = 0f32;
        for &v in x {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(x) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = fit_scale_min(x, &weights, nmax, (search, false), levels);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut head[4..16];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, d_f32) = round_f16(max_scale / 63.0);
    let (dmin, dmin_f32) = round_f16(max_min / 63.0);
    head[..2].copy_from_slice(&d.to_le_bytes());
    head[2..4].copy_from_slice(&dmin.to_le_bytes());
    let (sc, m) = k4_scales_mins(&head[4..16]);
    for (j, (x, levels)) in x
        .chunks_exact(32)
        .zip(levels.chunks_exact_mut(32))
        .enumerate()
    {
        let d = d_f32 * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_f32 * m[j] as f32;
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = nearest_int((v + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

/// 256 values as a Q4_K block's 144 bytes (ggml's `quantize_row_q4_K_ref`).
pub(super) fn q4_k_block(x: &[f32], block: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    k4_super_block(x, 15, (-1.0, 0.1, 20), &mut block[..16], &mut levels);
    for (q, levels) in block[16..]
        .chunks_exact_mut(32)
        .zip(levels.chunks_exact(64))
    {
        for (l, q) in q.iter_mut().enumerate() {
            *q = levels[l] | (levels[l + 32] << 4);
        }
    }
}

/// 256 values as a Q5_K block's 176 bytes (ggml's `quantize_row_q5_K_ref`).
pub(super) fn q5_k_block(x: &[f32], block: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    k4_super_block(x, 31, (-0.5, 0.1, 15), &mut block[..16], &mut levels);
    let (qh, qs) = block[16..].split_at_mut(32);
    qh.fill(0);
    for (pair, (q, levels)) in qs
        .chunks_exact_mut(32)
        .zip(levels.chunks_exact(64))
        .enumerate()
    {
        for (l, q) in q.iter_mut().enumerate() {
            let (low, high) = (levels[l], levels[l + 32]);
            qh[l] |= ((low >> 4) << (2 * pair)) | ((high >> 4) << (2 * pair + 1));
            *q = (low & 0xF) | ((high & 0xF) << 4);
        }
    }
}

/// 256 values as a Q6_K block's 210 bytes (ggml's `quantize_row_q6_K_ref`):
/// 128 bytes of low nibbles, 64 of high bit pairs, 16 eight-bit scales,
/// the f16 super-block scale.
pub(super) fn q6_k_block(x: &[f32], block: &mut [u8]) {
    let mut levels = [0u8; QK_K];
    let (scales, max_scale) = signed_scales(x, &mut levels, |x, l| fit_scale(x, 32, l));
    if max_scale.abs() < GROUP_MAX_EPS {
        block.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    let (d, d_f32) = round_f16(1.0 / iscale);
    block[208..210].copy_from_slice(&d.to_le_bytes());
    for (s, &scale) in block[192..208].iter_mut().zip(&scales) {
        *s = nearest_int(iscale * scale).min(127) as i8 as u8;
    }
    for (j, (x, levels)) in x
        .chunks_exact(16)
        .zip(levels.chunks_exact_mut(16))
        .enumerate()
    {
        let d = d_f32 * block[192 + j] as i8 as f32;
        if d == 0.0 {
            continue;
        }
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = (nearest_int(v / d).clamp(-32, 31) + 32) as u8;
        }
    }
    let (ql, qh) = block[..192].split_at_mut(128);
    for (half, levels) in levels.chunks_exact(128).enumerate() {
        let (ql, qh) = (&mut ql[64 * half..][..64], &mut qh[32 * half..][..32]);
        for l in 0..32 {
            let q = |k: usize| levels[l + 32 * k];
            ql[l] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            ql[l + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            qh[l] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        for (v, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.51, -8),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }

    #[test]
    fn a_constant_group_has_no_scale() {
        let mut levels = [7u8; 32];
        assert_eq!(
            fit_scale_min(
                &[0.0; 32],
                &[1.0; 32],
                15,
                ((-1.0, 0.1, 20), false),
                &mut levels
            ),
            (0.0, -0.0)
        );
        assert_eq!(levels, [0; 32]);
        let mut levels = [7u8; 16];
        assert_eq!(fit_scale(&[0.0; 16], 32, &mut levels), 0.0);
        assert_eq!(levels, [0; 16]);
    }

    #[test]
    fn the_scale_search_fits_a_ramp_exactly() {
        // 0, 0.25, ..: levels 0..=15 of scale 0.25 and no minimum, which no
        // other trial beats.
        let x: Vec<f32> = (0..32).map(|i| (i % 16) as f32 * 0.25).collect();
        let mut levels = [0u8; 32];
        let (scale, min) = fit_scale_min(&x, &[1.0; 32], 15, ((-1.0, 0.1, 20), false), &mut levels);
        assert_eq!((scale, min), (0.25, -0.0));
        for (i, &l) in levels.iter().enumerate() {
            assert_eq!(l as usize, i % 16);
        }
    }
}
