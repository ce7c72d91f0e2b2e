#!/usr/bin/env python3
"""References from Kiln's exact precision, for machines without torch.

`gen_references.py` needs torch and transformers. Kiln's `--precision exact`
matches their fp32 logits within 1.1e-4 on these models (the real-model
suite checks it whenever the transformers references are present), so its
logits stand in for them when comparing the 8-bit modes of Kiln and
llama.cpp: the KL divergences differ by far less than the digits reported.

For every model and prompt of `prompts.py` this writes, under
`<out>/<key>/`, the prompt's ids (llama.cpp's tokenizer from the GGUF; the
chat prompt in the model's chat template, written out below as transformers
renders it) and Kiln's exact logits (`host verify --precision exact
--save`). Then `llamacpp_fidelity.py --models <dir>` and `host verify
--reference <out>/<key>` compare against them.

Usage (a Python with llama-cpp-python and numpy):
    python tests/real_models/exact_references.py --models /work/models \
        --out /work/models/exact/references [--host target/release/host]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from llama_cpp import Llama

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prompts import MODELS, PROMPTS  # noqa: E402

# The chat prompt as transformers' chat templates render it (Gemma 3's GGUF
# carries none: its "chat" prompt is the plain question, as in
# gen_references.py).
CHAT_TEMPLATES = {
    "smollm2-135m": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
    "qwen2.5-coder-0.5b": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="/work/models")
    ap.add_argument("--out", required=True)
    ap.add_argument("--host", default="target/release/host")
    args = ap.parse_args()
    for key, file in MODELS:
        gguf = os.path.join(args.models, file)
        llm = Llama(model_path=gguf, vocab_only=True, verbose=False)
        with tempfile.TemporaryDirectory() as prompts:
            for name, text, chat in PROMPTS:
                template = CHAT_TEMPLATES.get(key) if chat else None
                if template:
                    rendered = template.format(q=text)
                    ids = llm.tokenize(rendered.encode(), add_bos=False, special=True)
                else:
                    rendered = text
                    ids = llm.tokenize(text.encode(), add_bos=True, special=False)
                with open(os.path.join(prompts, f"{name}.ids.json"), "w") as f:
                    json.dump({"ids": ids, "text": rendered, "chat": bool(template)}, f)
                # `host verify` needs logits to read; these zeros are only
                # the prompt's carrier.
                np.save(os.path.join(prompts, f"{name}.logits.npy"),
                        np.zeros((len(ids), llm.n_vocab()), np.float32))
            out = os.path.join(args.out, key)
            subprocess.run([args.host, "verify", "--model", gguf, "--reference", prompts,
                            "--precision", "exact", "--save", out],
                           check=True, stdout=subprocess.DEVNULL)
        print(f"{key}: {out}", flush=True)


if __name__ == "__main__":
    main()
