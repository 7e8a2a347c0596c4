#!/usr/bin/python3
"""Several choices per request (OpenAI `n`, docs/API.md "n") against the
real tangramd, over raw HTTP and through the official OpenAI Node client
(tests/integration/clients/openai_n.mjs):

- n = 3 greedy: every choice equals the n = 1 greedy output; indexes 0..2;
  usage counts the prompt once and sums the choices' tokens; the metrics
  count the prompt once and every choice's tokens.
- n = 3 with temperature 1 and seed s: choice i equals an n = 1 request
  with seed s + i; the same request streamed reassembles, per index, to
  the same choices, with one finish chunk per choice, one usage chunk and
  one [DONE].
- KV pages: with --profile none and a prompt of k pages plus one token per
  row, while every choice of an n = 4 stream runs, the pages the running
  requests hold are rows * (k + 4) (the prompt's full pages once, a
  private tail page per choice), against rows * (k + 1) for n = 1 (4x
  would be rows * 4 * (k + 1)); all back to zero after; closing the
  stream mid-way frees every choice's pages.
- n = 0, n = 17 and n above --max-num-seqs are 400 naming `n`; best_of
  other than n is 400 naming best_of.
- Slots: with --max-num-seqs 4 and three streams running, an n = 2
  request (two slots, one free) waits without a fifth slot and without
  harm to the running streams or the router, and is served once they
  end. (n > 1 under gvote is refused by
  the router, tests/unit/test_server_n.c; the daemon's workers do not run
  gvote yet, so no daemon here can be started with it.)
- The Node client: chat with n = 2, plain and streamed.

Fails, naming them, when node/npm or the daemon are missing.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading

import daemon_util as du

KEY = "sk-tangram-n"
MODEL = "tiny"
PROMPT = "The quick brown fox"
PAGE = 128
chk = du.Checker()
H = {"Authorization": "Bearer " + KEY}


def post(d, path, body):
    st, _, raw = du.http("POST", d.base_url + path, body, headers=H,
                         timeout=120)
    return st, du.json_of(raw), raw.decode(errors="replace")


def complete(d, **kw):
    body = dict({"model": MODEL, "prompt": PROMPT, "max_tokens": 6,
                 "temperature": 0, "ignore_eos": True}, **kw)
    return post(d, "/v1/completions", body)


def metrics(d):
    return du.fetch_metrics(d.base_url, headers=H)


def held_pages(m):
    """Pages the running requests hold on rank 0 (used minus stored)."""
    return int(du.metric(m, "tangram_kv_pages_used", rank="0")) - \
        int(du.metric(m, "tangram_kv_pages_cached", rank="0"))


def texts(j):
    return [c["text"] for c in sorted(j["choices"], key=lambda c: c["index"])]


def stream_choices(d, body):
    """POSTs a streaming completion; returns (choices text by index,
    finish reasons by index, usage chunks, [DONE] count, problems)."""
    st, _, raw = du.http("POST", d.base_url + "/v1/completions",
                         dict(body, stream=True), headers=H, timeout=120)
    out, fins, usage, done = {}, {}, [], 0
    payloads, problems = du.sse_events(raw)
    if st != 200:
        problems.append("status %d: %s" % (st, raw[:300]))
    for p in payloads:
        if p == "[DONE]":
            done += 1
            continue
        j = json.loads(p)
        if j.get("usage") is not None and not j["choices"]:
            usage.append(j["usage"])
        for c in j["choices"]:
            out[c["index"]] = out.get(c["index"], "") + c["text"]
            if c.get("finish_reason"):
                fins.setdefault(c["index"], []).append(c["finish_reason"])
    return out, fins, usage, done, problems


def t_choices(d):
    st, one, raw = complete(d)
    chk.check(st == 200, "n = 1 greedy", raw[:300])
    m0 = metrics(d)
    st, three, raw = complete(d, n=3)
    m1 = metrics(d)
    if not chk.check(st == 200 and len(three["choices"]) == 3,
                     "n = 3 greedy: 200 with three choices", raw[:500]):
        return
    chk.check([c["index"] for c in three["choices"]] == [0, 1, 2],
              "choices carry index 0, 1, 2 in order", three["choices"])
    chk.check(texts(three) == [one["choices"][0]["text"]] * 3,
              "every greedy choice equals the n = 1 output",
              (texts(three), one["choices"][0]["text"]))
    chk.check(all(c["finish_reason"] == "length" for c in three["choices"]),
              "each choice has its finish_reason", three["choices"])
    u, u1 = three["usage"], one["usage"]
    chk.check(u["prompt_tokens"] == u1["prompt_tokens"] and
              u["completion_tokens"] == 3 * u1["completion_tokens"] and
              u["total_tokens"] == u["prompt_tokens"] +
              u["completion_tokens"],
              "usage: the prompt once, completion tokens summed", (u, u1))
    dp = du.metric(m1, "tangram_prompt_tokens_total") - \
        du.metric(m0, "tangram_prompt_tokens_total")
    dg = du.metric(m1, "tangram_generation_tokens_total") - \
        du.metric(m0, "tangram_generation_tokens_total")
    chk.check(dp == u1["prompt_tokens"] and dg == u["completion_tokens"],
              "metrics: prompt tokens counted once, generation tokens per "
              "choice", (dp, dg, u))

    seed = 1234
    st, s3, raw = complete(d, n=3, temperature=1, seed=seed, max_tokens=8)
    chk.check(st == 200, "n = 3 sampled with a seed", raw[:300])
    want = []
    for i in range(3):
        st, j, raw = complete(d, temperature=1, seed=seed + i, max_tokens=8)
        want.append(j["choices"][0]["text"] if st == 200 else None)
    got = texts(s3) if s3 else None
    chk.check(got == want, "choice i equals n = 1 with seed + i",
              (got, want))
    chk.check(len(set(want)) > 1, "the seeded choices differ", want)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8,
            "temperature": 1, "seed": seed, "n": 3, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    out, fins, usage, done, problems = stream_choices(d, body)
    chk.check(not problems, "the stream is well-formed SSE", problems[:5])
    chk.check([out.get(i) for i in range(3)] == got,
              "the stream reassembles per index to the same choices",
              (out, got))
    chk.check(fins == {0: ["length"], 1: ["length"], 2: ["length"]},
              "one finish chunk per choice", fins)
    chk.check(len(usage) == 1 and usage[0]["completion_tokens"] == 24 and
              usage[0]["prompt_tokens"] == s3["usage"]["prompt_tokens"],
              "one usage chunk: the prompt once, 3 x 8 tokens", usage)
    chk.check(done == 1, "one [DONE]", done)
    # Seeded without a seed: the choices differ from each other.
    st, j, raw = complete(d, n=4, temperature=1, max_tokens=8)
    chk.check(st == 200 and len(set(texts(j))) > 1,
              "without a seed every choice draws its own", raw[:400])


def t_refused(d):
    for n, what in ((0, "n = 0"), (17, "n = 17")):
        st, j, raw = complete(d, n=n)
        chk.check(st == 400 and j["error"]["param"] == "n",
                  "%s -> 400 naming n" % what, raw[:300])
    st, j, raw = complete(d, n=2, best_of=3)
    chk.check(st == 400 and j["error"]["param"] == "best_of",
              "best_of 3 with n 2 -> 400 naming best_of", raw[:300])
    st, j, raw = complete(d, n=2, best_of=2)
    chk.check(st == 200 and len(j["choices"]) == 2, "best_of = n is served",
              raw[:300])


def long_prompt(d, k, rows):
    """A prompt of k * PAGE + 1 tokens (token ids)."""
    st, j, raw = post(d, "/tokenize", {"model": MODEL, "prompt":
                                       "alpha beta gamma delta " * 400,
                                       "add_special_tokens": False})
    assert st == 200, raw
    return j["tokens"][:k * PAGE + 1]


def wait_idle(d):
    def idle():
        m = metrics(d)
        return held_pages(m) == 0 and \
            int(du.metric(m, "tangram_num_requests_running")) == 0
    return du.wait_for(idle, 30)


def pages_while_running(d, ids, n, rows):
    """Streams `ids` with n choices and 100 tokens each; once every choice
    has sent text, reads the pages held while all n still run (retried
    when the request ended first). Returns the figure or None."""
    for _ in range(5):
        conn = http.client.HTTPConnection(d.host, d.http_port, timeout=120)
        body = json.dumps({"model": MODEL, "prompt": ids, "n": n,
                           "max_tokens": PAGE - 28, "temperature": 0,
                           "ignore_eos": True, "stream": True})
        conn.request("POST", "/v1/completions", body,
                     dict(H, **{"Content-Type": "application/json"}))
        resp = conn.getresponse()
        seen, ended = set(), False
        while len(seen) < n:
            line = resp.fp.readline()
            if not line:
                ended = True
                break
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            for c in json.loads(line[6:])["choices"]:
                seen.add(c["index"])
                ended |= c.get("finish_reason") is not None
        m = metrics(d)
        running = int(du.metric(m, "tangram_num_requests_running"))
        pages = held_pages(m)
        conn.close()
        wait_idle(d)
        if not ended and running == n:
            return pages
    return None


def t_pages(d):
    m = metrics(d)
    info = [dict(lb) for (name, lb) in m if name ==
            "tangram_cache_config_info"]
    page = int(info[0]["page_size"]) if info else None
    chk.check(page == PAGE, "the page size is --page-size", info)
    rows = 2  # 2 layers x 1 group (2 KV heads, --heads-per-group 2)
    k = 4
    ids = long_prompt(d, k, rows)
    p1 = pages_while_running(d, ids, 1, rows)
    p4 = pages_while_running(d, ids, 4, rows)
    chk.check(p1 == rows * (k + 1),
              "n = 1 holds the prompt's pages: rows * (k + 1) = %d"
              % (rows * (k + 1)), p1)
    chk.check(p4 == rows * (k + 4),
              "n = 4 holds the prompt's full pages once plus a tail page "
              "per choice: rows * (k + 4) = %d (4x n = 1 would be %d)"
              % (rows * (k + 4), 4 * rows * (k + 1)), p4)
    chk.check(wait_idle(d), "every page back after the requests",
              held_pages(metrics(d)))
    # Closing the stream mid-way frees every choice's pages.
    conn = http.client.HTTPConnection(d.host, d.http_port, timeout=120)
    conn.request("POST", "/v1/completions",
                 json.dumps({"model": MODEL, "prompt": ids, "n": 4,
                             "max_tokens": 2000, "temperature": 0,
                             "ignore_eos": True, "stream": True}),
                 dict(H, **{"Content-Type": "application/json"}))
    resp = conn.getresponse()
    got = b""
    while not got.startswith(b"data:"):
        got = resp.fp.readline()
        if not got:
            break
    m = metrics(d)
    busy = int(du.metric(m, "tangram_num_requests_running"))
    conn.sock.close()
    conn.close()
    chk.check(got.startswith(b"data:") and busy == 4,
              "an n = 4 stream runs four requests", (got[:100], busy))
    chk.check(wait_idle(d), "closing it frees every choice's pages",
              held_pages(metrics(d)))
    st, j, raw = complete(d, n=2)
    chk.check(st == 200, "the server serves on after the abort", raw[:200])


def t_node(d):
    root, why = du.node_clients(["openai_n.mjs"])
    if root is None:
        chk.check(False, "the OpenAI Node client is available", why)
        return
    r = subprocess.run(["node", os.path.join(root, "openai_n.mjs"),
                        d.base_url + "/v1", MODEL],
                       capture_output=True, text=True, timeout=180, cwd=root,
                       env=dict(os.environ, OPENAI_API_KEY=KEY))
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not chk.check(r.returncode == 0 and isinstance(j, dict) and
                     "error" not in j, "node: every request returned",
                     r.stdout[-1500:] + r.stderr[-800:]):
        return
    one = j["one"]["content"]
    two = j["two"]
    chk.check([c["index"] for c in two["choices"]] == [0, 1] and
              all(c["content"] == one and c["finish_reason"] == "length"
                  for c in two["choices"]),
              "node: chat n = 2 greedy, both choices the n = 1 message",
              (two, one))
    chk.check(two["usage"]["prompt_tokens"] ==
              j["one"]["usage"]["prompt_tokens"] and
              two["usage"]["completion_tokens"] ==
              2 * j["one"]["usage"]["completion_tokens"],
              "node: chat usage, the prompt once", two["usage"])
    s = j["stream"]
    chk.check(s["choices"] == {"0": {"content": one, "finish_reason": "length"},
                               "1": {"content": one,
                                     "finish_reason": "length"}} and
              s["roles"] == {"0": "assistant", "1": "assistant"} and
              len(s["ids"]) == 1,
              "node: the chat stream reassembles per index (a role each, "
              "one id)", s)
    chk.check(s["usage"] == two["usage"], "node: streamed usage the same",
              (s["usage"], two["usage"]))
    x = j["n17"]
    chk.check(x is not None and x["status"] == 400 and x["bad_request"] and
              x["param"] == "n", "node: n = 17 -> BadRequestError naming n",
              x)


def t_slots(d):
    """--max-num-seqs 4 with three requests running: an n = 2 request needs
    two slots, one is free, so it waits (the router neither admits it into
    a fifth slot nor dies: its pid stays the same and the running streams
    go on) and is served once the streams end."""
    router = d.child_pids("router")
    streams = []
    for i in range(3):
        conn = http.client.HTTPConnection(d.host, d.http_port, timeout=120)
        conn.request("POST", "/v1/completions",
                     json.dumps({"model": MODEL, "prompt": PROMPT + " %d" % i,
                                 "max_tokens": 3000, "temperature": 0,
                                 "ignore_eos": True, "stream": True}),
                     dict(H, **{"Content-Type": "application/json"}))
        resp = conn.getresponse()
        line = resp.fp.readline()
        while line and not line.startswith(b"data:"):
            line = resp.fp.readline()
        streams.append((conn, resp, line))
    chk.check(all(ln.startswith(b"data:") for _, _, ln in streams) and
              du.wait_for(lambda: du.metric(
                  metrics(d), "tangram_num_requests_running") == 3, 10),
              "three streams run", [ln[:80] for _, _, ln in streams])
    out = {}

    def group():
        try:
            out["r"] = complete(d, n=2)
        except OSError as e:
            out["r"] = (None, None, "request failed: %s" % e)

    def gauge(name):
        m = metrics(d)
        return du.metric(m, name) if m is not None else None

    t = threading.Thread(target=group)
    t.start()
    # Each stream has thousands of tokens to go: the group waits.
    waited = du.wait_for(lambda: (gauge("tangram_num_requests_waiting") or
                                  0) >= 1, 10, 0.02)
    running = gauge("tangram_num_requests_running")
    chk.check(waited and t.is_alive() and running == 3,
              "n = 2 with one slot free waits (no fifth slot)",
              (waited, t.is_alive(), running))
    for conn, resp, _ in streams:
        # Each stream still sends: none was lost to the waiting group.
        more = b""
        for _ in range(12):  # past the chunked framing's lines
            try:
                more = resp.fp.readline()
            except OSError as e:
                more = str(e).encode()
            if not more or more.startswith(b"data: {"):
                break
        chk.check(more.startswith(b"data: {"), "a running stream goes on",
                  more[:120])
        conn.sock.close()
        conn.close()
    t.join(120)
    st, j, raw = out.get("r", (None, None, "no answer"))
    chk.check(st == 200 and len(j["choices"]) == 2 and
              all(c["finish_reason"] == "length" for c in j["choices"]),
              "the n = 2 request is served once the streams end", raw[:300])
    chk.check(d.child_pids("router") == router and
              "assertion failed" not in d.log_text(),
              "the router did not restart or assert", d.log_text()[-1500:])


def t_max_seqs(work, model):
    """--max-num-seqs 4: n = 5 is 400 naming n; n = 4 is served; an n = 2
    request with three running waits for its two slots (t_slots)."""
    d = du.Daemon(model, work, api_key=KEY, args=["--max-num-seqs", "4"])
    try:
        ready = d.start()
        chk.check(ready, "tangramd starts with --max-num-seqs 4",
                  d.log_text()[-3000:])
        if not ready:
            return
        st, j, raw = complete(d, n=5)
        chk.check(st == 400 and j["error"]["param"] == "n" and
                  "max-num-seqs" in j["error"]["message"],
                  "n = 5 above --max-num-seqs 4 -> 400 naming n", raw[:300])
        st, j, raw = complete(d, n=4)
        chk.check(st == 200 and len(j["choices"]) == 4,
                  "n = 4 = --max-num-seqs is served", raw[:300])
        t_slots(d)
    finally:
        rc, left = d.stop()
        chk.check(rc == 0 and not left, "the second tangramd exits 0")
        san = d.sanitizer_reports()
        chk.check(not san, "no sanitizer report (second daemon)",
                  "\n".join(san[:10]))


def main():
    missing = du.missing_inputs(tools=["node", "npm"])
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdn")
    d = None
    try:
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, os.path.join(work, "full"), api_key=KEY,
                      profile="none", args=["--page-size", str(PAGE)])
        os.makedirs(d.workdir, exist_ok=True)
        ready = d.start()
        chk.check(ready, "tangramd starts", d.log_text()[-3000:])
        if ready:
            t_choices(d)
            t_refused(d)
            t_pages(d)
            t_node(d)
            chk.check(wait_idle(d), "no pages held at the end",
                      held_pages(metrics(d)))
        rc, left = d.stop()
        d = None
        chk.check(rc == 0 and not left, "tangramd exits 0 on SIGTERM")
        w2 = os.path.join(work, "seqs")
        os.makedirs(w2, exist_ok=True)
        t_max_seqs(w2, model)
    finally:
        if d is not None:
            d.stop()
            san = d.sanitizer_reports()
            chk.check(not san, "no sanitizer report in the daemon's log",
                      "\n".join(san[:10]))
            if chk.failures:
                print("---- tangramd log (tail) ----")
                print(d.log_text()[-4000:])
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
