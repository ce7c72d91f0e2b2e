# Sourced on the GPU machine by tests/gpu/run.sh and bench/gpu/run.sh:
# unpacks the binaries carried in .gpu/suite to $stage/bin and points the
# loader at the image's CUDA 13 libraries (its NVRTC and cuBLAS wheels).
stage=/tmp/kiln-gpu
mkdir -p "$stage"
tar -C "$stage" -xJf .gpu/suite/bin.tar.xz
bin=$stage/bin
libs=$(python3 - <<'PY'
import glob, os, site
dirs = set()
for base in site.getsitepackages():
    for name in ("libnvrtc.so.13", "libcublas.so.13"):
        for path in glob.glob(os.path.join(base, "nvidia", "**", name), recursive=True):
            dirs.add(os.path.dirname(path))
print(":".join(sorted(dirs)))
PY
)
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvrtc_dir=$(echo "$libs" | tr ':' '\n' | while read -r d; do [ -f "$d/libnvrtc.so.13" ] && echo "$d"; done | head -1)
[ -n "$nvrtc_dir" ] && export KILN_NVRTC_DIR=$nvrtc_dir
export KILN_CACHE_DIR=$stage/cache
