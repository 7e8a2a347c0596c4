// llama_peer.mjs — llama.cpp (node-llama-cpp's prebuilt CPU build) as the
// peer of tangram's CPU backend: greedy decode from prompts given as token
// ids, with wall times and log-probabilities.
//
// Usage: node llama_peer.mjs REQUEST.json   (or the JSON on stdin)
// Request: {"model": GGUF path, "threads": T, "new": N,
//           "prompts": [[ids...], ...]  (one per sequence, run at once),
//           "top": K  (top-K log-probabilities per step; 0 = none),
//           "kv_type": "F16" (llama.cpp's default) | "F32"}
// Output (stdout, one JSON object):
//   {"load_s", "prefill_s", "decode_s", "prefill_cpu_s", "decode_cpu_s",
//    "threads", "sequences",
//    "tokens": [[N ids] per sequence],
//    "logprobs": [[per step {"token", "logprob", "top": [[id, lp]...]}]]
//                (only when top > 0)}
// prefill_s: wall time of all prompts' evaluation up to each one's first
// generated token (the sequences share batches); decode_s: wall time of
// the remaining N - 1 steps of every sequence; *_cpu_s: the process's CPU
// time (all threads, user + system) over the same spans, which a loaded
// machine does not inflate by descheduling. Greedy = temperature 0.
// Log-probabilities are log-softmax of llama.cpp's raw logits:
// logit - max - log(sum exp(logit - max)), from the top-K logits and the
// total logit weight node-llama-cpp reports, so no full-vocabulary map
// crosses into JavaScript.
// Exit 1 with a message on stderr on any failure (bad request, load).
import fs from "node:fs";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

function fail(msg) {
    process.stderr.write("llama_peer: " + msg + "\n");
    process.exit(1);
}

const text = process.argv[2] ? fs.readFileSync(process.argv[2], "utf8")
    : fs.readFileSync(0, "utf8");
const req = JSON.parse(text);
const threads = req.threads ?? 1;
const n = req.new ?? 16;
const top = req.top ?? 0;
const prompts = req.prompts;
const kvType = req.kv_type ?? "F16";
if (!req.model || !Array.isArray(prompts) || prompts.length < 1 || n < 1)
    fail("request needs model, prompts (non-empty) and new >= 1");

const now = () => Number(process.hrtime.bigint()) / 1e9;
const t0 = now();
const llama = await getLlama({gpu: false, build: "never", maxThreads: threads,
    logLevel: LlamaLogLevel.error, progressLogs: false});
const model = await llama.loadModel({modelPath: req.model, gpuLayers: 0});
const longest = Math.max(...prompts.map((p) => p.length));
const context = await model.createContext({
    sequences: prompts.length,
    contextSize: Math.ceil((longest + n + 16) / 256) * 256,
    batchSize: Math.max(512, longest * prompts.length),
    threads: {ideal: threads, min: threads},
    flashAttention: false,
    experimentalKvCacheKeyType: kvType,
    experimentalKvCacheValueType: kvType,
});
const seqs = prompts.map(() => context.getSequence());
const loadS = now() - t0;

function stepOpts() {
    const next = {token: true, options: {temperature: 0}};
    if (top > 0) {
        next.logits = {filter: {tokens: [], includeTop: top,
            includeSelected: true}};
        next.totalLogitWeight = true;
    }
    return {generateNext: next};
}

function record(out) {
    const nx = out?.next;
    if (nx == null || nx.token == null)
        fail("no token generated");
    if (top <= 0)
        return {token: nx.token};
    const lg = [...nx.logits.entries()];
    const max = Math.max(...lg.map(([, v]) => v));
    const lse = max + Math.log(nx.totalLogitWeight);
    lg.sort((a, b) => b[1] - a[1]);
    return {token: nx.token, logprob: nx.logits.get(nx.token) - lse,
        top: lg.slice(0, top).map(([t, v]) => [t, v - lse])};
}

const cpu = () => {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
};
const steps = prompts.map(() => []);
const tp = now(), cp = cpu();
await Promise.all(seqs.map(async (seq, s) => {
    const p = prompts[s];
    const items = p.slice(0, -1).concat([[p[p.length - 1], stepOpts()]]);
    const res = await seq.controlledEvaluate(items);
    steps[s].push(record(res[items.length - 1]));
}));
const td = now(), cd = cpu();
await Promise.all(seqs.map(async (seq, s) => {
    for (let i = 1; i < n; i++) {
        const prev = steps[s][i - 1].token;
        const res = await seq.controlledEvaluate([[prev, stepOpts()]]);
        steps[s].push(record(res[0]));
    }
}));
const te = now(), ce = cpu();

const out = {load_s: loadS, prefill_s: td - tp, decode_s: te - td,
    prefill_cpu_s: cd - cp, decode_cpu_s: ce - cd,
    threads: context.currentThreads ?? threads, sequences: prompts.length,
    tokens: steps.map((st) => st.map((x) => x.token))};
if (top > 0)
    out.logprobs = steps;
process.stdout.write(JSON.stringify(out) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
