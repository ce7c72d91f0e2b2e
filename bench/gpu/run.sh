#!/usr/bin/env bash
# Kiln against PyTorch on the GPU machine, at the same shapes with random
# weights: decode at batch 1, 16 and 64 (128 prompt tokens, 256 generated,
# greedy: issue 14's 64-stream target and the PyTorch anchors of
# shared/notes/cuda.md) and the prefill of a 2048-token prompt. Needs the binaries carried
# in .gpu/suite (tests/gpu/pack.sh). Writes JSON per run to
# /tmp/kiln-gpu/bench (kept between the device tool's calls while the machine
# is warm) and copies gpu-bench.md (bench/gpu/table.py) and a tarball of
# every JSON to $OUT (the device tool returns at most 8 files).
# Each part fits the device tool's 10 minutes a command; `all` runs every
# part in one go.
#   bench/gpu/run.sh kiln              Kiln: llama3-8b bf16, q4_k_m and q4_k_m with
#                                      --precision fast (q4_k_m+fast: 8-bit x in the
#                                      decode GEMV), llama3.2-1b bf16
#   bench/gpu/run.sh torch MODE SHAPE  PyTorch (MODE eager or compiled) at SHAPE
#   bench/gpu/run.sh splits            Kiln's decode with the GEMV's warps per row
#                                      fixed to 1, 2, 4 and timed (KILN_GEMV_SPLIT)
#   bench/gpu/run.sh pdl               Kiln's decode at batch 1, 8 and 64 with and without
#                                      programmatic dependent launch
#                                      (KILN_NO_PROGRAMMATIC_LAUNCH), as text
#   bench/gpu/run.sh norm-fold         Kiln's decode at batch 1, 2 and 8 with the add + RMS
#                                      norm folded into the GEMVs around it and launched
#                                      on its own (KILN_NO_NORM_FOLD), as text
#   bench/gpu/run.sh attention-splits  Kiln's decode at batch 1 and 8 with tensor-core
#                                      attention split into rounds of 64 keys at least
#                                      and into single cache blocks as before
#                                      (KILN_SHORT_ATTENTION_SPLITS), as text
#   bench/gpu/run.sh dense             Kiln's decode at batch 16 and 64 (bf16 shapes),
#                                      dense products of 3 to 64 rows on cuBLAS and on
#                                      the tensor-core kernel (KILN_DENSE_ROWS), as text
#   bench/gpu/run.sh gemm-algorithms   Kiln's decode at batch 16 and 64 and a 2048-token
#                                      prefill (bf16 shapes) with cuBLAS's products in
#                                      the algorithm its heuristics pick and in
#                                      cuBLASLt's timed fastest (KILN_GEMM_ALGORITHM),
#                                      with each timing, as text
#   bench/gpu/run.sh dense-gemv        Kiln's decode at batch 1 to 8 and 16 (bf16 shapes)
#                                      with dense products of up to 1, 2, 4 and 8 rows
#                                      (KILN_BENCH_GEMV_ROWS) on the GEMV, the rest on
#                                      cuBLAS (KILN_DENSE_GEMV_ROWS), as text
#   bench/gpu/run.sh sampled           Kiln's decode at batch 1 and 64, greedy, sampled
#                                      (temperature 1, top-p 0.95) and greedy with a
#                                      repetition penalty (1.1) with and without async
#                                      scheduling: what the device sampler costs a step,
#                                      and what overlapping penalized picks gains, as text
#   bench/gpu/run.sh speculative       Kiln's decode at batch 1 and 16 with and without
#                                      n-gram drafts (4 drafts, lookup 1 to 3: random
#                                      weights' greedy output falls into repeats, so
#                                      this measures what a drafted step costs and
#                                      gains as acceptance allows, not a real
#                                      model's rate), as text
#   bench/gpu/run.sh decode-attention  Kiln's decode at batch 1 and 64 with attention on
#                                      the portable kernels and on tensor cores, as text
#   bench/gpu/run.sh kv-fp8            Kiln's decode at batch 16 and 64 over 2048-token
#                                      prompts with the bf16 and the fp8 (E4M3) KV cache:
#                                      what halving attention's bytes gains where the
#                                      cache is read as much as the weights, as text
#   bench/gpu/run.sh profile           where a decode step's time goes at batch 1, 16
#                                      and 64 (llama3-8b bf16 and q4_k_m, q4_k_m+fast
#                                      at batch 1), and a 2048-token prefill's: the
#                                      kernels of two decode steps mid-run, or of the
#                                      measured prefill (KILN_PROFILE_STEPS), by Nsight
#                                      Systems' kernel sums, else Nsight Compute
#   bench/gpu/run.sh kernel-memory     how chosen kernels of a decode step use the
#                                      memory system and issue (the GEMVs of llama3-8b
#                                      bf16 and q4_k_m at batch 1, grouped attention at
#                                      64, q4_k_m's tensor-core products at 16: L1 and
#                                      shared wavefronts, bank conflicts, DRAM
#                                      throughput, warp states, occupancy, launch
#                                      limits, pipes), by Nsight Compute's sections, as
#                                      CSV and a Markdown table of medians a kernel
#   bench/gpu/run.sh table             the table of every JSON so far
# KILN_BENCH_SHAPES and KILN_BENCH_PROFILE name weights DTYPE[+PRECISION]
# (`host benchmark --shape-dtype DTYPE --precision PRECISION`, exact unless
# given).
# KILN_BENCH_DEVICE=cuda-emulated KILN_BENCH_SHAPES=path/config.json:bf16
# dry-runs the Kiln part on a machine without a GPU.
#   bench/gpu/run.sh all
set -uo pipefail
cd "$(dirname "$0")/../.."
results=/tmp/kiln-gpu/bench
mkdir -p "$results"
device=${KILN_BENCH_DEVICE:-cuda}
input_len=${KILN_BENCH_INPUT_LEN:-128}
output_len=${KILN_BENCH_OUTPUT_LEN:-256}

# The benchmark's arguments for weights labelled DTYPE[+PRECISION] (e.g.
# q4_k_m+fast; exact precision unless given), in the array `weights`.
weights_of() {
  local dtype=${1%%+*} precision=exact
  [[ $1 == *+* ]] && precision=${1#*+}
  weights=(--shape-dtype "$dtype" --precision "$precision")
}

# Calls `$1 SHAPE DTYPE NAME` for each SHAPE:DTYPE[+PRECISION] of
# KILN_BENCH_SHAPES, with `weights` set (weights_of).
each_shape() {
  local run shape dtype
  for run in ${KILN_BENCH_SHAPES:-llama3-8b:bf16 llama3-8b:q4_k_m llama3-8b:q4_k_m+fast llama3.2-1b:bf16}; do
    shape=${run%%:*} dtype=${run##*:}
    weights_of "$dtype"
    "$1" "$shape" "$dtype" "$(basename "$shape" .json)"
  done
}

# The decode run also keeps the GEMV split timings made at load (every
# launch shape in each split, as µs and TB/s over all its layers' weights:
# the decode GEMVs' bandwidth in isolation) and cuBLAS's products' timings
# (cublas.rs: each candidate algorithm's µs) in kiln-*-gemv.log.
kiln_shape() {
  local shape=$1 dtype=$2 name=$3
  echo "== kiln $shape $dtype: decode"
  KILN_LOG=info,kiln_host::runtime::cuda::tune=debug,kiln_kernels::cuda::cublas=debug \
    "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" \
    --input-len "$input_len" --output-len "$output_len" --concurrency 1,16,64 --json \
    > "$results/kiln-$name-$dtype-decode.json" 2> >(tee "$results/kiln-$name-$dtype-gemv.log" >&2) ||
    echo "FAILED: $shape $dtype decode"
  echo "== kiln $shape $dtype: prefill ${KILN_BENCH_PREFILL_LEN:-2048}"
  "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" \
    --input-len "${KILN_BENCH_PREFILL_LEN:-2048}" --output-len 1 --concurrency 1 --json \
    > "$results/kiln-$name-$dtype-prefill.json" || echo "FAILED: $shape $dtype prefill"
}

kiln() {
  . tests/gpu/env.sh
  each_shape kiln_shape
}

# Decode at batch 1 and 8 with each split of the GEMV's rows among warps
# fixed, then chosen by timing at load (the default): what the choice gains.
splits_shape() {
  local shape=$1 dtype=$2 name=$3 split
  for split in 1 2 4 timed; do
    echo "== kiln $shape $dtype: decode, KILN_GEMV_SPLIT=$split"
    KILN_GEMV_SPLIT=$split "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" \
      --input-len "$input_len" --output-len 64 --concurrency 1,8 --json \
      > "$results/splits-$name-$dtype-$split.json" || echo "FAILED: $shape $dtype split $split"
  done
}

splits() {
  . tests/gpu/env.sh
  each_shape splits_shape
}

# Decode with a switch of Kiln's on (the default) and off (`VAR=1`), as
# `switch_shape PREFIX VAR CONCURRENCY WHAT SHAPE DTYPE NAME`: text, in
# PREFIX-NAME-DTYPE-{on,off}.txt.
switch_shape() {
  local prefix=$1 var=$2 concurrency=$3 what=$4 shape=$5 dtype=$6 name=$7 mode
  for mode in on off; do
    echo "== kiln $shape $dtype: decode, $what $mode"
    local switch=()
    [ "$mode" = off ] && switch=("$var=1")
    env "${switch[@]}" "$bin/host" benchmark --shape "$shape" "${weights[@]}" \
      --device "$device" --input-len "$input_len" --output-len 64 --concurrency "$concurrency" \
      2>&1 | tee "$results/$prefix-$name-$dtype-$mode.txt" || echo "FAILED: $shape $dtype $prefix $mode"
  done
}

# Decode with programmatic dependent launch on (the default on sm_90) and
# off: what overlapping each kernel's start with the previous one's end
# gains. Text, in pdl-*.txt.
pdl_shape() {
  switch_shape pdl KILN_NO_PROGRAMMATIC_LAUNCH 1,8,64 "programmatic launch" "$@"
}

pdl() {
  . tests/gpu/env.sh
  each_shape pdl_shape
}

# Decode with the add + RMS norm between two GEMVs folded into them (the
# default) and launched on its own: two launches a layer at batch 1 (and
# 2 for dense weights; at 8 dense products run on cuBLAS, where nothing is
# folded). Text, in norm-fold-*.txt.
norm_fold_shape() {
  switch_shape norm-fold KILN_NO_NORM_FOLD 1,2,8 "norm folded" "$@"
}

norm_fold() {
  . tests/gpu/env.sh
  each_shape norm_fold_shape
}

# Decode at batch 1 and 8 with tensor-core attention's splits of a round of
# 64 keys at least (the default) and of single cache blocks, as before
# (three of a block's four warps idle at ~200 positions). Text, in
# attention-splits-*.txt.
attention_splits_shape() {
  switch_shape attention-splits KILN_SHORT_ATTENTION_SPLITS 1,8 "whole-round splits" "$@"
}

attention_splits() {
  . tests/gpu/env.sh
  each_shape attention_splits_shape
}

# Decode at 16 and 64 streams with dense bf16 products of 3 to 64 rows on
# cuBLAS (the default) and on the tensor-core kernel of qmatmul.cu, which
# runs the matrices that share x as one launch (llama3-8b and llama3.2-1b
# bf16 unless KILN_BENCH_SHAPES says otherwise). Text, in dense-*.txt.
dense_shape() {
  local shape=$1 dtype=$2 name=$3 mode
  for mode in cublas tensor-cores; do
    echo "== kiln $shape $dtype: decode, dense rows on $mode"
    KILN_DENSE_ROWS=$mode "$bin/host" benchmark --shape "$shape" "${weights[@]}" \
      --device "$device" --input-len "$input_len" --output-len 64 --concurrency 16,64 \
      2>&1 | tee "$results/dense-$name-$dtype-$mode.txt" || echo "FAILED: $shape $dtype dense $mode"
  done
}

dense() {
  . tests/gpu/env.sh
  KILN_BENCH_SHAPES=${KILN_BENCH_SHAPES:-llama3-8b:bf16 llama3.2-1b:bf16} each_shape dense_shape
}

# Decode at 16 and 64 streams and a 2048-token prefill with cuBLAS's
# products (more rows than the GEMV takes) in the algorithm cuBLAS's
# heuristics pick and in the one of cuBLASLt's candidates timed fastest at
# first use (the default), with the timings (llama3-8b bf16 unless
# KILN_BENCH_SHAPES says otherwise). Text, in gemm-algorithms-*.txt.
gemm_algorithms_shape() {
  local shape=$1 dtype=$2 name=$3 mode
  for mode in heuristic timed; do
    echo "== kiln $shape $dtype: decode, products in cuBLAS's $mode algorithm"
    local out=$results/gemm-algorithms-$name-$dtype-$mode.txt
    KILN_GEMM_ALGORITHM=$mode KILN_LOG=info,kiln_kernels::cuda::cublas=debug \
      "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" \
      --input-len "$input_len" --output-len 64 --concurrency 16,64 \
      2>&1 | tee "$out" || echo "FAILED: $shape $dtype $mode"
    echo "== kiln $shape $dtype: prefill 2048, products in cuBLAS's $mode algorithm"
    KILN_GEMM_ALGORITHM=$mode KILN_LOG=info,kiln_kernels::cuda::cublas=debug \
      "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" \
      --input-len 2048 --output-len 1 --concurrency 1 \
      2>&1 | tee -a "$out" || echo "FAILED: $shape $dtype $mode prefill"
  done
}

gemm_algorithms() {
  . tests/gpu/env.sh
  KILN_BENCH_SHAPES=${KILN_BENCH_SHAPES:-llama3-8b:bf16} each_shape gemm_algorithms_shape
}

# Decode at batch 1 to 8 and 16 with the GEMV taking dense products of up
# to 1, 2 (the default), 4 and 8 rows of x (KILN_BENCH_GEMV_ROWS), cuBLAS
# the rest: where the GEMV's reads of x (once per row of W) start to cost
# more than cuBLAS (llama3-8b bf16 unless KILN_BENCH_SHAPES says otherwise;
# a GGUF shape's GEMV takes up to 8 rows whatever the setting). Text, in
# dense-gemv-*.txt.
dense_gemv_shape() {
  local shape=$1 dtype=$2 name=$3 rows
  for rows in ${KILN_BENCH_GEMV_ROWS:-1 2 4 8}; do
    echo "== kiln $shape $dtype: decode, dense GEMV up to $rows rows"
    KILN_DENSE_GEMV_ROWS=$rows "$bin/host" benchmark --shape "$shape" "${weights[@]}" \
      --device "$device" --input-len "$input_len" --output-len 64 --concurrency 1,2,3,4,8,16 \
      2>&1 | tee "$results/dense-gemv-$name-$dtype-$rows.txt" || echo "FAILED: $shape $dtype dense-gemv $rows"
  done
}

dense_gemv() {
  . tests/gpu/env.sh
  KILN_BENCH_SHAPES=${KILN_BENCH_SHAPES:-llama3-8b:bf16} each_shape dense_gemv_shape
}

# Decode greedy, sampled (temperature 1, top-p 0.95) and greedy with a
# repetition penalty, async and not, llama3-8b and llama3.2-1b bf16 unless
# KILN_BENCH_SHAPES says otherwise: greedy against sampled is the device
# sampler's cost a step; penalized against penalized-sync is what launching
# the picks after the previous step's are read, while the step runs, gains.
# Text, in sampled-*.txt.
sampled_shape() {
  local shape=$1 dtype=$2 name=$3 mode
  for mode in greedy sampled penalized penalized-sync; do
    echo "== kiln $shape $dtype: decode, $mode"
    local sampling=(--temperature 0)
    case "$mode" in
      sampled) sampling=(--temperature 1 --top-p 0.95) ;;
      penalized) sampling=(--temperature 0 --repetition-penalty 1.1) ;;
      penalized-sync) sampling=(--temperature 0 --repetition-penalty 1.1 --no-async-scheduling) ;;
    esac
    "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" \
      --input-len "$input_len" --output-len 64 --concurrency 1,64 "${sampling[@]}" \
      2>&1 | tee "$results/sampled-$name-$dtype-$mode.txt" || echo "FAILED: $shape $dtype $mode"
  done
}

sampled() {
  . tests/gpu/env.sh
  KILN_BENCH_SHAPES=${KILN_BENCH_SHAPES:-llama3-8b:bf16 llama3.2-1b:bf16} each_shape sampled_shape
}

# Decode with and without speculative decoding's drafts (greedy, so the
# drafted rows are picked on the device). Text, in speculative-*.txt: the
# drafts kept per level are in the table's last column.
speculative_shape() {
  local shape=$1 dtype=$2 name=$3 mode
  local config='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'
  for mode in plain ngram; do
    echo "== kiln $shape $dtype: decode, $mode"
    local drafts=()
    [ "$mode" = ngram ] && drafts=(--speculative-config "$config")
    "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" \
      --input-len "$input_len" --output-len "$output_len" --concurrency 1,16 --temperature 0 \
      "${drafts[@]}" 2>&1 | tee "$results/speculative-$name-$dtype-$mode.txt" || echo "FAILED: $shape $dtype $mode"
  done
}

speculative() {
  . tests/gpu/env.sh
  KILN_BENCH_SHAPES=${KILN_BENCH_SHAPES:-llama3-8b:bf16 llama3.2-1b:bf16} each_shape speculative_shape
}

# `host benchmark` of one shape (SHAPE DTYPE NAME, as each_shape passes
# them) once for each of VALUES of OPTION, ARGS after: text in
# $results/PREFIX-NAME-DTYPE-VALUE.txt.
#   benchmark_each SHAPE DTYPE NAME PREFIX OPTION "VALUES" ARGS...
benchmark_each() {
  local shape=$1 dtype=$2 name=$3 prefix=$4 option=$5 values=$6 value
  shift 6
  for value in $values; do
    echo "== kiln $shape $dtype: $prefix, $option $value"
    "$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device" "$option" "$value" "$@" \
      2>&1 | tee "$results/$prefix-$name-$dtype-$value.txt" || echo "FAILED: $shape $dtype $option $value"
  done
}

# Decode at 1 and 64 streams over 512-token prompts with attention on the
# portable CUDA-core kernels and on tensor cores (decode_attention.cu, the
# default): at 64 streams the grouped CUDA-core kernel
# took 57.8 µs a layer on the H200 (2026-11-30), bound by issue (llama3-8b
# bf16 unless KILN_BENCH_SHAPES says otherwise). Text, in
# decode-attention-*.txt.
decode_attention_shape() {
  benchmark_each "$@" decode-attention --attention-backend "portable auto" \
    --input-len 512 --output-len 256 --concurrency 1,64 --temperature 0
}

decode_attention() {
  . tests/gpu/env.sh
  KILN_BENCH_SHAPES=${KILN_BENCH_SHAPES:-llama3-8b:bf16} each_shape decode_attention_shape
}

# Decode over long prompts with the bf16 and the fp8 KV cache (llama3-8b
# bf16 unless KILN_BENCH_SHAPES says otherwise): at 64 sequences of ~2k
# positions Llama-3-8B's cache reads ~17 GB a step in bf16 beside 16 GB of
# weights. 512 tokens generated: with 64 (2026-11-30) the prefills of the
# 2048-token prompts took most of the run and the ITL said nothing of the
# cache. Text, in kv-fp8-*.txt.
kv_fp8_shape() {
  benchmark_each "$@" kv-fp8 --kv-cache-dtype "bfloat16 fp8" \
    --input-len 2048 --output-len 512 --concurrency 16,64 --temperature 0
}

kv_fp8() {
  . tests/gpu/env.sh
  KILN_BENCH_SHAPES=${KILN_BENCH_SHAPES:-llama3-8b:bf16} each_shape kv_fp8_shape
}

# Nsight Compute's command, if the machine has it.
nsight_compute() {
  command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1
}

# Each run's kernel time against its wall time, per kernel
# (bench/gpu/kernels.py), with whichever Nsight tool the machine has.
# Nsight Compute runs with the clocks left alone (`--clock-control none`):
# by default it locks them at base (1.36 GHz on the H200 on 2026-11-30,
# against ~1.98 in a benchmark), and serializes kernels either way.
profile() {
  . tests/gpu/env.sh
  local nsys ncu
  nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  ncu=$(nsight_compute)
  # shape:dtype:batch[:prompt tokens:generated tokens]
  for run in ${KILN_BENCH_PROFILE:-llama3-8b:bf16:1 llama3-8b:bf16:16 llama3-8b:bf16:64 llama3-8b:q4_k_m:1 llama3-8b:q4_k_m+fast:1 llama3-8b:q4_k_m:16 llama3-8b:q4_k_m:64 llama3-8b:bf16:1:2048:1}; do
    IFS=: read -r shape dtype batch prompt generated <<< "$run"
    prompt=${prompt:-$input_len} generated=${generated:-64}
    weights_of "$dtype"
    local name=profile-$shape-$dtype-$batch-$prompt-$generated
    local cmd=("$bin/host" benchmark --shape "$shape" "${weights[@]}" --device "$device"
      --input-len "$prompt" --output-len "$generated" --concurrency "$batch" --json)
    # The profiler sees only these steps (KILN_PROFILE_STEPS): two decode
    # steps well into the measured level, or the measured prompt's prefill
    # (the warm-up's is prefill step 0).
    local window=decode:$((generated / 2))..$((generated / 2 + 2))
    [ "$generated" -le 1 ] && window=prefill:1..2
    export KILN_PROFILE_STEPS=$window
    echo "== $name ($window)"
    if [ -n "$nsys" ]; then
      "$nsys" profile --force-overwrite true --cuda-graph-trace node --capture-range=cudaProfilerApi \
        --capture-range-end=stop -o "$results/$name" \
        "${cmd[@]}" > "$results/$name.json" || { echo "FAILED: $name"; continue; }
      "$nsys" stats --force-export true --report cuda_gpu_kern_sum --format csv \
        -o "$results/$name" "$results/$name.nsys-rep" > /dev/null
      python3 bench/gpu/kernels.py nsys "$results/${name}_cuda_gpu_kern_sum.csv" "$results/$name.json" \
        | tee "$results/$name.md"
      rm -f "$results/$name.nsys-rep" "$results/$name.sqlite"
    elif [ -n "$ncu" ]; then
      "$ncu" --csv --clock-control none --metrics gpu__time_duration.sum --profile-from-start off --launch-count 2000 \
        "${cmd[@]}" > "$results/$name.ncu.csv" 2> "$results/$name.log" || { echo "FAILED: $name"; continue; }
      python3 bench/gpu/kernels.py ncu "$results/$name.ncu.csv" | tee "$results/$name.md"
    else
      echo "no Nsight Systems or Nsight Compute on this machine" | tee "$results/$name.md"
    fi
    unset KILN_PROFILE_STEPS
  done
}

# Nsight Compute's memory, warp-state and occupancy sections for the first
# launches of chosen kernels in a decode step mid-run: whether a kernel
# waits on DRAM, on L1 (wavefronts per request: the lines a load touched)
# or on issue. KILN_BENCH_MEMORY: KERNEL-REGEX:DTYPE:BATCH runs on the
# llama3-8b shape.
kernel_memory() {
  . tests/gpu/env.sh
  local ncu run kernel dtype batch
  ncu=$(nsight_compute)
  [ -n "$ncu" ] || { echo "no Nsight Compute on this machine"; return 1; }
  for run in ${KILN_BENCH_MEMORY:-kiln_gemv:q4_k_m:1 kiln_gemv:bf16:1 kiln_decode_attention:bf16:64 kiln_qmm:q4_k_m:16}; do
    IFS=: read -r kernel dtype batch <<< "$run"
    weights_of "$dtype"
    local name=memory-$kernel-llama3-8b-$dtype-$batch
    echo "== $name"
    KILN_PROFILE_STEPS=decode:16..17 "$ncu" --csv --clock-control none --page details --profile-from-start off \
      --kernel-name "regex:$kernel" --launch-count 12 --section SpeedOfLight \
      --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section Occupancy \
      --section LaunchStats --section ComputeWorkloadAnalysis \
      "$bin/host" benchmark --shape llama3-8b "${weights[@]}" --device "$device" \
      --input-len "$input_len" --output-len 32 --concurrency "$batch" --json \
      > "$results/$name.csv" 2> "$results/$name.log" || { echo "FAILED: $name"; tail -5 "$results/$name.log"; continue; }
    grep -c "\"$kernel" "$results/$name.csv" | sed 's/^/metric rows: /'
    python3 bench/gpu/kernels.py sections "$results/$name.csv" > "$results/$name.md"
  done
}

torch_baseline() {
  local mode=$1 shape=$2
  echo "== torch $mode $shape"
  python3 bench/gpu/torch_baseline.py --shape "$shape" --modes "$mode" --batch 1,16,64 \
    --input-len "$input_len" --output-len "$output_len" --prefill-len 2048 \
    --json "$results/torch-$shape-$mode.json"
}

table() {
  python3 bench/gpu/table.py "$results" | tee "$results/gpu-bench.md"
}

case "${1:-}" in
  kiln) kiln ;;
  splits) splits ;;
  pdl) pdl ;;
  norm-fold) norm_fold ;;
  attention-splits) attention_splits ;;
  dense) dense ;;
  dense-gemv) dense_gemv ;;
  gemm-algorithms) gemm_algorithms ;;
  sampled) sampled ;;
  speculative) speculative ;;
  kv-fp8) kv_fp8 ;;
  decode-attention) decode_attention ;;
  profile) profile ;;
  kernel-memory) kernel_memory ;;
  torch) torch_baseline "${2:?mode}" "${3:?shape}" ;;
  table) table ;;
  all)
    kiln
    splits
    pdl
    norm_fold
    attention_splits
    dense
    gemm_algorithms
    dense_gemv
    sampled
    speculative
    kv_fp8
    decode_attention
    profile
    kernel_memory
    for shape in llama3-8b llama3.2-1b; do
      for mode in eager compiled; do torch_baseline "$mode" "$shape"; done
    done
    table
    ;;
  *) sed -n 2,77p "$0" >&2; exit 2 ;;
esac
if [ -n "${OUT:-}" ]; then
  [ -f "$results/gpu-bench.md" ] && cp "$results/gpu-bench.md" "$OUT/"
  tar -C "$results" -czf "$OUT/gpu-bench-json.tar.gz" .
fi
exit 0
