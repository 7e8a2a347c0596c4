#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer harnesses (tests/fuzz/README.md)
into tests/fuzz/corpus/<harness>/: small real inputs in each harness's input
layout (see the top of each fuzz_*.c), edge cases taken from the unit tests,
and copies of the project's small data files. Standard library only; run
from anywhere:  python3 tests/fuzz/make_corpus.py
Files it does not write (reproducers of fixed bugs, crash-*) are left alone.
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def put(harness, name, data):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- protobuf wire format (protobuf.dev "Encoding") ------------------------

def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def f_float(num, x):
    return varint(num << 3 | 5) + struct.pack("<f", x)


def f_packed(num, vals):
    return f_bytes(num, b"".join(varint(v) for v in vals))


def grpc_frame(msg, compressed=0):
    return bytes([compressed]) + struct.pack(">I", len(msg)) + msg


# ---- tangram.v1 (proto/tangram.proto) ---------------------------------------

def chat_message(role, content):
    return f_bytes(1, role) + f_bytes(2, content)


def sampling(**kw):
    b = b""
    if "max_tokens" in kw:
        b += f_varint(1, kw["max_tokens"])
    if "temperature" in kw:
        b += f_float(2, kw["temperature"])
    if "top_p" in kw:
        b += f_float(3, kw["top_p"])
    if "top_k" in kw:
        b += f_varint(4, kw["top_k"])
    if "seed" in kw:
        b += f_varint(6, kw["seed"])
    for s in kw.get("stop", []):
        b += f_bytes(7, s)
    if "stop_token_ids" in kw:
        b += f_packed(8, kw["stop_token_ids"])
    if "logprobs" in kw:
        b += f_varint(10, kw["logprobs"])
    if "repetition_penalty" in kw:
        b += f_float(13, kw["repetition_penalty"])
    if "min_tokens" in kw:
        b += f_varint(14, kw["min_tokens"])
    return b


GENERATE = {
    "gen_prompt": f_bytes(2, "Hello, world") + f_bytes(6, sampling(max_tokens=8)),
    "gen_ids": f_packed(3, [1, 2, 3, 151935]) + f_bytes(5, "sess-1"),
    "gen_chat": f_bytes(1, "req-1") + f_bytes(4, chat_message("system", "be brief"))
    + f_bytes(4, chat_message("user", "hi"))
    + f_bytes(6, sampling(temperature=0.7, top_p=0.9, top_k=40, seed=7,
                          stop=["\n\n", "END"], stop_token_ids=[151643],
                          logprobs=5, repetition_penalty=1.1, min_tokens=2)),
    "gen_bad_role": f_bytes(4, chat_message("wizard", "x")),
    "gen_two_forms": f_bytes(2, "a") + f_packed(3, [1]),
    "gen_bad_sampling": f_bytes(2, "a") + f_bytes(6, sampling(temperature=3.0, top_p=0.0)),
    "gen_big_id": f_packed(3, [0xFFFFFFFF]),
    "gen_long_session": f_bytes(2, "a") + f_bytes(5, "s" * 300),
    "gen_bad_utf8_id": f_bytes(2, "a") + f_bytes(1, b"\xff\xfe"),
}
TOKENIZE = {
    "tok_text": f_bytes(1, "hello there") + f_varint(3, 1),
    "tok_chat": f_bytes(2, chat_message("user", "hi"))
    + f_bytes(2, chat_message("developer", "rules")) + f_varint(4, 0),
    "tok_bad_role": f_bytes(2, chat_message("", "x")),
}
ABORT = {"abort": f_bytes(1, "req-1"), "abort_empty": b""}
HEALTH = {"health_all": b"", "health_gen": f_bytes(1, "tangram.v1.Generation"),
          "health_unknown": f_bytes(1, "nope")}


def reflection(kind, value):
    # ServerReflectionRequest: host = 1, then the oneof member.
    num = {"file_by_filename": 3, "file_containing_symbol": 4,
           "file_containing_extension": 5, "all_extension_numbers_of_type": 6,
           "list_services": 7}[kind]
    return f_bytes(1, "localhost") + f_bytes(num, value)


REFLECT = {
    "refl_list": reflection("list_services", ""),
    "refl_symbol": reflection("file_containing_symbol", "tangram.v1.Generation"),
    "refl_method": reflection("file_containing_symbol",
                              "tangram.v1.Generation.Generate"),
    "refl_file": reflection("file_by_filename", "tangram.proto"),
    "refl_ext": reflection("file_containing_extension",
                           f_bytes(1, "tangram.v1.GenerateRequest") + f_varint(2, 100)),
    "refl_extnums": reflection("all_extension_numbers_of_type",
                               "tangram.v1.GenerateRequest"),
    "refl_missing": reflection("file_containing_symbol", "no.Such"),
}


def grpc_seeds():
    # fuzz_grpc_msg: byte 0 the message type, then the protobuf bytes.
    for k, v in GENERATE.items():
        put("grpc_msg", k, bytes([0]) + v)
    put("grpc_msg", "gen_session_header", bytes([4]) + GENERATE["gen_prompt"])
    for k, v in TOKENIZE.items():
        put("grpc_msg", k, bytes([1]) + v)
    for k, v in ABORT.items():
        put("grpc_msg", k, bytes([2]) + v)
    for k, v in HEALTH.items():
        put("grpc_msg", k, bytes([3]) + v)
    # fuzz_grpc: f0 (method | flags), f1 (headers | splits), framed body.
    M = {"generate": 0, "tokenize": 1, "abort": 2, "modelinfo": 3, "check": 4,
         "watch": 5, "refl": 6, "refl_alpha": 7, "bidi": 8, "unary": 9,
         "stream": 10, "later": 11, "nope": 12, "badpath": 13}
    for k, v in GENERATE.items():
        put("grpc", k, bytes([M["generate"], 0]) + grpc_frame(v))
    for k, v in TOKENIZE.items():
        put("grpc", k, bytes([M["tokenize"], 0x40]) + grpc_frame(v))
    put("grpc", "abort", bytes([M["abort"], 0x01]) + grpc_frame(ABORT["abort"]))
    put("grpc", "modelinfo", bytes([M["modelinfo"], 0]) + grpc_frame(b""))
    put("grpc", "check", bytes([M["check"], 0]) + grpc_frame(HEALTH["health_gen"]))
    put("grpc", "check_unknown", bytes([M["check"], 0]) + grpc_frame(HEALTH["health_unknown"]))
    put("grpc", "watch", bytes([M["watch"], 0x08]) + grpc_frame(HEALTH["health_all"]))
    allrefl = b"".join(grpc_frame(v) for v in REFLECT.values())
    put("grpc", "refl_all", bytes([M["refl"], 0x80]) + allrefl)
    put("grpc", "refl_alpha_open", bytes([M["refl_alpha"] | 0x20, 0])
        + grpc_frame(REFLECT["refl_list"]))
    for k, v in REFLECT.items():
        put("grpc", k, bytes([M["refl"], 0]) + grpc_frame(v))
    put("grpc", "bidi", bytes([M["bidi"], 0xC0]) + grpc_frame(b"ab")
        + grpc_frame(b"") + grpc_frame(b"cd") + grpc_frame(b"fail"))
    put("grpc", "bidi_open_two", bytes([M["bidi"] | 0x60, 0]) + grpc_frame(b"x"))
    put("grpc", "unary", bytes([M["unary"], 0]) + grpc_frame(b"hello"))
    put("grpc", "unary_two_msgs", bytes([M["unary"], 0]) + grpc_frame(b"a") + grpc_frame(b"b"))
    put("grpc", "unary_compressed", bytes([M["unary"], 0]) + grpc_frame(b"a", 1))
    put("grpc", "unary_too_big", bytes([M["unary"], 0]) + b"\x00\x00\x10\x00\x00abc")
    put("grpc", "unary_partial_prefix", bytes([M["unary"], 0xC0]) + b"\x00\x00\x00")
    put("grpc", "unary_no_te", bytes([M["unary"], 0x04]) + grpc_frame(b"x"))
    put("grpc", "unary_json", bytes([M["unary"], 0x02]) + grpc_frame(b"x"))
    put("grpc", "unary_get", bytes([M["unary"], 0x10]) + grpc_frame(b"x"))
    put("grpc", "unary_bad_timeout", bytes([M["unary"], 0x20]) + grpc_frame(b"x"))
    put("grpc", "unary_deny", bytes([M["unary"] | 0x80, 0]) + grpc_frame(b"x"))
    put("grpc", "stream", bytes([M["stream"], 0x08]) + grpc_frame(b"\x05"))
    put("grpc", "later_two", bytes([M["later"] | 0x40, 0]) + grpc_frame(b"x"))
    put("grpc", "nope", bytes([M["nope"], 0]) + grpc_frame(b"x"))
    put("grpc", "badpath", bytes([M["badpath"], 0]) + grpc_frame(b"x"))
    # Raw mode: frames of the fuzzer's own after the preface and SETTINGS.
    ping = struct.pack(">I", 8)[1:] + bytes([6, 0]) + struct.pack(">I", 0) + b"12345678"
    wu = struct.pack(">I", 4)[1:] + bytes([8, 0]) + struct.pack(">I", 0) + struct.pack(">I", 1000)
    rst = struct.pack(">I", 4)[1:] + bytes([3, 0]) + struct.pack(">I", 1) + struct.pack(">I", 8)
    goaway = struct.pack(">I", 8)[1:] + bytes([7, 0]) + struct.pack(">I", 0) + bytes(8)
    put("grpc", "raw_ping_wu_rst", bytes([0x10, 0]) + ping + wu + rst + goaway)


# ---- worker protocol (proto/worker.proto) -----------------------------------

def plan_entry(slot, kind, tokens, start, sample=True, last=True, nprompt=0,
               fresh=False, samp=None, row_lens=None, seed=0):
    b = f_varint(1, slot) + f_bytes(2, "req-%d" % slot) + f_varint(3, kind)
    b += f_packed(4, tokens) + f_varint(5, start)
    if samp is not None:
        b += f_bytes(6, samp)
    if seed:
        b += f_varint(7, seed)
    b += f_varint(8, int(sample)) + f_varint(9, int(last))
    b += f_varint(10, nprompt) + f_varint(11, int(fresh))
    if row_lens:
        b += f_packed(12, row_lens)
    return b


def page_delta(slot, layer, group, pages, truncate=None):
    b = f_varint(1, slot) + f_varint(2, layer) + f_varint(3, group)
    b += f_packed(4, pages)
    if truncate is not None:
        b += f_varint(5, truncate)
    return b


def batch_plan(step, entries=(), deltas=(), frees=(), version=1):
    b = f_varint(1, version) + f_varint(2, step)
    for e in entries:
        b += f_bytes(3, e)
    for d in deltas:
        b += f_bytes(4, d)
    if frees:
        b += f_packed(5, list(frees))
    return b


def wmsg(body_num, body, version=1):
    return f_varint(1, version) + f_bytes(body_num, body)


def seq(*msgs):
    return b"".join(struct.pack("<H", len(m)) + m for m in msgs)


def worker_seeds():
    # The harness's worker: 2 layers x 2 groups (one head each), pages of
    # 4 tokens, prefill chunks of 8, 64 pages, 4 slots.
    rows = [(l, g) for l in range(2) for g in range(2)]
    pre = [page_delta(0, l, g, [2 * i, 2 * i + 1]) for i, (l, g) in enumerate(rows)]
    grow = [page_delta(0, l, g, [8 + i]) for i, (l, g) in enumerate(rows)]
    toks = [9, 8, 7, 6, 5, 4, 3, 2]
    p1 = batch_plan(1, [plan_entry(0, 1, toks, 0, nprompt=8, fresh=True)], pre)
    p2 = batch_plan(2, [plan_entry(0, 2, [11], 8, nprompt=8)], grow)
    samp = (f_float(1, 0.8) + f_float(2, 0.9) + f_varint(3, 5) + f_float(4, 0.05)
            + f_float(5, 0.5) + f_float(6, 0.5) + f_float(7, 1.2) + f_varint(8, 3))
    p1s = batch_plan(1, [plan_entry(0, 1, toks, 0, nprompt=8, fresh=True,
                                    samp=samp, seed=42)], pre)
    put("worker", "prefill", seq(wmsg(4, p1)))
    put("worker", "prefill_decode", seq(wmsg(4, p1), wmsg(4, p2)))
    put("worker", "prefill_sampled", seq(wmsg(4, p1s), wmsg(4, p2)))
    put("worker", "prefill_free", seq(wmsg(4, p1), wmsg(4, batch_plan(2, frees=[0]))))
    # Chunked prefill: 4 + 4 tokens, the second chunk last.
    c1 = batch_plan(1, [plan_entry(1, 1, toks[:4], 0, sample=False, last=False,
                                   nprompt=8, fresh=True)],
                    [page_delta(1, l, g, [i]) for i, (l, g) in enumerate(rows)])
    c2 = batch_plan(2, [plan_entry(1, 1, toks[4:], 4, nprompt=8)],
                    [page_delta(1, l, g, [4 + i]) for i, (l, g) in enumerate(rows)])
    put("worker", "chunked", seq(wmsg(4, c1), wmsg(4, c2)))
    trunc = batch_plan(2, [], [page_delta(0, 0, 0, [20], truncate=1)])
    put("worker", "truncate", seq(wmsg(4, p1), wmsg(4, trunc)))
    adopt = batch_plan(1, [plan_entry(2, 1, [1, 2], 4, nprompt=6, fresh=True,
                                      row_lens=[4, 2, 3, 4])],
                       [page_delta(2, l, g, [30 + 2 * i, 31 + 2 * i])
                        for i, (l, g) in enumerate(rows)])
    put("worker", "adopt_rows", seq(wmsg(4, adopt)))
    # Refused plans: bad page, wrong position, unknown slot, old step id,
    # bad version, out-of-range layer, unknown kind.
    put("worker", "bad_page", seq(wmsg(4, batch_plan(1, [plan_entry(0, 1, toks, 0, fresh=True)],
                                                     [page_delta(0, 0, 0, [999])]))))
    put("worker", "bad_pos", seq(wmsg(4, p1), wmsg(4, batch_plan(2, [plan_entry(0, 2, [1], 3)]))))
    put("worker", "bad_slot", seq(wmsg(4, batch_plan(1, [plan_entry(9, 2, [1], 0)]))))
    put("worker", "old_step", seq(wmsg(4, p1), wmsg(4, batch_plan(1, frees=[0]))))
    put("worker", "bad_version", seq(wmsg(4, batch_plan(1, version=7), version=7)))
    put("worker", "bad_layer", seq(wmsg(4, batch_plan(1, deltas=[page_delta(0, 5, 0, [1])]))))
    put("worker", "bad_kind", seq(wmsg(4, batch_plan(1, [plan_entry(0, 0, [1], 0, fresh=True)]))))
    put("worker", "big_token", seq(wmsg(4, batch_plan(1, [plan_entry(0, 1, [0xFFFFFFF0], 0, fresh=True)], pre))))
    comm = f_varint(1, 1) + f_bytes(2, b"id") + f_bytes(3, "shm") + f_varint(4, 1)
    put("worker", "comm_heartbeat_shutdown",
        seq(wmsg(7, comm), wmsg(3, f_varint(1, 1) + f_varint(2, 5)),
            wmsg(6, f_varint(1, 1) + f_bytes(2, "bye") + f_varint(3, 1)), wmsg(4, p1)))
    put("worker", "garbage", seq(b"\xff\xff\xff"))


# ---- HTTP/1.1 (fuzz_http) ----------------------------------------------------

def http_seeds():
    H = "Host: t\r\n"
    seeds = {
        "get_hello": "GET /hello HTTP/1.1\r\n" + H + "\r\n",
        "head_hello": "HEAD /hello HTTP/1.1\r\n" + H + "Connection: close\r\n\r\n",
        "post_echo_cl": "POST /echo HTTP/1.1\r\n" + H + "X-Test: a\r\nContent-Length: 5\r\n\r\nhello",
        "post_echo_chunked": "POST /echo HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\n"
        "3;a=b\r\nabc\r\n1\r\nd\r\n0\r\nX-T: a\r\n\r\n",
        "pipelined_later": "GET /later HTTP/1.1\r\n" + H + "\r\nGET /hello HTTP/1.1\r\n" + H
        + "\r\nPOST /echo HTTP/1.1\r\n" + H + "Content-Length: 2\r\n\r\nokGET /stream HTTP/1.1\r\n" + H + "\r\n",
        "http10_keepalive": "GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /hello HTTP/1.0\r\n\r\n",
        "prefix_query": "GET /v1/models/x?a=b&c HTTP/1.1\r\n" + H + "\r\n",
        "absolute_form": "GET http://t/hello?x HTTP/1.1\r\n" + H + "\r\n",
        "expect_continue": "PUT /echo HTTP/1.1\r\n" + H + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
        "expect_too_big": "PUT /echo HTTP/1.1\r\n" + H + "Expect: 100-continue\r\nContent-Length: 20000\r\n\r\n",
        "deny": "POST /echo HTTP/1.1\r\n" + H + "X-Deny: 1\r\nContent-Length: 3\r\n\r\nabc",
        "bad_bare_lf": "GET /hello HTTP/1.1\nHost: t\n\n",
        "bad_bare_cr": "GET /hello HTTP/1.1\r\nHost: t\r\nX-A: b\rX-C: d\r\n\r\n",
        "bad_obsfold": "GET /hello HTTP/1.1\r\n" + H + "X-A: b\r\n c\r\n\r\n",
        "bad_leading_ws": "GET /hello HTTP/1.1\r\n Host: t\r\n\r\n",
        "bad_chunk_crlf": "POST /echo HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n",
        "bad_chunk_ext_lf": "POST /echo HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\n3;a\nb\r\nabc\r\n0\r\n\r\n",
        "bad_cl_te": "POST /echo HTTP/1.1\r\n" + H + "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "bad_two_cl": "POST /echo HTTP/1.1\r\n" + H + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "bad_te_gzip": "POST /echo HTTP/1.1\r\n" + H + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        "bad_te_twice": "POST /echo HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "bad_te_http10": "POST /echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "bad_host_space": "GET /hello HTTP/1.1\r\nHost : t\r\n\r\n",
        "bad_no_host": "GET /hello HTTP/1.1\r\n\r\n",
        "bad_two_hosts": "GET /hello HTTP/1.1\r\n" + H + "Host: u\r\n\r\n",
        "bad_host_value": "GET /hello HTTP/1.1\r\nHost: a/b\r\n\r\n",
        "bad_version": "GET /hello HTTP/2.0\r\n" + H + "\r\n",
        "bad_target": "GET hello HTTP/1.1\r\n" + H + "\r\n",
        "too_large_body": "POST /echo HTTP/1.1\r\n" + H + "Content-Length: 99999\r\n\r\n",
        "huge_chunk": "POST /echo HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\nffffff\r\nab",
        "big_header": "GET /hello HTTP/1.1\r\n" + H + "X-Big: " + "a" * 2100 + "\r\n\r\n",
        "method_405": "DELETE /hello HTTP/1.1\r\n" + H + "\r\nOPTIONS * HTTP/1.1\r\n" + H + "\r\n",
        "connect": "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
        "upgrade": "GET /hello HTTP/1.1\r\n" + H + "Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        "trailer_fold": "POST /echo HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: a\r\n b\r\n\r\n",
        "incomplete": "POST /echo HTTP/1.1\r\n" + H + "Content-Length: 10\r\n\r\nabc",
    }
    for k, v in seeds.items():
        put("http", k, b"\x00" + v.encode())
    put("http", "split_chunked", b"\x03" + seeds["post_echo_chunked"].encode())
    put("http", "split_bytewise", b"\x01\r\n" + seeds["get_hello"].encode())
    put("http", "split_pipelined", b"\x07" + seeds["pipelined_later"].encode())


# ---- OpenAI bodies (fuzz_openai, fuzz_chat) -----------------------------------

COMPLETIONS = [
    {"model": "tiny", "prompt": "Hello", "max_tokens": 16, "temperature": 0.7,
     "top_p": 0.9, "stop": ["\n", "END"], "seed": 3, "logprobs": 2, "stream": True,
     "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    {"prompt": [1, 2, 3], "max_tokens": 1.0, "min_tokens": 1, "top_k": -1,
     "min_p": 0.1, "presence_penalty": 1.5, "frequency_penalty": -1,
     "repetition_penalty": 1.2, "ignore_eos": True, "skip_special_tokens": False,
     "include_stop_str_in_output": True, "stop_token_ids": [151643],
     "add_special_tokens": False, "user": "u", "session_id": "s", "request_id": "r"},
    {"prompt": ["only one"], "max_tokens": None, "n": 1, "best_of": 1, "echo": False},
    {"prompt": [[5, 6]], "logit_bias": {}, "suffix": None},
    {"prompt": "x", "max_tokens": 4097},
    {"prompt": "x", "temperature": 1e-300, "top_p": 1e-300, "repetition_penalty": 1e308},
]
CHATS = [
    {"model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "hi"}],
     "max_completion_tokens": 32, "stream": True,
     "logprobs": True, "top_logprobs": 3},
    {"messages": [{"role": "developer", "content": "rules"},
                  {"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]},
                  {"role": "assistant", "content": "<think>x</think>ok",
                   "reasoning_content": "r"},
                  {"role": "user", "content": "more", "name": "bob"}],
     "chat_template_kwargs": {"enable_thinking": False},
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "partial"}],
     "add_generation_prompt": False, "continue_final_message": True},
    {"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [],
     "response_format": {"type": "text"}},
    {"messages": [{"role": "assistant", "content": None,
                   "tool_calls": [{"id": "x"}]}]},
    {"messages": [{"role": "user", "content": "\u00e9\u4e2d<|im_start|>\U0001F600"}]},
    {"messages": []},
]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TOOL_CHATS = [
    {"messages": [{"role": "user", "content": "weather in Paris?"}],
     "tools": [WEATHER_TOOL], "tool_choice": "auto"},
    {"messages": [{"role": "user", "content": "weather in Paris?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function", "function": {
                          "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
     "tools": [WEATHER_TOOL]},
    {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL],
     "tool_choice": "none"},
]
TOKENIZE_BODIES = [
    {"model": "tiny", "prompt": "hello", "add_special_tokens": True,
     "return_token_strs": True},
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True,
     "continue_final_message": False, "chat_template_kwargs": {"enable_thinking": True}},
]
DETOKENIZE_BODIES = [{"model": "tiny", "tokens": [1, 2, 151935]},
                     {"tokens": []}, {"tokens": [-1]}]
RAW_BODIES = ['{', '{"prompt":"hi",}', '{"prompt":"a\\u0000b"}',
              '{"prompt":"hi"} trailing', '{"prompt":"hi","prompt":7}', '[]',
              '{"prompt":"hi","max_tokens":99999999999999999999999}',
              '{"prompt":"\\ud800 lone surrogate"}']


RESPONSES_BODIES = [
    {"model": "tiny", "input": "hi", "max_output_tokens": 8,
     "temperature": 0, "instructions": "be brief", "metadata": {"k": "v"}},
    {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "a"}, {"type": "input_text",
                                              "text": "b"}]},
               {"type": "reasoning", "summary": [], "content": [
                   {"type": "reasoning_text", "text": "hm"}]},
               {"type": "message", "role": "assistant", "content": [
                   {"type": "output_text", "text": "c", "annotations": []}]},
               {"type": "function_call", "call_id": "c1", "name": "f",
                "arguments": "{\"x\": 1}"},
               {"type": "function_call_output", "call_id": "c1",
                "output": "one"},
               {"type": "item_reference", "id": "fc_00"}],
     "tools": [{"type": "function", "name": "f", "strict": True,
                "parameters": {"type": "object", "properties": {
                    "x": {"type": "integer"}}, "required": ["x"],
                    "additionalProperties": False}}],
     "tool_choice": {"type": "function", "name": "f"}, "stream": True},
    {"input": "json", "text": {"format": {
        "type": "json_schema", "name": "s", "strict": True,
        "schema": {"type": "object", "properties": {
            "a": {"enum": ["x", "y"]}}, "required": ["a"]}}},
     "store": False, "previous_response_id": "resp_00"},
    {"input": "x", "include": ["reasoning.encrypted_content"]},
    {"input": [{"type": "input_image"}]},
    '<think>\nweigh\n</think>\n\nanswer',
]


def responses_seeds():
    for i, b in enumerate(RESPONSES_BODIES):
        if not isinstance(b, str):
            b = json.dumps(b, ensure_ascii=False)
        put("responses", "body_%d" % i, b)


def openai_seeds():
    def seed(ep, n_prompt, body):
        if not isinstance(body, str):
            body = json.dumps(body, ensure_ascii=False)
        return bytes([ep]) + struct.pack("<q", n_prompt) + body.encode()
    for i, b in enumerate(COMPLETIONS):
        put("openai", "completion_%d" % i, seed(0, 5 + i, b))
    for i, b in enumerate(CHATS):
        put("openai", "chat_%d" % i, seed(1, 30, b))
    for i, b in enumerate(TOKENIZE_BODIES):
        put("openai", "tokenize_%d" % i, seed(2, 0, b))
    for i, b in enumerate(DETOKENIZE_BODIES):
        put("openai", "detokenize_%d" % i, seed(3, 0, b))
    for i, b in enumerate(RAW_BODIES):
        put("openai", "raw_%d" % i, seed(i & 1, -1, b))
    put("openai", "fit_huge", seed(0, 1 << 62, COMPLETIONS[0]))
    put("openai", "fit_context", seed(1, 4095, CHATS[0]))
    # fuzz_chat: byte 0 picks the template (bits 0-3, of 15) and the
    # special tokens (bit 4); every template gets a plain and a tool chat.
    for i, b in enumerate(CHATS + TOOL_CHATS):
        put("chat", "chat_%d" % i, bytes([i % 15]) + json.dumps(b, ensure_ascii=False).encode())
    for t in range(15):
        put("chat", "tools_t%d" % t,
            bytes([t | 16]) + json.dumps(TOOL_CHATS[1], ensure_ascii=False).encode())


# ---- tokenizers (fuzz_tokenizer, fuzz_tok_encode) ------------------------------

def byte_chars():
    # GPT-2's byte-to-unicode table (openai/gpt-2 encoder.py bytes_to_unicode).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_tokenizer(extra=(), merges=(), added=(), normalizer=None, regex=None,
                   post=None, ignore_merges=False, behavior="Isolated"):
    bc = byte_chars()
    vocab = {bc[b]: b for b in range(256)}
    for i, t in enumerate(extra):
        vocab[t] = 256 + i
    pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
           "use_regex": regex is None}
    if regex is not None:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior,
             "invert": False}, dict(pre, use_regex=False)]}
    doc = {"version": "1.0", "added_tokens": list(added), "normalizer": normalizer,
           "pre_tokenizer": pre, "post_processor": post,
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False,
                     "ignore_merges": ignore_merges, "vocab": vocab,
                     "merges": list(merges)}}
    return json.dumps(doc, ensure_ascii=False).encode()


def tokenizer_seeds():
    sp = "\u0120"  # the byte-level space
    added = [{"id": 300, "content": "<|end|>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True},
             {"id": 301, "content": " hi", "single_word": True, "lstrip": True,
              "rstrip": True, "normalized": True, "special": False}]
    post = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [300],
                                           "tokens": ["<|end|>"]}}}
    cfg = json.dumps({"bos_token": "<|end|>", "eos_token": {"content": "<|end|>"},
                      "pad_token": None}).encode()
    gen = json.dumps({"eos_token_id": [300, 5]}).encode()
    basic = tiny_tokenizer(["ab", "bc", "abc", sp + "a"], ["b c", "a b", "a bc", sp + " a"])
    put("tokenizer", "basic", basic + b"\0\0\0\x00abc abcab")
    put("tokenizer", "added_post", tiny_tokenizer(
        ["ab"], ["a b"], added, {"type": "NFC"}, r"\s+|\w+", post) + b"\0" + cfg
        + b"\0" + gen + "\0\x03ab<|end|> hi caf\u00e9".encode())
    put("tokenizer", "nfkc_removed", tiny_tokenizer(
        [], [], [], {"type": "Sequence", "normalizers": [{"type": "NFKC"}]},
        r"[0-9]", None, True, "Removed") + "\0\0\0\x01\uff21 12x".encode())
    put("tokenizer", "merged_with_next", tiny_tokenizer(
        ["a-", "-b"], ["a -", "- b"], [], None, "-", None, False, "MergedWithNext")
        + b"\0\0\0\x00a-b--")
    put("tokenizer", "no_merges", tiny_tokenizer() + b"\0\0\0\x00\xf0\x9f\x98\x80 x")
    # fuzz_tok_encode (the real Qwen3 tokenizer): text and ids modes.
    texts = ["Hello, world! 123", " <|im_start|>user\nhi<|im_end|>",
             "caf\u00e9 \u4e2d\u6587 \U0001F600\t\r\n", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
             "don't   stop  ", "\u1e9b\u0323 e\u0301"]
    for i, t in enumerate(texts):
        put("tok_encode", "text_%d" % i, bytes([i & 3]) + t.encode())
    put("tok_encode", "bad_utf8", b"\x00ab\xc3(\xff")
    ids = [9707, 11, 1879, 0, 151643, 151644, 151935, 151936, -5, 1 << 30]
    put("tok_encode", "ids", b"\x80" + struct.pack("<%di" % len(ids), *ids))
    put("tok_encode", "ids_skip", b"\x81" + struct.pack("<%di" % len(ids), *ids))
    # Part of a multi-byte character per token.
    put("tok_encode", "ids_partial_utf8", b"\x80" + struct.pack("<3i", 120, 226, 126))


def copy_data():
    d = os.path.join(ROOT, "data", "safetensors_samples")
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            put("safetensors", name, open(os.path.join(d, name), "rb").read())
    # Edge cases of the header: length past the end, 0, not an object,
    # overlapping tensors, a scalar, metadata.
    def st(header, data=b""):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    put("safetensors", "edge_len_past_end", struct.pack("<Q", 1 << 40) + b"{}")
    put("safetensors", "edge_empty_header", struct.pack("<Q", 0))
    put("safetensors", "edge_array", st([]))
    put("safetensors", "edge_overlap", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                          "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, bytes(8)))
    put("safetensors", "edge_scalar_meta", st({"__metadata__": {"format": "pt"},
                                               "s": {"dtype": "BF16", "shape": [], "data_offsets": [0, 2]},
                                               "z": {"dtype": "F16", "shape": [0, 3], "data_offsets": [2, 2]},
                                               "m": {"dtype": "F64", "shape": [2, 1], "data_offsets": [2, 18]}},
                                              bytes(18)))
    put("safetensors", "edge_big_shape", st({"a": {"dtype": "F32", "shape": [1 << 62, 4],
                                                   "data_offsets": [0, 0]}}))
    for name in ("tiny-llama.json", "tiny-qwen3.json"):
        put("profile", name, open(os.path.join(ROOT, "profiles", name), "rb").read())
    p = json.load(open(os.path.join(ROOT, "profiles", "tiny-qwen3.json")))
    q = dict(p, grouping="adjacent")
    put("profile", "adjacent.json", json.dumps(q))
    q = dict(p)
    q["layers"] = [dict(l, groups=[[0, 0]] + l["groups"][1:]) for l in p["layers"]]
    put("profile", "bad_groups.json", json.dumps(q))
    q = dict(p, heads_per_group=3)
    put("profile", "bad_hp.json", json.dumps(q))


# ---- structured outputs (common/grammar) -----------------------------------

def grammar_seeds():
    """fuzz_grammar: mode byte, schema or spec, NUL, drive bytes. Every
    schema of the engine's test corpus with its first valid document, a
    few with a schema-invalid one, and tool-call and free-JSON specs."""
    with open(os.path.join(ROOT, "tests/grammar/schemas.json"), encoding="utf-8") as f:
        corpus = json.load(f)
    for case in corpus["schemas"]:
        schema = json.dumps(case["schema"], separators=(",", ":"), ensure_ascii=False)
        doc = case["valid"][0] if case["valid"] else ""
        put("grammar", case["name"], b"\x00" + schema.encode() + b"\x00" + doc.encode())
        if case["invalid"]:
            put("grammar", case["name"] + "_invalid",
                b"\x02" + schema.encode() + b"\x00" + case["invalid"][0].encode())
    for tc in corpus["tools"][:2]:
        spec = {"type": "tool_calls", "format": tc["format"], "min_calls": tc["min_calls"],
                "max_calls": tc["max_calls"], "tools": tc["tools"]}
        call = ('<tool_call>\n{"name": "get_weather", "arguments": {"location": "Oslo"}}\n</tool_call>'
                if tc["format"] == "hermes" else
                '{"name": "get_weather", "parameters": {"location": "Oslo"}}')
        put("grammar", "spec_" + tc["name"],
            b"\x01" + json.dumps(spec, separators=(",", ":")).encode() + b"\x00" + call.encode())
    trig = {"type": "triggered", "trigger": "<tool_call>", "anchored": False,
            "spec": {"type": "tool_calls", "format": "hermes", "min_calls": 1, "max_calls": 1,
                     "tools": [{"name": "f", "parameters": {"type": "object"}}]}}
    put("grammar", "spec_triggered",
        b"\x01" + json.dumps(trig, separators=(",", ":")).encode() + b"\x00" +
        b'<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    put("grammar", "spec_json_value", b'\x01{"type":"json_value"}\x00[1, {"a": "\\u00e9"}, true]')
    put("grammar", "spec_json_object", b'\x03{"type":"json_object"}\x00{"k":[null]}')
    put("grammar", "spec_bad", b'\x01{"type":"regex"}\x00x')
    put("grammar", "spec_regex",
        b'\x01{"type":"regex","pattern":"(yes|no)[.!]? \\\\d{2,3}"}\x00no! 42')
    put("grammar", "spec_choice",
        b'\x01{"type":"choice","choices":["red","green","gr\xc3\xa9y"]}\x00green')
    put("grammar", "spec_gbnf",
        b'\x01{"type":"grammar","gbnf":"root ::= item (\\", \\" item)*\\n'
        b'item ::= [a-z]+ | \\"\\\\\\"\\" [^\\"]* \\"\\\\\\"\\""}\x00ab, "c d"')
    put("grammar", "schema_unsupported", b'\x00{"pattern":"a"}\x00"a"')


def regex_seeds():
    """fuzz_regex: mode byte, pattern, NUL, subject. Patterns users write
    (zod's email, lookaheads, classes, Unicode), the refused constructs,
    and PCRE2-comparable ones (only a-c, digits and operators)."""
    cases = [
        ("email", 0, r"^(?!\.)(?!.*\.\.)([A-Za-z0-9_'+\-\.]*)[A-Za-z0-9_+-]@"
                     r"([A-Za-z0-9][A-Za-z0-9\-]*\.)+[A-Za-z]{2,}$", "ann.lee@example.com"),
        ("password", 0, r"^(?=.*[A-Z])(?=.*\d)(?!.*\s).{8,16}$", "Secret123"),
        ("date", 0, r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$", "2024-02-29"),
        ("unicode", 0, r"^\p{Lu}\p{Ll}*\u{1F600}?$", "\u00c9t\u00e9"),
        ("escapes", 2 | 4 | 32, r"[\t\n\x22\\]+\cA", "\t\"\\\x01"),
        ("word", 0, r"\bcat\b|\Bdog", "a cat"),
        ("full", 1, r"(yes|no|maybe)[.!]?", "maybe!"),
        ("length", 1 | 2 | 8 | 48, r"[a-z]+(-[a-z]+)*", "ab-cd"),
        ("backref", 0, r"(a)\1", "aa"),
        ("lookbehind", 0, r"(?<=a)b", "ab"),
        ("look_in_rep", 0, r"(?:a(?=b))+", "ab"),
        ("named", 0, r"(?<year>\d{4})-(?P<m>\d\d)", "2024-01"),
        ("braces", 0, r"a{,2}}]{x", "a{,2}}]{x"),
        ("classes", 0, r"[^]?[]?[\w.-]+@[^\s@]+", "x@y"),
        ("pcre1", 0, r"^(a|b)*c{2,3}$", "abcc"),
        ("pcre2", 1, r"(a|b|)+(?=c)c[abc]?\d*", "abc12"),
        ("pcre3", 0, r"(?!a)\w\b(b|c)*", "xb"),
        ("pcre4", 1, r"[a-c]{2}(?:a|bc){0,2}$", "bcbc"),
        ("states", 0, r"a[ab]{20}$", "ab"),
    ]
    for name, mode, pat, sub in cases:
        put("regex", name, bytes([mode]) + pat.encode() + b"\x00" + sub.encode())


def gbnf_seeds():
    """fuzz_gbnf: GBNF text, NUL, drive bytes."""
    json_g = (
        'root ::= object\n'
        'value ::= object | array | string | number | ("true" | "false" | "null") ws\n'
        'object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws\n'
        'array ::= "[" ws ( value ("," ws value)* )? "]" ws\n'
        'string ::= "\\"" ( [^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\\"" ws\n'
        'number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n'
        'ws ::= | " " | "\\n" [ \\t]{0,20}   # bounded\n')
    cases = [
        ("json", json_g, '{"a": [1, true], "b": "x\\n"}'),
        ("arith", 'root ::= expr\nexpr ::= term ([-+*/] term)*\n'
                  'term ::= [0-9]+ | "(" expr ")"\n', "(1+2)*3"),
        ("list", '# items\nroot ::= item ("," " "? item){0,4}\nitem ::= [a-z\\u00e0-\\u00ff]+\n'
                 '  | "\\U0001F600"\n', "ab, \xc3\xa9t\xc3\xa9,\xf0\x9f\x98\x80"),
        ("any", 'root ::= . . [^a-z\\n]* "end"', "\xce\xb1bXYend"),
        ("left", 'root ::= a\na ::= b? a "x" | "y"\nb ::= "z"', "yx"),
        ("undefined", 'root ::= item\n', "x"),
        ("bad_escape", 'root ::= "\\q"', "q"),
        ("nested", 'root ::= ((("a" | "b")+ ("c"? "d"){2,3})*)', "abcdd"),
    ]
    for name, g, drive in cases:
        put("gbnf", name, g.encode() + b"\x00" + drive.encode())


def main():
    regex_seeds()
    gbnf_seeds()
    grammar_seeds()
    http_seeds()
    openai_seeds()
    responses_seeds()
    grpc_seeds()
    worker_seeds()
    tokenizer_seeds()
    copy_data()


if __name__ == "__main__":
    main()
