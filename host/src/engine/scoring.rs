//! A scored prompt's log-probabilities (vLLM's `prompt_logprobs`, and
//! `echo` with `logprobs` on completions): each prompt token's under the
//! logits of the position before it, gathered over the scored chunks the
//! scheduler runs, and sent once complete.

use rayon::prelude::*;

use super::service::{PromptLogprob, TokenLogprob};
use crate::runtime::sampling::{log_softmax, top_logprobs};
use crate::tokenizer::Tokenizer;

/// The log-probabilities of one prompt, filled chunk by chunk.
pub(super) struct PromptScores {
    /// Alternatives a position lists besides its token.
    top: usize,
    /// Tokens are named `token_id:ID` instead of by their text.
    as_ids: bool,
    /// One a prompt token; the first stays `None`.
    entries: Vec<Option<PromptLogprob>>,
    /// Handed over ([`PromptScores::take_ready`]).
    taken: bool,
}

impl PromptScores {
    /// The empty scores of a prompt of `len` tokens.
    pub fn new(len: usize, top: usize, as_ids: bool) -> Self {
        Self {
            top,
            as_ids,
            entries: vec![None; len],
            taken: false,
        }
    }

    /// The entries, the first time every token but the first has its
    /// log-probability.
    pub fn take_ready(&mut self) -> Option<Vec<Option<PromptLogprob>>> {
        let complete = self.entries.iter().skip(1).all(Option::is_some);
        if self.taken || !complete {
            return None;
        }
        self.taken = true;
        Some(self.entries.clone())
    }

    /// Records the logits `rows` of the positions from `start` on: row j
    /// scores prompt token `start + j + 1`. Rows past the prompt's last
    /// token are ignored, and so are all once the entries are taken (the
    /// sequence was preempted and recomputes its prompt).
    pub fn record(
        &mut self,
        prompt: &[u32],
        start: usize,
        rows: &[Vec<f32>],
        tokenizer: &Tokenizer,
    ) {
        if self.taken {
            return;
        }
        let scored: Vec<(usize, PromptLogprob)> = rows
            .par_iter()
            .enumerate()
            .filter_map(|(j, row)| {
                let position = start + j + 1;
                let token = *prompt.get(position)?;
                Some((position, self.score(row, token, tokenizer)))
            })
            .collect();
        for (position, entry) in scored {
            self.entries[position] = Some(entry);
        }
    }

    /// `token`'s log-probability under `logits`, its rank and the most
    /// likely alternatives.
    fn score(&self, logits: &[f32], token: u32, tokenizer: &Tokenizer) -> PromptLogprob {
        let lp = log_softmax(logits);
        let own = lp.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
        let rank = 1 + lp.iter().filter(|&&l| l > own).count();
        let text = |t| TokenLogprob::name(tokenizer, t, self.as_ids);
        let top = top_logprobs(&lp, self.top)
            .into_iter()
            .map(|(t, l)| (t, text(t), l))
            .collect();
        PromptLogprob {
            logprob: TokenLogprob {
                token,
                text: text(token),
                logprob: own,
                top,
            },
            rank,
        }
    }
}
