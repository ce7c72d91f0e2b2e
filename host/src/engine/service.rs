//! The serving engine: one thread that owns the model, the scheduler and the
//! KV cache, and runs continuous batching. Requests arrive through a channel;
//! each one's tokens, text and end come back through its own event channel.
//! A request whose receiver is dropped (the client went away) is cancelled
//! and its cache blocks are freed at the next step.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use kiln_kernels::dense::attention::CacheLayout;
use rayon::prelude::*;

use super::batch::{launch_step, run_step};
pub use super::request::{
    Event, FinishReason, GenerationParams, PromptLogprob, Request, StopReason, TokenLogprob,
};
use super::sequence::Active;
use super::speculative::NgramConfig;
use super::stats::StatsLine;
use super::warm_up;
use crate::model::Model;
use crate::runtime::sampling::{RowSampling, Sampled};
use crate::runtime::{KvCache, PendingSample, RuntimeError, TokenFeed};
use crate::scheduler::{Batch, BlockManager, Scheduler, SchedulerConfig, SeqId};
use crate::tokenizer::Tokenizer;

/// Sizes of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// KV-cache blocks.
    pub num_blocks: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Scheduler limits.
    pub scheduler: SchedulerConfig,
    /// Share cache blocks between requests with a common prefix.
    pub prefix_caching: bool,
    /// Schedule and launch each step before reading the previous one's
    /// picks, where the backend allows (vLLM's `--async-scheduling`).
    pub async_scheduling: bool,
    /// Speculative decoding by n-gram lookup (vLLM's `--speculative-config`
    /// with the `ngram` method). Drafts follow a sequence's known last
    /// token, so steps then run one at a time (no async scheduling).
    pub speculative: Option<NgramConfig>,
}

/// Observations the engine reports after each step (for `/metrics`).
pub trait EngineObserver: Send + 'static {
    /// A request ran in a step for the first time, `queue_time` seconds
    /// after arriving.
    fn scheduled(&self, queue_time: f64);
    /// A request produced its first token `ttft` seconds after arriving.
    fn first_token(&self, ttft: f64);
    /// A request produced another token, `itl` seconds after the previous.
    fn next_token(&self, itl: f64);
    /// A request ended (for `reason`) after `latency` seconds.
    fn finished(
        &self,
        reason: FinishReason,
        latency: f64,
        prompt_tokens: usize,
        completion_tokens: usize,
    );
    /// The engine thread spent `host` seconds on its own work (scheduling,
    /// launching, reading picks into text and events) and `device_wait`
    /// seconds waiting for the device's picks, over a turn of its loop that
    /// launched a step when `launched`. With async scheduling a wait near
    /// zero means the host, not the device, sets the pace.
    fn step_time(&self, host: f64, device_wait: f64, launched: bool) {
        let _ = (host, device_wait, launched);
    }
    /// A drafted step verified `drafts` proposed tokens of one sequence and
    /// kept `accepted` of them (speculative decoding).
    fn speculated(&self, drafts: usize, accepted: usize) {
        let _ = (drafts, accepted);
    }
    /// The scheduler's state after a step.
    fn state(
        &self,
        running: usize,
        waiting: usize,
        kv_usage: f64,
        prefix_queries: u64,
        prefix_hits: u64,
        preemptions: u64,
    );
}

enum Command {
    /// Requests that arrive together (the engine admits them before its next
    /// step).
    Add(Vec<(SeqId, Request)>),
}

/// The handle the server holds: submit requests, stop the engine.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    next_id: Arc<AtomicU64>,
}

impl EngineHandle {
    /// Queues a request. Fails only if the engine has stopped.
    pub fn submit(&self, request: Request) -> Result<(), String> {
        self.submit_all(vec![request])
    }

    /// Queues requests that arrive together: the engine's next step sees
    /// them all (as a benchmark's concurrent requests should arrive).
    pub fn submit_all(&self, requests: Vec<Request>) -> Result<(), String> {
        let batch = requests
            .into_iter()
            .map(|r| (self.next_id.fetch_add(1, Ordering::Relaxed), r))
            .collect();
        self.commands
            .send(Command::Add(batch))
            .map_err(|_| "the engine has stopped".to_owned())
    }
}

/// The engine's thread. Join it after the last [`EngineHandle`] is dropped,
/// before the process exits: the engine drops the model, and with it the
/// device, on that thread, and a CUDA library torn down by the exit handlers
/// while the engine still releases its handles crashes the process (seen
/// as a segmentation fault in cublasDestroy on an H200).
pub struct EngineThread(std::thread::JoinHandle<()>);

impl EngineThread {
    /// Waits for the engine to stop; every handle must be dropped first.
    pub fn join(self) {
        if self.0.join().is_err() {
            tracing::error!("the engine thread panicked");
        }
    }
}

/// Starts the engine thread for `model`, with a KV cache of
/// `config.num_blocks` blocks on the model's device (allocated here, so a
/// cache that does not fit fails before any request). Where the backend
/// asks ([`crate::runtime::Backend::warm_up_batches`]), its step shapes run
/// once here first (`warm_up.rs`). The engine stops when every handle is
/// dropped, after finishing or cancelling what it has.
pub fn spawn(
    model: Model,
    tokenizer: Arc<Tokenizer>,
    eos: Vec<u32>,
    config: EngineConfig,
    observer: impl EngineObserver,
) -> Result<(EngineHandle, EngineThread), RuntimeError> {
    let kv = model.config.kv;
    let layout = CacheLayout {
        block_size: config.block_size,
        num_kv_heads: kv.num_kv_heads as usize,
        head_dim: kv.head_dim as usize,
    };
    let mut cache =
        model
            .backend
            .new_kv_cache(kv.num_layers as usize, config.num_blocks, layout)?;
    let batches = model
        .backend
        .warm_up_batches(config.scheduler.max_batch_size);
    if !batches.is_empty() {
        let done = warm_up::warm_up(
            model.backend.as_ref(),
            &model.pipeline,
            &mut cache,
            &batches,
            config.scheduler.max_batch_tokens,
        )
        .map_err(|e| RuntimeError::Device(format!("warming up: {e}")))?;
        tracing::info!(
            "warmed up in {:.2} s: decode steps of {} batch sizes (1 to {}), a prefill chunk of {} tokens",
            done.elapsed.as_secs_f64(),
            batches.len(),
            batches.last().copied().unwrap_or(0),
            done.chunk_tokens
        );
    }
    let (commands, receiver) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("kiln-engine".to_owned())
        .spawn(move || run(model, cache, &tokenizer, &eos, config, receiver, observer))
        .expect("the engine thread starts");
    let handle = EngineHandle {
        commands,
        next_id: Arc::new(AtomicU64::new(0)),
    };
    Ok((handle, EngineThread(thread)))
}

fn run(
    model: Model,
    cache: KvCache,
    tokenizer: &Tokenizer,
    eos: &[u32],
    config: EngineConfig,
    commands: mpsc::Receiver<Command>,
    observer: impl EngineObserver,
) {
    let blocks = BlockManager::new(config.num_blocks, config.block_size, config.prefix_caching);
    let overlap = config.async_scheduling
        && config.speculative.is_none()
        && model.backend.overlaps_steps()
        && model.pipeline.feeds_tokens();
    let mut scheduler = Scheduler::new(config.scheduler, blocks);
    // A scored prompt chunk's logits come back whole: 2^26 floats (256 MB)
    // at most.
    scheduler.limit_scored_tokens(SCORED_LOGITS / tokenizer.vocab_size().max(1));
    let mut engine = Engine {
        scheduler,
        model,
        cache,
        tokenizer,
        eos,
        active: HashMap::new(),
        stats: StatsLine::default(),
        observer,
        overlap,
        speculative: config.speculative,
        device_wait: 0.0,
        ran_apart: false,
    };
    let mut in_flight = None;
    loop {
        // Take new requests: wait for one when idle, else whatever is queued.
        let mut incoming = Vec::new();
        if engine.active.is_empty() && in_flight.is_none() {
            match commands.recv() {
                Ok(command) => incoming.push(command),
                Err(_) => return,
            }
        }
        let started = Instant::now();
        incoming.extend(commands.try_iter());
        for (id, request) in incoming.into_iter().flat_map(|Command::Add(batch)| batch) {
            engine.admit(id, request);
        }
        engine.cancel_gone();
        engine.device_wait = 0.0;
        engine.ran_apart = false;
        in_flight = engine.step(in_flight);
        let turn = started.elapsed().as_secs_f64();
        engine.observer.step_time(
            (turn - engine.device_wait).max(0.0),
            engine.device_wait,
            in_flight.is_some() || engine.ran_apart,
        );
    }
}

/// Logits a step of scored prompt chunks brings back at most.
const SCORED_LOGITS: usize = 1 << 26;

/// A step launched on the device whose picks the host has not read yet.
struct InFlight {
    /// The sequences whose rows were sampled, in row order, and the drafts
    /// each fed after its last token (one row each, after the row of that
    /// token).
    rows: Vec<(SeqId, Vec<u32>)>,
    pending: PendingSample,
}

/// The engine thread's state.
struct Engine<'t, O> {
    model: Model,
    cache: KvCache,
    tokenizer: &'t Tokenizer,
    eos: &'t [u32],
    scheduler: Scheduler,
    active: HashMap<SeqId, Active<'t>>,
    stats: StatsLine,
    observer: O,
    /// Async scheduling: step N + 1 is scheduled and launched before the
    /// host reads step N's picks, which the device feeds to it.
    overlap: bool,
    /// Speculative decoding's proposer.
    speculative: Option<NgramConfig>,
    /// Seconds waited for the device's picks in this turn of the loop.
    device_wait: f64,
    /// This turn ran a step apart from the sampled one (scored prompt
    /// chunks).
    ran_apart: bool,
}

impl<'t, O: EngineObserver> Engine<'t, O> {
    fn admit(&mut self, id: SeqId, request: Request) {
        // Refused alone here, not as a failed step with its batch.
        let most = self.model.backend.max_logprobs();
        if let Some((asked, most)) = request.params.logprobs.zip(most).filter(|(a, m)| a > m) {
            let message = format!("{asked} top log-probabilities asked, at most {most}");
            let _ = request.events.send(Event::Error(message));
            return;
        }
        if let Err(e) = self.scheduler.add_to_group(
            id,
            request.group,
            request.prompt.clone(),
            request.params.max_tokens,
        ) {
            let _ = request.events.send(Event::Error(e.to_string()));
            return;
        }
        if request.params.prompt_logprobs.is_some() {
            self.scheduler.score_prompt(id);
        }
        let mut state = Active::new(request, self.tokenizer);
        // A one-token prompt has nothing to score.
        state.send_prompt_logprobs_when_ready();
        self.active.insert(id, state);
    }

    /// Runs a step of scored prompt chunks, every row's logits back, and
    /// hands each sequence its rows' log-probabilities.
    fn score(&mut self, batch: &Batch) {
        let step = batch.step_batch();
        let backend = self.model.backend.as_ref();
        self.ran_apart = true;
        match run_step(backend, &self.model.pipeline, &mut self.cache, &step) {
            Ok(rows) => {
                self.scheduler.complete(batch);
                self.stats
                    .step(batch.num_tokens(), 0, load(&self.scheduler));
                for (seq, rows) in batch.seqs.iter().zip(rows) {
                    if let Some(state) = self.active.get_mut(&seq.id) {
                        state.record_prompt_rows(seq.start, &rows, self.tokenizer);
                    }
                }
            }
            Err(e) => {
                for seq in &batch.seqs {
                    self.fail(seq.id, format!("model step failed: {e}"));
                }
            }
        }
    }

    /// Proposes drafts for every sequence that may verify some (speculative
    /// decoding), from its prompt and output.
    fn propose_drafts(&mut self) {
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

    /// Cancels requests whose client is gone.
    fn cancel_gone(&mut self) {
        let gone: Vec<SeqId> = self
            .active
            .iter()
            .filter(|(_, a)| a.events.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.scheduler.remove(id);
            self.active.remove(&id);
        }
    }

    /// Ends a sequence with an error.
    fn fail(&mut self, id: SeqId, message: String) {
        if let Some(a) = self.active.remove(&id) {
            let _ = a.events.send(Event::Error(message));
        }
        self.scheduler.remove(id);
    }

    /// Schedules and launches the next step; reads the picks of `in_flight`
    /// (the step before) while it runs (first without async scheduling),
    /// then launches the new step's picks, decided with the previous picks
    /// known (penalties, grammars). Returns the step now in flight.
    fn step(&mut self, mut in_flight: Option<InFlight>) -> Option<InFlight> {
        if !self.overlap {
            if let Some(f) = in_flight.take() {
                self.settle(f);
            }
        }
        self.propose_drafts();
        let batch = self.scheduler.schedule();
        let now = Instant::now();
        for seq in &batch.seqs {
            if let Some(state) = self.active.get_mut(&seq.id).filter(|s| !s.scheduled) {
                state.scheduled = true;
                self.observer.scheduled((now - state.arrived).as_secs_f64());
            }
        }
        // Scored prompt chunks run first, as a step of their own (after the
        // step in flight, on the same stream).
        let (scored, batch) = batch.split_scored();
        if !scored.seqs.is_empty() {
            self.score(&scored);
        }
        if batch.seqs.is_empty() {
            match in_flight {
                Some(f) => self.settle(f),
                None => report(&self.scheduler, &self.observer),
            }
            return None;
        }
        // Each sequence that wants logits, and its drafts (speculative
        // decoding): a row for its last token and one for each draft.
        let sampled_rows: Vec<(SeqId, Vec<u32>)> = batch
            .seqs
            .iter()
            .filter(|s| s.wants_logits)
            .map(|s| (s.id, s.tokens[s.tokens.len() - s.drafts..].to_vec()))
            .collect();
        let num_rows = sampled_rows.iter().map(|(_, d)| d.len() + 1).sum();
        let step = batch.step_batch();
        let feed = match &in_flight {
            Some(f) => token_feed(&batch, &f.rows),
            None => Vec::new(),
        };
        let launched = launch_step(
            self.model.backend.as_ref(),
            &self.model.pipeline,
            &mut self.cache,
            &step,
            num_rows,
            &feed,
        );
        // The previous step's picks, read while this one runs: the picks
        // of this one are decided with them known.
        if let Some(f) = in_flight {
            self.settle(f);
        }
        let mut failed = Vec::new();
        let launched = launched.and_then(|step| {
            let seqs: Vec<(SeqId, &[u32])> = sampled_rows
                .iter()
                .map(|(id, drafts)| (*id, &drafts[..]))
                .collect();
            let rows = self.row_samplings(&seqs, &mut failed);
            Ok(self.model.backend.launch_picks(step, &rows)?)
        });
        let pending = match launched {
            Ok(pending) => pending,
            Err(e) => {
                // A failed step fails its requests, not the server.
                for seq in &batch.seqs {
                    self.fail(seq.id, format!("model step failed: {e}"));
                }
                report(&self.scheduler, &self.observer);
                return None;
            }
        };
        self.scheduler.complete(&batch);
        // A decode row or a draft's feeds one token, so what else was fed is
        // prompt (less the last token of each prompt: the line is
        // approximate); the tokens generated count once read.
        let fed = batch.num_tokens();
        self.stats
            .step(fed.saturating_sub(num_rows), 0, load(&self.scheduler));
        // A grammar that failed fails its sequence, after the step it was in.
        for (id, message) in failed {
            self.fail(id, message);
        }
        for (id, _) in &sampled_rows {
            if let Some(state) = self.active.get_mut(id) {
                state.awaiting = true;
                if self.overlap && state.continues_after_pick() {
                    self.scheduler.append_unresolved(*id);
                }
            }
        }
        report(&self.scheduler, &self.observer);
        Some(InFlight {
            rows: sampled_rows,
            pending,
        })
    }

    /// How the rows of each of `seqs` (a sequence and the drafts it feeds
    /// after its last token) pick their tokens ([`Active::rows`]: one row,
    /// or one a fed token), in order; a sequence gone since it was
    /// scheduled (ended by the pick before) picks greedily, unread, and one
    /// whose grammar fails goes to `failed`. Grammars' masks are the costly
    /// part (tens of µs a row): with several constrained sequences, they
    /// are decided in parallel.
    fn row_samplings(
        &mut self,
        seqs: &[(SeqId, &[u32])],
        failed: &mut Vec<(SeqId, String)>,
    ) -> Vec<RowSampling> {
        let eos = self.eos;
        let mut states: HashMap<SeqId, &mut Active<'t>> =
            self.active.iter_mut().map(|(id, a)| (*id, a)).collect();
        let mut rows: Vec<(Option<&mut Active<'t>>, &[u32])> = seqs
            .iter()
            .map(|&(id, drafts)| (states.remove(&id), drafts))
            .collect();
        let decide = |(state, drafts): &mut (Option<&mut Active<'t>>, &[u32])| {
            state.as_mut().map(|state| state.rows(eos, drafts))
        };
        let constrained = rows
            .iter()
            .filter(|(s, _)| s.as_ref().is_some_and(|s| s.constrained()))
            .count();
        let decided: Vec<_> = if constrained > 1 {
            rows.par_iter_mut().map(decide).collect()
        } else {
            rows.iter_mut().map(decide).collect()
        };
        seqs.iter()
            .zip(decided)
            .flat_map(|(&(id, drafts), decided)| match decided {
                Some(Ok(rows)) => rows,
                Some(Err(e)) => {
                    failed.push((id, e));
                    vec![RowSampling::greedy(); drafts.len() + 1]
                }
                None => vec![RowSampling::greedy(); drafts.len() + 1],
            })
            .collect()
    }

    /// Reads a launched step's picks and hands each to its sequence: text
    /// and events out, finished sequences removed. A sequence that fed
    /// drafts gets them up to the first its rows did not keep (a draft is
    /// kept when it is the pick of the row before it, [`Active::rows`]),
    /// then that row's own token (the last row's when all are kept).
    fn settle(&mut self, f: InFlight) {
        let waiting = Instant::now();
        let finished = self.model.backend.finish_sampled(f.pending);
        self.device_wait += waiting.elapsed().as_secs_f64();
        let sampled = match finished {
            Ok(sampled) => sampled,
            Err(e) => {
                for (id, _) in f.rows {
                    self.fail(id, format!("model step failed: {e}"));
                }
                return;
            }
        };
        let mut sampled = sampled.into_iter();
        let mut generated = 0;
        for (id, drafts) in f.rows {
            let mut picks: Vec<Sampled> = sampled.by_ref().take(drafts.len() + 1).collect();
            let kept = drafts
                .iter()
                .zip(&picks)
                .take_while(|(draft, pick)| **draft == pick.token)
                .count();
            picks.truncate(kept + 1);
            if !drafts.is_empty() && self.active.contains_key(&id) {
                self.observer.speculated(drafts.len(), kept);
            }
            for (i, pick) in picks.into_iter().enumerate() {
                if !self.deliver(id, pick, i < kept) {
                    break;
                }
                generated += 1;
            }
        }
        self.stats.step(0, generated, load(&self.scheduler));
        report(&self.scheduler, &self.observer);
    }

    /// Hands a sequence its pick: text and events out, the sequence removed
    /// if it ends. A `verified` pick was fed as a draft, so its keys and
    /// values are in the cache already. Returns whether the sequence goes
    /// on.
    fn deliver(&mut self, id: SeqId, sampled: Sampled, verified: bool) -> bool {
        let Some(state) = self.active.get_mut(&id) else {
            return false;
        };
        let now = Instant::now();
        match state.last_token {
            None => self
                .observer
                .first_token((now - state.arrived).as_secs_f64()),
            Some(last) => self.observer.next_token((now - last).as_secs_f64()),
        }
        state.last_token = Some(now);
        let token = sampled.token;
        match state.take_pick(sampled, self.tokenizer, self.eos) {
            Err(message) => self.fail(id, message),
            Ok(Some(finish_reason)) => {
                let state = self.active.remove(&id).expect("present");
                let _ = state.events.send(Event::Done {
                    finish_reason,
                    stop_reason: state.stop_reason.clone(),
                    prompt_tokens: state.prompt.len(),
                    completion_tokens: state.generated.len(),
                });
                self.observer.finished(
                    finish_reason,
                    state.arrived.elapsed().as_secs_f64(),
                    state.prompt.len(),
                    state.generated.len(),
                );
                self.scheduler.remove(id);
            }
            Ok(None) if verified => {
                self.scheduler.append_verified(id, token);
                return true;
            }
            Ok(None) => {
                self.scheduler.append_token(id, token);
                return true;
            }
        }
        false
    }
}

/// Where the device feeds the picks of the step in flight (whose sampled
/// sequences and their drafts are `previous`) into `batch`'s token ids:
/// each sequence whose last fed token is a placeholder gets its pick there
/// (the decoder pipeline lays the sequences' tokens out one after another).
/// A sequence that fed drafts has no one pick to feed (speculative decoding
/// runs without async scheduling).
fn token_feed(batch: &Batch, previous: &[(SeqId, Vec<u32>)]) -> Vec<TokenFeed> {
    let row_of = |id: SeqId| {
        let mut row = 0;
        for (seq, drafts) in previous {
            if *seq == id {
                return drafts.is_empty().then_some(row);
            }
            row += drafts.len() + 1;
        }
        None
    };
    let mut offset = 0;
    let mut feed = Vec::new();
    for seq in &batch.seqs {
        offset += seq.tokens.len();
        if seq.feeds_unresolved {
            if let Some(row) = row_of(seq.id) {
                feed.push(TokenFeed {
                    row,
                    index: offset - 1,
                });
            }
        }
    }
    feed
}

/// Sequences running and waiting, and the KV cache's use (the stats line's).
fn load(scheduler: &Scheduler) -> (usize, usize, f64) {
    (
        scheduler.num_running(),
        scheduler.num_waiting(),
        scheduler.blocks().usage(),
    )
}

fn report(scheduler: &Scheduler, observer: &impl EngineObserver) {
    let blocks = scheduler.blocks();
    let stats = blocks.stats();
    observer.state(
        scheduler.num_running(),
        scheduler.num_waiting(),
        blocks.usage(),
        stats.queries,
        stats.hits,
        scheduler.preemptions(),
    );
}
