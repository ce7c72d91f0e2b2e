#!/usr/bin/env python3
"""PyTorch / Hugging Face peer baseline for `host benchmark --shape ...`.

Builds a Llama-family model from a Hugging Face config.json (the same files
Kiln's `--shape` presets use, under host/src/model/shapes/) with random
weights -- speed does not depend on the values -- entirely offline, and
measures, for each mode:

* decode: `model.generate` on `batch` random-id prompts of `--input-len`
  tokens, greedy, producing exactly `--output-len` new tokens each (EOS is
  ignored: no eos_token_id, min_new_tokens == max_new_tokens).
  output tok/s = batch * output_len / wall time of one generate call (prefill
  of the prompts included, as in Kiln, where all requests of a level arrive at
  once), timed after warm-up calls of the same shape.
* prefill: one forward pass over a single `--prefill-len` token prompt (all
  logits computed), median of 5 timed runs after warm-up. prefill TFLOP/s
  counts matmul FLOPs only: 2 * (weights of all nn.Linear layers, lm_head
  included) * tokens / seconds; attention score FLOPs are left out.

Modes:
* eager:    HF generate with the default dynamic KV cache.
* compiled: HF generate with cache_implementation="static" and
  model.forward = torch.compile(model.forward, mode="reduce-overhead",
  fullgraph=True) -- the documented transformers recipe (falls back to
  fullgraph=False, recorded, if that fails). generate's own auto-compile is
  disabled so the forward is not compiled twice.

Matching Kiln: same shapes, same prompt/output lengths (pass the same
--input-len/--output-len as the Kiln run; Kiln's `--concurrency` is `--batch`
here), greedy, EOS ignored, random weights, bf16. A (mode, batch) that runs out
of memory is recorded as "oom"; any other failure as "error" and the run goes on.

Example (H100): python3 bench/gpu/torch_baseline.py --shape llama3-8b --json out.json
CPU smoke test: --device cpu --dtype float32 --shape /tmp/tiny.json --batch 1,2 ...
"""
import argparse
import datetime
import gc
import json
import os
import statistics
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

SHAPES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "host", "src", "model", "shapes")
PRESETS = {name: os.path.join(SHAPES_DIR, name + ".json") for name in ("llama3-8b", "llama3.2-1b")}
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


def load_config(shape):
    path = os.path.normpath(PRESETS.get(shape, shape))
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        fields = json.load(f)
    return path, AutoConfig.for_model(fields.pop("model_type"), **fields)


def build_model(config, dtype, device):
    # transformers >= 4.56 calls it `dtype`; older releases `torch_dtype`.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    with torch.device(device):  # allocate and random-init directly on the device
        model = AutoModelForCausalLM.from_config(config, **{key: dtype})
    model.eval()
    gc_ = model.generation_config
    gc_.eos_token_id, gc_.bos_token_id, gc_.pad_token_id = None, None, 0
    return model


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def is_oom(err):
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Runner:
    """Holds the model in one mode; in compiled mode retries once with fullgraph=False."""

    def __init__(self, model, mode):
        self.model, self.mode, self.fullgraph = model, mode, None
        self.eager_forward = model.forward
        if mode == "compiled":
            self.compile(fullgraph=True)

    def compile(self, fullgraph):
        torch._dynamo.reset()
        self.fullgraph = fullgraph
        self.model.forward = torch.compile(
            self.eager_forward, mode="reduce-overhead", fullgraph=fullgraph, dynamic=False)

    def restore(self):
        self.model.__dict__.pop("forward", None)  # back to the class's forward
        torch._dynamo.reset()

    def guarded(self, fn):
        """Runs fn(); a non-OOM failure under fullgraph=True recompiles with fullgraph=False and retries."""
        try:
            return fn()
        except Exception as err:
            if is_oom(err) or self.mode != "compiled" or not self.fullgraph:
                raise
            print(f"# fullgraph=True failed ({type(err).__name__}: {str(err)[:200]}); retrying with fullgraph=False")
            self.compile(fullgraph=False)
            return fn()

    def generate(self, ids, output_len):
        kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
                      eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(ids))
        if self.mode == "compiled":
            kwargs.update(cache_implementation="static", disable_compile=True)
        with torch.inference_mode():
            out = self.model.generate(ids, **kwargs)
        assert out.shape[1] == ids.shape[1] + output_len, f"generated {out.shape[1] - ids.shape[1]} tokens"

    def prefill(self, ids):
        with torch.inference_mode():
            self.model(ids, use_cache=False)


def random_ids(rng, batch, length, vocab, device):
    return torch.randint(0, vocab, (batch, length), generator=rng).to(device)


def bench_decode(runner, args, batch, rng, vocab):
    ids = random_ids(rng, batch, args.input_len, vocab, args.device)
    warmups = 2 if runner.mode == "compiled" else 1
    for _ in range(warmups):
        runner.guarded(lambda: runner.generate(ids, args.output_len))
    sync(args.device)
    start = time.perf_counter()
    runner.generate(ids, args.output_len)
    sync(args.device)
    wall = time.perf_counter() - start
    return {"output_tok_per_s": batch * args.output_len / wall, "wall_s": wall}


def bench_prefill(runner, args, rng, vocab, linear_params):
    ids = random_ids(rng, 1, args.prefill_len, vocab, args.device)
    for _ in range(3 if runner.mode == "compiled" else 1):
        runner.guarded(lambda: runner.prefill(ids))
    times = []
    for _ in range(5):
        sync(args.device)
        start = time.perf_counter()
        runner.prefill(ids)
        sync(args.device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {"prefill_tok_per_s": args.prefill_len / seconds,
            "prefill_tflops": 2 * linear_params * args.prefill_len / seconds / 1e12}


def attempt(fn):
    """Runs fn(), mapping failures to a short status instead of crashing."""
    try:
        return fn()
    except Exception as err:
        status = "oom" if is_oom(err) else "error"
        print(f"# {status}: {type(err).__name__}: {str(err)[:300]}")
        free_memory()
        return {"status": status, "error": f"{type(err).__name__}: {str(err)[:300]}"}


def fmt(value, digits=1):
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="llama3-8b", help=f"preset ({', '.join(PRESETS)}) or a config.json path")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--batch", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results to this path")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    assert set(modes) <= {"eager", "compiled"}, f"unknown mode in {modes}"
    batches = [int(b) for b in args.batch.split(",") if b]

    torch.manual_seed(args.seed)
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64  # one static graph per shape
    torch._dynamo.config.cache_size_limit = 64
    config_path, config = load_config(args.shape)
    on_cuda = torch.device(args.device).type == "cuda"
    header = {
        "shape": args.shape, "config": config_path, "dtype": args.dtype,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(torch.device(args.device)) if on_cuda else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "input_len": args.input_len, "output_len": args.output_len, "prefill_len": args.prefill_len,
    }
    model = build_model(config, DTYPES[args.dtype], args.device)
    linear_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    header["params"] = sum(t.numel() for t in model.parameters())
    header["linear_params"] = linear_params
    header["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    print("# " + ", ".join(f"{k}: {v}" for k, v in header.items()), flush=True)

    rng = torch.Generator().manual_seed(args.seed)
    vocab = config.vocab_size
    results = []
    for mode in modes:
        runner = Runner(model, mode)
        rows = []
        for batch in batches:
            print(f"# {mode} batch {batch} ...", flush=True)
            row = {"shape": args.shape, "mode": mode, "batch": batch,
                   "input_len": args.input_len, "output_len": args.output_len}
            row.update(attempt(lambda: bench_decode(runner, args, batch, rng, vocab)))
            rows.append(row)
        print(f"# {mode} prefill {args.prefill_len} ...", flush=True)
        prefill = attempt(lambda: bench_prefill(runner, args, rng, vocab, linear_params))
        if "status" in prefill:
            prefill = {"prefill_status": prefill["status"], "prefill_error": prefill["error"]}
        for row in rows:
            row.update(prefill, fullgraph=runner.fullgraph)
        results.extend(rows)
        runner.restore()
        free_memory()

    cols = ["shape", "mode", "batch", "input", "output", "output tok/s", "prefill tok/s", "prefill TFLOP/s"]
    print("\n" + " | ".join(f"{k}: {header[k]}" for k in ("device", "torch", "transformers", "dtype", "date")))
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in results:
        mode = r["mode"] + (" (fullgraph=False)" if r["fullgraph"] is False else "")
        out = fmt(r["output_tok_per_s"]) if "output_tok_per_s" in r else r["status"]
        pre = fmt(r["prefill_tok_per_s"]) if "prefill_tok_per_s" in r else r["prefill_status"]
        tfl = fmt(r["prefill_tflops"], 2) if "prefill_tflops" in r else r["prefill_status"]
        print(f"| {r['shape']} | {mode} | {r['batch']} | {r['input_len']} | {r['output_len']} | {out} | {pre} | {tfl} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
