#!/usr/bin/env python3
"""PyTorch / Hugging Face peer baseline for Kiln's `host benchmark --shape ...`.

Builds a Llama-family model offline from a Hugging Face config.json (the same
files Kiln's `--shape` presets use, host/src/model/shapes/) with random
weights -- speed does not depend on the values -- and measures, per mode:

* decode: `model.generate` on `batch` random-id prompts of `--input-len`
  tokens, greedy, exactly `--output-len` new tokens each (EOS ignored: no
  eos_token_id, min_new_tokens == max_new_tokens). output tok/s =
  batch * output_len / wall time of one generate call (the prompts' prefill
  included, as in Kiln, where a level's requests all arrive at once), after
  warm-up calls of the same shape; median of --repeats timed calls.
* prefill: one forward pass over a single `--prefill-len` token prompt (all
  logits computed), median of 5 after warm-up. TFLOP/s counts weight-matmul
  FLOPs only (attention's QK/PV products left out):
  2 * (weights of all nn.Linear layers, lm_head included) * tokens / s.

Modes:
* eager: generate with the default dynamic KV cache.
* compiled: generate with a static KV cache and model.forward =
  torch.compile(model.forward, mode="reduce-overhead", fullgraph=True), the
  documented transformers recipe (falls back to fullgraph=False, recorded).
  The StaticCache is built up front and reused, reset (untimed) between calls
  -- the docs' "StaticCache" variant: with cache_implementation="static",
  transformers 5.x builds a new cache per call and allocates it lazily inside
  the compiled prefill, so its tensors miss mark_static_address (recompiles
  and CUDA-graph input copies). generate's own auto-compile is disabled so
  the forward is not compiled twice.

Like Kiln's benchmark: same shapes, same prompt/output lengths (pass the Kiln
run's --input-len/--output-len; its --concurrency is --batch here), greedy,
EOS ignored, random weights, bf16. A (mode, batch) that runs out of memory is
recorded as "oom", any other failure as "error", and the run goes on.

  python3 bench/gpu/torch_baseline.py --shape llama3-8b --json out.json
  CPU smoke test: --device cpu --dtype float32 --shape /tmp/tiny-config.json
"""
import argparse
import datetime
import gc
import json
import os
import statistics
import time

import torch
import torch._inductor.config as inductor_config
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache

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
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in 4.56
    with torch.device(device):  # allocate and random-init directly on the device
        model = AutoModelForCausalLM.from_config(config, **{key: dtype})
    gen = model.eval().generation_config
    gen.eos_token_id, gen.bos_token_id, gen.pad_token_id = None, None, 0
    return model


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def is_oom(err):
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


class Runner:
    """The model in one mode; in compiled mode a failure retries once with fullgraph=False."""

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
        try:
            return fn()
        except Exception as err:
            if is_oom(err) or self.mode != "compiled" or not self.fullgraph:
                raise
            print(f"# fullgraph=True failed ({type(err).__name__}: {str(err)[:200]}); retrying with fullgraph=False")
            self.compile(fullgraph=False)
            return fn()

    def static_cache(self, batch, max_len):
        """An initialized StaticCache in compiled mode; None (generate's DynamicCache) in eager mode."""
        if self.mode != "compiled":
            return None
        c = self.model.config
        cache = StaticCache(config=c, max_cache_len=max_len)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        cache.early_initialization(batch_size=batch, num_heads=c.num_key_value_heads, head_dim=head_dim,
                                   dtype=self.model.dtype, device=self.model.device)
        return cache

    def generate_fn(self, ids, output_len, cache):
        """One greedy generate call of exactly output_len tokens, as a function (the caller resets the cache)."""
        kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
                      eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(ids))
        if cache is not None:
            kwargs.update(past_key_values=cache, disable_compile=True)

        def run():
            with torch.inference_mode():
                out = self.model.generate(ids, **kwargs)
            assert out.shape[1] == ids.shape[1] + output_len, f"generated {out.shape[1] - ids.shape[1]} tokens"
        return run

    def prefill(self, ids):
        with torch.inference_mode():
            self.model(ids, use_cache=False)


def timed(fn, device):
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def bench_decode(runner, args, batch, rng, vocab):
    ids = torch.randint(0, vocab, (batch, args.input_len), generator=rng).to(args.device)
    cache = runner.static_cache(batch, args.input_len + args.output_len)
    reset = cache.reset if cache is not None else (lambda: None)  # untimed
    run = runner.generate_fn(ids, args.output_len, cache)
    for _ in range(2 if runner.mode == "compiled" else 1):
        runner.guarded(lambda: (reset(), run()))
    walls = []
    for _ in range(args.repeats):
        reset()
        walls.append(timed(run, args.device))
    wall = statistics.median(walls)
    return {"output_tok_per_s": batch * args.output_len / wall, "wall_s": wall}


def bench_prefill(runner, args, rng, vocab, linear_params):
    ids = torch.randint(0, vocab, (1, args.prefill_len), generator=rng).to(args.device)
    for _ in range(3 if runner.mode == "compiled" else 1):
        runner.guarded(lambda: runner.prefill(ids))
    seconds = statistics.median(timed(lambda: runner.prefill(ids), args.device) for _ in range(5))
    return {"prefill_tok_per_s": args.prefill_len / seconds,
            "prefill_tflops": 2 * linear_params * args.prefill_len / seconds / 1e12}


def attempt(fn):
    """Runs fn(), turning a failure into {"status": "oom" or "error", "error": ...}."""
    try:
        return fn()
    except Exception as err:
        status, text = "oom" if is_oom(err) else "error", f"{type(err).__name__}: {str(err)[:300]}"
        print(f"# {status}: {text}")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {"status": status, "error": text}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="llama3-8b", help=f"preset ({', '.join(PRESETS)}) or a config.json path")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--batch", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=1, help="timed generate calls per batch (median)")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results to this path")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    assert set(modes) <= {"eager", "compiled"}, f"unknown mode in {modes}"
    batches = [int(b) for b in args.batch.split(",") if b]

    torch.manual_seed(args.seed)
    torch._dynamo.config.cache_size_limit = 64  # one static graph per shape
    if hasattr(torch._dynamo.config, "recompile_limit"):
        torch._dynamo.config.recompile_limit = 64
    on_cuda = torch.device(args.device).type == "cuda"
    if not on_cuda:  # CPU smoke tests: keep inductor's compile workers from competing with timed runs
        inductor_config.compile_threads = 1
    config_path, config = load_config(args.shape)
    header = {
        "shape": args.shape, "config": config_path, "dtype": args.dtype,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(torch.device(args.device)) if on_cuda else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "input_len": args.input_len, "output_len": args.output_len, "prefill_len": args.prefill_len,
        "repeats": args.repeats,
    }
    model = build_model(config, DTYPES[args.dtype], args.device)
    linear_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    header.update(params=sum(t.numel() for t in model.parameters()), linear_params=linear_params,
                  attn_implementation=getattr(model.config, "_attn_implementation", None))
    print("# " + ", ".join(f"{k}: {v}" for k, v in header.items()), flush=True)

    rng = torch.Generator().manual_seed(args.seed)
    results = []
    for mode in modes:
        runner = Runner(model, mode)
        rows = []
        for batch in batches:
            print(f"# {mode} batch {batch} ...", flush=True)
            row = {"shape": args.shape, "mode": mode, "batch": batch,
                   "input_len": args.input_len, "output_len": args.output_len}
            row.update(attempt(lambda: bench_decode(runner, args, batch, rng, config.vocab_size)))
            rows.append(dict(row, fullgraph=runner.fullgraph))
        print(f"# {mode} prefill {args.prefill_len} ...", flush=True)
        prefill = attempt(lambda: bench_prefill(runner, args, rng, config.vocab_size, linear_params))
        if "status" in prefill:
            prefill = {"prefill_status": prefill["status"], "prefill_error": prefill["error"]}
        results += [dict(row, prefill_fullgraph=runner.fullgraph, **prefill) for row in rows]
        runner.restore()
        gc.collect()

    cols = ["shape", "mode", "batch", "input", "output", "output tok/s", "prefill tok/s", "prefill TFLOP/s"]
    print("\n" + " | ".join(f"{k}: {header[k]}" for k in ("device", "torch", "transformers", "dtype", "date")))
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in results:
        mode = r["mode"] + (" (fullgraph=False)" if r["fullgraph"] is False else "")
        out = f"{r['output_tok_per_s']:,.1f}" if "output_tok_per_s" in r else r["status"]
        pre = f"{r['prefill_tok_per_s']:,.1f}" if "prefill_tok_per_s" in r else r["prefill_status"]
        tfl = f"{r['prefill_tflops']:,.2f}" if "prefill_tflops" in r else r["prefill_status"]
        print(f"| {r['shape']} | {mode} | {r['batch']} | {r['input_len']} | {r['output_len']} | {out} | {pre} | {tfl} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "results": results}, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
