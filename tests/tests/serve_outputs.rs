//! What shapes a chat's answer in `host serve`, through the official
//! `openai` client against SmolLM2-135M (GGUF): structured output, tool
//! calls, a reasoning model's thinking, the Responses API, and (through
//! the `anthropic` client) Anthropic's Messages API.
//! `.ci/setup` fetches the model and the client (see `serve.rs`).

use kiln_tests::serve::{requirements, run_client_script, Server, STRUCTURED_OUTPUT_CHECKS};
use kiln_tests::{run_host, text, workspace_root};

/// Structured output through the official client
/// (`tests/serve/structured_output.py`): Pydantic models with
/// `chat.completions.parse` over 22 varied prompts, greedy and sampled, `n`
/// of 3, streaming, vLLM's regex, choice and Lark grammar, the completions
/// endpoint, and 400s for a bad grammar or two ways of asking. On the CPU;
/// on the GPU that KILN_TEST_CUDA_DEVICE names, in the GPU suite (the masks
/// in the device sampler, async scheduling; too slow for the emulator).
#[test]
fn structured_output_parses_every_time_with_the_openai_client() {
    let (model, python) = requirements();
    let device = std::env::var("KILN_TEST_CUDA_DEVICE").unwrap_or_else(|_| "cpu".to_owned());
    let server = Server::start(&model, &["--device", &device]);
    run_client_script(
        &server,
        &python,
        "structured_output.py",
        &[],
        &STRUCTURED_OUTPUT_CHECKS,
    );
}

/// `--enable-auto-tool-choice` (vLLM's flag) on a model whose tool-call
/// format nothing names: the server refuses to start, in one line that says
/// what to add.
#[test]
fn enable_auto_tool_choice_without_a_known_format_refuses_to_start() {
    let (model, _) = requirements();
    let output = run_host(
        [
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--enable-auto-tool-choice",
            "--port",
            "0",
        ],
        &[],
    );
    let (_, stderr) = text(&output);
    assert!(!output.status.success());
    let line = stderr
        .lines()
        .find(|l| l.contains("--enable-auto-tool-choice"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.contains("add --tool-call-parser hermes|llama3_json|mistral"),
        "{stderr}"
    );
}

/// Tool calls through the official client (`tests/serve/tool_calls.py`) on
/// SmolLM2 with Qwen2.5's chat template (Hermes format): a named
/// `tool_choice` round trip, streaming with `required`, `auto`, refusals.
#[test]
fn tool_calls_round_trip_with_the_openai_client() {
    let (model, python) = requirements();
    let template =
        workspace_root().join("host/tests/fixtures/tokenizer/qwen2.5/chat_template.jinja");
    let server = Server::start(
        &model,
        &[
            "--chat-template",
            template.to_str().unwrap(),
            "--enable-auto-tool-choice",
        ],
    );
    assert!(
        server
            .log()
            .contains("tool calls are read in the Hermes format (from the chat template)"),
        "{}",
        server.log()
    );
    run_client_script(
        &server,
        &python,
        "tool_calls.py",
        &[],
        &["round_trip", "stream_required", "auto", "refusals"],
    );
}

/// OpenAI's Responses API and Anthropic's Messages API through their
/// official clients, on one SmolLM2 server with Qwen2.5's chat template.
/// `tests/serve/responses.py`: text as the chat endpoint answers it, the
/// SDK's stream helper over the typed events, `responses.parse` with a
/// Pydantic model, a function call and its output back in the input,
/// refusals. `tests/serve/anthropic_messages.py`: the same text and its stop
/// reasons, the SDK's stream helper, a named tool's `tool_use` block and its
/// `tool_result` back in the conversation, refusals.
#[test]
fn the_responses_and_messages_apis_answer_their_clients() {
    let (model, python) = requirements();
    let template =
        workspace_root().join("host/tests/fixtures/tokenizer/qwen2.5/chat_template.jinja");
    let server = Server::start(&model, &["--chat-template", template.to_str().unwrap()]);
    let checks = ["text", "stream", "structured", "tools", "refusals"];
    run_client_script(&server, &python, "responses.py", &[], &checks);
    let checks = ["text", "stream", "tools", "refusals"];
    run_client_script(&server, &python, "anthropic_messages.py", &[], &checks);
}

/// vLLM's `--reasoning-parser` through the official client
/// (`tests/serve/reasoning.py`): SmolLM2 shown two examples thinks in
/// `<think>` tags; the thinking comes back as `reasoning_content`, whole
/// and streamed, apart from the answer, and a grammar constrains the
/// answer only.
#[test]
fn a_reasoning_parser_returns_the_thinking_apart() {
    let (model, python) = requirements();
    let server = Server::start(&model, &["--reasoning-parser", "deepseek_r1"]);
    run_client_script(
        &server,
        &python,
        "reasoning.py",
        &[],
        &[
            "split",
            "stream",
            "cut",
            "structured",
            "prompt_ended",
            "history",
            "responses",
            "messages",
        ],
    );
}
