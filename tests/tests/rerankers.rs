//! Sequence classifiers (cross-encoder rerankers and text classifiers)
//! against references nobody here wrote: tiny random
//! `BertForSequenceClassification`, `RobertaForSequenceClassification` and
//! `Qwen3ForSequenceClassification` (a decoder) checkpoint directories with
//! their own tokenizers, against transformers' tokenizer ids and token
//! types, its logits, and sentence-transformers' `CrossEncoder` scores; in process on the CPU and CUDA backends, and
//! through `host serve`'s `/v1/score`, `/v1/rerank` and `/v1/classify` with
//! the official `cohere` client and httpx. An embedding model scores by
//! cosine similarity (checked against sentence-transformers' MiniLM
//! embeddings). References come from
//! `tests/fixtures/reference/gen_rerankers.py`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_host::embedding::{Embedder, EncoderText, Head, DEFAULT_BATCH_TOKENS};
use kiln_tests::models::{cuda_test_device, load_model_on, minilm_dir, DeviceChoice, WeightDtype};
use kiln_tests::serve::{python, run_client_script, Server};
use kiln_tests::workspace_root;
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    models: BTreeMap<String, ModelReference>,
}

#[derive(Deserialize)]
struct ModelReference {
    directory: String,
    architecture: String,
    labels: Vec<String>,
    inputs: Vec<Input>,
    truncated: Vec<Input>,
    cross_encoder_outputs: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Input {
    texts: Vec<String>,
    /// Cut to this many tokens (the `truncated` inputs).
    #[serde(default)]
    max_tokens: Option<usize>,
    ids: Vec<u32>,
    token_types: Vec<u32>,
    logits: Vec<f32>,
}

const ATOL: f32 = 1e-4;

fn reference_path() -> PathBuf {
    workspace_root().join("tests/fixtures/reference/tiny_rerankers.json")
}

fn reference() -> Reference {
    serde_json::from_str(&std::fs::read_to_string(reference_path()).unwrap()).unwrap()
}

fn model_dir(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/reference").join(name)
}

fn close(actual: &[f32], expected: &[f32], what: &str) {
    kiln_tests::reference::assert_within(actual, expected, ATOL, what);
}

/// Each tiny classifier, loaded from its directory like a user's: our
/// tokenizer gives transformers' ids and token types for every pair and
/// text (whole, and cut to a number of tokens as transformers'
/// `truncation=True` cuts them), every input's logits match transformers'
/// (all inputs in one ragged step, and each alone), and the cross-encoder's
/// sigmoid scores match sentence-transformers' `CrossEncoder.predict`.
#[test]
fn tiny_classifiers_match_transformers() {
    tiny_classifiers_match_transformers_on(DeviceChoice::Cpu);
}

/// The same on the CUDA backend (the kernel emulator in CI; a GPU with
/// `KILN_TEST_CUDA_DEVICE`), with f32 weights.
#[test]
fn tiny_classifiers_match_transformers_on_cuda() {
    tiny_classifiers_match_transformers_on(cuda_test_device());
}

fn tiny_classifiers_match_transformers_on(device: DeviceChoice) {
    let reference = reference();
    assert_eq!(reference.models.len(), 3);
    for (name, expected) in &reference.models {
        let model = load_model_on(
            &workspace_root().join(&expected.directory),
            device,
            WeightDtype::Float32,
        );
        assert_eq!(model.architecture.info.name, expected.architecture);
        assert!(
            model.unused_tensors.is_empty(),
            "{:?}",
            model.unused_tensors
        );
        let tokenizer = model.tokenizer.clone().unwrap();
        let all: Vec<&Input> = expected.inputs.iter().chain(&expected.truncated).collect();
        let inputs: Vec<EncoderText> = all
            .iter()
            .map(|input| {
                let (tokens, token_types) = match (input.texts.as_slice(), input.max_tokens) {
                    ([first, second], None) => tokenizer.encode_pair(first, second).unwrap(),
                    ([text], None) => {
                        let tokens = tokenizer.encode(text, true).unwrap();
                        let types = vec![0; tokens.len()];
                        (tokens, types)
                    }
                    ([first, rest @ ..], Some(max)) => tokenizer
                        .encode_truncated(first, rest.first().map(String::as_str), max)
                        .unwrap(),
                    (other, _) => panic!("{other:?}"),
                };
                assert_eq!(tokens, input.ids, "{name} {:?}", input.texts);
                assert_eq!(token_types, input.token_types, "{name} {:?}", input.texts);
                EncoderText {
                    tokens,
                    token_types,
                }
            })
            .collect();
        let embedder = Embedder::new(model, DEFAULT_BATCH_TOKENS).unwrap();
        let Head::Classifier(classes) = embedder.head().clone() else {
            panic!("{name} is a classifier");
        };
        assert_eq!(classes.labels, expected.labels);
        assert_eq!(embedder.dimensions(), Some(expected.labels.len()));
        let batched = embedder.run(&inputs).unwrap();
        assert_eq!(batched.len(), all.len());
        for (i, (input, logits)) in all.iter().zip(&batched).enumerate() {
            close(
                logits,
                &input.logits,
                &format!("{name} input {i} in the batch"),
            );
            let alone = embedder.run(std::slice::from_ref(&inputs[i])).unwrap();
            close(&alone[0], &input.logits, &format!("{name} input {i} alone"));
        }
        for (i, outputs) in expected.cross_encoder_outputs.iter().enumerate() {
            let scores = if classes.labels.len() == 1 {
                classes.activation.apply(&batched[i])
            } else {
                batched[i].clone()
            };
            close(&scores, outputs, &format!("{name} CrossEncoder output {i}"));
        }
    }
}

/// `XLMRobertaForSequenceClassification` (bge-reranker-v2-m3's
/// architecture) is RoBERTa's classifier under another name: the tiny
/// RoBERTa checkpoint declared as XLM-RoBERTa loads through that
/// registration and gives transformers' logits (the generator checks that
/// transformers' XLM-RoBERTa class gives the same).
#[test]
fn xlm_roberta_classifiers_load_as_roberta_ones() {
    let reference = reference();
    let expected = &reference.models["tiny_roberta_classifier"];
    let dir = tempfile::tempdir().unwrap();
    let source = workspace_root().join(&expected.directory);
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["architectures"] = serde_json::json!(["XLMRobertaForSequenceClassification"]);
    config["model_type"] = serde_json::json!("xlm-roberta");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let model = load_model_on(dir.path(), DeviceChoice::Cpu, WeightDtype::Float32);
    assert_eq!(
        model.architecture.info.name,
        "XLMRobertaForSequenceClassification"
    );
    assert!(
        model.unused_tensors.is_empty(),
        "{:?}",
        model.unused_tensors
    );
    let inputs: Vec<EncoderText> = expected
        .inputs
        .iter()
        .map(|input| EncoderText {
            tokens: input.ids.clone(),
            token_types: input.token_types.clone(),
        })
        .collect();
    let logits = Embedder::new(model, DEFAULT_BATCH_TOKENS)
        .unwrap()
        .run(&inputs)
        .unwrap();
    for (i, (input, logits)) in expected.inputs.iter().zip(&logits).enumerate() {
        close(logits, &input.logits, &format!("XLM-RoBERTa input {i}"));
    }
}

/// `host serve` of the tiny cross-encoder: `/v1/score` one-to-many and pair
/// by pair, raw logits, `/v1/rerank` (and the Cohere SDK's v1 and v2
/// clients), `/v1/classify`, and every refusal with its `param`.
#[test]
fn the_cross_encoder_scores_and_reranks_through_host_serve() {
    scores_and_reranks_through_host_serve("tiny_cross_encoder");
}

/// The same checks of the tiny decoder reranker
/// (`Qwen3ForSequenceClassification`, Qwen3-Reranker converted to a
/// classifier): its steps run over the paged cache like a decoder's.
#[test]
fn the_decoder_reranker_scores_and_reranks_through_host_serve() {
    scores_and_reranks_through_host_serve("tiny_qwen3_reranker");
}

/// `rerank_client.py`'s reranker checks of the reference's model `name`.
fn scores_and_reranks_through_host_serve(name: &str) {
    let python = python().expect("the Python venv with `cohere` and `httpx` (run .ci/setup)");
    let server = Server::start(&model_dir(name), &["--served-model-name", "reranker"]);
    run_client_script(
        &server,
        &python,
        "rerank_client.py",
        &["cross_encoder", reference_path().to_str().unwrap(), name],
        &[
            "score_one_to_many",
            "score_pairs",
            "raw_logits",
            "truncation",
            "rerank",
            "cohere_v1",
            "cohere_v2",
            "concurrent",
            "classify",
            "errors",
        ],
    );
}

/// `host serve` of the tiny three-label RoBERTa classifier: `/v1/classify`
/// gives softmax probabilities and the likeliest label; scoring refuses a
/// model with more than one class.
#[test]
fn the_classifier_classifies_through_host_serve() {
    let python = python().expect("the Python venv with `httpx` (run .ci/setup)");
    let server = Server::start(
        &model_dir("tiny_roberta_classifier"),
        &["--served-model-name", "sentiment"],
    );
    run_client_script(
        &server,
        &python,
        "rerank_client.py",
        &["classifier", reference_path().to_str().unwrap()],
        &["classify", "errors"],
    );
}

/// An embedding model scores and reranks by the cosine similarity of
/// sentence-transformers' embeddings.
#[test]
fn an_embedding_model_scores_by_cosine_similarity() {
    let python = python().expect("the Python venv with `httpx` (run .ci/setup)");
    let server = Server::start(&minilm_dir(), &["--served-model-name", "minilm"]);
    let minilm = workspace_root().join("tests/fixtures/reference/minilm_embeddings.json");
    run_client_script(
        &server,
        &python,
        "rerank_client.py",
        &["bi_encoder", minilm.to_str().unwrap()],
        &["score_one_to_many", "rerank", "errors"],
    );
}

/// A token type past the model's segments (a tokenizer that marks a pair's
/// second text for a model with one segment) fails the step with an error,
/// on the CPU and the CUDA backend, instead of reading past the table.
#[test]
fn token_types_past_the_model_are_an_error() {
    let reference = reference();
    let expected = &reference.models["tiny_roberta_classifier"];
    for device in [DeviceChoice::Cpu, cuda_test_device()] {
        let model = load_model_on(
            &workspace_root().join(&expected.directory),
            device,
            WeightDtype::Float32,
        );
        let embedder = Embedder::new(model, DEFAULT_BATCH_TOKENS).unwrap();
        let input = &expected.inputs[0];
        let mut token_types = vec![0; input.ids.len()];
        *token_types.last_mut().unwrap() = 1;
        let text = EncoderText {
            tokens: input.ids.clone(),
            token_types,
        };
        let error = embedder.run(&[text]).unwrap_err().to_string();
        let expected = match device {
            DeviceChoice::Cpu => "token id 1 is outside the vocabulary of 1",
            _ => "an index (a token id or a gathered row) was out of range",
        };
        assert!(error.contains(expected), "{device:?}: {error}");
    }
}
