#!/usr/bin/env python3
"""Reference logits, token ids and greedy continuations of real GGUF models,
computed by Hugging Face transformers in float32.

For every model in MODELS whose .gguf file is in --models (default
/work/models) and every prompt in PROMPTS this writes, under
<out>/<model key>/ (default out: <models>/references):

    <prompt>.ids.json     {"ids": [...], "text": ..., "chat": bool, "add_special_tokens": bool}
    <prompt>.logits.npy   float32 [len(ids), vocab], teacher-forced logits of the prompt
    <prompt>.greedy.json  {"new_ids": [...16 or fewer if EOS...], "margins": [...],
                           "eos_token_id": ..., "stopped_at_eos": bool}

and <out>/<model key>/manifest.json (versions, the GGUF's sha256, per prompt
the float64 re-computation's deviation from the float32 logits, which is the
noise floor of the reference itself).

The model is loaded from the GGUF, dequantized to float32
(`AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=float32)`;
transformers needs `accelerate` to load GGUF files),
in eval mode with eager attention; the tokenizer is loaded from the same GGUF.
Prompt ids are what transformers' tokenizer produces: plain prompts with
`tokenizer(text)` (its default add_special_tokens=True), the chat prompt by
rendering the tokenizer's chat template (add_generation_prompt=True) and
tokenizing the rendered text without adding special tokens (the template
writes them). A model without a chat template gets the question as plain text.

Run (10–20 minutes for all three models on 2 cores):

    /root/venvs/ref/bin/python tests/real_models/gen_references.py [--models DIR] [--out DIR] [--only KEY ...]

Any other model (what a plugin author runs before `host verify`): a Hugging
Face model directory (config.json, safetensors, tokenizer) or a .gguf file,
with the standard prompts or your own (NAME=TEXT, repeatable; `--chat NAME`
renders that one with the chat template):

    python tests/real_models/gen_references.py --model PATH --out DIR [--prompt NAME=TEXT ...] [--chat NAME ...]
    host verify --model PATH --reference DIR [--atol 1e-3 --rtol 1e-4 --greedy]

Needs torch, transformers (and accelerate plus gguf for GGUF files), numpy.
The outputs are large (up to ~300 MB per model); keep them outside the repo.
"""

import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF conversion bars

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prompts import MODELS, PROMPTS  # noqa: E402

GREEDY_NEW_TOKENS = 16


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prompt_ids(tokenizer, text, chat):
    """Token ids as transformers produces them; returns (ids, rendered text, chat used, add_special_tokens)."""
    if chat and tokenizer.chat_template:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        return ids, rendered, True, False
    ids = tokenizer(text)["input_ids"]
    return ids, text, False, True


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)
        f.write("\n")


def run_model(key, model_path, out_dir, prompts=PROMPTS):
    """Writes the references of one model: a .gguf file or a model directory."""
    if os.path.isdir(model_path):
        directory, name, source = model_path, None, {}
    else:
        directory, name = os.path.split(model_path)
        source = {"gguf_file": name}
    started = time.time()
    tokenizer = AutoTokenizer.from_pretrained(directory, **source)
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", **source
    )
    model.eval()
    print(f"{key}: loaded {type(model).__name__} in {time.time() - started:.1f} s", flush=True)
    os.makedirs(out_dir, exist_ok=True)
    gen_config = model.generation_config
    eos = gen_config.eos_token_id
    manifest = {
        "generator": "tests/real_models/gen_references.py",
        "model": model_path,
        "gguf": name,
        "gguf_sha256": sha256(model_path) if name else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "architecture": type(model).__name__,
        "vocab_size": model.config.vocab_size,
        "eos_token_id": eos,
        "prompts": {},
    }
    model64 = None
    for prompt, text, chat in prompts:
        ids, rendered, used_chat, special = prompt_ids(tokenizer, text, chat)
        input_ids = torch.tensor([ids], dtype=torch.int64)
        with torch.no_grad():
            logits = model(input_ids).logits[0].float().numpy()
        np.save(os.path.join(out_dir, f"{prompt}.logits.npy"), logits.astype(np.float32))
        write_json(
            os.path.join(out_dir, f"{prompt}.ids.json"),
            {"ids": ids, "text": rendered, "chat": used_chat, "add_special_tokens": special},
        )

        with torch.no_grad():
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=GREEDY_NEW_TOKENS,
                return_dict_in_generate=True,
                output_scores=True,
                repetition_penalty=1.0,
                top_k=None,
                top_p=None,
                temperature=None,
            )
        new_ids = out.sequences[0, len(ids):].tolist()
        margins = []
        for step_scores in out.scores:
            top2 = torch.topk(step_scores[0].float(), 2).values
            margins.append(float(top2[0] - top2[1]))
        eos_set = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        write_json(
            os.path.join(out_dir, f"{prompt}.greedy.json"),
            {
                "new_ids": new_ids,
                "margins": margins,
                "eos_token_id": eos,
                "stopped_at_eos": bool(new_ids) and new_ids[-1] in eos_set,
                "text": tokenizer.decode(new_ids),
            },
        )

        # The reference's own noise floor: the same weights in float64.
        if model64 is None:
            import copy

            model64 = copy.deepcopy(model).double()
        with torch.no_grad():
            logits64 = model64(input_ids).logits[0].numpy()
        dev = np.abs(logits.astype(np.float64) - logits64)
        manifest["prompts"][prompt] = {
            "tokens": len(ids),
            "chat": used_chat,
            "max_abs_logit": float(np.abs(logits).max()),
            "fp32_vs_fp64_max_abs": float(dev.max()),
            "fp32_vs_fp64_max_rel": float((dev / np.maximum(1.0, np.abs(logits64))).max()),
            "min_greedy_margin": min(margins) if margins else None,
        }
        print(
            f"{key}/{prompt}: {len(ids)} tokens, max|logit| {np.abs(logits).max():.2f}, "
            f"fp32 vs fp64 {dev.max():.2e}, greedy {new_ids} (min margin {min(margins):.3f})",
            flush=True,
        )
    write_json(os.path.join(out_dir, "manifest.json"), manifest)
    print(f"{key}: done in {time.time() - started:.1f} s", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="/work/models", help="directory holding the .gguf files")
    parser.add_argument("--out", default=None, help="output directory (default: <models>/references)")
    parser.add_argument("--only", nargs="*", help="model keys to generate (default: all present)")
    parser.add_argument("--model", help="any model: a Hugging Face directory or a .gguf file (needs --out)")
    parser.add_argument("--prompt", action="append", default=[], metavar="NAME=TEXT",
                        help="with --model: a prompt of your own (repeatable; default: the standard four)")
    parser.add_argument("--chat", action="append", default=[], metavar="NAME",
                        help="with --model: render this --prompt with the chat template")
    args = parser.parse_args()
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()
    if args.model:
        if not args.out:
            sys.exit("--model needs --out DIR")
        prompts = PROMPTS
        if args.prompt:
            pairs = [p.split("=", 1) for p in args.prompt]
            if any(len(pair) != 2 or not pair[0] for pair in pairs):
                sys.exit("--prompt takes NAME=TEXT")
            prompts = [(n, text, n in args.chat) for n, text in pairs]
        run_model(os.path.basename(os.path.normpath(args.model)), args.model, args.out, prompts)
        return
    out = args.out or os.path.join(args.models, "references")
    done = 0
    for key, name in MODELS:
        if args.only and key not in args.only:
            continue
        path = os.path.join(args.models, name)
        if not os.path.exists(path):
            print(f"{key}: {path} is missing; skipped", file=sys.stderr)
            continue
        run_model(key, path, os.path.join(out, key))
        done += 1
    if done == 0:
        sys.exit("no model generated")


if __name__ == "__main__":
    main()
