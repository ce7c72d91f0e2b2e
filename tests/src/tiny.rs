//! The tiny-model harness: a fixture of `tests/fixtures/reference/tiny_*.json`
//! (made by `gen_tiny_models.py`) written as a Hugging Face model directory,
//! loaded like a user's model, and run through the default decoder pipeline
//! in prefill, chunked prefill, token-by-token decode, a ragged batch of all
//! prompts and greedy generation, against transformers' logits and tokens.

use std::collections::BTreeMap;

use kiln_host::engine::batch::{run_step, Pipeline};
use kiln_host::runtime::cuda::CudaExecutor;
use kiln_host::runtime::{Backend, CacheLayout, KvCache, Tensor};
use kiln_plugin_api::pipeline::{StepBatch, StepSequence};
use serde::Deserialize;

use crate::models::{write_model_dir, DeviceChoice, WeightDtype};
use crate::reference::{compare, FixtureTensor};

/// A tiny model fixture: the checkpoint, prompts, and transformers' logits
/// and greedy continuation.
#[derive(Deserialize)]
pub struct TinyModel {
    /// The transformers class.
    pub architecture: String,
    /// `config.json`.
    pub config: serde_json::Value,
    /// The checkpoint, under save_pretrained's names.
    pub weights: BTreeMap<String, FixtureTensor>,
    /// Prompts of 1, 5 and 11 tokens.
    pub prompts: Vec<Vec<i64>>,
    /// Every position's logits of each prompt.
    pub logits: Vec<FixtureTensor>,
    /// Greedy continuation of the longest prompt.
    pub greedy: Vec<i64>,
}

/// Tokens per KV-cache block in these tests.
pub const BLOCK_SIZE: usize = 4;
/// Absolute tolerance against transformers' f32 logits.
pub const ATOL: f64 = 1e-4;
/// Relative tolerance against transformers' f32 logits.
pub const RTOL: f64 = 1e-4;

/// A loaded fixture: its backend and KV-cache shape.
pub struct Engine {
    backend: Box<dyn Backend>,
    layout: CacheLayout,
    layers: usize,
}

/// One sequence's step: which tokens, at which positions, with which blocks.
pub struct Step<'a> {
    /// The tokens fed.
    pub tokens: &'a [i64],
    /// Position of the first.
    pub start: usize,
    /// The sequence's cache blocks.
    pub blocks: Vec<i64>,
}

impl Engine {
    /// Writes the fixture as a Hugging Face model directory (config.json and
    /// safetensors, sharded in two when `sharded`) and loads it like a user's
    /// onto `device` (f32 weights: exact on every backend).
    pub fn load(name: &str, sharded: bool, device: DeviceChoice) -> (Self, TinyModel) {
        let model = read_fixture(name);
        (Self::from_model(&model, sharded, device), model)
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// [`Engine::load`] of a fixture already read (and perhaps changed).
    pub fn from_model(model: &TinyModel, sharded: bool, device: DeviceChoice) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_model_dir(&model.config, &model.weights, dir.path(), sharded);
        let loaded = crate::models::load_model_on(dir.path(), device, WeightDtype::Float32);
        assert_eq!(loaded.architecture.info.name, model.architecture);
        assert!(
            loaded.unused_tensors.is_empty(),
            "{:?}",
            loaded.unused_tensors
        );
        let layout = CacheLayout {
            block_size: BLOCK_SIZE,
            num_kv_heads: loaded.config.kv.num_kv_heads as usize,
            head_dim: loaded.config.kv.head_dim as usize,
        };
        let layers = loaded.config.kv.num_layers as usize;
        Self {
            backend: loaded.backend,
            layout,
            layers,
        }
    }

    pub fn cache(&self, blocks: usize) -> KvCache {
        self.backend
            .new_kv_cache(self.layers, blocks, self.layout)
            .unwrap()
    }

    /// The last position's logits of `prompt` prefilled alone into a fresh
    /// cache.
    pub fn prefill(&self, prompt: &[i64]) -> Vec<f32> {
        let step = Step {
            tokens: prompt,
            start: 0,
            blocks: blocks_for(0, prompt.len()),
        };
        self.step(&mut self.cache(8), &[step]).remove(0)
    }

    /// Runs one step for several sequences through the default decoder
    /// pipeline; returns each one's last-token logits.
    pub fn step(&self, cache: &mut KvCache, steps: &[Step<'_>]) -> Vec<Vec<f32>> {
        let to_u32 = |v: &[i64]| v.iter().map(|&x| x as u32).collect();
        let batch = StepBatch {
            sequences: steps
                .iter()
                .map(|s| StepSequence {
                    tokens: to_u32(s.tokens),
                    start: s.start,
                    blocks: to_u32(&s.blocks),
                    wants_logits: true,
                    token_types: Vec::new(),
                })
                .collect(),
            all_logits: false,
        };
        run_step(self.backend.as_ref(), &Pipeline::Decoder, cache, &batch)
            .unwrap()
            .into_iter()
            .map(|mut rows| rows.remove(0))
            .collect()
    }
}

/// The fixture `name` of `tests/fixtures/reference`.
pub fn read_fixture(name: &str) -> TinyModel {
    let path = crate::workspace_root()
        .join("tests/fixtures/reference")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `actual` within [`ATOL`]/[`RTOL`] of `expected`, or a panic naming `what`.
pub fn check(actual: &[f32], expected: &FixtureTensor, what: &str) {
    let tensor = Tensor::f32(vec![actual.len()], actual.to_vec());
    if let Err(e) = compare(&tensor, expected, ATOL, RTOL) {
        panic!("{what}: {e}");
    }
}

/// The blocks from `first` that hold `len` tokens.
pub fn blocks_for(first: i64, len: usize) -> Vec<i64> {
    (first..first + len.div_ceil(BLOCK_SIZE) as i64).collect()
}

/// Prefill, token-by-token decode, chunked prefill, a ragged batch of every
/// prompt and greedy generation of the fixture `name` on `device`, against
/// transformers' logits and tokens.
pub fn matches_transformers_on(name: &str, sharded: bool, device: DeviceChoice) {
    let (engine, model) = Engine::load(name, sharded, device);
    for (p, (prompt, logits)) in model.prompts.iter().zip(&model.logits).enumerate() {
        let len = prompt.len();
        // Whole-prompt prefill: the last position's logits.
        check(
            &engine.prefill(prompt),
            &logits.row(len - 1),
            &format!("{name} prompt {p} prefill"),
        );

        // Token by token: every position's logits, through the cache.
        let mut cache = engine.cache(8);
        for i in 0..len {
            let out = engine.step(
                &mut cache,
                &[Step {
                    tokens: &prompt[i..=i],
                    start: i,
                    blocks: blocks_for(0, len),
                }],
            );
            check(
                &out[0],
                &logits.row(i),
                &format!("{name} prompt {p} decode position {i}"),
            );
        }

        // Chunked prefill: two chunks.
        if len > 2 {
            let mut cache = engine.cache(8);
            let split = len / 2;
            engine.step(
                &mut cache,
                &[Step {
                    tokens: &prompt[..split],
                    start: 0,
                    blocks: blocks_for(0, len),
                }],
            );
            let out = engine.step(
                &mut cache,
                &[Step {
                    tokens: &prompt[split..],
                    start: split,
                    blocks: blocks_for(0, len),
                }],
            );
            check(
                &out[0],
                &logits.row(len - 1),
                &format!("{name} prompt {p} chunked prefill"),
            );
        }
    }

    // All prompts in one ragged batch, each with its own blocks.
    let mut cache = engine.cache(16);
    let mut first = 0;
    let steps: Vec<Step<'_>> = model
        .prompts
        .iter()
        .map(|prompt| {
            let blocks = blocks_for(first, prompt.len());
            first += blocks.len() as i64;
            Step {
                tokens: prompt,
                start: 0,
                blocks,
            }
        })
        .collect();
    let out = engine.step(&mut cache, &steps);
    for (p, (prompt, logits)) in model.prompts.iter().zip(&model.logits).enumerate() {
        check(
            &out[p],
            &logits.row(prompt.len() - 1),
            &format!("{name} batched prompt {p}"),
        );
    }

    // Greedy generation from the longest prompt.
    let prompt = model.prompts.iter().max_by_key(|p| p.len()).unwrap();
    let total = prompt.len() + model.greedy.len();
    let blocks = blocks_for(0, total);
    let mut cache = engine.cache(16);
    let mut logits = engine
        .step(
            &mut cache,
            &[Step {
                tokens: prompt,
                start: 0,
                blocks: blocks.clone(),
            }],
        )
        .remove(0);
    let mut generated = Vec::new();
    for _ in 0..model.greedy.len() {
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as i64;
        generated.push(next);
        let start = prompt.len() + generated.len() - 1;
        logits = engine
            .step(
                &mut cache,
                &[Step {
                    tokens: &[next],
                    start,
                    blocks: blocks.clone(),
                }],
            )
            .remove(0);
    }
    assert_eq!(generated, model.greedy, "{name}: greedy tokens");
    if let Some(cuda) = engine.backend.as_any().downcast_ref::<CudaExecutor>() {
        // Decode steps repeat their binding: from the third on they replay
        // a captured CUDA graph, and still matched transformers above.
        assert!(cuda.captured_graphs() > 0, "{name}: no step was captured");
    }
}

/// The CUDA backend against the CPU backend on the same steps (a prefill of
/// each prompt, then every position decoded through the cache): f32 products
/// on both, so only the order of summation differs.
pub fn cuda_matches_cpu(name: &str) {
    let (cpu, model) = Engine::load(name, false, DeviceChoice::Cpu);
    let (cuda, _) = Engine::load(name, false, crate::models::cuda_test_device());
    let mut worst = 0f32;
    for prompt in &model.prompts {
        let (mut cpu_cache, mut cuda_cache) = (cpu.cache(8), cuda.cache(8));
        let blocks = blocks_for(0, prompt.len());
        let mut compare = |a: &[f32], b: &[f32], what: String| {
            for (x, y) in a.iter().zip(b) {
                let d = (x - y).abs();
                worst = worst.max(d);
                assert!(d <= 2e-5, "{name} {what}: {x} on the CPU, {y} on CUDA");
            }
        };
        let step = |engine: &Engine, cache: &mut KvCache, tokens: &[i64], start: usize| {
            let s = Step {
                tokens,
                start,
                blocks: blocks.clone(),
            };
            engine.step(cache, &[s]).remove(0)
        };
        let half = prompt.len() / 2;
        let a = step(&cpu, &mut cpu_cache, &prompt[..half.max(1)], 0);
        let b = step(&cuda, &mut cuda_cache, &prompt[..half.max(1)], 0);
        compare(&a, &b, "prefill".into());
        for i in half.max(1)..prompt.len() {
            let a = step(&cpu, &mut cpu_cache, &prompt[i..=i], i);
            let b = step(&cuda, &mut cuda_cache, &prompt[i..=i], i);
            compare(&a, &b, format!("decode position {i}"));
        }
    }
    println!("{name}: CUDA vs CPU max |Δlogit| {worst:.2e}");
}

/// The fixture on the CUDA backend against transformers and the CPU backend.
pub fn on_cuda(name: &str, sharded: bool) {
    matches_transformers_on(name, sharded, crate::models::cuda_test_device());
    cuda_matches_cpu(name);
}
