#!/usr/bin/env python3
"""llama.cpp's own fidelity on the real-model references, with llama.cpp
built natively on this machine (llama-cpp-python from source).

For every model and prompt that `gen_references.py` wrote (transformers fp32
logits), evaluate the same prompt ids with llama.cpp (the same GGUF, CPU,
the whole prompt in one batch), read its logits at every position, and print
what `host verify` prints for Kiln: max |Δlogit|, top-1 agreement, mean and
max KL(reference ‖ llama.cpp), one JSON object per prompt.

Usage (the venv that has llama-cpp-python and numpy):
    python tests/real_models/llamacpp_fidelity.py [--models /work/models]
        [--threads 2] [--only KEY ...] [--cache-type f16|q8_0]

`--cache-type q8_0` is llama.cpp's `--cache-type-k q8_0 --cache-type-v
q8_0` (with flash attention, which a quantized V cache needs).
"""

import argparse
import json
import os
import platform
import sys

import numpy as np
from llama_cpp import Llama

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prompts import MODELS  # noqa: E402


def log_softmax(x):
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(engine, reference):
    """The numbers `host verify` reports, for `engine` against `reference`."""
    diff = np.abs(engine.astype(np.float64) - reference.astype(np.float64))
    p_log, q_log = log_softmax(reference), log_softmax(engine)
    kl = (np.exp(p_log) * (p_log - q_log)).sum(axis=-1)
    return {
        "positions": int(reference.shape[0]),
        "max_abs_diff": float(diff.max()),
        "top1_agree": int((engine.argmax(-1) == reference.argmax(-1)).sum()),
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
    }


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="/work/models")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--cache-type", choices=["f16", "q8_0"], default="f16")
    args = parser.parse_args()
    import llama_cpp

    print(
        json.dumps(
            {
                "llama_cpp_python": llama_cpp.__version__,
                "system_info": llama_cpp.llama_print_system_info().decode(),
                "cpu": cpu_model(),
                "cache_type": args.cache_type,
            }
        ),
        flush=True,
    )
    for key, file in MODELS:
        if args.only and key not in args.only:
            continue
        refs = os.path.join(args.models, "references", key)
        gguf = os.path.join(args.models, file)
        if not (os.path.isdir(refs) and os.path.isfile(gguf)):
            print(f"{key}: no GGUF or references, skipped", file=sys.stderr)
            continue
        prompts = sorted(n[: -len(".ids.json")] for n in os.listdir(refs) if n.endswith(".ids.json"))
        longest = max(len(json.load(open(os.path.join(refs, f"{p}.ids.json")))["ids"]) for p in prompts)
        cache = {}
        if args.cache_type == "q8_0":
            q8_0 = llama_cpp.GGML_TYPE_Q8_0
            cache = {"type_k": q8_0, "type_v": q8_0, "flash_attn": True}
        llm = Llama(
            model_path=gguf,
            **cache,
            n_ctx=longest + 16,
            n_batch=longest + 16,
            n_ubatch=longest + 16,
            n_threads=args.threads,
            logits_all=True,
            verbose=False,
        )
        for prompt in prompts:
            ids = json.load(open(os.path.join(refs, f"{prompt}.ids.json")))["ids"]
            reference = np.load(os.path.join(refs, f"{prompt}.logits.npy"))
            llm.reset()
            llm.eval(ids)
            logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
            report = {"model": key, "prompt": prompt, **compare(logits, reference)}
            print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
