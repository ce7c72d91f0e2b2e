#!/usr/bin/env python3
"""The official `openai` client's embeddings API against `host serve` of
all-MiniLM-L6-v2, checked against sentence-transformers' embeddings
(tests/fixtures/reference/minilm_embeddings.json).

Usage: embeddings_client.py BASE_URL MODEL REFERENCE_JSON
Prints one JSON line per check; exits non-zero on the first failure.
"""

import base64
import json
import math
import struct
import sys

import openai

BASE_URL, MODEL, REFERENCE = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=BASE_URL, api_key="unused", max_retries=0)
with open(REFERENCE, encoding="utf-8") as f:
    ref = json.load(f)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def worst_cosine(vectors, expected):
    assert len(vectors) == len(expected), (len(vectors), len(expected))
    return min(cosine(v, e) for v, e in zip(vectors, expected))


# Every reference sentence in one request, as floats.
reply = client.embeddings.create(model=MODEL, input=ref["sentences"], encoding_format="float")
assert reply.model == MODEL and reply.object == "list"
assert [d.index for d in reply.data] == list(range(len(ref["sentences"])))
assert reply.usage.prompt_tokens == sum(len(ids) for ids in ref["ids"]), reply.usage
worst = worst_cosine([d.embedding for d in reply.data], ref["embeddings"])
assert worst >= 0.9999, worst
report("floats", inputs=len(reply.data), worst_cosine=worst)

# base64: little-endian float32, the same vectors.
raw = client.embeddings.with_raw_response.create(
    model=MODEL, input=ref["sentences"][:3], encoding_format="base64"
)
body = json.loads(raw.text)
decoded = [
    list(struct.unpack(f"<{len(base64.b64decode(d['embedding'])) // 4}f", base64.b64decode(d["embedding"])))
    for d in body["data"]
]
worst = worst_cosine(decoded, ref["embeddings"][:3])
assert worst >= 0.9999, worst
report("base64", worst_cosine=worst)

# The client's default (it asks for base64 and decodes it itself).
reply = client.embeddings.create(model=MODEL, input=ref["sentences"][3])
worst = worst_cosine([reply.data[0].embedding], [ref["embeddings"][3]])
assert worst >= 0.9999, worst
report("client_default", worst_cosine=worst)

# Token ids in: the reference tokenizer's ids give the same vectors.
reply = client.embeddings.create(model=MODEL, input=ref["ids"][4:6], encoding_format="float")
worst = worst_cosine([d.embedding for d in reply.data], ref["embeddings"][4:6])
assert worst >= 0.9999, worst
report("token_ids", worst_cosine=worst)

# Concurrent requests (which the worker may batch together) each get their own vectors.
import concurrent.futures

with concurrent.futures.ThreadPoolExecutor(8) as pool:
    replies = list(
        pool.map(
            lambda i: client.embeddings.create(model=MODEL, input=ref["sentences"][i], encoding_format="float"),
            range(16),
        )
    )
worst = worst_cosine([r.data[0].embedding for r in replies], ref["embeddings"][:16])
assert worst >= 0.9999, worst
report("concurrent", requests=len(replies), worst_cosine=worst)

# vLLM's truncate_prompt_tokens: a text cut to k tokens as transformers'
# `truncation=True, max_length=k` cuts it (its first k - 1 ids and [SEP]),
# and a text too long for the model cut to the model's 256 with -1.
longest = max(range(len(ref["ids"])), key=lambda i: len(ref["ids"][i]))
ids, k = ref["ids"][longest], 9
reply = client.embeddings.create(
    model=MODEL, input=ref["sentences"][longest], encoding_format="float", extra_body={"truncate_prompt_tokens": k}
)
assert reply.usage.prompt_tokens == k, reply.usage
cut = client.embeddings.create(model=MODEL, input=[ids[: k - 1] + ids[-1:]], encoding_format="float")
worst = worst_cosine([reply.data[0].embedding], [cut.data[0].embedding])
assert worst >= 0.999999, worst
reply = client.embeddings.create(model=MODEL, input="word " * 400, extra_body={"truncate_prompt_tokens": -1})
assert reply.usage.prompt_tokens == 256, reply.usage
report("truncation", worst_cosine=worst)


def refused(param, **kwargs):
    try:
        client.embeddings.create(model=MODEL, **kwargs)
    except openai.BadRequestError as e:
        error = e.body if isinstance(e.body, dict) else {}
        assert error.get("param") == param, (param, e.body)
        return str(error.get("message"))
    raise AssertionError(f"accepted {kwargs}")


messages = {
    "unknown_field": refused("temperature", input="hi", extra_body={"temperature": 0.5}),
    "format": refused("encoding_format", input="hi", encoding_format="int8"),
    "dimensions": refused("dimensions", input="hi", dimensions=16),
    "too_long": refused("input", input="word " * 400),
    "truncate_ids": refused("truncate_prompt_tokens", input=[[101, 102]], extra_body={"truncate_prompt_tokens": 2}),
    "truncate_past_model": refused("truncate_prompt_tokens", input="hi", extra_body={"truncate_prompt_tokens": 257}),
    "empty": refused("input", input=[]),
    "out_of_vocabulary": refused("input", input=[[1, 2, 10**6]]),
}
try:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    raise AssertionError("chat accepted by an embedding model")
except openai.BadRequestError as e:
    messages["chat"] = str(e.body)
try:
    client.embeddings.create(model="other", input="hi")
    raise AssertionError("another model name accepted")
except openai.NotFoundError as e:
    messages["model"] = str(e.body)
report("errors", **messages)
