#!/usr/bin/env python3
"""Roofline arithmetic of one Kiln decode step on a GPU, kernel by kernel:
the bytes each launch must move (weights read once, activations, the KV
cache read by attention) and the time that takes at a copy bandwidth, for a
Llama-shaped config. With --prefill, the kernels of one prompt's prefill:
each launch's bytes and FLOPs, its time the larger of bytes at the copy
bandwidth and FLOPs at the GEMM rate. Arithmetic, not a measurement: the
floor a kernel cannot beat, to hold measured times against (`host
benchmark` measures).

  python3 bench/gpu/roofline.py --shape llama3-8b --batch 1 --context 256
  python3 bench/gpu/roofline.py --shape llama3-8b --prefill 2048
"""
import argparse
import json
import os

SHAPES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "host", "src", "model", "shapes")

# Bytes per weight element of each storage type (GGUF blocks: block bytes /
# block elements).
WEIGHT_BYTES = {"bf16": 2.0, "f32": 4.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_k": 144 / 256, "q6_k": 210 / 256}


def dims(c):
    """Width, layers, FFN width, vocabulary, query heads, head size, q's
    and k's (or v's) widths of a Llama-shaped config."""
    d, heads, kv_heads = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim", d // heads)
    return (d, c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"], heads, head_dim,
            heads * head_dim, kv_heads * head_dim)


def kernels(c, batch, context, weights, kv_bytes):
    """(name, launches per step, bytes per launch) of a decode step."""
    d, layers, ffn, vocab, _, _, q_dim, kv_dim = dims(c)
    w = WEIGHT_BYTES[weights]
    lm = WEIGHT_BYTES["q6_k" if weights == "q4_k" else weights]
    act = 4 * batch  # f32 activations per element of a row, per sequence
    gemv = lambda rows, cols, bpe: rows * cols * bpe + act * (cols + rows)
    # Where the GEMV runs (up to 8 rows of a packed matrix, 2 of a dense
    # one), the GEMV of gate and up writes silu(gate) * up itself, and the
    # GEMV of q, k and v writes q and k rotated and the cache's keys and
    # values.
    gemv_rows = 2 if weights in ("bf16", "f32") else 8
    cache_write = batch * 2 * kv_dim * kv_bytes
    rotary = ("rotary of q and k + KV-cache write (one launch)", layers,
              2 * act * (q_dim + kv_dim) + act * kv_dim + cache_write)
    if batch <= gemv_rows:
        mlp = [("gate and up projections + silu(gate) * up (one launch)", layers,
                gemv(2 * ffn, d, w) - act * ffn)]
        qkv = [("q, k and v projections + rotary + KV-cache write (one launch)", layers,
                gemv(q_dim + 2 * kv_dim, d, w) + cache_write)]
    elif weights not in ("bf16", "f32") and batch <= 64:
        # Packed blocks on tensor cores (qmatmul.cu): the matrices that share
        # x in one launch, gate's and up's activation written by it.
        mlp = [("gate and up projections + silu(gate) * up (one launch)", layers,
                gemv(2 * ffn, d, w) - act * ffn)]
        qkv = [("q, k and v projections (one launch)", layers, gemv(q_dim + 2 * kv_dim, d, w)),
               rotary]
    else:
        # cuBLAS, a launch a matrix (KILN_DENSE_ROWS=tensor-cores puts bf16
        # matrices of up to 64 rows on the packed blocks' path above).
        mlp = [("gate projection", layers, gemv(ffn, d, w)),
               ("up projection", layers, gemv(ffn, d, w)),
               ("silu(gate) * up", layers, 3 * act * ffn)]
        qkv = [("q projection", layers, gemv(q_dim, d, w)),
               ("k and v projections (a launch each)", 2 * layers, gemv(kv_dim, d, w)),
               rotary]
    # Where the GEMV runs the logits' GEMV also finds greedy's picks; past
    # it the sampler reads the logits again (a greedy row: one pass).
    if batch <= gemv_rows:
        head = [("lm_head + greedy's pick (one launch)", 1, gemv(vocab, d, lm))]
    else:
        head = [("lm_head", 1, gemv(vocab, d, lm)), ("greedy sampling", 1, act * vocab)]
    norms = [("embedding norm (layer 0)", 1, 2 * act * d + 4 * d),
             ("residual add + rms_norm (one launch)", 2 * layers, 4 * act * d + 4 * d)]
    return [
        ("embedding rows", 1, batch * d * w + act * d),
        *norms,
        *qkv,
        ("paged attention (split-K over long contexts, merged by the last split)", layers,
         batch * context * 2 * kv_dim * kv_bytes + 2 * act * q_dim),
        ("o projection", layers, gemv(d, q_dim, w)),
        *mlp,
        ("down projection", layers, gemv(d, ffn, w)),
        *head,
    ]


def prefill_kernels(c, tokens, weights, kv_bytes):
    """(name, launches, bytes per launch, FLOPs per launch) of the prefill of
    one prompt of `tokens` (bf16 products on cuBLAS, flash attention)."""
    d, layers, ffn, vocab, heads, head_dim, q_dim, kv_dim = dims(c)
    w = WEIGHT_BYTES[weights]
    f32, bf16 = 4 * tokens, 2 * tokens  # bytes per element of a row, all rows
    # x read in bf16 (written so by the norm, attention or activation before
    # it), f32 out; bf16 out for the activation (gate and up).
    gemm = lambda n, k, out=f32: (n * k * w + bf16 * k + out * n, 2 * tokens * n * k)
    causal_pairs = tokens * (tokens + 1) / 2
    return [
        ("embedding rows", 1, tokens * d * w + f32 * d, 0),
        ("rms_norm (layer 0), x stored in bf16", 1, f32 * d + bf16 * d + 4 * d, 0),
        ("residual add + rms_norm, x stored in bf16", 2 * layers - 1, 3 * f32 * d + bf16 * d + 4 * d, 0),
        ("q projection (cuBLAS)", layers, *gemm(q_dim, d)),
        ("k projection", layers, *gemm(kv_dim, d)),
        ("v projection", layers, *gemm(kv_dim, d)),
        ("rotary of q and k + KV-cache write", layers,
         2 * f32 * (q_dim + kv_dim) + f32 * kv_dim + 2 * tokens * kv_dim * kv_bytes, 0),
        ("flash attention (causal), output stored in bf16", layers,
         f32 * q_dim + bf16 * q_dim + 2 * tokens * kv_dim * kv_bytes, 4 * heads * head_dim * causal_pairs),
        ("o projection", layers, *gemm(d, q_dim)),
        ("gate projection, stored in bf16", layers, *gemm(ffn, d, bf16)),
        ("up projection, stored in bf16", layers, *gemm(ffn, d, bf16)),
        ("silu(gate) * up, stored in bf16", layers, 3 * bf16 * ffn, 0),
        ("down projection", layers, *gemm(d, ffn)),
        ("last row's lm_head (GEMV)", 1, vocab * d * w, 2 * vocab * d),
    ]


def prefill(args, config):
    rows = prefill_kernels(config, args.prefill, args.weights, args.kv_bytes)
    print(f"{args.shape}, prefill of {args.prefill} tokens, {args.weights} weights, "
          f"{args.bandwidth / 1e12:.2f} TB/s, {args.gemm_rate / 1e12:.0f} TFLOP/s\n")
    print("| kernel | launches | MB per launch | GFLOP per launch | µs per launch | µs per prefill |")
    print("| --- | --- | --- | --- | --- | --- |")
    total_us, gemm_us = 0.0, 0.0
    for name, n, b, f in rows:
        us = max(b / args.bandwidth, f / args.gemm_rate) * 1e6
        total_us += n * us
        if "projection" in name:
            gemm_us += n * f / args.gemm_rate * 1e6
        print(f"| {name} | {n} | {b / 1e6:.1f} | {f / 1e9:.1f} | {us:.1f} | {n * us:.0f} |")
    print(f"\n{total_us / 1e3:.1f} ms a prefill at best ({args.prefill * 1e6 / total_us:,.0f} tok/s), of which the "
          f"products' FLOPs at the GEMM rate are {gemm_us / 1e3:.1f} ms: at most {gemm_us / total_us * 100:.0f} % of "
          f"the GEMM rate with every kernel at its bound.")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=256, help="positions each sequence attends to")
    p.add_argument("--weights", default="bf16", choices=sorted(WEIGHT_BYTES))
    p.add_argument("--kv-bytes", type=int, default=2, help="bytes per KV-cache element (bf16 by default, 4 with --kv-cache-dtype float32, 1 with fp8)")
    p.add_argument("--bandwidth", type=float, default=3.02e12, help="bytes/s (H100 copy, measured)")
    p.add_argument("--gap-us", type=float, default=0.96, help="µs between graph-replayed kernels (measured)")
    p.add_argument("--prefill", type=int, help="tokens of one prompt: the prefill's kernels instead")
    p.add_argument("--gemm-rate", type=float, default=864e12, help="FLOP/s (H200 bf16 GEMM, measured)")
    args = p.parse_args()
    path = args.shape if os.path.isfile(args.shape) else os.path.join(SHAPES, args.shape + ".json")
    with open(path) as f:
        config = json.load(f)
    if args.prefill:
        return prefill(args, config)
    rows = kernels(config, args.batch, args.context, args.weights, args.kv_bytes)
    total_bytes = sum(n * b for _, n, b in rows)
    launches = sum(n for _, n, _ in rows)
    print(f"{args.shape}, batch {args.batch}, context {args.context}, {args.weights} weights, "
          f"{args.kv_bytes}-byte KV cache, {args.bandwidth / 1e12:.2f} TB/s\n")
    print("| kernel | launches | MB per launch | µs per launch at bandwidth | µs per step |")
    print("| --- | --- | --- | --- | --- |")
    for name, n, b in rows:
        us = b / args.bandwidth * 1e6
        print(f"| {name} | {n} | {b / 1e6:.3f} | {us:.2f} | {n * us:.0f} |")
    bound_us = total_bytes / args.bandwidth * 1e6
    gaps_us = launches * args.gap_us
    print(f"\n{total_bytes / 1e9:.3f} GB a step: {bound_us:.0f} µs at bandwidth, at most "
          f"{1e6 / bound_us:.0f} steps/s ({args.batch * 1e6 / bound_us:,.0f} tok/s).")
    print(f"{launches} launches: {gaps_us:.0f} µs of gaps at {args.gap_us} µs each; bandwidth time plus gaps "
          f"allows {1e6 / (bound_us + gaps_us):.0f} steps/s ({bound_us / (bound_us + gaps_us) * 100:.0f} % of the roofline).")


if __name__ == "__main__":
    main()
