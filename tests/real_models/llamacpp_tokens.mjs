#!/usr/bin/env node
// Tokenize a fixed list of varied strings with llama.cpp (through the
// node-llama-cpp bindings) for each real GGUF model, and write JSON.
//
// llama.cpp is the independent reference here: nobody on this project wrote it.
// Two tokenizations per string and model:
//
//   "default": what llama.cpp's own tools (llama-cli, llama-server,
//              llama-tokenize) do with a prompt: llama_tokenize(add_special=true,
//              parse_special=true), i.e. BOS prepended when the GGUF says
//              tokenizer.ggml.add_bos_token (EOS appended when add_eos_token),
//              and special-token text such as "<|im_start|>" parsed into the
//              special token. This is the counterpart of Hugging Face
//              transformers' `tokenizer(text)` and of Kiln's `--prompt`.
//   "raw":     llama_tokenize(add_special=false, parse_special=false): no
//              BOS/EOS, special-token text tokenized as plain text.
//
// node-llama-cpp's `model.tokenize(text, specialTokens)` is
// common_tokenize(vocab, text, add_special=false, parse_special=specialTokens);
// BOS/EOS are added here from the model's own add_bos/add_eos flags
// (`model.tokens.shouldPrependBosToken` / `shouldAppendEosToken`), exactly as
// llama_tokenize(add_special=true) does.
//
// Setup (outside the repo; prebuilt CPU binaries, ~35 s):
//   mkdir -p /work/llamacpp && cd /work/llamacpp && npm init -y && npm install node-llama-cpp
// Run:
//   node tests/real_models/llamacpp_tokens.mjs [--llama-dir /work/llamacpp] \
//       [--models /work/models] [--out tests/real_models/llamacpp_tokens.json]
// Compare with Kiln: tests/real_models/compare_tokens_llamacpp.py

import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

export const MODELS = [
    ["smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"],
    ["gemma3-270m", "gemma-3-270m-q4_k_m.gguf"],
    ["qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q5_0.gguf"],
];

// Keep in sync with nothing: the comparison script reads the strings back from
// the JSON this writes.
export const STRINGS = [
    "",
    "Hello world",
    "hello, world!",
    " leading space",
    "trailing space ",
    "two  spaces   three    four",
    "    indented four",
    "line one\nline two",
    "blank lines\n\n\nthree",
    "windows\r\nline end",
    "tab\tseparated\tvalues",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "3.14159265358979323846",
    "12345678901234567890 and 1,000,000.00",
    "Call 555-0123 in 2026.",
    "I'm sure they're, we've, she'll, it's, don't",
    "UPPER lower MiXeD CamelCase snake_case",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber \u00c5ngstr\u00f6m",
    "e\u0301 (decomposed accent)",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\ud55c\uad6d\uc5b4",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "emoji \ud83d\ude00\ud83d\udc4d\ud83c\udffd \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 \ud83c\uddeb\ud83c\uddf7",
    "math: \u2200x \u2208 \u211d, x\u00b2 \u2265 0 \u2192 \u221a(x\u00b2) = |x|",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|>",
    "<s> </s> <bos> <eos> <start_of_turn>user\nhi<end_of_turn>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "https://example.com/path?q=1&r=two#frag",
    "!!!??? ... --- *** ###",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
];

function arg(name, fallback) {
    const i = process.argv.indexOf(name);
    return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

async function main() {
    const llamaDir = arg("--llama-dir", process.env.LLAMACPP_DIR ?? "/work/llamacpp");
    const modelsDir = arg("--models", "/work/models");
    const out = arg("--out", "tests/real_models/llamacpp_tokens.json");
    const entry = path.join(llamaDir, "node_modules", "node-llama-cpp", "dist", "index.js");
    const { getLlama, LlamaLogLevel } = await import(pathToFileURL(entry).href);
    const pkg = JSON.parse(
        fs.readFileSync(path.join(llamaDir, "node_modules", "node-llama-cpp", "package.json"), "utf8"),
    );
    const info = JSON.parse(
        fs.readFileSync(
            path.join(llamaDir, "node_modules", "node-llama-cpp", "llama", "llama.cpp.info.json"),
            "utf8",
        ),
    );

    const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
    const result = {
        reference: `llama.cpp ${info.tag} via node-llama-cpp ${pkg.version}`,
        modes: {
            default: "llama_tokenize(add_special=true, parse_special=true)",
            raw: "llama_tokenize(add_special=false, parse_special=false)",
        },
        models: {},
    };
    for (const [key, file] of MODELS) {
        const modelPath = path.join(modelsDir, file);
        if (!fs.existsSync(modelPath)) {
            console.error(`skip ${key}: ${modelPath} not found`);
            continue;
        }
        const model = await llama.loadModel({ modelPath, vocabOnly: true });
        const t = model.tokens;
        const bos = t.shouldPrependBosToken ? [t.bos] : [];
        const eos = t.shouldAppendEosToken ? [t.eos] : [];
        const entries = STRINGS.map((text) => ({
            text,
            default: [...bos, ...model.tokenize(text, true), ...eos],
            raw: model.tokenize(text, false),
        }));
        result.models[key] = {
            file,
            bos: t.bos ?? null,
            eos: t.eos ?? null,
            add_bos: Boolean(t.shouldPrependBosToken),
            add_eos: Boolean(t.shouldAppendEosToken),
            entries,
        };
        console.error(`${key}: ${entries.length} strings, add_bos=${t.shouldPrependBosToken}`);
        await model.dispose();
    }
    // One line per string: small diffs when the reference is regenerated.
    const text = JSON.stringify(result, (k, v) => (k === "entries" ? "@ENTRIES@" : v), 1);
    const pieces = text.split('"@ENTRIES@"');
    const keys = Object.keys(result.models);
    let body = pieces[0];
    for (let i = 0; i < keys.length; i++) {
        const rows = result.models[keys[i]].entries.map((e) => "    " + JSON.stringify(e));
        body += "[\n" + rows.join(",\n") + "\n   ]" + pieces[i + 1];
    }
    fs.writeFileSync(out, body + "\n");
    console.error(`wrote ${out}`);
    await llama.dispose();
}

await main();
