//! Repetition, frequency and presence penalties (vLLM / OpenAI semantics),
//! applied to logits before sampling.

use std::collections::BTreeMap;

use crate::runtime::sampling::TokenAdjustment;

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

    /// The tokens these penalties touch given the prompt and the output so
    /// far, with `bias` added to their logits (`logit_bias`) and `banned`
    /// tokens suppressed; the backend applies them (repetition first, then
    /// frequency and presence, then the bias).
    pub fn adjustments(
        &self,
        prompt: &[u32],
        generated: &[u32],
        bias: &[(u32, f32)],
        banned: &[u32],
    ) -> Vec<TokenAdjustment> {
        let mut by_token: BTreeMap<u32, TokenAdjustment> = BTreeMap::new();
        if self.repetition != 1.0 {
            for &token in prompt.iter().chain(generated) {
                by_token.entry(token).or_insert_with(|| blank(token)).seen = true;
            }
        }
        if self.frequency != 0.0 || self.presence != 0.0 {
            for &token in generated {
                by_token
                    .entry(token)
                    .or_insert_with(|| blank(token))
                    .generated += 1;
            }
        }
        for &(token, b) in bias {
            by_token.entry(token).or_insert_with(|| blank(token)).bias += b;
        }
        for &token in banned {
            by_token.entry(token).or_insert_with(|| blank(token)).banned = true;
        }
        by_token.into_values().collect()
    }
}

fn blank(token: u32) -> TokenAdjustment {
    TokenAdjustment {
        token,
        generated: 0,
        seen: false,
        banned: false,
        bias: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_list_the_tokens_they_touch() {
        let touched = Penalties {
            repetition: 2.0,
            frequency: 0.5,
            ..Penalties::default()
        }
        .adjustments(&[0, 3], &[2, 2, 1], &[], &[7]);
        let summary: Vec<(u32, u32, bool, bool)> = touched
            .iter()
            .map(|a| (a.token, a.generated, a.seen, a.banned))
            .collect();
        assert_eq!(
            summary,
            [
                (0, 0, true, false),
                (1, 1, true, false),
                (2, 2, true, false),
                (3, 0, true, false),
                (7, 0, false, true)
            ]
        );
        assert!(Penalties::default()
            .adjustments(&[1], &[2], &[], &[])
            .is_empty());
        assert!(Penalties {
            presence: 3.0,
            ..Penalties::default()
        }
        .validate()
        .unwrap_err()
        .contains("presence_penalty"));
    }
}
