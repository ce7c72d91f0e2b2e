#!/usr/bin/env bash
# Kiln vs llama.cpp on CPU: same GGUF, same token ids, same thread count,
# alternating runs, medians and ratios. See bench/cpu/README.md.
#
# Usage (from the repository root):
#   bench/cpu/compare_llamacpp.sh [--rounds N] [--models "smollm2 gemma3 qwen2.5"] [--out DIR]
#   (also smollm2-bf16: bench/cpu/make_bf16_gguf.py's bf16 copy of SmolLM2, and
#   smollm2-iq4_xs, qwen2.5-iq4_xs: the bf16 copies of SmolLM2 and Qwen2.5
#   quantized to IQ4_XS by bench/cpu/quantize_gguf.py; smollm2-q2_k likewise
#   quantized to Q2_K: its 30 MLP down projections are Q3_K, most others Q4_0;
#   smollm2-q4_k_m to Q4_K_M: 166 Q5_0, 15 Q8_0, 14 Q6_K and 16 Q4_K, the bytes
#   Kiln's `--quantization q4_k_m` makes of the bf16 copy)
# Environment:
#   HOST            Kiln's host binary               (default target/release/host)
#   MODELS_DIR      where the GGUF files are         (default /work/models)
#   LLAMACPP_PY     a Python with llama-cpp-python built natively on this machine
#                   (default /work/llamacpp-py/bin/python; bench/cpu/build_llamacpp.sh)
#   THREADS         threads for both engines         (default 2)
#   PRECISIONS      Kiln's --precision values to run (default "exact fast";
#                   "exact fast fast-residual" adds the third)
#   NICE            niceness of the measured processes (default 0)
#   QUIET_BUSY      before every run, wait until other processes use less than
#                   this fraction of the CPUs over one second (default 0.10) ...
#   QUIET_MAX_WAIT  ... but at most this many seconds (default 300)
#   MAX_INTERFERENCE  a run during which other processes used more than this
#                   percentage of the CPUs is repeated ... (default 10)
#   TRIES           ... at most this many times in all (default 3)
#
# Per model and round, each engine (Kiln in each of PRECISIONS, and llama.cpp;
# the order rotates every round) runs three fresh processes:
#   decode : 73-token prompt, 128 new tokens, greedy  -> prefill-73 tok/s,
#            decode tok/s (127 steps after the first token), peak RSS
#   prefill: 512-token prompt, 1 new token            -> prefill-512 tok/s
#   cold   : 73-token prompt, 1 new token             -> wall time from exec to
#            exit: cold start (load + prefill) to first token
# Both engines get the same ids: the first 73 / 512 token ids of
# bench/cpu/prompt.txt as Kiln tokenizes it (BOS included where the model adds
# one). Raw measurements go to DIR/raw.tsv (model, engine, round, metric,
# value, interference %), the summary to DIR/summary.md and stdout.
#
# Interference: for every run, the CPU time the whole machine spent (from
# /proc/stat) minus the run's own user+sys time, as a percentage of the CPU
# capacity over the run's wall time. llama.cpp's thread pool spins at its
# barriers, so with 2 threads on 2 cores any other busy process slows its
# decode by 10x or more (Kiln's far less): only clean runs count.

set -euo pipefail

ROUNDS=5
MODELS="smollm2 gemma3 qwen2.5"
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --models) MODELS="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h|--help) sed -n 2,35p "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

HERE="$(cd "$(dirname "$0")" && pwd)"
HOST="${HOST:-target/release/host}"
MODELS_DIR="${MODELS_DIR:-/work/models}"
LLAMACPP_PY="${LLAMACPP_PY:-/work/llamacpp-py/bin/python}"
THREADS="${THREADS:-2}"
NICE="${NICE:-0}"
QUIET_BUSY="${QUIET_BUSY:-0.10}"
QUIET_MAX_WAIT="${QUIET_MAX_WAIT:-300}"
MAX_INTERFERENCE="${MAX_INTERFERENCE:-10}"
TRIES="${TRIES:-3}"
OUT="${OUT:-$(mktemp -d /tmp/kiln-vs-llamacpp.XXXXXX)}"
mkdir -p "$OUT"
RAW="$OUT/raw.tsv"
: > "$RAW"
export RAYON_NUM_THREADS="$THREADS"
CLK_TCK="$(getconf CLK_TCK)"

# `host generate --model M ... --output json`, or, for a host built before that
# CLI change, `host generate M ... --json`.
if "$HOST" generate --help 2>/dev/null | grep -q -- '--output'; then
    NEW_CLI=1; GEN_JSON=(--output json)
else
    NEW_CLI=0; GEN_JSON=(--json)
fi

[ -x "$HOST" ] || { echo "no Kiln host at $HOST: cargo build --release -p kiln-host" >&2; exit 1; }
"$LLAMACPP_PY" -c 'import llama_cpp' 2>/dev/null || {
    echo "no llama-cpp-python at $LLAMACPP_PY: bench/cpu/build_llamacpp.sh" >&2
    exit 1
}
[ -x /usr/bin/time ] || { echo "needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 1; }

model_file() {
    case "$1" in
        smollm2) echo "SmolLM2-135M-Instruct.Q4_1.gguf" ;;
        gemma3) echo "gemma-3-270m-q4_k_m.gguf" ;;
        qwen2.5) echo "qwen2.5-coder-0.5b-instruct-q5_0.gguf" ;;
        # bench/cpu/make_bf16_gguf.py's bf16 copy of smollm2
        smollm2-bf16) echo "SmolLM2-135M-Instruct.BF16.gguf" ;;
        # its IQ4_XS (bench/cpu/quantize_gguf.py), and Qwen2.5's likewise
        smollm2-iq4_xs) echo "SmolLM2-135M-Instruct.IQ4_XS.gguf" ;;
        qwen2.5-iq4_xs) echo "qwen2.5-coder-0.5b-instruct-iq4_xs.gguf" ;;
        smollm2-q2_k) echo "SmolLM2-135M-Instruct.Q2_K.gguf" ;;
        smollm2-q4_k_m) echo "SmolLM2-135M-Instruct.Q4_K_M.gguf" ;;
        *) echo "unknown model key $1 (smollm2, gemma3, qwen2.5, smollm2-bf16, smollm2-iq4_xs, qwen2.5-iq4_xs, smollm2-q2_k, smollm2-q4_k_m)" >&2; return 1 ;;
    esac
}

now() { date +%s.%N; }

# "busy idle" jiffies of all CPUs together.
cpu_jiffies() { awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; }

# Fraction of all CPUs busy over the next second (this script is idle then).
cpu_busy() {
    local a b
    a=$(cpu_jiffies); sleep 1; b=$(cpu_jiffies)
    echo "$a $b" | awk '{busy = $3 - $1; idle = $4 - $2; t = busy + idle; if (t <= 0) t = 1; printf "%.3f", busy / t}'
}

# Wait (at most QUIET_MAX_WAIT s) until other processes leave the CPUs alone.
wait_quiet() {
    local start busy
    start=$(date +%s)
    while :; do
        busy=$(cpu_busy)
        awk -v b="$busy" -v q="$QUIET_BUSY" 'BEGIN {exit !(b < q)}' && return
        [ $(($(date +%s) - start)) -ge "$QUIET_MAX_WAIT" ] && return
        sleep 2
    done
}

# record MODEL ENGINE ROUND METRIC VALUE (the current run's INTERF appended)
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$INTERF" >> "$RAW"; }

# Peak RSS in MiB from a GNU time -v report.
peak_rss() { awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2 / 1024}' "$1"; }

# Our own user+sys seconds from a GNU time -v report.
own_cpu_s() { awk -F': ' '/User time \(seconds\)|System time \(seconds\)/ {s += $2} END {print s + 0}' "$1"; }

# launch ENGINE IDS_FILE MAX_NEW LOG TIMEFILE: one process of one engine.
launch() {
    case "$1" in
        kiln-*)
            nice -n "$NICE" /usr/bin/time -v -o "$5" "$HOST" generate "${GEN_MODEL[@]}" --prompt-ids "$(cat "$2")" \
                --max-new-tokens "$3" --temperature 0 --precision "${1#kiln-}" "${GEN_JSON[@]}" > "$4.out" 2> "$4"
            ;;
        llama.cpp)
            nice -n "$NICE" /usr/bin/time -v -o "$5" "$LLAMACPP_PY" "$HERE/llamacpp_run.py" \
                --model "$MODEL_PATH" --ids-file "$2" --max-new-tokens "$3" --threads "$THREADS" > "$4.out" 2> "$4"
            ;;
    esac
}

# measured ENGINE IDS_FILE MAX_NEW LOG TIMEFILE: launch on a quiet machine,
# repeat while others interfered; sets WALL_MS and INTERF (percent).
measured() {
    local try=1 j0 j1 t0 t1
    while :; do
        wait_quiet
        j0=$(cpu_jiffies); t0=$(now)
        launch "$@"
        t1=$(now); j1=$(cpu_jiffies)
        WALL_MS=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", (b - a) * 1000}')
        INTERF=$(echo "$j0 $j1 $(own_cpu_s "$5") $CLK_TCK" | awk '{
            busy = ($3 - $1) / $6; total = ($3 - $1 + $4 - $2) / $6; if (total <= 0) total = 1;
            x = (busy - $5) / total * 100; if (x < 0) x = 0; printf "%.0f", x }')
        if [ "$INTERF" -le "$MAX_INTERFERENCE" ] || [ "$try" -ge "$TRIES" ]; then
            return
        fi
        echo "      ($1 $(basename "$4" .log): others used ${INTERF}% of the CPUs; again)" >&2
        try=$((try + 1))
    done
}

# Kiln's log line: "prefill N tokens in X ms (.. tok/s); decode M steps in Y ms (.. tok/s)"
kiln_field() { # LOG prefill_tps|decode_tps|decode_steps
    sed -n 's/.*prefill \([0-9]*\) tokens in \([0-9.]*\) ms (\([0-9.]*\) tok\/s); decode \([0-9]*\) steps in \([0-9.]*\) ms (\([0-9.]*\) tok\/s).*/\3 \6 \4/p' "$1" |
        tail -1 | awk -v f="$2" '{ if (f=="prefill_tps") print $1; else if (f=="decode_tps") print $2; else print $3 }'
}

# llamacpp_run.py's JSON line.
llama_field() { # LOG.out prefill_tps|decode_tps|decode_steps|load_to_first_ms
    python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().split("\n")[-1])
f = sys.argv[2]
if f == "prefill_tps": print("%.2f" % (r["prompt_len"] / (r["prefill_ms"] / 1e3)))
elif f == "decode_tps": print("%.2f" % (r["decode_steps"] / (r["decode_ms"] / 1e3)))
elif f == "load_to_first_ms": print("%.0f" % (r["load_ms"] + r["prefill_ms"]))
else: print(r["decode_steps"])' "$1" "$2"
}

field() { # ENGINE LOG METRIC
    case "$1" in
        llama.cpp) llama_field "$2.out" "$3" ;;
        *) kiln_field "$2" "$3" ;;
    esac
}

# one_engine MODEL ENGINE ROUND
one_engine() {
    local key="$1" engine="$2" round="$3" d="$OUT/$1/$2.r$3"
    mkdir -p "$d"
    measured "$engine" "$IDS73" 128 "$d/decode.log" "$d/decode.time"
    record "$key" "$engine" "$round" prefill73_tps "$(field "$engine" "$d/decode.log" prefill_tps)"
    record "$key" "$engine" "$round" decode_tps "$(field "$engine" "$d/decode.log" decode_tps)"
    record "$key" "$engine" "$round" decode_steps "$(field "$engine" "$d/decode.log" decode_steps)"
    record "$key" "$engine" "$round" peak_rss_mib "$(peak_rss "$d/decode.time")"
    record "$key" "$engine" "$round" interference_pct "$INTERF"
    measured "$engine" "$IDS512" 1 "$d/prefill.log" "$d/prefill.time"
    record "$key" "$engine" "$round" prefill512_tps "$(field "$engine" "$d/prefill.log" prefill_tps)"
    record "$key" "$engine" "$round" interference_pct "$INTERF"
    measured "$engine" "$IDS73" 1 "$d/cold.log" "$d/cold.time"
    record "$key" "$engine" "$round" cold_first_token_ms "$WALL_MS"
    if [ "$engine" = llama.cpp ]; then
        record "$key" "$engine" "$round" load_to_first_token_ms "$(field "$engine" "$d/cold.log" load_to_first_ms)"
    fi
    record "$key" "$engine" "$round" interference_pct "$INTERF"
}

# What the Python runtime plus llama-cpp-python cost in RSS before any model.
INTERF=0
/usr/bin/time -v -o "$OUT/python_baseline.time" "$LLAMACPP_PY" -c 'import llama_cpp, numpy' > /dev/null 2>&1 || true
record all llama.cpp 0 python_baseline_rss_mib "$(peak_rss "$OUT/python_baseline.time" || echo nan)"

# The machine and the llama.cpp build, for the record.
{
    echo "- CPU: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) logical CPUs"
    echo "- x86 flags: $(grep -o -w -E 'avx2|avx512f|avx512_vnni|avx512vbmi|avx512_bf16|avx512_fp16|amx_tile|amx_int8|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "- llama.cpp: llama-cpp-python $("$LLAMACPP_PY" -c 'import llama_cpp; print(llama_cpp.__version__)'), $("$LLAMACPP_PY" "$HERE/llamacpp_run.py" --system-info)"
    [ -f "$(dirname "$LLAMACPP_PY")/../kiln-build.txt" ] && echo "- llama.cpp build: $(cat "$(dirname "$LLAMACPP_PY")/../kiln-build.txt")"
    echo "- Kiln: $("$HOST" --version 2>/dev/null || echo "$HOST"), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$OUT/machine.md"
cat "$OUT/machine.md" >&2

read -r -a PRECISION_LIST <<< "${PRECISIONS:-exact fast}"
ENGINES=(llama.cpp)
for p in "${PRECISION_LIST[@]}"; do ENGINES+=("kiln-$p"); done
for key in $MODELS; do
    MODEL_PATH="$MODELS_DIR/$(model_file "$key")"
    [ -f "$MODEL_PATH" ] || { echo "skip $key: $MODEL_PATH not found" >&2; continue; }
    mkdir -p "$OUT/$key"
    IDS73="$OUT/$key/ids73.txt"
    IDS512="$OUT/$key/ids512.txt"
    if [ "$NEW_CLI" = 1 ]; then GEN_MODEL=(--model "$MODEL_PATH"); else GEN_MODEL=("$MODEL_PATH"); fi
    "$HOST" generate "${GEN_MODEL[@]}" --prompt "$(cat "$HERE/prompt.txt")" --max-new-tokens 1 "${GEN_JSON[@]}" 2> /dev/null |
        tail -1 | python3 -c '
import json, sys
ids = json.load(sys.stdin)["prompt_ids"]
if len(ids) < 512:
    sys.exit("prompt.txt is only %d tokens" % len(ids))
open(sys.argv[1], "w").write(",".join(map(str, ids[:73])))
open(sys.argv[2], "w").write(",".join(map(str, ids[:512])))' "$IDS73" "$IDS512"
    echo "== $key ($(basename "$MODEL_PATH")), $ROUNDS rounds, $THREADS threads, nice $NICE, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    for round in $(seq 1 "$ROUNDS"); do
        # Rotate the engine order every round so no engine always runs first.
        for i in "${!ENGINES[@]}"; do
            engine="${ENGINES[$(((i + round - 1) % ${#ENGINES[@]}))]}"
            one_engine "$key" "$engine" "$round"
            echo "   round $round $engine: $(awk -F'\t' -v k="$key" -v e="$engine" -v r="$round" \
                '$1==k && $2==e && $3==r && $4!="decode_steps" {printf "%s=%s ", $4, $5}' "$RAW")" >&2
        done
    done
done

{ cat "$OUT/machine.md"; echo; python3 "$HERE/summarize.py" --max-interference "$MAX_INTERFERENCE" "$RAW"; } | tee "$OUT/summary.md"
echo "raw measurements and logs: $OUT" >&2
