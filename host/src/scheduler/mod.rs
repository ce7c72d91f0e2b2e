//! Continuous batching: which sequences run in the next step and which of
//! their tokens, under a token budget (chunked prefill) and the KV cache's
//! capacity (queueing, and preemption by recomputation when decode runs out
//! of blocks). Requests join and leave between steps. A sequence whose
//! prompt is scored (its tokens' log-probabilities, vLLM's
//! `prompt_logprobs`) computes every prompt position itself (no prefix-cache
//! hits) in chunks of its own, whose every row's logits come back.

pub mod blocks;

use std::collections::{HashMap, VecDeque};

use kiln_plugin_api::pipeline::{StepBatch, StepSequence};

pub use blocks::{BlockManager, OutOfBlocks, PrefixStats, SequenceBlocks};

/// Identifies a sequence.
pub type SeqId = u64;

/// Limits of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences running at once.
    pub max_batch_size: usize,
    /// Tokens fed to the model per step (prefill chunks plus decodes).
    pub max_batch_tokens: usize,
    /// Longest sequence (prompt plus output).
    pub max_seq_len: usize,
}

/// Why a request cannot be queued.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The prompt is empty.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The request can never fit.
    #[error("the prompt ({prompt} tokens) plus up to {max_new} new tokens exceeds the context length of {limit}")]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Requested new tokens.
        max_new: usize,
        /// The limit.
        limit: usize,
    },
    /// The id is in use.
    #[error("sequence {0} already exists")]
    Duplicate(SeqId),
}

#[derive(Debug)]
struct Sequence {
    id: SeqId,
    /// The request it belongs to: admission shares the batch fairly
    /// between requests, whatever number of sequences each brought.
    group: u64,
    /// Prompt and generated tokens.
    tokens: Vec<u32>,
    /// Tokens whose keys and values are in the cache.
    computed: usize,
    blocks: SequenceBlocks,
    /// The last token is a placeholder for a pick not yet known on the host
    /// (async scheduling: the device feeds it to the step).
    unresolved: bool,
    /// Its prompt's positions but the last are scored (all their logits
    /// come back): this many tokens long.
    scored_prompt: Option<usize>,
    /// Speculative decoding: tokens proposed to follow its last one, fed
    /// after it in its next step (then cleared).
    drafts: Vec<u32>,
}

impl Sequence {
    /// Whether its next step feeds its last token alone (it decodes).
    fn decodes(&self) -> bool {
        self.tokens.len() == self.computed + 1 && Scheduler::scoring_until(self).is_none()
    }
}

/// The placeholder of a token not yet known: out of every vocabulary, so a
/// step that ran with it unfed fails its index check instead of computing
/// with a wrong token.
pub const UNRESOLVED_TOKEN: u32 = u32::MAX;

/// One sequence's part of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub id: SeqId,
    /// Position of the first fed token.
    pub start: usize,
    /// Tokens to feed.
    pub tokens: Vec<u32>,
    /// The sequence's cache blocks.
    pub blocks: Vec<u32>,
    /// True when this step reaches the sequence's last known token, so its
    /// logits pick the next one.
    pub wants_logits: bool,
    /// The last fed token is [`UNRESOLVED_TOKEN`]: the previous step's pick,
    /// which the device feeds in.
    pub feeds_unresolved: bool,
    /// Prompt tokens of a scored sequence, each of whose rows' logits come
    /// back (the step's scored part, [`Batch::split_scored`]).
    pub scored: bool,
    /// The last this many fed tokens are drafts (speculative decoding):
    /// each fed token is a sequence of its own in the step, with one
    /// logits row ([`Batch::step_batch`]).
    pub drafts: usize,
}

/// The sequences of one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// In row order.
    pub seqs: Vec<ScheduledSeq>,
}

impl Batch {
    /// The step as the pipeline model sees it: last-token logits only, or,
    /// for a batch of scored chunks ([`Batch::split_scored`]), every fed
    /// token's. A drafted sequence (speculative decoding) feeds each of
    /// its tokens as a sequence of its own, one position further each, on
    /// its blocks: every row is then a decode row whose context ends at its
    /// token (the step writes all rows' keys and values before attention
    /// reads them), picked as any (on the device for CUDA), and a step of
    /// decoding and drafted sequences alone is a decode step (captured
    /// graphs).
    pub fn step_batch(&self) -> StepBatch {
        let sequence = |tokens: &[u32], start, s: &ScheduledSeq| StepSequence {
            tokens: tokens.to_vec(),
            start,
            blocks: s.blocks.clone(),
            wants_logits: s.wants_logits || s.scored,
            token_types: Vec::new(),
        };
        StepBatch {
            sequences: self
                .seqs
                .iter()
                .flat_map(|s| match s.drafts {
                    0 => vec![sequence(&s.tokens, s.start, s)],
                    _ => (0..s.tokens.len())
                        .map(|i| sequence(&s.tokens[i..=i], s.start + i, s))
                        .collect(),
                })
                .collect(),
            all_logits: self.seqs.iter().any(|s| s.scored),
        }
    }

    /// The scored chunks (run as a step of their own, every row's logits
    /// back) and the rest.
    pub fn split_scored(self) -> (Batch, Batch) {
        let (scored, rest) = self.seqs.into_iter().partition(|s| s.scored);
        (Batch { seqs: scored }, Batch { seqs: rest })
    }

    /// Tokens in the step.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }
}

/// The scheduler.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    preemptions: u64,
    /// Tokens of a scored chunk at most (its logits rows come back whole).
    max_scored_tokens: usize,
}

impl Scheduler {
    /// A scheduler over `blocks`.
    pub fn new(config: SchedulerConfig, blocks: BlockManager) -> Self {
        Self {
            config,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
            max_scored_tokens: usize::MAX,
        }
    }

    /// Bounds the tokens of a scored chunk (whose rows of logits come back
    /// whole: the engine sizes it by the vocabulary).
    pub fn limit_scored_tokens(&mut self, tokens: usize) {
        self.max_scored_tokens = tokens.max(1);
    }

    /// Scores a queued sequence's prompt: every position but the last
    /// computes its logits ([`ScheduledSeq::scored`]), none taken from the
    /// prefix cache. Returns false if it is not waiting to start.
    pub fn score_prompt(&mut self, id: SeqId) -> bool {
        let waiting = self.waiting.iter_mut().find(|s| s.id == id);
        let Some(seq) = waiting.filter(|s| s.computed == 0 && s.blocks.blocks.is_empty()) else {
            return false;
        };
        seq.scored_prompt = Some(seq.tokens.len());
        true
    }

    /// Queues a sequence that is a request of its own. `max_new` bounds its
    /// output, for the length check.
    pub fn add(
        &mut self,
        id: SeqId,
        prompt: Vec<u32>,
        max_new: usize,
    ) -> Result<(), AdmissionError> {
        self.add_to_group(id, id, prompt, max_new)
    }

    /// Queues a sequence of request `group` (one of its prompts or `n`
    /// choices).
    pub fn add_to_group(
        &mut self,
        id: SeqId,
        group: u64,
        prompt: Vec<u32>,
        max_new: usize,
    ) -> Result<(), AdmissionError> {
        if prompt.is_empty() {
            return Err(AdmissionError::EmptyPrompt);
        }
        let limit = self
            .config
            .max_seq_len
            .min(self.blocks.num_blocks() * self.blocks.block_size());
        if prompt.len() + max_new > limit {
            return Err(AdmissionError::TooLong {
                prompt: prompt.len(),
                max_new,
                limit,
            });
        }
        if self.contains(id) {
            return Err(AdmissionError::Duplicate(id));
        }
        self.waiting.push_back(Sequence {
            id,
            group,
            tokens: prompt,
            computed: 0,
            blocks: SequenceBlocks::default(),
            unresolved: false,
            scored_prompt: None,
            drafts: Vec::new(),
        });
        Ok(())
    }

    fn contains(&self, id: SeqId) -> bool {
        self.running.iter().chain(&self.waiting).any(|s| s.id == id)
    }

    /// Records a sequence's sampled token: it takes the place of the
    /// placeholder [`Scheduler::append_unresolved`] left (the sequence may
    /// have been preempted since), else it is appended.
    pub fn append_token(&mut self, id: SeqId, token: u32) {
        let mut seqs = self.running.iter_mut().chain(self.waiting.iter_mut());
        if let Some(seq) = seqs.find(|s| s.id == id) {
            if std::mem::take(&mut seq.unresolved) {
                *seq.tokens.last_mut().expect("a placeholder") = token;
            } else {
                seq.tokens.push(token);
            }
        }
    }

    /// Appends a placeholder for a running sequence's pick that the host
    /// does not know yet, so the next step can be scheduled meanwhile; the
    /// step feeds the pick on the device, and [`Scheduler::append_token`]
    /// writes it here.
    pub fn append_unresolved(&mut self, id: SeqId) {
        if let Some(seq) = self.running.iter_mut().find(|s| s.id == id) {
            assert!(!seq.unresolved, "sequence {id} already awaits a pick");
            seq.tokens.push(UNRESOLVED_TOKEN);
            seq.unresolved = true;
        }
    }

    /// Proposes drafts to follow a running sequence's last token in its
    /// next step, where that step only feeds that token (it decodes, its
    /// last token known): `draft` makes them from the sequence's prompt and
    /// output tokens. They go in as far as the token budget and the cache
    /// allow. Returns false (without calling `draft`) where the sequence
    /// cannot take drafts now.
    pub fn propose(&mut self, id: SeqId, draft: impl FnOnce(&[u32]) -> Vec<u32>) -> bool {
        let running = self.running.iter_mut().find(|s| s.id == id);
        let Some(seq) = running.filter(|s| s.decodes() && !s.unresolved) else {
            return false;
        };
        seq.drafts = draft(&seq.tokens);
        true
    }

    /// Records a token of a sequence that a drafted step verified: its keys
    /// and values are in the cache (it was fed as a draft).
    pub fn append_verified(&mut self, id: SeqId, token: u32) {
        if let Some(seq) = self.running.iter_mut().find(|s| s.id == id) {
            seq.tokens.push(token);
            seq.computed += 1;
            let computed = seq.computed;
            self.blocks.commit(&mut seq.blocks, &seq.tokens, computed);
        }
    }

    /// Removes a sequence (finished, cancelled or disconnected) and frees its
    /// blocks. Returns false if it was unknown.
    pub fn remove(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let seq = self.running.remove(i);
            self.blocks.release(seq.blocks);
            true
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let seq = self.waiting.remove(i).expect("found");
            self.blocks.release(seq.blocks);
            true
        } else {
            false
        }
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> Batch {
        let mut budget = self.config.max_batch_tokens;
        let mut batch = Batch::default();
        // Running sequences first, oldest first; make room by preempting the
        // newest when the cache is full.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let mut take = self.chunk(seq, budget);
            if take == 0 {
                // Its last pick is on the way and is its last (async
                // scheduling): nothing to feed.
                i += 1;
                continue;
            }
            let mut needed = seq.computed + take;
            let mut seq_blocks = std::mem::take(&mut self.running[i].blocks);
            loop {
                match self.blocks.reserve(&mut seq_blocks, needed) {
                    Ok(()) => break,
                    // Drafts give way before any other sequence does.
                    Err(_) if take > 1 && !self.running[i].drafts.is_empty() => {
                        self.running[i].drafts.clear();
                        take = 1;
                        needed = self.running[i].computed + 1;
                    }
                    Err(_) if self.running.len() > i + 1 => self.preempt_last(),
                    Err(_) => break,
                }
            }
            self.running[i].blocks = seq_blocks;
            if self.running[i].blocks.blocks.len() < self.blocks.blocks_for(needed) {
                // Even alone it does not fit now: it waits for space.
                self.preempt(i);
                continue;
            }
            batch.seqs.push(self.plan(&self.running[i], take));
            budget -= take;
            i += 1;
        }
        // Then waiting sequences, while there is room: first of the request
        // with the fewest running (so one request's many sequences cannot
        // starve the others), oldest first among equals.
        while budget > 0 && self.running.len() < self.config.max_batch_size {
            let Some(mut seq) = self.next_waiting() else {
                break;
            };
            let mut lookup = PrefixStats::default();
            if seq.blocks.blocks.is_empty() && seq.scored_prompt.is_none() {
                let (blocks, cached, found) = self.blocks.start_sequence(&seq.tokens);
                (seq.blocks, seq.computed, lookup) = (blocks, cached, found);
            }
            let take = self.chunk(&seq, budget);
            if self
                .blocks
                .reserve(&mut seq.blocks, seq.computed + take)
                .is_err()
            {
                // It waits holding nothing: blocks held by waiting sequences
                // could leave none for any (its prefix stays cached, and its
                // lookup counts when it is admitted).
                self.blocks.release(std::mem::take(&mut seq.blocks));
                seq.computed = 0;
                self.waiting.push_front(seq);
                break;
            }
            self.blocks.count_lookup(lookup);
            batch.seqs.push(self.plan(&seq, take));
            budget -= take;
            self.running.push(seq);
        }
        batch
    }

    /// Takes the waiting sequence to admit next: the first one of the
    /// group with the fewest running sequences.
    fn next_waiting(&mut self) -> Option<Sequence> {
        let mut running: HashMap<u64, usize> = HashMap::new();
        for seq in &self.running {
            *running.entry(seq.group).or_default() += 1;
        }
        let chosen = self
            .waiting
            .iter()
            .enumerate()
            .min_by_key(|(i, seq)| (running.get(&seq.group).copied().unwrap_or(0), *i))
            .map(|(i, _)| i)?;
        self.waiting.remove(chosen)
    }

    /// The end of `seq`'s scored positions (all of its prompt's but the
    /// last), while it has some left to compute.
    fn scoring_until(seq: &Sequence) -> Option<usize> {
        seq.scored_prompt
            .map(|prompt| prompt - 1)
            .filter(|&end| seq.computed < end)
    }

    /// Tokens of `seq` to feed this step within `budget`: a scored chunk
    /// stops at the last prompt token (which goes on as a plain step, its
    /// logits sampled) and at the scored chunks' limit.
    fn chunk(&self, seq: &Sequence, budget: usize) -> usize {
        match Self::scoring_until(seq) {
            Some(end) => (end - seq.computed).min(budget.min(self.max_scored_tokens)),
            None => (seq.tokens.len() - seq.computed + seq.drafts.len()).min(budget),
        }
    }

    /// `seq`'s part of the step: `take` tokens from its first not computed,
    /// its drafts last.
    fn plan(&self, seq: &Sequence, take: usize) -> ScheduledSeq {
        let known = (seq.tokens.len() - seq.computed).min(take);
        let drafts = take - known;
        let end = seq.computed + known;
        let scored = Self::scoring_until(seq).is_some();
        let mut tokens = seq.tokens[seq.computed..end].to_vec();
        tokens.extend_from_slice(&seq.drafts[..drafts]);
        ScheduledSeq {
            id: seq.id,
            start: seq.computed,
            tokens,
            blocks: seq.blocks.blocks.clone(),
            wants_logits: !scored && end == seq.tokens.len(),
            feeds_unresolved: seq.unresolved && end == seq.tokens.len(),
            scored,
            drafts,
        }
    }

    fn preempt_last(&mut self) {
        let last = self.running.len() - 1;
        self.preempt(last);
    }

    /// Puts a running sequence back in front of the queue, dropping its cache
    /// (it is recomputed, with the help of the prefix cache, when it returns).
    fn preempt(&mut self, index: usize) {
        let mut seq = self.running.remove(index);
        self.blocks.release(std::mem::take(&mut seq.blocks));
        seq.computed = 0;
        seq.drafts.clear();
        self.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Records that `batch` ran: the fed tokens are now in the cache (a
    /// draft's only once verified: [`Scheduler::append_verified`]).
    pub fn complete(&mut self, batch: &Batch) {
        for planned in &batch.seqs {
            if let Some(seq) = self.running.iter_mut().find(|s| s.id == planned.id) {
                seq.computed = planned.start + planned.tokens.len() - planned.drafts;
                seq.drafts.clear();
                // A placeholder's block is registered once the pick is known.
                let known = seq.tokens.len() - usize::from(seq.unresolved);
                self.blocks
                    .commit(&mut seq.blocks, &seq.tokens, seq.computed.min(known));
            }
        }
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Sequences waiting.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The block manager (usage, prefix-cache statistics).
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }
}

#[cfg(test)]
mod tests;
