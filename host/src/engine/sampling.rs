//! Choosing the next token from logits: temperature, top-k, top-p, min-p,
//! with a seeded generator so a request with a seed is reproducible.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use crate::runtime::sampling::argmax;
use crate::runtime::sampling::{sample_row, RowSampling, MIN_TEMPERATURE};

/// Sampling parameters (OpenAI / vLLM semantics).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (0: none).
    pub min_p: f32,
    /// Seed of the generator (`None`: from the OS).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Whether it picks the most likely token (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_TEMPERATURE
    }

    /// Checks the ranges, naming the offending parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        Ok(())
    }
}

/// A sampler: parameters plus its random state. The backend picks the
/// token ([`crate::runtime::sampling`]); the sampler supplies the draw, so a
/// seeded request is reproducible on every backend.
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

impl Sampler {
    /// A sampler with `params` (seeded if they say so).
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Self { params, rng }
    }

    /// How to pick the next token: the filters and a fresh draw (drawn only
    /// when sampling, so greedy requests consume none).
    pub fn next_row(&mut self) -> RowSampling {
        let p = &self.params;
        RowSampling {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            uniform: if p.is_greedy() {
                0.0
            } else {
                self.rng.random::<f32>()
            },
            ..RowSampling::greedy()
        }
    }

    /// Picks the next token of `logits` on the host.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        sample_row(logits, &self.next_row()).token
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: Some(seed),
        })
    }

    #[test]
    fn greedy_takes_the_argmax() {
        assert_eq!(sampler(0.0, 0, 1.0, 0.0, 1).sample(&[0.1, 3.0, 2.9]), 1);
    }

    #[test]
    fn filters_restrict_the_choice() {
        let logits = [2.0, 1.9, 1.8, -5.0];
        for seed in 0..200 {
            assert_eq!(
                sampler(1.0, 1, 1.0, 0.0, seed).sample(&logits),
                0,
                "top_k = 1"
            );
            assert!(
                sampler(1.0, 0, 0.5, 0.0, seed).sample(&logits) <= 1,
                "top_p = 0.5 keeps two"
            );
            assert!(
                sampler(1.0, 0, 1.0, 0.5, seed).sample(&logits) <= 2,
                "min_p drops the unlikely one"
            );
        }
    }

    #[test]
    fn seeds_reproduce_and_distributions_follow_the_logits() {
        let logits = [0.0, (3.0f32).ln()]; // p = 0.25, 0.75
        let draws = |seed| {
            let mut s = sampler(1.0, 0, 1.0, 0.0, seed);
            (0..4000).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        let ones = draws(7).iter().filter(|&&t| t == 1).count() as f64 / 4000.0;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }

    #[test]
    fn validation_names_the_parameter() {
        let bad = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        };
        assert!(bad.validate().unwrap_err().contains("top_p"));
    }
}
