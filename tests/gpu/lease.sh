#!/usr/bin/env bash
# A whole GPU lease in one device-tool call. A lease is 15 minutes of device
# time from the machine's start (a minute or two) to its return, and no
# machine starts with under 4 minutes left: one call of at most ~9 minutes is
# all a lease holds. This runs, in order of what each result decides, the
# CUDA suites that take seconds, then the speed measurements, and skips each
# part whose estimate would pass the deadline, so what did run comes back.
#
#   here:  tests/gpu/pack.sh        (.gpu/suite; SmolLM2's halves are not carried)
#   there: carry [".gpu/suite"], timeout_s 570, command: tests/gpu/lease.sh
#
# On 2026-11-30 the machine stayed warm between calls (30 s) and the lease
# ran 440 s with ~430 s of device time left: enough to stage SmolLM2 first
# (carry [".gpu/stage1"], then [".gpu/stage2"], command tests/gpu/run.sh
# stage: a short call each) so that the suite also runs its
# real-model parts (SmolLM2 against transformers, the fp8 cache's sm_89+
# conversion, the OpenAI server), and to follow with a second call for the
# parts this one skipped. The second lease that day did the latter: this
# script (446 s, 421 s of device time left), then four short calls of the
# skipped parts (`bench/gpu/run.sh profile`, `pdl`, `kiln`, `dense`,
# `speculative`, `kv-fp8`; 330 s in all), each started within the 30 s.
#
# Back in $OUT: lease.md (each part, its time, or why it was skipped),
# gpu-suite.md and its logs, gpu-bench.md (bench/gpu/table.py; PyTorch's
# columns are the committed 2026-11-24 H200 runs, named in its header) and
# every run's JSON and text. KILN_LEASE_SECONDS (default 480) is the
# deadline, counted from the start of this script.
#
# Dry run without a GPU (the suites on the emulator, the benchmarks at full
# shape on the null device, which times the host alone):
#   KILN_GPU_SUITE_DEVICE=cuda-emulated KILN_BENCH_DEVICE=cuda-null tests/gpu/lease.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
deadline=${KILN_LEASE_SECONDS:-480}
results=/tmp/kiln-gpu/bench
mkdir -p "$results"
log=$results/lease.md
{
  echo "# GPU lease"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- commit: $(cat .gpu/suite/commit 2>/dev/null || git rev-parse HEAD)"
  echo "- card: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
  echo "- deadline: $deadline s"
  echo
  echo "| part | result | seconds |"
  echo "| --- | --- | --- |"
} > "$log"

# PyTorch at the same shapes on the same kind of card, measured 2026-11-24
# (torch.compile alone takes minutes: no lease has them to spare).
cp bench/results/gpu-2026-11-24/torch-*.json "$results/" 2>/dev/null

# Runs `part NAME ESTIMATE COMMAND...` unless ESTIMATE seconds would pass the
# deadline; a part is stopped at twice its estimate or at the deadline.
part() {
  local name=$1 estimate=$2
  shift 2
  local left=$((deadline - SECONDS))
  if [ "$estimate" -gt "$left" ]; then
    echo "| $name | skipped: ~$estimate s, $left s left | |" >> "$log"
    return
  fi
  local limit=$((2 * estimate < left ? 2 * estimate : left)) started=$SECONDS
  echo "== $name (limit $limit s)"
  timeout "$limit" "$@" > "$results/lease-$name.log" 2>&1
  local rc=$?
  local result=passed
  [ $rc -eq 124 ] && result="stopped at $limit s"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && result="FAILED ($rc)"
  echo "| $name | $result | $((SECONDS - started)) |" >> "$log"
  tail -5 "$results/lease-$name.log"
  # Should the call be cut short, what ran is back.
  [ -n "${OUT:-}" ] && cp "$log" "$OUT/"
}


# Correctness first: every suite that runs in seconds (NVRTC's is CI's).
# The first suite compiles the kernels on a fresh machine (over 60 s on the
# H200 on 2026-11-30, when the first three suites timed out doing it).
part suite 150 env KILN_GPU_SUITE_SKIP=nvrtc KILN_GPU_SUITE_TIMEOUT=60 \
  KILN_GPU_SUITE_FIRST_TIMEOUT=180 tests/gpu/run.sh suite
# Issue 14's table: decode at 1, 16 and 64 streams and a 2048-token prefill
# (45 s on the H200 on 2026-11-30). Batch 1's split attention took ~38 µs a
# layer (its merge a chain of L2 loads, since a round of splits at a time).
part kiln-bf16 90 env KILN_BENCH_SHAPES="llama3-8b:bf16 llama3.2-1b:bf16" bench/gpu/run.sh kiln
# Q4_K_M at batch 1: 179.8 tok/s on 2026-11-30 (second lease), ahead of
# bf16's 171.5; 2,158 at 16 streams.
part kiln-q4_k_m 60 env KILN_BENCH_SHAPES="llama3-8b:q4_k_m" bench/gpu/run.sh kiln
# Where a batch-1 step's time goes (Nsight; the 1B's too, the furthest from
# its target at 711 tok/s on 2026-11-30; and Q4_K_M's at 16 streams,
# where the tensor-core product of packed blocks took 11.8 ms a step on
# 2026-11-30 against bf16's 6.1 ms on cuBLAS).
part profile-batch-1 100 env KILN_BENCH_PROFILE="llama3-8b:bf16:1 llama3.2-1b:bf16:1 llama3-8b:q4_k_m:1 llama3-8b:q4_k_m:16" \
  bench/gpu/run.sh profile
# The add + RMS norm folded into the batch-1 GEMVs around it (built without
# a GPU: two launches a layer fewer) against its own launch, on the 1B
# (the furthest from its target) and the 8B.
part norm-fold 80 env KILN_BENCH_SHAPES="llama3.2-1b:bf16 llama3-8b:bf16" bench/gpu/run.sh norm-fold
# Tensor-core decode attention split into rounds of 64 keys at least (since
# 2026-12-01, built without a GPU) against single cache blocks as before,
# whose merge was the suspect of batch 1's ~38 µs a layer; then Qwen3's and
# Gemma 2's shapes, whose norms run inside other launches since 2026-12-01.
part attention-splits 80 env KILN_BENCH_SHAPES="llama3.2-1b:bf16 llama3-8b:bf16" bench/gpu/run.sh attention-splits
part kiln-qwen3-gemma2 60 env KILN_BENCH_SHAPES="bench/gpu/shapes/qwen3-0.6b.json:bf16 bench/gpu/shapes/gemma2-2b.json:bf16" \
  bench/gpu/run.sh kiln
# cuBLAS's products at 16 and 64 streams and in a 2048-token prefill in its
# heuristics' algorithm and in cuBLASLt's timed fastest (the default since
# 2026-11-30, built without a GPU): the o projection streamed at 2.4 TB/s at
# 64 rows on 2026-11-30.
part gemm-algorithms 90 env KILN_BENCH_SHAPES="llama3-8b:bf16" bench/gpu/run.sh gemm-algorithms
# How the GEMVs (batch 1), decode attention (batch 64: the grouped kernel
# was issue-bound on 2026-11-30, tensor cores since) and the packed products
# at 16 rows (Q4_K gate/up at 0.65 TB/s on 2026-11-30; their shared bank
# conflicts removed since) use L1, shared memory, DRAM and issue (Nsight
# Compute's sections).
part kernel-memory 150 bench/gpu/run.sh kernel-memory
# Kernels written without a GPU under compute-sanitizer's memcheck (seen to
# work on the Firecracker machines): padded decode batches through graphs
# (split attention and its merge, the rotary launch), the KV caches, the
# device sampler. Reported in gpu-memcheck.md.
part memcheck 120 env KILN_GPU_SUITE_MEMCHECK=1 KILN_GPU_SUITE_ONLY="decode-graphs kv-cache device-sampler" \
  KILN_GPU_SUITE_TIMEOUT=100 tests/gpu/run.sh suite
# Sampling at temperature 1, top-p 0.95 over flat rows: 13.2 ms a step at
# batch 1 against greedy's 5.4 on 2026-11-30; a selection's weights are
# since worked out once, not on each of its 35 passes.
part sampled 80 env KILN_BENCH_SHAPES="llama3-8b:bf16" bench/gpu/run.sh sampled
# Decode attention on tensor cores (decode_attention.cu, built without a
# GPU) against the grouped CUDA-core kernel, issue-bound at 64 streams
# (57.8 µs a layer on 2026-11-30, ~10 µs by the new kernel's arithmetic).
part decode-attention 90 env KILN_BENCH_SHAPES="llama3-8b:bf16" bench/gpu/run.sh decode-attention
# A GGUF model's GEMV at 2 to 8 rows (its loads of x in KQuantSpread's
# order since 2026-11-30, a quarter of the lines of L1).
part small-batches 60 env KILN_BENCH_SHAPES="llama3-8b:q4_k_m" KILN_BENCH_GEMV_ROWS=2 \
  bench/gpu/run.sh dense-gemv
# Dense products of 2 to 8 rows on the GEMV or on cuBLAS (8 rows on the GEMV
# took 3.7 times cuBLAS's 16 on 2026-11-30; the threshold is 2 since).
part dense-gemv 90 env KILN_BENCH_SHAPES="llama3-8b:bf16" bench/gpu/run.sh dense-gemv
# Where a step's time goes at 64 streams and in prefill (Nsight Systems;
# Q4_K_M's 2048-token prefill ran at 37 % of the GEMM rate on 2026-11-30,
# bf16's at 63 %).
part profile 130 env KILN_BENCH_PROFILE="llama3-8b:bf16:64 llama3-8b:bf16:1:2048:1 llama3-8b:q4_k_m:1:2048:1" \
  bench/gpu/run.sh profile
# What programmatic launch and the tensor-core dense products gain.
part pdl 80 env KILN_BENCH_SHAPES="llama3.2-1b:bf16" bench/gpu/run.sh pdl
part dense 70 env KILN_BENCH_SHAPES="llama3-8b:bf16" bench/gpu/run.sh dense
part kiln-q4_k_m-fast 60 env KILN_BENCH_SHAPES="llama3-8b:q4_k_m+fast" bench/gpu/run.sh kiln
# IQ4_XS read packed (since 2026-12-03, built without a GPU; 4.25 bits a
# weight, Q4_K's 4.5): at batch 1 it should pass Q4_K_M's 179.8 tok/s.
part kiln-iq4_xs 60 env KILN_BENCH_SHAPES="llama3-8b:iq4_xs" bench/gpu/run.sh kiln
# Q3_K_M read packed (since 2026-12-04, built without a GPU; 3.44 bits a
# weight in Q3_K, 4.5 in the Q4_K of v, o and down).
part kiln-q3_k_m 60 env KILN_BENCH_SHAPES="llama3-8b:q3_k_m" bench/gpu/run.sh kiln
# Q8_0, what `--quantization q8_0` makes of a bf16 checkpoint (8.5 bits a
# weight: a batch-1 step reads 8.5 GB where bf16 reads 16).
part kiln-q8_0 60 env KILN_BENCH_SHAPES="llama3-8b:q8_0" bench/gpu/run.sh kiln
# Drafted decode steps (speculative decoding) against plain ones.
part speculative 60 env KILN_BENCH_SHAPES="llama3.2-1b:bf16" bench/gpu/run.sh speculative
# The fp8 KV cache against bf16 where attention reads as much as the weights.
part kv-fp8 120 env KILN_BENCH_SHAPES="llama3-8b:bf16" bench/gpu/run.sh kv-fp8

python3 bench/gpu/table.py "$results" > "$results/gpu-bench.md" 2>&1
echo >> "$log"
echo "Finished at $SECONDS s." >> "$log"
cat "$log" "$results/gpu-bench.md"
if [ -n "${OUT:-}" ]; then
  cp "$log" "$results/gpu-bench.md" "$OUT/"
  [ -f /tmp/kiln-gpu/out/gpu-suite.md ] && cp /tmp/kiln-gpu/out/gpu-suite.md "$OUT/"
  [ -f /tmp/kiln-gpu/out-memcheck/gpu-memcheck.md ] && cp /tmp/kiln-gpu/out-memcheck/gpu-memcheck.md "$OUT/"
  tar -C /tmp/kiln-gpu -czf "$OUT/lease-logs.tar.gz" bench out out-memcheck 2>/dev/null
  rm -f "$OUT/gpu-bench-json.tar.gz" "$OUT"/gpu-*-logs.tar.gz
fi
exit 0
