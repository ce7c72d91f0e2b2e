#!/usr/bin/env bash
# One-off: batch-1 GEMV regression A/B (HEAD against a2e79c2, 2026-11-30b's
# 171.5 tok/s) and the decode-graphs / kv-cache suites one test at a time.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/env.sh
out=${OUT:-/tmp/ab-out}
mkdir -p "$out"
{ nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE,POWER,ECC,MEMORY,COMPUTE; } > "$out/smi.txt" 2>&1
mkdir -p /tmp/a2e && tar -C /tmp/a2e -xJf .gpu/ab/a2e.tar.xz
export KILN_WORKSPACE=$PWD KILN_HOST_BIN=$bin/host KILN_TEST_CUDA_DEVICE=cuda RUST_BACKTRACE=1
for t in cuda_graphs cuda_kv_cache; do
  timeout 120 "$bin/$t" --test-threads=1 > "$out/$t-serial.log" 2>&1
  echo "$t serial rc=$? $(grep 'test result' "$out/$t-serial.log")"
done
if ! grep -q 'test result: ok' "$out/cuda_graphs-serial.log"; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$sanitizer" ] && timeout 100 "$sanitizer" --tool memcheck "$bin/cuda_graphs" --test-threads=1 \
    long_context_decode_splits_attention_and_matches_the_cpu > "$out/cuda_graphs-memcheck.log" 2>&1
  echo "memcheck rc=$?"
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv -lms 500 > "$out/clocks.csv" 2>&1 &
smi=$!
bench() {
  local name=$1 host=$2 cache=$3
  shift 3
  env "$@" KILN_CACHE_DIR="$cache" KILN_LOG=info,kiln_host::runtime::cuda::tune=debug timeout 100 "$host" benchmark \
    --shape llama3-8b --shape-dtype bf16 --precision exact --device cuda --input-len 128 --output-len 64 \
    --concurrency 1 --json > "$out/$name.json" 2> "$out/$name.log"
  echo "$name rc=$? $(grep -o '"output_tok_per_s": [0-9.]*' "$out/$name.json")"
}
bench head "$bin/host" "$KILN_CACHE_DIR"
bench a2e79c2 /tmp/a2e/host /tmp/a2e/cache
bench head-no-pdl "$bin/host" "$KILN_CACHE_DIR" KILN_NO_PROGRAMMATIC_LAUNCH=1
bench head-again "$bin/host" "$KILN_CACHE_DIR"
kill $smi
