#!/usr/bin/env python3
"""Compare Kiln's tokenization of real GGUF models with llama.cpp's.

Reads the JSON written by llamacpp_tokens.mjs (llama.cpp's ids for each string;
committed as tests/real_models/llamacpp_tokens.json, so no Node is needed here,
"default" = llama_tokenize(add_special=true, parse_special=true)), tokenizes
every string with Kiln through the release host

    host generate --model MODEL --prompt TEXT --max-new-tokens 1 --output json   -> "prompt_ids"

(or `host generate MODEL ... --json` with a host built before that CLI change)

(the tokenizer's default special-token handling, like transformers'
`tokenizer(text)`), and reports per model how many strings agree exactly and
every disagreement.

Optionally (--hf-tokenizers DIR, needs `transformers` importable by the Python
running this) a third column: Hugging Face transformers' `tokenizer(text)`
from DIR/<key>-hf (tokenizer.json exported from the same GGUF), to say which
side a disagreement is on.

Run (stdlib only without --hf-tokenizers):

    node tests/real_models/llamacpp_tokens.mjs     # optional: regenerate the JSON
    python3 tests/real_models/compare_tokens_llamacpp.py [tests/real_models/llamacpp_tokens.json] \
        [--host target/release/host] [--models /work/models] \
        [--hf-tokenizers /work/models/tokenizers] [--json-out FILE]

Exit status 0 always unless something could not run; agreement is a report,
not a pass/fail gate (llama.cpp is a loose reference: its tokenizers have
known small departures from the Hugging Face ones).

Findings, 2026-11-22 (llama.cpp v0.5.0 via node-llama-cpp 3.22.1, 32 strings):
  smollm2-135m 31/32, gemma3-270m 32/32, qwen2.5-coder-0.5b 30/32 agree.
  - "" (empty): Kiln's `generate` refuses an empty prompt ("the prompt is
    empty") for the models that add no BOS; not a tokenizer difference
    (llama.cpp and transformers both give []; Gemma gives [BOS] everywhere).
  - Qwen2.5, "<s> </s> ...": llama.cpp turns "</s>" (id 128247, a NORMAL token
    in the GGUF) into a control token at load ("control-looking token: 128247
    '</s>' was not control-type; this is probably a bug in the model. its type
    will be overridden") and so, with parse_special, emits [220, 128247] for
    " </s>"; transformers and Kiln give [690, 82, 29] (" </", "s", ">").
    Kiln matches transformers; the difference is llama.cpp's heuristic.
"""

import argparse
import json
import os
import subprocess
import sys

HF_DIRS = {
    "smollm2-135m": "smollm2-hf",
    "gemma3-270m": "gemma3-hf",
    "qwen2.5-coder-0.5b": "qwen2.5-hf",
}


_NEW_CLI = {}


def generate_cmd(host, model_path, text):
    """`host generate` for the binary at hand: `--model M --output json` (current
    CLI) or the older `generate M ... --json`."""
    if host not in _NEW_CLI:
        help_text = subprocess.run([host, "generate", "--help"], capture_output=True, text=True).stdout
        _NEW_CLI[host] = "--output" in help_text
    if _NEW_CLI[host]:
        return [host, "generate", "--model", model_path, "--prompt", text, "--max-new-tokens", "1", "--output", "json"]
    return [host, "generate", model_path, "--prompt", text, "--max-new-tokens", "1", "--json"]


def kiln_ids(host, model_path, text):
    proc = subprocess.run(generate_cmd(host, model_path, text), capture_output=True, text=True)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        return None, f"exit {proc.returncode}: {last[0][:200]}"
    out = proc.stdout.strip()
    # The JSON object is the last line printed on stdout.
    line = out.splitlines()[-1] if out else ""
    try:
        return json.loads(line)["prompt_ids"], None
    except (ValueError, KeyError) as e:
        return None, f"bad output: {e}: {out[:200]}"


def hf_tokenizer(hf_root, key):
    if not hf_root:
        return None
    d = os.path.join(hf_root, HF_DIRS.get(key, key))
    if not os.path.isdir(d):
        return None
    from transformers import AutoTokenizer  # noqa: PLC0415 (optional dependency)

    return AutoTokenizer.from_pretrained(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("llamacpp_json", nargs="?", default="tests/real_models/llamacpp_tokens.json")
    ap.add_argument("--host", default="target/release/host")
    ap.add_argument("--models", default="/work/models")
    ap.add_argument("--hf-tokenizers", default=None)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    with open(args.llamacpp_json, encoding="utf-8") as f:
        ref = json.load(f)
    print(f"reference: {ref['reference']}; mode compared: default = {ref['modes']['default']}")

    summary = {}
    details = {}
    for key, m in ref["models"].items():
        model_path = os.path.join(args.models, m["file"])
        tok = hf_tokenizer(args.hf_tokenizers, key)
        agree = 0
        hf_agree_kiln = hf_agree_llama = 0
        rows = []
        for e in m["entries"]:
            text, lc = e["text"], e["default"]
            kiln, err = kiln_ids(args.host, model_path, text)
            hf = tok(text)["input_ids"] if tok is not None else None
            if hf is not None:
                hf_agree_kiln += hf == kiln
                hf_agree_llama += hf == lc
            same = kiln == lc
            agree += same
            rows.append({"text": text, "llamacpp": lc, "kiln": kiln, "kiln_error": err, "hf": hf})
            if not same:
                print(f"\n[{key}] DISAGREE on {text!r}")
                print(f"  llama.cpp   : {lc}")
                print(f"  kiln        : {kiln if err is None else err}")
                if hf is not None:
                    side = "kiln" if hf == kiln else "llama.cpp" if hf == lc else "neither"
                    print(f"  transformers: {hf}   (matches {side})")
        n = len(m["entries"])
        summary[key] = {"strings": n, "agree": agree, "add_bos": m["add_bos"]}
        if tok is not None:
            summary[key]["transformers_agrees_kiln"] = hf_agree_kiln
            summary[key]["transformers_agrees_llamacpp"] = hf_agree_llama
        details[key] = rows

    print("\n| model | add BOS | strings | Kiln == llama.cpp | transformers == Kiln | transformers == llama.cpp |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, s in summary.items():
        print(
            f"| {key} | {s['add_bos']} | {s['strings']} | {s['agree']} | "
            f"{s.get('transformers_agrees_kiln', '-')} | {s.get('transformers_agrees_llamacpp', '-')} |"
        )
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"reference": ref["reference"], "summary": summary, "details": details}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
