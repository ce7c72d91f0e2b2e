#!/usr/bin/env python3
"""Kiln's server against llama.cpp's llama-server, built natively on this
machine, on the same GGUF at 1, 4 and 16 concurrent streams, measured by the
same online load generator (`host benchmark --url`). See README.md here.

    bench/serve/compare_llama_server.py [--model GGUF] [--rounds 2]
        [--concurrency 1 4 16] [--input-len 128] [--output-len 128]
        [--out bench/results/serve-vs-llama-server-DATE.md]

Environment: HOST (default target/release/host), LLAMA_SERVER (default
/work/llama-server-build/bin/llama-server, built by build_llama_server.sh),
THREADS (2).

One server runs at a time (two would share the cores). Per round, the engines
(Kiln --precision exact, Kiln --precision fast, llama-server) take turns in
a rotating order; each starts fresh, answers one warm-up request, then serves
each concurrency level with `--num-prompts max(8, 4 x concurrency)` requests
of `--input-len` random words and exactly `--output-len` tokens (greedy,
`ignore_eos`), all sent at once under `--max-concurrency`. The table holds
medians over rounds; the raw JSON of every run goes beside it (`.jsonl`).
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_model():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    name = next(l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name"))
    flags = set(next(l for l in info.splitlines() if l.startswith("flags")).split(":", 1)[1].split())
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16") if f in flags]
    return name, simd, os.cpu_count()


def wait_healthy(url, process, log, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"the server exited:\n{open(log).read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"the server did not answer /health in {timeout} s:\n{open(log).read()[-3000:]}")


def start(engine, args, port, log):
    slots = max(args.concurrency)
    if engine.startswith("kiln"):
        precision = engine.split("-", 1)[1]
        command = [args.host, "serve", "--model", args.model, "--port", str(port),
                   "--served-model-name", "smollm2", "--max-num-seqs", str(slots),
                   "--precision", precision]
    else:
        context = slots * (args.input_len * 2 + args.output_len + 16)
        command = [args.llama_server, "-m", args.model, "--port", str(port), "-t", str(args.threads),
                   "-tb", str(args.threads), "-np", str(slots), "-c", str(context), "--no-webui",
                   "-a", "smollm2"]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    process = subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    return process


def load(args, url, concurrency, prompts):
    command = [args.host, "benchmark", "--url", url, "--model", "smollm2", "--num-prompts", str(prompts),
               "--max-concurrency", str(concurrency), "--input-len", str(args.input_len),
               "--output-len", str(args.output_len), "--json"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["failed"]:
        sys.exit(f"{result['failed']} requests failed: {result['errors'][:3]}")
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="/work/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.host = os.environ.get("HOST", os.path.join(ROOT, "target/release/host"))
    args.llama_server = os.environ.get("LLAMA_SERVER", "/work/llama-server-build/bin/llama-server")
    args.threads = int(os.environ.get("THREADS", "2"))
    for path in (args.host, args.llama_server, args.model):
        if not os.path.exists(path):
            sys.exit(f"missing {path} (see bench/serve/README.md)")
    date = datetime.date.today().isoformat()
    out = args.out or os.path.join(ROOT, f"bench/results/serve-vs-llama-server-{date}.md")

    engines = ["kiln-exact", "kiln-fast", "llama-server"]
    runs = []
    raw = open(os.path.splitext(out)[0] + ".jsonl", "w")
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = engines[round_ % 3:] + engines[:round_ % 3]
            for engine in order:
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                log = os.path.join(tmp, f"{engine}-{round_}.log")
                process = start(engine, args, port, log)
                try:
                    wait_healthy(url, process, log)
                    load(args, url, 1, 1)  # warm-up
                    for concurrency in args.concurrency:
                        result = load(args, url, concurrency, max(8, 4 * concurrency))
                        result.update(engine=engine, round=round_, concurrency=concurrency)
                        raw.write(json.dumps(result) + "\n")
                        raw.flush()
                        runs.append(result)
                        print(f"round {round_} {engine:12} x{concurrency:<3} "
                              f"{result['output_throughput']:7.1f} tok/s  "
                              f"p99 TTFT {result['ttft_ms']['p99']:7.1f} ms", flush=True)
                finally:
                    process.terminate()
                    process.wait(timeout=30)

    def median(engine, concurrency, pick):
        return statistics.median(pick(r) for r in runs if r["engine"] == engine and r["concurrency"] == concurrency)

    cpu, simd, cores = cpu_model()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    version = subprocess.run([args.llama_server, "--version"], capture_output=True, text=True)
    version = (version.stdout + version.stderr).strip().splitlines()
    lines = [
        f"# Kiln serve vs llama-server, {os.path.basename(args.model)}, {date}",
        "",
        f"- Machine: {cpu}, {cores} cores ({', '.join(simd)}), {platform.system()} {platform.release()}",
        f"- Kiln commit {commit}, `{os.path.relpath(args.host, ROOT)}` (release); `RAYON_NUM_THREADS={args.threads}`, "
        f"`--max-num-seqs {max(args.concurrency)}`",
        f"- llama-server: {' / '.join(l for l in version if l)}; built natively by "
        f"`bench/serve/build_llama_server.sh` (AVX-512, VNNI, BF16 on; AMX off); `-t {args.threads} -tb {args.threads} "
        f"-np {max(args.concurrency)}`, continuous batching (its default)",
        f"- Load: `host benchmark --url`, {args.input_len} random words in, exactly {args.output_len} tokens out "
        f"(greedy, `ignore_eos`), max(8, 4 x concurrency) requests sent at once under `--max-concurrency`; "
        f"{args.rounds} rounds, engines alternating; medians",
        "",
        "| streams | engine | output tok/s | ratio to llama-server | p99 TTFT ms | median TPOT ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for concurrency in args.concurrency:
        base = median("llama-server", concurrency, lambda r: r["output_throughput"])
        for engine in engines:
            tput = median(engine, concurrency, lambda r: r["output_throughput"])
            ttft = median(engine, concurrency, lambda r: r["ttft_ms"]["p99"])
            tpot = median(engine, concurrency, lambda r: r["tpot_ms"]["median"])
            lines.append(f"| {concurrency} | {engine} | {tput:.1f} | {tput / base:.2f} | {ttft:.0f} | {tpot:.1f} |")
    text = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(text)
    print(text)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
