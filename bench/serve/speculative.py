#!/usr/bin/env python3
"""Speculative decoding by n-gram lookup against plain decoding, on Kiln's
server with the same model, one request at a time (batch 1, where a step's
cost is reading the weights and drafts verified in the same step come
nearly free): tasks whose answers copy from their prompts (editing code,
quoting, extracting), greedy, each answer compared between the two runs;
then all of them at once (drafted and plain rows sharing steps).

    bench/serve/speculative.py [--model GGUF] [--rounds 2] [--max-tokens 256]
        [--config '{"method": "ngram", "num_speculative_tokens": 4,
                    "prompt_lookup_max": 5, "prompt_lookup_min": 3}']
        [--out bench/results/speculative-DATE.md]

Environment: HOST (default target/release/host), THREADS (2). One server at
a time; the servers take turns per round, each answering a warm-up first.
The table holds, per task, tokens generated, the medians of the output
rates, and the draft tokens verified and kept (from /metrics).
"""

import argparse
import concurrent.futures
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_llama_server import ROOT, cpu_model, free_port, wait_healthy  # noqa: E402

CODE = '''def mean(values):
    total = 0
    for value in values:
        total += value
    return total / len(values)


def variance(values):
    m = mean(values)
    total = 0
    for value in values:
        total += (value - m) ** 2
    return total / len(values)
'''

TEXT = (
    "Kiln is a Rust system that takes model architectures as dynamically loaded plugins, "
    "compiles their graphs for CPU and GPU, and serves them through an OpenAI-compatible "
    "server with continuous batching and a paged KV cache. Each architecture is a plugin "
    "written exactly as a third party would write it."
)

TASKS = [
    ("rename in code", f"Rewrite this Python code, renaming the variable `total` to `acc`. "
     f"Answer with the code only.\n\n```python\n{CODE}```"),
    ("repeat a paragraph", f"Repeat the following paragraph exactly, word for word:\n\n{TEXT}"),
    ("extract sentences", f"Copy the sentences of this text that mention plugins:\n\n{TEXT}"),
    ("free answer", "Write a short story about a lighthouse keeper."),
]


ALL_AT_ONCE = "all four at once"


def post(url, body):
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())


def counter(url, name):
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "_total"):
                return float(line.split()[-1])
    return 0.0


def run_server(host, model, threads, extra, rounds_results, label, max_tokens):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="kiln-spec-", suffix=".log", delete=False).name
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    with open(log, "w") as out:
        process = subprocess.Popen(
            [host, "serve", "--model", model, "--port", str(port), *extra],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(url, process, log)
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
            served = json.loads(r.read())["data"][0]["id"]
        chat = lambda content, n: post(f"{url}/v1/chat/completions", {
            "model": served, "messages": [{"role": "user", "content": content}],
            "temperature": 0, "max_tokens": n})
        chat("Hello", 8)
        # All tasks at once: drafted and plain rows share each step.
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(TASKS)) as pool:
            answers = list(pool.map(lambda task: chat(task[1], max_tokens), TASKS))
        wall = time.perf_counter() - start
        rounds_results.setdefault((label, ALL_AT_ONCE), []).append({
            "wall_s": wall, "tokens": sum(a["usage"]["completion_tokens"] for a in answers),
            "text": json.dumps([a["choices"][0]["message"]["content"] for a in answers]),
            "drafts": 0, "accepted": 0})
        for name, prompt in TASKS:
            before = (counter(url, "vllm:spec_decode_num_draft_tokens"),
                      counter(url, "vllm:spec_decode_num_accepted_tokens"))
            start = time.perf_counter()
            answer = chat(prompt, max_tokens)
            wall = time.perf_counter() - start
            after = (counter(url, "vllm:spec_decode_num_draft_tokens"),
                     counter(url, "vllm:spec_decode_num_accepted_tokens"))
            tokens = answer["usage"]["completion_tokens"]
            rounds_results.setdefault((label, name), []).append({
                "wall_s": wall, "tokens": tokens,
                "text": answer["choices"][0]["message"]["content"],
                "drafts": after[0] - before[0], "accepted": after[1] - before[1]})
    finally:
        process.terminate()
        process.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "target/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--config", default=json.dumps({
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, "prompt_lookup_min": 3}))
    parser.add_argument("--out")
    args = parser.parse_args()
    host = os.environ.get("HOST", os.path.join(ROOT, "target/release/host"))
    threads = int(os.environ.get("THREADS", "2"))
    results = {}
    engines = [("plain", []), ("ngram", ["--speculative-config", args.config])]
    for round_ in range(args.rounds):
        for label, extra in engines[round_ % 2:] + engines[:round_ % 2]:
            run_server(host, args.model, threads, extra, results, label, args.max_tokens)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    name, simd, cores = cpu_model()
    lines = [
        "# Speculative decoding (n-gram lookup) against plain decoding, one request at a time and four at once",
        "",
        f"- date: {datetime.date.today()}; commit: {commit}",
        f"- machine: {name} ({cores} cores; {', '.join(simd)}), {threads} threads",
        f"- model: `{os.path.relpath(args.model, ROOT)}`, greedy chat answers of up to "
        f"{args.max_tokens} tokens; `--speculative-config '{args.config}'`",
        f"- medians over {args.rounds} rounds (`bench/serve/speculative.py`)",
        "",
        "| task | tokens | plain tok/s | ngram tok/s | ratio | drafts kept | same text |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for task in [name for name, _ in TASKS] + [ALL_AT_ONCE]:
        plain, ngram = results[("plain", task)], results[("ngram", task)]
        rate = lambda runs: statistics.median(r["tokens"] / r["wall_s"] for r in runs)
        same = all(r["text"] == plain[0]["text"] for r in plain + ngram)
        kept = f"{int(ngram[0]['accepted'])} of {int(ngram[0]['drafts'])}" if task != ALL_AT_ONCE else "-"
        lines.append(f"| {task} | {plain[0]['tokens']} | {rate(plain):.1f} | {rate(ngram):.1f} | "
                     f"{rate(ngram) / rate(plain):.2f}x | {kept} | {'yes' if same else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".jsonl", "w") as f:
            for (label, task), runs in results.items():
                for run in runs:
                    f.write(json.dumps({"engine": label, "task": task, **run}) + "\n")


if __name__ == "__main__":
    main()
