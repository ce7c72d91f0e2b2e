#!/usr/bin/env python3
"""One llama.cpp run, the counterpart of one `host generate --prompt-ids ...`
process: load the GGUF, prefill the given token ids in one batch, then
greedy-decode --max-new-tokens tokens (EOS is not a stop: the count is
fixed), and print one JSON line of timings to stdout.

llama.cpp comes from llama-cpp-python built from source on this machine
(`bench/cpu/build_llamacpp.sh`); only its C API is used (ctypes), so the
loop is the same as llama.cpp's own `llama-simple`: decode, read the last
row of logits, take the argmax, decode that token.

Timings (milliseconds), measured like Kiln's generate log:
  load_ms     model load + context creation
  prefill_ms  evaluating the prompt until the first new token is picked
  decode_ms   the remaining max_new_tokens - 1 steps (evaluate one token, pick)

Usage: python bench/cpu/llamacpp_run.py --model M.gguf --ids-file F
           --max-new-tokens N [--threads 2]
"""

import argparse
import ctypes
import json
import time

import numpy as np
import llama_cpp as ll


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--ids-file")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--system-info", action="store_true", help="print llama.cpp's system info and exit")
    args = parser.parse_args()
    if args.system_info:
        print(ll.llama_print_system_info().decode())
        return
    if not args.model or not args.ids_file:
        parser.error("--model and --ids-file are required (unless --system-info)")
    with open(args.ids_file) as f:
        ids = [int(t) for t in f.read().strip().split(",")]

    # Silence llama.cpp's load log (it goes to stderr otherwise).
    log = ll.llama_log_callback(lambda level, text, user: None)
    ll.llama_log_set(log, ctypes.c_void_p(0))
    ll.llama_backend_init()

    t0 = time.perf_counter()
    model_params = ll.llama_model_default_params()
    model_params.n_gpu_layers = 0
    model = ll.llama_model_load_from_file(args.model.encode(), model_params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {args.model}")
    ctx_params = ll.llama_context_default_params()
    ctx_params.n_ctx = len(ids) + args.max_new_tokens + 1
    ctx_params.n_batch = max(len(ids), 1)
    ctx_params.n_ubatch = max(len(ids), 1)
    ctx_params.n_threads = args.threads
    ctx_params.n_threads_batch = args.threads
    ctx = ll.llama_init_from_model(model, ctx_params)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    t1 = time.perf_counter()

    def step(tokens):
        arr = (ll.llama_token * len(tokens))(*tokens)
        if ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(tokens))) != 0:
            raise SystemExit("llama_decode failed")
        logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        return int(logits.argmax())

    generated = []
    t_start = time.perf_counter()
    token = step(ids)
    generated.append(token)
    t_first = time.perf_counter()
    while len(generated) < args.max_new_tokens:
        token = step([token])
        generated.append(token)
    t_last = time.perf_counter()

    out = {
        "engine": "llama.cpp",
        "prompt_len": len(ids),
        "generated": len(generated),
        "load_ms": (t1 - t0) * 1e3,
        "prefill_ms": (t_first - t_start) * 1e3,
        "decode_steps": len(generated) - 1,
        "decode_ms": (t_last - t_first) * 1e3,
        "threads": args.threads,
        "context_size": ll.llama_n_ctx(ctx),
        "generated_ids": generated,
    }
    print(json.dumps(out), flush=True)
    ll.llama_free(ctx)
    ll.llama_model_free(model)


if __name__ == "__main__":
    main()
