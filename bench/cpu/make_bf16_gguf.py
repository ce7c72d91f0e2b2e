#!/usr/bin/env python3
"""Writes a bf16 copy of a GGUF file, for benchmarks of bf16 weights.

    bench/cpu/make_bf16_gguf.py IN.gguf OUT.gguf

Every quantized matrix is dequantized (the `gguf` package's reference
dequantization) and stored as BF16; F32 tensors (the norms) stay F32; all
metadata (tokenizer, chat template, hyperparameters) is copied. The weights
are the quantized model's, so the model still talks; what a benchmark of it
measures is the products of a bf16 checkpoint, as Hugging Face ships them,
in Kiln and in llama.cpp on the same file. Needs `pip install gguf numpy`.
"""

import sys

import gguf
from gguf import GGMLQuantizationType as Q

KEEP = {Q.F32, Q.BF16}


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, target = sys.argv[1], sys.argv[2]
    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        if tensor.tensor_type in KEEP:
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
            continue
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        bits = gguf.quants.quantize(weights, Q.BF16)
        writer.add_tensor(tensor.name, bits, raw_dtype=Q.BF16)
        print(f"{tensor.name}: {tensor.tensor_type.name} -> BF16 {list(weights.shape)}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
