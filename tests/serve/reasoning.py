#!/usr/bin/env python3
"""A reasoning parser through the official `openai` client against a running
`host serve --reasoning-parser deepseek_r1` (SmolLM2, which writes
`<think>...</think>` before its answer when shown two examples):

- split: the thinking comes back as `reasoning_content`, the answer as
  `content`, and the two with their markers are the raw output (the same
  prompt's tokens on /v1/completions, which no parser reads);
- stream: the streamed deltas add up to the same two fields;
- cut: an output cut before `</think>` is all thinking;
- structured: a regex that the thinking breaks constrains the answer only;
- prompt_ended: a prompt ending with `</think>` makes the output all answer;
- history: a returned message, thinking included, is taken back in the
  conversation;
- responses: the Responses API returns the thinking as a reasoning item,
  whole and streamed;
- messages: Anthropic's Messages API returns it as a thinking block.

    reasoning.py BASE_URL MODEL

Prints one JSON line per check; exits non-zero on the first failure.
"""

import json
import re
import sys
import urllib.request

import anthropic
import openai

EXAMPLES = [
    {"role": "system", "content": "You think inside <think></think> tags, then answer."},
    {"role": "user", "content": "What is 1+1?"},
    {"role": "assistant", "content": "<think>One plus one.</think>2"},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>Two plus two.</think>4"},
    {"role": "user", "content": "What is 3+3?"},
]


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def fields(message):
    """A message's or delta's thinking and answer (vLLM's extra field)."""
    return getattr(message, "reasoning_content", None), message.content


def main():
    base_url, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    ask = dict(model=model, messages=EXAMPLES, max_tokens=40, temperature=0)

    whole = client.chat.completions.create(**ask)
    thinking, answer = fields(whole.choices[0].message)
    assert thinking and answer, whole
    assert whole.choices[0].message.model_extra["reasoning"] == thinking, whole
    # The raw output of the same prompt tokens.
    request = urllib.request.Request(
        base_url.removesuffix("/v1") + "/tokenize",
        json.dumps({"model": model, "messages": EXAMPLES}).encode(),
        {"content-type": "application/json"},
    )
    tokens = json.load(urllib.request.urlopen(request))["tokens"]
    raw = client.completions.create(model=model, prompt=tokens, max_tokens=40, temperature=0)
    raw = raw.choices[0].text
    assert raw.lstrip().removeprefix("<think>") == f"{thinking}</think>{answer}", (raw, whole)
    report("split", raw=raw, reasoning_content=thinking, content=answer)

    stream = client.chat.completions.create(**ask, stream=True)
    streamed_thinking, streamed_answer, finish = "", "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        t, a = fields(delta)
        streamed_thinking += t or ""
        streamed_answer += a or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (streamed_thinking, streamed_answer) == (thinking, answer), (streamed_thinking, streamed_answer)
    assert finish == whole.choices[0].finish_reason, finish
    report("stream")

    cut = client.chat.completions.create(**{**ask, "max_tokens": 6})
    assert cut.choices[0].finish_reason == "length", cut
    thinking_cut, answer_cut = fields(cut.choices[0].message)
    assert thinking_cut and answer_cut is None, cut
    report("cut", reasoning_content=thinking_cut)

    # Three capitals: the thinking, in words, could not start under it.
    structured = client.chat.completions.create(
        **ask, extra_body={"structured_outputs": {"regex": "[A-Z]{3}"}})
    thinking_s, answer_s = fields(structured.choices[0].message)
    assert thinking_s and not re.fullmatch("[A-Z]{3}", thinking_s), structured
    assert re.fullmatch("[A-Z]{3}", answer_s or ""), structured
    report("structured", reasoning_content=thinking_s, content=answer_s)

    ended = client.chat.completions.create(
        **{**ask, "messages": EXAMPLES + [{"role": "assistant", "content": "<think>Three plus three.</think>"}]},
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    thinking_e, answer_e = fields(ended.choices[0].message)
    assert thinking_e is None and answer_e, ended
    report("prompt_ended", content=answer_e)

    # The answer with its thinking back in the history, as the client
    # replays a message: accepted, and left to the template (SmolLM2's
    # drops it: the same prompt as without it).
    follow = [{"role": "user", "content": "And 4+4?"}]
    replayed = client.chat.completions.create(
        **{**ask, "max_tokens": 1, "messages": EXAMPLES + [whole.choices[0].message] + follow})
    plain = client.chat.completions.create(
        **{**ask, "max_tokens": 1, "messages": EXAMPLES + [{"role": "assistant", "content": answer}] + follow})
    assert replayed.usage.prompt_tokens == plain.usage.prompt_tokens, (replayed, plain)
    differing = {"role": "assistant", "content": answer, "reasoning_content": "a", "reasoning": "b"}
    try:
        client.chat.completions.create(**{**ask, "messages": EXAMPLES + [differing] + follow})
        raise AssertionError("accepted two different thinkings")
    except openai.BadRequestError as e:
        assert "differ" in str(e), e
    report("history")

    # The Responses API: the thinking as a reasoning item, before the
    # message; streamed through the SDK's helper alike.
    response = client.responses.create(model=model, input=EXAMPLES, max_output_tokens=40, temperature=0)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"], response
    assert response.output[0].content[0].text == thinking and response.output_text == answer, response
    with client.responses.stream(model=model, input=EXAMPLES, max_output_tokens=40, temperature=0) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.reasoning_text.delta")
        final = stream.get_final_response()
    assert streamed == thinking and final.output_text == answer, (streamed, final)
    assert final.output[0].content[0].text == thinking, final
    report("responses")

    # Anthropic's Messages API: the thinking as a thinking block.
    messages = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key="none", max_retries=0)
    asked = dict(model=model, system=EXAMPLES[0]["content"], messages=EXAMPLES[1:], max_tokens=40,
                 extra_body={"temperature": 0})
    message = messages.messages.create(**asked)
    assert [b.type for b in message.content] == ["thinking", "text"], message
    assert message.content[0].thinking == thinking and message.content[1].text == answer, message
    with messages.messages.stream(**asked) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"], final
    assert final.content[0].thinking == thinking and final.content[1].text == answer, final
    report("messages")


if __name__ == "__main__":
    main()
