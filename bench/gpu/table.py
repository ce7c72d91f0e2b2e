#!/usr/bin/env python3
"""The table of a GPU benchmark run: every kiln-*.json (`host benchmark
--json`) and torch-*.json (bench/gpu/torch_baseline.py) in a directory, as
markdown: decode output tok/s per shape and batch with Kiln's ratio to the
memory roofline and to PyTorch (and the engine thread's own work and its
wait for the device per step: a wait near zero means the host sets the
pace), and prefill tok/s with the fraction of the
device's bf16 GEMM rate; and Kiln's decode with the GEMV's split of rows
among warps fixed to each of 1, 2 and 4 and chosen by timing
(splits-SHAPE-DTYPE-SPLIT.json, `bench/gpu/run.sh splits`).

  python3 bench/gpu/table.py OUT_DIR
"""
import glob
import json
import os
import sys


def load(directory, pattern):
    runs = []
    for path in sorted(glob.glob(os.path.join(directory, pattern))):
        try:
            with open(path) as f:
                runs.append((os.path.basename(path), json.load(f)))
        except (OSError, ValueError) as err:
            print(f"<!-- skipped {path}: {err} -->")
    return runs


def kiln_runs(kiln, kind):
    """(shape, storage type, run) of each Kiln JSON of `kind` (decode, prefill)."""
    suffix = f"-{kind}.json"
    for name, run in kiln:
        if name.endswith(suffix):
            shape, dtype = name[len("kiln-"):-len(suffix)].rsplit("-", 1)
            yield shape, dtype, run


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    kiln = load(directory, "kiln-*.json")
    torch = load(directory, "torch-*.json")
    # PyTorch output tok/s and prefill tok/s by (shape, mode, batch).
    peer = {}
    for _, run in torch:
        for r in run.get("results", []):
            peer[(r["shape"], r["mode"], r["batch"])] = r
    header = next((run for _, run in torch), {})
    print("# Kiln against PyTorch on one GPU\n")
    if kiln:
        print(f"- Kiln device: {kiln[0][1].get('device')}")
    if header:
        print(f"- PyTorch {header.get('torch')}, transformers {header.get('transformers')}, "
              f"device {header.get('device')}, {header.get('date')}")
    print()
    print("| shape | weights | batch | Kiln tok/s | of roofline | host (driver) / wait ms a step | PyTorch eager | PyTorch compiled | Kiln ÷ compiled |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape, dtype, run in kiln_runs(kiln, "decode"):
        for level in run["levels"]:
            batch = level["concurrency"]
            ours = level["output_tok_per_s"]
            roof = level.get("roofline_fraction")
            cells = []
            for mode in ("eager", "compiled"):
                r = peer.get((shape, mode, batch), {})
                cells.append(r.get("output_tok_per_s"))
            compiled = cells[1]
            fmt = lambda v: "-" if v is None else f"{v:,.1f}"
            ratio = "-" if not compiled or dtype != "bf16" else f"{ours / compiled:.2f}×"
            host, wait = level.get("host_ms_per_step"), level.get("device_wait_ms_per_step")
            driver = level.get("driver_ms_per_step")
            by_call = level.get("driver_ms_per_step_by_call") or {}
            # The driver's largest share by kind of call, where it counts.
            top = max(by_call.items(), key=lambda kv: kv[1], default=None)
            top_cell = "" if not top or top[1] < 0.005 else f", {top[0]} {top[1]:.2f}"
            host_cell = "-" if host is None else f"{host:.2f}" + ("" if driver is None else f" ({driver:.2f}{top_cell})")
            split = "-" if host is None or wait is None else f"{host_cell} / {wait:.2f}"
            print(f"| {shape} | {dtype} | {batch} | {ours:,.1f} | "
                  f"{'-' if roof is None else f'{roof * 100:.0f} %'} | {split} | {fmt(cells[0])} | {fmt(compiled)} | {ratio} |")
    print()
    print("| shape | weights | prompt | Kiln prefill tok/s | of GEMM rate | PyTorch compiled prefill tok/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape, dtype, run in kiln_runs(kiln, "prefill"):
        level = run["levels"][0]
        fraction = level.get("prefill_gemm_fraction")
        theirs = peer.get((shape, "compiled", 1), {}).get("prefill_tok_per_s")
        print(f"| {shape} | {dtype} | {level['input_len']} | {level['prefill_tok_per_s']:,.0f} | "
              f"{'-' if fraction is None else f'{fraction * 100:.0f} %'} | "
              f"{'-' if theirs is None else f'{theirs:,.0f}'} |")
    splits = load(directory, "splits-*.json")
    if splits:
        print("\nDecode tok/s by the GEMV's warps per row (`KILN_GEMV_SPLIT`; `timed`: chosen per shape at load)\n")
        print("| shape | weights | warps per row | batch | tok/s | of roofline |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name, run in splits:
            shape, dtype, split = name[len("splits-"):-len(".json")].rsplit("-", 2)
            for level in run["levels"]:
                roof = level.get("roofline_fraction")
                print(f"| {shape} | {dtype} | {split} | {level['concurrency']} | "
                      f"{level['output_tok_per_s']:,.1f} | {'-' if roof is None else f'{roof * 100:.0f} %'} |")
    roofline = next((run.get("roofline") for _, run in kiln if run.get("roofline")), None)
    if roofline:
        print(f"\nMeasured: copy bandwidth {roofline['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
              f"bf16 GEMM {roofline['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s.")


if __name__ == "__main__":
    main()
