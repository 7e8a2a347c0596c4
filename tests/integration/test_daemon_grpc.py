#!/usr/bin/python3
"""Integration test of the real tangramd over gRPC (tangram.v1.Generation and
grpc.health.v1.Health), driven by Debian's python3-grpcio.

The Python message classes are generated at test time by `protoc
--python_out` from proto/tangram.proto and proto/health.proto (Debian
packages protobuf-compiler and python3-protobuf); calls go through grpcio's
generic multi-callables, so no grpc_tools plugin is needed.

The daemon runs with --max-num-seqs 1 --max-queued 1 and an API key, so that
a long request plus a queued one fill it (RESOURCE_EXHAUSTED for the next).

Checked: Health/Check SERVING (open without the key), NOT_FOUND for an
unknown service; ModelInfo; Tokenize equals the HTTP /tokenize (also for a
chat with tools, a tool call and its result; Generate with tools; bad tool
parameters and a tool_choice naming no tool -> INVALID_ARGUMENT); Generate
streams tokens and text with finish_reason 0 until the last message, which
carries LENGTH and the usage; greedy Generate equals the HTTP completion of
the same prompt ids; logprobs; stop strings; a second turn by session_id
reuses KV (cached_prompt_tokens > 0), the x-session-id metadata refused
empty or given twice; Abort of a running long request
(found=true, its stream ends CANCELLED, its pages are freed); Abort of an
unknown id (found=false); a second request with a running request's id
(ALREADY_EXISTS); client cancellation frees the pages; garbage
protobuf bytes -> INVALID_ARGUMENT; missing/bad key -> UNAUTHENTICATED;
temperature 5 -> INVALID_ARGUMENT (and other bad requests); queue full ->
RESOURCE_EXHAUSTED; the hardening: a caller without the key is refused from
its headers while its body is still held back (and counted in /metrics),
server reflection needs the key too while health does not, request_id is
stored whole up to 256 bytes (duplicate check, Abort and the responses use
all of it) and longer ones are refused, as are over-long session ids,
unknown chat roles in Tokenize, stop_token_ids outside the vocabulary or
too many of them, stop strings over the HTTP API's byte limit (seed
2^64 - 1 and a schema's integer beyond 64 bits are served), and messages
over --grpc-max-message (counted); and at the end nothing runs or waits and
the pages in use are the multi-turn cache's (the page accounting of
test_daemon_http.py: aborted and cancelled requests add nothing). Fails,
naming it, when the daemon, grpcio, protobuf or protoc is missing. About
20 s on 2 cores. The key-less daemon's checks (reflection used to call
Generate, Watch through a drain, deadlines, receive timeouts, Abort scoped
to the connection) are in test_daemon_grpc_ops.py.
"""
import importlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

KEY = "grpc-test-key"
AUTH_MD = (("authorization", "Bearer " + KEY),)
AUTH_HTTP = {"Authorization": "Bearer " + KEY}
MODEL = "tiny"
GEN = "/tangram.v1.Generation/"

chk = du.Checker()
PROFILE = os.environ.get("TANGRAM_TEST_PROFILE") or None


def load_protos(out_dir):
    """Generates and imports tangram_pb2 and health_pb2; returns them or
    (None, why)."""
    proto_dir = os.path.join(du.SOURCE or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", ".."), "proto")
    r = subprocess.run(["protoc", "-I", proto_dir, "--python_out=" + out_dir,
                        "tangram.proto", "health.proto"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return None, "protoc failed: " + r.stderr
    sys.path.insert(0, out_dir)
    return (importlib.import_module("tangram_pb2"),
            importlib.import_module("health_pb2")), None


class Client:
    """Generic grpcio stubs for the tangram and health services."""

    def __init__(self, grpc, pb, hpb, target):
        self.grpc, self.pb, self.hpb = grpc, pb, hpb
        self.ch = grpc.insecure_channel(target)
        ser = lambda m: m.SerializeToString()  # noqa: E731
        self.generate = self.ch.unary_stream(
            GEN + "Generate", request_serializer=ser,
            response_deserializer=pb.GenerateResponse.FromString)
        self.tokenize = self.ch.unary_unary(
            GEN + "Tokenize", request_serializer=ser,
            response_deserializer=pb.TokenizeResponse.FromString)
        self.model_info = self.ch.unary_unary(
            GEN + "ModelInfo", request_serializer=ser,
            response_deserializer=pb.ModelInfoResponse.FromString)
        self.abort = self.ch.unary_unary(
            GEN + "Abort", request_serializer=ser,
            response_deserializer=pb.AbortResponse.FromString)
        self.check = self.ch.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=ser,
            response_deserializer=hpb.HealthCheckResponse.FromString)
        # Raw bytes in and out, for garbage input.
        self.raw_generate = self.ch.unary_stream(GEN + "Generate")
        self.raw_tokenize = self.ch.unary_unary(GEN + "Tokenize")

    def gen(self, timeout=60, md=AUTH_MD, **kw):
        """Runs a Generate to its end; returns (messages, status code,
        details)."""
        sampling = kw.pop("sampling", None)
        req = self.pb.GenerateRequest(**kw)
        if sampling is not None:
            req.sampling.CopyFrom(self.pb.SamplingParams(**sampling))
        msgs = []
        try:
            for m in self.generate(req, metadata=md, timeout=timeout):
                msgs.append(m)
            return msgs, self.grpc.StatusCode.OK, ""
        except self.grpc.RpcError as e:
            return msgs, e.code(), e.details()


def code_of(grpc, fn, *a, **kw):
    """Status code of a unary call (OK when it returns), and the reply."""
    try:
        return grpc.StatusCode.OK, fn(*a, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()


def joined(msgs):
    ids, text = [], ""
    for m in msgs:
        ids.extend(m.token_ids)
        text += m.text
    return ids, text


class Http:
    def __init__(self, d):
        self.d = d

    def post(self, path, body):
        st, _, data = du.http("POST", self.d.base_url + path, body, AUTH_HTTP)
        return st, du.json_of(data)

    def metrics(self):
        return du.fetch_metrics(self.d.base_url, AUTH_HTTP)

    def idle(self, timeout=10):
        def quiet():
            m = self.metrics()
            if m and du.metric(m, "tangram_num_requests_running") == 0 and \
                    du.metric(m, "tangram_num_requests_waiting") == 0:
                return m
            return None
        return du.wait_for(quiet, timeout, 0.05)

    def pages(self):
        m = self.idle()
        return None if m is None else du.metric(m, "tangram_kv_pages_used",
                                                rank="0")


def t_health_info(c, grpc, http):
    code, r = code_of(grpc, c.check, c.hpb.HealthCheckRequest(), timeout=10)
    chk.check(code == grpc.StatusCode.OK and
              r.status == c.hpb.HealthCheckResponse.SERVING,
              "Health/Check '' SERVING without a key", (code, r))
    code, r = code_of(grpc, c.check, c.hpb.HealthCheckRequest(
        service="tangram.v1.Generation"), timeout=10)
    chk.check(code == grpc.StatusCode.OK and
              r.status == c.hpb.HealthCheckResponse.SERVING,
              "Health/Check tangram.v1.Generation SERVING", (code, r))
    code, r = code_of(grpc, c.check, c.hpb.HealthCheckRequest(
        service="no.such.Service"), timeout=10)
    chk.check(code == grpc.StatusCode.NOT_FOUND,
              "Health/Check of an unknown service -> NOT_FOUND", (code, r))
    code, r = code_of(grpc, c.model_info, c.pb.ModelInfoRequest(),
                      metadata=AUTH_MD, timeout=10)
    chk.check(code == grpc.StatusCode.OK and r.model == MODEL and
              r.num_layers == 2 and r.num_kv_heads == 2 and
              r.head_dim == 16 and r.page_size == 16 and
              r.heads_per_group == 2 and r.tensor_parallel == 1 and
              r.backend == "cpu" and r.vocab_size > 150000 and
              r.max_model_len > 0 and
              (r.profile == "none" if PROFILE is None else r.profile != ""),
              "ModelInfo describes the model and layout", (code, r))
    text = "Hello world, this is gRPC."
    code, r = code_of(grpc, c.tokenize, c.pb.TokenizeRequest(text=text),
                      metadata=AUTH_MD, timeout=10)
    st, j = http.post("/tokenize", {"model": MODEL, "prompt": text})
    chk.check(code == grpc.StatusCode.OK and st == 200 and
              list(r.token_ids) == j["tokens"] and r.count == j["count"],
              "Tokenize equals HTTP /tokenize", (code, r, j))
    code, r = code_of(grpc, c.tokenize, c.pb.TokenizeRequest(
        messages=[c.pb.ChatMessage(role="user", content="hi")]),
        metadata=AUTH_MD, timeout=10)
    chk.check(code == grpc.StatusCode.OK and r.count > 3,
              "Tokenize of a chat renders the template", (code, r))
    t_tools(c, grpc, http)


def t_tools(c, grpc, http):
    """Tool use over gRPC renders exactly what the HTTP API renders."""
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = c.pb.Tool(name="get_weather", description="Weather of a city.",
                     parameters_json=json.dumps(params))
    msgs = [c.pb.ChatMessage(role="user", content="Weather in Paris?"),
            c.pb.ChatMessage(role="assistant", tool_calls=[c.pb.ToolCall(
                id="call_1", name="get_weather",
                arguments="{\"city\": \"Paris\"}")]),
            c.pb.ChatMessage(role="tool", tool_call_id="call_1",
                             content="21 C")]
    code, r = code_of(grpc, c.tokenize, c.pb.TokenizeRequest(
        messages=msgs, tools=[tool]), metadata=AUTH_MD, timeout=10)
    st, j = http.post("/tokenize", {"model": MODEL, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city.",
            "parameters": params}}]})
    chk.check(code == grpc.StatusCode.OK and st == 200 and
              list(r.token_ids) == j["tokens"],
              "Tokenize of a chat with tools and tool calls equals HTTP",
              (code, r, j))
    gm, code, det = c.gen(messages=msgs, tools=[tool], tool_choice="auto",
                          sampling={"max_tokens": 6, "temperature": 0})
    chk.check(code == grpc.StatusCode.OK and gm and
              gm[-1].finish_reason in (c.pb.FINISH_REASON_STOP,
                                       c.pb.FINISH_REASON_LENGTH,
                                       c.pb.FINISH_REASON_TOOL_CALLS) and
              all(tc.id.startswith("call_") and json.loads(tc.arguments)
                  is not None for m in gm for tc in m.tool_calls),
              "Generate of a chat with tools", (code, det, gm[-1:]))
    gm, code, det = c.gen(messages=msgs[:1], tools=[c.pb.Tool(
        name="f", parameters_json="{not json")])
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and
              "parameters_json" in det,
              "a tool with bad parameters_json -> INVALID_ARGUMENT", det)
    gm, code, det = c.gen(messages=msgs[:1], tools=[tool],
                          tool_choice="not_a_tool")
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and
              "not_a_tool" in det,
              "tool_choice naming no tool -> INVALID_ARGUMENT", det)
    gm, code, det = c.gen(prompt="x", tools=[tool])
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT,
              "tools on a text prompt -> INVALID_ARGUMENT", det)


def t_generate(c, grpc, http):
    st, j = http.post("/tokenize", {"model": MODEL,
                                    "prompt": "The weather today is"})
    ids = j["tokens"] if st == 200 else [1, 2, 3]
    msgs, code, det = c.gen(prompt_token_ids=ids,
                            sampling={"max_tokens": 8, "temperature": 0,
                                      "ignore_eos": True})
    ok = code == grpc.StatusCode.OK and len(msgs) >= 2
    chk.check(ok, "Generate streams several messages (%d)" % len(msgs),
              (code, det))
    if not ok:
        return
    out_ids, text = joined(msgs)
    last = msgs[-1]
    chk.check(all(m.finish_reason == 0 and not m.HasField("usage")
                  for m in msgs[:-1]) and
              last.finish_reason == c.pb.FINISH_REASON_LENGTH,
              "finish_reason 0 while streaming, LENGTH at the end",
              [m.finish_reason for m in msgs])
    chk.check(last.HasField("usage") and
              last.usage.prompt_tokens == len(ids) and
              last.usage.completion_tokens == 8 and len(out_ids) == 8,
              "final usage: prompt and 8 completion tokens", last)
    chk.check(all(m.request_id for m in msgs) and
              len({m.request_id for m in msgs}) == 1,
              "every message carries the request id")
    st, hj = http.post("/v1/completions", {
        "model": MODEL, "prompt": ids, "max_tokens": 8, "temperature": 0,
        "ignore_eos": True})
    chk.check(st == 200 and hj["choices"][0]["text"] == text,
              "greedy Generate equals the HTTP completion of the same ids",
              (text, hj))
    st, dj = http.post("/detokenize", {"model": MODEL, "tokens": out_ids})
    chk.check(st == 200 and dj["prompt"] == text,
              "streamed token_ids detokenize to the streamed text",
              (dj, text))
    # Text prompt, logprobs, client request id.
    msgs, code, det = c.gen(prompt="Hello", request_id="lp-1",
                            sampling={"max_tokens": 4, "temperature": 0,
                                      "logprobs": 2, "ignore_eos": True})
    lps = [lp for m in msgs for lp in m.logprobs]
    out_ids, _ = joined(msgs)
    chk.check(code == grpc.StatusCode.OK and len(lps) == 4 and
              [lp.token_id for lp in lps] == out_ids and
              all(lp.logprob <= 0 and 1 <= len(lp.top) <= 2 and
                  abs(lp.top[0].logprob - lp.logprob) < 1e-4 for lp in lps)
              and msgs[-1].request_id == "lp-1",
              "logprobs: one per token, 2 alternatives, greedy is the top",
              (code, det, lps))
    # Stop string taken from a greedy output.
    msgs, code, _ = c.gen(prompt="Stop here please", sampling={
        "max_tokens": 12, "temperature": 0, "ignore_eos": True})
    _, full = joined(msgs)
    k = next((i for i in range(2, len(full) - 2)
              if full[i:i + 2].isascii() and full[i:i + 2].strip() ==
              full[i:i + 2] and full[i:i + 2].isprintable() and
              full.find(full[i:i + 2]) == i), None)
    # The model and seed are fixed, so the output always has such a pair.
    if chk.check(k is not None, "gRPC stop string: an ASCII pair to stop on",
                 full):
        s = full[k:k + 2]
        msgs, code, _ = c.gen(prompt="Stop here please", sampling={
            "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "stop": [s]})
        _, cut = joined(msgs)
        chk.check(code == grpc.StatusCode.OK and cut == full[:k] and
                  msgs[-1].finish_reason == c.pb.FINISH_REASON_STOP,
                  "stop string %r cuts the output, finish STOP" % s,
                  (full, cut))
    # Seeds at temperature 1.
    def sample(seed):
        m, _, _ = c.gen(prompt="Random", sampling={
            "max_tokens": 6, "temperature": 1.0, "seed": seed,
            "ignore_eos": True})
        return joined(m)[0]
    a, b, d = sample(7), sample(7), sample(8)
    chk.check(len(a) == 6 and a == b and a != d,
              "seed: same seed same tokens, other seed other tokens",
              (a, b, d))


def t_session(c, grpc, http):
    m0 = http.metrics()
    msgs, code, _ = c.gen(session_id="grpc-conv", messages=[
        c.pb.ChatMessage(role="user", content="Tell me a story.")],
        sampling={"max_tokens": 5, "temperature": 0, "ignore_eos": True})
    _, reply = joined(msgs)
    ok = code == grpc.StatusCode.OK and \
        msgs[-1].usage.cached_prompt_tokens == 0
    chk.check(ok, "chat Generate, first turn", code)
    msgs, code, _ = c.gen(session_id="grpc-conv", messages=[
        c.pb.ChatMessage(role="user", content="Tell me a story."),
        c.pb.ChatMessage(role="assistant", content=reply),
        c.pb.ChatMessage(role="user", content="Go on.")],
        sampling={"max_tokens": 5, "temperature": 0, "ignore_eos": True})
    u = msgs[-1].usage if msgs else None
    chk.check(ok and code == grpc.StatusCode.OK and
              0 < u.cached_prompt_tokens < u.prompt_tokens,
              "session_id second turn reuses KV (cached %s of %s)" %
              (u and u.cached_prompt_tokens, u and u.prompt_tokens))
    m1 = http.metrics()
    a = du.metric(m0, "tangram_cached_prompt_tokens_total") if m0 else None
    b = du.metric(m1, "tangram_cached_prompt_tokens_total") if m1 else None
    chk.check(a is not None and b is not None and u is not None and
              b - a >= u.cached_prompt_tokens > 0,
              "tangram_cached_prompt_tokens_total grew (%s -> %s)" % (a, b))

    # The x-session-id metadata (the HTTP header's equivalent) is refused
    # empty or given twice, even beside session_id; session_id "" is
    # proto3's unset.
    for what, md, kw in (
            ("empty x-session-id metadata", (("x-session-id", ""),), {}),
            ("x-session-id metadata given twice",
             (("x-session-id", "a"), ("x-session-id", "b")), {}),
            ("x-session-id given twice beside session_id",
             (("x-session-id", "a"), ("x-session-id", "a")),
             {"session_id": "c"})):
        msgs, code, det = c.gen(prompt="a", sampling={"max_tokens": 2},
                                md=AUTH_MD + md, **kw)
        chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and not msgs and
                  "x-session-id" in det,
                  "%s -> INVALID_ARGUMENT naming it (%s: %s)" %
                  (what, code, det))
    msgs, code, _ = c.gen(prompt="a", sampling={"max_tokens": 2},
                          md=AUTH_MD + (("x-session-id", "grpc-md"),))
    chk.check(code == grpc.StatusCode.OK,
              "one x-session-id metadata is served (%s)" % code)


class Background:
    """A Generate running in a thread, with its first message awaited."""

    def __init__(self, c, **kw):
        self.c, self.kw = c, kw
        self.msgs, self.code, self.det = [], None, None
        self.first = threading.Event()
        self.call = None
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        grpc = self.c.grpc
        sampling = self.kw.pop("sampling")
        req = self.c.pb.GenerateRequest(**self.kw)
        req.sampling.CopyFrom(self.c.pb.SamplingParams(**sampling))
        self.call = self.c.generate(req, metadata=AUTH_MD, timeout=120)
        try:
            for m in self.call:
                self.msgs.append(m)
                self.first.set()
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code, self.det = e.code(), e.details()
        self.first.set()

    def join(self, timeout=30):
        self.t.join(timeout)
        return not self.t.is_alive()


LONG = {"max_tokens": 3000, "temperature": 0.7, "seed": 1,
        "ignore_eos": True}


def t_abort(c, grpc, http):
    before = http.pages()
    bg = Background(c, prompt="A very long story", request_id="long-1",
                    sampling=dict(LONG))
    bg.first.wait(30)
    chk.check(len(bg.msgs) >= 1, "long request streams")
    _, code, det = c.gen(prompt="same id", request_id="long-1",
                         sampling={"max_tokens": 2})
    chk.check(code == grpc.StatusCode.ALREADY_EXISTS,
              "a second Generate with a running request's id -> "
              "ALREADY_EXISTS (%s: %s)" % (code, det))
    code, r = code_of(grpc, c.abort, c.pb.AbortRequest(request_id="long-1"),
                      metadata=AUTH_MD, timeout=10)
    chk.check(code == grpc.StatusCode.OK and r.found,
              "Abort of the running request: found=true", (code, r))
    ended = bg.join(20)
    chk.check(ended and bg.code == grpc.StatusCode.CANCELLED,
              "the aborted stream ends with CANCELLED (%s, %s)" %
              (bg.code, bg.det))
    n = sum(len(m.token_ids) for m in bg.msgs)
    chk.check(n < 3000, "the aborted stream stopped early (%d tokens)" % n)
    code, r = code_of(grpc, c.abort, c.pb.AbortRequest(request_id="long-1"),
                      metadata=AUTH_MD, timeout=10)
    chk.check(code == grpc.StatusCode.OK and not r.found,
              "Abort again (or of an unknown id): found=false", (code, r))
    after = http.pages()
    chk.check(before is not None and after == before,
              "the aborted request's pages are freed (%s -> %s)" %
              (before, after))
    # Client-side cancellation.
    bg = Background(c, prompt="Cancel me", sampling=dict(LONG))
    bg.first.wait(30)
    bg.call.cancel()
    bg.join(20)
    chk.check(bg.code == grpc.StatusCode.CANCELLED and
              http.idle(10) is not None,
              "client cancel: the request ends on the server (%s)" % bg.code)
    after2 = http.pages()
    chk.check(after2 == before, "client cancel frees the pages (%s -> %s)"
              % (before, after2))


def t_queue_full(c, grpc, http):
    before = http.pages()
    a = Background(c, prompt="first", request_id="q-a", sampling=dict(LONG))
    a.first.wait(30)
    b = Background(c, prompt="second", request_id="q-b", sampling=dict(LONG))
    waiting = du.wait_for(lambda: (du.metric(http.metrics() or {},
                                             "tangram_num_requests_waiting")
                                   or 0) >= 1, 10)
    chk.check(waiting, "second request waits behind --max-num-seqs 1")
    msgs, code, det = c.gen(prompt="third", sampling={"max_tokens": 2})
    chk.check(code == grpc.StatusCode.RESOURCE_EXHAUSTED,
              "queue full (--max-queued 1) -> RESOURCE_EXHAUSTED (%s: %s)" %
              (code, det))
    st, _, raw = du.http("POST", http.d.base_url + "/v1/completions",
                         {"model": MODEL, "prompt": "x", "max_tokens": 2},
                         AUTH_HTTP)
    chk.check(st == 429 and du.is_openai_error(raw),
              "queue full over HTTP -> 429 in the OpenAI shape", (st, raw))
    for rid in ("q-b", "q-a"):
        code, r = code_of(grpc, c.abort, c.pb.AbortRequest(request_id=rid),
                          metadata=AUTH_MD, timeout=10)
        chk.check(code == grpc.StatusCode.OK and r.found,
                  "Abort %s (%s) found" % (rid, "waiting" if rid == "q-b"
                                           else "running"), (code, r))
    a.join(20)
    b.join(20)
    chk.check(a.code == grpc.StatusCode.CANCELLED and
              b.code == grpc.StatusCode.CANCELLED,
              "both aborted streams end CANCELLED (%s, %s)" % (a.code, b.code))
    after = http.pages()
    chk.check(after == before, "no pages left by the queue test (%s -> %s)"
              % (before, after))
    msgs, code, _ = c.gen(prompt="after the queue", sampling={
        "max_tokens": 2, "ignore_eos": True})
    chk.check(code == grpc.StatusCode.OK and
              msgs[-1].usage.completion_tokens == 2,
              "serving again after the queue drained")


def t_bad(c, grpc, http):
    before = http.pages()
    for what, data in (("garbage bytes", b"\xff\xff\xff\xff\x0f"),
                       ("truncated field", b"\x12\x40abc"),
                       ("wrong wire type", b"\x1a\x05\x08")):
        try:
            list(c.raw_generate(data, metadata=AUTH_MD, timeout=10))
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
        chk.check(code == grpc.StatusCode.INVALID_ARGUMENT,
                  "Generate with %s -> INVALID_ARGUMENT (%s)" % (what, code))
    # Strings that are not UTF-8 (protobuf-c does not check them) are the
    # client's error, named, not an internal one: a placeholder of the same
    # length is swapped for bad bytes in a valid encoding.
    tool = c.pb.Tool(name="f", description="QQ", parameters_json="{}")
    for what, req in (
            ("message content", c.pb.GenerateRequest(messages=[
                c.pb.ChatMessage(role="user", content="QQ")])),
            ("tool description", c.pb.GenerateRequest(messages=[
                c.pb.ChatMessage(role="user", content="hi")], tools=[tool]))):
        data = req.SerializeToString().replace(b"QQ", b"\xff\xfe")
        try:
            list(c.raw_generate(data, metadata=AUTH_MD, timeout=10))
            code, det = grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            code, det = e.code(), e.details()
        chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in det,
                  "Generate with a %s that is not UTF-8 -> INVALID_ARGUMENT "
                  "naming it (%s: %s)" % (what, code, det))
    code, _ = code_of(grpc, c.raw_tokenize, b"\xff\xff\xff",
                      metadata=AUTH_MD, timeout=10)
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT,
              "Tokenize with garbage bytes -> INVALID_ARGUMENT (%s)" % code)
    for what, md in (("missing", ()),
                     ("wrong", (("authorization", "Bearer nope"),))):
        _, code, _ = c.gen(md=md, prompt="hi", sampling={"max_tokens": 2})
        chk.check(code == grpc.StatusCode.UNAUTHENTICATED,
                  "Generate with a %s key -> UNAUTHENTICATED (%s)" %
                  (what, code))
    code, _ = code_of(grpc, c.model_info, c.pb.ModelInfoRequest(),
                      metadata=(("authorization", "Bearer nope"),),
                      timeout=10)
    chk.check(code == grpc.StatusCode.UNAUTHENTICATED,
              "ModelInfo with a wrong key -> UNAUTHENTICATED")
    cases = [
        ("temperature 5", dict(prompt="a", sampling={"temperature": 5})),
        ("top_p 0", dict(prompt="a", sampling={"top_p": 0})),
        ("logprobs 50", dict(prompt="a", sampling={"logprobs": 50})),
        ("no prompt", dict(sampling={"max_tokens": 2})),
        ("two prompt forms", dict(prompt="a", prompt_token_ids=[1])),
        ("token id outside the vocabulary",
         dict(prompt_token_ids=[1, 1000000])),
        ("token id past int32", dict(prompt_token_ids=[1, 4000000000])),
        ("unknown chat role",
         dict(messages=[c.pb.ChatMessage(role="wizard", content="x")])),
        ("max_tokens 0", dict(prompt="a", sampling={"max_tokens": 0})),
        ("over the context",
         dict(prompt="a", sampling={"max_tokens": 10 ** 9})),
    ]
    for what, kw in cases:
        msgs, code, det = c.gen(**kw)
        chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and not msgs and
                  det, "%s -> INVALID_ARGUMENT with a message (%s: %s)" %
                  (what, code, det))
    msgs, code, _ = c.gen(prompt="still fine", sampling={
        "max_tokens": 3, "ignore_eos": True})
    chk.check(code == grpc.StatusCode.OK and
              msgs[-1].usage.completion_tokens == 3,
              "still serving after the bad input")
    after = http.pages()
    if before is not None and after is not None and PROFILE is None:
        n = msgs[-1].usage.prompt_tokens + 3 - 1 if msgs else 0
        chk.check(after - before == 2 * -(-n // 16),
                  "bad input took no pages (%s -> %s)" % (before, after))


def t_limits(c, grpc, http):
    """The hardening of the gRPC front end, with the key configured."""
    m0 = http.metrics() or {}
    ev = threading.Event()

    def held():
        ev.wait(30)
        yield c.pb.TokenizeRequest(text="never sent").SerializeToString()
    call = c.ch.stream_unary(GEN + "Tokenize")
    code, det = code_of(grpc, call, held(), timeout=20)
    ev.set()
    chk.check(code == grpc.StatusCode.UNAUTHENTICATED,
              "no key: refused from the headers while the body is held back "
              "(%s: %s)" % (code, det))
    m1 = http.metrics() or {}
    chk.check((du.metric(m1, "tangram_grpc_unauthenticated_total") or 0) >
              (du.metric(m0, "tangram_grpc_unauthenticated_total") or 0),
              "tangram_grpc_unauthenticated_total counts it")
    refl = c.ch.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo")
    code, _ = code_of(grpc, lambda: list(refl(iter([b"\x3a\x00"]),
                                              timeout=10)))
    chk.check(code == grpc.StatusCode.UNAUTHENTICATED,
              "reflection without the key -> UNAUTHENTICATED (%s)" % code)
    code, got = code_of(grpc, lambda: list(refl(iter([b"\x3a\x00"]),
                                                metadata=AUTH_MD,
                                                timeout=10)))
    chk.check(code == grpc.StatusCode.OK and len(got) == 1,
              "reflection with the key answers (%s)" % code)

    # request_id: stored whole up to 256 bytes, refused beyond.
    long_id = "r" * 200
    bg = Background(c, prompt="A long id", request_id=long_id,
                    sampling=dict(LONG))
    bg.first.wait(30)
    chk.check(bg.msgs and bg.msgs[0].request_id == long_id,
              "a 200-byte request_id comes back whole")
    _, code, _ = c.gen(prompt="same id", request_id=long_id,
                       sampling={"max_tokens": 2})
    chk.check(code == grpc.StatusCode.ALREADY_EXISTS,
              "the same 200-byte id again -> ALREADY_EXISTS (%s)" % code)
    # Another id sharing its first 63 bytes is another request (queued
    # behind the first with --max-num-seqs 1).
    other = long_id[:63] + "x"
    bg2 = Background(c, prompt="Another long id", request_id=other,
                     sampling=dict(LONG))
    waiting = du.wait_for(lambda: (du.metric(http.metrics() or {},
                                             "tangram_num_requests_waiting")
                                   or 0) >= 1, 10)
    chk.check(waiting and bg2.code is None,
              "a 64-byte id sharing the first 63 bytes is accepted (%s)" %
              bg2.code)
    code, r = code_of(grpc, c.abort, c.pb.AbortRequest(
        request_id=long_id[:63]), metadata=AUTH_MD, timeout=10)
    chk.check(code == grpc.StatusCode.OK and not r.found,
              "Abort by a 63-byte prefix of the ids: found=false", (code, r))
    for rid, what in ((other, "the 64-byte id"), (long_id, "the 200-byte id")):
        code, r = code_of(grpc, c.abort, c.pb.AbortRequest(request_id=rid),
                          metadata=AUTH_MD, timeout=10)
        chk.check(code == grpc.StatusCode.OK and r.found,
                  "Abort by %s: found=true" % what, (code, r))
    bg.join(20)
    bg2.join(20)
    chk.check(bg.code == grpc.StatusCode.CANCELLED and
              bg2.code == grpc.StatusCode.CANCELLED,
              "both long-id streams end CANCELLED (%s, %s)" %
              (bg.code, bg2.code))
    for what, kw in (("request_id of 257 bytes", dict(request_id="x" * 257)),
                     ("session_id of 257 bytes", dict(session_id="s" * 257))):
        msgs, code, det = c.gen(prompt="a", sampling={"max_tokens": 2}, **kw)
        chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and not msgs and
                  "256" in det, "%s -> INVALID_ARGUMENT (%s: %s)" %
                  (what, code, det))
    code, det = code_of(grpc, c.abort, c.pb.AbortRequest(
        request_id="x" * 257), metadata=AUTH_MD, timeout=10)
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT,
              "Abort with a 257-byte id -> INVALID_ARGUMENT (%s)" % code)

    # Tokenize takes the roles Generate and HTTP take.
    for role in ("wizard", ""):
        code, det = code_of(grpc, c.tokenize, c.pb.TokenizeRequest(
            messages=[c.pb.ChatMessage(role=role, content="x")]),
            metadata=AUTH_MD, timeout=10)
        chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and "role" in det,
                  "Tokenize with role %r -> INVALID_ARGUMENT (%s: %s)" %
                  (role, code, det))
    toks = {}
    for role in ("developer", "system"):
        code, r = code_of(grpc, c.tokenize, c.pb.TokenizeRequest(messages=[
            c.pb.ChatMessage(role=role, content="Be brief."),
            c.pb.ChatMessage(role="user", content="hi")]),
            metadata=AUTH_MD, timeout=10)
        toks[role] = list(r.token_ids) if code == grpc.StatusCode.OK else code
    chk.check(toks["developer"] == toks["system"] and
              isinstance(toks["system"], list),
              "Tokenize: developer renders as system, as over HTTP", toks)

    # Sampling limits: those of the HTTP API (rt_openai.h).
    code, info = code_of(grpc, c.model_info, c.pb.ModelInfoRequest(),
                         metadata=AUTH_MD, timeout=10)
    vocab = info.vocab_size if code == grpc.StatusCode.OK else 151669
    cases = [
        ("a stop token id outside the vocabulary",
         {"stop_token_ids": [vocab]}),
        ("257 stop token ids", {"stop_token_ids": [1] * 257}),
        ("a 1 MB stop string", {"stop": ["s" * (1 << 20)]}),
        ("a stop string of 1025 bytes", {"stop": ["s" * 1025]}),
        ("17 stop strings", {"stop": ["a%d" % i for i in range(17)]}),
    ]
    for what, sp in cases:
        sp = dict(sp, max_tokens=2)
        msgs, code, det = c.gen(prompt="a", sampling=sp)
        chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and not msgs and
                  det, "%s -> INVALID_ARGUMENT (%s: %s)" % (what, code,
                                                              det[:80]))
    msgs, code, _ = c.gen(prompt="a", sampling={
        "max_tokens": 2, "ignore_eos": True, "stop": ["s" * 1024],
        "stop_token_ids": [vocab - 1] * 256})
    chk.check(code == grpc.StatusCode.OK,
              "at the limits (a 1024-byte stop, 256 ids up to vocab-1) is "
              "accepted (%s)" % code)
    # seed is a uint64: every value is a seed (HTTP's signed seed s is
    # the same as gRPC's s mod 2^64). An integer beyond 64 bits inside a
    # JSON text (a schema's enum) is read as over HTTP, not refused as
    # malformed.
    msgs, code, _ = c.gen(prompt="a", sampling={
        "max_tokens": 2, "seed": (1 << 64) - 1})
    chk.check(code == grpc.StatusCode.OK, "seed 2^64 - 1 is served (%s)" %
              code)
    rf = json.dumps({"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"enum": [1, 99999999999999999999]}}})
    msgs, code, det = c.gen(prompt="a", response_format=rf,
                            sampling={"max_tokens": 4})
    chk.check(code == grpc.StatusCode.OK,
              "a response_format whose enum holds 99999999999999999999 is "
              "served (%s: %s)" % (code, det))
    m0 = http.metrics() or {}
    msgs, code, det = c.gen(prompt="p" * (5 << 20), sampling={
        "max_tokens": 2})
    chk.check(code == grpc.StatusCode.RESOURCE_EXHAUSTED,
              "a 5 MiB request over --grpc-max-message -> RESOURCE_EXHAUSTED "
              "(%s)" % code)
    m1 = http.metrics() or {}
    chk.check((du.metric(m1, "tangram_grpc_oversized_messages_total") or 0)
              == (du.metric(m0, "tangram_grpc_oversized_messages_total")
                  or 0) + 1, "tangram_grpc_oversized_messages_total counts it")


def main():
    missing = du.missing_inputs(
        modules=[("grpc", "python3-grpcio"),
                 ("google.protobuf", "python3-protobuf")],
        tools=["protoc"])
    if missing:
        return du.fail_missing(missing)
    import grpc
    work = du.scratch_dir("tgdgrpc")
    d = None
    c = None
    try:
        mods, why = load_protos(work)
        if mods is None:
            chk.check(False, "generate the Python protobuf modules", why)
            return chk.summary()
        pb, hpb = mods
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, work, ["--max-num-seqs", "1", "--max-queued",
                                    "1", "--max-model-len", "4096"],
                      api_key=KEY, profile=PROFILE)
        ready = d.start()
        chk.check(ready, "tangramd starts and /health turns 200",
                  d.log_text()[-3000:])
        if ready:
            http = Http(d)
            c = Client(grpc, pb, hpb, d.grpc_target)
            t_health_info(c, grpc, http)
            t_generate(c, grpc, http)
            t_session(c, grpc, http)
            t_abort(c, grpc, http)
            t_queue_full(c, grpc, http)
            t_bad(c, grpc, http)
            t_limits(c, grpc, http)
            m = http.idle(10)
            chk.check(m is not None, "at the end nothing runs or waits")
            if m is not None:
                used = du.metric(m, "tangram_kv_pages_used", rank="0")
                total = du.metric(m, "tangram_kv_pages_capacity", rank="0")
                chk.check(used is not None and 0 < used < total,
                          "pages in use at the end are the cache's only "
                          "(%s of %s)" % (used, total))
            chk.check(d.proc.poll() is None and not
                      [ln for ln in d.log_text().splitlines()
                       if "restarting" in ln],
                      "no process died during the test")
    finally:
        if c is not None:
            c.ch.close()
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
