//! The serving engine in-process, as the server drives it: what a request
//! hears back, collected from its events, and the engine's counters.

use kiln_host::engine::service::{Event, PromptLogprob};
use kiln_host::server::metrics::Metrics;
use tokio::sync::mpsc::UnboundedReceiver;

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
