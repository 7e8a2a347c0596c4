#!/usr/bin/python3
"""bench_structured — what structured outputs cost a serving step, measured
side by side in one invocation (docs/PERFORMANCE.md "Structured outputs").

One tangramd on loopback (CPU backend, the tiny qwen3 model of the
integration tests: a short forward pass, so the mask's share is the
largest it gets), then two bursts of N concurrent chats of M tokens each:
unconstrained (ignore_eos), and with response_format json_object (random
weights never close a string, so they also run to M tokens). Printed: each
burst's wall time and time per generated token, their ratio, and from the
worker's statistics (logged at exit) the constrained draws, the masks and
their mean time, and how long draws waited for a mask (the worker computes
the next step's masks right after sending a step's result, while the
router plans the next step; a draw waits only for a mask not ready then).

    TANGRAM_BIN=build/bin bench_structured.py [--requests 8]
        [--tokens 64] [--quick]
--quick: 2 requests of 16 tokens (ctest runs it as bench-structured-quick).
The load average is printed: on a shared machine absolute times follow it.
"""
import argparse
import os
import re
import shutil
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import daemon_util as du  # noqa: E402


def burst(d, n, m, constrained):
    bodies = []
    for i in range(n):
        b = {"model": "tiny", "max_tokens": m, "temperature": 1.0, "seed": i,
             "messages": [{"role": "user", "content": "Write JSON %d." % i}]}
        if constrained:
            b["response_format"] = {"type": "json_object"}
        else:
            b["ignore_eos"] = True
        bodies.append(b)
    out = [None] * n

    def one(i):
        st, _, data = du.http("POST", d.base_url + "/v1/chat/completions",
                              bodies[i], None, 900)
        doc = du.json_of(data)
        out[i] = (st, doc["usage"]["completion_tokens"]
                  if st == 200 and doc else 0)
    t0 = time.monotonic()
    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.monotonic() - t0
    if any(st != 200 for st, _ in out):
        raise RuntimeError("a request failed: %r" % out)
    return wall, sum(k for _, k in out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.requests, a.tokens = 2, 16
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgbstruct")
    model = du.make_model(os.path.join(work, "tiny"))
    d = du.Daemon(model, work, ["--max-model-len", "2048", "--page-size", "16"])
    if not d.start():
        print(d.log_text()[-3000:])
        shutil.rmtree(work, ignore_errors=True)
        return 1
    try:
        burst(d, 1, 4, True)  # the vocabulary and the grammar, once
        wu, ku = burst(d, a.requests, a.tokens, False)
        wc, kc = burst(d, a.requests, a.tokens, True)
    finally:
        d.stop()
        log = d.log_text()
        shutil.rmtree(work, ignore_errors=True)
    m = re.findall(r"structured outputs: (\d+) constrained draws, (\d+) masks "
                   r"of ([\d.]+) us on average; draws waited for (\d+) masks, "
                   r"([\d.]+) ms in all \(([\d.]+) us per draw\)", log)
    print("load average %.2f %.2f %.2f" % os.getloadavg())
    print("%d requests x %d tokens, CPU backend, tiny model" %
          (a.requests, a.tokens))
    print("unconstrained: %6.2f s, %7.3f ms/token" % (wu, wu * 1e3 / ku))
    print("json_object:   %6.2f s, %7.3f ms/token" % (wc, wc * 1e3 / kc))
    print("ratio constrained / unconstrained (time per token): %.3f" %
          ((wc / kc) / (wu / ku)))
    if not m:
        print("no statistics line in the worker's log")
        return 1
    draws, masks, mean_us, waits, wait_ms, per_draw = m[-1]
    print("worker: %s constrained draws, %s masks of %s us on average" %
          (draws, masks, mean_us))
    print("worker: draws waited for %s masks, %s ms in all, %s us per draw "
          "(%.4f of a token's time)" %
          (waits, wait_ms, per_draw, float(per_draw) * 1e-3 /
           (wc * 1e3 / kc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
