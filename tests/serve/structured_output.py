#!/usr/bin/env python3
"""Structured output through the official `openai` client against a running
`host serve`: Pydantic models with `chat.completions.parse` over varied
prompts (greedy and sampled, n > 1), streaming, vLLM's `structured_outputs`
(regex, choice, Lark grammar, json_object) and the completions endpoint.

    structured_output.py BASE_URL MODEL

Prints one JSON line per check; exits non-zero on the first failure.
"""

import json
import re
import sys
import time
from typing import List, Literal

import openai
from pydantic import BaseModel, Field


# Every field is bounded (strings by length, numbers by range, lists by
# count), so every output the grammar allows ends within max_tokens: a tiny
# model would otherwise happily write digits forever, inside the grammar.
class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=40)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    hobbies: List[str] = Field(max_length=3)


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confidence: int = Field(ge=0, le=100)


PROMPTS = [
    (City, "Give me facts about Paris as JSON."),
    (City, "Describe Tokyo."),
    (City, "Which city is the capital of Italy? Answer in JSON."),
    (City, "Tell me about a big city in Brazil."),
    (City, "What is the largest city in Canada?"),
    (City, "Name a city on the Danube."),
    (City, "A city famous for its canals."),
    (Person, "Invent a person who likes hiking."),
    (Person, "Describe a retired teacher."),
    (Person, "Create a character for a fantasy novel."),
    (Person, "Who is a typical software engineer?"),
    (Person, "Make up a profile of a chef."),
    (Person, "Describe your best friend."),
    (Person, "A musician from Vienna."),
    (Verdict, "Is the sky blue?"),
    (Verdict, "Is 7 a prime number?"),
    (Verdict, "Can penguins fly?"),
    (Verdict, "Is water wet?"),
    (Verdict, "Is Paris in Germany?"),
    (Verdict, "Do cats bark?"),
    (Verdict, "Is the Earth round?"),
    (City, "Where would you go for a holiday?"),
]


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)

    # Pydantic models through .parse: the output parses every time.
    tokens, seconds = 0, 0.0
    for i, (schema, prompt) in enumerate(PROMPTS):
        sampled = i % 2 == 1
        start = time.monotonic()
        completion = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            response_format=schema,
            max_tokens=256,
            temperature=0.8 if sampled else 0.0,
            seed=i,
        )
        seconds += time.monotonic() - start
        tokens += completion.usage.completion_tokens
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", (prompt, choice)
        assert isinstance(choice.message.parsed, schema), (prompt, choice.message.content)
    report("parse", prompts=len(PROMPTS), completion_tokens=tokens,
           tok_per_s=round(tokens / seconds, 1))

    # n choices in one batch, each parsed.
    completion = client.chat.completions.parse(
        model=model, messages=[{"role": "user", "content": "Describe Berlin."}],
        response_format=City, n=3, temperature=1.0, seed=5, max_tokens=256)
    assert len(completion.choices) == 3
    for choice in completion.choices:
        assert isinstance(choice.message.parsed, City), choice.message.content
    report("parse_n")

    # Streaming with a JSON schema: the joined deltas parse.
    schema = Verdict.model_json_schema()
    schema["additionalProperties"] = False
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Is snow cold?"}],
        response_format={"type": "json_schema", "json_schema": {
            "name": "verdict", "schema": schema, "strict": True}},
        stream=True, max_tokens=128)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    Verdict.model_validate_json(text)
    report("stream", text=text)

    # json_object: any JSON object.
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give me a JSON object about dogs."}],
        response_format={"type": "json_object"}, max_tokens=256,
        extra_body={"structured_outputs": None})
    content = completion.choices[0].message.content
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict), content
    report("json_object", finish_reason=completion.choices[0].finish_reason)

    # vLLM's structured_outputs: regex, choice, grammar.
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Give me a phone number."}],
        max_tokens=32, extra_body={"structured_outputs": {"regex": r"\d{3}-\d{4}"}})
    content = completion.choices[0].message.content
    assert re.fullmatch(r"\d{3}-\d{4}", content), content
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Is this review positive? 'Great food!'"}],
        max_tokens=8, temperature=1.0, seed=3,
        extra_body={"structured_outputs": {"choice": ["positive", "negative"]}})
    assert completion.choices[0].message.content in ("positive", "negative"), completion
    grammar = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]+/'
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}],
        max_tokens=16, extra_body={"structured_outputs": {"grammar": grammar}})
    content = completion.choices[0].message.content
    assert re.fullmatch(r"The answer is [0-9]+\.", content), content
    report("structured_outputs", grammar_output=content)

    # The completions endpoint takes them too.
    completion = client.completions.create(
        model=model, prompt="The opposite of hot is", max_tokens=8,
        extra_body={"structured_outputs": {"choice": [" cold", " warm"]}})
    assert completion.choices[0].text in (" cold", " warm"), completion
    report("completions")

    # A schema llguidance cannot compile, and two ways of asking: 400s.
    for body in [{"structured_outputs": {"regex": "("}},
                 {"structured_outputs": {"choice": ["a"]}, "guided_regex": "b"}]:
        try:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                extra_body=body)
            raise AssertionError(f"accepted {body}")
        except openai.BadRequestError as e:
            assert e.status_code == 400
    report("refusals")


if __name__ == "__main__":
    main()
