#!/usr/bin/env bash
# Builds llama.cpp natively on this machine, as the baseline of
# compare_llamacpp.sh: llama-cpp-python 0.3.36 from its PyPI source archive,
# compiled with GGML_NATIVE=ON (-march=native: every SIMD extension the CPU
# has) into a virtual environment, with numpy. About 7 minutes on 2 cores.
#
#   bench/cpu/build_llamacpp.sh [--amx auto|on|off] [VENV]   (default /work/llamacpp-py)
#
# AMX: ggml has AMX tile kernels (int8 and bf16 products) that -march=native
# compiles in on CPUs with AMX, but they have crashed on some of the Xeon VMs
# we use. `on` keeps them, `off` compiles them out (-mno-amx-*), `auto` (the
# default) keeps them if the CPU has AMX and a probe (prefill and decode of
# SmolLM2 from MODELS_DIR, default /work/models) runs cleanly, and otherwise
# rebuilds without. What was decided, and why, goes to VENV/kiln-build.txt
# (compare_llamacpp.sh puts it in its summary) and to stdout.
set -euo pipefail
AMX=auto
VENV=/work/llamacpp-py
while [ $# -gt 0 ]; do
    case "$1" in
        --amx) AMX="$2"; shift 2 ;;
        -h|--help) sed -n 2,16p "$0"; exit 0 ;;
        *) VENV="$1"; shift ;;
    esac
done
HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION=0.3.36
MODEL="${MODELS_DIR:-/work/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
has_amx=$(grep -qw amx_int8 /proc/cpuinfo && echo yes || echo no)

python3 -m venv "$VENV"
# llama-cpp-python's own dependencies (it is installed with --no-deps below).
"$VENV/bin/pip" install -q numpy typing_extensions diskcache jinja2 cmake ninja

# build on|off: (re)installs llama-cpp-python with or without AMX.
build() {
    local flags="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF"
    if [ "$1" = off ]; then
        # Explicit -mno-* flags win over -march=native whatever their order.
        local no="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
        flags="$flags '-DCMAKE_C_FLAGS=$no' '-DCMAKE_CXX_FLAGS=$no'"
    fi
    echo "building llama-cpp-python $VERSION with CMAKE_ARGS=$flags" >&2
    CMAKE_ARGS="$flags" PATH="$VENV/bin:$PATH" "$VENV/bin/pip" install -q --force-reinstall \
        --no-deps --no-binary llama-cpp-python --no-cache-dir "llama-cpp-python==$VERSION"
}

# probe: prefill 64 tokens and decode 16 with the built library, in a child;
# its output goes to VENV/kiln-amx-probe.log.
probe() {
    local ids rc=0
    ids=$(mktemp)
    seq -s, 1 64 > "$ids"
    "$VENV/bin/python" "$HERE/llamacpp_run.py" --model "$MODEL" --ids-file "$ids" \
        --max-new-tokens 16 > "$VENV/kiln-amx-probe.log" 2>&1 || rc=$?
    rm -f "$ids"
    return $rc
}

system_info() { "$VENV/bin/python" "$HERE/llamacpp_run.py" --system-info; }

case "$AMX" in
    on|off) build "$AMX"; why="--amx $AMX" ;;
    auto)
        if [ "$has_amx" = no ]; then
            build off; AMX=off; why="the CPU has no AMX"
        else
            build on
            if [ ! -f "$MODEL" ]; then
                AMX=on; why="CPU has AMX; not probed ($MODEL missing)"
            else
                rc=0; probe || rc=$?
                if [ "$rc" = 0 ]; then
                    AMX=on; why="CPU has AMX and the probe ran cleanly"
                elif [ "$rc" -gt 128 ]; then
                    echo "the AMX build crashed in the probe (signal $((rc - 128))): rebuilding without AMX" >&2
                    tail -5 "$VENV/kiln-amx-probe.log" >&2
                    build off; AMX=off; why="CPU has AMX but ggml's AMX build died of signal $((rc - 128)) in the probe"
                else
                    echo "the probe failed (exit $rc), not a crash; see $VENV/kiln-amx-probe.log" >&2
                    tail -5 "$VENV/kiln-amx-probe.log" >&2
                    exit 1
                fi
            fi
        fi ;;
    *) echo "--amx takes auto, on or off" >&2; exit 2 ;;
esac
echo "llama-cpp-python $VERSION, GGML_NATIVE=ON, AMX $AMX ($why); $(system_info)" | tee "$VENV/kiln-build.txt"
