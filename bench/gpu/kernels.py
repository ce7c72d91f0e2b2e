#!/usr/bin/env python3
"""Where a benchmark run's device time goes, per kernel, as a Markdown table.

    kernels.py nsys KERN_SUM.csv BENCHMARK.json
        Nsight Systems' cuda_gpu_kern_sum report of a `host benchmark --json`
        run: every kernel's total over the profiled steps (KILN_PROFILE_STEPS,
        named when set), and the level's wall time, steps, host time and
        kernels a step.
    kernels.py ncu KERNELS.csv
        Nsight Compute's --csv output with gpu__time_duration.sum: each kernel
        (by name and grid) over the profiled steps.
    kernels.py sections SECTIONS.csv
        Nsight Compute's --csv --page details output of some sections
        (`bench/gpu/run.sh kernel-memory`): each kernel's (by name and grid)
        metrics, the median over its launches, section by section.
"""
import csv
import json
import os
import sys
from collections import defaultdict


def table(rows, total_ns):
    """rows: (name, launches, total ns, min ns, max ns), largest total first."""
    lines = ["| kernel | launches | total ms | mean µs | min µs | max µs | share |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, launches, total, low, high in sorted(rows, key=lambda r: -r[2]):
        lines.append(f"| {name} | {launches} | {total / 1e6:.2f} | {total / launches / 1e3:.2f} "
                     f"| {low / 1e3:.2f} | {high / 1e3:.2f} | {100 * total / total_ns:.1f} % |")
    return "\n".join(lines)


def nsys(kern_sum, benchmark):
    rows = []
    with open(kern_sum, newline="") as f:
        for r in csv.DictReader(f):
            rows.append((r["Name"][:80], int(r["Instances"]), float(r["Total Time (ns)"]),
                         float(r["Min (ns)"]), float(r["Max (ns)"])))
    total = sum(r[2] for r in rows)
    # Nsight Systems may print its own lines around the benchmark's JSON.
    with open(benchmark) as f:
        text = f.read()
    report, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
    level = report["levels"][0]
    wall_ns = level["wall_s"] * 1e9
    steps = max(level.get("steps", 0), 1)
    print(f"- device: {report['device']}; concurrency {level['concurrency']}, "
          f"{level['input_len']} in / {level['output_len']} out: {level['output_tok_per_s']:.1f} tok/s, "
          f"mean ITL {level['mean_itl_ms']:.2f} ms")
    window = os.environ.get("KILN_PROFILE_STEPS")
    seen = f"the steps of KILN_PROFILE_STEPS={window}" if window else "the whole run (load and warm-up included)"
    print(f"- kernel time {total / 1e6:.2f} ms over {seen}; "
          f"the level: wall time {wall_ns / 1e6:.1f} ms, {steps} steps, "
          f"host {level.get('host_ms_per_step', 0):.3f} ms (driver {level.get('driver_ms_per_step') or 0:.3f}), "
          f"wait {level.get('device_wait_ms_per_step', 0):.3f} ms, "
          f"{level.get('kernels_per_step') or 0:.1f} kernels a step")
    print()
    print(table(rows, total))


def ncu(path):
    groups = defaultdict(list)
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "ns": 1, "us": 1e3, "ms": 1e6}
        value = float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1)
        groups[(r["Kernel Name"][:60], r["Grid Size"], r["Block Size"])].append(value)
    rows = [(f"{name} {grid}x{block}", len(v), sum(v), min(v), max(v)) for (name, grid, block), v in groups.items()]
    total = sum(r[2] for r in rows)
    window = os.environ.get("KILN_PROFILE_STEPS", "the profiled launches")
    print(f"- {window}: {sum(r[1] for r in rows)} launches, {total / 1e6:.2f} ms of kernel time")
    print()
    print(table(rows, total))


def sections(path):
    values = defaultdict(lambda: defaultdict(list))
    units = {}
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(lines):
        metric, value = r.get("Metric Name"), (r.get("Metric Value") or "").replace(",", "")
        if not metric or not value:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        kernel = f"{r['Kernel Name'][:60]} {r['Grid Size']}x{r['Block Size']}"
        key = (r.get("Section Name", ""), metric)
        values[kernel][key].append(number)
        units[key] = r.get("Metric Unit", "")
    for kernel, metrics in values.items():
        launches = max(len(v) for v in metrics.values())
        print(f"### {kernel} ({launches} launches, medians)")
        print()
        print("| section | metric | value | unit |")
        print("| --- | --- | --- | --- |")
        for (section, metric), v in metrics.items():
            median = sorted(v)[len(v) // 2]
            print(f"| {section} | {metric} | {median:g} | {units[(section, metric)]} |")
        print()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "nsys":
        nsys(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "ncu":
        ncu(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "sections":
        sections(sys.argv[2])
    else:
        sys.exit(__doc__)
