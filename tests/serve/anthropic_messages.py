#!/usr/bin/env python3
"""Anthropic's Messages API through the official `anthropic` client against
a running `host serve` whose chat template supports tools (Qwen2.5's,
Hermes format):

- text: `messages.create` answers what the chat endpoint answers, greedy,
  with a system prompt, and says why it stopped (`max_tokens`,
  `stop_sequence` with the sequence);
- stream: the SDK's `messages.stream` helper (which rebuilds the message
  from the events and checks their order) gives the same text;
- tools: a named tool gives a `tool_use` block with its input, streamed
  too, and the result in a `tool_result` block reaches the next prompt;
- refusals: `thinking` and server tools are 400s.

    anthropic_messages.py BASE_URL MODEL   (BASE_URL as for OpenAI: http://HOST:PORT/v1)

Prints one JSON line per check; exits non-zero on the first failure.
"""

import json
import sys

import anthropic
import openai

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
# Sent as a body field: the SDK's newest versions dropped the argument.
GREEDY = {"temperature": 0}


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    # The Anthropic client adds /v1 itself.
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="none", max_retries=0)
    chat = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    system = "You are a geography teacher."

    message = client.messages.create(model=model, system=system, messages=question, max_tokens=24,
                                     extra_body=GREEDY)
    expected = chat.chat.completions.create(
        model=model, messages=[{"role": "system", "content": system}] + question, max_tokens=24,
        temperature=0)
    text = "".join(block.text for block in message.content if block.type == "text")
    assert text == expected.choices[0].message.content, (message, expected)
    assert message.usage.input_tokens == expected.usage.prompt_tokens, message.usage
    assert message.usage.output_tokens == expected.usage.completion_tokens, message.usage
    assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[expected.choices[0].finish_reason]
    words = text.split()
    stopped = client.messages.create(model=model, system=system, messages=question, max_tokens=24,
                                     extra_body=GREEDY, stop_sequences=[words[2]])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == words[2], stopped
    report("text", text=text, stop_sequence=stopped.stop_sequence)

    with client.messages.stream(model=model, system=system, messages=question, max_tokens=24,
                                extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and final.content[0].text == text, (streamed, final)
    assert final.stop_reason == message.stop_reason, final
    report("stream")

    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.messages.create(model=model, messages=weather, tools=[WEATHER], max_tokens=64,
                                    tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY)
    uses = [block for block in called.content if block.type == "tool_use"]
    assert called.stop_reason == "tool_use" and len(uses) == 1, called
    assert uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str), uses
    with client.messages.stream(model=model, messages=weather, tools=[WEATHER], max_tokens=64,
                                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [uses[0].input], final
    follow = client.messages.create(
        model=model, tools=[WEATHER], max_tokens=16, tool_choice={"type": "none"},
        messages=weather + [
            {"role": "assistant", "content": called.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                          "content": "18 degrees"}]},
        ])
    assert follow.usage.input_tokens > called.usage.input_tokens, (follow, called)
    report("tools", input=uses[0].input)

    for extra in [{"thinking": {"type": "enabled", "budget_tokens": 1024}},
                  {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}]:
        try:
            client.messages.create(model=model, messages=question, max_tokens=4, **extra)
            raise AssertionError(f"accepted {extra}")
        except anthropic.BadRequestError as e:
            assert e.status_code == 400, e
    report("refusals")


if __name__ == "__main__":
    main()
