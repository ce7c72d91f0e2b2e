#!/usr/bin/env bash
# Builds llama.cpp's llama-server natively on this machine from the llama.cpp
# that llama-cpp-python 0.3.36 vendors (its PyPI source archive), with the
# x86 SIMD levels set explicitly: AVX2/FMA/F16C/BMI2 and AVX-VNNI, AVX-512
# (F, VBMI, VNNI, BF16) where the CPU has them, AMX off (ggml's AMX path has
# crashed on the Xeons we use). About 7 minutes on 2 cores.
#
#   bench/serve/build_llama_server.sh [BUILD_DIR]   (default /work/llama-server-build)
#
# Needs Python 3, a C++ compiler and network access to PyPI; cmake and ninja
# come from PyPI into a throw-away virtual environment.
set -euo pipefail
BUILD="${1:-/work/llama-server-build}"
WORK="$(dirname "$BUILD")/llama-server-src"
VERSION=0.3.36
mkdir -p "$WORK"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q cmake ninja
archive="$WORK/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$archive" ]; then
    python3 - "$VERSION" "$archive" <<'PY'
import re, sys, urllib.request
version, target = sys.argv[1], sys.argv[2]
page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url = next(u for u in re.findall(r'href="([^"#]+)', page) if u.endswith(f"-{version}.tar.gz"))
urllib.request.urlretrieve(url, target)
PY
fi
tar xzf "$archive" -C "$WORK"
src="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
has() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
PATH="$WORK/venv/bin:$PATH" cmake -S "$src" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" \
    -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)" \
    -DGGML_AVX512="$(has avx512f)" -DGGML_AVX512_VBMI="$(has avx512vbmi)" \
    -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)" \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF
PATH="$WORK/venv/bin:$PATH" cmake --build "$BUILD" --target llama-server -j "$(nproc)"
echo "built $BUILD/bin/llama-server"
