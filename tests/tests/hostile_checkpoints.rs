//! Checkpoints that lie: header values that would size huge allocations,
//! numbers that must be finite, overlapping tensor data and NaN weights.
//! Each is refused by `host inspect`/`generate` with one short line naming
//! the culprit, never an abort or a silent load.

use std::path::Path;

use kiln_tests::{run_host, text, workspace_root};

const TINY: &str = "tests/fixtures/reference/tiny_gemma3.f32.gguf";

/// Overwrites the value of GGUF metadata `key` (its type's width) with `value`.
fn patch_metadata(bytes: &mut [u8], key: &str, value: &[u8]) {
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key.as_bytes());
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("no {key}"))
        + needle.len()
        + 4;
    bytes[at..at + value.len()].copy_from_slice(value);
}

/// Runs `host <command> <model> [extra]`; returns (success, stderr).
fn host(command: &str, model: &Path, extra: &[&str]) -> (bool, String) {
    let model = model.to_str().unwrap();
    let mut args = vec![command];
    if command == "generate" {
        args.extend(["--model", model, "--prompt", "hi", "--max-new-tokens", "1"]);
    } else {
        args.push(model);
    }
    args.extend_from_slice(extra);
    let output = run_host(&args, &[]);
    let (_, stderr) = text(&output);
    (output.status.success(), stderr)
}

fn assert_refused(what: &str, (ok, stderr): (bool, String), needle: &str) {
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{what}: no error line in:\n{stderr}"));
    assert!(!ok, "{what} loaded");
    assert!(
        error.contains(needle) && error.len() < 300,
        "{what}: {error}"
    );
    assert!(!stderr.contains("memory allocation"), "{what}: {stderr}");
}

#[test]
fn header_values_never_size_an_allocation_and_must_be_finite() {
    let dir = tempfile::tempdir().unwrap();
    let original = std::fs::read(workspace_root().join(TINY)).unwrap();
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "gemma3.block_count",
            (i32::MAX as u32).to_le_bytes().to_vec(),
            "at most 1024 layers",
        ),
        (
            "gemma3.embedding_length",
            (1u32 << 31).to_le_bytes().to_vec(),
            "hidden_size",
        ),
        (
            "gemma3.rope.freq_base",
            f32::NAN.to_le_bytes().to_vec(),
            "NaN",
        ),
        (
            "gemma3.attention.layer_norm_rms_epsilon",
            (-1f32).to_le_bytes().to_vec(),
            "rms_norm_eps",
        ),
        (
            "gemma3.attention.layer_norm_rms_epsilon",
            f32::NAN.to_le_bytes().to_vec(),
            "NaN",
        ),
    ];
    for (key, value, needle) in cases {
        let mut bytes = original.clone();
        patch_metadata(&mut bytes, key, &value);
        let path = dir.path().join("bad.gguf");
        std::fs::write(&path, &bytes).unwrap();
        assert_refused(key, host("inspect", &path, &[]), needle);
    }

    // A config.json that declares a billion layers.
    let model = dir.path().join("billion");
    std::fs::create_dir(&model).unwrap();
    let config = serde_json::json!({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1_000_000_000u64,
        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 16, "rms_norm_eps": 1e-5});
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let weight = vec![0u8; 16 * 8 * 4];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![16, 8], &weight)
        .unwrap();
    safetensors::serialize_to_file(
        [("model.embed_tokens.weight", view)],
        None,
        &model.join("model.safetensors"),
    )
    .unwrap();
    assert_refused(
        "1e9 layers",
        host("inspect", &model, &[]),
        "num_hidden_layers",
    );

    // Two tensors over the same bytes.
    let header = r#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"model.norm.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&[0; 8]);
    std::fs::write(model.join("model.safetensors"), file).unwrap();
    assert_refused("overlapping data", host("inspect", &model, &[]), "offset");
}

#[test]
fn check_weights_finds_a_nan_weight() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(workspace_root().join(TINY)).unwrap();
    let path = dir.path().join("nan.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let (ok, stderr) = host("generate", &path, &["--check-weights"]);
    assert!(ok, "the intact fixture passes the scan:\n{stderr}");
    // The last tensor's last f32 ends the file.
    let end = bytes.len();
    bytes[end - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    assert_refused(
        "a NaN weight",
        host("generate", &path, &["--check-weights"]),
        "NaN at row",
    );
}
