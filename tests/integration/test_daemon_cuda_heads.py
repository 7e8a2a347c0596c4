#!/usr/bin/python3
"""Per-head KV lengths on the CUDA backend: tangramd --backend cuda with
--method gvote (DESIGN.md §4.8) and with --decode-compress trig (§4.9),
against --backend cpu serving the same model, profile and requests.

On a tiny qwen3 model with head_dim 64 (8 query / 4 KV heads, 2 layers; the
CUDA kernels take d 64 and 128) and a profile from `tangram-profile
calibrate --trig --heads-per-group 1` (every head its own group, so
per-head lengths move pages), for gvote with S = 0 and with S = 8
synthetic queries, and for trig (--decode-budget 12 --decode-every 8
--decode-window 4):
  * teacher forcing, as in test_daemon_cuda.py: for each of 4 prompts of 40
    tokens, S = the first FORCED (16) ids of the CPU's greedy continuation
    (tangram-generate, same flags); both backends score every position of
    S (a one-token completion of each prefix forced to S[i] by logit_bias
    +100) and decode 64 tokens all forced to S[0] (with trig 8
    compactions, at the same steps on both since the tokens are the same);
    the forced token's log-probability must be within TOL = 0.1 nat of the
    CPU's at every position: the bf16 tolerance tests/gpu/test_cuda_model.c
    gives the per-head methods (a bf16 score may tip a near-tie of gvote's
    nucleus or of trig's survivor choice). Greedy agreement is a reported
    figure, required wherever the CPU's top two are over 2 TOL apart; the
    free-running greedy completions (64 tokens, ignore_eos) may differ only
    after a near-tie (0.1 nat);
  * both backends give pages back (tangram_kv_pages_released_total > 0);
    with trig the pages released by all these requests are exactly the
    CPU's (what a compaction frees depends only on the heads'
    lengths and caps, not on which entries survive);
  * on the GPU: turn 2 of a conversation (same X-Session-Id) reuses the
    stored per-head KV (cached_tokens > 0) and is served; 6 concurrent
    sampled streams end with [DONE]; afterwards every page in use is a
    stored entry's, and no step failed.

Without a usable NVIDIA GPU it checks that neither option is refused for
the CUDA backend any more (each start fails only because there is no
device, or no CUDA build, never naming the method), measures trig's
teacher forcing of the first prompt on two CPU daemons (which must agree
to 1e-4: this checks the measuring itself), and exits 77 (skipped), or 1 under
TANGRAM_REQUIRE_GPU=1. Fails, naming it, when a program is missing or a
loaded driver cannot list the GPUs.
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
              "--ffn", "384", "--dtype", "bf16", "--seed", "23"]
CHUNK = 64
N_PROMPT = 40
MAX_TOKENS = 64
NEAR_TIE = 0.1
TOL = 0.1
SELF_TOL = 1e-4  # two CPU daemons: the same arithmetic
FORCED = 16  # teacher-forced positions per prompt
SEED = 7
TRIG = ["--decode-compress", "trig", "--decode-budget", "12",
        "--decode-every", "8", "--decode-window", "4"]
BASE = ["--heads-per-group", "1", "--prefill-chunk", str(CHUNK),
        "--kv-memory", "256MiB"]


def prompt_ids(k, n=N_PROMPT):
    return [(i * (41 + 2 * k) + 13 * k + 7) % 3000 + 100 for i in range(n)]


def calibrate(model, work):
    samples = os.path.join(work, "samples.jsonl")
    with open(samples, "w") as f:
        for k in range(4):
            f.write(json.dumps({"prompt_ids": prompt_ids(100 + k, 90)}) +
                    "\n")
    prof = os.path.join(work, "trig.json")
    r = subprocess.run(
        [du.prog("tangram-profile"), "calibrate", "--model", model,
         "--ratio", "0.4", "--samples", samples, "--heads-per-group", "1",
         "--threads", "1", "--trig", "-o", prof],
        capture_output=True, text=True, timeout=300)
    C.check(r.returncode == 0, "tangram-profile calibrate --trig",
            r.stderr[-500:])
    return prof if r.returncode == 0 else None


def complete(d, ids, session=None):
    body = {"model": "model", "prompt": ids, "max_tokens": MAX_TOKENS,
            "temperature": 0, "logprobs": 5, "ignore_eos": True,
            "seed": SEED}  # gvote's synthetic queries draw from the seed
    hdrs = {"X-Session-Id": session} if session else None
    st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                         headers=hdrs, timeout=300)
    j = du.json_of(raw)
    if st != 200 or not j:
        return None, "status %s: %s" % (st, raw[:300]), None
    lp = j["choices"][0].get("logprobs") or {}
    return lp.get("tokens"), lp.get("top_logprobs"), j


def cpu_answer_ids(model, prof, ids, extra):
    """tangram-generate's greedy answer ids (CPU backend, same flags)."""
    r = subprocess.run(
        [du.prog("tangram-generate"), "--model", model, "--profile", prof,
         "--prompt-ids", json.dumps(ids), "--max-tokens", str(MAX_TOKENS),
         "--temperature", "0", "--seed", str(SEED), "--ignore-eos",
         "--prefill-chunk",
         str(CHUNK), "--json"] + extra,
        capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        C.check(False, "tangram-generate " + " ".join(extra), r.stderr[-500:])
        return None
    return json.loads(r.stdout)["token_ids"]


def streams_finish(d, n):
    ok = []

    def one(i):
        body = {"model": "model", "prompt": prompt_ids(60 + i),
                "max_tokens": 40, "stream": True, "temperature": 0.8,
                "seed": i, "ignore_eos": True}
        st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                             timeout=300)
        ok.append(st == 200 and raw.rstrip().endswith(b"data: [DONE]"))

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(ok) == n and all(ok)


def released(d):
    s = du.fetch_metrics(d.base_url)
    return du.metric(s, "tangram_kv_pages_released_total", rank="0") or 0


def run(model, prof, work, backend, extra, cases):
    """Serves on `backend` with `extra` flags: measure_forced's scores of
    the cases, the pages the free-running completions released, and (on
    cuda) the other checks. Returns (scores, released) or None when the
    daemon did not start or a request failed."""
    sub = os.path.join(work, backend + "-" + str(len(os.listdir(work))))
    os.makedirs(sub)
    d = du.Daemon(model, sub, profile=prof,
                  args=BASE + extra + ["--backend", backend])
    with d:
        if not C.check(d.start(timeout=240), "%s %s: daemon ready" %
                       (backend, " ".join(extra)), d.log_text()[-3000:]):
            return None
        # The seed: gvote's synthetic queries draw from it.
        r0 = released(d)
        scores = du.measure_forced(C, d, cases, MAX_TOKENS, {"seed": SEED})
        if scores is None:
            return None
        rel = released(d) - r0
        if backend == "cuda":
            tag = "cuda " + " ".join(extra)
            ids = prompt_ids(40)
            t1 = complete(d, ids, session="conv-1")
            out = cpu_answer_ids(model, prof, ids, extra)
            if C.check(t1[0] is not None and out is not None,
                       tag + ": turn 1 served", t1[1]):
                # Turn 1's answer as ids (HTTP answers text): the CPU's,
                # which the GPU's equals up to near-ties; what matches the
                # stored entry's ids is reused.
                turn2 = ids + out + [(7 * i + 3) % 3000 + 100
                                     for i in range(20)]
                t2 = complete(d, turn2, session="conv-1")
                j = t2[2]
                cached = ((j or {}).get("usage", {}).get(
                    "prompt_tokens_details") or {}).get("cached_tokens", 0)
                C.check(j is not None and cached > 0,
                        tag + ": turn 2 reuses the stored per-head KV "
                        "(%s cached tokens)" % cached, t2[1])
            C.check(streams_finish(d, 6), tag + ": 6 concurrent streams end")
            C.check(du.wait_for(lambda: du.only_cached_pages(
                du.kv_page_metrics(d.base_url, 1)), 20),
                tag + ": afterwards every page in use is a stored entry's",
                du.kv_page_metrics(d.base_url, 1))
            C.check("failed" not in d.log_text(),
                    tag + ": no step failed", d.log_text()[-2000:])
        return scores, rel


def forced_cases(model, prof, extra, n=4):
    """[(prompt k, the first FORCED ids of the CPU's greedy continuation)]
    for k < n, or None (checked)."""
    out = []
    for k in range(n):
        ids = prompt_ids(k)
        seq = cpu_answer_ids(model, prof, ids, extra)
        if seq is None:
            return None
        out.append((ids, seq[:FORCED]))
    return out


def compare(model, prof, work, extra, name, exact_release):
    cases = forced_cases(model, prof, extra)
    if cases is None:
        return
    cpu = run(model, prof, work, "cpu", extra, cases)
    gpu = run(model, prof, work, "cuda", extra, cases)
    if cpu is None or gpu is None:
        return
    du.check_forced(C, name, cpu[0], gpu[0], TOL, NEAR_TIE)
    C.check(cpu[1] > 0 and gpu[1] > 0,
            "%s: pages released on both backends" % name, (cpu[1], gpu[1]))
    if exact_release:
        C.check(cpu[1] == gpu[1], "%s: the GPU releases exactly the CPU's "
                "pages" % name, (cpu[1], gpu[1]))


def self_check(model, prof, work):
    """Without a GPU: trig's measuring on two CPU daemons given the same
    requests; every figure must agree to SELF_TOL."""
    cases = forced_cases(model, prof, TRIG, n=1)
    if cases is None:
        return
    a = run(model, prof, work, "cpu", TRIG, cases)
    b = run(model, prof, work, "cpu", TRIG, cases)
    if a is None or b is None:
        return
    du.check_forced(C, "self-check (cpu against cpu, trig)", a[0], b[0],
                    SELF_TOL, NEAR_TIE)
    C.check(a[1] > 0 and a[1] == b[1], "self-check: trig released pages, "
            "the same on both", (a[1], b[1]))


def refused_only_for_want_of_a_device(model, prof, work):
    for name, extra in (("gvote", ["--method", "gvote"]), ("trig", TRIG)):
        sub = os.path.join(work, "nogpu-" + name)
        os.makedirs(sub)
        d = du.Daemon(model, sub, profile=prof,
                      args=BASE + ["--backend", "cuda"] + extra)
        with d:
            d.start(timeout=30)
            line = d.start_failure() or ""
            log = d.log_text()
            C.check(("no CUDA device" in line or "no CUDA backend" in line)
                    and "gvote" not in line and "trig" not in line,
                    "%s on --backend cuda is refused only for want of a GPU"
                    % name, line or log[-1500:])


def main():
    missing = du.missing_inputs(programs=du.ALL_PROGRAMS)
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tg_cuda_heads.")
    try:
        model = du.make_model_args(os.path.join(work, "model"), MODEL_ARGS)
        prof = calibrate(model, work)
        if prof is None:
            return C.summary()
        if du.gpu_count() == 0:
            refused_only_for_want_of_a_device(model, prof, work)
            self_check(model, prof, work)
            if C.summary() != 0:
                return 1
            return du.gpu_skip("no NVIDIA GPU")
        compare(model, prof, work, ["--method", "gvote", "--gvote-samples",
                                    "0"], "gvote S=0", False)
        compare(model, prof, work, ["--method", "gvote"], "gvote S=8", False)
        compare(model, prof, work, TRIG, "trig", True)
        return C.summary()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
