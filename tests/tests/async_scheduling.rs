//! Async scheduling on the CUDA backend (the kernel emulator, or a GPU with
//! KILN_TEST_CUDA_DEVICE): the serving engine launches step N + 1 before it
//! reads step N's tokens, which the device feeds to it. Every request must
//! end exactly as when the host reads each step's tokens first: greedy and
//! seeded sampling, log-probabilities, stops by token, by string, by
//! end-of-sequence after `min_tokens` and by length, penalties (which make
//! the engine decide the next picks after reading the tokens), structured
//! output, sequences of one request, a cache small enough to preempt, and
//! prefix caching. And the host must really have read tokens while the next
//! step was queued, penalties and grammars included. A scored prompt (vLLM's
//! `prompt_logprobs`), whose chunks run as steps of their own while another
//! request's step is in flight, gets its tokens' log-probabilities as the
//! model's whole-prompt logits give them.

use kiln_host::engine::service::{GenerationParams, Request};
use kiln_host::engine::structured::{Constraint, Grammar, Grammars};
use kiln_host::engine::SamplingParams;
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::LoadOptions;
use kiln_host::runtime::cuda::{CudaExecutor, WeightDtype};
use kiln_tests::engine::{
    assert_same_outcomes, byte_tokenizer, metric, request, tiny_config, Outcome,
};

/// A request to serve.
#[derive(Clone)]
struct Ask {
    prompt: Vec<u32>,
    params: GenerationParams,
    /// Sequences of one request share a group.
    group: u64,
    grammar: Option<Grammar>,
}

impl Ask {
    fn new(prompt: Vec<u32>, params: GenerationParams, group: u64) -> Self {
        Self {
            prompt,
            params,
            group,
            grammar: None,
        }
    }
}

/// Runs `requests` through a serving engine on the CUDA backend; returns
/// each one's outcome (a failed one ends `error: ...`), how many times the
/// host read a step's tokens while the next step was queued, and the
/// preemptions.
fn serve(
    requests: &[Ask],
    eos: &[u32],
    async_scheduling: bool,
    num_blocks: usize,
) -> (Vec<Outcome>, u64, u64) {
    let (outcomes, overlapped, preemptions, _) =
        serve_warmed(requests, eos, async_scheduling, num_blocks, false);
    (outcomes, overlapped, preemptions)
}

/// [`serve`], with the engine's start-up warm-up (`engine/warm_up.rs`) run
/// or not whatever the device; also returns the kernels the device ran.
fn serve_warmed(
    requests: &[Ask],
    eos: &[u32],
    async_scheduling: bool,
    num_blocks: usize,
    warm_up: bool,
) -> (Vec<Outcome>, u64, u64, u64) {
    let options = LoadOptions {
        dtype: WeightDtype::Float32,
        ..kiln_tests::models::shape_options(kiln_tests::models::cuda_test_device())
    };
    let model = kiln_tests::models::tiny_llama_shape(ShapeDtype::F32, &options);
    let executor = model
        .backend
        .as_any()
        .downcast_ref::<CudaExecutor>()
        .expect("the CUDA backend");
    executor.warm_up_always(warm_up);
    let device = executor.device();
    let (overlapped_before, kernels_before) = (device.overlapped_waits(), device.kernels_run());
    let grammars = Grammars::new(byte_tokenizer(VOCAB), eos.to_vec(), VOCAB as usize);
    let config = tiny_config(num_blocks, async_scheduling, None);
    let requests = requests
        .iter()
        .map(|ask| Request {
            constraint: ask
                .grammar
                .as_ref()
                .map(|g| Constraint::new(grammars.matcher(g).unwrap())),
            ..request(ask.prompt.clone(), ask.params.clone(), ask.group)
        })
        .collect();
    let (outcomes, metrics) = kiln_tests::engine::serve(model, eos, config, requests);
    let preemptions = metric(&metrics, "vllm:num_preemptions_total") as u64;
    (
        outcomes,
        device.overlapped_waits() - overlapped_before,
        preemptions,
        device.kernels_run() - kernels_before,
    )
}

/// The tiny model's vocabulary.
const VOCAB: u32 = 768;

/// Prompt `i`: `len` ids spread over the tiny vocabulary.
fn prompt(i: u32, len: u32) -> Vec<u32> {
    (0..len).map(|j| (i * 97 + j * 31 + 5) % VOCAB).collect()
}

#[test]
fn async_scheduling_ends_every_request_as_reading_each_step_first_does() {
    // First the plain greedy outputs, to pick stops that fire mid-output.
    let plain: Vec<_> = (0..4)
        .map(|i| Ask::new(prompt(i, 3 + 5 * i), GenerationParams::greedy(12), 0))
        .collect();
    let (base, _, _) = serve(&plain, &[], false, 256);
    let token_at = |r: usize, i: usize| base[r].tokens[i];

    let mut requests = plain.clone();
    // Stops: a token id, a string (a token's text), the end-of-sequence
    // token after min_tokens, and the length.
    let mut stop_token = GenerationParams::greedy(12);
    stop_token.stop_token_ids = vec![token_at(0, 3)];
    requests.push(Ask::new(prompt(0, 3), stop_token, 10));
    let mut stop_string = GenerationParams::greedy(12);
    stop_string.stop = vec![format!("<{}>", token_at(1, 5))];
    requests.push(Ask::new(prompt(1, 8), stop_string, 11));
    let eos = [token_at(2, 2)];
    let mut min_tokens = GenerationParams::greedy(12);
    min_tokens.min_tokens = 6;
    requests.push(Ask::new(prompt(2, 13), min_tokens, 12));
    requests.push(Ask::new(prompt(3, 18), GenerationParams::greedy(1), 13));
    // Seeded sampling with log-probabilities; two sequences of one request.
    for seed in [7, 8] {
        let mut sampled = GenerationParams::greedy(10);
        sampled.sampling = SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.95,
            seed: Some(seed),
            ..SamplingParams::default()
        };
        sampled.logprobs = Some(2);
        requests.push(Ask::new(prompt(5, 9), sampled, 20));
    }
    // Penalties: while this runs, the engine reads each step's tokens before
    // the next step (short, so most steps overlap).
    let mut penalized = GenerationParams::greedy(3);
    penalized.penalties.repetition = 1.3;
    penalized.penalties.presence = 0.5;
    requests.push(Ask::new(prompt(6, 6), penalized, 30));

    let mut outcomes = Vec::new();
    for num_blocks in [256, 20] {
        let (want, waited, _) = serve(&requests, &eos, false, num_blocks);
        let (got, overlapped, preempted) = serve(&requests, &eos, true, num_blocks);
        assert_eq!(preempted > 0, num_blocks < 256, "{preempted} preemptions");
        assert_same_outcomes(&got, &want, &format!("{num_blocks} blocks"));
        assert_eq!(waited, 0, "without async scheduling no wait overlaps");
        eprintln!("{num_blocks} blocks: {overlapped} overlapped reads");
        assert!(
            overlapped >= 5,
            "{overlapped} reads of a step's tokens overlapped the next step"
        );
        outcomes.push(got);
    }
    // The stops fired mid-output, so they were tested.
    assert_eq!(base[0].end, "length after 12");
    let all = &outcomes[0];
    assert_eq!(all[4].end, "stop after 4");
    assert!(all[5].end.starts_with("stop after"), "{}", all[5].end);
    assert!(all[6].tokens.len() >= 6, "min_tokens");
    assert_eq!(all[7].end, "length after 1");
}

/// Penalties and grammars decide a row's pick from the output so far: the
/// engine still queues the next step's graph before it reads the tokens
/// (only that step's picks wait for them), and every request ends as when
/// the host reads each step's tokens first.
#[test]
fn penalties_and_grammars_overlap_the_next_step_and_end_alike() {
    // Two to six digits (tokens 48 to 57), then the end (token 7).
    let grammar = Grammar::Regex("[0-9]{2,6}".to_owned());
    let eos = [7];
    let mut requests = Vec::new();
    for i in 0..3 {
        let mut penalized = GenerationParams::greedy(14);
        penalized.penalties.repetition = 1.3;
        penalized.penalties.presence = 0.5;
        penalized.penalties.frequency = 0.2 * i as f32;
        requests.push(Ask::new(
            prompt(10 + i, 5 + 3 * i),
            penalized,
            40 + u64::from(i),
        ));
    }
    for i in 0..3 {
        let mut params = GenerationParams::greedy(12);
        if i == 1 {
            params.sampling = SamplingParams {
                temperature: 1.0,
                seed: Some(3),
                ..SamplingParams::default()
            };
        }
        requests.push(Ask {
            grammar: Some(grammar.clone()),
            ..Ask::new(prompt(20 + i, 4 + i), params, 50 + u64::from(i))
        });
    }
    let (want, waited, _) = serve(&requests, &eos, false, 256);
    let (got, overlapped, _) = serve(&requests, &eos, true, 256);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        assert!(!got.end.starts_with("error"), "request {i}: {got:?}");
        assert_eq!(
            (&got.tokens, &got.text, &got.end),
            (&want.tokens, &want.text, &want.end),
            "request {i}"
        );
    }
    for outcome in &got[3..] {
        let inside = outcome.tokens.strip_suffix(&eos).unwrap_or(&outcome.tokens);
        assert!(
            (2..=6).contains(&inside.len()) && inside.iter().all(|t| (48..58).contains(t)),
            "outside the grammar: {outcome:?}"
        );
        assert!(outcome.end.starts_with("stop after"), "{outcome:?}");
    }
    assert_eq!(waited, 0, "without async scheduling no wait overlaps");
    assert!(
        overlapped >= 5,
        "{overlapped} reads of a step's tokens overlapped the next step"
    );
}

/// A request asking more top log-probabilities than the device sampler
/// gives is refused alone when it arrives; the request beside it, which
/// would have shared its steps, runs to the end.
#[test]
fn too_many_log_probabilities_fail_only_their_request() {
    let mut too_many = GenerationParams::greedy(4);
    too_many.logprobs = Some(21);
    let mut most = GenerationParams::greedy(4);
    most.logprobs = Some(20);
    let requests = [
        Ask::new(prompt(1, 5), too_many, 1),
        Ask::new(prompt(2, 5), most, 2),
    ];
    let (outcomes, _, _) = serve(&requests, &[], true, 64);
    assert_eq!(
        outcomes[0].end,
        "error: 21 top log-probabilities asked, at most 20"
    );
    assert_eq!(outcomes[1].end, "length after 4");
    assert!(outcomes[1].logprobs.iter().all(|(_, top)| top.len() == 20));
}

/// A scored prompt two budgets long runs its chunks while another request
/// decodes greedily (its steps in flight with async scheduling; the last
/// chunk, of 5 rows, has its logits product on the decode GEMV, which must
/// not write over the greedy picks the next step is fed): every position's
/// log-probability, rank and top alternatives are those of the whole
/// prompt's logits (a Generator's), the first position has none, and both
/// requests generate what they do without async scheduling.
#[test]
fn scored_prompts_match_the_whole_prompts_logits() {
    let decoding = Ask::new(prompt(1, 8), GenerationParams::greedy(40), 0);
    // Chunks of 56 and 63 rows beside the other's prompt and first decode,
    // then 5 (the budget is 64 tokens), then the last prompt token.
    let long: Vec<u32> = (0..125).map(|i| (i * 7 + 3) % VOCAB).collect();
    let params = GenerationParams {
        prompt_logprobs: Some(3),
        ..GenerationParams::greedy(2)
    };
    let scored = Ask::new(long.clone(), params, 1);
    let options = LoadOptions {
        dtype: WeightDtype::Float32,
        ..kiln_tests::models::shape_options(kiln_tests::models::cuda_test_device())
    };
    let model = kiln_tests::models::tiny_llama_shape(ShapeDtype::F32, &options);
    let mut generator = kiln_host::engine::Generator::new(&model, long.len()).unwrap();
    let rows = generator.feed(&long, true).unwrap();
    let mut generated = Vec::new();
    for async_scheduling in [false, true] {
        let requests = [decoding.clone(), scored.clone()];
        let (outcomes, overlapped, _) = serve(&requests, &[], async_scheduling, 128);
        generated.push([outcomes[0].tokens.clone(), outcomes[1].tokens.clone()]);
        assert_eq!(
            outcomes[1].end, "length after 2",
            "async {async_scheduling}"
        );
        assert_eq!(outcomes[0].end, "length after 40");
        assert_eq!(overlapped > 0, async_scheduling, "steps in flight");
        let scores = outcomes[1].prompt_logprobs.as_ref().expect("scored");
        assert_eq!(scores.len(), long.len());
        assert!(scores[0].is_none());
        for (p, score) in scores.iter().enumerate().skip(1) {
            let (token, logprob, rank, top) = score.clone().expect("every later position");
            let lp = kiln_host::runtime::sampling::log_softmax(&rows[p - 1]);
            let want = lp[long[p] as usize];
            let what = format!("async {async_scheduling} position {p}");
            assert_eq!(token, long[p], "{what}");
            assert!((logprob - want).abs() < 1e-4, "{what}: {logprob} vs {want}");
            let more_likely = lp.iter().filter(|&&l| l > want + 1e-4).count();
            assert!(
                (more_likely + 1..=more_likely + 2).contains(&rank),
                "{what}: rank {rank}"
            );
            let mut order: Vec<u32> = (0..lp.len() as u32).collect();
            order.sort_by(|a, b| lp[*b as usize].total_cmp(&lp[*a as usize]));
            assert_eq!(top.len(), 3, "{what}");
            assert!(
                (lp[top[2] as usize] - lp[order[2] as usize]).abs() < 1e-4,
                "{what}: top"
            );
        }
    }
    assert_eq!(
        generated[0], generated[1],
        "outputs with and without async scheduling"
    );
}

/// A server that runs its step shapes once at start-up, as on a GPU whose
/// products are timed at first use (decode steps at the batch buckets up to
/// the tiny engine's 8 sequences and a prefill chunk, in the empty cache's
/// first blocks), serves every request as a cold one, async or not.
#[test]
fn a_warm_up_at_start_leaves_every_request_as_it_was() {
    let requests: Vec<_> = (0..5)
        .map(|i| Ask::new(prompt(i, 2 + 3 * i), GenerationParams::greedy(9), 0))
        .collect();
    for async_scheduling in [false, true] {
        let (cold, _, _, cold_kernels) = serve_warmed(&requests, &[], async_scheduling, 256, false);
        let (warm, _, _, warm_kernels) = serve_warmed(&requests, &[], async_scheduling, 256, true);
        assert_same_outcomes(&warm, &cold, &format!("async {async_scheduling}"));
        // The warm-up's five steps ran (each at least a dozen kernels).
        assert!(
            warm_kernels >= cold_kernels + 5 * 12,
            "{warm_kernels} kernels warmed, {cold_kernels} cold"
        );
    }
}
