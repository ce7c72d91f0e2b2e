#!/usr/bin/env python3
"""Machine instructions (SASS) of hand-written kernels, without a GPU.

Compiles every module under kernels/cuda/ with NVRTC for sm_80 and sm_90
(the cuda_nvrtc test, writing cubins to KILN_CUBIN_DIR), disassembles the
named kernels with cuobjdump and prints, for each loop (a backward branch),
its instructions and the most frequent opcodes. A loop's count is a static
one (both sides of a branch inside it are counted); it is how a change to a
hot loop is judged before a GPU is lent.

    kernels/cuda/sass_report.py kiln_qmm_q4_k kiln_gemv_q4_k_m1 [--arch sm_80]

With `--module flash_attention.cu`, only that module is compiled, here, by
NVRTC's library (seconds, where the test takes minutes), and ptxas's
registers and spills of its kernels are printed first:

    kernels/cuda/sass_report.py --module flash_attention.cu kiln_flash_attention_bf16_d128

`--serial-loads` lists the loops whose loads come one after each branch (a
memory round trip an element), in every kernel of the modules compiled:

    kernels/cuda/sass_report.py --serial-loads --module sampling.cu

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


def compile_module(name: str, arch: str, out: pathlib.Path) -> None:
    """One module's cubin for `arch` into `out`, by NVRTC's library as .ci/setup
    unpacks it (includes from kernels/cuda, as the runtime inlines them),
    printing ptxas's registers, spills and stack frame of each kernel."""
    import ctypes

    nvrtc_dir = ROOT / "target/cuda/nvidia/cu13/lib"
    # libnvrtc loads its builtins library by name: load it first.
    ctypes.CDLL(str(next(nvrtc_dir.glob("libnvrtc-builtins.so*"))), mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(str(nvrtc_dir / "libnvrtc.so.13"))
    path = ROOT / "kernels/cuda" / name
    program = ctypes.c_void_p()
    status = nvrtc.nvrtcCreateProgram(ctypes.byref(program), path.read_bytes(), name.encode(), 0, None, None)
    if status != 0:
        sys.exit(f"nvrtcCreateProgram: {status}")
    options = [f"--gpu-architecture={arch}", "--std=c++17", f"-I{ROOT / 'kernels/cuda'}", "--ptxas-options=-v"]
    array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = nvrtc.nvrtcCompileProgram(program, len(options), array)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    lines = log.value.decode().splitlines()
    if status != 0:
        sys.exit("\n".join(lines))
    for i, line in enumerate(lines):
        if "Compiling entry function" in line:
            after = " ".join(lines[i + 1 : i + 4])
            registers = re.search(r"Used (\d+) registers", after)
            spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", after)
            stack = re.search(r"(\d+) bytes stack frame", after)
            print(
                f"{line.split(chr(39))[1]} ({arch}): {registers.group(1) if registers else '?'} registers, "
                f"spills {spills.group(1) if spills else '?'} / {spills.group(2) if spills else '?'} bytes, "
                f"stack frame {stack.group(1) if stack else '?'} bytes"
            )
    nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(program, cubin)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{path.stem}.{arch}.cubin").write_bytes(cubin.raw)


def disassemble(cubin: pathlib.Path, bin_dir: pathlib.Path, *options: str) -> str:
    """cuobjdump's SASS of `cubin` (`options`: e.g. `-fun KERNEL`)."""
    return subprocess.run(
        [str(bin_dir / "cuobjdump"), "-sass", *options, str(cubin)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}"),
    ).stdout


def loops(sass: str):
    """A function's instructions (address, opcode without modifiers) and its
    loops: (first, last address) of each backward branch."""
    code = [(int(a, 16), op.split()[-1].split(".")[0], rest) for a, op, rest in INSTRUCTION.findall(sass)]
    spans = []
    for at, op, rest in code:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op == "BRA" and target and int(target.group(1), 16) < at:
            spans.append((int(target.group(1), 16), at))
    return [(a, o) for a, o, _ in code], spans


def report(cubin: pathlib.Path, kernel: str, bin_dir: pathlib.Path) -> str:
    code, spans = loops(disassemble(cubin, bin_dir, "-fun", kernel))
    if not code:
        return ""
    lines = [f"{kernel} ({cubin.name}): {len(code)} instructions"]
    for start, end in spans:
        body = [o for a, o in code if start <= a <= end]
        common = " ".join(f"{o} {n}" for o, n in collections.Counter(body).most_common(10))
        lines.append(f"  loop {start:#x}..{end:#x}: {len(body)} | {common}")
    return "\n".join(lines)


def serial_loads(cubin: pathlib.Path, bin_dir: pathlib.Path) -> list[str]:
    """Loops of every kernel in `cubin` whose global loads mostly come one
    after each branch: load, use, branch, and the next load only then, a
    memory round trip an element (NVRTC compiles a `#pragma unroll` loop
    whose loads sit behind its bound checks so: the sampler's passes were,
    2026-12-04). `for_each_batched` (kiln_cuda.cuh) issues a batch of loads
    first. Nested loops are listed with their inner ones, and so are loads
    in the arms of a branch the whole grid takes alike (kiln_gated_rows'
    element types): read the loop before changing it."""
    found = []
    for function in re.split(r"\n\s+Function : ", disassemble(cubin, bin_dir))[1:]:
        name = function.split("\n")[0].strip()
        code, spans = loops(function)
        for start, end in spans:
            loads = after_branch = 0
            branched = False
            for o in (o for a, o in code if start <= a <= end):
                if o == "LDG":
                    loads += 1
                    after_branch += branched
                    branched = False
                elif o == "BRA" and loads:
                    branched = True
            if loads >= 4 and after_branch >= loads / 2:
                found.append(f"{name} loop {start:#x}..{end:#x}: {after_branch} of {loads} loads each after a branch")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kernels", nargs="*")
    parser.add_argument("--serial-loads", action="store_true", help="list loops that load an element a branch")
    parser.add_argument("--arch", default="sm_90", choices=["sm_80", "sm_90"])
    parser.add_argument("--cubins", type=pathlib.Path, default=ROOT / "target/cuda/cubins")
    parser.add_argument("--module", help="compile only this module of kernels/cuda, here")
    args = parser.parse_args()
    bin_dir = tools()
    if args.module:
        compile_module(args.module, args.arch, args.cubins)
        modules = [args.cubins / f"{pathlib.Path(args.module).stem}.{args.arch}.cubin"]
    else:
        cubins(args.cubins)
        modules = sorted(args.cubins.glob(f"*.{args.arch}.cubin"))
    if args.serial_loads:
        for cubin in modules:
            for line in serial_loads(cubin, bin_dir):
                print(f"{cubin.name}: {line}")
    for kernel in args.kernels:
        found = [report(c, kernel, bin_dir) for c in modules]
        found = [f for f in found if f]
        print("\n".join(found) if found else f"{kernel}: not in any module for {args.arch}")


if __name__ == "__main__":
    main()
