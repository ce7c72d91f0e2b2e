//! `--kv-cache-dtype` on the CPU backend (llama.cpp's `--cache-type-k/v`):
//! an f16 cache on SmolLM2 generates what the f32 cache generates, in
//! `generate` and in `serve`, where the same `--kv-cache-memory` then holds
//! twice the tokens; `auto` is f16 in fast precision and f32 in exact; the
//! CUDA-only and CPU-only choices are refused on the other device.

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
fn serve_holds_twice_the_tokens_in_an_f16_cache() {
    let (model, _) = requirements();
    let (f32_tokens, f16_tokens) = (
        served_kv_tokens(&model, "float32"),
        served_kv_tokens(&model, "float16"),
    );
    assert!(f32_tokens > 0);
    // Within a block of rounding.
    assert!(
        f16_tokens.abs_diff(2 * f32_tokens) <= 32,
        "{f16_tokens} vs {f32_tokens}"
    );
}

#[test]
fn float16_is_refused_on_a_gpu() {
    let (model, _) = requirements();
    let output = run_host(
        [
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "1,2",
            "--device",
            "cuda-emulated",
            "--kv-cache-dtype",
            "float16",
        ],
        &[],
    );
    let (_, stderr) = text(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--kv-cache-dtype float16 is for the CPU backend"),
        "{stderr}"
    );
}
