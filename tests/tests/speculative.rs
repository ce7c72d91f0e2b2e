//! Speculative decoding by n-gram lookup (`--speculative-config` with the
//! `ngram` method) in the serving engine, on the CPU and on the CUDA backend
//! (the kernel emulator, or a GPU with KILN_TEST_CUDA_DEVICE): every request
//! ends exactly as without it (greedy ones drafted and verified, with
//! log-probabilities, penalties, a logit bias, bad words, `min_tokens` and
//! grammars too; stops by token, string and length inside a run of kept
//! drafts; a cache small enough to preempt; prefix caching), while
//! drafts were verified and kept and the requests took fewer steps. Sampled
//! requests draft too (their drafts checked against their distribution:
//! `runtime::sampling`'s test), reproducibly with a seed.

use kiln_host::device::DeviceChoice;
use kiln_host::engine::service::{GenerationParams, Request};
use kiln_host::engine::speculative::NgramConfig;
use kiln_host::engine::structured::{Constraint, Grammar, Grammars};
use kiln_host::engine::SamplingParams;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::{CudaExecutor, WeightDtype};
use kiln_host::server::metrics::Metrics;
use kiln_tests::engine::{
    self, assert_same_outcomes, byte_tokenizer, metric, request, tiny_config, Outcome,
};

/// The tiny model's vocabulary.
const VOCAB: u32 = 768;

/// What a run gave: each request's outcome, and the engine's counters.
struct Run {
    outcomes: Vec<Outcome>,
    metrics: Metrics,
}

impl Run {
    fn counter(&self, name: &str) -> f64 {
        metric(&self.metrics, &format!("{name}_total"))
    }
}

/// The tiny Llama shape (random weights) on `device`.
fn tiny(device: DeviceChoice) -> Model {
    let options = LoadOptions {
        dtype: WeightDtype::Float32,
        ..kiln_tests::models::shape_options(device)
    };
    kiln_tests::models::tiny_llama_shape(ShapeDtype::F32, &options)
}

/// Serves `requests` (all at once) on `model`.
fn serve(
    model: Model,
    requests: &[(Vec<u32>, GenerationParams)],
    speculative: Option<NgramConfig>,
    num_blocks: usize,
) -> Run {
    let config = tiny_config(num_blocks, false, speculative);
    let requests = requests
        .iter()
        .enumerate()
        .map(|(group, (prompt, params))| request(prompt.clone(), params.clone(), group as u64))
        .collect();
    let (outcomes, metrics) = engine::serve(model, &[], config, requests);
    Run { outcomes, metrics }
}

/// A prompt that repeats a pattern of `period` ids, `len` long.
fn repeating(seed: u32, period: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|j| (seed * 97 + (j % period) * 31 + 5) % VOCAB)
        .collect()
}

fn ngram() -> NgramConfig {
    NgramConfig::parse(
        r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}"#,
    )
    .unwrap()
}

/// The requests: greedy ones to draft, with stops inside their outputs
/// (picked from a plain run's tokens), beside requests that decode as
/// before.
fn requests(device: DeviceChoice) -> Vec<(Vec<u32>, GenerationParams)> {
    let greedy: Vec<_> = (0..4)
        .map(|i| (repeating(i, 3 + i, 9 + 4 * i), GenerationParams::greedy(40)))
        .collect();
    let plain = serve(tiny(device), &greedy, None, 256).outcomes;
    let token_at = |r: usize, i: usize| plain[r].tokens[i];
    let mut requests = greedy.clone();
    // The same prompt again (prefix caching), stopped by a token id, by a
    // string (a token's text) and by length mid-output.
    let mut stop_token = GenerationParams::greedy(40);
    stop_token.stop_token_ids = vec![token_at(0, 13)];
    requests.push((greedy[0].0.clone(), stop_token));
    let mut stop_string = GenerationParams::greedy(40);
    stop_string.stop = vec![format!("<{}>", token_at(1, 17))];
    requests.push((greedy[1].0.clone(), stop_string));
    requests.push((greedy[2].0.clone(), GenerationParams::greedy(11)));
    // Log-probabilities, penalties, a logit bias with a bad word, and
    // min_tokens: drafted too, each row picking as it would once the drafts
    // before it are kept.
    let mut logprobs = GenerationParams::greedy(20);
    logprobs.logprobs = Some(2);
    requests.push((repeating(6, 4, 12), logprobs));
    let mut penalized = GenerationParams::greedy(20);
    penalized.penalties.repetition = 1.3;
    penalized.penalties.frequency = 0.2;
    requests.push((repeating(7, 4, 12), penalized));
    let mut biased = GenerationParams::greedy(24);
    biased.logit_bias = vec![(token_at(3, 4), -2.0)];
    biased.bad_words = vec![vec![token_at(3, 8), token_at(3, 9)]];
    requests.push((greedy[3].0.clone(), biased));
    // Its stop token, made the likeliest by a bias, is banned until the
    // tenth token, which drafted rows cross.
    let mut min_tokens = GenerationParams::greedy(30);
    min_tokens.min_tokens = 10;
    min_tokens.stop_token_ids = vec![token_at(3, 2)];
    min_tokens.logit_bias = vec![(token_at(3, 2), 50.0)];
    requests.push((greedy[3].0.clone(), min_tokens));
    requests
}

/// Asserts that `got` (with drafts) ended every request as `want` did, in
/// fewer steps; returns the draft tokens kept and verified.
fn same_outcomes_in_fewer_steps(got: &Run, want: &Run, what: &str) -> (f64, f64) {
    assert_same_outcomes(&got.outcomes, &want.outcomes, what);
    let drafts = got.counter("vllm:spec_decode_num_draft_tokens");
    let accepted = got.counter("vllm:spec_decode_num_accepted_tokens");
    let (steps, plain_steps) = (
        got.counter("kiln:engine_steps"),
        want.counter("kiln:engine_steps"),
    );
    eprintln!(
        "{what}: {accepted} of {drafts} draft tokens kept, {steps} steps against {plain_steps}"
    );
    assert!(
        steps < plain_steps,
        "{what}: {steps} steps against {plain_steps}"
    );
    (accepted, drafts)
}

fn drafts_change_nothing_but_the_steps(device: DeviceChoice) {
    let requests = requests(device);
    for num_blocks in [256, 24] {
        let want = serve(tiny(device), &requests, None, num_blocks);
        let got = serve(tiny(device), &requests, Some(ngram()), num_blocks);
        let (accepted, drafts) =
            same_outcomes_in_fewer_steps(&got, &want, &format!("{device:?}, {num_blocks} blocks"));
        assert!(
            accepted > 0.0 && drafts >= accepted,
            "{accepted} of {drafts}"
        );
        let preempted = got.counter("vllm:num_preemptions");
        assert_eq!(preempted > 0.0, num_blocks < 256, "{preempted} preemptions");
    }
    // The stops fired mid-output, so they were tested.
    let outcomes = serve(tiny(device), &requests, Some(ngram()), 256).outcomes;
    for stopped in &outcomes[4..6] {
        assert!(stopped.end.starts_with("stop after"), "{}", stopped.end);
    }
    assert_eq!(outcomes[6].end, "length after 11");
}

#[test]
fn drafts_on_the_cpu_change_nothing_but_the_steps() {
    drafts_change_nothing_but_the_steps(DeviceChoice::Cpu);
}

#[test]
fn drafts_on_cuda_change_nothing_but_the_steps() {
    drafts_change_nothing_but_the_steps(kiln_tests::models::cuda_test_device());
}

/// Structured output drafts too: each draft's row takes the grammar's mask
/// after the drafts before it, drafts the grammar refuses (copied from the
/// prompts' other bytes) are not kept, and every request ends as without
/// drafts, inside its grammar.
fn grammar_drafts_change_nothing_but_the_steps(device: DeviceChoice) {
    // Pairs "ab" or "cd", 3 to 12 of them, then the end (token 7).
    let grammar = Grammar::Regex("(ab|cd){3,12}".to_owned());
    let eos = [7];
    let grammars = Grammars::new(byte_tokenizer(VOCAB), eos.to_vec(), VOCAB as usize);
    let prompts = ["abababx", "cdabcdz", "xyababab", "cdcd"];
    let run = |speculative| {
        let requests = prompts
            .iter()
            .enumerate()
            .map(|(i, text)| Request {
                constraint: Some(Constraint::new(grammars.matcher(&grammar).unwrap())),
                ..request(
                    text.bytes().map(u32::from).collect(),
                    GenerationParams::greedy(30),
                    i as u64,
                )
            })
            .collect();
        let config = tiny_config(256, false, speculative);
        let (outcomes, metrics) = engine::serve(tiny(device), &eos, config, requests);
        Run { outcomes, metrics }
    };
    let want = run(None);
    let got = run(Some(ngram()));
    let what = format!("{device:?}, grammar");
    let (accepted, drafts) = same_outcomes_in_fewer_steps(&got, &want, &what);
    assert!(
        0.0 < accepted && accepted < drafts,
        "{accepted} of {drafts}"
    );
    for outcome in &got.outcomes {
        let inside = outcome.tokens.strip_suffix(&eos).unwrap_or(&outcome.tokens);
        let text: String = inside.iter().map(|&t| char::from(t as u8)).collect();
        let pairs = text.len() / 2;
        assert!(
            text.len().is_multiple_of(2)
                && (3..=12).contains(&pairs)
                && (0..pairs).all(|i| ["ab", "cd"].contains(&&text[2 * i..2 * i + 2])),
            "outside the grammar: {outcome:?}"
        );
    }
}

#[test]
fn grammar_drafts_on_the_cpu_change_nothing_but_the_steps() {
    grammar_drafts_change_nothing_but_the_steps(DeviceChoice::Cpu);
}

#[test]
fn grammar_drafts_on_cuda_change_nothing_but_the_steps() {
    grammar_drafts_change_nothing_but_the_steps(kiln_tests::models::cuda_test_device());
}

/// On CUDA a drafted step is a decode step whose every row the device
/// picks, greedy or sampled (the sampler checks a sampled row's draft):
/// only token ids come back, a few bytes a row, where the rows' logits
/// would be 3 KB each.
#[test]
fn drafts_on_cuda_bring_back_only_their_picks() {
    let model = tiny(kiln_tests::models::cuda_test_device());
    let executor: &CudaExecutor = model.backend.as_any().downcast_ref().unwrap();
    let device = executor.device();
    let mut requests: Vec<_> = (0..3)
        .map(|i| (repeating(i, 3 + i, 9 + 4 * i), GenerationParams::greedy(40)))
        .collect();
    requests.push((repeating(2, 3, 15), seeded_sampling()));
    let run = serve(model, &requests, Some(ngram()), 256);
    let drafts = run.counter("vllm:spec_decode_num_draft_tokens");
    let generated: usize = run.outcomes.iter().map(|o| o.tokens.len()).sum();
    let rows = generated as f64 + drafts;
    let read = device.bytes_read() as f64;
    eprintln!("{read} bytes read back for {generated} tokens and {drafts} drafts");
    assert!(drafts > 0.0, "nothing drafted");
    assert!(
        read < 16.0 * rows,
        "{read} bytes read back for {rows} rows: logits came back"
    );
}

/// A seeded sampled request that drafts and keeps some.
fn seeded_sampling() -> GenerationParams {
    let mut sampled = GenerationParams::greedy(40);
    sampled.sampling = SamplingParams {
        // The random tiny model's logits are close together: a low
        // temperature makes its picks likely enough to draft and keep.
        temperature: 0.05,
        top_k: 40,
        top_p: 0.95,
        seed: Some(11),
        ..SamplingParams::default()
    };
    sampled
}

/// A seeded sampled request drafts, and gives the same tokens every time.
#[test]
fn sampled_requests_draft_and_repeat_with_their_seed() {
    let requests = [(repeating(2, 3, 15), seeded_sampling())];
    let runs: Vec<Run> = (0..2)
        .map(|_| serve(tiny(DeviceChoice::Cpu), &requests, Some(ngram()), 256))
        .collect();
    assert_eq!(runs[0].outcomes[0].end, "length after 40");
    assert_eq!(runs[0].outcomes[0].tokens, runs[1].outcomes[0].tokens);
    let drafts = runs[0].counter("vllm:spec_decode_num_draft_tokens");
    let kept = runs[0].counter("vllm:spec_decode_num_accepted_tokens");
    eprintln!("sampled: {kept} of {drafts} draft tokens kept");
    assert!(drafts > 0.0 && kept > 0.0, "{kept} of {drafts}");
}

/// SmolLM2 (real weights, on the CPU) continuing text that repeats, where
/// some drafts are right and some are not (the tiny random model's greedy
/// output repeats one token), one request with a bad word its drafts
/// propose: its greedy output is the same with drafts.
#[test]
fn smollm2_keeps_its_greedy_output_with_drafts() {
    let path = kiln_tests::models::smollm2_gguf()
        .unwrap_or_else(|| panic!("SmolLM2 is missing: run .ci/setup (or set KILN_SMOLLM2_GGUF)"));
    let load = || kiln_tests::models::load_model(&path);
    let texts = [
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
        "Monday, Tuesday, Wednesday, Thursday, Friday. The days again: Monday, Tuesday,",
        "The capital of France is Paris. The capital of Spain is Madrid. The capital of Italy is",
    ];
    let tokenizer = load().tokenizer.take().unwrap();
    let mut requests: Vec<_> = texts
        .iter()
        .map(|text| {
            (
                tokenizer.encode(text, false).unwrap(),
                GenerationParams::greedy(32),
            )
        })
        .collect();
    // The days again with ", Wednesday" a bad word: the drafts that copy
    // the days propose it after "Tuesday", and the row after a drafted ","
    // must ban it as it would once that comma is generated.
    let mut banned = GenerationParams::greedy(32);
    banned.bad_words = vec![tokenizer.encode(", Wednesday", false).unwrap()];
    requests.push((requests[1].0.clone(), banned));
    let want = serve(load(), &requests, None, 256);
    let got = serve(load(), &requests, Some(ngram()), 256);
    let (accepted, drafts) = same_outcomes_in_fewer_steps(&got, &want, "SmolLM2");
    assert!(
        0.0 < accepted && accepted < drafts,
        "{accepted} of {drafts}: some drafts kept, some not"
    );
}
