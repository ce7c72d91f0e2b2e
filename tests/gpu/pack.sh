#!/usr/bin/env bash
# Builds the GPU suite here (no GPU needed) and packs it for the device
# machine in three payloads under .gpu/, each small enough for one transfer
# (64 MiB with the repository): the SmolLM2 GGUF in two halves, then the
# stripped release binaries (host and the CUDA test suites, xz-compressed),
# the hand-written kernels' sm_90 cubins and the `openai` client's wheels.
# See tests/gpu/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

model=target/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || { echo "$model is missing: run .ci/setup" >&2; exit 1; }
rm -rf .gpu && mkdir -p .gpu/stage1 .gpu/stage2 .gpu/suite/wheels

echo "== build (release)"
cargo build --release --locked -p kiln-host
tests=(tiny_models tiny_families tiny_gguf verify serve serve_outputs cuda_nvrtc cuda_quantized load_quantization cuda_dense_rows cuda_gemv_splits cuda_graphs cuda_kv_cache cuda_latent_attention async_scheduling speculative benchmark)
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
cargo test --release --locked -p kiln-tests --no-run "${args[@]}" --message-format=json-render-diagnostics \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
' > .gpu/tests.txt
cargo test --release --locked -p kiln-host --lib --no-run --message-format=json-render-diagnostics \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["lib"]:
        print("host_lib", m["executable"])
' >> .gpu/tests.txt

echo "== kernels for sm_90 (H100, H200)"
# Compiled here by NVRTC (host precompile), so the device machine loads them
# instead of compiling them cold (over 60 s on the H200 on 2026-11-30).
rm -rf .gpu/cache
KILN_CACHE_DIR=$PWD/.gpu/cache LD_LIBRARY_PATH=$PWD/target/cuda/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  target/release/host precompile --arch sm_90 | tail -1
tar -C .gpu/cache -cJf .gpu/suite/kernels.tar.xz kernels
rm -rf .gpu/cache

echo "== pack"
mkdir -p .gpu/bin
cp target/release/host .gpu/bin/host
while read -r name path; do cp "$path" ".gpu/bin/$name"; done < .gpu/tests.txt
strip .gpu/bin/*
# xz -9's 64 MiB window spans the binaries, which share most of their code:
# 14 MB where the default's 8 MiB window gave 42 (2026-12-04).
tar -C .gpu -cf - bin | xz -9e -T2 > .gpu/suite/bin.tar.xz
rm -rf .gpu/bin
git rev-parse HEAD > .gpu/suite/commit
sha256sum "$model" | cut -d' ' -f1 > .gpu/suite/smollm2.sha256
half=$((48 * 1024 * 1024))
head -c "$half" "$model" > .gpu/stage1/smollm2.part-a
tail -c +"$((half + 1))" "$model" > .gpu/stage2/smollm2.part-b
# The device image has no `openai` package: its wheels and the ones it needs
# that the image lacks.
# Compiled ones (pydantic-core, jiter) for each Python the image may have.
for python in 3.11 3.12 3.13; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python" \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/suite/wheels openai==3.54.0 pydantic==2.14.3 pydantic-core==2.50.4 jiter==0.19.0 \
    annotated-types==0.8.0 typing-inspection==0.4.5 httpx2==2.16.2 httpcore2==2.16.2 \
    truststore==0.10.5 sniffio==1.3.1 typing-extensions==4.16.0 anyio==4.16.0 h11==0.16.0 idna==3.20
done
du -sh .gpu/stage1 .gpu/stage2 .gpu/suite
cat <<'NEXT'
Payloads ready. With the device tool, one call each, back to back (the
machine stays warm 30 s between calls):
  1. carry [".gpu/stage1"]  command: tests/gpu/run.sh stage
  2. carry [".gpu/stage2"]  command: tests/gpu/run.sh stage
  3. carry [".gpu/suite"]   command: tests/gpu/run.sh suite
The results come back as $OUT/gpu-suite.md (and its logs).
NEXT
