#!/usr/bin/env python3
"""Machine instructions (SASS) of hand-written kernels, without a GPU.

Compiles every module under kernels/cuda/ with NVRTC for sm_80 and sm_90
(the cuda_nvrtc test, writing cubins to KILN_CUBIN_DIR), disassembles the
named kernels with cuobjdump and prints, for each loop (a backward branch),
its instructions and the most frequent opcodes. A loop's count is a static
one (both sides of a branch inside it are counted); it is how a change to a
hot loop is judged before a GPU is lent.

    kernels/cuda/sass_report.py kiln_qmm_q4_k kiln_gemv_q4_k_m1 [--arch sm_80]

Needs NVRTC (.ci/setup); cuobjdump and nvdisasm come from PyPI wheels,
unpacked into target/cuda/sass on first use.
"""

import argparse
import collections
import os
import pathlib
import re
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOLS = ROOT / "target/cuda/sass"
WHEELS = ["nvidia-cuda-cuobjdump==13.2.86", "nvidia-cuda-nvdisasm==13.5.37"]
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P[0-9T] )?[A-Z0-9_.]+)([^;]*);")


def tools() -> pathlib.Path:
    """The folder holding cuobjdump and nvdisasm, unpacked if missing."""
    bin_dir = TOOLS / "nvidia/cu13/bin"
    if not (bin_dir / "cuobjdump").exists() or not (bin_dir / "nvdisasm").exists():
        TOOLS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(TOOLS)]
            + WHEELS,
            check=True,
        )
        for wheel in TOOLS.glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(TOOLS)
            wheel.unlink()
        for tool in bin_dir.iterdir():
            tool.chmod(0o755)
    return bin_dir


def cubins(out: pathlib.Path) -> None:
    """Every hand-written module's cubins, written by the cuda_nvrtc test."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KILN_CUBIN_DIR=str(out))
    subprocess.run(
        ["cargo", "test", "-q", "-p", "kiln-tests", "--test", "cuda_nvrtc", "hand_written"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def report(cubin: pathlib.Path, kernel: str, bin_dir: pathlib.Path) -> str:
    sass = subprocess.run(
        [str(bin_dir / "cuobjdump"), "-sass", "-fun", kernel, str(cubin)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}"),
    ).stdout
    code = [(int(a, 16), op.split()[-1], rest) for a, op, rest in INSTRUCTION.findall(sass)]
    if not code:
        return ""
    lines = [f"{kernel} ({cubin.name}): {len(code)} instructions"]
    for at, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op == "BRA" and target and int(target.group(1), 16) < at:
            start = int(target.group(1), 16)
            body = [o.split(".")[0] for a, o, _ in code if start <= a <= at]
            common = " ".join(f"{o} {n}" for o, n in collections.Counter(body).most_common(10))
            lines.append(f"  loop {start:#x}..{at:#x}: {len(body)} | {common}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kernels", nargs="+")
    parser.add_argument("--arch", default="sm_90", choices=["sm_80", "sm_90"])
    parser.add_argument("--cubins", type=pathlib.Path, default=ROOT / "target/cuda/cubins")
    args = parser.parse_args()
    bin_dir = tools()
    cubins(args.cubins)
    for kernel in args.kernels:
        found = [report(c, kernel, bin_dir) for c in sorted(args.cubins.glob(f"*.{args.arch}.cubin"))]
        found = [f for f in found if f]
        print("\n".join(found) if found else f"{kernel}: not in any module for {args.arch}")


if __name__ == "__main__":
    main()
