#!/usr/bin/python3
"""bench_responses — multi-turn conversations three ways, side by side
(docs/PERFORMANCE.md "Conversations held by the server"):

  chat      /v1/chat/completions, the client re-sending the whole history
            (the template renders it again every turn)
  ids       /v1/responses with previous_response_id (the default): the
            stored token ids of the conversation plus the new turn
  rerender  /v1/responses with previous_response_id under
            --responses-rerender: the stored items rendered again

Per way: C conversations of T turns (greedy, max_tokens M, streamed), one
request at a time so the numbers are per turn, not queueing.
Reported per way, over the turns after the first: prompt tokens, tokens
reused from the multi-turn KV cache (usage cached_tokens), the tokens
prefilled (the difference), and time to first token p50 / p99 (the
first text delta after the request was sent).

    TANGRAM_BIN=build/bin bench_responses.py [--model DIR] [--conversations
        8] [--turns 6] [--max-tokens 24] [--target R] [--quick]
        [-- extra tangramd flags]
Without --model, the tiny qwen3 model of the integration tests is
generated. --target R: each way also under a compressing profile of ratio
R, calibrated now with tangram-profile (rows "<way> prof R").
--interleave: turn t of every conversation before turn t+1 (the
conversations then compete for the KV pool). Extra flags
go to every tangramd (e.g. -- --kv-memory 2MiB --kv-host-memory 0 for
pressure without the host tier). --quick: 2 conversations of 3 turns (ctest runs it as
bench-responses-quick). Exits 1 when a request fails.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import daemon_util as du  # noqa: E402

USER_TURNS = ["Tell me about the sea.", "What lives in it?",
              "And in the deep?", "How deep does it go?",
              "Who explored it first?", "What did they find?",
              "Is it still unexplored?", "Thank you."]


def stream(d, path, body, timeout=600):
    """POSTs a streaming request; returns (ttft seconds, text, usage)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=timeout)
    t0 = time.monotonic()
    c.request("POST", path, body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("%s: %d %s" % (path, r.status, r.read()[:300]))
    ttft, text, usage, buf = None, [], None, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            for line in block.decode().split("\n"):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                delta = None
                if ev.get("type") == "response.output_text.delta":
                    delta = ev["delta"]
                elif ev.get("type") in ("response.completed",
                                        "response.incomplete"):
                    usage = ev["response"]["usage"]
                    usage = {"prompt": usage["input_tokens"], "cached":
                             usage["input_tokens_details"]["cached_tokens"],
                             "id": ev["response"]["id"]}
                elif "choices" in ev:
                    if ev["choices"]:
                        delta = ev["choices"][0]["delta"].get("content")
                    if ev.get("usage"):
                        u = ev["usage"]
                        usage = {"prompt": u["prompt_tokens"], "cached":
                                 (u.get("prompt_tokens_details") or {})
                                 .get("cached_tokens", 0)}
                if delta:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    text.append(delta)
    c.close()
    return ttft if ttft is not None else time.monotonic() - t0, \
        "".join(text), usage


def run_way(d, way, convs, turns, max_tokens, interleave):
    rows = []  # (turn, prompt, cached, ttft)
    history = [[] for _ in range(convs)]
    prevs = [None] * convs
    order = [(ci, t) for t in range(turns) for ci in range(convs)] \
        if interleave else [(ci, t) for ci in range(convs)
                            for t in range(turns)]
    for ci, t in order:
        if True:
            history_c, prev = history[ci], prevs[ci]
            user = "%s (%d)" % (USER_TURNS[t % len(USER_TURNS)], ci)
            if way == "chat":
                history_c.append({"role": "user", "content": user})
                ttft, text, u = stream(d, "/v1/chat/completions", {
                    "messages": history_c, "max_tokens": max_tokens,
                    "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}})
                history_c.append({"role": "assistant", "content": text})
            else:
                body = {"input": user, "max_output_tokens": max_tokens,
                        "temperature": 0, "stream": True}
                if prev is not None:
                    body["previous_response_id"] = prev
                ttft, text, u = stream(d, "/v1/responses", body)
                prevs[ci] = u["id"]
            rows.append((t, u["prompt"], u["cached"], ttft))
    return rows


def calibrate(model, work, target):
    """A profile of ratio `target` for the model, calibrated now on a few
    samples of the conversations' words (tangram-profile calibrate)."""
    import subprocess
    samples = os.path.join(work, "calib.jsonl")
    with open(samples, "w") as f:
        for i in range(8):
            f.write(json.dumps({"text": " ".join(
                USER_TURNS[(i + k) % len(USER_TURNS)] for k in range(40))})
                + "\n")
    out = os.path.join(work, "profile-%.2f.json" % target)
    r = subprocess.run([du.prog("tangram-profile"), "calibrate", "--model",
                        model, "--ratio", str(target), "--samples", samples,
                        "--heads-per-group", "2", "--backend", "cpu", "-o",
                        out], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError("calibration failed: " + r.stderr[-2000:])
    return out


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--target", type=float)
    ap.add_argument("--interleave", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    if a.quick:
        a.conversations, a.turns = 2, 3
    missing = du.missing_inputs()
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgbresp")
    model = a.model or du.make_model(os.path.join(work, "model"))
    print("%d conversations x %d turns%s, max_tokens %d, flags %s, load "
          "%.2f" % (a.conversations, a.turns,
                    " (interleaved)" if a.interleave else "", a.max_tokens,
                    " ".join(a.extra) or "-", os.getloadavg()[0]))
    print("%-18s %8s %8s %9s %9s %9s" % ("way", "prompt", "reused",
                                        "prefill", "ttft p50", "ttft p99"))
    rc = 0
    runs = [(way, None) for way in ("chat", "ids", "rerender")]
    if a.target is not None:
        prof = calibrate(model, work, a.target)
        runs += [(way, prof) for way in ("chat", "ids", "rerender")]
    for way, prof in runs:
        args = list(a.extra) + (["--responses-rerender"]
                                if way == "rerender" else [])
        d = du.Daemon(model, work, args, profile=prof)
        label = way if prof is None else "%s prof %.2f" % (way, a.target)
        with d:
            if not d.start():
                print("FAIL: tangramd did not start:",
                      d.log_since_start()[-2000:])
                return 1
            try:
                rows = run_way(d, way, a.conversations, a.turns,
                               a.max_tokens, a.interleave)
            except (RuntimeError, OSError, ValueError, KeyError) as e:
                print("FAIL: %s: %s" % (label, e))
                rc = 1
                d.stop()
                continue
            d.stop()
        later = [r for r in rows if r[0] > 0]
        prompt = sum(r[1] for r in later)
        reused = sum(r[2] for r in later)
        ttfts = [r[3] * 1000 for r in later]
        print("%-18s %8d %8d %9d %7.1fms %7.1fms" %
              (label, prompt, reused, prompt - reused, pct(ttfts, 0.5),
               pct(ttfts, 0.99)))
    return rc


if __name__ == "__main__":
    sys.exit(main())
