#!/usr/bin/python3
"""Integration test of the CUDA backend: tangramd --backend cuda serves.

Without a usable NVIDIA GPU (nvidia-smi -L lists none) it checks only that
a CUDA worker refuses to start with a clear message (a CPU-only build says
it has no CUDA backend; a CUDA build without a device says there is no
usable device) and exits 77 (skipped).

With a GPU: a tiny qwen3 model with head_dim 64 (the CUDA kernels take 64
and 128) is served by --backend cpu and --backend cuda, with full KV and
with a compressing profile (tangram-profile build from a synthetic
retention file). For each: /health 200; /v1/models and the gRPC-free
HTTP path work; greedy completions with logprobs give, per step, a chosen
token whose CPU log-probability is within 0.1 nat of the CPU's best
(bf16 on the GPU against fp32 on the CPU may flip near-ties, so the tokens
themselves are compared only up to the first near-tie); 8 concurrent
streaming requests all finish with [DONE]; the KV pages return to zero
after they finish; a seeded sampled request replays identically. With two
or more GPUs also --tp 2 on the CUDA backend (NCCL) against --tp 1.
"""
import json
import os
import shutil
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()

MODEL_ARGS = ["--arch", "qwen3", "--hidden", "256", "--layers", "2",
              "--heads", "8", "--kv-heads", "4", "--head-dim", "64",
              "--ffn", "384", "--dtype", "bf16", "--seed", "21"]
PROMPTS = ["The quick brown fox jumps over the lazy dog and",
           "A KV cache per conversation grows with every turn, so",
           "1, 2, 3, 4, 5, 6, 7, 8,"]
MAX_TOKENS = 16
NEAR_TIE = 0.1


def make_model(out):
    return du.make_model_args(out, MODEL_ARGS)


def make_profile(work):
    """A skewed profile of the model: 2 layers x 4 KV heads, H_p = 1."""
    return du.make_skewed_profile(work, 2, 4, 64, 5, n_samples=16, low=0.1)



def complete(d, prompt, extra=None):
    body = {"model": "model", "prompt": prompt, "max_tokens": MAX_TOKENS,
            "temperature": 0, "logprobs": 5, "ignore_eos": True}
    body.update(extra or {})
    st, _, raw = du.http("POST", d.base_url + "/v1/completions",
                         json.dumps(body).encode(),
                         {"Content-Type": "application/json"}, timeout=120)
    j = du.json_of(raw)
    if st != 200 or not j:
        return None, "status %s: %s" % (st, raw[:300])
    lp = j["choices"][0].get("logprobs") or {}
    return lp.get("tokens"), lp.get("top_logprobs")


def close_greedy(ref, got):
    """Each step's token agrees, or the reference's top two were within
    NEAR_TIE there (the rest of the sequence then cannot be compared)."""
    return du.greedy_agrees(ref[0], ref[1], got[0], NEAR_TIE)


def streams_finish(d, n):
    ok = []

    def one(i):
        body = json.dumps({"model": "model", "prompt": PROMPTS[i % 3],
                           "max_tokens": 24, "stream": True,
                           "temperature": 0.8, "seed": i}).encode()
        st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                             {"Content-Type": "application/json"},
                             timeout=120)
        ok.append(st == 200 and raw.rstrip().endswith(b"data: [DONE]"))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(ok) == n and all(ok)


def pages_used(d):
    s = du.fetch_metrics(d.base_url)
    return du.metric(s, "tangram_kv_pages_used", rank="0")


def serve_and_compare(model, work, profile, tp, name):
    args = ["--kv-memory", "256MiB", "--heads-per-group", "1"]
    ref = None
    cpu = du.Daemon(model, work, args=args + ["--backend", "cpu"],
                    profile=profile)
    with cpu:
        if not C.check(cpu.start(), name + ": cpu daemon ready",
                       cpu.log_text()[-2000:]):
            return
        ref = [complete(cpu, p) for p in PROMPTS]
    gpu = du.Daemon(model, work, args=args + ["--backend", "cuda", "--tp",
                                              str(tp)], profile=profile)
    with gpu:
        if not C.check(gpu.start(timeout=180), name + ": cuda daemon ready",
                       gpu.log_text()[-3000:]):
            return
        st, _, raw = du.http("GET", gpu.base_url + "/v1/models")
        C.check(st == 200 and b"model" in raw, name + ": /v1/models")
        for p, r in zip(PROMPTS, ref):
            got = complete(gpu, p)
            C.check(close_greedy(r, got), name + ": greedy close to cpu: " + p,
                    "cpu %s\ncuda %s" % (r[0], got[0]))
        C.check(streams_finish(gpu, 8), name + ": 8 concurrent streams end")
        C.check(du.wait_for(lambda: pages_used(gpu) == 0, 10),
                name + ": pages return to 0")
        a = complete(gpu, PROMPTS[0], {"temperature": 0.9, "seed": 7})
        b = complete(gpu, PROMPTS[0], {"temperature": 0.9, "seed": 7})
        C.check(a[0] is not None and a[0] == b[0],
                name + ": seeded sampling replays")


def refused_without_gpu(model, work):
    d = du.Daemon(model, work, args=["--backend", "cuda"])
    with d:
        d.start(timeout=30)
        line = d.start_failure() or ""
        C.check("no CUDA device" in line or "no CUDA backend" in line,
                "cuda worker refuses clearly without a GPU", line or
                d.log_text()[-1500:])


def main():
    if not du.have_daemon():
        print("skipped: tangramd not built")
        return 77
    work = du.scratch_dir("tg_cuda_daemon.")
    try:
        model = make_model(os.path.join(work, "model"))
        n = du.gpu_count()
        if n == 0:
            refused_without_gpu(model, work)
            if C.summary() != 0:
                return 1
            print("skipped: no NVIDIA GPU")
            return 77
        profile = make_profile(work)
        serve_and_compare(model, work, None, 1, "full KV")
        serve_and_compare(model, work, profile, 1, "profile")
        if n >= 2:
            serve_and_compare(model, work, None, 2, "tp 2 full KV")
            serve_and_compare(model, work, profile, 2, "tp 2 profile")
        return C.summary()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
