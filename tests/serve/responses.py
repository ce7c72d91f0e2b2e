#!/usr/bin/env python3
"""OpenAI's Responses API through the official `openai` client against a
running `host serve` whose chat template supports tools (Qwen2.5's, Hermes
format):

- text: `responses.create` answers what the chat endpoint answers, greedy,
  for a text input and for items with instructions;
- stream: the SDK's `responses.stream` helper (which rebuilds the response
  from the typed events and checks their order) gives the same text, and
  the raw events are numbered in order;
- structured: `responses.parse` with a Pydantic model parses;
- tools: a named function gives a `function_call` item, and the call with
  its output in the next input reaches the prompt;
- refusals: hosted tools, `previous_response_id`, `store: true` are 400s.

    responses.py BASE_URL MODEL

Prints one JSON line per check; exits non-zero on the first failure.
"""

import json
import sys

import openai
import pydantic

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    question = "What is the capital of France?"

    response = client.responses.create(model=model, input=question, max_output_tokens=24, temperature=0)
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], max_tokens=24, temperature=0)
    assert response.output_text == chat.choices[0].message.content, (response, chat)
    assert response.status in ("completed", "incomplete"), response
    assert response.usage.input_tokens == chat.usage.prompt_tokens, (response.usage, chat.usage)
    assert response.usage.output_tokens == chat.usage.completion_tokens, (response.usage, chat.usage)
    items = [{"role": "developer", "content": "Answer in one word."},
             {"role": "user", "content": [{"type": "input_text", "text": question}]}]
    with_items = client.responses.create(
        model=model, instructions="You are a geography teacher.", input=items, max_output_tokens=16,
        temperature=0)
    chat = client.chat.completions.create(
        model=model, max_tokens=16, temperature=0,
        messages=[{"role": "system", "content": "You are a geography teacher."},
                  {"role": "system", "content": "Answer in one word."},
                  {"role": "user", "content": question}])
    assert with_items.output_text == chat.choices[0].message.content, (with_items, chat)
    report("text", output_text=response.output_text)

    with client.responses.stream(model=model, input=question, max_output_tokens=24, temperature=0) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert deltas == response.output_text == final.output_text, (deltas, final)
    raw = client.responses.create(model=model, input=question, max_output_tokens=8, stream=True)
    events = list(raw)
    assert [e.sequence_number for e in events] == list(range(len(events))), events
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    report("stream", events=len(events))

    parsed = client.responses.parse(
        model=model, input="Name a city in Italy as JSON.", text_format=City, max_output_tokens=64,
        temperature=0)
    assert isinstance(parsed.output_parsed, City), parsed
    report("structured", city=parsed.output_parsed.model_dump())

    called = client.responses.create(
        model=model, input="What is the weather in Paris?", tools=[WEATHER], max_output_tokens=64,
        tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", called
    city = json.loads(calls[0].arguments)["city"]
    follow = client.responses.create(
        model=model, tools=[WEATHER], max_output_tokens=16, tool_choice="none",
        input=[{"role": "user", "content": "What is the weather in Paris?"}, calls[0],
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees"}])
    assert follow.usage.input_tokens > called.usage.input_tokens, (follow, called)
    assert isinstance(follow.output_text, str), follow
    report("tools", city=city, answer=follow.output_text)

    for extra in [{"tools": [{"type": "web_search"}]}, {"previous_response_id": "resp_1"},
                  {"store": True}]:
        try:
            client.responses.create(model=model, input=question, max_output_tokens=4, **extra)
            raise AssertionError(f"accepted {extra}")
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
    report("refusals")


if __name__ == "__main__":
    main()
