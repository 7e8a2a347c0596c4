#!/usr/bin/python3
"""Integration test of the real tangramd over its OpenAI-compatible HTTP API.

Starts tangramd (router + one CPU worker) on loopback with the tiny qwen3
model, --max-model-len 128 and an API key, and drives it with http.client,
curl and the official OpenAI Node client (npm `openai`, installed on first
use from the committed tests/integration/clients/package-lock.json with
`npm ci` into <build>/integration-clients or $TMPDIR; when node/npm or the
registry are unavailable that part fails, naming what is missing, and the
rest still runs).

Checked: /health (open without the key), /v1/models, /metrics (parses, has
the DESIGN §5 names), the API key (401 in the OpenAI error shape), non-
streaming and SSE completions and chats (every chunk parses, role first,
usage chunk, data: [DONE]), greedy determinism and stream == non-stream,
seed reproducibility at temperature 1, logprobs shapes, stop strings,
ignore_eos + max_tokens, 32 concurrent streams, multi-turn reuse (history
re-sent, and X-Session-Id) in usage and in tangram_cached_prompt_tokens_total,
/tokenize + /detokenize, client disconnect, every kind of bad input (each gets
the right status and the OpenAI error shape, and the server keeps serving),
and the page accounting after all of it.

Page accounting we expect (full KV, --page-size 16, 2 layers, 2 KV heads in
one group): a finished request's KV stays in the multi-turn cache holding
layers * groups * ceil(n / 16) = 2 * ceil(n / 16) pages per rank, where
n = prompt_tokens + completion_tokens - 1 (the last sampled token is never
fed back). Storing a sequence equal to a stored one replaces it; taking an
entry for the next turn moves its pages to the new request. An aborted or
disconnected request frees its pages at once. So: after a batch of requests
with distinct prompts tangram_kv_pages_used grows by exactly the sum of
their entries; after a disconnect or bad input it does not move; and at
the end nothing is running or waiting.

Set TANGRAM_TEST_PROFILE=FILE to serve a profile instead of full KV (the
exact page counts are then not checked). Fails, naming them, when the
daemon, curl or node/npm are missing. About 40 s on 2 cores.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

KEY = "sk-tangram-test"
AUTH = {"Authorization": "Bearer " + KEY}
MODEL = "tiny"
PAGE = 16
LAYERS_X_GROUPS = 2  # 2 layers, 2 KV heads in groups of 2
MAX_LEN = 128

chk = du.Checker()
PROFILE = os.environ.get("TANGRAM_TEST_PROFILE") or None


def entry_pages(prompt_tokens, completion_tokens):
    """Pages a stored multi-turn entry holds per rank (module docstring)."""
    n = prompt_tokens + completion_tokens - 1
    return LAYERS_X_GROUPS * -(-n // PAGE)


class Api:
    """Thin client of one daemon: JSON posts with the key."""

    def __init__(self, d):
        self.d = d

    def post(self, path, body, headers=None, timeout=60):
        h = dict(AUTH)
        h.update(headers or {})
        return du.http("POST", self.d.base_url + path, body, h, timeout)

    def post_json(self, path, body, headers=None):
        st, hd, data = self.post(path, body, headers)
        return st, du.json_of(data), data

    def complete(self, **kw):
        body = {"model": MODEL, "max_tokens": 8, "temperature": 0}
        body.update(kw)
        return self.post_json("/v1/completions", body)

    def chat(self, messages, headers=None, **kw):
        body = {"model": MODEL, "messages": messages, "max_tokens": 8,
                "temperature": 0}
        body.update(kw)
        return self.post_json("/v1/chat/completions", body, headers)

    def metrics(self):
        return du.fetch_metrics(self.d.base_url, AUTH)

    def pages_used(self):
        m = self.metrics()
        return None if m is None else du.metric(m, "tangram_kv_pages_used",
                                                rank="0")

    def idle(self, timeout=10):
        """Waits until nothing runs or waits; returns the metrics then."""
        def quiet():
            m = self.metrics()
            if m and du.metric(m, "tangram_num_requests_running") == 0 and \
                    du.metric(m, "tangram_num_requests_waiting") == 0:
                return m
            return None
        return du.wait_for(quiet, timeout, 0.05)


def stream(api, path, body, headers=None):
    """A streaming request; returns (status, content-type, payloads,
    problems, raw)."""
    st, hd, data = api.post(path, body, headers)
    payloads, problems = du.sse_events(data)
    return st, hd.get("content-type", ""), payloads, problems, data


def parse_chunks(payloads):
    """JSON chunks before [DONE]; (chunks, ended_with_done, bad)."""
    done = bool(payloads) and payloads[-1] == "[DONE]"
    body = payloads[:-1] if done else payloads
    chunks, bad = [], []
    for p in body:
        j = du.json_of(p)
        (chunks if isinstance(j, dict) else bad).append(j if j else p)
    return chunks, done, bad


# ---- individual checks ---------------------------------------------------

def t_basic(api):
    d = api.d
    st, _, body = du.http("GET", d.base_url + "/health")
    chk.check(st == 200, "/health 200 without a key", (st, body))
    st, _, body = du.http("GET", d.base_url + "/v1/models", headers=AUTH)
    j = du.json_of(body)
    chk.check(st == 200 and j and j.get("object") == "list" and
              [m.get("id") for m in j.get("data", [])] == [MODEL],
              "/v1/models lists the served model", body)
    for what, hdrs in (("missing", {}),
                       ("wrong", {"Authorization": "Bearer nope"}),
                       ("not bearer", {"Authorization": "Basic " + KEY})):
        st, _, body = du.http("POST", d.base_url + "/v1/completions",
                              {"model": MODEL, "prompt": "hi"}, hdrs)
        chk.check(st == 401 and du.is_openai_error(body),
                  "%s API key -> 401 in the OpenAI error shape" % what,
                  (st, body))
    st, _, body = du.http("GET", d.base_url + "/v1/models")
    chk.check(st == 401 and du.is_openai_error(body),
              "/v1/models needs the key too", (st, body))


def t_completion(api):
    st, j, raw = api.complete(prompt="The capital of France is")
    ok = st == 200 and j and j.get("object") == "text_completion" and \
        j["choices"][0]["finish_reason"] in ("length", "stop") and \
        isinstance(j["choices"][0]["text"], str)
    chk.check(ok, "non-streaming completion", raw)
    if not ok:
        return
    u = j["usage"]
    chk.check(u["prompt_tokens"] > 0 and
              u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
              and (u["completion_tokens"] == 8 or
                   j["choices"][0]["finish_reason"] == "stop"),
              "completion usage adds up", u)
    st2, j2, raw2 = api.complete(prompt="The capital of France is")
    chk.check(st2 == 200 and j2["choices"][0]["text"] ==
              j["choices"][0]["text"], "greedy: same prompt, same text",
              (raw, raw2))
    # Streaming, same prompt: the deltas join to the same text.
    st, ct, payloads, problems, raw = stream(
        api, "/v1/completions",
        {"model": MODEL, "prompt": "The capital of France is",
         "max_tokens": 8, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True}})
    chunks, done, bad = parse_chunks(payloads)
    chk.check(st == 200 and ct.startswith("text/event-stream") and
              not problems and not bad and done,
              "SSE completion: event-stream, every chunk parses, ends with "
              "data: [DONE]", raw[:1500])
    text = "".join(c["choices"][0].get("text", "") for c in chunks
                   if c.get("choices"))
    fins = [c["choices"][0].get("finish_reason") for c in chunks
            if c.get("choices")]
    chk.check(text == j["choices"][0]["text"],
              "SSE completion text equals the non-streaming text",
              (text, j["choices"][0]["text"]))
    chk.check(fins and fins[-1] == j["choices"][0]["finish_reason"] and
              all(f is None for f in fins[:-1]),
              "finish_reason only on the last choice chunk", fins)
    usage = [c for c in chunks if c.get("usage") and not c.get("choices")]
    chk.check(len(usage) == 1 and usage[0]["usage"]["completion_tokens"] ==
              j["usage"]["completion_tokens"] and chunks[-1] is usage[0],
              "one usage chunk (choices []) last with include_usage",
              usage)
    # Without include_usage: no usage chunk.
    st, _, payloads, _, _ = stream(
        api, "/v1/completions",
        {"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": True})
    chunks2, done2, _ = parse_chunks(payloads)
    chk.check(st == 200 and done2 and
              not any(c.get("usage") for c in chunks2),
              "no usage chunk without stream_options", payloads)
    return j["choices"][0]["text"]


def t_chat(api):
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say something."}]
    st, j, raw = api.chat(msgs)
    ok = st == 200 and j and j.get("object") == "chat.completion" and \
        j["choices"][0]["message"]["role"] == "assistant"
    chk.check(ok, "non-streaming chat completion", raw)
    st, ct, payloads, problems, raw = stream(
        api, "/v1/chat/completions",
        {"model": MODEL, "messages": msgs, "max_tokens": 8, "temperature": 0,
         "stream": True, "stream_options": {"include_usage": True}})
    chunks, done, bad = parse_chunks(payloads)
    chk.check(st == 200 and not problems and not bad and done and chunks,
              "SSE chat: every chunk parses, ends with data: [DONE]",
              raw[:1500])
    if not chunks:
        return
    first = chunks[0]
    chk.check(first.get("object") == "chat.completion.chunk" and
              first["choices"][0]["delta"].get("role") == "assistant",
              "SSE chat: first chunk carries the assistant role", first)
    text = "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if c.get("choices"))
    chk.check(ok and text == j["choices"][0]["message"]["content"],
              "SSE chat text equals the non-streaming content",
              (text, j and j["choices"][0]["message"]["content"]))
    chk.check(chunks[-1].get("choices") == [] and
              chunks[-1]["usage"]["total_tokens"] ==
              j["usage"]["total_tokens"], "SSE chat usage chunk",
              chunks[-1])


def t_seed(api):
    def sample(seed):
        st, j, raw = api.complete(prompt="Once upon a time", max_tokens=6,
                                  temperature=1.0, seed=seed,
                                  ignore_eos=True)
        return j["choices"][0]["text"] if st == 200 else raw
    a, b, c = sample(42), sample(42), sample(43)
    chk.check(a == b, "temperature 1: same seed, same text", (a, b))
    chk.check(a != c, "temperature 1: different seed, different text",
              (a, c))


def t_logprobs(api):
    st, j, raw = api.complete(prompt="Hello", max_tokens=5, logprobs=3,
                              ignore_eos=True)
    lp = j and st == 200 and j["choices"][0].get("logprobs")
    ok = bool(lp) and len(lp["tokens"]) == 5 and \
        len(lp["token_logprobs"]) == 5 and len(lp["top_logprobs"]) == 5 and \
        len(lp["text_offset"]) == 5 and \
        all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"]) \
        and all(isinstance(t, dict) and 1 <= len(t) <= 3
                for t in lp["top_logprobs"])
    chk.check(ok, "completion logprobs=3: 5 tokens, <= 3 alternatives each",
              raw[:1500])
    if ok:
        # Greedy: the sampled token is the best alternative.
        chk.check(all(abs(max(t.values()) - x) < 1e-4 for t, x in
                      zip(lp["top_logprobs"], lp["token_logprobs"])),
                  "greedy token logprob is the top alternative's", lp)
    st, j, raw = api.chat([{"role": "user", "content": "hi"}], max_tokens=4,
                          logprobs=True, top_logprobs=2, ignore_eos=True)
    content = j and st == 200 and (j["choices"][0].get("logprobs") or
                                   {}).get("content")
    chk.check(bool(content) and len(content) == 4 and
              all(isinstance(c["token"], str) and c["logprob"] <= 0 and
                  len(c["top_logprobs"]) == 2 for c in content),
              "chat logprobs with top_logprobs=2: 4 entries of 2", raw[:1500])
    st, j, raw = api.complete(prompt="Hello", max_tokens=2)
    chk.check(st == 200 and j["choices"][0]["logprobs"] is None,
              "no logprobs unless asked", raw)


def t_stop(api):
    # Find a stop string inside a greedy output, then ask again with it.
    for prompt in ("The quick brown fox", "Numbers: 1, 2, 3,", "Hello world",
                   "In the beginning"):
        st, j, _ = api.complete(prompt=prompt, max_tokens=16,
                                ignore_eos=True)
        text = j["choices"][0]["text"] if st == 200 else ""
        for k in range(2, len(text) - 2):
            s = text[k:k + 2]
            if s.isascii() and s.strip() == s and s.isprintable() and \
                    text.find(s) == k:
                break
        else:
            continue
        st, j2, raw = api.complete(prompt=prompt, max_tokens=16,
                                   ignore_eos=True, stop=[s])
        out = j2["choices"][0]["text"] if st == 200 else None
        chk.check(out == text[:k] and s not in out and
                  j2["choices"][0]["finish_reason"] == "stop",
                  "stop string %r: output cut before it, finish_reason stop"
                  % s, (text, raw))
        st, _, payloads, _, _ = stream(
            api, "/v1/completions",
            {"model": MODEL, "prompt": prompt, "max_tokens": 16,
             "temperature": 0, "ignore_eos": True, "stop": s,
             "stream": True})
        chunks, done, _ = parse_chunks(payloads)
        sout = "".join(c["choices"][0]["text"] for c in chunks)
        chk.check(done and sout == text[:k] and
                  chunks[-1]["choices"][0]["finish_reason"] == "stop",
                  "streamed stop string: same cut, finish_reason stop",
                  (sout, text[:k]))
        return
    chk.check(False, "stop strings: no usable ASCII pair in any output")


def t_ignore_eos(api):
    st, j, raw = api.complete(prompt="Hi", max_tokens=20, ignore_eos=True,
                              temperature=0.8, seed=3)
    chk.check(st == 200 and j["usage"]["completion_tokens"] == 20 and
              j["choices"][0]["finish_reason"] == "length",
              "ignore_eos + max_tokens 20 -> exactly 20 tokens, length", raw)
    st, j, raw = api.complete(prompt="Hi", ignore_eos=True, max_tokens=None)
    # OpenAI's legacy completions default max_tokens to 16.
    chk.check(st == 200 and j["usage"]["completion_tokens"] == 16,
              "completion without max_tokens: OpenAI's default of 16", raw)
    st, j, raw = api.chat([{"role": "user", "content": "Hi"}],
                          ignore_eos=True, max_tokens=None)
    # Chat without max_tokens: up to the context (128 - prompt).
    chk.check(st == 200 and j["usage"]["prompt_tokens"] +
              j["usage"]["completion_tokens"] == MAX_LEN and
              j["choices"][0]["finish_reason"] == "length",
              "chat with ignore_eos and no max_tokens fills the context "
              "exactly", raw)


def t_concurrent(api, pages_check):
    n = 32
    prompts = ["Request number %d says" % i for i in range(n)]
    results = [None] * n

    def one(i):
        try:
            results[i] = stream(api, "/v1/completions",
                                {"model": MODEL, "prompt": prompts[i],
                                 "max_tokens": 8, "temperature": 0,
                                 "ignore_eos": True, "stream": True,
                                 "stream_options": {"include_usage": True}})
        except OSError as e:
            results[i] = e

    before = api.pages_used()
    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in th:
        t.start()
    for t in th:
        t.join(120)
    took = time.time() - t0
    good, texts, expect_pages = 0, [], 0
    for i, r in enumerate(results):
        if isinstance(r, tuple) and r[0] == 200:
            chunks, done, bad = parse_chunks(r[2])
            u = chunks[-1].get("usage") if chunks else None
            if done and not bad and u and u["completion_tokens"] == 8:
                good += 1
                texts.append("".join(c["choices"][0]["text"]
                                     for c in chunks if c.get("choices")))
                expect_pages += entry_pages(u["prompt_tokens"], 8)
                continue
        print("   stream %d: %r" % (i, r if not isinstance(r, tuple)
                                    else r[4][:300]))
    chk.check(good == n, "32 concurrent streams all complete with 8 tokens "
              "and [DONE] (%d ok, %.1f s)" % (good, took))
    # The same prompts one by one give the same greedy text.
    same = 0
    for i in (0, 7, 31):
        st, j, _ = api.complete(prompt=prompts[i], max_tokens=8,
                                ignore_eos=True)
        same += st == 200 and good == n and \
            j["choices"][0]["text"] == texts[i]
    chk.check(same == 3, "batched greedy output equals the unbatched one")
    api.idle()
    after = api.pages_used()
    if pages_check and before is not None and after is not None:
        # The three repeats replaced their own entries (same sequence).
        chk.check(after - before == expect_pages,
                  "pages grew by exactly the 32 stored entries "
                  "(%s -> %s, expected +%d)" % (before, after, expect_pages))


def t_multiturn(api):
    m0 = api.metrics()
    c0 = du.metric(m0, "tangram_cached_prompt_tokens_total") if m0 else None
    conv = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Tell me about the sea."}]
    st, j, raw = api.chat(conv, max_tokens=6, ignore_eos=True)
    ok = st == 200 and j["usage"]["prompt_tokens_details"]["cached_tokens"] \
        == 0
    chk.check(ok, "multi-turn: first turn has no cached tokens", raw)
    if not ok:
        return
    conv2 = conv + [{"role": "assistant",
                     "content": j["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "And the sky?"}]
    st, j2, raw = api.chat(conv2, max_tokens=6, ignore_eos=True)
    cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"] \
        if st == 200 else -1
    chk.check(cached > 0 and cached < j2["usage"]["prompt_tokens"],
              "multi-turn: second turn reuses %d of %d prompt tokens" %
              (cached, j2["usage"]["prompt_tokens"] if st == 200 else 0), raw)
    m1 = api.metrics()
    c1 = du.metric(m1, "tangram_cached_prompt_tokens_total") if m1 else None
    chk.check(c0 is not None and c1 is not None and c1 - c0 >= cached > 0,
              "tangram_cached_prompt_tokens_total grew by the reuse "
              "(%s -> %s)" % (c0, c1))
    # With X-Session-Id, on a conversation of its own.
    sid = {"X-Session-Id": "conversation-42"}
    conv = [{"role": "user", "content": "Let us count sheep together."}]
    st, j, raw = api.chat(conv, headers=sid, max_tokens=5, ignore_eos=True)
    if not chk.check(st == 200, "X-Session-Id: first turn", raw):
        return
    conv.append({"role": "assistant",
                 "content": j["choices"][0]["message"]["content"]})
    conv.append({"role": "user", "content": "One more."})
    st, j2, raw = api.chat(conv, headers=sid, max_tokens=5, ignore_eos=True)
    cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"] \
        if st == 200 else -1
    chk.check(cached > 0, "X-Session-Id: second turn reuses %d tokens"
              % cached, raw)
    m2 = api.metrics()
    c2 = du.metric(m2, "tangram_cached_prompt_tokens_total") if m2 else None
    chk.check(c2 is not None and c1 is not None and c2 - c1 >= cached > 0,
              "cached-token metric grew with the session turn too")


def t_poison(api):
    """One client's unusable sampling parameters fail only its own request:
    values that pass as doubles but become 0 or infinity as the worker's
    floats are refused with a 400 naming the parameter, while a batch of
    good streams runs on to the end and the multi-turn cache keeps its
    entries."""
    conv = [{"role": "user", "content": "Remember the word lighthouse."}]
    st, j, raw = api.chat(conv, max_tokens=4, ignore_eos=True)
    if not chk.check(st == 200, "poison: first turn of a cached "
                     "conversation", raw):
        return
    conv += [{"role": "assistant",
              "content": j["choices"][0]["message"]["content"]},
             {"role": "user", "content": "Which word?"}]
    n = 8
    results = [None] * n

    def one(i):
        try:
            results[i] = stream(api, "/v1/completions",
                                {"model": MODEL, "prompt": "Good stream %d" % i,
                                 "max_tokens": 24, "temperature": 0.7,
                                 "seed": i, "ignore_eos": True,
                                 "stream": True,
                                 "stream_options": {"include_usage": True}})
        except OSError as e:
            results[i] = e

    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    poisons = [("/v1/completions", {"top_p": 1e-300}, "top_p"),
               ("/v1/completions", {"repetition_penalty": 1e308},
                "repetition_penalty"),
               ("/v1/chat/completions", {"top_p": 1e-46}, "top_p"),
               ("/v1/chat/completions", {"repetition_penalty": 3.5e38},
                "repetition_penalty")]
    for path, extra, param in poisons:
        body = {"model": MODEL, "max_tokens": 8, "stream": True}
        if path.endswith("completions") and "chat" not in path:
            body["prompt"] = "poisoned"
        else:
            body["messages"] = [{"role": "user", "content": "poisoned"}]
        body.update(extra)
        st, _, data = api.post(path, body)
        j = du.json_of(data)
        err = j.get("error") if isinstance(j, dict) else None
        err = err if isinstance(err, dict) else {}
        chk.check(st == 400 and err.get("param") == param and
                  param in err.get("message", ""),
                  "poison %s %s: 400 naming %s" % (path, extra, param), data)
    for t in th:
        t.join(120)
    good = 0
    for r in results:
        if isinstance(r, tuple) and r[0] == 200:
            chunks, done, bad = parse_chunks(r[2])
            u = chunks[-1].get("usage") if chunks else None
            if done and not bad and u and u["completion_tokens"] == 24:
                good += 1
    chk.check(good == n, "poison: all %d good streams ran to the end "
              "(%d ok)" % (n, good))
    st, j2, raw = api.chat(conv, max_tokens=4, ignore_eos=True)
    cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"] \
        if st == 200 else -1
    chk.check(cached > 0, "poison: the multi-turn cache survived (second "
              "turn reuses %d tokens)" % cached, raw)
    failed = [ln for ln in api.d.log_text().splitlines()
              if "step" in ln and "failed" in ln]
    chk.check(not failed, "poison: no step failed in the daemon's log",
              failed[:3])


def t_tokenize(api):
    text = "Hello world, tangram here!"
    st, j, raw = api.post_json("/tokenize", {"model": MODEL, "prompt": text})
    ok = st == 200 and j and isinstance(j.get("tokens"), list) and \
        j.get("count") == len(j["tokens"]) > 0 and \
        j.get("max_model_len") == MAX_LEN
    chk.check(ok, "/tokenize gives tokens, count and max_model_len", raw)
    if not ok:
        return
    st, j2, raw = api.post_json("/detokenize",
                                {"model": MODEL, "tokens": j["tokens"]})
    chk.check(st == 200 and j2 and j2.get("prompt") == text,
              "/detokenize round trip", raw)
    st, j3, raw = api.post_json("/detokenize",
                                {"model": MODEL, "tokens": [-1]})
    chk.check(st == 400 and du.is_openai_error(raw),
              "/detokenize of a bad id -> 400", raw)


def t_metrics(api):
    st, hd, body = du.http("GET", api.d.base_url + "/metrics", headers=AUTH)
    samples, types, problems = du.parse_metrics(body.decode(errors="replace"))
    chk.check(st == 200 and hd.get("content-type", "").startswith(
        "text/plain") and not problems, "/metrics parses as Prometheus text",
        problems[:5])
    need = ["tangram_num_requests_running", "tangram_num_requests_waiting",
            "tangram_kv_cache_usage_perc", "tangram_prompt_tokens_total",
            "tangram_generation_tokens_total",
            "tangram_num_preemptions_total",
            "tangram_kv_pages_reclaimed_ratio"]
    hists = ["tangram_time_to_first_token_seconds",
             "tangram_inter_token_latency_seconds",
             "tangram_e2e_request_latency_seconds",
             "tangram_scheduler_step_seconds"]
    names = {n for n, _ in samples}
    missing = [n for n in need if n not in names]
    missing += [h for h in hists if types.get(h) != "histogram" or
                h + "_count" not in names or h + "_bucket" not in names]
    chk.check(not missing, "/metrics has the DESIGN §5 names", missing)
    chk.check(du.metric(samples, "tangram_kv_pages_used", rank="0")
              is not None and
              du.metric(samples, "tangram_kv_pages_capacity", rank="0"),
              "per-rank page gauges")
    inf = du.metric(samples, "tangram_e2e_request_latency_seconds_bucket",
                    le="+Inf")
    cnt = du.metric(samples, "tangram_e2e_request_latency_seconds_count")
    chk.check(inf is not None and inf == cnt and cnt > 0,
              "histogram +Inf bucket equals its count", (inf, cnt))
    # The steps' wall time holds their host work: the router's (planning,
    # result handling) and the worker's (in flight, outside the backend's
    # calls) are disjoint parts of it, both measured on CLOCK_MONOTONIC.
    wall = du.metric(samples, "tangram_step_seconds_total")
    rh = du.metric(samples, "tangram_step_router_host_seconds_total")
    wh = du.metric(samples, "tangram_step_worker_host_seconds_total")
    chk.check(all(types.get(n) == "counter" for n in (
        "tangram_step_seconds_total", "tangram_step_router_host_seconds_total",
        "tangram_step_worker_host_seconds_total")) and
        None not in (wall, rh, wh) and wall > 0 and rh > 0 and wh > 0 and
        rh + wh <= wall * (1 + 1e-9),
        "step time counters: router %s s + worker %s s of host work within "
        "%s s of steps" % (rh, wh, wall))


def raw_exchange(d, data, shutdown=False, timeout=10):
    """Sends raw bytes on a fresh connection; returns the status code of the
    first response (None when the server closed without one) and its
    text."""
    s = socket.create_connection(("127.0.0.1", d.http_port), timeout=timeout)
    got = b""
    try:
        try:
            s.sendall(data)
            if shutdown:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before reading it all
        while b"\r\n\r\n" not in got:
            try:
                b = s.recv(65536)
            except OSError:
                break
            if not b:
                break
            got += b
        head, _, rest = got.partition(b"\r\n\r\n")
        try:
            status = int(head.split(b" ")[1])
        except (IndexError, ValueError):
            return None, got.decode(errors="replace")
        # Content-Length body
        n = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v)
        while len(rest) < n:
            try:
                b = s.recv(65536)
            except OSError:
                break
            if not b:
                break
            rest += b
        return status, rest.decode(errors="replace")
    finally:
        s.close()


def t_bad_input(api):
    d = api.d
    before = api.pages_used()
    cases = [
        ("malformed JSON", "/v1/completions", b'{"model": "tiny", "prompt":',
         400),
        ("JSON that is not an object", "/v1/completions", b'[1, 2]', 400),
        ("prompt of the wrong type", "/v1/completions",
         {"model": MODEL, "prompt": 5}, 400),
        ("max_tokens of the wrong type", "/v1/completions",
         {"model": MODEL, "prompt": "a", "max_tokens": "ten"}, 400),
        ("negative max_tokens", "/v1/completions",
         {"model": MODEL, "prompt": "a", "max_tokens": -5}, 400),
        ("temperature out of range", "/v1/completions",
         {"model": MODEL, "prompt": "a", "temperature": -1}, 400),
        ("messages of the wrong type", "/v1/chat/completions",
         {"model": MODEL, "messages": "hello"}, 400),
        ("unknown role", "/v1/chat/completions",
         {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
         400),
        ("unknown model", "/v1/completions",
         {"model": "no-such-model", "prompt": "a"}, 404),
        ("prompt longer than the context", "/v1/completions",
         {"model": MODEL, "prompt": "word " * 300}, 400),
        ("prompt + max_tokens over the context", "/v1/completions",
         {"model": MODEL, "prompt": "a b c", "max_tokens": MAX_LEN}, 400),
        ("token id outside the vocabulary", "/v1/completions",
         {"model": MODEL, "prompt": [1, 2, 10 ** 9]}, 400),
        ("empty body", "/v1/completions", b"", 400),
    ]
    for what, path, body, want in cases:
        st, _, raw = api.post(path, body)
        chk.check(st == want and du.is_openai_error(raw),
                  "%s -> %d with the OpenAI error shape" % (what, want),
                  (st, raw[:400]))
    # Over the 8 MiB body limit, announced by Content-Length.
    big = 9 << 20
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (KEY, big)).encode()
    st, text = raw_exchange(d, head + b"{" + b" " * (1 << 20))
    chk.check(st == 413 and du.is_openai_error(text),
              "body over 8 MiB (Content-Length) -> 413", (st, text[:300]))
    # ... and in chunked encoding without a length.
    chunk = b" " * (1 << 20)
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk)
                       for _ in range(9)) + b"0\r\n\r\n"
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n" % KEY).encode()
    st, text = raw_exchange(d, head + chunked)
    chk.check(st == 413 and du.is_openai_error(text),
              "chunked body over 8 MiB -> 413", (st, text[:300]))
    st, _, raw = du.http("GET", d.base_url + "/v1/nothing", headers=AUTH)
    chk.check(st == 404 and du.is_openai_error(raw), "unknown path -> 404",
              (st, raw))
    st, _, raw = du.http("GET", d.base_url + "/v1/completions", headers=AUTH)
    chk.check(st == 405 and du.is_openai_error(raw),
              "wrong method -> 405", (st, raw))
    st, text = raw_exchange(d, b"NONSENSE\r\n\r\n")
    chk.check(st == 400, "a request line that is not HTTP -> 400",
              (st, text[:300]))
    st, text = raw_exchange(d, b"GET /health HTTP/1.1\r\nX-Big: " +
                            b"a" * (256 << 10) + b"\r\n\r\n")
    chk.check(st == 431 or st == 400, "huge header -> 431", (st, text[:200]))
    # Still serving, nothing leaked.
    st, j, raw = api.complete(prompt="still alive?", max_tokens=3)
    chk.check(st == 200 and j["usage"]["completion_tokens"] >= 1,
              "server keeps serving after the bad input", raw)
    api.idle()
    after = api.pages_used()
    if before is not None and after is not None and PROFILE is None:
        chk.check(after - before == entry_pages(j["usage"]["prompt_tokens"],
                                                j["usage"]
                                                ["completion_tokens"]),
                  "bad input took no pages (%s -> %s)" % (before, after))


def t_disconnect(api):
    d = api.d
    before = api.pages_used()
    body = json.dumps({"model": MODEL, "prompt": "Disconnect me",
                       "max_tokens": 100, "ignore_eos": True,
                       "stream": True}).encode()
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (KEY, len(body))).encode()
    s = socket.create_connection(("127.0.0.1", d.http_port), timeout=10)
    s.sendall(head + body)
    got = b""
    while got.count(b"data:") < 2:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    m = api.idle(10)
    chk.check(m is not None, "client disconnect: the request ends (nothing "
              "running)")
    after = api.pages_used()
    chk.check(before is not None and after == before,
              "client disconnect frees the request's pages (%s -> %s)" %
              (before, after))


def t_curl(api):
    d = api.d
    r = subprocess.run(
        ["curl", "-sS", "-w", "\n%{http_code}", d.base_url +
         "/v1/completions", "-H", "Content-Type: application/json",
         "-H", "Authorization: Bearer " + KEY, "-d",
         json.dumps({"model": MODEL, "prompt": "curl says", "max_tokens": 4,
                     "temperature": 0})],
        capture_output=True, text=True, timeout=60)
    body, _, code = r.stdout.rpartition("\n")
    j = du.json_of(body)
    chk.check(r.returncode == 0 and code == "200" and j and
              j["usage"]["completion_tokens"] == 4 or
              (j and j["choices"][0]["finish_reason"] == "stop"),
              "curl: completion", r.stdout + r.stderr)
    r = subprocess.run(
        ["curl", "-sS", "-N", d.base_url + "/v1/chat/completions",
         "-H", "Content-Type: application/json",
         "-H", "Authorization: Bearer " + KEY, "-d",
         json.dumps({"model": MODEL, "stream": True, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "hi"}]})],
        capture_output=True, timeout=60)
    payloads, problems = du.sse_events(r.stdout)
    chunks, done, bad = parse_chunks(payloads)
    chk.check(r.returncode == 0 and done and not bad and not problems and
              chunks[0]["choices"][0]["delta"].get("role") == "assistant",
              "curl -N: SSE chat stream", r.stdout[:600])
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w",
                        "%{http_code}", d.base_url + "/health"],
                       capture_output=True, text=True, timeout=30)
    chk.check(r.stdout == "200", "curl: /health 200", r.stdout + r.stderr)
    r = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}",
                        d.base_url + "/v1/completions", "-d", "{oops"],
                       capture_output=True, text=True, timeout=30)
    body, _, code = r.stdout.rpartition("\n")
    chk.check(code == "401" and du.is_openai_error(body),
              "curl without key: 401", r.stdout)


def t_node(api):
    root, why = du.node_clients(["openai_client.mjs"])
    if root is None:
        chk.missing("OpenAI Node client checks", why)
        return
    env = dict(os.environ, OPENAI_API_KEY=KEY)
    r = subprocess.run(["node", os.path.join(root, "openai_client.mjs"),
                        api.d.base_url + "/v1", MODEL], capture_output=True,
                       text=True, timeout=120, env=env, cwd=root)
    j = du.json_of(r.stdout.strip().splitlines()[-1] if r.stdout.strip()
                   else "")
    if not chk.check(r.returncode == 0 and isinstance(j, dict),
                     "OpenAI Node client ran every call",
                     r.stdout[-800:] + r.stderr[-800:]):
        return
    c, cs, ch, chs = (j["completion"], j["completion_stream"], j["chat"],
                      j["chat_stream"])
    chk.check(c["object"] == "text_completion" and
              c["usage"]["completion_tokens"] >= 1,
              "node: completions.create", c)
    chk.check(cs["finish_reason"] == c["finish_reason"] and
              cs["text"] == c["text"] and cs["usage_chunks"] == 1 and
              cs["usage"]["completion_tokens"] ==
              c["usage"]["completion_tokens"],
              "node: streamed completion equals the non-streamed one, usage "
              "chunk", (c, cs))
    chk.check(ch["object"] == "chat.completion" and
              ch["role"] == "assistant" and isinstance(ch["text"], str),
              "node: chat.completions.create", ch)
    chk.check(chs["first_role"] == "assistant" and
              chs["text"] == ch["text"] and chs["usage_chunks"] == 1 and
              chs["objects"] == ["chat.completion.chunk"],
              "node: streamed chat equals the non-streamed one, role first, "
              "usage chunk", (ch, chs))
    chk.check(j["models"] == [MODEL], "node: models.list", j["models"])
    chk.check(j.get("model") == {"id": MODEL, "object": "model",
                                 "owned_by": "tangram"},
              "node: models.retrieve of the served model", j.get("model"))
    mm = j.get("model_missing") or {}
    chk.check(mm.get("threw") and mm.get("status") == 404 and
              mm.get("not_found") and mm.get("code") == "model_not_found",
              "node: models.retrieve of another id raises NotFoundError "
              "(404 model_not_found)", mm)
    chk.check(j["bad_key"].get("threw") and j["bad_key"]["status"] == 401
              and j["bad_key"]["auth_error"],
              "node: wrong key raises AuthenticationError (401)",
              j["bad_key"])


def main():
    missing = du.missing_inputs(tools=["curl", "node", "npm"])
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdhttp")
    d = None
    try:
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, work, ["--max-model-len", str(MAX_LEN),
                                    "--page-size", str(PAGE)],
                      api_key=KEY, profile=PROFILE)
        ready = d.start()
        chk.check(ready, "tangramd starts and /health turns 200",
                  d.log_text()[-3000:])
        if ready:
            api = Api(d)
            t_basic(api)
            t_completion(api)
            t_chat(api)
            t_seed(api)
            t_logprobs(api)
            t_stop(api)
            t_ignore_eos(api)
            t_tokenize(api)
            t_multiturn(api)
            t_concurrent(api, PROFILE is None)
            t_poison(api)
            t_bad_input(api)
            t_disconnect(api)
            t_curl(api)
            t_node(api)
            t_metrics(api)
            m = api.idle(10)
            chk.check(m is not None, "at the end nothing runs or waits")
            if m is not None:
                used = du.metric(m, "tangram_kv_pages_used", rank="0")
                # Only the multi-turn cache holds pages now: a positive
                # count well below the pool (see the module docstring).
                total = du.metric(m, "tangram_kv_pages_capacity", rank="0")
                chk.check(used is not None and 0 < used < total,
                          "pages in use at the end are the cache's only "
                          "(%s of %s)" % (used, total))
            chk.check(d.proc.poll() is None and not
                      [ln for ln in d.log_text().splitlines()
                       if "restarting" in ln],
                      "no process died during the test")
    finally:
        if d is not None:
            rc, left = d.stop()
            chk.check(rc == 0, "tangramd exits 0 on SIGTERM (rc %s)" % rc)
            chk.check(not left, "no router/worker survives tangramd (%s)" %
                      left)
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
