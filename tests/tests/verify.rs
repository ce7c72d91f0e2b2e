//! `host verify` end to end: every tiny random checkpoint (written as a model
//! directory) against a reference directory made from transformers' logits and
//! greedy continuation in its fixture, and the ways a verification fails.

use std::path::Path;

use kiln_host::engine::npy;
use kiln_tests::reference::FixtureTensor;
use kiln_tests::run_verify as verify;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
struct Fixture {
    config: Value,
    weights: std::collections::BTreeMap<String, FixtureTensor>,
    prompts: Vec<Vec<u32>>,
    logits: Vec<FixtureTensor>,
    greedy: Vec<u32>,
}

fn load_fixture(name: &str) -> Fixture {
    let path = kiln_tests::workspace_root()
        .join("tests/fixtures/reference")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Writes the fixture's prompts as a reference directory (the layout
/// `gen_references.py` writes); the longest prompt carries the greedy ids.
/// `perturb` shifts one logit of the first prompt.
fn write_reference(fixture: &Fixture, dir: &Path, perturb: f32) {
    for (i, (ids, logits)) in fixture.prompts.iter().zip(&fixture.logits).enumerate() {
        let name = format!("prompt{i}");
        std::fs::write(
            dir.join(format!("{name}.ids.json")),
            json!({ "ids": ids }).to_string(),
        )
        .unwrap();
        let mut values: Vec<f32> = logits.values().iter().map(|&v| v as f32).collect();
        if i == 0 {
            values[3] += perturb;
        }
        npy::write_f32(
            &dir.join(format!("{name}.logits.npy")),
            &logits.shape,
            &values,
        )
        .unwrap();
        if i + 1 == fixture.prompts.len() {
            std::fs::write(
                dir.join(format!("{name}.greedy.json")),
                json!({ "new_ids": fixture.greedy }).to_string(),
            )
            .unwrap();
        }
    }
}

#[test]
fn every_tiny_family_verifies_against_transformers() {
    for name in kiln_tests::models::TINY_FAMILIES {
        let fixture = load_fixture(name);
        let (model, reference) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        kiln_tests::models::write_model_dir(&fixture.config, &fixture.weights, model.path(), false);
        write_reference(&fixture, reference.path(), 0.0);
        let (passed, stdout, stderr) = verify(
            model.path(),
            reference.path(),
            &["--atol", "1e-4", "--rtol", "1e-4", "--greedy", "--json"],
        );
        assert!(passed, "{name}: {stderr}\n{stdout}");
        let report: Value = serde_json::from_str(&stdout).unwrap();
        let prompts = report["prompts"].as_array().unwrap();
        assert_eq!(prompts.len(), fixture.prompts.len(), "{name}");
        for p in prompts {
            assert_eq!(p["top1_agree"], p["positions"], "{name}: {p}");
            assert!(p["max_abs_diff"].as_f64().unwrap() <= 2e-4, "{name}: {p}");
        }
        let last = prompts.last().unwrap();
        assert_eq!(last["greedy"]["kiln"], json!(fixture.greedy), "{name}");
        assert_eq!(last["greedy"]["first_difference"], Value::Null, "{name}");
        println!(
            "{name}: {}",
            prompts
                .iter()
                .map(|p| format!("max|Δ| {:.1e}", p["max_abs_diff"].as_f64().unwrap()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

#[test]
fn a_reference_outside_the_tolerance_fails_with_the_position_named() {
    let fixture = load_fixture("tiny_llama.json");
    let (model, reference) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    kiln_tests::models::write_model_dir(&fixture.config, &fixture.weights, model.path(), false);
    write_reference(&fixture, reference.path(), 0.01);

    // Without criteria it only reports; the table shows the difference.
    let (passed, stdout, stderr) = verify(model.path(), reference.path(), &[]);
    assert!(passed, "{stderr}");
    assert!(
        stdout.contains("prompt0") && stdout.contains("1.000e-2"),
        "{stdout}"
    );

    let (passed, _, stderr) = verify(model.path(), reference.path(), &["--atol", "1e-3"]);
    assert!(!passed);
    assert!(
        stderr.contains("verification failed")
            && stderr
                .contains("prompt0: |Δlogit| up to 1.000e-2 (position 0, token 3) exceeds 0.001"),
        "{stderr}"
    );
}

#[test]
fn malformed_references_are_reported_in_one_line() {
    let fixture = load_fixture("tiny_llama.json");
    let (model, reference) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    kiln_tests::models::write_model_dir(&fixture.config, &fixture.weights, model.path(), false);

    let (passed, _, stderr) = verify(model.path(), reference.path(), &[]);
    assert!(!passed);
    assert!(
        stderr.contains("holds no `<prompt>.ids.json` files"),
        "{stderr}"
    );

    write_reference(&fixture, reference.path(), 0.0);
    std::fs::write(reference.path().join("prompt1.logits.npy"), b"not numpy").unwrap();
    let (passed, _, stderr) = verify(model.path(), reference.path(), &[]);
    assert!(!passed);
    assert!(stderr.contains("prompt1.logits.npy"), "{stderr}");

    write_reference(&fixture, reference.path(), 0.0);
    std::fs::write(
        reference.path().join("prompt2.ids.json"),
        "{\"ids\": [1, 2]}",
    )
    .unwrap();
    let (passed, _, stderr) = verify(model.path(), reference.path(), &[]);
    assert!(!passed);
    assert!(
        stderr.contains("prompt2: 11 logits rows for 2 prompt ids"),
        "{stderr}"
    );
}

/// The real SmolLM2-135M GGUF that `.ci/setup` fetches (or `KILN_SMOLLM2_GGUF`).
fn smollm2() -> std::path::PathBuf {
    kiln_tests::models::smollm2_gguf()
        .unwrap_or_else(|| panic!("SmolLM2 is missing: run .ci/setup (or set KILN_SMOLLM2_GGUF)"))
}

/// Runs `host verify` on SmolLM2 against transformers fp32 logits of a short
/// prompt and its 16-token greedy continuation
/// (`tests/fixtures/reference/smollm2_capital`, written by
/// `gen_references.py --model … --prompt "capital=The capital of France is"`)
/// with `flags`; returns the prompt's report.
fn verify_smollm2(flags: &[&str], what: &str) -> Value {
    let reference = kiln_tests::workspace_root().join("tests/fixtures/reference/smollm2_capital");
    let mut args = vec!["--greedy", "--json"];
    args.extend(flags);
    let (passed, stdout, stderr) = verify(&smollm2(), &reference, &args);
    assert!(passed, "{stderr}\n{stdout}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let prompt = report["prompts"][0].clone();
    assert_eq!(prompt["greedy"]["first_difference"], Value::Null);
    println!(
        "SmolLM2 {what} vs transformers: max |Δlogit| {:.2e}, mean KL {:.2e}, top-1 {}/{}",
        prompt["max_abs_diff"].as_f64().unwrap(),
        prompt["mean_kl"].as_f64().unwrap_or(f64::NAN),
        prompt["top1_agree"],
        prompt["positions"]
    );
    prompt
}

#[test]
fn smollm2_matches_transformers_fp32_in_exact_mode() {
    verify_smollm2(&["--atol", "1e-3", "--rtol", "1e-4"], "exact (CPU)");
}

/// The CUDA backend (the kernel emulator, or a GPU with
/// KILN_TEST_CUDA_DEVICE): with f32 weights (`--dtype float32`) as close to
/// transformers as the CPU backend; with the default bf16 products, within a
/// mean KL of 1e-3, every top-1 and the greedy continuation (measured on the
/// emulator: max |Δ| 0.28, mean KL 1.8e-4).
#[test]
fn smollm2_on_the_cuda_backend_matches_transformers() {
    let device = kiln_tests::models::cuda_test_device().to_string();
    let emulated = ["--device", device.as_str()];
    let f32_flags = [
        &emulated[..],
        &["--dtype", "float32", "--atol", "1e-3", "--rtol", "1e-4"],
    ]
    .concat();
    verify_smollm2(&f32_flags, &format!("{device} f32"));
    let bf16_flags = [
        &emulated[..],
        &["--max-mean-kl", "1e-3", "--min-top1", "1.0"],
    ]
    .concat();
    verify_smollm2(&bf16_flags, &format!("{device} bf16"));
}

/// The fp8 (E4M3) KV cache on the CUDA backend, bf16 products: the greedy
/// continuation and every top-1 of transformers', within a mean KL of 2e-2
/// (measured on the emulator: max |Δ| 1.76, mean KL 6.9e-3, where the bf16
/// cache gives 4.3e-5; the CPU's q8_0 cache 4.8e-4: E4M3 keeps 3 bits of
/// mantissa, Q8_0 blocks of 32 an 8-bit integer each under a shared scale).
#[test]
fn smollm2_with_an_fp8_cache_keeps_transformers_greedy_output() {
    let device = kiln_tests::models::cuda_test_device().to_string();
    let flags = [
        "--device",
        device.as_str(),
        "--kv-cache-dtype",
        "fp8",
        "--max-mean-kl",
        "2e-2",
        "--min-top1",
        "1.0",
    ];
    verify_smollm2(&flags, &format!("{device} bf16, fp8 cache"));
}
