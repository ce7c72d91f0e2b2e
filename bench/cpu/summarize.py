#!/usr/bin/env python3
"""Summarize compare_llamacpp.sh's raw.tsv (model, engine, round, metric,
value, interference %) into Markdown tables of medians ([min-max]) and
Kiln/llama.cpp ratios. Standard library only.

    python3 bench/cpu/summarize.py [--max-interference PCT] RAW.tsv

Only runs during which other processes used at most PCT % of the CPUs count
(default 10); a cell with fewer clean runs than rounds says "(k clean)", and a
cell with none falls back to all runs and is marked "!".
"""

import argparse
import statistics
from collections import defaultdict

METRICS = [
    ("decode_tps", "decode tok/s (128 new after 73)", True),
    ("prefill73_tps", "prefill tok/s, 73 tokens", True),
    ("prefill512_tps", "prefill tok/s, 512 tokens", True),
    ("peak_rss_mib", "peak RSS MiB (decode run)", True),
    ("cold_first_token_ms", "cold start to first token, ms (process wall)", True),
    ("load_to_first_token_ms", "llama.cpp in-process load to first token, ms", False),
    ("decode_steps", "decode steps measured", False),
    ("interference_pct", "other processes' CPU use during runs, %", False),
]
# Kiln's precisions in this order when present; others after them.
KILN_ORDER = ["kiln-exact", "kiln-fast", "kiln-fast-residual"]


def fmt(x):
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("--max-interference", type=float, default=10.0)
    args = ap.parse_args()

    data = defaultdict(list)  # (model, engine, metric) -> [(value, interference)]
    extra = {}
    with open(args.raw, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 5:
                continue
            model, engine, _round, metric, value = parts[:5]
            try:
                v = float(value)
                interf = float(parts[5]) if len(parts) > 5 and parts[5] else 0.0
            except ValueError:
                continue
            if model == "all":
                extra[metric] = v
                continue
            data[(model, engine, metric)].append((v, interf))

    models = list(dict.fromkeys(k[0] for k in data))
    present = {k[1] for k in data if k[1].startswith("kiln-")}
    kiln = [e for e in KILN_ORDER if e in present] + sorted(present - set(KILN_ORDER))
    engines = kiln + ["llama.cpp"]
    names = [e.removeprefix("kiln-") for e in kiln]
    for model in models:
        rounds = max(len(v) for (m, e, k), v in data.items() if m == model and k == "decode_tps")
        print(f"\n### {model}: {rounds} rounds; medians [min-max] over runs with <= {args.max_interference:g}% interference\n")
        header = [f"Kiln {n}" for n in names] + ["llama.cpp"] + [f"{n} / llama.cpp" for n in names]
        print("| metric | " + " | ".join(header) + " |")
        print("| --- " * (len(header) + 1) + "|")
        for metric, label, ratio in METRICS:
            cells, med = [], {}
            for e in engines:
                runs = data.get((model, e, metric))
                if not runs:
                    cells.append("-")
                    continue
                if metric == "interference_pct":
                    vals, note = [v for v, _ in runs], ""
                else:
                    vals = [v for v, i in runs if i <= args.max_interference]
                    note = "" if len(vals) == len(runs) else f" ({len(vals)} clean)"
                    if not vals:
                        vals, note = [v for v, _ in runs], " !"
                med[e] = statistics.median(vals)
                rng = f" [{fmt(min(vals))}-{fmt(max(vals))}]" if len(vals) > 1 else ""
                cells.append(f"{fmt(med[e])}{rng}{note}")
            if all(c == "-" for c in cells):
                continue
            ratios = []
            for e in kiln:
                ok = ratio and e in med and med.get("llama.cpp")
                ratios.append(f"{med[e] / med['llama.cpp']:.2f}" if ok else "-")
            print(f"| {label} | " + " | ".join(cells + ratios) + " |")
    for key, runtime in (
        ("python_baseline_rss_mib", "the Python runtime and llama-cpp-python"),
        ("node_baseline_rss_mib", "the Node runtime and addon"),
    ):
        if key in extra:
            print(
                f"\nllama.cpp's RSS and cold start include {runtime} "
                f"({extra[key]:.0f} MiB RSS with no model loaded)."
            )
    print("Ratios are Kiln / llama.cpp: above 1 means Kiln is faster (tok/s) or heavier/slower (MiB, ms).")


if __name__ == "__main__":
    main()
