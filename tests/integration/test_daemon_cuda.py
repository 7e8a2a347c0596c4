#!/usr/bin/python3
"""Integration test of the CUDA backend: tangramd --backend cuda serves, and
scores tokens as --backend cpu does.

Equivalence is measured by teacher forcing, so that both backends score
the same token sequence whatever either would have generated: for three
prompts (token ids; 150, 97 and 40 tokens, so the compressing profile keeps
fewer keys than a chunk of 64 holds), S = the CPU's greedy continuation of
16 tokens (tangram-generate). Through the HTTP API each backend then
  * scores every position of S: a one-token completion of prompt + S[:i]
    forced to S[i] with logit_bias +100 returns the raw log-probability of
    S[i] (the requests go in the same order to both daemons, so the
    multi-turn cache reuses the same prefixes on both);
  * decodes a forced sequence: the prompt, then 16 tokens all forced to
    S[0], whose raw log-probabilities come from the decode path (split-map
    decode attention, CUDA graphs);
and the forced token's log-probability must be within TOL of the CPU's at
every position of both. TOL is the bf16 tolerance of
tests/gpu/test_cuda_model.c for the same model family: 0.05 nat with full
KV, 0.1 with a compressing profile (a bf16 score can change which near-tied
key a chunk keeps), each 0.05 more under --tp 2 (the all-reduce sums bf16
partial products). Greedy agreement is a separate, reported figure: at how
many forced positions the two backends' most likely tokens are the same,
which must hold wherever the CPU's top two are more than 2 TOL apart; and
how many steps a free-running greedy completion agrees before the first
difference, which must come only after a near-tie (the CPU's top two within
0.1 nat), as before.

Beside that, with a GPU: /v1/models; 8 concurrent streaming requests all end
with [DONE]; afterwards every page in use is a stored entry's; a seeded
sampled request replays identically. With two or more GPUs also --tp 2 on
the CUDA backend (NCCL) against the CPU.

Without a usable NVIDIA GPU it checks that a CUDA worker refuses to start
with a clear message (a CPU-only build says it has no CUDA backend; a CUDA
build without a device that there is no usable device), runs the
teacher-forcing comparison of the profile configuration on the first prompt
between two CPU daemons (which must agree exactly: it checks the measuring
itself), and exits 77 (skipped), or 1 under TANGRAM_REQUIRE_GPU=1. A program that is not
built, or a driver that is loaded but cannot list the GPUs, fails the test.
"""
import json
import os
import shutil
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()

MODEL_ARGS = ["--arch", "qwen3", "--hidden", "256", "--layers", "2",
              "--heads", "8", "--kv-heads", "4", "--head-dim", "64",
              "--ffn", "384", "--dtype", "bf16", "--seed", "21"]
CHUNK = 64
PROMPT_LENS = (150, 97, 40)
FORCED = 16  # teacher-forced positions per prompt
NEAR_TIE = 0.1
TOL = {"full KV": 0.05, "profile": 0.1}
TP_EXTRA = 0.05
SELF_TOL = 1e-4  # two CPU daemons: the same arithmetic


def prompt_ids(k, n):
    return [(i * (37 + 2 * k) + 11 * k + 5) % 3000 + 100 for i in range(n)]


def make_profile(work):
    """A skewed profile of the model: 2 layers x 4 KV heads, H_p = 1."""
    return du.make_skewed_profile(work, 2, 4, 64, 5, n_samples=16, low=0.1)


def cpu_greedy(model, profile, ids):
    """tangram-generate's greedy continuation of ids (CPU backend): FORCED
    token ids, or None (the failure is checked)."""
    r = subprocess.run(
        [du.prog("tangram-generate"), "--model", model, "--profile",
         profile or "none", "--prompt-ids", json.dumps(ids), "--max-tokens",
         str(FORCED), "--temperature", "0", "--ignore-eos",
         "--prefill-chunk", str(CHUNK), "--json"],
        capture_output=True, text=True, timeout=300)
    if not C.check(r.returncode == 0, "tangram-generate greedy reference",
                   r.stderr[-500:]):
        return None
    return json.loads(r.stdout)["token_ids"]


def forced_cases(model, profile, n):
    """[(prompt k, the CPU's greedy continuation)] for the first n prompts,
    or None (checked)."""
    out = []
    for k, ln in enumerate(PROMPT_LENS[:n]):
        p = prompt_ids(k, ln)
        seq = cpu_greedy(model, profile, p)
        if seq is None or not C.check(len(seq) == FORCED, "prompt %d: %d "
                                      "greedy ids" % (k, FORCED), seq):
            return None
        out.append((p, seq))
    return out


def start(model, work, profile, backend, tp, name):
    sub = os.path.join(work, "%s-%s-%d" % (backend, name.replace(" ", "-"),
                                           len(os.listdir(work))))
    os.makedirs(sub)
    d = du.Daemon(model, sub, profile=profile,
                  args=["--kv-memory", "256MiB", "--heads-per-group", "1",
                        "--prefill-chunk", str(CHUNK), "--backend", backend,
                        "--tp", str(tp)])
    ok = d.start(timeout=240 if backend == "cuda" else 120)
    C.check(ok, "%s: %s daemon ready" % (name, backend), d.log_text()[-3000:])
    return d, ok


def streams_finish(d, n):
    ok = []

    def one(i):
        body = {"model": "model", "prompt": prompt_ids(20 + i, 30),
                "max_tokens": 24, "stream": True, "temperature": 0.8,
                "seed": i}
        st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                             timeout=120)
        ok.append(st == 200 and raw.rstrip().endswith(b"data: [DONE]"))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(ok) == n and all(ok)


def serve_and_compare(model, work, profile, tp, name, cases):
    tol = TOL["profile" if profile else "full KV"] + \
        (TP_EXTRA if tp > 1 else 0.0)
    cpu, ok = start(model, work, profile, "cpu", 1, name)
    with cpu:
        ref = du.measure_forced(C, cpu, cases, FORCED) if ok else None
    if ref is None:
        return
    gpu, ok = start(model, work, profile, "cuda", tp, name)
    with gpu:
        if not ok:
            return
        got = du.measure_forced(C, gpu, cases, FORCED)
        if got is not None:
            du.check_forced(C, name, ref, got, tol, NEAR_TIE)
        st, _, raw = du.http("GET", gpu.base_url + "/v1/models")
        C.check(st == 200 and b"model" in raw, name + ": /v1/models")
        C.check(streams_finish(gpu, 8), name + ": 8 concurrent streams end")
        C.check(du.wait_for(lambda: du.only_cached_pages(
            du.kv_page_metrics(gpu.base_url, tp)), 20),
            name + ": afterwards every page in use is a stored entry's",
            du.kv_page_metrics(gpu.base_url, tp))
        p = cases[0][0]
        a = du.complete_ids(gpu, p, FORCED, {"temperature": 0.9, "seed": 7})
        b = du.complete_ids(gpu, p, FORCED, {"temperature": 0.9, "seed": 7})
        C.check(a[0] is not None and a[0] == b[0],
                name + ": seeded sampling replays", (a[0], b[0]))


def self_check(model, work, profile, cases):
    """Without a GPU: the measuring itself, on two CPU daemons given the
    same requests (forced tokens honoured, the cache reused alike): every
    figure must agree to SELF_TOL."""
    res = []
    for i in range(2):
        d, ok = start(model, work, profile, "cpu", 1, "self-check %d" % i)
        with d:
            res.append(du.measure_forced(C, d, cases, FORCED) if ok else None)
    if res[0] is not None and res[1] is not None:
        du.check_forced(C, "self-check (cpu against cpu, profile)", res[0],
                        res[1], SELF_TOL, NEAR_TIE)


def refused_without_gpu(model, work):
    sub = os.path.join(work, "nogpu")
    os.makedirs(sub)
    d = du.Daemon(model, sub, args=["--backend", "cuda"])
    with d:
        d.start(timeout=30)
        line = d.start_failure() or ""
        C.check("no CUDA device" in line or "no CUDA backend" in line,
                "cuda worker refuses clearly without a GPU", line or
                d.log_text()[-1500:])


def main():
    missing = du.missing_inputs(programs=du.ALL_PROGRAMS)
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tg_cuda_daemon.")
    try:
        model = du.make_model_args(os.path.join(work, "model"), MODEL_ARGS)
        profile = make_profile(work)
        n = du.gpu_count()
        if n == 0:
            refused_without_gpu(model, work)
            # The measuring on the longest prompt only: the rest of the
            # plumbing is the same, and a skipped test should stay short.
            one = forced_cases(model, profile, 1)
            if one is not None:
                self_check(model, work, profile, one)
            if C.summary() != 0:
                return 1
            return du.gpu_skip("no NVIDIA GPU")
        cases = {prof: forced_cases(model, prof, len(PROMPT_LENS))
                 for prof in (None, profile)}
        if None in cases.values():
            return C.summary() or 1
        serve_and_compare(model, work, None, 1, "full KV", cases[None])
        serve_and_compare(model, work, profile, 1, "profile",
                          cases[profile])
        if n >= 2:
            serve_and_compare(model, work, None, 2, "tp 2 full KV",
                              cases[None])
            serve_and_compare(model, work, profile, 2, "tp 2 profile",
                              cases[profile])
        return C.summary()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
