//! The serving engine in-process, as the server drives it: what a request
//! hears back, collected from its events, and the engine's counters.

use std::sync::Arc;
use std::time::Instant;

use kiln_host::engine::service::{
    self, EngineConfig, Event, GenerationParams, PromptLogprob, Request,
};
use kiln_host::engine::speculative::NgramConfig;
use kiln_host::model::Model;
use kiln_host::scheduler::SchedulerConfig;
use kiln_host::server::metrics::Metrics;
use kiln_host::tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedReceiver;

/// Positions per KV-cache block of [`tiny_config`].
pub const BLOCK_SIZE: usize = 4;

/// An engine for the tiny models: `num_blocks` blocks of [`BLOCK_SIZE`], 8
/// sequences and 64 tokens a step, 512 positions, prefix caching.
pub fn tiny_config(
    num_blocks: usize,
    async_scheduling: bool,
    speculative: Option<NgramConfig>,
) -> EngineConfig {
    EngineConfig {
        num_blocks,
        block_size: BLOCK_SIZE,
        scheduler: SchedulerConfig {
            max_batch_size: 8,
            max_batch_tokens: 64,
            max_seq_len: 512,
        },
        prefix_caching: true,
        async_scheduling,
        speculative,
    }
}

/// A request of `group` for [`serve`] (which gives it its event channel).
pub fn request(prompt: Vec<u32>, params: GenerationParams, group: u64) -> Request {
    Request {
        prompt,
        params,
        events: tokio::sync::mpsc::unbounded_channel().0,
        arrived: Instant::now(),
        group,
        constraint: None,
    }
}

/// Serves `requests` on `model` through an engine with `config`, all
/// submitted at once, to their ends; returns each one's outcome and the
/// engine's metrics.
pub fn serve(
    mut model: Model,
    eos: &[u32],
    config: EngineConfig,
    requests: Vec<Request>,
) -> (Vec<Outcome>, Metrics) {
    let tokenizer = Arc::new(model.tokenizer.take().expect("a tokenizer"));
    let metrics = Metrics::new("tiny", config.block_size);
    let (engine, thread) =
        service::spawn(model, tokenizer, eos.to_vec(), config, metrics.clone()).unwrap();
    let receivers: Vec<_> = requests
        .into_iter()
        .map(|mut request| {
            let (events, receiver) = tokio::sync::mpsc::unbounded_channel();
            request.events = events;
            engine.submit(request).unwrap();
            receiver
        })
        .collect();
    let outcomes = receivers.into_iter().map(receive).collect();
    drop(engine);
    thread.join();
    (outcomes, metrics)
}

/// A scored prompt position: token, log-probability, rank, top ids.
pub type Scored = (u32, f32, usize, Vec<u32>);

/// What a request heard back.
#[derive(Debug)]
pub struct Outcome {
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Its text.
    pub text: String,
    /// Each token's log-probability and top ids, when asked for.
    pub logprobs: Vec<(f32, Vec<u32>)>,
    /// The prompt's (token, log-probability, rank, top ids) per position,
    /// when scored (before any output).
    pub prompt_logprobs: Option<Vec<Option<Scored>>>,
    /// `<finish reason> after <tokens>`, or `error: <message>`.
    pub end: String,
}

/// Collects a request's events until it ends.
pub fn receive(mut receiver: UnboundedReceiver<Event>) -> Outcome {
    let mut outcome = Outcome {
        tokens: Vec::new(),
        text: String::new(),
        logprobs: Vec::new(),
        prompt_logprobs: None,
        end: String::new(),
    };
    while let Some(event) = receiver.blocking_recv() {
        match event {
            Event::Chunk {
                text,
                token,
                logprob,
            } => {
                outcome.tokens.push(token);
                outcome.text += &text;
                if let Some(lp) = logprob {
                    let top = lp.top.iter().map(|t| t.0).collect();
                    outcome.logprobs.push((lp.logprob, top));
                }
            }
            Event::Done {
                finish_reason,
                completion_tokens,
                ..
            } => {
                outcome.end = format!("{} after {completion_tokens}", finish_reason.as_str());
                break;
            }
            Event::Error(message) => {
                outcome.end = format!("error: {message}");
                break;
            }
            Event::PromptLogprobs(scores) => {
                assert!(outcome.tokens.is_empty(), "scores after output");
                let entry = |s: &PromptLogprob| {
                    let top = s.logprob.top.iter().map(|t| t.0).collect();
                    (s.logprob.token, s.logprob.logprob, s.rank, top)
                };
                outcome.prompt_logprobs =
                    Some(scores.iter().map(|s| s.as_ref().map(entry)).collect());
            }
        }
    }
    outcome
}

/// Asserts that every request of `got` ended as its counterpart of `want`:
/// the same tokens, text and end, none an error, and log-probabilities
/// within rounding (a preempted sequence is recomputed in other batches).
pub fn assert_same_outcomes(got: &[Outcome], want: &[Outcome], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (got, want)) in got.iter().zip(want).enumerate() {
        let case = format!("{what}, request {i}: {got:?} vs {want:?}");
        assert!(!got.end.starts_with("error"), "{case}");
        assert_eq!(
            (&got.tokens, &got.text, &got.end),
            (&want.tokens, &want.text, &want.end),
            "{case}"
        );
        assert_eq!(got.logprobs.len(), want.logprobs.len(), "{case}");
        for ((a, top_a), (b, top_b)) in got.logprobs.iter().zip(&want.logprobs) {
            assert!((a - b).abs() < 1e-4 && top_a == top_b, "{case}");
        }
    }
}

/// The value of the metric line that starts with `name` (a counter's
/// `<name>_total`, a gauge's name).
pub fn metric(metrics: &Metrics, name: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or_else(|| panic!("no metric {name}"))
}

/// A byte-level BPE vocabulary of `vocab` tokens (a tiny model's) for
/// llguidance: token `b` < 256 is byte `b` (as GPT-2 writes bytes), the
/// rest two zero bytes and a number (never inside a grammar's text).
pub fn byte_tokenizer(vocab: u32) -> Arc<Tokenizer> {
    let self_mapped = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let byte_char = |b: u32| match self_mapped(b) {
        true => char::from_u32(b).unwrap(),
        false => char::from_u32(256 + (0..b).filter(|&x| !self_mapped(x)).count() as u32).unwrap(),
    };
    let vocab: serde_json::Map<String, serde_json::Value> = (0..vocab)
        .map(|i| match i {
            0..256 => (byte_char(i).to_string(), i.into()),
            _ => (format!("{0}{0}{i}", byte_char(0)), i.into()),
        })
        .collect();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
                                        "trim_offsets": false, "use_regex": false});
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []},
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, json.to_string()).unwrap();
    Arc::new(Tokenizer::from_file(&path).unwrap())
}
