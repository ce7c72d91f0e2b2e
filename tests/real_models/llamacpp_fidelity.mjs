#!/usr/bin/env node
// llama.cpp's own fidelity on the real-model references: for every model and
// prompt that `gen_references.py` wrote (transformers fp32 logits), evaluate
// the same prompt ids with llama.cpp (node-llama-cpp, CPU, the same GGUF),
// read its raw logits at every position, and print what `host verify` prints
// for Kiln: max |Δlogit|, top-1 agreement and mean/max KL(reference ‖ llama.cpp).
//
// Usage: node tests/real_models/llamacpp_fidelity.mjs [--models /work/models]
//            [--llama-dir /work/llamacpp] [--threads 2] [--only KEY ...]
// Prints one JSON object per model on stdout (progress on stderr).

import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const argv = process.argv.slice(2);
function arg(name, fallback) {
    const i = argv.indexOf(name);
    return i >= 0 && i + 1 < argv.length ? argv[i + 1] : fallback;
}
const modelsDir = arg("--models", "/work/models");
const llamaDir = arg("--llama-dir", process.env.LLAMACPP_DIR ?? "/work/llamacpp");
const threads = Number(arg("--threads", "2"));
const only = argv.includes("--only") ? argv.slice(argv.indexOf("--only") + 1) : null;

// The same models as gen_references.py.
const MODELS = [
    ["smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"],
    ["qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q5_0.gguf"],
    ["gemma3-270m", "gemma-3-270m-q4_k_m.gguf"],
];

/** A float32 [rows, cols] C-order .npy file. */
function readNpy(file) {
    const buf = fs.readFileSync(file);
    if (buf.toString("latin1", 1, 6) !== "NUMPY") throw new Error(`${file} is not .npy`);
    const major = buf[6];
    const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
    const start = major === 1 ? 10 : 12;
    const header = buf.toString("latin1", start, start + headerLen);
    if (!header.includes("'<f4'") || !header.includes("'fortran_order': False"))
        throw new Error(`${file}: want little-endian float32 in C order: ${header}`);
    const shape = header.match(/'shape': \((\d+), (\d+)\)/).slice(1, 3).map(Number);
    const data = new Float32Array(buf.buffer.slice(buf.byteOffset + start + headerLen, buf.byteOffset + buf.length));
    return { rows: shape[0], cols: shape[1], data };
}

function logSoftmax(row) {
    let max = -Infinity;
    for (const v of row) max = Math.max(max, v);
    let sum = 0;
    for (const v of row) sum += Math.exp(v - max);
    const logZ = max + Math.log(sum);
    return Float64Array.from(row, (v) => v - logZ);
}

function argmax(row) {
    let best = 0;
    for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
    return best;
}

const { getLlama, LlamaLogLevel } = await import(
    pathToFileURL(path.join(llamaDir, "node_modules", "node-llama-cpp", "dist", "index.js")).href
);
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads });

for (const [key, file] of MODELS) {
    if (only && !only.includes(key)) continue;
    const refs = path.join(modelsDir, "references", key);
    const gguf = path.join(modelsDir, file);
    if (!fs.existsSync(gguf) || !fs.existsSync(refs)) {
        console.error(`${key}: ${gguf} or ${refs} is missing; skipped`);
        continue;
    }
    const model = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
    const prompts = fs.readdirSync(refs).filter((f) => f.endsWith(".ids.json")).map((f) => f.slice(0, -9)).sort();
    const report = { model: key, gguf: file, llama_cpp: llama.llamaCppRelease?.release ?? "unknown", prompts: [] };
    for (const name of prompts) {
        const ids = JSON.parse(fs.readFileSync(path.join(refs, `${name}.ids.json`), "utf8")).ids;
        const reference = readNpy(path.join(refs, `${name}.logits.npy`));
        const context = await model.createContext({
            contextSize: ids.length + 1,
            batchSize: ids.length,
            threads: { ideal: threads, min: threads },
            sequences: 1,
        });
        const sequence = context.getSequence();
        const outputs = await sequence.controlledEvaluate(ids.map((t) => [t, { generateNext: { logits: true } }]));
        let maxAbs = 0, top1 = 0, klSum = 0, klMax = 0;
        const row = new Float32Array(reference.cols);
        for (let r = 0; r < reference.rows; r++) {
            const logits = outputs[r]?.next?.logits;
            if (!logits) throw new Error(`${key}/${name}: no logits at position ${r}`);
            row.fill(-Infinity);
            for (const [token, value] of logits) row[token] = value;
            const ref = reference.data.subarray(r * reference.cols, (r + 1) * reference.cols);
            for (let c = 0; c < row.length; c++) maxAbs = Math.max(maxAbs, Math.abs(row[c] - ref[c]));
            if (argmax(row) === argmax(ref)) top1++;
            const p = logSoftmax(ref), q = logSoftmax(row);
            let kl = 0;
            for (let c = 0; c < p.length; c++) kl += Math.exp(p[c]) * (p[c] - q[c]);
            kl = Math.max(kl, 0);
            klSum += kl;
            klMax = Math.max(klMax, kl);
        }
        await context.dispose();
        const entry = { name, positions: reference.rows, max_abs_diff: maxAbs, top1_agree: top1, mean_kl: klSum / reference.rows, max_kl: klMax };
        report.prompts.push(entry);
        console.error(`${key}/${name}: ${reference.rows} tokens, max|Δ| ${maxAbs.toFixed(3)}, top-1 ${top1}/${reference.rows}, mean KL ${entry.mean_kl.toFixed(5)}`);
    }
    await model.dispose();
    console.log(JSON.stringify(report));
}
