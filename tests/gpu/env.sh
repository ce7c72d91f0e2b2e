# Sourced on the GPU machine by tests/gpu/run.sh and bench/gpu/run.sh:
# unpacks the binaries carried in .gpu/suite to $stage/bin and points the
# loader at the image's CUDA 13 libraries (its NVRTC and cuBLAS wheels).
stage=/tmp/kiln-gpu
mkdir -p "$stage"
# Unpacked once per payload (a lease's parts each source this).
# The hand-written kernels' sm_90 cubins (tests/gpu/pack.sh, host precompile)
# go into the kernel cache, so a cold machine loads them instead of
# compiling them.
if ! cmp -s .gpu/suite/commit "$stage/bin.commit" || [ .gpu/suite/bin.tar.xz -nt "$stage/bin.commit" ]; then
  tar -C "$stage" -xJf .gpu/suite/bin.tar.xz && cp .gpu/suite/commit "$stage/bin.commit"
  if [ -f .gpu/suite/kernels.tar.xz ]; then
    mkdir -p "$stage/cache" && tar -C "$stage/cache" -xJf .gpu/suite/kernels.tar.xz
  fi
fi
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
# cudarc opens the unversioned names (libcublas.so) before the versioned
# ones, so a CUDA toolkit's libcublas.so on the loader's path would be taken
# while cuBLAS then loads the wheel's libcublasLt.so.13 from LD_LIBRARY_PATH:
# two builds in one process (seen on the H200 image).
# Unversioned links to the wheels' libraries come first, so every CUDA
# library is the wheels'.
links=$stage/cuda-links
mkdir -p "$links"
for dir in $(echo "$libs" | tr ':' ' '); do
  for lib in "$dir"/lib*.so.13; do
    [ -e "$lib" ] && ln -sf "$lib" "$links/$(basename "$lib" .13)"
  done
done
export LD_LIBRARY_PATH=$links:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvrtc_dir=$(echo "$libs" | tr ':' '\n' | while read -r d; do [ -f "$d/libnvrtc.so.13" ] && echo "$d"; done | head -1)
[ -n "$nvrtc_dir" ] && export KILN_NVRTC_DIR=$nvrtc_dir
export KILN_CACHE_DIR=$stage/cache
