#!/usr/bin/env python3
"""Soak `host serve`: rounds of concurrent streaming clients, a quarter of
them hanging up mid-stream, then checks that every request finished, the KV
cache went back to empty and the server's memory stayed flat.

    python3 tests/serve/soak.py --host target/release/host \
        --model target/models/SmolLM2-135M-Instruct.Q4_1.gguf

Run it before closing work on the server (64 clients, 3 rounds of 60 s by
default); the test suite runs a short one. Prints a table per round
(requests, hang-ups, errors, p50/p99 latency, RSS, KV usage), the peak RSS
and a JSON summary with --json; exits 1 if any request failed, the cache did
not drain or RSS grew by more than 10 % (+ 16 MiB) from the first round to
the last.
"""

import argparse
import asyncio
import json
import random
import socket
import statistics
import subprocess
import sys
import time

import urllib.request

import openai

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers.",
    "Tell me a short story about a robot.",
    "How do I reverse a list in Python?",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid, field="VmRSS"):
    """The process's resident memory now (VmRSS) or at its peak (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def metric(base, name):
    for line in get(f"{base}/metrics")[1].splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    raise RuntimeError(f"no metric {name}")


async def one_request(client, rng, stats):
    hang_up = rng.random() < 0.25
    start = time.monotonic()
    try:
        stream = await client.chat.completions.create(
            model="soak",
            messages=[{"role": "user", "content": rng.choice(PROMPTS)}],
            max_tokens=rng.randint(8, 64),
            temperature=0.8,
            stream=True,
        )
        chunks = 0
        async for _ in stream:
            chunks += 1
            if hang_up and chunks >= 3:
                await stream.close()
                stats["hangups"] += 1
                return
        stats["latencies"].append(time.monotonic() - start)
    except openai.OpenAIError as e:
        stats["errors"].append(f"{type(e).__name__}: {e}"[:200])


async def client_loop(base, deadline, seed, stats):
    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)
    while time.monotonic() < deadline:
        await one_request(client, rng, stats)
    await client.close()


async def round_(base, clients, seconds, seed):
    stats = {"latencies": [], "errors": [], "hangups": 0}
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(client_loop(base, deadline, seed * 1000 + i, stats) for i in range(clients)))
    # The engine notices hang-ups at its next step: wait for it to drain.
    drained_at = time.monotonic() + 30
    while True:
        running = metric(base, "vllm:num_requests_running")
        usage = metric(base, "vllm:kv_cache_usage_perc")
        if (running == 0 and usage == 0) or time.monotonic() > drained_at:
            break
        await asyncio.sleep(0.2)
    stats["running_after"] = running
    stats["kv_usage_after"] = usage
    return stats


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True, help="the host binary")
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--kv-cache-memory", default="1GiB")
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="the server's --kv-cache-dtype (auto is f32 in exact precision)")
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args()

    port = free_port()
    server = subprocess.Popen(
        [args.host, "serve", "--model", args.model, "--port", str(port),
         "--served-model-name", "soak", "--kv-cache-memory", args.kv_cache_memory,
         "--kv-cache-dtype", args.kv_cache_dtype,
         "--max-connections", str(args.clients + 16)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        while True:
            try:
                if get(f"{base}/health", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() - started > 120:
                sys.exit(f"the server did not start:\n{server.stderr.read()}")
            time.sleep(0.2)
        idle_rss = rss_mib(server.pid)
        rounds = []
        print(f"idle RSS {idle_rss:.0f} MiB; {args.clients} clients, {args.seconds:g} s a round")
        print("round  requests  hang-ups  errors  p50 s  p99 s  RSS MiB  KV after")
        for r in range(args.rounds):
            stats = asyncio.run(round_(base, args.clients, args.seconds, r))
            lat = sorted(stats["latencies"])
            p50 = statistics.median(lat) if lat else float("nan")
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
            row = {
                "round": r + 1,
                "requests": len(lat) + stats["hangups"] + len(stats["errors"]),
                "completed": len(lat),
                "hangups": stats["hangups"],
                "errors": len(stats["errors"]),
                "p50_s": p50,
                "p99_s": p99,
                "rss_mib": rss_mib(server.pid),
                "kv_usage_after": stats["kv_usage_after"],
                "running_after": stats["running_after"],
                "error_samples": stats["errors"][:5],
            }
            rounds.append(row)
            print(f"{row['round']:>5}  {row['requests']:>8}  {row['hangups']:>8}  {row['errors']:>6}  "
                  f"{p50:5.2f}  {p99:5.2f}  {row['rss_mib']:7.0f}  {row['kv_usage_after']:8.3f}")
            for sample in row["error_samples"]:
                print(f"       error: {sample}")
        peak_rss = rss_mib(server.pid, "VmHWM")
        print(f"peak RSS {peak_rss:.0f} MiB")
    finally:
        server.terminate()
        server.wait(timeout=60)
    problems = []
    if any(r["errors"] for r in rounds):
        problems.append("requests failed")
    if any(r["kv_usage_after"] != 0 or r["running_after"] != 0 for r in rounds):
        problems.append("the KV cache or the running set did not drain")
    first, last = rounds[0]["rss_mib"], rounds[-1]["rss_mib"]
    if last > first * 1.10 + 16:
        problems.append(f"RSS grew from {first:.0f} to {last:.0f} MiB")
    if server.returncode != 0:
        problems.append(f"the server exited with {server.returncode} on SIGTERM")
    summary = {"idle_rss_mib": idle_rss, "peak_rss_mib": peak_rss, "clients": args.clients, "seconds": args.seconds,
               "rounds": rounds, "problems": problems}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    print("ok" if not problems else "FAILED: " + "; ".join(problems))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
