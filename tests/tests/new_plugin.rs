//! `host new-plugin`: the scaffolded crate passes its own test, builds as a
//! cdylib, is listed, changes what the model computes, and is served.

use std::path::Path;
use std::process::Command;

use kiln_tests::serve::Server;
use kiln_tests::{fixture_target_dir, run_host, text};
use serde_json::{json, Value};

/// `cargo <command>` on the scaffolded crate, offline, with the fixtures'
/// lock file and target directory (so the dependencies are already built).
fn cargo(command: &str, manifest: &Path) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([command, "--offline", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(fixture_target_dir())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(
        output.status.success(),
        "cargo {command} failed:\n{stdout}\n{stderr}"
    );
}

/// A word-level tokenizer for the tiny fixture's 96 ids: `<unk>`, `<s>`,
/// `</s>`, then `w0` … `w92`.
fn word_tokenizer() -> Value {
    let mut vocab = serde_json::Map::new();
    for (id, word) in ["<unk>", "<s>", "</s>"]
        .into_iter()
        .map(str::to_owned)
        .chain((0..93).map(|i| format!("w{i}")))
        .enumerate()
    {
        vocab.insert(word, json!(id));
    }
    json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}})
}

fn greedy(model: &Path, plugin: &[&str]) -> Value {
    let mut args = vec![
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,5,9,13",
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
    ];
    args.extend(plugin);
    kiln_tests::generate_json(&args).unwrap()["generated_ids"].clone()
}

#[test]
fn a_scaffolded_plugin_builds_changes_one_block_and_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = dir.path().join("gelu-llama");
    let output = run_host(
        [
            "new-plugin",
            "gelu-llama",
            "--from",
            "llama",
            "--dir",
            crate_dir.to_str().unwrap(),
        ],
        &[],
    );
    let (stdout, stderr) = text(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(stdout.contains("GeluLlamaForCausalLM"), "{stdout}");
    let lib = std::fs::read_to_string(crate_dir.join("src/lib.rs")).unwrap();
    assert!(lib.lines().count() <= 100, "the example stays short");
    assert!(crate_dir.join("fixtures/make_tiny_model.py").is_file());
    // A second run does not overwrite.
    let again = run_host(
        [
            "new-plugin",
            "gelu-llama",
            "--dir",
            crate_dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(text(&again).1.contains("already exists"));

    assert!(
        crate_dir.join("Cargo.lock").is_file(),
        "Kiln's lock file pins the versions"
    );
    let manifest = crate_dir.join("Cargo.toml");
    cargo("test", &manifest);
    cargo("build", &manifest);
    let library = kiln_tests::built_library("gelu-llama");
    let plugin = ["--custom-architectures", library.to_str().unwrap()];

    // The tiny Llama fixture as the variant: GELU instead of SiLU changes
    // the tokens; as plain Llama it still generates transformers' tokens.
    let (config, weights) = kiln_tests::models::tiny_model("tiny_llama.json");
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let mut variant = config.clone();
    variant["architectures"] = json!(["GeluLlamaForCausalLM"]);
    variant["hidden_act"] = json!("gelu_pytorch_tanh");
    kiln_tests::models::write_model_dir(&variant, &weights, &model, false);
    std::fs::write(model.join("tokenizer.json"), word_tokenizer().to_string()).unwrap();
    let gelu = greedy(&model, &plugin);
    variant["hidden_act"] = json!("silu");
    std::fs::write(model.join("config.json"), variant.to_string()).unwrap();
    let silu = greedy(&model, &plugin);
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    assert_eq!(silu, greedy(&model, &[]), "SiLU is the built-in Llama");
    assert_ne!(gelu, silu, "the replaced activation changes the output");

    // Served with --custom-architectures, answered over HTTP.
    variant["hidden_act"] = json!("gelu_pytorch_tanh");
    std::fs::write(model.join("config.json"), variant.to_string()).unwrap();
    let server = Server::start(&model, &plugin);
    let body = json!({"model": "smollm2", "prompt": "w1 w2 w3", "max_tokens": 4, "temperature": 0});
    let reply = server.post_json("/v1/completions", &body);
    assert_eq!(reply["usage"]["completion_tokens"], 4, "{reply}");
}
