#!/usr/bin/env python3
"""Tool calls through the official `openai` client against a running
`host serve` whose chat template supports tools (Qwen2.5's, Hermes format):
a weather-tool round trip with a named tool_choice, streaming with
`required`, `auto`, and refusals.

    tool_calls.py BASE_URL MODEL [--auto-must-call]

With --auto-must-call (for a model trained for tools, such as
Qwen2.5-Coder), `auto` must call the weather tool, streamed and not, and the
tool's result must reach the next prompt.

Prints one JSON line per check; exits non-zero on the first failure.
"""

import json
import sys

import openai

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                       "required": ["city"], "additionalProperties": False},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def streamed_calls(stream):
    """The calls (by index: name and arguments text), content and finish reason of a stream."""
    calls, content, finish = {}, "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            entry = calls.setdefault(c.index, {"name": "", "arguments": ""})
            entry["name"] += c.function.name or ""
            entry["arguments"] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return calls, content, finish


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    must_call = "--auto-must-call" in sys.argv[3:]
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)

    # A named function: the call always parses; then the round trip.
    first = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER, TIME], max_tokens=96, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather", call
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments["city"], str) and arguments["unit"] in ("celsius", "fahrenheit"), arguments
    history = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    second = client.chat.completions.create(
        model=model, messages=history, tools=[WEATHER, TIME], tool_choice="none", max_tokens=24)
    assert second.choices[0].message.tool_calls is None
    assert isinstance(second.choices[0].message.content, str)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    report("round_trip", arguments=arguments, answer=second.choices[0].message.content)

    # Streaming with `required`: deltas assemble into calls, no tag leaks.
    stream = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER, TIME], tool_choice="required",
        parallel_tool_calls=False, max_tokens=96, stream=True)
    calls, content, finish = streamed_calls(stream)
    assert finish == "tool_calls" and len(calls) == 1, (finish, calls, content)
    assert "<tool_call>" not in content, content
    streamed = calls[0]
    assert streamed["name"] in ("get_weather", "get_time"), streamed
    json.loads(streamed["arguments"])
    report("stream_required", call=streamed)

    # `auto`: the model decides; the answer is well formed either way.
    auto = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER], max_tokens=64, temperature=0)
    message = auto.choices[0].message
    assert message.tool_calls or isinstance(message.content, str), message
    report("auto", called=bool(message.tool_calls))
    if must_call:
        assert auto.choices[0].finish_reason == "tool_calls", auto
        call = message.tool_calls[0]
        assert call.function.name == "get_weather", call
        assert "paris" in json.loads(call.function.arguments)["city"].lower(), call
        stream = client.chat.completions.create(
            model=model, messages=QUESTION, tools=[WEATHER], max_tokens=64, temperature=0,
            stream=True)
        calls, content, finish = streamed_calls(stream)
        assert finish == "tool_calls" and len(calls) == 1, (finish, calls, content)
        assert calls[0]["name"] == "get_weather", calls
        arguments = calls[0]["arguments"]
        assert json.loads(arguments) == json.loads(call.function.arguments), arguments
        assert "<tool_call>" not in content, content
        history = QUESTION + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
        ]
        answer = client.chat.completions.create(
            model=model, messages=history, tools=[WEATHER], max_tokens=48, temperature=0)
        # The tool's result reached the prompt; what the model makes of it is
        # its own affair (Qwen2.5-Coder-0.5B tends to call the tool again).
        assert answer.usage.prompt_tokens > auto.usage.prompt_tokens, answer
        reply = answer.choices[0].message
        assert reply.tool_calls or isinstance(reply.content, str), answer
        text = reply.content or json.dumps([c.function.model_dump() for c in reply.tool_calls])
        report("auto_round_trip", call=json.loads(arguments), answer=text)

    # Refusals: a named function that is not offered, a malformed tool.
    for body in [
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": [{"type": "function"}]},
    ]:
        try:
            client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, **body)
            raise AssertionError(f"accepted {body}")
        except openai.BadRequestError as e:
            assert e.status_code == 400
    report("refusals")


if __name__ == "__main__":
    main()
