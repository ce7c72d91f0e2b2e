#!/usr/bin/env python3
"""Writes a random decoder embedding model for benchmarks (no model hub here).

    make_random_decoder.py OUT_DIR [--layers 4] [--dtype bfloat16]

Qwen3-Embedding-0.6B's shape (width 1,024, 16 query and 8 key/value heads of
128, MLP 3,072, 151,669-token vocabulary, tied embeddings) with `--layers`
of its 28 layers, random weights saved in `--dtype` (the real checkpoint's
is bf16), a byte-level BPE tokenizer trained on bench/cpu/prompt.txt that
appends `<|endoftext|>`, and sentence-transformers files (last-token
pooling, Normalize), as Qwen3-Embedding is laid out. The speed of a layer is
the real model's; the embeddings mean nothing.
"""

import argparse
import json
import os

import tokenizers
import torch
from sentence_transformers import SentenceTransformer, models
from tokenizers import processors
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3Model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EOT = "<|endoftext|>"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    torch.manual_seed(0)
    text = open(os.path.join(ROOT, "bench/cpu/prompt.txt"), encoding="utf-8").read()
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator([text], vocab_size=4000, min_frequency=1, special_tokens=[EOT])
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOT}", special_tokens=[(EOT, 0)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok._tokenizer, eos_token=EOT, pad_token=EOT, padding_side="left", model_max_length=32768
    )
    config = Qwen3Config(
        vocab_size=151669,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=args.layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )
    model = Qwen3Model(config).to(getattr(torch, args.dtype)).eval()
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    transformer = models.Transformer(args.out)
    modules = [transformer, models.Pooling(1024, pooling_mode="lasttoken"), models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(args.out)
    path = os.path.join(args.out, "config.json")
    saved = json.load(open(path, encoding="utf-8"))
    saved["architectures"] = ["Qwen3ForCausalLM"]
    json.dump(saved, open(path, "w", encoding="utf-8"), indent=2)


if __name__ == "__main__":
    main()
