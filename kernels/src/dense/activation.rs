//! Activation functions over slices, vectorized: SiLU and the tanh form of
//! GELU, both written as `x / (1 + exp(-y))` over one exponential, and GELU
//! with the exact erf, over erfc's Chebyshev fit (one exponential too).
//!
//! The exponential is Cephes' `expf` (Cody–Waite range reduction and a
//! degree-6 polynomial, within 2 ulp over the clamped range), written with
//! plain arithmetic so that the compiler vectorizes it. The same scalar code
//! is compiled for AVX-512, for AVX2 + FMA and for the baseline, chosen at run
//! time; Rust does not contract `a * b + c` into FMA, so every variant gives
//! bit-identical results, also the scalar `*_scalar` functions that constant
//! folding uses.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two, so that `n · LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Inputs beyond these give 0 or overflow.
const EXP_MIN: f32 = -87.336_55;
const EXP_MAX: f32 = 88.376_26;
/// 1.5 · 2^23: an integer-valued f32 of magnitude below 2^22 added to it
/// lands in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0;
const MAGIC_BITS: u32 = 0x4B40_0000;
/// sqrt(2 / pi), GELU-tanh's constant.
const GELU_C: f32 = 0.797_884_6;

/// `exp(x)`: 0 below the normal range, infinity above it.
#[inline(always)]
pub(crate) fn exp(input: f32) -> f32 {
    let x = input.clamp(EXP_MIN, EXP_MAX);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32
    let y = p * r * r + r + 1.0;
    let scale = pow2(n);
    if input > EXP_MAX {
        f32::INFINITY
    } else if input < EXP_MIN {
        0.0
    } else {
        y * scale
    }
}

/// `2^n` for an integer-valued `n` in [-126, 128] (128 gives infinity): the
/// exponent field alone. Adding 1.5 · 2^23 puts the integer in the low
/// mantissa bits (`MAGIC_BITS + n`), which vectorizes, where `n as i32`, a
/// saturating conversion, compiles to a scalar conversion a lane.
#[inline(always)]
fn pow2(n: f32) -> f32 {
    let n_bits = (n + MAGIC).to_bits().wrapping_sub(MAGIC_BITS);
    f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// SiLU of one value: `x · sigmoid(x)`.
#[inline(always)]
pub fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// GELU (tanh form) of one value:
/// `0.5·x·(1 + tanh(u)) = x · sigmoid(2u)`, `u = sqrt(2/π)·(x + 0.044715·x³)`.
#[inline(always)]
pub fn gelu_tanh_scalar(x: f32) -> f32 {
    let u = GELU_C * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp(-2.0 * u))
}

/// GELU with the exact erf (BERT's, PyTorch's default):
/// `0.5·x·(1 + erf(x/√2))`, as `0.5·x·erfc(|x|/√2)` for x < 0 (its tail,
/// which `1 + erf` would lose to cancellation) and `x − 0.5·x·erfc(x/√2)`
/// for x ≥ 0. erfc is Numerical Recipes' Chebyshev fit (`erfcc`: fractional
/// error below 1.2e-7 everywhere), written branch-free so that it vectorizes.
#[inline(always)]
pub fn gelu_scalar(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = 0.170_872_77;
    p = p * t - 0.822_152_23;
    p = p * t + 1.488_515_9;
    p = p * t - 1.135_204;
    p = p * t + 0.278_868_07;
    p = p * t - 0.186_288_06;
    p = p * t + 0.096_784_18;
    p = p * t + 0.374_091_96;
    p = p * t + 1.000_023_7;
    p = p * t - 1.265_512_2;
    // x clamped to finite: ±∞ meet a tail of 0 (GELU(∞) = ∞, GELU(-∞) = -0).
    let half_tail = 0.5 * x.clamp(-f32::MAX, f32::MAX) * (t * exp(p - z * z));
    if x < 0.0 {
        half_tail
    } else {
        x - half_tail
    }
}

macro_rules! vectorized {
    ($(#[$doc:meta])* $name:ident, $scalar:ident) => {
        $(#[$doc])*
        pub fn $name(x: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512(x: &mut [f32]) {
                    x.iter_mut().for_each(|v| *v = $scalar(*v));
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2(x: &mut [f32]) {
                    x.iter_mut().for_each(|v| *v = $scalar(*v));
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F.
                    return unsafe { avx512(x) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has AVX2 and FMA.
                    return unsafe { avx2(x) };
                }
            }
            x.iter_mut().for_each(|v| *v = $scalar(*v));
        }
    };
}

vectorized!(
    /// SiLU of every element, in place.
    silu,
    silu_scalar
);
vectorized!(
    /// GELU (tanh form) of every element, in place.
    gelu_tanh,
    gelu_tanh_scalar
);
vectorized!(
    /// GELU (exact erf) of every element, in place.
    gelu,
    gelu_scalar
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs from -100 to 100, dense near zero.
    fn inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (-20_000..=20_000).map(|i| i as f32 * 1e-3).collect();
        xs.extend((-100..=100).map(|i| i as f32));
        xs.extend([
            0.0, -0.0, 1e-30, -1e-30, 87.0, -87.0, 89.0, -89.0, 1e30, -1e30,
        ]);
        xs
    }

    #[test]
    fn pow2_is_exact_over_the_exponent_range() {
        for n in -126..=127 {
            assert_eq!(pow2(n as f32), 2f32.powi(n), "2^{n}");
        }
        assert_eq!(pow2(128.0), f32::INFINITY);
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64() {
        let mut worst = 0f64;
        for i in -87_000..=88_000 {
            let x = i as f32 * 1e-3;
            let want = f64::from(x).exp();
            let ulp = f64::from(f32::EPSILON) * want;
            worst = worst.max((f64::from(exp(x)) - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "{worst} ulp");
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn activations_match_their_definitions() {
        for x in inputs() {
            let xd = f64::from(x);
            let silu = xd / (1.0 + (-xd).exp());
            let u = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3));
            // 0.5·x·(1 + tanh u), in the form that keeps its digits for x ≪ 0.
            let gelu = xd / (1.0 + (-2.0 * u).exp());
            // The exponent's argument y is rounded to f32 first, which alone
            // moves exp(-y) by up to eps·|y| relative: the bound grows with |y|.
            for (got, want, y, what) in [
                (silu_scalar(x), silu, xd, "silu"),
                (gelu_tanh_scalar(x), gelu, 2.0 * u, "gelu_tanh"),
            ] {
                let err = (f64::from(got) - want).abs();
                let rtol = 4.0 * f64::from(f32::EPSILON) * (1.0 + y.abs());
                assert!(
                    err <= 1e-35 + rtol * want.abs(),
                    "{what}({x}) = {got}, want {want}"
                );
            }
        }
    }

    #[test]
    fn gelu_matches_the_exact_erf() {
        let mut worst = 0f64;
        for x in inputs() {
            let xd = f64::from(x);
            // 0.5·x·(1 + erf(x/√2)) = 0.5·x·erfc(-x/√2), erfc in f64 (libm).
            let want = 0.5 * xd * libm::erfc(-xd * std::f64::consts::FRAC_1_SQRT_2);
            let got = f64::from(gelu_scalar(x));
            if want.abs() > 1e-30 {
                // The fit's 1.2e-7 and f32's rounding of z² inside the
                // exponential (eps·z² relative).
                let z2 = xd * xd / 2.0;
                let rtol = 2e-7 + 2.0 * f64::from(f32::EPSILON) * (1.0 + z2);
                let err = (got - want).abs() / want.abs();
                assert!(err <= rtol, "gelu({x}) = {got}, want {want}");
                worst = worst.max(err / rtol);
            } else {
                assert!(got.abs() <= 1e-30, "gelu({x}) = {got}, want {want}");
            }
        }
        assert!(gelu_scalar(f32::NAN).is_nan());
        assert_eq!(gelu_scalar(f32::INFINITY), f32::INFINITY);
        assert_eq!(
            gelu_scalar(f32::NEG_INFINITY).to_bits(),
            (-0.0f32).to_bits()
        );
        assert!(worst > 0.0);
    }

    #[test]
    fn slices_equal_the_scalar_functions_bit_for_bit() {
        let xs = inputs();
        for (slice_fn, scalar) in [
            (silu as fn(&mut [f32]), silu_scalar as fn(f32) -> f32),
            (gelu_tanh, gelu_tanh_scalar),
            (gelu, gelu_scalar),
        ] {
            let mut ys = xs.clone();
            slice_fn(&mut ys);
            for (x, y) in xs.iter().zip(&ys) {
                assert_eq!(y.to_bits(), scalar(*x).to_bits(), "at {x}");
            }
        }
    }
}
