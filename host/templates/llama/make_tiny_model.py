#!/usr/bin/env python3
"""A tiny random `{{arch}}` checkpoint and its transformers reference, for
`host verify`. The reference is transformers' `LlamaForCausalLM` with
`hidden_act: gelu_pytorch_tanh`, which is what this variant computes.

    python fixtures/make_tiny_model.py [--out fixtures/tiny]

Writes OUT/model (config.json naming {{arch}}, model.safetensors, a
word-level tokenizer.json); then make the reference logits with Kiln's
generator and compare:

    python {{kiln}}/tests/real_models/gen_references.py --model OUT/model --out OUT/reference
    host verify --model OUT/model --reference OUT/reference \
        --custom-architectures target/debug/lib{{lib}}.so --atol 1e-4 --greedy

Needs torch, transformers, tokenizers, numpy.
"""

import argparse
import json
import os

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(93)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "tiny"))
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, hidden_act="gelu_pytorch_tanh",
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    directory = os.path.join(args.out, "model")
    model.save_pretrained(directory, safe_serialization=True)
    with open(os.path.join(directory, "config.json")) as f:
        saved = json.load(f)
    saved["architectures"] = ["{{arch}}"]
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(saved, f, indent=2)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(directory)
    print(f"wrote {directory}")


if __name__ == "__main__":
    main()
