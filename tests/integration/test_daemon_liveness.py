#!/usr/bin/python3
"""A long step is not a dead worker (DESIGN.md §2, docs/RELIABILITY.md
"Liveness"): the real tangramd on loopback, CPU backend, the tiny qwen3
model of the integration tests.

A worker beats from a thread of its own, so the router sees it alive
however long a step takes, while a stopped worker is still found at the
heartbeat deadline. Checked:

1. Burst: 16 concurrent completions of 500-token prompts, with the step
   budget of a GPU (--max-batched-tokens 8192: the 16 prompts' chunks form
   one step of 8,000 tokens) and a heartbeat of 200 ms, i.e. a deadline of
   1 s, which such a step exceeds several times over on two cores (the
   test prints how many steps took longer than the deadline). Every request
   completes with all its tokens, no rank dies, the worker keeps its pid.
   Before the heartbeat thread the worker was declared dead in the first
   long step and every request got 500.
2. A 30,000-token prompt on the same daemon (chunks of 512: its last chunks
   attend over the whole history, the longest steps of the test) completes
   with usage.prompt_tokens 30000. A profile that keeps about a tenth of
   every head makes it affordable on two cores; the steps still grow with
   the history.
3. SIGSTOP of the worker with default flags (heartbeat 1 s, deadline 5 s):
   the streaming request in flight ends with an error within 6 s of the
   stop and not before 3 s (the deadline counts from the last beat, which
   came at most one period before the stop; the router checks every 250
   ms; the rest is margin for a loaded machine), the stopped process is
   killed and replaced, and a new request succeeds. The same daemon's
   start-up line shows the CPU backend's default step budget (2048).

Client timeouts everywhere, so a hang is a failure. About 2 minutes on two
idle cores, most of it the 30,000-token prompt.
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

ck = du.Checker()


class Daemon(du.Daemon):
    """tangramd with its own step flags (prefill chunk 512, the backend's
    step budget) instead of the small ones of the other daemon tests."""
    DEFAULT_ARGS = ["--kv-memory", "256MiB", "--heads-per-group", "2",
                    "--shutdown-timeout", "5"]


def low_budget_profile(work):
    """A profile of the tiny model (2 layers, 2 KV heads of 16) keeping
    about 8 % of every head (retention 0.06 +- 0.01 over 24 samples)."""
    rng = random.Random(7)
    samples = [[[round(0.06 + rng.uniform(-0.01, 0.01), 4) for _ in range(2)]
                for _ in range(2)] for _ in range(24)]
    ret = os.path.join(work, "low.retention.json")
    with open(ret, "w") as f:
        json.dump({"format": "tangram-retention", "version": 1,
                   "model": {"architecture": "Qwen3ForCausalLM",
                             "num_layers": 2, "num_kv_heads": 2,
                             "head_dim": 16},
                   "method": "snapkv", "target_ratio": 0.06,
                   "samples": samples}, f)
    prof = os.path.join(work, "low.json")
    r = subprocess.run([du.prog("tangram-profile"), "build", "--retention",
                        ret, "--heads-per-group", "2", "-o", prof],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("tangram-profile build failed: " + r.stderr)
    return prof


def complete(d, body, timeout):
    """POST /v1/completions; (status, parsed JSON or None, seconds)."""
    t = time.time()
    try:
        st, _, data = du.http("POST", d.base_url + "/v1/completions", body,
                              timeout=timeout)
    except OSError as e:
        return "error: %s" % e, None, time.time() - t
    return st, du.json_of(data), time.time() - t


def steps_over(d, seconds):
    """Steps (tangram_scheduler_step_seconds) longer than `seconds`, from
    the histogram's buckets; None when /metrics is unavailable."""
    s = du.fetch_metrics(d.base_url)
    if s is None:
        return None
    count = du.metric(s, "tangram_scheduler_step_seconds_count")
    for (name, labels), v in s.items():
        if name == "tangram_scheduler_step_seconds_bucket":
            le = dict(labels).get("le")
            if le not in (None, "+Inf") and abs(float(le) - seconds) < 1e-9:
                return int(count - v)
    return None


def deaths(d):
    return [ln for ln in d.log_text().splitlines() if " died: " in ln]


def check_burst(d):
    worker = d.child_pids("worker")
    rng = random.Random(11)
    prompts = [[rng.randrange(1000, 100000) for _ in range(500)]
               for _ in range(16)]
    res = [None] * 16

    def one(i):
        res[i] = complete(d, {"prompt": prompts[i], "max_tokens": 8,
                              "ignore_eos": True}, timeout=300)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    good = [r for r in res if r[0] == 200 and r[1] and
            r[1]["usage"]["completion_tokens"] == 8 and
            r[1]["usage"]["prompt_tokens"] == 500]
    ck.check(len(good) == 16, "burst: 16 of 16 500-token prompts completed "
             "with 8 tokens (%.1f s)" % took,
             [(r[0], (r[1] or {}).get("error")) for r in res if r not in good])
    over = steps_over(d, 1.0)
    print("info burst: %s step(s) took longer than the 1 s heartbeat "
          "deadline" % over, flush=True)
    ck.check(not deaths(d), "burst: no rank declared dead", deaths(d)[:3])
    ck.check(d.child_pids("worker") == worker,
             "burst: the worker kept its pid", (worker, d.child_pids("worker")))


def check_long_prompt(d):
    worker = d.child_pids("worker")
    rng = random.Random(12)
    ids = [rng.randrange(1000, 100000) for _ in range(30000)]
    before = steps_over(d, 1.0) or 0
    st, j, took = complete(d, {"prompt": ids, "max_tokens": 4,
                               "ignore_eos": True}, timeout=500)
    usage = (j or {}).get("usage") or {}
    ck.check(st == 200 and usage.get("prompt_tokens") == 30000 and
             usage.get("completion_tokens") == 4,
             "30K prompt: completed, usage 30000 + 4 (%.1f s)" % took,
             (st, str(j)[:300]))
    print("info 30K prompt: %s more step(s) over the 1 s deadline" %
          ((steps_over(d, 1.0) or 0) - before), flush=True)
    ck.check(not deaths(d), "30K prompt: no rank declared dead",
             deaths(d)[:3])
    ck.check(d.child_pids("worker") == worker,
             "30K prompt: the worker kept its pid")


class Stream:
    """A streaming completion read in a thread: t_error is the time its
    error event (or the end of the stream without [DONE]) arrived."""

    def __init__(self, port, body):
        self.port, self.body = port, body
        self.first = threading.Event()
        self.events, self.t_end, self.errored = [], None, False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        data = json.dumps(dict(self.body, stream=True)).encode()
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                   "Content-Type: application/json\r\nContent-Length: %d"
                   "\r\n\r\n" % len(data)).encode() + data)
        buf = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
                if b"data:" in buf:
                    self.first.set()
                if b'"error"' in buf or b"[DONE]" in buf:
                    break
        except OSError:
            pass
        self.t_end = time.time()
        self.errored = b'"error"' in buf
        s.close()


def check_sigstop(model, work):
    d = Daemon(model, work)
    try:
        if not ck.check(d.start(), "sigstop: daemon with default flags "
                        "started", d.log_text()[-2000:]):
            return
        start = [ln for ln in d.log_text().splitlines()
                 if "tangramd starting:" in ln]
        ck.check(start and '"max-batched-tokens":2048' in start[-1],
                 "sigstop: the CPU backend's default step budget is 2048",
                 start[-1:])
        workers = d.child_pids("worker")
        if not ck.check(len(workers) == 1, "sigstop: one worker", workers):
            return
        s = Stream(d.http_port, {"prompt": "liveness probe", "max_tokens":
                                 3000, "ignore_eos": True})
        ck.check(s.first.wait(20), "sigstop: the stream started")
        time.sleep(0.3)
        t_stop = time.time()
        os.kill(workers[0], signal.SIGSTOP)
        s.thread.join(20)
        took = (s.t_end or time.time()) - t_stop
        ck.check(s.errored, "sigstop: the request in flight ended with an "
                 "error event")
        ck.check(3.0 <= took <= 6.0, "sigstop: found dead %.2f s after the "
                 "stop (bound 6 s: 5 s deadline + 250 ms check + margin)"
                 % took)
        back = du.wait_for(lambda: d.health() == 200 and
                           d.child_pids("worker") and
                           d.child_pids("worker")[0] != workers[0], 30, 0.05)
        ck.check(back, "sigstop: the stopped worker was killed and replaced")
        st, j, _ = complete(d, {"prompt": "after", "max_tokens": 4}, 60)
        ck.check(st == 200 and (j or {}).get("usage", {}).get(
            "completion_tokens") == 4, "sigstop: a new request succeeds",
            (st, str(j)[:300]))
    finally:
        d.stop()


def main():
    missing = du.missing_inputs(programs=("tangramd", "tangram-router",
                                          "tangram-worker",
                                          "tangram-make-model",
                                          "tangram-profile"))
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tg-liveness-")
    try:
        model = du.make_model(os.path.join(work, "model"))
        prof = low_budget_profile(work)
        d = Daemon(model, work, profile=prof,
                   args=["--worker-heartbeat-ms", "200",
                         "--max-batched-tokens", "8192"])
        try:
            if ck.check(d.start(), "daemon (heartbeat 200 ms, step budget "
                        "8192) started", d.log_text()[-3000:]):
                check_burst(d)
                check_long_prompt(d)
            rc, left = d.stop()
            ck.check(rc == 0 and not left, "stop: exit 0, no child left",
                     (rc, left))
        finally:
            d.stop()
        check_sigstop(model, work)
        if ck.failures:
            print("---- tangramd log (tail) ----")
            log = os.path.join(work, "tangramd.log")
            with open(log, errors="replace") as f:
                print("\n".join(ln for ln in f.read().splitlines()
                                if "debug" not in ln)[-4000:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ck.summary()


if __name__ == "__main__":
    sys.exit(main())
