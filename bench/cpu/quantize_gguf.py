#!/usr/bin/env python3
"""Quantizes a GGUF file with llama.cpp's own quantizer (`llama-quantize`'s
code, called through llama-cpp-python), for benchmarks of formats no
packaged model comes in.

    bench/cpu/quantize_gguf.py IN.gguf OUT.gguf TYPE [--pure] [--vocab-type TYPE2]

TYPE is a llama.cpp file type as `llama-quantize` spells it: IQ4_XS, IQ4_NL,
Q4_K_M, ... The input should hold unquantized weights (bf16 or f16: see
make_bf16_gguf.py, which dequantizes a packaged model). llama.cpp picks each
tensor's type as `llama-quantize` does, with its fallbacks: IQ4_XS rows whose
length is not a multiple of 256 become IQ4_NL, and the token embedding and
output matrices follow its rules for the file type. No importance matrix is
used. `--pure` quantizes every tensor it can to TYPE (llama-quantize's
`--pure`); `--vocab-type Q8_0` stores the token embeddings and the output
matrix as that ggml type (`--token-embedding-type`, `--output-tensor-type`):
with both, Q4_0 is what Kiln's `--quantization q4_0` computes at load. Needs
llama-cpp-python (e.g. the build of build_llamacpp.sh).
"""

import sys

import llama_cpp


def main() -> None:
    args = sys.argv[1:]
    pure = "--pure" in args
    if pure:
        args.remove("--pure")
    vocab_type = None
    if "--vocab-type" in args:
        at = args.index("--vocab-type")
        vocab_type = args[at + 1].upper()
        del args[at : at + 2]
    if len(args) != 3:
        sys.exit(__doc__)
    source, target, name = args[0], args[1], args[2].upper()
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}", None)
    if ftype is None:
        sys.exit(f"unknown file type {name!r}: llama_cpp has no LLAMA_FTYPE_MOSTLY_{name}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 0
    params.pure = pure
    if vocab_type is not None:
        ggml_type = getattr(llama_cpp, f"GGML_TYPE_{vocab_type}", None)
        if ggml_type is None:
            sys.exit(f"unknown ggml type {vocab_type!r}")
        params.token_embedding_type = ggml_type
        params.output_tensor_type = ggml_type
    status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), params)
    if status != 0:
        sys.exit(f"llama_model_quantize failed with status {status}")


if __name__ == "__main__":
    main()
