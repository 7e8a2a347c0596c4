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

Then, side by side, the inter-token latency of unconstrained streams (S
streams of T tokens, timed by the client at each content event): alone,
and while K first-seen schemas (distinct, each seconds of compile: C
string properties of distinct maxLength) are sent at the same time. The
schemas' requests wait outside the batch until rank 0 has their grammar
(DESIGN.md §4.11), so the streams' gaps should not grow by the compile;
printed: median, p99 and max gap of each run, and how long the schemas'
requests took.

    TANGRAM_BIN=build/bin bench_structured.py [--requests 8]
        [--tokens 64] [--streams 3] [--stream-tokens 400] [--schemas 2]
        [--schema-props 30] [--quick]
--quick: 2 requests of 16 tokens, 2 streams of 40 tokens beside one
schema of 4 properties (ctest runs it as bench-structured-quick).
The load average is printed: on a shared machine absolute times follow it.
"""
import argparse
import http.client as httplib
import json
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


def stream_gaps(d, n, seed, out, i):
    """One unconstrained streaming chat of n tokens; out[i] = the gaps
    between its content events, seconds."""
    body = {"model": "tiny", "max_tokens": n, "temperature": 1.0,
            "seed": seed, "ignore_eos": True, "stream": True,
            "messages": [{"role": "user", "content": "Tell me more."}]}
    c = httplib.HTTPConnection("127.0.0.1", d.http_port, timeout=900)
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    ts = []
    while True:
        line = r.readline()
        if not line or line.startswith(b"data: [DONE]"):
            break
        if line.startswith(b"data:") and b'"content"' in line:
            ts.append(time.monotonic())
    c.close()
    if r.status != 200 or len(ts) < 2:
        raise RuntimeError("a stream failed: status %d" % r.status)
    out[i] = [b - a for a, b in zip(ts, ts[1:])]


def schema_of(tag, props):
    return {"type": "object", "properties": {
        "%s_%d" % (tag, i): {"type": "string", "maxLength": 300 + i}
        for i in range(props)}}


def itl_run(d, a, tag):
    """The streams, with a.schemas first-seen schemas sent once each has
    begun (tag None: alone). Returns (sorted gaps, schema seconds)."""
    gaps = [None] * a.streams
    th = [threading.Thread(target=stream_gaps,
                           args=(d, a.stream_tokens, 7 + i, gaps, i))
          for i in range(a.streams)]
    for t in th:
        t.start()
    secs = [0.0] * a.schemas
    codes = [None] * a.schemas
    if tag is not None:
        time.sleep(0.5)  # the streams are decoding

        def one(k):
            b = {"model": "tiny", "max_tokens": 8, "temperature": 0,
                 "messages": [{"role": "user", "content": "JSON."}],
                 "response_format": {"type": "json_schema", "json_schema": {
                     "name": "o",
                     "schema": schema_of("%s%d" % (tag, k), a.schema_props)}}}
            t0 = time.monotonic()
            st, _, data = du.http("POST", d.base_url + "/v1/chat/completions",
                                  b, None, 900)
            secs[k] = time.monotonic() - t0
            codes[k] = st
            if st not in (200, 400):
                raise RuntimeError("a schema request got %d: %r" % (st, data))
        sh = [threading.Thread(target=one, args=(k,))
              for k in range(a.schemas)]
        for t in sh:
            t.start()
        for t in sh:
            t.join()
    for t in th:
        t.join()
    if any(g is None for g in gaps):
        raise RuntimeError("a stream failed")
    return sorted(x for g in gaps for x in g), max(secs), codes


def pct(v, q):
    return v[min(len(v) - 1, int(q * len(v)))] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--streams", type=int, default=3)
    ap.add_argument("--stream-tokens", type=int, default=400)
    ap.add_argument("--schemas", type=int, default=2)
    ap.add_argument("--schema-props", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.requests, a.tokens = 2, 16
        a.streams, a.stream_tokens, a.schemas, a.schema_props = 2, 40, 1, 4
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
        alone, _, _ = itl_run(d, a, None)
        beside, compile_s, codes = itl_run(d, a, "bench%d" % os.getpid())
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
        print("no statistics line in the worker's log; its tail:")
        print(log[-3000:])
        return 1
    print("unconstrained streams (%d x %d tokens), inter-token gap in ms:"
          % (a.streams, a.stream_tokens))
    print("  alone:                               median %7.1f  p99 %7.1f  "
          "max %7.1f" % (pct(alone, 0.5), pct(alone, 0.99), alone[-1] * 1e3))
    print("  while %d first-seen schemas compile:  median %7.1f  p99 %7.1f  "
          "max %7.1f  (schema requests took %.2f s, statuses %s)"
          % (a.schemas, pct(beside, 0.5), pct(beside, 0.99),
             beside[-1] * 1e3, compile_s, codes))
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
