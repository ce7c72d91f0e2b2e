#!/usr/bin/env bash
# Runs on the GPU machine (see tests/gpu/README.md).
#   run.sh stage  copies the payload halves carried in .gpu/stage*/ to /tmp
#   run.sh suite  unpacks .gpu/suite and runs the CUDA backend's suites on the
#                 real driver, writing $OUT/gpu-suite.md and, as the device
#                 tool returns at most 8 files, one log per suite packed in
#                 $OUT/gpu-suite-logs.tar.gz
# KILN_GPU_SUITE_ONLY (names, space-separated) runs those suites alone;
# KILN_GPU_SUITE_MEMCHECK=1 runs them under compute-sanitizer's memcheck
# (an out-of-bounds or misaligned access fails the suite), reporting to
# gpu-memcheck.md and its own logs instead.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = stage ]; then
  mkdir -p /tmp/kiln-gpu
  for f in .gpu/stage*/*; do [ -f "$f" ] && cp "$f" /tmp/kiln-gpu/; done
  ls -la /tmp/kiln-gpu
  exit 0
fi
[ "${1:-}" = suite ] || { echo "usage: run.sh stage|suite" >&2; exit 2; }

. tests/gpu/env.sh
memcheck=${KILN_GPU_SUITE_MEMCHECK:-}
sanitizer=
if [ -n "$memcheck" ]; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  out=$stage/out-memcheck
  report=$out/gpu-memcheck.md
else
  out=$stage/out
  report=$out/gpu-suite.md
fi
rm -rf "$out"
mkdir -p "$out"
# Each package's wheel for this Python, from the carried ones.
packages=$(ls .gpu/suite/wheels | sed 's/-[0-9].*//' | sort -u)
# shellcheck disable=SC2086
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --find-links .gpu/suite/wheels --target "$stage/site" $packages
export PYTHONPATH=$stage/site

model=$stage/smollm2.gguf
if [ -f "$stage/smollm2.part-a" ] && [ -f "$stage/smollm2.part-b" ]; then
  cat "$stage/smollm2.part-a" "$stage/smollm2.part-b" > "$model"
fi
model_ok=no
[ -f "$model" ] && [ "$(sha256sum "$model" | cut -d' ' -f1)" = "$(cat .gpu/suite/smollm2.sha256)" ] && model_ok=yes

# KILN_GPU_SUITE_DEVICE=cuda-emulated dry-runs the suite on a machine
# without a GPU.
device=${KILN_GPU_SUITE_DEVICE:-cuda}
export KILN_WORKSPACE=$PWD KILN_HOST_BIN=$bin/host KILN_TEST_CUDA_DEVICE=$device \
  KILN_TEST_PYTHON=$(command -v python3) KILN_SMOLLM2_GGUF=$model RUST_BACKTRACE=1

{
  echo "# Kiln GPU suite"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- commit: $(cat .gpu/suite/commit)"
  echo "- device: $device; card: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1)"
  echo "- CUDA libraries: $libs"
  echo "- SmolLM2 staged: $model_ok"
  echo
  echo "| suite | result | time (s) |"
  echo "| --- | --- | --- |"
} > "$report"

suite() {
  local name=$1; shift
  # KILN_GPU_SUITE_SKIP: suites not to run (names, space-separated).
  if [[ " ${KILN_GPU_SUITE_SKIP:-} " == *" $name "* ]]; then
    echo "| $name | skipped (KILN_GPU_SUITE_SKIP) | |" >> "$report"
    return
  fi
  if [ -n "${KILN_GPU_SUITE_ONLY:-}" ] && [[ " $KILN_GPU_SUITE_ONLY " != *" $name "* ]]; then
    return
  fi
  if [ -n "$memcheck" ]; then
    if [ -z "$sanitizer" ]; then
      echo "| $name | not run: no compute-sanitizer on this machine | |" >> "$report"
      return
    fi
    set -- "$sanitizer" --tool memcheck --error-exitcode 1 --print-limit 20 "$@"
  fi
  local started=$SECONDS limit=${SUITE_LIMIT:-${KILN_GPU_SUITE_TIMEOUT:-180}}
  # A hung suite must not take the rest of the lease with it.
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  # A test filter that matches nothing passes as cargo sees it: not here.
  if [ $rc -eq 0 ] && grep -q "^running 0 tests" "$out/$name.log" && ! grep -q "^running [1-9]" "$out/$name.log"; then
    rc=no-tests
  fi
  case $rc in
    0) result=passed ;;
    no-tests) result="FAILED: no test matched (see $name.log)" ;;
    124) result="TIMED OUT after $limit s (see $name.log)" ;;
    *) result="FAILED (see $name.log)" ;;
  esac
  echo "| $name | $result | $((SECONDS - started)) |" >> "$report"
}

# The first suite compiles the hand-written kernels into NVRTC's disk cache
# (a fresh machine's cold start: 60 s and more, seen on the H200), so it
# has its own limit, KILN_GPU_SUITE_FIRST_TIMEOUT.
SUITE_LIMIT=${KILN_GPU_SUITE_FIRST_TIMEOUT:-300} suite device-info "$bin/host" generate --model "$KILN_WORKSPACE/tests/fixtures/reference/tiny_llama.f32.gguf" \
  --prompt-ids 1,2,3 --max-new-tokens 4 --device "$device"
suite nvrtc "$bin/cuda_nvrtc" --test-threads 1 --nocapture
suite device-sampler "$bin/host_lib" runtime::cuda::sample --nocapture
suite tiny-families "$bin/tiny_models" on_the_cuda_backend --test-threads 1
suite half-checkpoints "$bin/tiny_models" bf16_and_f16 --test-threads 1
suite tiny-families-1.5 "$bin/tiny_families" on_the_cuda_backend --test-threads 1
suite tiny-ggufs "$bin/tiny_gguf" on_the_cuda_backend --nocapture
suite packed-gguf "$bin/cuda_quantized" --nocapture
suite load-quantization "$bin/load_quantization" --nocapture
suite dense-rows "$bin/cuda_dense_rows" --nocapture
suite gemv-splits "$bin/cuda_gemv_splits" --nocapture
suite decode-graphs "$bin/cuda_graphs" --nocapture
suite kv-cache "$bin/cuda_kv_cache" --nocapture
suite latent-attention-576 "$bin/cuda_latent_attention" --nocapture
suite async-scheduling "$bin/async_scheduling" --nocapture
suite speculative "$bin/speculative" on_cuda --nocapture
suite benchmark-shapes "$bin/benchmark" shape --nocapture
if [ "$model_ok" = yes ]; then
  suite smollm2-verify "$bin/verify" smollm2 --nocapture --test-threads 1
  suite serve-openai "$bin/serve" serve_on_the_cuda_backend --nocapture
  suite structured-output "$bin/serve_outputs" structured_output --nocapture
  suite smollm2-generate "$bin/host" generate --model "$model" --device "$device" \
    --prompt "What is the capital of France?" --chat --max-new-tokens 64
  suite smollm2-benchmark "$bin/host" benchmark --model "$model" --device "$device" \
    --input-len 128 --output-len 128 --concurrency 1,16,64
  {
    echo
    echo "SmolLM2 on $device (bf16 products, one sequence):"
    echo
    grep -h "vs transformers\|prefill" "$out/smollm2-verify.log" "$out/smollm2-generate.log" | sed 's/^/    /'
    echo
    echo "host benchmark (SmolLM2, 128 in / 128 out, greedy):"
    echo
    grep -v "INFO\|WARN" "$out/smollm2-benchmark.log" | sed 's/^/    /'
  } >> "$report"
else
  echo "| smollm2-* | not run: SmolLM2 was not staged (run.sh stage with both halves first) | |" >> "$report"
fi
cat "$report"
if [ -n "${OUT:-}" ]; then
  cp "$report" "$OUT/"
  tar -C "$out" -czf "$OUT/$(basename "$report" .md)-logs.tar.gz" .
fi
