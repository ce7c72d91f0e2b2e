//! Rotary position embeddings and their frequency scalings (default, linear,
//! Llama 3, per-frequency factors, YaRN), computed like Hugging Face transformers does.

use serde::{Deserialize, Serialize};

use crate::graph::{ops, DType, TensorValue};

/// How the rotary frequencies are scaled for long contexts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// No scaling.
    Default,
    /// Positions divided by `factor`.
    Linear {
        /// The scaling factor.
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// The scaling factor.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are scaled fully.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are not scaled.
        high_freq_factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
    },
    /// Per-frequency divisors of the inverse frequencies: how a GGUF file
    /// stores Llama 3's scaling (`rope_freqs.weight`, one per rotated pair).
    FreqFactors {
        /// The divisors, `[head_dim / 2]`.
        factors: Vec<f64>,
    },
    /// YaRN: interpolation blended with extrapolation, plus attention scaling.
    Yarn {
        /// The scaling factor.
        factor: f64,
        /// The context length the model was trained with.
        original_max_position_embeddings: f64,
        /// Fast boundary, in rotations (default 32).
        beta_fast: f64,
        /// Slow boundary, in rotations (default 1).
        beta_slow: f64,
        /// Overrides the attention factor.
        attention_factor: Option<f64>,
        /// DeepSeek-style mscale numerator (0: unused).
        mscale: f64,
        /// DeepSeek-style mscale denominator (0: unused).
        mscale_all_dim: f64,
        /// Round the correction range to whole dimensions (default true).
        truncate: bool,
    },
}

/// Rotary position embedding over `head_dim`.
#[derive(Clone, Debug, PartialEq)]
pub struct RotaryEmbedding {
    /// Rotated dimensions per head.
    pub head_dim: u64,
    /// Base (`rope_theta`).
    pub theta: f64,
    /// Frequency scaling.
    pub scaling: RopeScaling,
    /// Rotate adjacent pairs (GGUF llama) instead of halves (Hugging Face).
    pub interleaved: bool,
}

impl RotaryEmbedding {
    /// Unscaled rotary embedding, rotating halves.
    pub fn new(head_dim: u64, theta: f64) -> Self {
        Self {
            head_dim,
            theta,
            scaling: RopeScaling::Default,
            interleaved: false,
        }
    }

    /// The inverse frequencies `[head_dim / 2]`, in f32 like transformers.
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.head_dim as usize;
        let base = self.theta as f32;
        let plain: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32))
            .collect();
        match &self.scaling {
            RopeScaling::Default => plain,
            RopeScaling::Linear { factor } => plain.iter().map(|f| f / *factor as f32).collect(),
            // One value per factor: a count other than `head_dim / 2` gives
            // an `inv_freq` the rope op rejects when the graph is built.
            RopeScaling::FreqFactors { factors } => factors
                .iter()
                .enumerate()
                .map(|(i, &d)| 1.0 / base.powf((2 * i) as f32 / dim as f32) / d as f32)
                .collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let (factor, low, high, original) = (
                    *factor as f32,
                    *low_freq_factor as f32,
                    *high_freq_factor as f32,
                    *original_max_position_embeddings as f32,
                );
                let low_freq_wavelen = original / low;
                let high_freq_wavelen = original / high;
                plain
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let smooth = (original / wavelen - low) / (high - low);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let correction_dim = |rotations: f64| {
                    (dim as f64
                        * (original_max_position_embeddings
                            / (rotations * 2.0 * std::f64::consts::PI))
                            .ln())
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (correction_dim(*beta_fast), correction_dim(*beta_slow));
                if *truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0) as f32;
                let mut high = high.min(dim as f64 - 1.0) as f32;
                if low == high {
                    high += 0.001;
                }
                (0..dim / 2)
                    .map(|i| {
                        let pos_freq = base.powf((2 * i) as f32 / dim as f32);
                        let extrapolation = 1.0 / pos_freq;
                        let interpolation = 1.0 / (*factor as f32 * pos_freq);
                        let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        interpolation * (1.0 - extrapolation_factor)
                            + extrapolation * extrapolation_factor
                    })
                    .collect()
            }
        }
    }

    /// The factor YaRN applies to cos and sin (1 for every other scaling).
    pub fn attention_factor(&self) -> f32 {
        let RopeScaling::Yarn {
            factor,
            attention_factor,
            mscale,
            mscale_all_dim,
            ..
        } = &self.scaling
        else {
            return 1.0;
        };
        let get_mscale = |scale: f64, m: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * m * scale.ln() + 1.0
            }
        };
        let value = match attention_factor {
            Some(value) => *value,
            None if *mscale != 0.0 && *mscale_all_dim != 0.0 => {
                get_mscale(*factor, *mscale) / get_mscale(*factor, *mscale_all_dim)
            }
            None => get_mscale(*factor, 1.0),
        };
        value as f32
    }

    /// Rotates `x [T, heads, dim]` at `positions [T]`: all of each head
    /// when `head_dim` is `dim`; its first `head_dim` dimensions when fewer
    /// (partial rotary: GPT-NeoX, Phi-2), the rest passing through; none when
    /// `head_dim` is 0 (layers without rotary, as SmolLM3's every fourth).
    pub fn forward(&self, x: &TensorValue, positions: &TensorValue) -> TensorValue {
        if self.head_dim == 0 {
            return x.clone();
        }
        let dim = x.shape().last().and_then(|d| d.as_static()).unwrap_or(0);
        if self.head_dim < dim {
            let rotated = self.head_dim as i64;
            let head = ops::slice(x, -1, 0, Some(rotated), 1);
            let rest = ops::slice(x, -1, rotated, None, 1);
            return ops::concat(&[&self.forward(&head, positions), &rest], -1);
        }
        let inv_freq = self.inv_freq();
        let inv_freq = x.graph().constant(
            inv_freq.iter().map(|&f| f64::from(f)).collect(),
            DType::F32,
            &[inv_freq.len() as u64],
        );
        ops::rope(
            x,
            positions,
            &inv_freq,
            self.interleaved,
            self.attention_factor(),
        )
    }
}
