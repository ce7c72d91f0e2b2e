//! `host serve` with real clients: the official `openai` Python package and
//! curl, against SmolLM2-135M (GGUF). `.ci/setup` fetches the model into
//! `target/models/` and creates `target/ci-venv` with `openai`; elsewhere,
//! point `KILN_SMOLLM2_GGUF` and `KILN_TEST_PYTHON` at them.

use std::process::Command;
use std::time::{Duration, Instant};

use kiln_tests::serve::{curl, metric, requirements, run_client_script, Server};
use kiln_tests::{run_host, text, workspace_root};

#[test]
fn the_openai_client_works_against_smollm2_and_nothing_leaks() {
    let (model, python) = requirements();
    let server = Server::start(&model, &["--api-key", "test-key"]);
    run_client_script(
        &server,
        &python,
        "openai_client.py",
        &["test-key"],
        &[
            "chat",
            "chat_stream",
            "logprobs",
            "completions",
            "stop",
            "seed",
            "errors",
            "logit_bias",
            "refusals",
            "concurrency",
            "metrics",
        ],
    );

    // Greedy over the server equals `host generate`.
    let body = r#"{"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}"#;
    let reply = curl(
        &server,
        &[
            "-s",
            "-H",
            "authorization: Bearer test-key",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &server.url("/v1/completions"),
        ],
    );
    let served: serde_json::Value = serde_json::from_str(&reply).unwrap();
    let generated = run_host(
        [
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            "The capital of France is",
            "--max-new-tokens",
            "8",
            "--output",
            "json",
        ],
        &[],
    );
    let (stdout, stderr) = text(&generated);
    assert!(generated.status.success(), "{stderr}");
    let local: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(served["choices"][0]["text"], local["text"]);

    // Every request is over: no running request, no KV block in use.
    let started = Instant::now();
    while metric(&server, "vllm:num_requests_running") != 0.0
        || metric(&server, "vllm:kv_cache_usage_perc") != 0.0
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "requests or blocks left over:\n{}",
            curl(&server, &["-s", &server.url("/metrics")])
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(metric(&server, "vllm:prompt_tokens_total") > 0.0);
    assert!(metric(&server, "vllm:time_to_first_token_seconds_count") > 0.0);
}

/// The prompt's log-probabilities (`echo` with `logprobs`, vLLM's
/// `prompt_logprobs`) against transformers' fp32 logits of the same
/// prompt (`tests/fixtures/reference/smollm2_capital`), through the
/// official client.
#[test]
fn prompt_log_probabilities_match_transformers() {
    let (model, python) = requirements();
    let reference = workspace_root().join("tests/fixtures/reference/smollm2_capital");
    let ids: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reference.join("capital.ids.json")).unwrap())
            .unwrap();
    let ids: Vec<u32> = serde_json::from_value(ids["ids"].clone()).unwrap();
    let logits =
        kiln_host::engine::npy::read_matrix(&reference.join("capital.logits.npy")).unwrap();
    // Token p's log-probability under the logits of position p - 1.
    let logprobs: Vec<f32> = (1..ids.len())
        .map(|p| kiln_host::runtime::sampling::log_softmax(logits.row(p - 1))[ids[p] as usize])
        .collect();
    let expected = serde_json::json!({"ids": ids, "logprobs": logprobs}).to_string();
    let server = Server::start(&model, &[]);
    let report = run_client_script(
        &server,
        &python,
        "prompt_logprobs.py",
        &[&expected],
        &[
            "echo",
            "prompt_logprobs",
            "chat_prompt_logprobs",
            "stream",
            "refusals",
        ],
    );
    println!("{report}");
}

#[test]
fn curl_sees_openai_errors_and_sse_and_the_server_stops_cleanly() {
    let (model, _) = requirements();
    let mut server = Server::start(&model, &["--api-key", "k", "--max-request-bytes", "2KiB"]);
    let status = |args: &[&str]| {
        let mut all = vec!["-s", "-o", "/dev/null", "-w", "%{http_code}"];
        all.extend_from_slice(args);
        curl(&server, &all)
    };
    let chat = server.url("/v1/chat/completions");
    assert_eq!(status(&[&chat, "-d", "{}"]), "401", "no API key");
    // Exact comparison: a prefix, a case change, an inner space or an extra
    // word is wrong. (Whitespace around a header value is not part of it in
    // HTTP, so no client can send a key ending in a space: such keys are
    // refused at start, see the test below.)
    for wrong in [
        "Bearer kk",
        "Bearer K",
        "Bearer",
        "k",
        "Bearer  k",
        "Bearer k k",
    ] {
        let header = format!("authorization: {wrong}");
        assert_eq!(
            status(&["-H", &header, &chat, "-d", "{}"]),
            "401",
            "{wrong}"
        );
    }
    // Anthropic's header (its clients' way) holds the key itself.
    let messages = server.url("/v1/messages");
    for (header, code) in [("x-api-key: kk", "401"), ("x-api-key: k", "400")] {
        assert_eq!(
            status(&["-H", header, &messages, "-d", "{}"]),
            code,
            "{header}"
        );
    }
    assert_eq!(
        status(&[
            "-H",
            "authorization: Bearer k",
            "-H",
            "content-type: application/json",
            "-d",
            "{not json",
            &chat
        ]),
        "400"
    );
    let big = format!(
        r#"{{"model": "smollm2", "prompt": "{}"}}"#,
        "x".repeat(4096)
    );
    assert_eq!(
        status(&[
            "-H",
            "authorization: Bearer k",
            "-H",
            "content-type: application/json",
            "-d",
            &big,
            &server.url("/v1/completions")
        ]),
        "413"
    );
    let error = curl(
        &server,
        &[
            "-s",
            "-H",
            "authorization: Bearer k",
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "top_p": 0}"#,
            &chat,
        ],
    );
    let error: serde_json::Value = serde_json::from_str(&error).unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("top_p"),
        "{error}"
    );
    assert_eq!(
        curl(&server, &["-s", &server.url("/health")]).trim(),
        r#"{"status":"ok"}"#
    );
    // 404 and 405 in OpenAI's error shape; one model's card; x-request-id
    // comes back.
    let auth = "authorization: Bearer k";
    let json = |path: &str| -> serde_json::Value {
        let body = curl(&server, &["-s", "-H", auth, &server.url(path)]);
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    };
    let missing = json("/v1/nothing");
    assert_eq!(missing["error"]["message"], "Invalid URL (GET /v1/nothing)");
    assert_eq!(missing["error"]["code"], 404);
    let wrong_method = json("/v1/chat/completions");
    assert_eq!(wrong_method["error"]["code"], 405, "{wrong_method}");
    assert!(wrong_method["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Method GET is not allowed"));
    assert_eq!(json("/v1/models/smollm2")["id"], "smollm2");
    assert_eq!(json("/v1/models/other")["error"]["param"], "model");
    assert_eq!(
        status(&["-H", auth, &server.url("/v1/models/other")]),
        "404"
    );
    let headers = curl(
        &server,
        &[
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            auth,
            "-H",
            "x-request-id: abc-123",
            &server.url("/v1/models"),
        ],
    );
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("x-request-id: abc-123"),
        "{headers}"
    );

    // /tokenize and /detokenize with vLLM's shapes: a prompt round-trips; a
    // chat renders through the template as /v1/chat/completions counts it.
    let post = |path: &str, body: serde_json::Value| -> serde_json::Value {
        let body = body.to_string();
        let args = [
            "-s",
            "-H",
            auth,
            "-H",
            "content-type: application/json",
            "-d",
            &body,
        ];
        let out = curl(&server, &[&args[..], &[&server.url(path)]].concat());
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{path}: {e}: {out}"))
    };
    let text = "The capital of France is";
    let tokenized = post(
        "/tokenize",
        serde_json::json!({"prompt": text, "return_token_strs": true}),
    );
    let tokens = tokenized["tokens"].as_array().unwrap().clone();
    assert_eq!(tokenized["count"], tokens.len(), "{tokenized}");
    let pieces: Vec<&str> = tokenized["token_strs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(pieces.concat(), text);
    let back = post(
        "/detokenize",
        serde_json::json!({"model": "smollm2", "tokens": tokens}),
    );
    assert_eq!(back["prompt"], text);
    let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
    let with = post("/tokenize", serde_json::json!({"messages": messages}));
    let without = post(
        "/tokenize",
        serde_json::json!({"messages": messages, "add_generation_prompt": false}),
    );
    assert!(
        with["count"].as_u64() > without["count"].as_u64(),
        "{with} {without}"
    );
    let chat_body = serde_json::json!({"model": "smollm2", "messages": messages, "max_tokens": 1});
    let answered = post("/v1/chat/completions", chat_body);
    assert_eq!(
        answered["usage"]["prompt_tokens"], with["count"],
        "{answered}"
    );
    // vLLM's truncate_prompt_tokens keeps a prompt's last tokens (-1: as
    // many as the context holds); add_special_tokens is honoured (SmolLM2
    // adds no BOS, so nothing changes).
    let completion = |extra: serde_json::Value| {
        let mut body = serde_json::json!({"model": "smollm2", "prompt": text, "max_tokens": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        post("/v1/completions", body)
    };
    for (keep, want) in [(2, 2), (-1, tokens.len()), (100, tokens.len())] {
        let answer = completion(serde_json::json!({"truncate_prompt_tokens": keep}));
        assert_eq!(answer["usage"]["prompt_tokens"], want, "{keep}: {answer}");
    }
    let refused = completion(serde_json::json!({"truncate_prompt_tokens": 0}));
    assert_eq!(
        refused["error"]["param"], "truncate_prompt_tokens",
        "{refused}"
    );
    let plain = completion(serde_json::json!({"add_special_tokens": false}));
    assert_eq!(plain["usage"]["prompt_tokens"], tokens.len(), "{plain}");
    // vLLM's allowed_token_ids: only those tokens come out ("The" and
    // " capital", whatever the model would rather say).
    let only = completion(serde_json::json!({"allowed_token_ids": &tokens[..2], "max_tokens": 6}));
    let mut rest = only["choices"][0]["text"].as_str().unwrap().to_owned();
    assert!(!rest.is_empty(), "{only}");
    while !rest.is_empty() {
        let piece = pieces[..2].iter().find(|p| rest.starts_with(*p));
        rest = rest[piece.unwrap_or_else(|| panic!("{only}")).len()..].to_owned();
    }
    for bad in [serde_json::json!([]), serde_json::json!([99999999])] {
        let refused = completion(serde_json::json!({"allowed_token_ids": bad}));
        assert_eq!(refused["error"]["param"], "allowed_token_ids", "{refused}");
    }
    // vLLM's bad_words: the greedy answer names Paris, not when it is one.
    let text_of =
        |answer: &serde_json::Value| answer["choices"][0]["text"].as_str().unwrap().to_owned();
    let free = completion(serde_json::json!({"max_tokens": 4}));
    assert!(text_of(&free).contains("Paris"), "{free}");
    let banned = completion(serde_json::json!({"max_tokens": 4, "bad_words": ["Paris"]}));
    assert!(!text_of(&banned).contains("Paris"), "{banned}");
    let refused = completion(serde_json::json!({"bad_words": [" "]}));
    assert_eq!(refused["error"]["param"], "bad_words", "{refused}");
    let chat_body = serde_json::json!({"model": "smollm2", "messages": messages, "max_tokens": 1,
                                       "truncate_prompt_tokens": 3, "add_special_tokens": true});
    let answered = post("/v1/chat/completions", chat_body);
    assert_eq!(answered["usage"]["prompt_tokens"], 3, "{answered}");
    let refused = post("/detokenize", serde_json::json!({"tokens": [1, 99999999]}));
    assert_eq!(refused["error"]["param"], "tokens", "{refused}");
    let refused = post(
        "/tokenize",
        serde_json::json!({"prompt": "a", "messages": messages}),
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exactly one"),
        "{refused}"
    );

    let sse = curl(
        &server,
        &[
            "-s",
            "-N",
            "-H",
            "authorization: Bearer k",
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 5, "stream": true}"#,
            &chat,
        ],
    );
    let events: Vec<&str> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{sse}");
    assert!(events.len() >= 3, "{sse}");

    // SIGTERM: the server finishes and exits cleanly.
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = server.child.wait().unwrap();
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        server.log()
    );
    assert!(server.log().contains("shutting down"), "{}", server.log());
}

/// `serve` on the CUDA backend (the kernel emulator, or a GPU with
/// KILN_TEST_CUDA_DEVICE) end to end, the tokens picked on the device
/// (greedy with log-probabilities, and a seeded draw through temperature,
/// top-k and top-p), answering the official client the way `host generate`
/// on the CPU answers the same requests.
#[test]
fn serve_on_the_cuda_backend_answers_the_openai_client_like_the_cpu() {
    let (model, python) = requirements();
    let device = kiln_tests::models::cuda_test_device().to_string();
    let server = Server::start(
        &model,
        &[
            "--device",
            &device,
            "--dtype",
            "float32",
            "--max-batch-tokens",
            "128",
        ],
    );
    let output = Command::new(&python)
        .arg(workspace_root().join("tests/serve/openai_smoke.py"))
        .args([&server.url("/v1"), "smollm2"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&output);
    assert!(
        output.status.success(),
        "openai client failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.log()
    );
    let served: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let on_cpu = |extra: &[&str]| -> String {
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--max-new-tokens",
            "6",
            "--output",
            "json",
        ];
        args.extend(extra);
        let generated = run_host(&args, &[]);
        let (stdout, stderr) = text(&generated);
        assert!(generated.status.success(), "{stderr}");
        let local: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        local["text"].as_str().unwrap().to_owned()
    };
    let chat = on_cpu(&["--prompt", "What is the capital of France?", "--chat"]);
    assert_eq!(served["chat"].as_str().unwrap(), chat);
    let sampled = on_cpu(&[
        "--prompt",
        "The capital of France is",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--top-k",
        "40",
        "--seed",
        "7",
    ]);
    assert_eq!(served["sampled"].as_str().unwrap(), sampled);
}

/// The API key is a secret: `--help` never prints it from the environment,
/// and a key HTTP could not carry (surrounding whitespace is dropped from
/// headers) is refused at start, in one line.
#[test]
fn the_api_key_is_never_printed_and_an_unsendable_key_is_refused() {
    let help = run_host(["serve", "--help"], &[("KILN_API_KEY", "s3cret-value")]);
    let (out, _) = text(&help);
    assert!(
        help.status.success() && out.contains("KILN_API_KEY"),
        "{out}"
    );
    assert!(!out.contains("s3cret-value"), "{out}");
    for key in ["key ", " key", ""] {
        let refused = run_host(["serve", "--model", "unused", "--api-key", key], &[]);
        assert!(!refused.status.success());
        let (_, err) = text(&refused);
        assert!(
            err.contains("--api-key") && err.lines().count() == 1,
            "{err}"
        );
    }
}

/// vLLM's spellings of the options, a chat template given on the command
/// line (with `chat_template_kwargs` and `continue_final_message`), and the
/// load line in the log.
#[test]
fn vllm_spellings_and_a_given_chat_template_work() {
    let (model, _) = requirements();
    let server = Server::start(
        &model,
        &[
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "512",
            "--enable-prefix-caching",
            "--chat-template",
            "{% for m in messages %}<<{{ m.content }}>>{% endfor %}{{ greeting | default('') }}",
            "--generation-config",
            "vllm",
            "--allowed-origins",
            "https://app.example.com",
        ],
    );
    // CORS for the allowed origin only.
    let preflight = |origin: &str| {
        curl(
            &server,
            &[
                "-s",
                "-D",
                "-",
                "-o",
                "/dev/null",
                "-X",
                "OPTIONS",
                "-H",
                &format!("origin: {origin}"),
                "-H",
                "access-control-request-method: POST",
                &server.url("/v1/chat/completions"),
            ],
        )
        .to_ascii_lowercase()
    };
    assert!(
        preflight("https://app.example.com")
            .contains("access-control-allow-origin: https://app.example.com"),
        "{}",
        preflight("https://app.example.com")
    );
    assert!(!preflight("https://evil.example.com").contains("access-control-allow-origin"));
    let post = |path: &str, body: serde_json::Value| server.post_json(path, &body);
    let chat = post(
        "/tokenize",
        serde_json::json!({"messages": [{"role": "user", "content": "hello"}]}),
    );
    let plain = post(
        "/tokenize",
        serde_json::json!({"prompt": "<<hello>>", "add_special_tokens": false}),
    );
    assert_eq!(chat["tokens"], plain["tokens"], "{chat} {plain}");
    assert_eq!(chat["max_model_len"], 1024, "{chat}");
    // vLLM's chat template fields: extra variables, and the final message
    // left open (the rendering cut where its text ends), which a
    // generation prompt after it contradicts.
    let tokens_of = |prompt: &str| {
        post(
            "/tokenize",
            serde_json::json!({"prompt": prompt, "add_special_tokens": false}),
        )["tokens"]
            .clone()
    };
    let messages = serde_json::json!([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Sure"}]);
    let greeted = post(
        "/tokenize",
        serde_json::json!({"messages": messages, "chat_template_kwargs": {"greeting": "Hi!"}}),
    );
    assert_eq!(
        greeted["tokens"],
        tokens_of("<<hello>><<Sure>>Hi!"),
        "{greeted}"
    );
    let continued = serde_json::json!({"messages": messages, "add_generation_prompt": false, "continue_final_message": true});
    assert_eq!(
        post("/tokenize", continued.clone())["tokens"],
        tokens_of("<<hello>><<Sure")
    );
    let answer = post(
        "/v1/chat/completions",
        serde_json::json!({"model": "smollm2", "messages": messages, "max_tokens": 2,
                           "add_generation_prompt": false, "continue_final_message": true}),
    );
    let prompt_tokens = tokens_of("<<hello>><<Sure").as_array().unwrap().len();
    assert_eq!(answer["usage"]["prompt_tokens"], prompt_tokens, "{answer}");
    let refused = post(
        "/v1/chat/completions",
        serde_json::json!({"model": "smollm2", "messages": messages, "continue_final_message": true}),
    );
    assert_eq!(
        refused["error"]["param"], "continue_final_message",
        "{refused}"
    );
    let no_text = serde_json::json!([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": []}]);
    let refused = post(
        "/tokenize",
        serde_json::json!({"messages": no_text, "add_generation_prompt": false, "continue_final_message": true}),
    );
    assert!(refused["error"].is_object(), "{refused}");
    let log = server.log();
    assert!(
        log.contains("loaded ") && log.contains("LlamaForCausalLM") && log.contains("M parameters"),
        "{log}"
    );
    // `--generation-config vllm`: no temperature given samples at 1, so two
    // seeds write two different texts (greedy would write one).
    let texts: Vec<serde_json::Value> = [1, 2]
        .iter()
        .map(|seed| {
            post(
                "/v1/completions",
                serde_json::json!({"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 16, "seed": seed}),
            )["choices"][0]["text"]
                .clone()
        })
        .collect();
    assert_ne!(texts[0], texts[1], "{texts:?}");
    // Neither the architecture (SmolLM2's vocabulary is not Llama 3's) nor
    // this template names a tool-call format: tools that would be read are
    // refused, `tool_choice: none` is not.
    assert!(log.contains("no tool-call format"), "{log}");
    let tool = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let refused = post(
        "/v1/chat/completions",
        serde_json::json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "tools": tool}),
    );
    assert_eq!(refused["error"]["param"], "tool_choice", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--tool-call-parser"),
        "{refused}"
    );
    let answered = post(
        "/v1/chat/completions",
        serde_json::json!({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
            "tools": tool, "tool_choice": "none", "max_tokens": 2}),
    );
    assert_eq!(
        answered["choices"][0]["message"]["role"], "assistant",
        "{answered}"
    );
    // Not an embedding model: a 400 that says so.
    let refused = post(
        "/v1/embeddings",
        serde_json::json!({"model": "smollm2", "input": "hi"}),
    );
    assert_eq!(refused["error"]["code"], 400, "{refused}");
    assert!(refused["error"]["message"]
        .as_str()
        .unwrap()
        .contains("embedding model"));
}

/// `host benchmark --url`: the online load generator against a running
/// server, from random prompts and from a JSONL dataset, Poisson arrivals
/// under a concurrency limit; every request completes and is measured.
#[test]
fn the_online_benchmark_measures_a_running_server() {
    let (model, _) = requirements();
    let server = Server::start(&model, &[]);
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(
        &dataset,
        "{\"prompt\": \"The capital of France is\"}\n{\"prompt\": \"Once upon a time\"}\n",
    )
    .unwrap();
    let base = server.url("");
    for extra in [
        vec!["--max-concurrency", "3", "--input-len", "12"],
        vec![
            "--request-rate",
            "20",
            "--dataset",
            dataset.to_str().unwrap(),
        ],
    ] {
        let mut args = vec![
            "benchmark",
            "--url",
            &base,
            "--model",
            "smollm2",
            "--num-prompts",
            "6",
            "--output-len",
            "5",
            "--json",
        ];
        args.extend(&extra);
        let output = run_host(&args, &[]);
        let (stdout, stderr) = text(&output);
        assert!(output.status.success(), "{stderr}");
        let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(report["completed"], 6, "{report}");
        assert_eq!(report["failed"], 0, "{report}");
        assert_eq!(report["output_tokens"], 30, "{report}");
        for metric in ["ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"] {
            assert!(
                report[metric]["mean"].as_f64().unwrap() > 0.0,
                "{metric}: {report}"
            );
        }
    }
}

/// `--speculative-config` (n-gram lookup) on SmolLM2: a greedy answer that
/// repeats the prompt is the text the server gives without it, whole and
/// streamed, with drafts kept (vLLM's counters); a method Kiln does not
/// implement, or async scheduling asked for beside it, refuses to start.
#[test]
fn speculative_decoding_keeps_the_answer_and_counts_its_drafts() {
    let (model, _) = requirements();
    let ngram = r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}"#;
    let body = serde_json::json!({
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog, and the lazy dog sleeps."}],
        "temperature": 0,
        "max_tokens": 40,
    });
    let answer = |server: &Server| {
        let whole = server.post_json("/v1/chat/completions", &body);
        whole["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let plain = answer(&Server::start(&model, &[]));
    let server = Server::start(&model, &["--speculative-config", ngram]);
    assert_eq!(answer(&server), plain);
    let mut streamed = body.clone();
    streamed["stream"] = serde_json::json!(true);
    let events = curl(
        &server,
        &[
            "-sN",
            "-H",
            "content-type: application/json",
            "-d",
            &streamed.to_string(),
            &server.url("/v1/chat/completions"),
        ],
    );
    let streamed_text: String = events
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed_text, plain);
    let kept = metric(&server, "vllm:spec_decode_num_accepted_tokens_total");
    let drafted = metric(&server, "vllm:spec_decode_num_draft_tokens_total");
    assert!(
        kept > 0.0 && drafted >= kept,
        "{kept} of {drafted} draft tokens kept"
    );
    assert!(server.log().contains("speculative decoding: n-gram lookup"));
    for (extra, says) in [
        (
            vec![
                "--speculative-config",
                r#"{"method": "eagle", "num_speculative_tokens": 2}"#,
            ],
            "method \"eagle\" is not implemented",
        ),
        (
            vec!["--speculative-config", ngram, "--async-scheduling"],
            "--async-scheduling",
        ),
    ] {
        let mut args = vec!["serve", "--model", model.to_str().unwrap(), "--port", "0"];
        args.extend(extra);
        let output = run_host(args, &[]);
        let (_, stderr) = text(&output);
        assert!(
            !output.status.success() && stderr.contains(says),
            "{stderr}"
        );
    }
}
