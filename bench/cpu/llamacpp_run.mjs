#!/usr/bin/env node
// One llama.cpp run, the counterpart of one `host generate --prompt-ids ...`
// process: load the GGUF, prefill the given token ids, then greedy-decode
// --max-new-tokens tokens (EOS is not a stop: the count is fixed), and print
// one JSON line of timings to stdout.
//
// Timings (milliseconds), measured like Kiln's generate log:
//   load_ms     loadModel + createContext + getSequence
//   prefill_ms  evaluating the prompt until the first new token is sampled
//   decode_ms   the remaining max_new_tokens - 1 steps (evaluate one token, sample)
//   first_token_ms  performance.now() at the first new token: time since this
//               Node process started, Node and addon start-up included
//
// Uses node-llama-cpp from --llama-dir (installed outside the repo, see README.md).
// Usage: node bench/cpu/llamacpp_run.mjs --model M.gguf --ids-file F --max-new-tokens N
//            [--threads 2] [--llama-dir /work/llamacpp]

import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

function arg(name, fallback) {
    const i = process.argv.indexOf(name);
    return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

const llamaDir = arg("--llama-dir", process.env.LLAMACPP_DIR ?? "/work/llamacpp");
const modelPath = arg("--model");
const ids = fs.readFileSync(arg("--ids-file"), "utf8").trim().split(",").map(Number);
const maxNew = Number(arg("--max-new-tokens", "128"));
const threads = Number(arg("--threads", "2"));

const { getLlama, LlamaLogLevel } = await import(
    pathToFileURL(path.join(llamaDir, "node_modules", "node-llama-cpp", "dist", "index.js")).href
);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads });

const t0 = performance.now();
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({
    contextSize: ids.length + maxNew + 1,
    batchSize: Math.max(ids.length, 1),
    threads: { ideal: threads, min: threads },
    sequences: 1,
});
const sequence = context.getSequence();
const t1 = performance.now();

const generated = [];
let tFirst = 0;
let tLast = 0;
const tStart = performance.now();
for await (const token of sequence.evaluate(ids, { temperature: 0 })) {
    generated.push(token);
    if (generated.length === 1) tFirst = performance.now();
    if (generated.length >= maxNew) break;
}
tLast = performance.now();

const out = {
    engine: "llama.cpp",
    prompt_len: ids.length,
    generated: generated.length,
    load_ms: t1 - t0,
    prefill_ms: tFirst - tStart,
    decode_steps: generated.length - 1,
    decode_ms: tLast - tFirst,
    first_token_ms: tFirst,
    threads: context.currentThreads ?? threads,
    batch_size: context.batchSize,
    context_size: context.contextSize,
    flash_attention: context.flashAttention,
    cpu_math_cores: llama.cpuMathCores,
    generated_ids: generated,
};
process.stdout.write(JSON.stringify(out) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
