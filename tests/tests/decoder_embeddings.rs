//! Decoders run as embedding models (`--runner pooling`, vLLM's flag;
//! Qwen3-Embedding, gte-Qwen2, e5-mistral) against sentence-transformers:
//! tiny random Qwen3 (last-token pooling, normalized, laid out as
//! Qwen3-Embedding is) and Llama (mean pooling) checkpoint directories with
//! their own tokenizers, in process on the CPU and CUDA backends, through
//! `host embed` and through `host serve`'s `/v1/embeddings`. References come
//! from `tests/fixtures/reference/gen_decoder_embeddings.py`.

use std::collections::BTreeMap;

use kiln_host::embedding::{Embedder, Head, PoolingMode};
use kiln_host::model::Runner;
use kiln_plugin_api::Task;
use kiln_tests::models::{cuda_test_device, load_model_as, DeviceChoice, WeightDtype};
use kiln_tests::serve::{curl, Server};
use kiln_tests::{run_host, workspace_root};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    models: BTreeMap<String, ModelReference>,
}

#[derive(Deserialize)]
struct ModelReference {
    directory: String,
    architecture: String,
    pooling: String,
    normalize: bool,
    texts: Vec<Text>,
}

#[derive(Deserialize)]
struct Text {
    text: String,
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

const ATOL: f32 = 1e-4;

fn reference() -> Reference {
    let path = workspace_root().join("tests/fixtures/reference/tiny_decoder_embeddings.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn close(actual: &[f32], expected: &[f32], what: &str) {
    kiln_tests::reference::assert_within(actual, expected, ATOL, what);
}

/// Each tiny decoder, loaded from its directory with `--runner pooling`:
/// run for embeddings with no LM head to load, the sentence-transformers
/// pooling its files name, our tokenizer's ids equal to transformers', and
/// every text's embedding within 1e-4 of sentence-transformers' (in steps
/// of several texts, since the cache holds 64 tokens, and each text alone).
#[test]
fn tiny_decoders_match_sentence_transformers() {
    tiny_decoders_match_sentence_transformers_on(DeviceChoice::Cpu);
}

/// The same on the CUDA backend (the kernel emulator in CI; a GPU with
/// `KILN_TEST_CUDA_DEVICE`), with f32 weights.
#[test]
fn tiny_decoders_match_sentence_transformers_on_cuda() {
    tiny_decoders_match_sentence_transformers_on(cuda_test_device());
}

fn tiny_decoders_match_sentence_transformers_on(device: DeviceChoice) {
    let reference = reference();
    assert_eq!(reference.models.len(), 2);
    for (name, expected) in &reference.models {
        let dir = workspace_root().join(&expected.directory);
        let model = load_model_as(&dir, device, WeightDtype::Float32, Runner::Pooling).unwrap();
        assert_eq!(model.architecture.info.name, expected.architecture);
        assert_eq!(model.architecture.info.task, Task::TextGeneration);
        assert_eq!(model.task, Task::Embeddings);
        assert!(
            model.unused_tensors.is_empty(),
            "{:?}",
            model.unused_tensors
        );
        let tokenizer = model.tokenizer.clone().unwrap();
        let ids: Vec<Vec<u32>> = expected
            .texts
            .iter()
            .map(|t| {
                let ids = tokenizer.encode(&t.text, true).unwrap();
                assert_eq!(ids, t.ids, "{name} {:?}", t.text);
                ids
            })
            .collect();
        let embedder = Embedder::new(model, 64).unwrap();
        let Head::Pooling(pooling) = embedder.head().clone() else {
            panic!("{name} embeds");
        };
        let mode = match expected.pooling.as_str() {
            "lasttoken" => PoolingMode::LastToken,
            "mean" => PoolingMode::Mean,
            other => panic!("{other}"),
        };
        assert_eq!(
            (pooling.modes, pooling.normalize),
            (vec![mode], expected.normalize)
        );
        assert_eq!(embedder.max_tokens(), 64);
        let batched = embedder.embed(&ids).unwrap();
        for (i, (text, embedding)) in expected.texts.iter().zip(&batched).enumerate() {
            close(
                embedding,
                &text.embedding,
                &format!("{name} text {i} batched"),
            );
        }
        for (i, text) in expected.texts.iter().enumerate().step_by(5) {
            let alone = embedder.embed(std::slice::from_ref(&ids[i])).unwrap();
            close(
                &alone[0],
                &text.embedding,
                &format!("{name} text {i} alone"),
            );
        }
        // Longer than the cache: refused, not cut.
        let error = embedder.embed(&[vec![5; 65]]).unwrap_err().to_string();
        assert!(error.contains("1 to 64 tokens"), "{error}");
    }
}

/// Without `--runner pooling` the checkpoint is the text generator its
/// config names, unless the config names the base model (`Qwen3Model`, as
/// e5-mistral's names `MistralModel`), which vLLM runs as an embedding
/// model; `--runner generate` refuses an encoder; an architecture whose
/// plugin does not build hidden states is refused by name.
#[test]
fn the_runner_chooses_what_a_checkpoint_is_run_as() {
    let reference = reference();
    let expected = &reference.models["tiny_qwen3_embedding"];
    let qwen3 = workspace_root().join(&expected.directory);
    let model = load_model_as(&qwen3, DeviceChoice::Cpu, WeightDtype::Auto, Runner::Auto).unwrap();
    assert_eq!(model.task, Task::TextGeneration);
    let error = Embedder::new(model, 64).err().unwrap();
    assert!(error.contains("text-generation model"), "{error}");

    let base = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&qwen3).unwrap() {
        let entry = entry.unwrap();
        // The model's files, not its sentence-transformers ones.
        let name = entry.file_name().into_string().unwrap();
        if [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
        .contains(&name.as_str())
        {
            std::fs::copy(entry.path(), base.path().join(entry.file_name())).unwrap();
        }
    }
    let config_path = base.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["architectures"] = serde_json::json!(["Qwen3Model"]);
    std::fs::write(&config_path, config.to_string()).unwrap();
    let model = load_model_as(
        base.path(),
        DeviceChoice::Cpu,
        WeightDtype::Auto,
        Runner::Auto,
    )
    .unwrap();
    assert_eq!(
        (model.architecture.info.name.as_str(), model.task),
        ("Qwen3ForCausalLM", Task::Embeddings)
    );
    // Without its sentence-transformers files: a decoder's default pooling
    // (the last token, normalized), which is this model's own.
    let embedder = Embedder::new(model, 64).unwrap();
    let ids = &expected.texts[1].ids;
    close(
        &embedder.embed(std::slice::from_ref(ids)).unwrap()[0],
        &expected.texts[1].embedding,
        "Qwen3Model",
    );

    // A causal LM's own checkpoint (an untied `lm_head.weight`) pools too:
    // its head is left unread.
    let (config, weights) = kiln_tests::models::tiny_model("tiny_llama.json");
    let causal = tempfile::tempdir().unwrap();
    kiln_tests::models::write_model_dir(&config, &weights, causal.path(), false);
    let model = load_model_as(
        causal.path(),
        DeviceChoice::Cpu,
        WeightDtype::Auto,
        Runner::Pooling,
    )
    .unwrap();
    assert_eq!(model.task, Task::Embeddings);
    let embedder = Embedder::new(model, 64).unwrap();
    let vector = embedder.embed(&[vec![1, 2, 3]]).unwrap().remove(0);
    let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");

    let cross_encoder = workspace_root().join("tests/fixtures/reference/tiny_cross_encoder");
    let error = load_model_as(
        &cross_encoder,
        DeviceChoice::Cpu,
        WeightDtype::Auto,
        Runner::Generate,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(error.contains("cannot generate text"), "{error}");

    let gemma = workspace_root().join("tests/fixtures/reference/tiny_gemma3.f32.gguf");
    let error = load_model_as(
        &gemma,
        DeviceChoice::Cpu,
        WeightDtype::Auto,
        Runner::Pooling,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(error.contains("cannot be run for embeddings"), "{error}");
}

/// `host embed` runs a decoder as an embedding model unasked (and refuses
/// to with `--runner generate`); `host serve --runner pooling` serves its
/// embeddings on `/v1/embeddings`.
#[test]
fn host_embed_and_serve_run_a_decoder_as_an_embedding_model() {
    let reference = reference();
    let expected = &reference.models["tiny_qwen3_embedding"];
    let dir = workspace_root().join(&expected.directory);
    let texts: Vec<&str> = expected.texts[..3]
        .iter()
        .map(|t| t.text.as_str())
        .collect();
    let mut args = vec!["embed", "--model", dir.to_str().unwrap()];
    args.extend(&texts);
    let output = run_host(args.iter().copied(), &[]);
    let (stdout, stderr) = kiln_tests::text(&output);
    assert!(output.status.success(), "{stderr}");
    for (i, line) in stdout.lines().enumerate() {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        let vector: Vec<f32> = serde_json::from_value(line["embedding"].clone()).unwrap();
        close(
            &vector,
            &expected.texts[i].embedding,
            &format!("host embed {i}"),
        );
    }
    let output = run_host(
        [
            "embed",
            "--runner",
            "generate",
            "--model",
            dir.to_str().unwrap(),
            "hi",
        ],
        &[],
    );
    let (_, stderr) = kiln_tests::text(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("not an embedding model"), "{stderr}");

    let server = Server::start(
        &dir,
        &["--served-model-name", "qwen3-emb", "--runner", "pooling"],
    );
    let body = serde_json::json!({"model": "qwen3-emb", "input": texts}).to_string();
    let answer = curl(
        &server,
        &[
            "-s",
            "-H",
            "content-type: application/json",
            "-d",
            &body,
            &server.url("/v1/embeddings"),
        ],
    );
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let data = answer["data"].as_array().unwrap();
    assert_eq!(data.len(), 3, "{answer}");
    for (i, item) in data.iter().enumerate() {
        let vector: Vec<f32> = serde_json::from_value(item["embedding"].clone()).unwrap();
        close(
            &vector,
            &expected.texts[i].embedding,
            &format!("/v1/embeddings {i}"),
        );
    }
    let tokens: usize = expected.texts[..3].iter().map(|t| t.ids.len()).sum();
    assert_eq!(answer["usage"]["prompt_tokens"], tokens, "{answer}");
}
