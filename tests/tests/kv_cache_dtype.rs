//! `--kv-cache-dtype` on the CPU backend (llama.cpp's `--cache-type-k/v`):
//! an f16 cache on SmolLM2 generates what the f32 cache generates, in
//! `generate` and in `serve`, where the same `--kv-cache-memory` then holds
//! twice the tokens (a q8_0 cache 64/17 times); `auto` is f16 in fast
//! precision and f32 in exact; the CPU-only choices are refused on a GPU,
//! and q8_0 for heads that are not whole blocks of 32.

use kiln_tests::models::{tiny_model, write_model_dir};
use kiln_tests::serve::{requirements, Server};
use kiln_tests::{generate_json, run_host, text};

/// SmolLM2's greedy continuation of a chat prompt with `extra` options.
fn generate(model: &str, extra: &[&str]) -> Vec<u64> {
    let mut args = vec![
        "--model",
        model,
        "--prompt",
        "Name three rivers of Europe and say where each one rises.",
        "--chat",
        "--max-new-tokens",
        "24",
    ];
    args.extend_from_slice(extra);
    let json = generate_json(&args).unwrap();
    json["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn an_f16_cache_generates_what_the_f32_cache_generates() {
    let (model, _) = requirements();
    let model = model.to_str().unwrap();
    let f32_ids = generate(model, &["--kv-cache-dtype", "float32"]);
    assert_eq!(f32_ids.len(), 24);
    assert_eq!(
        generate(model, &[]),
        f32_ids,
        "exact precision's auto is f32"
    );
    assert_eq!(generate(model, &["--kv-cache-dtype", "float16"]), f32_ids);
    // bf16 keeps 8 bits of mantissa: it runs, and starts the same way.
    let bf16_ids = generate(model, &["--kv-cache-dtype", "bfloat16"]);
    assert_eq!(bf16_ids[..4], f32_ids[..4]);
    // q8_0 (8.5 bits a number) also starts the same way.
    let q8_ids = generate(model, &["--kv-cache-dtype", "q8_0"]);
    assert_eq!(q8_ids.len(), 24);
    assert_eq!(q8_ids[..8], f32_ids[..8]);
    // Fast precision's auto (f16) is its f16 cache.
    let fast = ["--precision", "fast"];
    assert_eq!(
        generate(model, &fast),
        generate(
            model,
            &[&fast[..], &["--kv-cache-dtype", "float16"]].concat()
        )
    );
}

/// The tokens `serve` says its KV cache holds.
fn served_kv_tokens(model: &std::path::Path, dtype: &str) -> u64 {
    let server = Server::start(
        model,
        &["--kv-cache-memory", "32MiB", "--kv-cache-dtype", dtype],
    );
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("KV cache:"))
        .unwrap_or_else(|| panic!("no KV cache line in\n{log}"));
    let tokens = line
        .split('(')
        .nth(1)
        .and_then(|rest| rest.split(" tokens").next())
        .and_then(|n| n.parse().ok());
    tokens.unwrap_or_else(|| panic!("no token count in {line}"))
}

#[test]
fn serve_holds_twice_the_tokens_in_an_f16_cache_and_3_8_times_in_q8_0() {
    let (model, _) = requirements();
    let (f32_tokens, f16_tokens, q8_tokens) = (
        served_kv_tokens(&model, "float32"),
        served_kv_tokens(&model, "float16"),
        served_kv_tokens(&model, "q8_0"),
    );
    assert!(f32_tokens > 0);
    // Within a block of rounding: 4 bytes a number, 2, and 34 per 32.
    assert!(
        f16_tokens.abs_diff(2 * f32_tokens) <= 32,
        "{f16_tokens} vs {f32_tokens}"
    );
    assert!(
        q8_tokens.abs_diff(f32_tokens * 64 / 17) <= 64,
        "{q8_tokens} vs {f32_tokens}"
    );
}

/// `host generate --model model --prompt-ids 1,2` with `extra` options:
/// its exit status and standard error.
fn generate_status(model: &std::path::Path, extra: &[&str]) -> (Option<i32>, String) {
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1,2",
    ];
    args.extend_from_slice(extra);
    let output = run_host(args, &[]);
    (output.status.code(), text(&output).1)
}

#[test]
fn cpu_only_options_are_refused_on_a_gpu() {
    let (model, _) = requirements();
    for (option, value) in [
        ("--kv-cache-dtype", "float16"),
        ("--kv-cache-dtype", "q8_0"),
    ] {
        let (code, stderr) = generate_status(&model, &["--device", "cuda-emulated", option, value]);
        assert_eq!(code, Some(1), "{stderr}");
        let expected = format!("{option} {value} is for the CPU backend");
        assert!(stderr.contains(&expected), "{stderr}");
    }
}

/// vLLM's `fp8` (and its `fp8_e4m3` spelling) is a GPU cache: the CPU
/// backend refuses it by name; `--device cuda-emulated` generates with it.
#[test]
fn fp8_is_refused_on_the_cpu_and_served_on_cuda() {
    let (model, _) = requirements();
    for value in ["fp8", "fp8_e4m3"] {
        let (code, stderr) = generate_status(&model, &["--kv-cache-dtype", value]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains("--kv-cache-dtype fp8 is for the CUDA backend"),
            "{stderr}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (config, weights) = tiny_model("tiny_llama.json");
    write_model_dir(&config, &weights, dir.path(), false);
    let on_cuda = ["--device", "cuda-emulated", "--kv-cache-dtype", "fp8"];
    let (code, stderr) = generate_status(dir.path(), &on_cuda);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn q8_0_is_refused_for_heads_that_are_not_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    // Heads of 8 numbers.
    let (config, weights) = tiny_model("tiny_llama.json");
    write_model_dir(&config, &weights, dir.path(), false);
    let (code, stderr) = generate_status(dir.path(), &["--kv-cache-dtype", "q8_0"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("q8_0 stores heads in blocks of 32 numbers, and this model's heads have 8"),
        "{stderr}"
    );
    let (code, stderr) = generate_status(dir.path(), &["--kv-cache-dtype", "float16"]);
    assert_eq!(code, Some(0), "{stderr}");
}
