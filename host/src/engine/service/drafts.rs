//! Speculative decoding's part of the engine: drafts proposed for the
//! sequences that may take them, and the step that verifies them beside
//! the decoding sequences.

use super::{load, Engine, EngineObserver};
use crate::engine::batch::{run_sampled_step, run_step, StepError};
use crate::engine::sequence::Active;
use crate::runtime::sampling::{check_draft, sample_row, RowSampling, Sampled};
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
    /// out the picks: a drafted sequence's drafts up to the first its rows
    /// do not keep, then that row's token. When every drafted sequence is
    /// greedy, the backend picks every row where the logits are (on the
    /// device for CUDA: only tokens come back) and a draft is kept when it
    /// is the row before's pick; otherwise every row's logits come back and
    /// the host checks each draft against its row's sampling
    /// ([`Engine::check_drafts`]).
    pub(super) fn verify(&mut self, batch: &Batch) {
        self.ran_apart = true;
        let decoding: Vec<SeqId> = batch
            .seqs
            .iter()
            .filter(|s| s.drafts == 0)
            .map(|s| s.id)
            .collect();
        let mut failed = Vec::new();
        let samplings = self.row_samplings(&decoding, &mut failed);
        let greedy = batch
            .seqs
            .iter()
            .filter(|s| s.drafts > 0)
            .all(|s| self.active.get(&s.id).is_none_or(Active::drafts_greedily));
        let picked = match greedy {
            true => self.verify_picked(batch, samplings),
            false => self.verify_on_host(batch, samplings),
        };
        let picks = match picked {
            Ok(picks) => picks,
            Err(e) => {
                for seq in &batch.seqs {
                    self.fail(seq.id, format!("model step failed: {e}"));
                }
                return;
            }
        };
        self.scheduler.complete(batch);
        let mut generated = 0;
        for (seq, (picks, kept)) in batch.seqs.iter().zip(picks) {
            // A grammar that failed fails its sequence, without its pick.
            if failed.iter().any(|(id, _)| *id == seq.id) {
                continue;
            }
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

    /// A verified step's picks where the backend picks every row: each
    /// decoding row as `samplings` say, each drafted sequence's rows
    /// greedily, its drafts kept while each is the pick of the row before.
    /// Returns each sequence's picks and how many of them are drafts.
    fn verify_picked(
        &mut self,
        batch: &Batch,
        samplings: Vec<RowSampling>,
    ) -> Result<Vec<(Vec<Sampled>, usize)>, StepError> {
        let mut samplings = samplings.into_iter();
        let rows: Vec<RowSampling> = batch
            .seqs
            .iter()
            .flat_map(|seq| match seq.drafts {
                0 => vec![samplings.next().expect("one a decoding sequence")],
                n => vec![RowSampling::greedy(); n + 1],
            })
            .collect();
        let step = batch.step_batch();
        let backend = self.model.backend.as_ref();
        let sampled =
            run_sampled_step(backend, &self.model.pipeline, &mut self.cache, &step, &rows)?;
        let mut sampled = sampled.into_iter();
        Ok(batch
            .seqs
            .iter()
            .map(|seq| {
                let mut picks: Vec<Sampled> = sampled.by_ref().take(seq.drafts + 1).collect();
                let drafts = &seq.tokens[seq.tokens.len() - seq.drafts..];
                let kept = drafts
                    .iter()
                    .zip(&picks)
                    .take_while(|(draft, pick)| **draft == pick.token)
                    .count();
                picks.truncate(kept + 1);
                (picks, kept)
            })
            .collect())
    }

    /// A verified step's picks from every row's logits, on the host: each
    /// decoding row as `samplings` say, each drafted sequence's drafts
    /// checked against its rows ([`Engine::check_drafts`]). Returns each
    /// sequence's picks and how many of them are drafts.
    fn verify_on_host(
        &mut self,
        batch: &Batch,
        samplings: Vec<RowSampling>,
    ) -> Result<Vec<(Vec<Sampled>, usize)>, StepError> {
        let step = batch.step_batch();
        let backend = self.model.backend.as_ref();
        let rows = run_step(backend, &self.model.pipeline, &mut self.cache, &step)?;
        let mut rows = rows.into_iter().flatten();
        let mut samplings = samplings.into_iter();
        Ok(batch
            .seqs
            .iter()
            .map(|seq| {
                let rows: Vec<Vec<f32>> = rows.by_ref().take(seq.drafts + 1).collect();
                match seq.drafts {
                    0 => {
                        let sampling = samplings.next().expect("one a decoding sequence");
                        (vec![sample_row(&rows[0], &sampling)], 0)
                    }
                    n => self.check_drafts(seq.id, &seq.tokens[seq.tokens.len() - n..], &rows),
                }
            })
            .collect())
    }

    /// A drafted sequence's picks from its rows: each draft checked in turn
    /// (`check_draft`: kept as the row's sampling would pick it), up to the
    /// first not kept, whose row's own token follows; when all are kept,
    /// the last row's pick. Returns the picks and how many are drafts.
    fn check_drafts(
        &mut self,
        id: SeqId,
        drafts: &[u32],
        rows: &[Vec<f32>],
    ) -> (Vec<Sampled>, usize) {
        let Some(state) = self.active.get_mut(&id) else {
            return (Vec::new(), 0);
        };
        let picked = |token| Sampled {
            token,
            logprob: None,
            top: Vec::new(),
        };
        let mut picks = Vec::new();
        for (row, &draft) in rows.iter().zip(drafts) {
            let sampling = state.draft_sampling();
            let again = state.draft_sampling().uniform;
            match check_draft(row, &sampling, draft, again) {
                None => picks.push(picked(draft)),
                Some(token) => {
                    let kept = picks.len();
                    picks.push(picked(token));
                    return (picks, kept);
                }
            }
        }
        let last = sample_row(&rows[drafts.len()], &state.draft_sampling());
        picks.push(last);
        (picks, drafts.len())
    }
}
