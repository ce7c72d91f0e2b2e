//! Repetition, frequency and presence penalties (vLLM / OpenAI semantics),
//! applied to logits before sampling.

use std::collections::HashMap;

/// Penalty parameters; the defaults change nothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// OpenAI `frequency_penalty`: minus this times each generated token's count.
    pub frequency: f32,
    /// OpenAI `presence_penalty`: minus this for each token generated at all.
    pub presence: f32,
    /// Hugging Face `repetition_penalty`: logits of tokens seen in the prompt or
    /// output are divided by it when positive, multiplied when negative.
    pub repetition: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self {
            frequency: 0.0,
            presence: 0.0,
            repetition: 1.0,
        }
    }
}

impl Penalties {
    /// True when applying them changes nothing.
    pub fn is_neutral(&self) -> bool {
        self.frequency == 0.0 && self.presence == 0.0 && self.repetition == 1.0
    }

    /// Checks the ranges, naming the offending parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !(-2.0..=2.0).contains(&self.frequency) {
            return Err(format!(
                "frequency_penalty must be in [-2, 2], got {}",
                self.frequency
            ));
        }
        if !(-2.0..=2.0).contains(&self.presence) {
            return Err(format!(
                "presence_penalty must be in [-2, 2], got {}",
                self.presence
            ));
        }
        if !(self.repetition > 0.0 && self.repetition.is_finite()) {
            return Err(format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition
            ));
        }
        Ok(())
    }

    /// Penalizes `logits` given the prompt and the tokens generated so far.
    pub fn apply(&self, logits: &mut [f32], prompt: &[u32], generated: &[u32]) {
        if self.is_neutral() {
            return;
        }
        if self.repetition != 1.0 {
            let mut seen: Vec<u32> = prompt.iter().chain(generated).copied().collect();
            seen.sort_unstable();
            seen.dedup();
            for token in seen {
                if let Some(l) = logits.get_mut(token as usize) {
                    *l = if *l > 0.0 {
                        *l / self.repetition
                    } else {
                        *l * self.repetition
                    };
                }
            }
        }
        if self.frequency != 0.0 || self.presence != 0.0 {
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for &token in generated {
                *counts.entry(token).or_default() += 1;
            }
            for (token, count) in counts {
                if let Some(l) = logits.get_mut(token as usize) {
                    *l -= self.frequency * count as f32 + self.presence;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_follow_their_definitions() {
        let mut logits = vec![2.0, -2.0, 1.0, 1.0];
        Penalties {
            repetition: 2.0,
            ..Penalties::default()
        }
        .apply(&mut logits, &[0], &[1]);
        assert_eq!(logits, [1.0, -4.0, 1.0, 1.0]);
        let mut logits = vec![1.0; 4];
        Penalties {
            frequency: 0.5,
            presence: 0.25,
            ..Penalties::default()
        }
        .apply(&mut logits, &[3], &[2, 2, 1]);
        assert_eq!(logits, [1.0, 0.25, -0.25, 1.0]);
        assert!(Penalties {
            presence: 3.0,
            ..Penalties::default()
        }
        .validate()
        .unwrap_err()
        .contains("presence_penalty"));
    }
}
