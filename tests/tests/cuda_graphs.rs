//! CUDA graphs of decode steps on the CUDA backend (the kernel emulator, or a
//! GPU with KILN_TEST_CUDA_DEVICE): decode batches are padded to a few
//! bucket sizes, so batches of 3 and 4 sequences share one captured graph,
//! and the padded steps (with q/k/v and gate/up each one launch) give the
//! CPU backend's logits.

use kiln_host::device::DeviceChoice;
use kiln_host::engine::batch::{launch_step, run_sampled_step, run_step, Pipeline};
use kiln_host::model::synthetic::ShapeDtype;
use kiln_host::model::{LoadOptions, Model};
use kiln_host::runtime::cuda::{AttentionBackend, CudaExecutor, WeightDtype};
use kiln_host::runtime::sampling::{self, RowSampling};
use kiln_host::runtime::{CacheLayout, KvCache, KvCacheDtype};
use kiln_plugin_api::pipeline::{StepBatch, StepSequence};

const BLOCK_SIZE: usize = 4;

fn load(device: DeviceChoice) -> Model {
    let options = LoadOptions {
        dtype: WeightDtype::Float32,
        ..kiln_tests::models::shape_options(device)
    };
    kiln_tests::models::tiny_llama_shape(ShapeDtype::F32, &options)
}

fn cache(model: &Model) -> KvCache {
    cache_of(model, 16)
}

/// A cache of `blocks` blocks of BLOCK_SIZE positions.
fn cache_of(model: &Model, blocks: usize) -> KvCache {
    let layout = CacheLayout {
        block_size: BLOCK_SIZE,
        num_kv_heads: model.config.kv.num_kv_heads as usize,
        head_dim: model.config.kv.head_dim as usize,
    };
    let layers = model.config.kv.num_layers as usize;
    model.backend.new_kv_cache(layers, blocks, layout).unwrap()
}

/// The batch of `sequences` (index, tokens, start); every sequence owns
/// blocks 2i and 2i + 1.
fn batch(sequences: &[(u32, Vec<u32>, usize)]) -> StepBatch {
    batch_of(sequences, 2)
}

/// The batch of `sequences` (index, tokens, start); sequence i owns blocks
/// `width` · i onwards, `width` of them.
fn batch_of(sequences: &[(u32, Vec<u32>, usize)], width: u32) -> StepBatch {
    StepBatch {
        sequences: sequences
            .iter()
            .map(|(i, tokens, start)| StepSequence {
                tokens: tokens.clone(),
                start: *start,
                blocks: (width * i..width * (i + 1)).collect(),
                wants_logits: true,
                token_types: Vec::new(),
            })
            .collect(),
        all_logits: false,
    }
}

/// One step of `sequences` (index, tokens, start); every sequence owns
/// blocks 2i and 2i + 1. Returns each one's last-token logits.
fn step(model: &Model, cache: &mut KvCache, sequences: &[(u32, Vec<u32>, usize)]) -> Vec<Vec<f32>> {
    step_of(model, cache, sequences, 2)
}

/// One step of `sequences` as [`batch_of`] lays them out: each one's
/// last-token logits.
fn step_of(
    model: &Model,
    cache: &mut KvCache,
    sequences: &[(u32, Vec<u32>, usize)],
    width: u32,
) -> Vec<Vec<f32>> {
    run_step(
        model.backend.as_ref(),
        &Pipeline::Decoder,
        cache,
        &batch_of(sequences, width),
    )
    .unwrap()
    .into_iter()
    .map(|mut rows| rows.remove(0))
    .collect()
}

#[test]
fn decode_batches_share_bucketed_graphs_and_match_the_cpu() {
    let (cpu, cuda) = (
        load(DeviceChoice::Cpu),
        load(kiln_tests::models::cuda_test_device()),
    );
    let (mut cpu_cache, mut cuda_cache) = (cache(&cpu), cache(&cuda));
    let executor: &CudaExecutor = cuda.backend.as_any().downcast_ref().unwrap();
    let captured = || executor.captured_graphs();
    // Each of the 2 layers reads q, k and v in one launch and gate and up in
    // one (3 steps merged) and rotates q and k in one (1); 4 of the 5 RMS
    // norms run with the residual add before them, the first with the
    // embedding, and the gather of the last tokens with the last norm
    // (`end_norms.rs`).
    assert_eq!(executor.merged_steps(), 2 * (3 + 1) + 4 + 1 + 1);
    // Each layer's rotation of q and k writes the keys and values into the
    // cache (kiln_rope_write_kv) instead of the attention's own write.
    assert_eq!(executor.cache_writes_with_rotary(), 2);
    // Each layer's SiLU(gate)·up is written by the GEMV of gate and up at up
    // to 8 rows (decode), by its own kernel for longer prompts.
    assert_eq!(executor.gated_activations_in_gemv(), 2);
    // And its rotation of q and k with that cache write is done by the GEMV
    // of q, k and v at up to 8 rows, by the rotary launch for longer ones.
    assert_eq!(executor.rotations_in_gemv(), 2);
    // Prefill five sequences of three tokens, one at a time.
    for i in 0..5u32 {
        let prompt = vec![(vec![i * 7 + 1, i * 3 + 2, 5], 0)];
        let with_index: Vec<_> = prompt.into_iter().map(|(t, s)| (i, t, s)).collect();
        let a = step(&cpu, &mut cpu_cache, &with_index);
        let b = step(&cuda, &mut cuda_cache, &with_index);
        assert_close(&a, &b, "prefill");
    }
    // Decode: 3, 4, 3 and 4 sequences (bucket 4: eager, then captured, then
    // replayed twice), then 5 (bucket 8: eager; its larger arena starts the
    // graph cache over).
    let mut after_capture = 0;
    let mut next = [1u32; 5];
    let mut position = [3usize; 5];
    for (round, batch) in [3usize, 4, 3, 4, 5].into_iter().enumerate() {
        let sequences: Vec<(u32, Vec<u32>, usize)> = (0..batch as u32)
            .map(|i| (i, vec![next[i as usize]], position[i as usize]))
            .collect();
        let a = step(&cpu, &mut cpu_cache, &sequences);
        let b = step(&cuda, &mut cuda_cache, &sequences);
        assert_close(&a, &b, &format!("decode round {round} ({batch} sequences)"));
        for i in 0..batch {
            next[i] = kiln_host::engine::sampling::argmax(&a[i]);
            position[i] += 1;
        }
        if round == 1 {
            after_capture = captured();
            assert!(after_capture > 0, "the second decode step was not captured");
        }
        if round == 3 {
            assert_eq!(
                captured(),
                after_capture,
                "3 and 4 sequences share one graph"
            );
        }
    }
}

/// Padded decode steps over a bf16 cache (3 sequences in the graph of 4:
/// its padding row has no context) on the tensor-core decode attention,
/// against the portable kernels: within bf16 rounding (6e-3 relative, as
/// `cuda_kv_cache.rs`), not all equal.
#[test]
fn padded_decode_steps_on_tensor_core_attention_match_the_portable_kernels() {
    let load = |attention_backend| {
        let options = LoadOptions {
            dtype: WeightDtype::Float32,
            kv_cache_dtype: KvCacheDtype::BFloat16,
            attention_backend,
            ..kiln_tests::models::shape_options(kiln_tests::models::cuda_test_device())
        };
        kiln_tests::models::tiny_llama_shape(ShapeDtype::F32, &options)
    };
    let (portable, auto) = (
        load(AttentionBackend::Portable),
        load(AttentionBackend::Auto),
    );
    let (mut portable_cache, mut auto_cache) = (cache(&portable), cache(&auto));
    let mut sequences: Vec<(u32, Vec<u32>, usize)> = (0..3u32)
        .map(|i| (i, vec![i * 7 + 1, i * 3 + 2, 5], 0))
        .collect();
    let (mut worst, mut differs) = (0f32, false);
    for round in 0..4 {
        let a = step(&portable, &mut portable_cache, &sequences);
        let b = step(&auto, &mut auto_cache, &sequences);
        for (row, (x, y)) in a.iter().zip(&b).enumerate() {
            let delta = kiln_tests::models::relative_difference(x, y);
            assert!(
                delta < 6e-3,
                "round {round}, row {row}: relative |Δ| {delta:.2e}"
            );
            (worst, differs) = (worst.max(delta), differs || x != y);
        }
        for (i, (_, tokens, start)) in sequences.iter_mut().enumerate() {
            *start += tokens.len();
            *tokens = vec![kiln_host::engine::sampling::argmax(&a[i])];
        }
    }
    println!("relative |Δ| {worst:.2e}");
    assert!(differs, "the portable kernels' logits exactly");
}

fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (row, (a, b)) in a.iter().zip(b).enumerate() {
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 2e-4,
                "{what} row {row}: {x} on the CPU, {y} on CUDA"
            );
        }
    }
}

/// Decode over a long context: each row's keys are split across blocks of
/// the GPU (flash-decoding) and merged by the attention launch itself (its
/// last block), giving the CPU backend's logits with no more kernels than
/// a decode step over a short context.
#[test]
fn long_context_decode_splits_attention_and_matches_the_cpu() {
    let (cpu, cuda) = (
        load(DeviceChoice::Cpu),
        load(kiln_tests::models::cuda_test_device()),
    );
    let device = cuda
        .backend
        .as_any()
        .downcast_ref::<CudaExecutor>()
        .unwrap()
        .device();
    let kernels_of = |feed: &mut dyn FnMut()| {
        let before = device.kernels_run();
        feed();
        device.kernels_run() - before
    };
    let mut short = kiln_host::engine::Generator::new(&cuda, 16).unwrap();
    short.feed(&[1, 2, 3], false).unwrap();
    let unsplit = kernels_of(&mut || {
        short.feed(&[4], false).unwrap();
    });
    // 32 blocks of 16 positions a sequence: a decode row's keys split 32
    // ways (one cache block each, to fill the GPU; those past position 304
    // empty).
    let capacity = 512;
    let (mut on_cpu, mut on_cuda) = (
        kiln_host::engine::Generator::new(&cpu, capacity).unwrap(),
        kiln_host::engine::Generator::new(&cuda, capacity).unwrap(),
    );
    let prompt: Vec<u32> = (0..300).map(|i| (i * 31 + 11) % 768).collect();
    let mut last = Vec::new();
    for chunk in prompt.chunks(100) {
        let a = on_cpu.feed(chunk, false).unwrap().remove(0);
        let b = on_cuda.feed(chunk, false).unwrap().remove(0);
        assert_close(std::slice::from_ref(&a), &[b], "prefill chunk");
        last = a;
    }
    for position in 0..4 {
        let token = kiln_host::engine::sampling::argmax(&last);
        let a = on_cpu.feed(&[token], false).unwrap().remove(0);
        let mut b = Vec::new();
        let split = kernels_of(&mut || b = on_cuda.feed(&[token], false).unwrap().remove(0));
        assert_eq!(split, unsplit, "kernels of decode {position} at 300+");
        assert_close(
            std::slice::from_ref(&a),
            &[b],
            &format!("decode {position} at 300+"),
        );
        last = a;
    }
}

/// Past 16 rows, long contexts split too (`long_context_splits`): a step of
/// 21 rows, a decode row and a 20-token chunk, over block tables 128 cache
/// blocks wide (the f32 cache's grouped kernels) splits each row's keys two
/// ways and gives the CPU backend's logits; so do the 100-row prefill
/// chunks before it.
#[test]
fn many_rows_over_long_contexts_split_attention_and_match_the_cpu() {
    const WIDTH: u32 = 128;
    let (cpu, cuda) = (
        load(DeviceChoice::Cpu),
        load(kiln_tests::models::cuda_test_device()),
    );
    let blocks = 2 * WIDTH as usize;
    let (mut cpu_cache, mut cuda_cache) = (cache_of(&cpu, blocks), cache_of(&cuda, blocks));
    let mut both = |sequences: &[(u32, Vec<u32>, usize)], what: &str| {
        let a = step_of(&cpu, &mut cpu_cache, sequences, WIDTH);
        let b = step_of(&cuda, &mut cuda_cache, sequences, WIDTH);
        assert_close(&a, &b, what);
        a
    };
    let prompt =
        |seed: u32, n: u32| -> Vec<u32> { (0..n).map(|i| (i * 31 + seed) % 768).collect() };
    let (first, second) = (prompt(11, 500), prompt(5, 480));
    for (i, tokens) in [(0u32, &first), (1, &second)] {
        for (c, chunk) in tokens.chunks(100).enumerate() {
            both(
                &[(i, chunk.to_vec(), 100 * c)],
                &format!("sequence {i} chunk {c}"),
            );
        }
    }
    let extra = prompt(7, 20);
    both(
        &[(0, vec![3], first.len()), (1, extra, second.len())],
        "a decode row and a 20-token chunk at ~500 positions",
    );
}

/// Steps of more than `graphs::MAX_CAPTURED_ROWS` (512) tokens run eagerly
/// however often their binding comes back (capturing one idles the GPU while
/// the host records it); shorter ones are captured on their second run.
#[test]
fn steps_of_more_than_512_tokens_are_never_captured() {
    let cuda = load(kiln_tests::models::cuda_test_device());
    let executor: &CudaExecutor = cuda.backend.as_any().downcast_ref().unwrap();
    let width = 44;
    let mut cache = cache_of(&cuda, 3 * width as usize);
    let prompts = |n: u32| -> Vec<(u32, Vec<u32>, usize)> {
        (0..n)
            .map(|i| (i, (0..172).map(|t| (t * 5 + i * 11) % 768).collect(), 0))
            .collect()
    };
    let long = prompts(3);
    assert!(long.iter().map(|(_, t, _)| t.len()).sum::<usize>() > 512);
    for run in 0..3 {
        let logits = step_of(&cuda, &mut cache, &long, width);
        assert!(logits.iter().flatten().all(|v| v.is_finite()));
        assert_eq!(executor.captured_graphs(), 0, "516 tokens, run {run}");
    }
    for run in 0..2 {
        step_of(&cuda, &mut cache, &prompts(2), width);
        assert_eq!(executor.captured_graphs(), run, "344 tokens, run {run}");
    }
}

/// A token id past the vocabulary is reported by the embedding kernel (the
/// error flag uploaded with the inputs), and the next step runs normally.
#[test]
fn an_out_of_range_token_is_an_error_and_the_next_step_runs() {
    let cuda = load(kiln_tests::models::cuda_test_device());
    let mut generator = kiln_host::engine::Generator::new(&cuda, 8).unwrap();
    let err = generator
        .feed(&[5, 100_000], false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("out of range"), "{err}");
    let mut fresh = kiln_host::engine::Generator::new(&cuda, 8).unwrap();
    let logits = fresh.feed(&[5, 6], false).unwrap().remove(0);
    assert!(logits.iter().all(|v| v.is_finite()));
}

/// A sampled step waits for the device once, for its tokens: the inputs and
/// the sampler's parameters are uploaded without waiting (through pinned
/// memory on a GPU) and the error flag is read after the tokens. This holds
/// for eager, captured and replayed steps, with and without log-probabilities,
/// and an out-of-range token is still reported on this path.
#[test]
fn a_sampled_step_waits_for_the_device_once() {
    let cuda = load(kiln_tests::models::cuda_test_device());
    let executor: &CudaExecutor = cuda.backend.as_any().downcast_ref().unwrap();
    let mut cache = cache(&cuda);
    let sampled_step = |cache: &mut KvCache, sequences: &[(u32, Vec<u32>, usize)], logprobs| {
        let rows: Vec<RowSampling> = sequences
            .iter()
            .map(|_| RowSampling {
                logprobs,
                ..RowSampling::greedy()
            })
            .collect();
        let before = executor.host_waits();
        let sampled = run_sampled_step(
            cuda.backend.as_ref(),
            &Pipeline::Decoder,
            cache,
            &batch(sequences),
            &rows,
        );
        (sampled, executor.host_waits() - before)
    };
    let prompt = [(0, vec![3, 9, 4], 0), (1, vec![8, 2, 7], 0)];
    let (sampled, waits) = sampled_step(&mut cache, &prompt, None);
    let mut next: Vec<u32> = sampled.unwrap().iter().map(|s| s.token).collect();
    assert_eq!(waits, 1, "a prefill step");
    for (round, logprobs) in [None, None, None, Some(3)].into_iter().enumerate() {
        let decode: Vec<_> = (0..2)
            .map(|i| (i as u32, vec![next[i]], 3 + round))
            .collect();
        let (sampled, waits) = sampled_step(&mut cache, &decode, logprobs);
        let sampled = sampled.unwrap();
        assert_eq!(waits, 1, "decode round {round} (logprobs {logprobs:?})");
        assert_eq!(sampled[0].top.len(), logprobs.unwrap_or(0));
        next = sampled.iter().map(|s| s.token).collect();
    }
    assert!(
        executor.captured_graphs() > 0,
        "no decode step was captured"
    );
    let (sampled, _) = sampled_step(&mut cache, &[(0, vec![100_000], 7)], None);
    let err = sampled.unwrap_err().to_string();
    assert!(err.contains("out of range"), "{err}");
    // A launched step's picks are taken from its logits only while no step
    // has run over them since.
    let backend = cuda.backend.as_ref();
    let mut launch = |i: u32, token| {
        let sequences = [(i, vec![token], 7)];
        launch_step(
            backend,
            &Pipeline::Decoder,
            &mut cache,
            &batch(&sequences),
            1,
            &[],
        )
        .unwrap()
    };
    let (first, second) = (launch(0, 5), launch(1, 6));
    let rows = [RowSampling::greedy()];
    let err = backend
        .launch_picks(first, &rows)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("another step ran over"), "{err}");
    let picked = backend.launch_picks(second, &rows).unwrap();
    assert_eq!(backend.finish_sampled(picked).unwrap().len(), 1);
}

/// The kernels a step runs, as the device counts them (launches and GEMMs),
/// on the tiny Llama's two layers with bf16 products: a decode step of one
/// sequence runs 5 a layer (q/k/v GEMV writing q and k rotated and the
/// keys and values into the cache, attention, o GEMV, gate/up GEMV writing
/// SiLU(gate)·up, down GEMV), the o and down GEMVs adding the residual and
/// taking the next norm's parts, whose products scale their sums
/// (`norm_fold.rs`), except the last down's: its norm feeds the last
/// tokens' gather, not a product, and runs with that gather as one launch
/// (`end_norms.rs`); and 2 more (the embedding with the first norm, the
/// logits' GEMV), eager, captured or replayed; a 10-token prefill runs 4
/// GEMMs a layer on bf16 x, which the two norms, the activation and the
/// attention write in bf16 themselves, no cast between: q, k and v as one
/// over their stacked
/// matrix, whose rows the rotary launch (its own past the decode GEMV)
/// reads where they lie, writing the cache and v
/// (`products::rotates_after_stack`: no split of its columns), gate and up
/// as one, whose rows `kiln_gated_rows` reads for the activation
/// (`products::activates_after_stack`), o and down (9).
#[test]
fn steps_run_the_kernels_their_fusions_leave() {
    let options = kiln_tests::models::shape_options(kiln_tests::models::cuda_test_device());
    let model = kiln_tests::models::tiny_llama_shape(ShapeDtype::F32, &options);
    let executor: &CudaExecutor = model.backend.as_any().downcast_ref().unwrap();
    let device = executor.device();
    let mut cache = cache(&model);
    let mut kernels = |sequences: &[(u32, Vec<u32>, usize)]| {
        let before = device.kernels_run();
        step(&model, &mut cache, sequences);
        device.kernels_run() - before
    };
    let prompts = [(0, vec![1, 2, 3, 4, 5], 0), (1, vec![6, 7, 8, 9, 10], 0)];
    assert_eq!(kernels(&prompts), 2 * 9 + 2, "a 10-token prefill");
    // Gate's and up's products, past the GEMV, write bf16 for the
    // generated activation.
    assert_eq!(executor.half_product_outputs(), 2 * 2);
    for position in 5..8 {
        let decode = kernels(&[(0, vec![5], position)]);
        assert_eq!(decode, 2 * 5 + 1 + 2, "decode at position {position}");
    }
    assert_eq!(executor.captured_graphs(), 1);
}

/// Greedy rows with nothing to adjust take the picks that the logits'
/// decode GEMV found as it wrote them: no sampler launch, and the same
/// tokens as the sampler's (which runs when log-probabilities are asked
/// for) and as the host's argmax of the step's logits. Past the GEMV (9
/// rows, padded to 16: the GEMM) the sampler picks every row.
#[test]
fn greedy_rows_take_the_picks_of_the_logits_gemv() {
    let cuda = load(kiln_tests::models::cuda_test_device());
    let executor: &CudaExecutor = cuda.backend.as_any().downcast_ref().unwrap();
    let device = executor.device();
    let layout = CacheLayout {
        block_size: BLOCK_SIZE,
        num_kv_heads: cuda.config.kv.num_kv_heads as usize,
        head_dim: cuda.config.kv.head_dim as usize,
    };
    let layers = cuda.config.kv.num_layers as usize;
    let mut cache = cuda.backend.new_kv_cache(layers, 32, layout).unwrap();
    for rows in [2u32, 9] {
        let prompts: Vec<_> = (0..rows)
            .map(|i| (i, vec![3 + i, 9, 40 + 7 * i], 0))
            .collect();
        step(&cuda, &mut cache, &prompts);
        let decode: Vec<_> = (0..rows)
            .map(|i| (i, vec![(61 * i + 5) % 768], 3))
            .collect();
        // Rerunning the step writes the same keys and values again.
        let logits = step(&cuda, &mut cache, &decode);
        let want: Vec<u32> = logits.iter().map(|l| sampling::argmax(l)).collect();
        let mut kernels = Vec::new();
        for logprobs in [None, Some(0)] {
            let sampling = RowSampling {
                logprobs,
                ..RowSampling::greedy()
            };
            let before = device.kernels_run();
            let sampled = run_sampled_step(
                cuda.backend.as_ref(),
                &Pipeline::Decoder,
                &mut cache,
                &batch(&decode),
                &vec![sampling; rows as usize],
            )
            .unwrap();
            kernels.push(device.kernels_run() - before);
            let got: Vec<u32> = sampled.iter().map(|s| s.token).collect();
            assert_eq!(got, want, "{rows} rows, log-probabilities {logprobs:?}");
        }
        let sampler = u64::from(rows <= 8);
        assert_eq!(kernels[0] + sampler, kernels[1], "{rows} rows: kernels");
    }
}

/// A server's start-up warm-up (decode steps at a few batch sizes and a
/// prefill chunk, all in the cache's first blocks) leaves every later step
/// as it would have been: the same bits as a backend that never warmed up,
/// over the very blocks the warm-up wrote.
#[test]
fn a_warm_up_leaves_later_steps_as_they_were() {
    let device = kiln_tests::models::cuda_test_device();
    let (warmed, cold) = (load(device), load(device));
    let (mut warmed_cache, mut cold_cache) = (cache(&warmed), cache(&cold));
    let done = kiln_host::engine::warm_up::warm_up(
        warmed.backend.as_ref(),
        &Pipeline::Decoder,
        &mut warmed_cache,
        &[1, 2, 4],
        7,
    )
    .unwrap();
    assert_eq!(done.chunk_tokens, 7);
    let mut sequences: Vec<(u32, Vec<u32>, usize)> = (0..3u32)
        .map(|i| (i, vec![i + 3, 2 * i + 1, 9], 0))
        .collect();
    for round in 0..4 {
        let a = step(&warmed, &mut warmed_cache, &sequences);
        let b = step(&cold, &mut cold_cache, &sequences);
        assert_eq!(a, b, "step {round}");
        for (s, logits) in sequences.iter_mut().zip(&a) {
            s.2 += s.1.len();
            s.1 = vec![kiln_host::engine::sampling::argmax(logits)];
        }
    }
}
