"""The prompt's log-probabilities over `host serve`, with the official
`openai` client: `echo` with `logprobs` on completions (as lm-evaluation-
harness scores a context and its continuation), vLLM's `prompt_logprobs`
on completions and chat (completions streamed too), and what is refused.

Usage: prompt_logprobs.py BASE_URL MODEL_NAME EXPECTED
EXPECTED: JSON {"ids": prompt ids, "logprobs": each later prompt token's
log-probability under transformers' fp32 logits}. Prints one JSON object per
check; exits non-zero on the first failed assertion.
"""

import json
import sys

import openai

base_url, model, expected = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
ids, want = expected["ids"], expected["logprobs"]
TOLERANCE = 2e-3


def report(name, **values):
    print(json.dumps({"check": name, **values}), flush=True)


def close(got, wanted, what):
    assert len(got) == len(wanted), (what, got, wanted)
    worst = max(abs(g - w) for g, w in zip(got, wanted))
    assert worst < TOLERANCE, (what, worst, got, wanted)
    return worst


# echo + logprobs: the prompt's tokens first (the first without a
# log-probability), then the one generated token; offsets over the texts.
echo = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=2)
lp = echo.choices[0].logprobs
assert len(lp.tokens) == len(ids) + 1, lp.tokens
assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
prompt_text = "".join(lp.tokens[: len(ids)])
assert echo.choices[0].text.startswith(prompt_text), (echo.choices[0].text, prompt_text)
worst = close(lp.token_logprobs[1 : len(ids)], want, "echo")
assert all(len(top) >= 1 for top in lp.top_logprobs[1:]), lp.top_logprobs
assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))], lp.text_offset
report("echo", worst=worst, tokens=lp.tokens)

# vLLM's prompt_logprobs on completions: by token id, with rank and text.
scored = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0, extra_body={"prompt_logprobs": 2})
entries = scored.choices[0].model_extra["prompt_logprobs"]
assert len(entries) == len(ids) and entries[0] is None, entries
own = [entries[p][str(ids[p])] for p in range(1, len(ids))]
worst = close([e["logprob"] for e in own], want, "prompt_logprobs")
for p in range(1, len(ids)):
    ranks = sorted(e["rank"] for e in entries[p].values())
    assert 2 <= len(entries[p]) <= 3 and ranks[0] == 1, entries[p]
    best = max(e["logprob"] for e in entries[p].values())
    assert entries[p][str(ids[p])]["logprob"] <= best + 1e-6, entries[p]
report("prompt_logprobs", worst=worst, ranks=[e["rank"] for e in own])

# On chat, once for the response, over the rendered prompt's tokens.
chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 0}
)
chat_entries = chat.model_extra["prompt_logprobs"]
assert len(chat_entries) == chat.usage.prompt_tokens and chat_entries[0] is None, chat_entries
assert all(len(e) == 1 and all(v["logprob"] <= 0 for v in e.values()) for e in chat_entries[1:]), chat_entries
report("chat_prompt_logprobs", positions=len(chat_entries))

# Streamed completions: the echo's chunk carries the prompt's
# log-probabilities (and vLLM's prompt_logprobs), then the tokens follow.
chunks = list(client.completions.create(
    model=model, prompt=ids, max_tokens=2, temperature=0, echo=True, logprobs=1, stream=True,
    extra_body={"prompt_logprobs": 1},
))
first = chunks[0].choices[0]
assert first.text == echo.choices[0].text[: len(first.text)] and first.text.startswith(prompt_text), first.text
assert first.logprobs.token_logprobs[0] is None and len(first.logprobs.tokens) == len(ids), first.logprobs
worst = close(first.logprobs.token_logprobs[1:], want, "streamed echo")
assert len(first.model_extra["prompt_logprobs"]) == len(ids), first.model_extra
streamed = "".join(c.choices[0].text for c in chunks if c.choices)
assert streamed.startswith(prompt_text) and len(streamed) > len(prompt_text), streamed
report("stream", worst=worst, chunks=len(chunks))

# Refused by name: more than 20 alternatives, and a streamed chat's.
try:
    client.completions.create(model=model, prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 21})
    raise AssertionError("accepted 21 alternatives")
except openai.BadRequestError as e:
    assert e.body.get("param") == "prompt_logprobs" and "20" in e.body.get("message", ""), e.body
try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, stream=True, extra_body={"prompt_logprobs": 1}
    )
    raise AssertionError("accepted a streamed chat's prompt_logprobs")
except openai.BadRequestError as e:
    assert e.body.get("param") == "prompt_logprobs", e.body
report("refusals")
