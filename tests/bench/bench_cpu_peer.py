#!/usr/bin/python3
"""bench_cpu_peer — tangram's CPU backend against llama.cpp on the same
weights, same machine, same prompts, runs interleaved (DESIGN.md §7).

Model: tangram-make-model with the Qwen3-0.6B shape (hidden 1024, 28
layers, 16 query / 8 KV heads of 128, SwiGLU 3072, tied embeddings, the
real qwen3 tokenizer: 596 M parameters), random fp32 weights, --seed 1,
written once into --workdir (2.4 GB; not the repository) with two GGUF
files of the same weights from tests/bench/peer/hf_to_gguf.py: F32 and
BF16 (rounded to nearest even, as tangram's --cpu-weights bf16 rounds).

Peer: llama.cpp through node-llama-cpp's prebuilt CPU build
(tests/bench/peer/llama_peer.mjs, installed from its lockfile into the
build tree), --threads T, its defaults otherwise (F16 KV cache, no flash
attention). Ours: tangram-generate --backend cpu --threads T --profile
none (full KV) --cpu-weights f32|bf16.

Workload: one prompt of --prompt random ids (default 256), --new greedy
tokens (default 32, eos ignored). Per thread count and repetition the four
single-stream runs go in turn (ours f32, llama f32, ours bf16, llama
bf16), so machine load hits both alike; each reports prefill tokens/s
(prompt / prefill wall, first token included) and decode tokens/s ((new -
1) / wall of the remaining steps). With --seqs S > 1 (default 8) it also
runs S sequences at once (S different prompts of the same length): llama
in one context of S sequences (its batches mix them), ours through
tangramd (router + one CPU worker, OMP_NUM_THREADS = T, full KV) with S
concurrent streamed /v1/completions. Two throughputs: all = S * new /
wall from the first prompt in to the last token out (prefills included);
decode = the tokens produced after every sequence has its first token,
over that window (llama: S * (new - 1) over its decode loop, which starts
once all prompts are in).
Decode is also given per CPU-second (new - 1 over the process's CPU time
of the decode, all threads: tangram-generate's decode_cpu_seconds,
node's process.cpuUsage()), which descheduling on a loaded machine does
not inflate (memory stalls still count). Printed: the median over
repetitions of each cell, every repetition's value, the ratios ours / llama's (> 1: tangram faster), whether the f32
runs chose the same greedy tokens, and the load average before and after.

Usage: bench_cpu_peer.py [--quick] [--threads 1,2] [--reps N]
       [--prompt N] [--new N] [--seqs S] [--workdir DIR] [--json FILE]
--quick: the tiny qwen3 model of the integration tests, 64-token prompt,
8 new tokens, 1 thread, 1 repetition, 2 sequences (ctest: bench-cpu-peer-
quick, so the benchmark cannot rot). Exits 1 when a run fails or a
package is missing (named).
"""
import argparse
import http.client as httplib
import json
import os
import random
import shutil
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "peer"))
import daemon_util as du  # noqa: E402

SHAPE = ["--arch", "qwen3", "--hidden", "1024", "--layers", "28", "--heads",
         "16", "--kv-heads", "8", "--head-dim", "128", "--ffn", "3072",
         "--tie", "--dtype", "fp32", "--seed", "1"]
QUICK = ["--arch", "qwen3", "--hidden", "64", "--layers", "2", "--heads",
         "4", "--kv-heads", "2", "--head-dim", "16", "--ffn", "128",
         "--dtype", "fp32", "--seed", "1"]


def load():
    return "%.2f %.2f %.2f" % os.getloadavg()


def prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randint(1000, 99999) for _ in range(n)]


def stream_one(d, name, ids, new):
    """One streamed greedy completion; {"times": arrival time of each
    chunk that carries a choice} or {"error"}."""
    body = json.dumps({"model": name, "prompt": ids, "max_tokens": new,
                       "temperature": 0, "ignore_eos": True,
                       "stream": True})
    conn = httplib.HTTPConnection(d.host, d.http_port, timeout=1800)
    times = []
    try:
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"error": "status %d: %s" % (resp.status,
                                                resp.read()[:300])}
        while True:
            line = resp.readline()
            if not line:
                break
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            j = json.loads(payload)
            if j.get("choices"):
                times.append(time.time())
    except OSError as e:
        return {"error": "request failed: %s" % e}
    finally:
        conn.close()
    return {"times": times}


def serve_batch(model, prompts, new, threads, weights, work):
    """S concurrent greedy completions through tangramd; returns
    {"wall_s", "tokens"} or {"error"}."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    n = len(prompts)
    ctx = max(len(p) for p in prompts) + new
    # KV for every sequence at full length, with room: 28 layers x 8 heads
    # x 128 x 2 (K, V) x 4 bytes = 229 KiB per token.
    kv = max(64, (n * ctx * 230 * 1024 * 3 // 2) >> 20)
    d = du.Daemon(model, work, args=[
        "--kv-memory", "%dMiB" % kv, "--prefill-chunk", "512",
        "--max-batched-tokens", "2048", "--heads-per-group", "1",
        "--cpu-weights", weights])
    os.makedirs(work, exist_ok=True)
    try:
        if not d.start(timeout=600):
            return {"error": "tangramd did not start: " +
                    "\n".join(ln for ln in d.log_text().splitlines()
                              if "error" in ln or "fatal" in ln)[-1500:]}
        out = [None] * n

        def one(i):
            out[i] = stream_one(d, os.path.basename(model), prompts[i], new)
        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        t0 = time.time()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.time() - t0
    finally:
        d.stop()
    for o in out:
        if "error" in o:
            return o
        if len(o["times"]) != new:
            return {"error": "%d streamed chunks, want one per token (%d)"
                    % (len(o["times"]), new)}
    # Decode window: from the moment every sequence has its first token
    # (all prefills done) to the last token, the tokens streamed inside it.
    start = max(o["times"][0] for o in out)
    end = max(o["times"][-1] for o in out)
    inside = sum(1 for o in out for t in o["times"] if t > start)
    return {"wall_s": wall, "prefill_s": start - t0,
            "decode_s": end - start, "decode_tokens": inside}


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--prompt", type=int, default=None)
    ap.add_argument("--new", type=int, default=None)
    ap.add_argument("--seqs", type=int, default=None)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    q = a.quick
    threads = [int(x) for x in (a.threads or "1").split(",")]
    reps = a.reps or (1 if q else 3)
    n_prompt = a.prompt or (64 if q else 256)
    new = a.new or (8 if q else 32)
    seqs = a.seqs if a.seqs is not None else (2 if q else 8)

    missing = du.missing_inputs(modules=[("numpy", "python3-numpy")],
                                tools=["node", "npm"])
    if missing:
        return du.fail_missing(missing)
    import peer
    root, why = peer.install()
    if root is None:
        print("FAIL: node-llama-cpp (tests/bench/peer): %s" % why)
        return 1

    tmp = None
    if a.workdir:
        work = a.workdir
    elif q:
        work = tmp = du.scratch_dir("bench-cpu-peer")
    else:
        work = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                            "tangram-bench-cpu-peer")
    os.makedirs(work, exist_ok=True)
    try:
        return run(a, q, peer, root, work, threads, reps, n_prompt, new,
                   seqs)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def run(a, q, peer, root, work, threads, reps, n_prompt, new, seqs):
    model = os.path.join(work, "qwen3-tiny" if q else "qwen3-0.6b-f32")
    t0 = time.time()
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        try:
            du.make_model_args(model, QUICK if q else SHAPE)
        except RuntimeError as e:
            print("FAIL: %s" % e)
            return 1
    ggufs = {}
    for dt in ("f32", "bf16"):
        ggufs[dt] = os.path.join(model, dt + ".gguf")
        err = peer.convert(model, ggufs[dt], dt)
        if err:
            print("FAIL: %s" % err)
            return 1
    print("bench-cpu-peer: tangram CPU backend vs llama.cpp (node-llama-cpp "
          "3.22.1 prebuilt CPU build), same weights")
    print("model: %s (%s), model + GGUF files ready in %.1f s"
          % (model, "tiny qwen3" if q else "Qwen3-0.6B shape, fp32",
             time.time() - t0))
    print("workload: prompt %d random ids, %d greedy new tokens, %d "
          "repetitions, runs interleaved; %d-sequence batch: %s"
          % (n_prompt, new, reps, seqs, "on" if seqs > 1 else "off"))
    print("load average at the start: %s" % load())
    ids = prompt(n_prompt, 2)
    batch = [prompt(n_prompt, 100 + i) for i in range(seqs)]
    variants = [("ours", "f32"), ("llama", "f32"), ("ours", "bf16"),
                ("llama", "bf16")]
    res = {}
    failed = []
    for t in threads:
        for r in range(reps):
            for who, dt in variants:
                if who == "ours":
                    x = peer.run_tangram(model, ids, new, t, weights=dt)
                else:
                    x = peer.run_llama(root, ggufs[dt], [ids], new, t)
                    if "error" not in x:
                        x["tokens"] = x["tokens"][0]
                if "error" in x:
                    failed.append("%s %s t%d: %s" % (who, dt, t, x["error"]))
                    print("FAIL: " + failed[-1])
                    continue
                cell = res.setdefault((t, who, dt), {
                    "pre": [], "dec": [], "dec_cpu": [], "tokens": []})
                cell["pre"].append(n_prompt / x["prefill_s"])
                cell["dec"].append((new - 1) / x["decode_s"])
                cell["dec_cpu"].append((new - 1) / x["decode_cpu_s"])
                cell["tokens"].append(x["tokens"])
                print("  t%d rep %d %-5s %-4s prefill %7.2f tok/s  decode "
                      "%6.2f tok/s, %6.2f tok/CPU-s  (load %s)" % (
                          t, r, who, dt, cell["pre"][-1], cell["dec"][-1],
                          cell["dec_cpu"][-1], load()), flush=True)
            if seqs > 1:
                for who, dt in (("ours", "f32"), ("llama", "f32")):
                    if who == "ours":
                        x = serve_batch(model, batch, new, t, dt,
                                        os.path.join(work, "daemon"))
                    else:
                        x = peer.run_llama(root, ggufs[dt], batch, new, t)
                        if "error" not in x:
                            x["wall_s"] = x["prefill_s"] + x["decode_s"]
                            x["decode_tokens"] = seqs * (new - 1)
                    if "error" in x:
                        failed.append("%s batch t%d: %s"
                                      % (who, t, x["error"]))
                        print("FAIL: " + failed[-1])
                        continue
                    cell = res.setdefault((t, who, "batch"), {"tps": [],
                                                              "dec": []})
                    cell["tps"].append(seqs * new / x["wall_s"])
                    cell["dec"].append(x["decode_tokens"] / x["decode_s"])
                    print("  t%d rep %d %-5s %d seqs  all %6.2f tok/s  decode "
                          "%6.2f tok/s  (wall %.1f s, prefills %.1f s, load "
                          "%s)" % (t, r, who, seqs, cell["tps"][-1],
                                   cell["dec"][-1], x["wall_s"],
                                   x["prefill_s"], load()), flush=True)

    print()
    print("| threads | tangram weights (llama.cpp GGUF) | prefill tok/s "
          "ours | llama.cpp | ratio | decode tok/s ours | llama.cpp | ratio "
          "| decode tok/CPU-s ours | llama.cpp | ratio | same tokens |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    med = statistics.median
    for t in threads:
        for dt in ("f32", "bf16"):
            o, l_ = res.get((t, "ours", dt)), res.get((t, "llama", dt))
            if not o or not l_:
                continue
            same = all(x == o["tokens"][0] for x in o["tokens"] +
                       l_["tokens"])
            cols = []
            for k in ("pre", "dec", "dec_cpu"):
                a_, b_ = med(o[k]), med(l_[k])
                cols += ["%.2f" % a_, "%.2f" % b_, "%.2f" % (a_ / b_)]
            print("| %d | %s (%s) | %s | %s |" % (
                t, dt, dt.upper(), " | ".join(cols),
                "yes" if same else "no"))
        bo, bl = res.get((t, "ours", "batch")), res.get((t, "llama",
                                                         "batch"))
        if bo and bl:
            ao, al = statistics.median(bo["tps"]), statistics.median(bl["tps"])
            do, dl = statistics.median(bo["dec"]), statistics.median(bl["dec"])
            print("| %d | f32, %d sequences (tangramd / one llama.cpp "
                  "context): all tokens / wall | | | | %.2f | %.2f | %.2f | "
                  "| | | |"
                  % (t, seqs, ao, al, ao / al))
            print("| %d | f32, %d sequences: decode window | | | | %.2f | "
                  "%.2f | %.2f | | | | |" % (t, seqs, do, dl, do / dl))
    print()
    print("every repetition (tok/s):")
    for k in sorted(res):
        print("  t%d %-5s %-5s %s" % (k[0], k[1], k[2], "; ".join(
            "%s %s" % (n, ", ".join("%.2f" % v for v in res[k][n]))
            for n in ("pre", "dec", "dec_cpu", "tps") if n in res[k])))
    print("load average at the end: %s" % load())
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"%d/%s/%s" % k: {n: v for n, v in c.items()
                                        if n != "tokens"}
                       for k, c in res.items()}, f, indent=1)
    if failed:
        print("FAIL: %d runs failed" % len(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
