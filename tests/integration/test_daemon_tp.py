#!/usr/bin/python3
"""Integration test of tensor parallelism on the CPU backend: tangramd --tp 2.

A tiny qwen3 model whose 4 KV heads divide by 2 * H_p is served with
--tp 1 and --tp 2, with full KV (--heads-per-group 2: one group per rank)
and with a profile built by tangram-profile from a synthetic retention file
(--heads-per-group 1: two groups of different budgets per rank). Checked for
each: /health 200 with two workers; greedy completions (logprobs on) give
the same tokens with --tp 2 as with --tp 1 (a divergence is accepted only
after a near-tie of the --tp 1 run's top two log-probabilities); the pages
used on rank 0 and rank 1 (tangram_kv_pages_used{rank=...}) grow while a
streaming request runs and return to their level once it is cancelled. With
full KV, SIGKILL of the rank 1 worker: the in-flight stream ends with an
error, both workers are restarted (new pids), /health returns to 200 and
completions again match --tp 1.

The communicator: no --comm-id on any command line; worker rank 0 names
the group after its pid (/tangram-<pid>-<hex>), the router relays it in a
CommSetup and both ranks log that they joined that one group (after the
restart: a new one, of the new rank 0). No segment of a finished rank 0
stays in /dev/shm.

This needs a worker that accepts --world-size 2: when tangram-worker
refuses it the test FAILS (it does not skip), naming the worker's message.
Fails, naming it, when tangramd or the shared tokenizer is missing. ~40 s.
"""
import http.client as httplib
import json
import os
import re
import shutil
import signal
import sys
import time

JOINED = re.compile(r"worker/(\d+)\[(\d+)\] joined the communicator group "
                    r"\((/tangram-(\d+)-[0-9a-f]{16}), world size 2\)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

C = du.Checker()

MODEL_ARGS = ["--arch", "qwen3", "--hidden", "64", "--layers", "2",
              "--heads", "8", "--kv-heads", "4", "--head-dim", "16",
              "--ffn", "128", "--dtype", "bf16", "--seed", "3"]

PROMPTS = ["The quick brown fox jumps over the lazy dog and",
           "Tensor parallel ranks share one all-reduce; each holds half",
           "1, 2, 3, 4, 5, 6, 7, 8,"]
MAX_TOKENS = 16
NEAR_TIE = 2e-3  # natural-log gap under which fp32 sums may flip the argmax


def make_model(out):
    return du.make_model_args(out, MODEL_ARGS)


def make_profile(work):
    """A skewed profile of the model: 2 layers x 4 KV heads, H_p = 1."""
    return du.make_skewed_profile(work, 2, 4, 16, 11, n_samples=24, low=0.05)



def complete(d, prompt):
    """Greedy completion with logprobs: (tokens, top logprob lists) or
    (None, reason)."""
    body = json.dumps({"model": "model", "prompt": prompt, "max_tokens":
                       MAX_TOKENS, "temperature": 0, "logprobs": 2,
                       "ignore_eos": True}).encode()
    try:
        st, _, raw = du.http("POST", d.base_url + "/v1/completions", body,
                             {"Content-Type": "application/json"}, timeout=60)
    except OSError as e:
        return None, "request failed: %s" % e
    j = du.json_of(raw)
    if st != 200 or not j:
        return None, "status %s: %s" % (st, raw[:300])
    lp = j["choices"][0].get("logprobs") or {}
    return lp.get("tokens"), lp.get("top_logprobs")


def same_greedy(ref, got):
    """True when got's tokens equal ref's, or first differ right after a
    near-tie in the reference (then the rest cannot be compared)."""
    return du.greedy_agrees(ref[0], ref[1], got[0], NEAR_TIE)


def reference(model, work, args, profile):
    """Greedy outputs of --tp 1 for PROMPTS, or None."""
    d = du.Daemon(model, work, args=["--tp", "1"] + args, profile=profile)
    with d:
        if not C.check(d.start(), "tp 1 reference daemon ready",
                       d.log_text()[-2000:]):
            return None
        return [complete(d, p) for p in PROMPTS]


def worker_pids(d):
    """{rank: pid} of the live workers."""
    out = {}
    for pid in d.child_pids("worker"):
        m = re.search(r"--rank[ =](\d+)", du.cmdline(pid))
        if m:
            out[int(m.group(1))] = pid
    return out


def pages(d):
    s = du.fetch_metrics(d.base_url)
    if s is None:
        return None
    return tuple(du.metric(s, "tangram_kv_pages_used", rank=str(r))
                 for r in (0, 1))


class Stream:
    """A streaming completion read incrementally over its own connection."""

    def __init__(self, d, prompt, max_tokens):
        self.conn = httplib.HTTPConnection("127.0.0.1", d.http_port,
                                           timeout=60)
        body = json.dumps({"model": "model", "prompt": prompt, "stream": True,
                           "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True})
        self.conn.request("POST", "/v1/completions", body,
                          {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.data = b""

    def read_some(self, n=1):
        """Reads until n more SSE events arrived (or the stream ended)."""
        want = self.data.count(b"\n\n") + n
        while self.data.count(b"\n\n") < want:
            chunk = self.resp.read1(4096)
            if not chunk:
                return False
            self.data += chunk
        return True

    def read_all(self, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            try:
                chunk = self.resp.read1(4096)
            except (OSError, httplib.HTTPException):
                break
            if not chunk:
                break
            self.data += chunk
        return self.data

    def close(self):
        self.conn.close()


def long_prompt(tag):
    # A unique head so that no stored multi-turn entry is reused.
    return "%s %s" % (tag, " ".join("w%d" % i for i in range(120)))


def group_of(d, ranks):
    """The group id both live ranks ({rank: pid}) logged joining, when it
    is one and carries rank 0's pid; else None."""
    seen = {}
    for rank, pid, gid, owner in JOINED.findall(d.log_text()):
        if ranks.get(int(rank)) == int(pid):
            seen[int(rank)] = (gid, int(owner))
    if sorted(seen) != [0, 1] or seen[0] != seen[1] or \
            seen[0][1] != ranks.get(0):
        return None
    return seen[0][0]


def shm_left(pid):
    if not os.path.isdir("/dev/shm"):
        return []
    return [n for n in os.listdir("/dev/shm")
            if n.startswith("tangram-%d-" % pid)]


def check_pages(d, name):
    base = du.wait_for(lambda: pages(d), 5)
    if not C.check(base is not None and None not in base,
                   "%s: tangram_kv_pages_used for rank 0 and 1" % name, base):
        return
    st = Stream(d, long_prompt("pages-" + name), 3000)
    C.check(st.resp.status == 200 and st.read_some(3),
            "%s: long stream running" % name)
    during = du.wait_for(lambda: (lambda p: p if p and p[0] > base[0] and
                                  p[1] > base[1] else None)(pages(d)), 5)
    C.check(during is not None, "%s: pages used grow on both ranks while a "
            "request runs (%s -> %s)" % (name, base, during))
    st.close()  # the client goes: the request is aborted, pages freed
    back = du.wait_for(lambda: pages(d) == base, 10)
    C.check(back, "%s: pages used return to %s after the request ends "
            "(now %s)" % (name, base, pages(d)))


def check_tp2(model, work, args, profile, ref, name, kill):
    d = du.Daemon(model, work, args=["--tp", "2"] + args, profile=profile)
    with d:
        ready = d.start()
        if not ready:
            why = d.start_failure() or d.log_text()[-2000:]
            C.check(False, "%s: tangramd --tp 2 ready (the worker must "
                    "accept --world-size 2)" % name, why)
            return
        C.check(d.health() == 200, "%s: /health 200 with --tp 2" % name)
        w = worker_pids(d)
        C.check(sorted(w) == [0, 1], "%s: two workers, ranks 0 and 1" % name,
                w)
        C.check(not any("--comm-id" in du.cmdline(p) for p in w.values()),
                "%s: no --comm-id on the workers' command lines" % name)
        ids = group_of(d, w)
        C.check(ids is not None, "%s: both ranks joined one group named by "
                "rank 0 after its pid" % name, JOINED.findall(d.log_text()))
        got = [complete(d, p) for p in PROMPTS]
        for i, (r, g) in enumerate(zip(ref, got)):
            C.check(same_greedy(r, g), "%s: prompt %d greedy tokens equal "
                    "--tp 1" % (name, i), (r[0], g[0]))
        check_pages(d, name)
        if not kill:
            return
        # SIGKILL of rank 1 during a request.
        st = Stream(d, long_prompt("kill"), 3000)
        C.check(st.resp.status == 200 and st.read_some(2),
                "kill: stream running before the kill")
        old = worker_pids(d)
        os.kill(old[1], signal.SIGKILL)
        t0 = time.time()
        body = st.read_all(30)
        st.close()
        events, _ = du.sse_events(body)
        errs = [e for e in events if e != "[DONE]" and
                (du.json_of(e.encode()) or {}).get("error")]
        C.check(errs, "kill: the in-flight stream ends with an error",
                body[-400:])
        new = du.wait_for(lambda: (lambda p: p if sorted(p) == [0, 1] and
                                   p[0] != old[0] and p[1] != old[1]
                                   else None)(worker_pids(d)), 30)
        C.check(new, "kill: both ranks restarted (old %s, new %s)" %
                (old, worker_pids(d)))
        C.check(du.wait_for(lambda: d.health() == 200, 60),
                "kill: /health 200 again after %.1f s" % (time.time() - t0))
        if new:
            ids2 = du.wait_for(lambda: group_of(d, new), 10)
            C.check(ids2 is not None and ids2 != ids,
                    "kill: the restarted ranks joined a new group of the "
                    "new rank 0", (ids, ids2))
            C.check(not shm_left(old[0]),
                    "kill: nothing of the old rank 0 left in /dev/shm",
                    shm_left(old[0]))
        log = d.log_text()
        C.check("tensor-parallel group" in log,
                "kill: router and supervisor ended the whole group")
        got = [complete(d, p) for p in PROMPTS]
        for i, (r, g) in enumerate(zip(ref, got)):
            C.check(same_greedy(r, g), "kill: prompt %d after the restart "
                    "equals --tp 1" % i, (r[0], g[0]))
        rc, left = d.stop()
        C.check(rc == 0 and not left, "kill: clean stop (rc %s, left %s)" %
                (rc, left))
        if new:
            C.check(not shm_left(new[0]), "kill: rank 0 removed its group's "
                    "shared memory on exit", shm_left(new[0]))
        C.check(not d.sanitizer_reports(), "no sanitizer reports",
                d.sanitizer_reports()[:5])


def main():
    missing = du.missing_inputs(programs=(
        "tangramd", "tangram-router", "tangram-worker", "tangram-make-model",
        "tangram-profile"))
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgtp")
    try:
        model = make_model(os.path.join(work, "model"))
        prof = make_profile(work)
        cases = [("full", ["--heads-per-group", "2"], None, True),
                 ("profile", ["--heads-per-group", "1"], prof, False)]
        for name, args, profile, kill in cases:
            sub = os.path.join(work, name)
            os.makedirs(sub)
            ref = reference(model, sub, args, profile)
            if ref is None:
                continue
            C.check(all(r[0] and len(r[0]) == MAX_TOKENS for r in ref),
                    "%s: --tp 1 gives %d tokens per prompt" %
                    (name, MAX_TOKENS), [r[0] for r in ref])
            check_tp2(model, sub, args, profile, ref, name, kill)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return C.summary()


if __name__ == "__main__":
    sys.exit(main())
