//! One request's sequence in the serving engine: its state, how its next
//! token is picked, and what happens when a pick comes back (text, stop
//! conditions, events).

use std::time::Instant;

use llguidance::Matcher;
use tokio::sync::mpsc::UnboundedSender;

use super::sampling::Sampler;
use super::service::{Event, FinishReason, GenerationParams, TokenLogprob};
use super::stop::{StopMatcher, StopOutcome};
use super::structured;
use crate::runtime::sampling::{RowSampling, Sampled};
use crate::tokenizer::{DecodeStream, Tokenizer};

/// One running request's state.
pub(super) struct Active<'t> {
    pub prompt: Vec<u32>,
    pub params: GenerationParams,
    sampler: Sampler,
    pub generated: Vec<u32>,
    decoder: DecodeStream<'t>,
    stop: StopMatcher,
    pub events: UnboundedSender<Event>,
    pub arrived: Instant,
    pub last_token: Option<Instant>,
    /// It ran in a step (its queue time is recorded).
    pub scheduled: bool,
    constraint: Option<Matcher>,
    /// A launched step picks its next token; the host has not read it yet.
    pub awaiting: bool,
}

impl<'t> Active<'t> {
    /// A new request's state.
    pub fn new(request: super::service::Request, tokenizer: &'t Tokenizer) -> Self {
        Self {
            sampler: Sampler::new(request.params.sampling.clone()),
            decoder: tokenizer.decode_stream(true),
            stop: StopMatcher::new(request.params.stop.clone()),
            prompt: request.prompt,
            params: request.params,
            generated: Vec::new(),
            events: request.events,
            arrived: request.arrived,
            last_token: None,
            scheduled: false,
            constraint: request.constraint,
            awaiting: false,
        }
    }

    /// Whether a grammar constrains its output.
    pub fn constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Whether the pick on the way leaves room for more (`max_tokens`).
    pub fn continues_after_pick(&self) -> bool {
        self.generated.len() + usize::from(self.awaiting) < self.params.max_tokens
    }

    /// How the backend picks this sequence's next token: its sampler's
    /// filters and draw, its penalties, a ban on ending before
    /// `min_tokens`, and its grammar's mask.
    pub fn row_sampling(&mut self, eos: &[u32]) -> Result<RowSampling, String> {
        let allowed = match &mut self.constraint {
            Some(matcher) => Some(
                structured::allowed_tokens(matcher)
                    .map_err(|e| format!("structured output: {e}"))?,
            ),
            None => None,
        };
        let params = &self.params;
        // A pick on the way counts: this row picks the token after it.
        let generated = self.generated.len() + usize::from(self.awaiting);
        let suppress_eos = !params.ignore_eos && generated < params.min_tokens;
        let banned: Vec<u32> = if suppress_eos {
            eos.iter().chain(&params.stop_token_ids).copied().collect()
        } else {
            Vec::new()
        };
        let penalties = params.penalties;
        Ok(RowSampling {
            repetition: penalties.repetition,
            frequency: penalties.frequency,
            presence: penalties.presence,
            adjustments: penalties.adjustments(
                &self.prompt,
                &self.generated,
                &params.logit_bias,
                &banned,
            ),
            logprobs: params.logprobs,
            allowed,
            ..self.sampler.next_row()
        })
    }

    /// Takes the sequence's pick and sends its text; returns how the
    /// sequence ends, if it does, or why it fails.
    pub fn take_pick(
        &mut self,
        sampled: Sampled,
        tokenizer: &Tokenizer,
        eos: &[u32],
    ) -> Result<Option<FinishReason>, String> {
        self.awaiting = false;
        let token = sampled.token;
        let mut grammar_done = false;
        if let Some(matcher) = &mut self.constraint {
            matcher
                .consume_token(token)
                .map_err(|e| format!("structured output: {e}"))?;
            grammar_done = matcher.is_stopped();
        }
        let params = &self.params;
        self.generated.push(token);
        let logprob = sampled.logprob.map(|logprob| {
            let text = |t: u32| tokenizer.decode(&[t], false).unwrap_or_default();
            TokenLogprob {
                token,
                text: text(token),
                logprob,
                top: sampled
                    .top
                    .iter()
                    .map(|&(t, lp)| (t, text(t), lp))
                    .collect(),
            }
        });

        let is_eos = !params.ignore_eos && eos.contains(&token);
        let is_stop_token = params.stop_token_ids.contains(&token);
        let piece = if is_eos || is_stop_token {
            None
        } else {
            self.decoder.step(token).ok().flatten()
        };
        let (text, stopped_by_string) = match self.stop.push(piece.as_deref().unwrap_or("")) {
            StopOutcome::Continue(text) => (text, false),
            StopOutcome::Stop(text) => (text, true),
        };
        let finish = if is_eos || is_stop_token || stopped_by_string || grammar_done {
            Some(FinishReason::Stop)
        } else if self.generated.len() >= params.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        // At the end, release what the decoder and the stop matcher still hold.
        let mut text = text;
        if finish == Some(FinishReason::Length) || grammar_done {
            if let Ok(Some(rest)) = self.decoder.flush() {
                let (StopOutcome::Continue(more) | StopOutcome::Stop(more)) = self.stop.push(&rest);
                text.push_str(&more);
            }
            text.push_str(&self.stop.finish());
        }
        let _ = self.events.send(Event::Chunk {
            text,
            token,
            logprob,
        });
        Ok(finish)
    }
}
