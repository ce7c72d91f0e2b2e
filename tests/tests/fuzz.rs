//! Mutation fuzzing of everything a file or a request hands Kiln: GGUF files,
//! safetensors headers, config.json, request bodies and chat rendering.
//! Each target mutates a valid input (bit flips, interesting values, cuts,
//! splices) and runs it through the real code: a result or an error is
//! fine, a panic or an abort is a failure. A target runs for
//! `KILN_FUZZ_SECONDS` (default 3) from `KILN_FUZZ_SEED` (default: the
//! clock); a failure prints the seed and the input to replay it.

use std::path::Path;
use std::time::{Duration, Instant};

use kiln_host::model::{self, LoadOptions};
use kiln_host::plugins::ArchitectureRegistry;
use kiln_host::server::messages::MessagesRequest;
use kiln_host::server::openai::{
    check_fields, ChatRequest, CompletionRequest, EndpointFields, Limits, CHAT_FIELDS,
    COMPLETION_FIELDS,
};
use kiln_host::server::responses::ResponsesRequest;
use kiln_tests::workspace_root;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const TINY_GGUF: &str = "tests/fixtures/reference/tiny_gemma3.f32.gguf";

/// Runs `target` on mutations of `seed_input` until the time is up.
fn fuzz(name: &str, seed_input: &[u8], mut target: impl FnMut(&[u8])) {
    let seconds: f64 = std::env::var("KILN_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let seed: u64 = std::env::var("KILN_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let mut rng = StdRng::seed_from_u64(seed);
    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < Duration::from_secs_f64(seconds) {
        let input = mutate(&mut rng, seed_input);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&input)));
        if outcome.is_err() {
            let shown = String::from_utf8_lossy(&input[..input.len().min(2000)]).into_owned();
            panic!("{name}: panic at run {runs} (KILN_FUZZ_SEED={seed}); input starts:\n{shown}");
        }
        runs += 1;
    }
    eprintln!("{name}: {runs} runs in {seconds} s (KILN_FUZZ_SEED={seed})");
    assert!(runs > 0);
}

/// One to four mutations of `input`.
fn mutate(rng: &mut StdRng, input: &[u8]) -> Vec<u8> {
    const INTERESTING: [&[u8]; 8] = [
        &[0],
        &[0xff],
        &[0x7f],
        &[0x80],
        &[0xff, 0xff, 0xff, 0x7f],
        &[0, 0, 0, 0x80],
        &[0, 0, 0xc0, 0x7f],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    ];
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        if out.is_empty() {
            out.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..out.len());
        match rng.random_range(0..5) {
            0 => out[at] ^= 1 << rng.random_range(0..8),
            1 => {
                let value = INTERESTING[rng.random_range(0..INTERESTING.len())];
                let end = (at + value.len()).min(out.len());
                out[at..end].copy_from_slice(&value[..end - at]);
            }
            2 => out.truncate(at),
            3 => {
                let from = rng.random_range(0..out.len());
                let len = rng.random_range(1..=16).min(out.len() - from);
                let piece = out[from..from + len].to_vec();
                out.splice(at..at, piece);
            }
            _ => out[at] = rng.random(),
        }
    }
    out
}

fn load_options() -> LoadOptions {
    LoadOptions {
        check_weights: true,
        max_length: None,
        ..kiln_tests::models::shape_options(kiln_tests::models::DeviceChoice::Cpu)
    }
}

/// Loads the model at `path` (GGUF, with a config.json beside it if there
/// is one) with every check; errors are expected, panics are not.
fn try_load(registry: &ArchitectureRegistry, path: &Path) -> Result<(), String> {
    let resolved = model::resolve(path.to_str().unwrap(), None, None).map_err(|e| e.to_string())?;
    model::load(registry, resolved, &load_options())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A load error is short (a line, perhaps with a hint), whatever the file
/// holds.
fn assert_short(error: &str) {
    assert!(
        error.len() <= 600 && error.lines().count() <= 2,
        "a {}-character error: {}",
        error.len(),
        &error[..error.len().min(1500)]
    );
}

#[test]
fn fuzz_gguf_files() {
    let registry = ArchitectureRegistry::load(&[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(workspace_root().join(TINY_GGUF)).unwrap();
    let path = dir.path().join("fuzz.gguf");
    std::fs::write(&path, &bytes).unwrap();
    try_load(&registry, &path).expect("the unmutated file loads");
    // The metadata and tensor table are where a lie does harm: mutate the
    // head (the first 4 KiB), keep the data.
    let head = 4096.min(bytes.len());
    fuzz("gguf", &bytes[..head], |mutated| {
        let mut file = mutated.to_vec();
        file.extend_from_slice(&bytes[head..]);
        std::fs::write(&path, &file).unwrap();
        if let Err(e) = try_load(&registry, &path) {
            assert_short(&e);
        }
    });
}

#[test]
fn fuzz_config_json() {
    let registry = ArchitectureRegistry::load(&[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("model.gguf");
    std::fs::copy(workspace_root().join(TINY_GGUF), &gguf).unwrap();
    let (_, config) =
        kiln_host::checkpoint::open_gguf(&gguf, kiln_host::checkpoint::TensorBytes::Mapped)
            .unwrap();
    let config = serde_json::to_vec_pretty(&config).unwrap();
    std::fs::write(dir.path().join("config.json"), &config).unwrap();
    try_load(&registry, &gguf).expect("the unmutated config loads");
    fuzz("config.json", &config, |mutated| {
        std::fs::write(dir.path().join("config.json"), mutated).unwrap();
        if let Err(e) = try_load(&registry, &gguf) {
            assert_short(&e);
        }
    });
}

#[test]
fn fuzz_safetensors_headers() {
    let dir = tempfile::tempdir().unwrap();
    let header = br#"{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}"#;
    let path = dir.path().join("model.safetensors");
    fuzz("safetensors", header, |mutated| {
        let mut file = (mutated.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(mutated);
        file.extend_from_slice(&[0x3f; 24]);
        std::fs::write(&path, &file).unwrap();
        let _ = kiln_host::checkpoint::open_safetensors(
            &path,
            kiln_host::checkpoint::TensorBytes::Mapped,
        );
    });
}

#[test]
fn fuzz_request_bodies() {
    let limits = Limits {
        max_model_len: 2048,
        max_tokens: 2048,
        max_n: 16,
        vocab_size: 49152,
        max_seqs_per_request: 128,
        max_prompt_bytes: 1 << 20,
        allow_special_tokens_in_messages: false,
    };
    let defaults = kiln_host::engine::sampling::SamplingParams::default();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "n": 2, "stop": ["a", "b"],
        "stop_token_ids": [7], "logit_bias": {"5": 1.5}, "logprobs": true, "top_logprobs": 3,
        "max_completion_tokens": 32, "seed": 4, "presence_penalty": 0.5, "repetition_penalty": 1.1,
        "stream": true, "stream_options": {"include_usage": true}, "min_tokens": 2});
    fuzz("chat request", chat.to_string().as_bytes(), |mutated| {
        let Ok(body) = serde_json::from_slice::<Value>(mutated) else {
            return;
        };
        if check_fields(&body, CHAT_FIELDS).is_err() {
            return;
        }
        if let Ok(request) = serde_json::from_value::<ChatRequest>(body) {
            for m in &request.messages {
                let _ = m.text();
            }
            let logprobs = request.logprobs.then(|| request.top_logprobs.unwrap_or(0));
            let _ = request.common.params(
                request.max_completion_tokens,
                None,
                logprobs,
                10,
                &limits,
                &defaults,
            );
        }
    });
    let responses = json!({"model": "m", "instructions": "Be brief.", "max_output_tokens": 16,
        "input": [{"role": "developer", "content": "x"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"}, "temperature": 0.5, "stream": true,
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}});
    fuzz(
        "responses request",
        responses.to_string().as_bytes(),
        |mutated| {
            let Ok(body) = serde_json::from_slice::<Value>(mutated) else {
                return;
            };
            if check_fields(&body, ResponsesRequest::FIELDS).is_err() {
                return;
            }
            if let Ok(request) = serde_json::from_value::<ResponsesRequest>(body) {
                if let Ok(chat) = request.to_chat() {
                    for m in &chat.messages {
                        let _ = m.text();
                    }
                }
            }
        },
    );
    let messages = json!({"model": "m", "max_tokens": 16, "system": [{"type": "text", "text": "s"}],
        "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                {"type": "text", "text": "and?"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f"}, "stop_sequences": ["x"], "stream": true});
    fuzz(
        "messages request",
        messages.to_string().as_bytes(),
        |mutated| {
            let Ok(body) = serde_json::from_slice::<Value>(mutated) else {
                return;
            };
            if check_fields(&body, MessagesRequest::FIELDS).is_err() {
                return;
            }
            if let Ok(request) = serde_json::from_value::<MessagesRequest>(body) {
                if let Ok(chat) = request.to_chat() {
                    for m in &chat.messages {
                        let _ = m.text();
                    }
                }
            }
        },
    );
    let completion = json!({"model": "m", "prompt": [[1, 2, 3], [4]], "echo": true, "logprobs": 2,
        "max_tokens": 8, "n": 3, "best_of": null, "temperature": 0, "stop": "x"});
    fuzz(
        "completion request",
        completion.to_string().as_bytes(),
        |mutated| {
            let Ok(body) = serde_json::from_slice::<Value>(mutated) else {
                return;
            };
            if check_fields(&body, COMPLETION_FIELDS).is_err() {
                return;
            }
            if let Ok(request) = serde_json::from_value::<CompletionRequest>(body) {
                let _ = request.common.params(
                    request.common.max_tokens,
                    Some(16),
                    request.logprobs,
                    4,
                    &limits,
                    &defaults,
                );
            }
        },
    );
}
