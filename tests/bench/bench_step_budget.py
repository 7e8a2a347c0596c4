#!/usr/bin/python3
"""bench_step_budget — how long one step of the daemon takes against the
step budget (--max-batched-tokens), measured side by side in one
invocation (docs/RELIABILITY.md "Liveness under long steps").

Per budget: one tangramd on loopback (CPU backend by default, --log-level
debug so the worker logs each step's time), a burst of N concurrent
completions of P-token prompts (random ids, max_tokens 8, ignore_eos), then
the number of steps, the longest step, the median decode step of the whole
batch and the burst's wall time, each also as a ratio to the first
budget's. The step length is how long every running request's next token
waits behind the prefills that share its step; the burst's wall time is
the throughput side.

    TANGRAM_BIN=build/bin bench_step_budget.py [--model DIR]
        [--budgets 512,1024,2048,4096,8192] [--requests 16] [--prompt 500]
        [--backend cpu] [--profile FILE] [--quick]
Without --model, the tiny qwen3 model of the integration tests (2 layers,
hidden 64) is generated with tangram-make-model (TANGRAM_DATA names the
project's data folder, default ./data).
--quick: budgets 512 and 1024, 4 requests of 100 tokens (a smoke run; ctest
runs it as bench-step-budget-quick).
The load average of the machine is printed with every row: on a shared
machine the absolute times follow it.
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body, timeout=900):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        return r.status
    except OSError:
        return None
    finally:
        c.close()


def healthy(port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/health")
        return c.getresponse().status == 200
    except OSError:
        return False


def run_budget(a, budget, work):
    log = os.path.join(work, "tangramd-%d.log" % budget)
    hp, gp = free_port(), free_port()
    cmd = [os.path.join(a.bin, "tangramd"), "--model", a.model,
           "--http-port", str(hp), "--grpc-port", str(gp),
           "--backend", a.backend, "--kv-memory", "1GiB",
           "--log-level", "debug", "--max-batched-tokens", str(budget)]
    cmd += ["--profile", a.profile] if a.profile else ["--heads-per-group",
                                                        "1"]
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                             env=dict(os.environ, TMPDIR=work))
    try:
        end = time.time() + 120
        while not healthy(hp):
            if p.poll() is not None or time.time() > end:
                sys.exit("tangramd did not start; see " + log)
            time.sleep(0.2)
        rng = random.Random(11)
        prompts = [[rng.randrange(1000, 100000) for _ in range(a.prompt)]
                   for _ in range(a.requests)]
        status = []
        threads = [threading.Thread(target=lambda i=i: status.append(post(
            hp, {"prompt": prompts[i], "max_tokens": 8, "ignore_eos": True})))
            for i in range(a.requests)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
    finally:
        p.terminate()
        p.wait(60)
    with open(log, errors="replace") as f:
        text = f.read()
    steps = [(int(e), int(s), float(ms) / 1e3) for e, s, ms in re.findall(
        r"step \d+: (\d+) entries, (\d+) sampled, ([\d.]+) ms", text)]
    decode = [t for e, s, t in steps if e == a.requests and s == a.requests]
    return {"budget": budget, "steps": len(steps),
            "longest": max((t for _, _, t in steps), default=0.0),
            "decode": statistics.median(decode) if decode else float("nan"),
            "wall": wall, "ok": sum(1 for s in status if s == 200),
            "load": open("/proc/loadavg").read().split()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--profile")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--budgets", default="512,1024,2048,4096,8192")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=500)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    a.bin = os.environ.get("TANGRAM_BIN", "build/bin")
    if a.quick:
        a.budgets, a.requests, a.prompt = "512,1024", 4, 100
    budgets = [int(b) for b in a.budgets.split(",")]
    with tempfile.TemporaryDirectory(prefix="tg-bench-step-") as work:
        if a.model is None:
            a.model = os.path.join(work, "model")
            data = os.environ.get("TANGRAM_DATA", "data")
            subprocess.run([os.path.join(a.bin, "tangram-make-model"),
                            "--arch", "qwen3", "--hidden", "64", "--layers",
                            "2", "--heads", "4", "--kv-heads", "2",
                            "--head-dim", "16", "--ffn", "128", "--dtype",
                            "bf16", "--seed", "1", "--tokenizer",
                            os.path.join(data, "tokenizers", "qwen3"), "-o",
                            a.model], check=True, capture_output=True)
        rows = [run_budget(a, b, work) for b in budgets]
    base = rows[0]
    print("%8s %6s %9s %6s %9s %6s %8s %6s %4s %5s" % (
        "budget", "steps", "longest", "x", "decode", "x", "burst", "x", "ok",
        "load"))
    for r in rows:
        print("%8d %6d %8.2fs %6.2f %8.3fs %6.2f %7.1fs %6.2f %4d %5s" % (
            r["budget"], r["steps"], r["longest"],
            r["longest"] / base["longest"] if base["longest"] else 0,
            r["decode"], r["decode"] / base["decode"]
            if base["decode"] == base["decode"] and base["decode"] else 0,
            r["wall"], r["wall"] / base["wall"], r["ok"], r["load"]))
    return 0 if all(r["ok"] == a.requests for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
