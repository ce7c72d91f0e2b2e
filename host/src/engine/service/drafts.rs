//! Speculative decoding's part of the engine: drafts proposed for the
//! sequences that may take them, and the step that verifies them beside
//! the decoding sequences.

use super::{load, Engine, EngineObserver};
use crate::engine::batch::run_sampled_step;
use crate::runtime::sampling::Sampled;
use crate::scheduler::{Batch, SeqId};

impl<O: EngineObserver> Engine<'_, O> {
    /// Proposes drafts for every sequence that may verify some (speculative
    /// decoding), from its prompt and output.
    pub(super) fn propose_drafts(&mut self) {
        let Some(ngram) = self.speculative else {
            return;
        };
        for (id, state) in &mut self.active {
            let room = state.draft_room();
            if room > 0 {
                let index = &mut state.ngram;
                self.scheduler
                    .propose(*id, |tokens| index.propose(&ngram, tokens, room));
            }
        }
    }

    /// Runs a step of drafted sequences and decoding ones beside them (every
    /// fed token a decode row of its own, [`Batch::step_batch`]) and hands
    /// out the picks. The backend picks every row where its logits are (on
    /// the device for CUDA: only token ids come back): a decoding row as its
    /// sampling says; a drafted sequence's rows as its next row would once
    /// the drafts before them are kept, each but the last checking the
    /// draft after its token ([`Active::rows`]), so a draft is kept when it
    /// is the pick of the row before it. Its picks are the drafts up to the
    /// first not kept, then that row's own token (the last row's when all
    /// are kept).
    pub(super) fn verify(&mut self, batch: &Batch) {
        self.ran_apart = true;
        let seqs: Vec<(SeqId, &[u32])> = batch
            .seqs
            .iter()
            .map(|seq| (seq.id, &seq.tokens[seq.tokens.len() - seq.drafts..]))
            .collect();
        let mut failed = Vec::new();
        let rows = self.row_samplings(&seqs, &mut failed);
        let step = batch.step_batch();
        let backend = self.model.backend.as_ref();
        let sampled =
            match run_sampled_step(backend, &self.model.pipeline, &mut self.cache, &step, &rows) {
                Ok(sampled) => sampled,
                Err(e) => {
                    for seq in &batch.seqs {
                        self.fail(seq.id, format!("model step failed: {e}"));
                    }
                    return;
                }
            };
        self.scheduler.complete(batch);
        let mut sampled = sampled.into_iter();
        let mut generated = 0;
        for seq in &batch.seqs {
            let mut picks: Vec<Sampled> = sampled.by_ref().take(seq.drafts + 1).collect();
            // A grammar that failed fails its sequence, without its pick.
            if failed.iter().any(|(id, _)| *id == seq.id) {
                continue;
            }
            let drafts = &seq.tokens[seq.tokens.len() - seq.drafts..];
            let kept = drafts
                .iter()
                .zip(&picks)
                .take_while(|(draft, pick)| **draft == pick.token)
                .count();
            picks.truncate(kept + 1);
            if seq.drafts > 0 {
                self.observer.speculated(seq.drafts, kept);
            }
            for (i, pick) in picks.into_iter().enumerate() {
                generated += 1;
                if !self.deliver(seq.id, pick, i < kept) {
                    break;
                }
            }
        }
        for (id, message) in failed {
            self.fail(id, message);
        }
        let prompt = batch.num_tokens() - batch.seqs.iter().map(|s| s.drafts + 1).sum::<usize>();
        self.stats.step(prompt, generated, load(&self.scheduler));
    }
}
