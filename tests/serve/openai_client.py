"""Drives `host serve` with the official `openai` Python client.

Usage: openai_client.py BASE_URL MODEL_NAME API_KEY
Prints one JSON object per check to stdout (the Rust test reads them) and
exits non-zero on the first failed assertion.
"""

import json
import sys
import threading

import openai

base_url, model, api_key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def report(name, **values):
    print(json.dumps({"check": name, **values}), flush=True)


# Chat, greedy, non-streaming.
chat = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=16, temperature=0)
choice = chat.choices[0]
assert choice.message.role == "assistant"
assert "Paris" in choice.message.content, choice.message.content
assert chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens > 0
report("chat", content=choice.message.content, finish_reason=choice.finish_reason)

# Chat streaming with usage.
pieces, usage, finish = [], None, None
for chunk in client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
streamed = "".join(pieces)
assert streamed == choice.message.content, (streamed, choice.message.content)
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens
report("chat_stream", content=streamed, finish_reason=finish)

# Log-probabilities, also when streaming.
lp = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content)
assert all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content)
streamed_lp = []
for chunk in client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2, stream=True):
    for c in chunk.choices:
        if c.logprobs and c.logprobs.content:
            streamed_lp.extend(c.logprobs.content)
assert [t.token for t in streamed_lp] == [t.token for t in content]
# vLLM's return_tokens_as_token_ids names the same tokens by id.
as_ids = client.chat.completions.create(
    model=model, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3,
    extra_body={"return_tokens_as_token_ids": True},
).choices[0].logprobs.content
assert [t.logprob for t in as_ids] == [t.logprob for t in content], (as_ids, content)
for named, texted in zip(as_ids, content):
    assert named.token.startswith("token_id:") and named.bytes == list(named.token.encode()), named
    detokenize = base_url.rsplit("/v1", 1)[0] + "/detokenize"
    ids = client.post(detokenize, cast_to=object, body={"tokens": [int(named.token[len("token_id:"):])]})
    assert ids["prompt"] == texted.token, (ids, texted)
report("logprobs", tokens=[t.token for t in content])

# Completions: text prompt, token-id prompt, echo, legacy logprobs.
comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2)
assert comp.choices[0].logprobs and len(comp.choices[0].logprobs.tokens) == comp.usage.completion_tokens
echo = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0, echo=True)
assert echo.choices[0].text.startswith("The capital of France is")
ids = client.completions.create(model=model, prompt=[504, 3575, 282, 4649, 314], max_tokens=4, temperature=0)
assert ids.usage.prompt_tokens == 5
report("completions", text=comp.choices[0].text)

# Stop strings end generation and are not returned, unless vLLM's
# include_stop_str_in_output asks for them; skip_special_tokens=false with
# it keeps the end-of-turn token's text.
stopped = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=32, temperature=0, stop=[" 7"])
assert " 7" not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop", stopped.choices[0]
included = client.completions.create(
    model=model, prompt="1, 2, 3, 4,", max_tokens=32, temperature=0, stop=[" 7"],
    extra_body={"include_stop_str_in_output": True},
)
assert included.choices[0].text == stopped.choices[0].text + " 7", (included.choices[0], stopped.choices[0])
# vLLM's stop_reason: the stop string, a stop token id, or null.
assert stopped.choices[0].to_dict()["stop_reason"] == " 7", stopped.choices[0]
first = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=1, temperature=0, logprobs=0,
                                  extra_body={"return_tokens_as_token_ids": True})
first_id = int(first.choices[0].logprobs.tokens[0][len("token_id:"):])
by_token = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=8, temperature=0,
                                     extra_body={"stop_token_ids": [first_id]})
assert by_token.choices[0].finish_reason == "stop" and by_token.choices[0].to_dict()["stop_reason"] == first_id, by_token
hello = [{"role": "user", "content": "Hi"}]
plain = client.chat.completions.create(model=model, messages=hello, max_tokens=48, temperature=0)
assert plain.choices[0].finish_reason == "stop" and plain.choices[0].to_dict()["stop_reason"] is None, plain.choices[0]
special = client.chat.completions.create(
    model=model, messages=hello, max_tokens=48, temperature=0,
    extra_body={"include_stop_str_in_output": True, "skip_special_tokens": False},
)
assert special.choices[0].message.content == plain.choices[0].message.content + "<|im_end|>", special.choices[0]
report("stop", text=stopped.choices[0].text)

# Seeds reproduce; n gives several choices.
a = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=1234)
b = client.completions.create(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=1234)
assert a.choices[0].text == b.choices[0].text
several = client.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=1.0, n=3, seed=7)
assert sorted(c.index for c in several.choices) == [0, 1, 2]
report("seed", text=a.choices[0].text)

# Errors are OpenAI-shaped.
try:
    client.chat.completions.create(model="no-such-model", messages=QUESTION, max_tokens=4)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert "does not exist" in str(e)
try:
    client.completions.create(model=model, prompt="hi " * 9000, max_tokens=4)
    raise AssertionError("over-long prompt accepted")
except openai.BadRequestError as e:
    assert "maximum context length" in str(e)
try:
    client.completions.create(model=model, prompt="hi", max_tokens=4, temperature=-1)
    raise AssertionError("negative temperature accepted")
except openai.BadRequestError as e:
    assert "temperature" in str(e)
report("errors")

# logit_bias is honoured: +100 on token 504 makes greedy pick it every time
# (the text is that of [504, 504, 504], which an echo of those ids starts with).
plain = client.completions.create(model=model, prompt="The capital of France is", max_tokens=3, temperature=0)
biased = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=3, temperature=0, logit_bias={"504": 100}
).choices[0].text
echoed = client.completions.create(model=model, prompt=[504, 504, 504], max_tokens=1, temperature=0, echo=True).choices[0].text
assert biased and echoed.startswith(biased) and biased != plain.choices[0].text, (biased, echoed, plain.choices[0].text)
report("logit_bias", text=biased)

# What the server does not implement is refused, naming the field, never
# accepted and ignored.
refusals = [
    ("response_format", lambda: client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=4, response_format={"type": "xml"})),
    ("functions", lambda: client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=4,
        functions=[{"name": "f", "parameters": {"type": "object"}}])),
    ("best_of", lambda: client.completions.create(model=model, prompt="hi", max_tokens=4, best_of=2)),
    ("frobnicate", lambda: client.completions.create(model=model, prompt="hi", max_tokens=4, extra_body={"frobnicate": 1})),
    ("name", lambda: client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi", "name": "bob"}], max_tokens=4)),
]
for field, call in refusals:
    try:
        call()
        raise AssertionError(f"{field} accepted")
    except openai.BadRequestError as e:
        assert field in str(e), (field, str(e))
report("refusals", fields=[f for f, _ in refusals])

# Concurrency: 32 clients, mixed lengths, some leave mid-stream. Every
# completed answer must equal the same request run alone.
def job(i):
    return f"Item {i % 6}: " + "word " * (i % 6) * 9, 4 + i % 6


expected = {}
for i in range(6):
    prompt, max_tokens = job(i)
    expected[i] = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0).choices[0].text
results, failures = {}, []


def worker(i):
    try:
        if i % 4 == 3:
            # Disconnect after the first chunk.
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Count to {20 + i}."}], max_tokens=64, temperature=0, stream=True
            )
            next(iter(stream))
            stream.close()
            results[i] = "left"
            return
        prompt, max_tokens = job(i)
        out = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
        assert out.choices[0].finish_reason in ("stop", "length")
        assert out.choices[0].text == expected[i % 6], (i, out.choices[0].text, expected[i % 6])
        results[i] = out.choices[0].text
    except Exception as e:  # noqa: BLE001 - reported below
        failures.append(f"{i}: {e!r}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not failures, failures
assert len(results) == 32
report("concurrency", finished=sum(1 for v in results.values() if v != "left"), left=sum(1 for v in results.values() if v == "left"))


# The Model Server Protocol: vLLM's metric names with a model_name label,
# parsed as OpenMetrics by prometheus_client.
import urllib.request  # noqa: E402

from prometheus_client.openmetrics.parser import text_string_to_metric_families  # noqa: E402

with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics") as r:
    assert r.headers["content-type"].startswith("application/openmetrics-text"), r.headers["content-type"]
    families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
wanted = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
    "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
    # Kiln's own: the engine thread's steps, its own work and its waits for the device.
    "kiln:engine_steps": "counter", "kiln:engine_host_seconds": "counter",
    "kiln:engine_device_wait_seconds": "counter",
}
for name, kind in wanted.items():
    assert name in families and families[name].type == kind, (name, families.get(name))
    assert all(s.labels.get("model_name") == model for s in families[name].samples), families[name]
reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
assert reasons <= {"stop", "length"} and reasons, reasons
generated = sum(s.value for s in families["vllm:generation_tokens"].samples)
assert generated > 0
steps = sum(s.value for s in families["kiln:engine_steps"].samples)
assert steps > 0 and sum(s.value for s in families["kiln:engine_host_seconds"].samples) > 0, steps
report("metrics", families=len(wanted), generation_tokens=generated)
