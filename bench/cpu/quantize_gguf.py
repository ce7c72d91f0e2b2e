#!/usr/bin/env python3
"""Quantizes a GGUF file with llama.cpp's own quantizer (`llama-quantize`'s
code, called through llama-cpp-python), for benchmarks of formats no
packaged model comes in.

    bench/cpu/quantize_gguf.py IN.gguf OUT.gguf TYPE

TYPE is a llama.cpp file type as `llama-quantize` spells it: IQ4_XS, IQ4_NL,
Q4_K_M, ... The input should hold unquantized weights (bf16 or f16: see
make_bf16_gguf.py, which dequantizes a packaged model). llama.cpp picks each
tensor's type as `llama-quantize` does, with its fallbacks: IQ4_XS rows whose
length is not a multiple of 256 become IQ4_NL, and the token embedding and
output matrices follow its rules for the file type. No importance matrix is
used. Needs llama-cpp-python (e.g. the build of build_llamacpp.sh).
"""

import sys

import llama_cpp


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    source, target, name = sys.argv[1], sys.argv[2], sys.argv[3].upper()
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}", None)
    if ftype is None:
        sys.exit(f"unknown file type {name!r}: llama_cpp has no LLAMA_FTYPE_MOSTLY_{name}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 0
    status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), params)
    if status != 0:
        sys.exit(f"llama_model_quantize failed with status {status}")


if __name__ == "__main__":
    main()
