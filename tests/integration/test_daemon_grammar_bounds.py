#!/usr/bin/python3
"""An ambiguous schema costs its own request only (DESIGN.md §4.11, "Work
per token"), through the real tangramd (CPU backend, the tiny model, the
Qwen3 tokenizer):

- the tree schema: anyOf of two array schemas whose items are the tree
  again, so after every "[" both alternatives are alive. With a logit_bias
  that makes the model open "[" at every token, the output nests as deep as
  max_tokens. A matcher that kept one head per stack doubled its work per
  level: the step took 0.05 s at depth 8, 3.95 s at 12 and never ended at
  16, the worker was declared stalled and killed, and every request in
  flight failed. Now the request answers 200 with finish_reason "length"
  and an output of DEPTH "[", the worker is the same process, and
  unconstrained streams beside it keep their pace (no gap between two
  tokens reaches GAP_MAX) and complete.
- the same with n = 2 (two matchers of one grammar) and streaming.

Bounds: GAP_MAX is 1.5 s. A step of the tiny model takes 5-50 ms on the
shared 2-core machine (gaps up to 0.5 s were seen at load average 9); the
failure this test catches is a step of seconds, then a killed worker.
Fails, naming it, when the daemon is missing.
"""
import http.client as httplib
import json
import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

MODEL = "tiny"
GAP_MAX = 1.5
DEPTH = 200
chk = du.Checker()

TREE = {"anyOf": [
    {"type": "array", "items": {"$ref": "#"}, "maxItems": 2},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 3}]}


class Stream(threading.Thread):
    """One unconstrained streaming chat of n tokens (ignore_eos); records
    the arrival time of every content event."""

    def __init__(self, d, n, seed):
        threading.Thread.__init__(self)
        self.d, self.n, self.seed = d, n, seed
        self.times, self.status, self.done, self.error = [], None, False, None

    def run(self):
        body = {"model": MODEL, "max_tokens": self.n, "temperature": 1.0,
                "seed": self.seed, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "Tell me more."}]}
        try:
            c = httplib.HTTPConnection(self.d.host, self.d.http_port,
                                       timeout=600)
            c.request("POST", "/v1/chat/completions", json.dumps(body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            self.status = r.status
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data: [DONE]"):
                    self.done = True
                    break
                if line.startswith(b"data:") and b'"content"' in line:
                    self.times.append(time.monotonic())
            c.close()
        except OSError as e:
            self.error = str(e)

    def max_gap(self):
        g = [b - a for a, b in zip(self.times, self.times[1:])]
        return max(g) if g else 0.0


def token_id(d, text):
    st, _, data = du.http("POST", d.base_url + "/tokenize",
                          {"model": MODEL, "prompt": text,
                           "add_special_tokens": False})
    doc = du.json_of(data) or {}
    toks = doc.get("tokens") or []
    return toks[0] if st == 200 and len(toks) == 1 else None


def tree_body(bracket, n=1, stream=False):
    b = {"model": MODEL, "max_tokens": DEPTH, "temperature": 0, "n": n,
         "logit_bias": {str(bracket): 100},
         "messages": [{"role": "user", "content": "A tree, please."}],
         "response_format": {"type": "json_schema", "json_schema": {
             "name": "tree", "schema": TREE}}}
    if stream:
        b["stream"] = True
    return b


def t_tree(d, bracket, n, stream):
    name = "tree schema, n = %d%s" % (n, ", streamed" if stream else "")
    workers = d.child_pids("worker")
    streams = [Stream(d, 150, 10 + i) for i in range(2)]
    for s in streams:
        s.start()
    du.wait_for(lambda: all(len(s.times) >= 3 for s in streams), 60)
    t0 = time.monotonic()
    st, _, data = du.http("POST", d.base_url + "/v1/chat/completions",
                          tree_body(bracket, n, stream), None, 600)
    took = time.monotonic() - t0
    for s in streams:
        s.join()
    texts, reasons = [""] * n, [None] * n
    if stream:
        payloads, problems = du.sse_events(data) if st == 200 else ([], [])
        chk.check(not problems, "%s: a clean event stream" % name,
                  problems[:3])
        for p in payloads:
            ev = json.loads(p) if p != "[DONE]" else None
            if not isinstance(ev, dict):
                continue
            for c in ev.get("choices", []):
                texts[c["index"]] += c.get("delta", {}).get("content") or ""
                if c.get("finish_reason"):
                    reasons[c["index"]] = c["finish_reason"]
    else:
        doc = du.json_of(data) or {}
        for c in doc.get("choices", []):
            texts[c["index"]] = c["message"].get("content") or ""
            reasons[c["index"]] = c.get("finish_reason")
    chk.check(st == 200, "%s: 200 in %.1f s" % (name, took),
              (st, data[:300]))
    for i in range(n):
        chk.check(texts[i] == "[" * DEPTH and reasons[i] == "length",
                  "%s, choice %d: %d nested \"[\", finish_reason length"
                  % (name, i, DEPTH),
                  (len(texts[i]), texts[i][:40], reasons[i]))
    chk.check(d.child_pids("worker") == workers,
              "%s: the worker was not restarted" % name,
              (workers, d.child_pids("worker")))
    chk.check(all(s.done and s.status == 200 for s in streams),
              "%s: streams beside it complete" % name,
              [(s.status, s.done, s.error) for s in streams])
    worst = max(s.max_gap() for s in streams)
    chk.check(worst < GAP_MAX, "%s: no stream stalled (longest gap %.3f s "
              "< %.1f s)" % (name, worst, GAP_MAX))


def main():
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tggbounds")
    model = du.make_model(os.path.join(work, "tiny"))
    d = du.Daemon(model, work, ["--max-model-len", "2048"])
    if not d.start():
        chk.check(False, "tangramd starts", d.log_text()[-3000:])
        return chk.summary()
    try:
        bracket = token_id(d, "[")
        chk.check(bracket is not None, "\"[\" is one token", bracket)
        if bracket is not None:
            t_tree(d, bracket, 1, False)
            t_tree(d, bracket, 2, True)
        d.check_alive(chk)
    finally:
        d.stop_checked(chk)
        if chk.failures:
            d.print_log_tail(chk)
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
