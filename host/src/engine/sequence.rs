//! One request's sequence in the serving engine: its state, how its next
//! token is picked, and what happens when a pick comes back (text, stop
//! conditions, events).

use std::borrow::Cow;
use std::time::Instant;

use llguidance::Matcher;
use tokio::sync::mpsc::UnboundedSender;

use super::sampling::Sampler;
use super::scoring::PromptScores;
use super::service::{Event, FinishReason, GenerationParams, StopReason, TokenLogprob};
use super::speculative::NgramIndex;
use super::stop::{StopMatcher, StopOutcome};
use super::structured;
use crate::runtime::sampling::{Draft, RowSampling, Sampled};
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
    /// While `Some`, the text the output must show before the grammar
    /// applies (a reasoning model's end of thinking), and the output's last
    /// text, as long as it.
    grammar_after: Option<(String, String)>,
    /// A launched step picks its next token; the host has not read it yet.
    pub awaiting: bool,
    /// The stop string or stop token that ended it.
    pub stop_reason: Option<StopReason>,
    /// Its prompt's log-probabilities, when asked for.
    prompt_scores: Option<PromptScores>,
    /// Its n-gram lookup for drafts (speculative decoding).
    pub ngram: NgramIndex,
}

impl<'t> Active<'t> {
    /// A new request's state.
    pub fn new(request: super::service::Request, tokenizer: &'t Tokenizer) -> Self {
        let (constraint, grammar_after) = match request.constraint {
            Some(c) => (Some(c.matcher), c.after.map(|text| (text, String::new()))),
            None => (None, None),
        };
        Self {
            sampler: Sampler::new(request.params.sampling.clone()),
            decoder: tokenizer.decode_stream(request.params.skip_special_tokens),
            stop: StopMatcher::new(
                request.params.stop.clone(),
                request.params.include_stop_str_in_output,
            ),
            prompt_scores: request.params.prompt_logprobs.map(|top| {
                let as_ids = request.params.return_tokens_as_token_ids;
                PromptScores::new(request.prompt.len(), top, as_ids)
            }),
            prompt: request.prompt,
            params: request.params,
            generated: Vec::new(),
            ngram: NgramIndex::default(),
            events: request.events,
            arrived: request.arrived,
            last_token: None,
            scheduled: false,
            constraint,
            grammar_after,
            awaiting: false,
            stop_reason: None,
        }
    }

    /// Records the logits rows of its prompt's positions from `start` on (a
    /// scored chunk), and sends the prompt's log-probabilities once all are
    /// known.
    pub fn record_prompt_rows(&mut self, start: usize, rows: &[Vec<f32>], tokenizer: &Tokenizer) {
        if let Some(scores) = &mut self.prompt_scores {
            scores.record(&self.prompt, start, rows, tokenizer);
        }
        self.send_prompt_logprobs_when_ready();
    }

    /// Sends the prompt's log-probabilities, once, when they are asked for
    /// and all known.
    pub fn send_prompt_logprobs_when_ready(&mut self) {
        if let Some(entries) = self
            .prompt_scores
            .as_mut()
            .and_then(PromptScores::take_ready)
        {
            let _ = self.events.send(Event::PromptLogprobs(entries));
        }
    }

    /// Whether a grammar constrains its output.
    pub fn constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Its grammar's matcher, once the grammar applies.
    fn grammar(&mut self) -> Option<&mut Matcher> {
        let awake = self.grammar_after.is_none();
        self.constraint.as_mut().filter(|_| awake)
    }

    /// Whether its grammar waits for the end of its thinking: a draft could
    /// end it, and the rows after would pick unconstrained, so it drafts
    /// nothing until then.
    fn grammar_waits(&self) -> bool {
        self.constraint.is_some() && self.grammar_after.is_some()
    }

    /// How many drafts its next step may verify (speculative decoding): as
    /// many as it may still generate past the next token, unless a pick is
    /// on the way.
    pub fn draft_room(&self) -> usize {
        match self.awaiting || self.grammar_waits() {
            false => self
                .params
                .max_tokens
                .saturating_sub(self.generated.len() + 1),
            true => 0,
        }
    }

    /// Whether the pick on the way leaves room for more (`max_tokens`).
    pub fn continues_after_pick(&self) -> bool {
        self.generated.len() + usize::from(self.awaiting) < self.params.max_tokens
    }

    /// How a step's rows of this sequence pick: its next token's (its
    /// sampler's filters and draw, its penalties, a ban on ending before
    /// `min_tokens`, and its grammar's mask with its allowed tokens'), or,
    /// when it feeds `drafts` after its last token (speculative decoding),
    /// one row a fed token, each picking as the sequence's next row would
    /// once the drafts before it are kept (the grammar advanced over them,
    /// then rolled back), each but the last checking the draft after its
    /// token with a second draw ([`Draft`]). A row after a draft the
    /// grammar refuses, or after one that ends it, picks greedily: an
    /// earlier row's pick ends the sequence's picks there.
    pub fn rows(&mut self, eos: &[u32], drafts: &[u32]) -> Result<Vec<RowSampling>, String> {
        let mut rows = Vec::with_capacity(drafts.len() + 1);
        // The drafts the grammar took, and whether it goes on after them.
        let (mut taken, mut open) = (0, true);
        for j in 0..=drafts.len() {
            if let (Some(matcher), Some(&draft)) = (self.grammar(), drafts[..j].last()) {
                if open {
                    let took = matcher
                        .try_consume_tokens(&[draft])
                        .map_err(|e| format!("structured output: {e}"))?;
                    taken += took;
                    open = took == 1 && !matcher.is_stopped();
                }
            }
            let row = match open {
                true => self.row_sampling(eos, &drafts[..j])?,
                false => RowSampling::greedy(),
            };
            let draft = drafts.get(j).map(|&token| Draft {
                token,
                again: self.sampler.next_row().uniform,
            });
            rows.push(RowSampling { draft, ..row });
        }
        if let Some(matcher) = self.grammar() {
            matcher
                .rollback(taken)
                .map_err(|e| format!("structured output: {e}"))?;
        }
        Ok(rows)
    }

    /// How the backend picks this sequence's token after `drafted`, taken
    /// as generated after the output (the grammar, if any, already advanced
    /// over them).
    fn row_sampling(&mut self, eos: &[u32], drafted: &[u32]) -> Result<RowSampling, String> {
        let grammar = match self.grammar() {
            Some(matcher) => Some(
                structured::allowed_tokens(matcher)
                    .map_err(|e| format!("structured output: {e}"))?,
            ),
            None => None,
        };
        let allowed = match (grammar, &self.params.allowed_tokens) {
            (Some(grammar), Some(only)) => {
                Some(grammar.iter().zip(only).map(|(g, o)| g & o).collect())
            }
            (grammar, only) => grammar.or_else(|| only.clone()),
        };
        let output: Cow<'_, [u32]> = match drafted {
            [] => Cow::Borrowed(&self.generated),
            _ => Cow::Owned([&self.generated[..], drafted].concat()),
        };
        let params = &self.params;
        // A pick on the way counts: this row picks the token after it.
        let generated = output.len() + usize::from(self.awaiting);
        let suppress_eos = !params.ignore_eos && generated < params.min_tokens;
        let mut banned: Vec<u32> = if suppress_eos {
            eos.iter().chain(&params.stop_token_ids).copied().collect()
        } else {
            Vec::new()
        };
        // A bad word's last token, where the output ends with the rest.
        banned.extend(params.bad_words.iter().filter_map(|word| {
            let (last, rest) = word.split_last()?;
            output.ends_with(rest).then_some(*last)
        }));
        let penalties = params.penalties;
        Ok(RowSampling {
            repetition: penalties.repetition,
            frequency: penalties.frequency,
            presence: penalties.presence,
            adjustments: penalties.adjustments(&self.prompt, &output, &params.logit_bias, &banned),
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
        if let Some(matcher) = self.grammar() {
            matcher
                .consume_token(token)
                .map_err(|e| format!("structured output: {e}"))?;
            grammar_done = matcher.is_stopped();
        }
        self.generated.push(token);
        let params = &self.params;
        let logprob = sampled.logprob.map(|logprob| {
            let text = |t| TokenLogprob::name(tokenizer, t, params.return_tokens_as_token_ids);
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
        // The token that stops generation has no text unless asked for.
        let piece = if (is_eos || is_stop_token) && !params.include_stop_str_in_output {
            None
        } else {
            self.decoder.step(token).ok().flatten()
        };
        wake_grammar(&mut self.grammar_after, piece.as_deref().unwrap_or(""));
        let (text, stopped_by_string) = match self.stop.push(piece.as_deref().unwrap_or("")) {
            StopOutcome::Continue(text) => (text, false),
            StopOutcome::Stop(text) => (text, true),
        };
        self.stop_reason = if stopped_by_string {
            self.stop
                .matched()
                .map(|s| StopReason::String(s.to_owned()))
        } else {
            (is_stop_token && !is_eos).then_some(StopReason::Token(token))
        };
        let finish = if is_eos || is_stop_token || stopped_by_string || grammar_done {
            Some(FinishReason::Stop)
        } else if self.generated.len() >= params.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        // At the end, release what the decoder and the stop matcher still
        // hold, unless a stop string cut the text.
        let mut text = text;
        if finish.is_some() && !stopped_by_string {
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

/// Wakes a grammar that waits (`after`: the text it waits for, and the
/// output's last text) once the output's text shows it, with `piece`; the
/// grammar takes the tokens after this one.
fn wake_grammar(after: &mut Option<(String, String)>, piece: &str) {
    let Some((marker, tail)) = after else {
        return;
    };
    tail.push_str(piece);
    if tail.contains(marker.as_str()) {
        *after = None;
    } else if tail.len() > marker.len() {
        let mut cut = tail.len() - marker.len();
        while !tail.is_char_boundary(cut) {
            cut -= 1;
        }
        tail.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::super::service::Request;
    use super::super::structured::Constraint;
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir = env!("CARGO_MANIFEST_DIR");
        Tokenizer::from_file(format!(
            "{dir}/tests/fixtures/tokenizer/tiny-gpt2/hf/tokenizer.json"
        ))
        .unwrap()
    }

    /// A sequence of a one-token prompt generating with `params`, and where
    /// its events go.
    fn sequence(
        tokenizer: &Tokenizer,
        params: GenerationParams,
    ) -> (Active<'_>, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (events, received) = tokio::sync::mpsc::unbounded_channel();
        let request = Request {
            prompt: vec![0],
            params,
            events,
            arrived: Instant::now(),
            group: 0,
            constraint: None,
        };
        (Active::new(request, tokenizer), received)
    }

    /// The text a sequence sends for `tokens` (the last one ending it as
    /// an end-of-sequence token, `eos`) with stop strings `stop`.
    fn sent_text(tokenizer: &Tokenizer, tokens: &[u32], eos: u32, stop: &[&str]) -> String {
        let params = GenerationParams {
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..GenerationParams::greedy(100)
        };
        let (mut active, mut received) = sequence(tokenizer, params);
        for &token in tokens {
            let sampled = Sampled {
                token,
                logprob: None,
                top: Vec::new(),
            };
            active.take_pick(sampled, tokenizer, &[eos]).unwrap();
        }
        let mut text = String::new();
        while let Ok(Event::Chunk { text: piece, .. }) = received.try_recv() {
            text.push_str(&piece);
        }
        text
    }

    /// A bad word's last token is banned where the output ends with the
    /// rest of it; a one-token word always.
    #[test]
    fn bad_words_ban_their_last_token_after_the_rest() {
        let tokenizer = tokenizer();
        let params = GenerationParams {
            bad_words: vec![vec![7, 8, 9], vec![4]],
            ..GenerationParams::greedy(10)
        };
        let (mut active, _received) = sequence(&tokenizer, params);
        let mut banned = |generated: &[u32]| {
            active.generated = generated.to_vec();
            let row = active.rows(&[], &[]).unwrap().remove(0);
            let mut banned: Vec<u32> = row
                .adjustments
                .iter()
                .filter(|a| a.banned)
                .map(|a| a.token)
                .collect();
            banned.sort_unstable();
            banned
        };
        assert_eq!(banned(&[1, 2]), [4]);
        assert_eq!(banned(&[1, 7, 8]), [4, 9]);
        assert_eq!(banned(&[7, 8, 1]), [4]);
        assert_eq!(banned(&[8]), [4]);
    }

    /// A grammar that waits for the end of the thinking leaves the rows
    /// before it unconstrained (and draftless), then masks the answer.
    #[test]
    fn a_grammar_after_the_thinking_constrains_only_the_answer() {
        let tokenizer = tokenizer();
        let encode = |text: &str| tokenizer.encode(text, false).unwrap();
        let grammars = super::super::structured::Grammars::new(
            std::sync::Arc::new(tokenizer.clone()),
            vec![0],
            tokenizer.vocab_size(),
        );
        let grammar = super::super::structured::Grammar::Regex("[0-9]+".into());
        let (events, _received) = tokio::sync::mpsc::unbounded_channel();
        let request = Request {
            prompt: vec![0],
            params: GenerationParams::greedy(100),
            events,
            arrived: Instant::now(),
            group: 0,
            constraint: Some(Constraint {
                matcher: grammars.matcher(&grammar).unwrap(),
                after: Some("</think>".to_owned()),
            }),
        };
        let mut active = Active::new(request, &tokenizer);
        let allows = |mask: &[u32], token: u32| mask[token as usize / 32] >> (token % 32) & 1 == 1;
        let (letters, digit) = (encode("Hmm"), encode("7")[0]);
        for &token in letters.iter().chain(&encode(" so</think>")) {
            assert!(active.rows(&[0], &[]).unwrap()[0].allowed.is_none());
            assert_eq!(active.draft_room(), 0);
            let pick = Sampled {
                token,
                logprob: None,
                top: Vec::new(),
            };
            active.take_pick(pick, &tokenizer, &[0]).unwrap();
        }
        let mask = active.rows(&[0], &[]).unwrap()[0].allowed.clone().unwrap();
        assert!(allows(&mask, digit) && !allows(&mask, letters[0]));
        assert!(active.draft_room() > 0);
    }

    /// Text held back as the possible start of a stop string is sent when
    /// an end-of-sequence token ends the sequence instead (vLLM releases
    /// it too).
    #[test]
    fn held_back_text_is_sent_when_the_sequence_ends() {
        let tokenizer = tokenizer();
        let ids = tokenizer.encode("Hello world", false).unwrap();
        let eos = tokenizer.encode("!", false).unwrap()[0];
        let tokens = [ids.as_slice(), &[eos]].concat();
        assert_eq!(sent_text(&tokenizer, &tokens, eos, &[]), "Hello world");
        // "d" could start the stop string "done" until the sequence ends.
        assert_eq!(
            sent_text(&tokenizer, &tokens, eos, &["done"]),
            "Hello world"
        );
    }
}
