#!/usr/bin/python3
"""Conversations held by the server over gRPC (GenerateRequest
previous_response_id and store, GenerateResponse.response_id; docs/API.md
"gRPC") on the real tangramd with the tiny model, an API key and
--responses-db, through Debian's python3-grpcio (the generated client code and
protobuf modules of test_daemon_grpc.py).

- A plain Generate stores nothing (no response_id): existing clients are
  unchanged. store=true on a chat: the final message (only it) carries a
  response_id "resp_" + 32 hex digits.
- Continuation: previous_response_id with only the new message reuses the
  first turn's KV whole (cached_prompt_tokens = the first turn's prompt +
  output - 1, the last token never fed back; the same rule the Responses
  test checks), and is stored without asking; a third turn reuses the
  second's.
- Greedy (temperature 0) output of the continued turn equals that of the
  same turn with the whole history re-sent as messages (another session, so
  the cache cannot make them agree).
- NOT_FOUND for an unknown id, for another session's id and for no
  session's; continuing with a prompt (not a chat) is INVALID_ARGUMENT;
  store=false with a previous_response_id stores nothing.
- Both front ends share the store and the multi-turn cache's scope: a
  gRPC-stored response is retrieved and listed by GET
  /v1/responses/{id}[/input_items] and continued by POST /v1/responses
  (its KV reused whole) in the same session (X-Session-Id), and gRPC
  continues a response stored by HTTP (its KV reused whole); another
  session cannot retrieve it.
- tangram_responses_stored_total counts the stored turns.

Fails, naming it, when grpcio, protobuf or protoc is missing. About 15 s
on 2 cores.
"""
import json
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402
import test_daemon_grpc as tg  # noqa: E402

chk = du.Checker()
SAMPLING = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
ID_RE = re.compile(r"resp_[0-9a-f]{32}")


def turn(c, what, **kw):
    """A Generate to its end: (ids, text, final message) or None."""
    kw.setdefault("sampling", dict(SAMPLING))
    msgs, code, det = c.gen(**kw)
    if not chk.check(code == c.grpc.StatusCode.OK and msgs, what,
                     (code, det)):
        return None
    ids, text = tg.joined(msgs)
    chk.check(all(m.response_id == "" for m in msgs[:-1]),
              "%s: only the final message may carry response_id" % what)
    return ids, text, msgs[-1]


def user(c, text):
    return c.pb.ChatMessage(role="user", content=text)


def t_continue(c, grpc):
    r = turn(c, "plain chat Generate", session_id="g-a",
             messages=[user(c, "Hello.")])
    chk.check(r is not None and r[2].response_id == "",
              "a plain Generate stores nothing (no response_id)")
    t1 = turn(c, "turn 1 with store", session_id="g-a", store=True,
              messages=[user(c, "Tell me a story.")])
    if t1 is None:
        return None
    id1 = t1[2].response_id
    chk.check(ID_RE.fullmatch(id1) is not None,
              "turn 1: response_id is resp_ + 32 hex digits", id1)
    t2 = turn(c, "turn 2 continuing turn 1", session_id="g-a",
              previous_response_id=id1, messages=[user(c, "Go on.")])
    if t2 is None:
        return None
    u1, u2 = t1[2].usage, t2[2].usage
    reused = u1.prompt_tokens + u1.completion_tokens - 1
    chk.check(u2.prompt_tokens > u1.prompt_tokens + u1.completion_tokens,
              "turn 2's prompt holds turn 1's prompt and output and more",
              (u1, u2))
    chk.check(u2.cached_prompt_tokens == reused,
              "turn 2 reuses turn 1's KV whole (cached %d, want prompt + "
              "output - 1 = %d)" % (u2.cached_prompt_tokens, reused))
    id2 = t2[2].response_id
    chk.check(ID_RE.fullmatch(id2) is not None and id2 != id1,
              "turn 2 is stored without asking (a new response_id)", id2)
    # The same turn with the whole history re-sent, in a session of its
    # own: the same greedy answer.
    full = turn(c, "turn 2 with the history re-sent", session_id="g-full",
                messages=[user(c, "Tell me a story."),
                          c.pb.ChatMessage(role="assistant", content=t1[1]),
                          user(c, "Go on.")])
    if full is not None:
        chk.check(full[0] == t2[0],
                  "greedy: the continued turn's output equals the re-sent "
                  "history's (prompt %d vs %d tokens)" %
                  (u2.prompt_tokens, full[2].usage.prompt_tokens),
                  (t2[1], full[1]))
    t3 = turn(c, "turn 3 continuing turn 2", session_id="g-a",
              previous_response_id=id2, messages=[user(c, "And then?")])
    if t3 is None:
        return None
    chk.check(t3[2].usage.cached_prompt_tokens ==
              u2.prompt_tokens + u2.completion_tokens - 1,
              "turn 3 reuses turn 2's KV whole", t3[2].usage)
    return t1, t2, t3


def t_errors(c, grpc, id1):
    for what, kw in (
            ("an unknown previous_response_id",
             {"session_id": "g-a", "previous_response_id": "resp_" + "0" * 32}),
            ("another session's response",
             {"session_id": "g-b", "previous_response_id": id1}),
            ("the response with no session",
             {"previous_response_id": id1}),
            ("another session's response by x-session-id metadata",
             {"previous_response_id": id1,
              "md": tg.AUTH_MD + (("x-session-id", "g-b"),)})):
        msgs, code, det = c.gen(messages=[user(c, "steal")],
                                sampling=dict(SAMPLING), **kw)
        chk.check(code == grpc.StatusCode.NOT_FOUND and not msgs,
                  "%s: NOT_FOUND, nothing generated (%s: %s)" %
                  (what, code, det))
    msgs, code, det = c.gen(prompt="a", previous_response_id=id1,
                            session_id="g-a", sampling=dict(SAMPLING))
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and not msgs,
              "previous_response_id with a prompt (not a chat): "
              "INVALID_ARGUMENT (%s: %s)" % (code, det))
    r = turn(c, "store=false continuing", session_id="g-a", store=False,
             previous_response_id=id1, messages=[user(c, "Quietly.")])
    chk.check(r is not None and r[2].response_id == "",
              "store=false with previous_response_id: nothing stored")


def http_post(d, body, session):
    h = dict(tg.AUTH_HTTP)
    h["Content-Type"] = "application/json"
    h["X-Session-Id"] = session
    st, _, data = du.http("POST", d.base_url + "/v1/responses",
                          json.dumps(body).encode(), h, timeout=120)
    return st, du.json_of(data)


def http_get(d, path, session):
    h = dict(tg.AUTH_HTTP)
    h["X-Session-Id"] = session
    st, _, data = du.http("GET", d.base_url + path, None, h)
    return st, du.json_of(data)


def t_shared(c, grpc, d, t1, t2, t3):
    """The newest turn is continued: the multi-turn cache keeps one entry
    per conversation, which a turn continuing an older one (a fork) takes
    over."""
    id1, id2, id3 = (t[2].response_id for t in (t1, t2, t3))
    st, o = http_get(d, "/v1/responses/" + id1, "g-a")
    out = (o or {}).get("output") or [{}]
    chk.check(st == 200 and o["id"] == id1 and
              out[0].get("type") == "message" and
              out[0]["content"][0]["text"] == t1[1],
              "HTTP retrieves a gRPC-stored response (its output text)",
              (st, o))
    st, li = http_get(d, "/v1/responses/%s/input_items?order=asc" % id2,
                      "g-a")
    data = (li or {}).get("data") or []
    chk.check(st == 200 and len(data) == 3 and
              data[0].get("role") == "user" and
              data[1].get("role") == "assistant" and
              data[2]["content"][0]["text"] == "Go on.",
              "input_items lists the gRPC conversation as items", (st, li))
    st, o = http_get(d, "/v1/responses/" + id1, "g-b")
    chk.check(st == 404, "another session cannot retrieve it over HTTP", st)
    u3 = t3[2].usage
    st, h3 = http_post(d, {"input": "Next.", "previous_response_id": id3,
                           "max_output_tokens": 4, "temperature": 0}, "g-a")
    chk.check(st == 200 and
              h3["usage"]["input_tokens_details"]["cached_tokens"] ==
              u3.prompt_tokens + u3.completion_tokens - 1,
              "HTTP continues a gRPC-stored response, its KV reused whole",
              (st, h3))
    if st != 200:
        return
    hu = h3["usage"]
    t4 = turn(c, "gRPC continuing an HTTP-stored response", session_id="g-a",
              previous_response_id=h3["id"], messages=[user(c, "Finish.")])
    chk.check(t4 is not None and t4[2].usage.cached_prompt_tokens ==
              hu["input_tokens"] + hu["output_tokens"] - 1,
              "gRPC continues an HTTP-stored response, its KV reused whole",
              t4 and t4[2].usage)


def main():
    missing = du.missing_inputs(
        modules=[("grpc", "python3-grpcio"),
                 ("google.protobuf", "python3-protobuf")],
        tools=["protoc"])
    if missing:
        return du.fail_missing(missing)
    import grpc
    work = du.scratch_dir("tgdgrpcresp")
    c = None
    try:
        mods, why = tg.load_protos(work)
        if mods is None:
            chk.check(False, "generate the Python protobuf modules", why)
            return chk.summary()
        pb, hpb = mods
        model = du.make_model(os.path.join(work, "model"))
        d = du.Daemon(model, work,
                      ["--responses-db", os.path.join(work, "resp.db")],
                      api_key=tg.KEY)
        with d:
            if chk.check(d.start(), "tangramd starts",
                         d.log_since_start()[-2000:]):
                c = tg.Client(grpc, pb, hpb, d.grpc_target)
                m0 = du.fetch_metrics(d.base_url, tg.AUTH_HTTP) or {}
                turns = t_continue(c, grpc)
                if turns is not None:
                    t_shared(c, grpc, d, *turns)
                    t_errors(c, grpc, turns[0][2].response_id)
                m1 = du.fetch_metrics(d.base_url, tg.AUTH_HTTP) or {}
                a = du.metric(m0, "tangram_responses_stored_total") or 0
                b = du.metric(m1, "tangram_responses_stored_total")
                # turns 1, 2, 3, the HTTP turn and the gRPC turn after it
                chk.check(b is not None and b - a == 5,
                          "tangram_responses_stored_total counts the "
                          "stored turns (%s -> %s)" % (a, b))
                d.check_alive(chk)
                d.print_log_tail(chk)
                c.ch.close()
                c = None
                d.stop_checked(chk)
    finally:
        if c is not None:
            c.ch.close()
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
