#!/usr/bin/python3
"""The Responses API of the real tangramd on the tiny model (docs/API.md
"Responses"), with an API key and --responses-db:

- POST /v1/responses with a string input: a Response object (id resp_ +
  32 hex digits, status, a message item with output_text, usage with
  input_tokens_details.cached_tokens); items input with instructions;
  text.format json_schema constrains the output (it parses and matches);
  store false leaves nothing to retrieve; errors: an unknown
  previous_response_id (404 previous_response_not_found), an input of the
  wrong type, an item type not served (400 naming the field).
- Continuation: previous_response_id continues the stored token ids, so
  the second turn's prompt reuses the whole first turn from the KV cache
  (cached_tokens = the first turn's prompt + output less the last token,
  which was never fed back), and the third turn the second's.
- Retrieve returns the stored object; input_items lists the conversation
  (desc by default; order asc, limit and after page it); DELETE, then
  404 for retrieve, input_items, delete and continuing.
- Scope: a response stored under one session (X-Session-Id) is 404 for
  another session (retrieve, input_items, continue, delete) and still there
  for its own; without the key, 401.
- Streaming: the event sequence (response.created, response.in_progress,
  output_item.added, content_part.added, output_text.delta ..., .done,
  content_part.done, output_item.done, response.completed or
  response.incomplete), sequence_number 0, 1, 2 ...; the deltas join into
  the final text; the streamed response is retrievable.
- Reasoning: a thought (held to a think section by a regex constraint on
  the tiny model, whose template is Qwen3's) is a reasoning item before the
  message, whole and streamed (reasoning_text events); continued, its ids
  are kept.
- A streaming client that disconnects cancels the generation (nothing
  runs on, far fewer tokens than asked, nothing stored).
- A function tool round trip: tool_choice naming the function gives a
  function_call item (call_id, name, arguments JSON); its
  function_call_output continues the conversation; streamed, the call comes
  as function_call_arguments.delta / .done.
- --responses-rerender: a continuation re-renders the history (a prompt of
  chat-template text, still served).
- Durability: the router SIGKILLed between two turns (the supervisor starts
  a new one, which reads the database back): the next turn continues the
  conversation, the earlier response is retrievable.
- The official OpenAI Node client, unchanged (clients/openai_responses.mjs):
  responses.create, a second turn, responses.stream with finalResponse,
  retrieve, inputItems.list through its cursor pages, delete, a function
  tool round trip and responses.parse with zodTextFormat.
- The AI SDK's OpenAI provider (clients/ai_sdk_responses.mjs: generateText,
  streamText, a tool round trip whose call goes back as an item_reference,
  generateObject) and the OpenAI Agents SDK (clients/agents_responses.mjs:
  an agent calling a function tool, then a run continued by
  previousResponseId) and LangChain's ChatOpenAI with useResponsesApi
  (clients/langchain_responses.mjs: invoke, stream, a bound tool and its
  result), unchanged.
- Metrics: tangram_responses_stored_total, _lookups_total{result} count
  what the test did.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

KEY = "sk-responses-test"
MODEL = None
chk = du.Checker()


def post(d, body, session=None, key=KEY, timeout=120):
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Authorization"] = "Bearer " + key
    if session is not None:
        h["X-Session-Id"] = session
    st, _, data = du.http("POST", d.base_url + "/v1/responses",
                          json.dumps(body).encode(), h, timeout=timeout)
    return st, data


def get(d, path, session=None, method="GET", key=KEY):
    h = {"Authorization": "Bearer " + key} if key is not None else {}
    if session is not None:
        h["X-Session-Id"] = session
    st, _, data = du.http(method, d.base_url + path, None, h)
    return st, du.json_of(data)


def text_of(resp):
    out = []
    for it in resp.get("output", []):
        if it.get("type") == "message":
            for p in it.get("content", []):
                if p.get("type") == "output_text":
                    out.append(p["text"])
    return "".join(out)


def create(d, body, what, session=None):
    st, data = post(d, body, session)
    j = du.json_of(data)
    ok = chk.check(st == 200 and isinstance(j, dict) and
                   j.get("object") == "response", what, (st, data[:600]))
    return j if ok else None


def check_basic(d):
    j = create(d, {"model": MODEL, "input": "Say hello.",
                   "max_output_tokens": 8, "temperature": 0}, "create: 200")
    if j is None:
        return
    chk.check(re.fullmatch(r"resp_[0-9a-f]{32}", j["id"]) is not None,
              "create: id is resp_ + 32 hex digits", j["id"])
    chk.check(j["status"] in ("completed", "incomplete") and
              j["output"][0]["type"] == "message" and
              j["output"][0]["role"] == "assistant" and
              j["output"][0]["content"][0]["type"] == "output_text",
              "create: a message item with output_text", j)
    u = j.get("usage") or {}
    chk.check(u.get("output_tokens") == 8 and u.get("input_tokens", 0) > 0
              and "cached_tokens" in u.get("input_tokens_details", {}) and
              u.get("total_tokens") == u["input_tokens"] + 8,
              "create: usage with input_tokens_details.cached_tokens", u)
    chk.check(j["status"] == "incomplete" and
              j["incomplete_details"] == {"reason": "max_output_tokens"},
              "create: 8 tokens of 8 is incomplete (max_output_tokens)", j)
    st, g = get(d, "/v1/responses/" + j["id"])
    chk.check(st == 200 and g == j, "retrieve: the stored object", (st, g))

    j = create(d, {"input": [
        {"role": "user", "content": [{"type": "input_text",
                                      "text": "Answer yes or no."}]}],
        "instructions": "You are terse.", "metadata": {"k": "v"},
        "max_output_tokens": 40, "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "yn", "strict": True,
                            "schema": {"type": "object", "properties": {
                                "answer": {"type": "string",
                                           "enum": ["yes", "no"]}},
                                "required": ["answer"],
                                "additionalProperties": False}}}},
        "create: items, instructions, metadata, json_schema")
    if j is not None:
        ans = du.json_of(text_of(j))
        chk.check(isinstance(ans, dict) and ans.get("answer") in ("yes", "no"),
                  "text.format json_schema: the output matches the schema",
                  text_of(j))
        chk.check(j["instructions"] == "You are terse." and
                  j["metadata"] == {"k": "v"} and
                  j["text"]["format"]["type"] == "json_schema",
                  "create: instructions, metadata and text echoed", j)

    # A body over the inline bound (16 KiB) is parsed on the thread pool.
    big = " ".join("word%d" % (i % 50) for i in range(3000))
    j = create(d, {"input": big, "max_output_tokens": 2,
                   "instructions": "Summarize."}, "a 21 KB body: 200")
    if j is not None:
        j2 = create(d, {"input": big, "previous_response_id": j["id"],
                        "instructions": "Summarize.",
                        "max_output_tokens": 2},
                    "a 21 KB continuation of a 21 KB turn: 200")
        chk.check(j2 is not None and
                  j2["usage"]["input_tokens_details"]["cached_tokens"] ==
                  j["usage"]["input_tokens"] +
                  j["usage"]["output_tokens"] - 1,
                  "the large continuation reuses the large turn", j2)
    st, data = post(d, {"input": big * 6, "max_output_tokens": 2})
    e = du.json_of(data)
    chk.check(st == 400 and du.is_openai_error(e) and
              e["error"]["code"] == "context_length_exceeded" and
              e["error"]["param"] == "input",
              "an input over the context: 400 context_length_exceeded "
              "naming input", (st, data[:300]))
    j = create(d, {"input": "not kept", "store": False,
                   "max_output_tokens": 2}, "store false: 200")
    if j is not None:
        st, e = get(d, "/v1/responses/" + j["id"])
        chk.check(st == 404 and du.is_openai_error(e),
                  "store false: retrieve 404", (st, e))
    st, data = post(d, {"input": "x", "previous_response_id":
                        "resp_" + "0" * 32})
    e = du.json_of(data)
    chk.check(st == 404 and du.is_openai_error(e) and
              e["error"]["code"] == "previous_response_not_found" and
              e["error"]["param"] == "previous_response_id",
              "unknown previous_response_id: 404 previous_response_not_found",
              (st, data))
    st, data = post(d, {"input": 5})
    e = du.json_of(data)
    chk.check(st == 400 and du.is_openai_error(e) and
              e["error"]["param"] == "input", "input 5: 400 naming input",
              (st, data))
    st, data = post(d, {"input": [{"type": "input_image", "image_url": "x"}]})
    e = du.json_of(data)
    chk.check(st == 400 and du.is_openai_error(e) and
              e["error"]["param"] == "input[0].type",
              "an image item: 400 naming input[0].type", (st, data))
    for field, value in (("include", ["message.output_text.logprobs"]),
                         ("top_logprobs", 3), ("background", True)):
        st, data = post(d, {"input": "x", field: value})
        e = du.json_of(data)
        chk.check(st == 400 and du.is_openai_error(e) and
                  e["error"]["param"] == field,
                  "%s (not served): 400 naming it, not ignored" % field,
                  (st, data))
    st, data = post(d, {"input": "x"}, key=None)
    chk.check(st == 401, "no API key: 401", (st, data[:200]))


def check_continuation(d):
    s = "conv-a"
    r1 = create(d, {"input": "Tell me a story.", "max_output_tokens": 6,
                    "temperature": 0}, "turn 1", session=s)
    if r1 is None:
        return
    r2 = create(d, {"input": "Go on.", "previous_response_id": r1["id"],
                    "max_output_tokens": 6, "temperature": 0}, "turn 2",
                session=s)
    if r2 is None:
        return
    u1, u2 = r1["usage"], r2["usage"]
    reused = u1["input_tokens"] + u1["output_tokens"] - 1
    chk.check(r2["previous_response_id"] == r1["id"],
              "turn 2 names its previous response", r2)
    chk.check(u2["input_tokens"] > u1["input_tokens"] + u1["output_tokens"],
              "turn 2's prompt holds turn 1's prompt and output and more",
              (u1, u2))
    chk.check(u2["input_tokens_details"]["cached_tokens"] == reused,
              "turn 2 reuses turn 1's KV whole (cached_tokens = prompt + "
              "output - 1 = %d)" % reused, u2)
    r3 = create(d, {"input": "And then?", "previous_response_id": r2["id"],
                    "max_output_tokens": 4, "temperature": 0}, "turn 3",
                session=s)
    if r3 is not None:
        chk.check(r3["usage"]["input_tokens_details"]["cached_tokens"] ==
                  u2["input_tokens"] + u2["output_tokens"] - 1,
                  "turn 3 reuses turn 2's KV whole", r3["usage"])
    # The conversation's items, newest first by default.
    st, li = get(d, "/v1/responses/%s/input_items" % r2["id"], s)
    ids = [it.get("id") for it in (li or {}).get("data", [])]
    chk.check(st == 200 and li["object"] == "list" and len(ids) == 3 and
              li["data"][0]["role"] == "user" and
              li["data"][1]["id"] == r1["output"][0]["id"] and
              li["has_more"] is False and li["first_id"] == ids[0],
              "input_items: turn 2's input, turn 1's output and input (desc)",
              li)
    st, la = get(d, "/v1/responses/%s/input_items?order=asc&limit=2" %
                 r2["id"], s)
    st2, lb = get(d, "/v1/responses/%s/input_items?order=asc&limit=2&"
                  "after=%s" % (r2["id"], (la or {}).get("last_id")), s)
    chk.check(st == 200 and st2 == 200 and la["has_more"] is True and
              [x["id"] for x in la["data"] + lb["data"]] == ids[::-1] and
              lb["has_more"] is False,
              "input_items: order=asc, limit and after page it", (la, lb))
    # An item_reference names an output item of a stored response of the
    # same scope.
    ref = {"input": [{"type": "item_reference", "id": r2["output"][0]["id"]},
                     {"role": "user", "content": "Quote it."}],
           "max_output_tokens": 2, "temperature": 0}
    r4 = create(d, ref, "item_reference: 200", session=s)
    if r4 is not None:
        st, li = get(d, "/v1/responses/%s/input_items?order=asc" % r4["id"],
                     s)
        chk.check(st == 200 and li["data"][0] == r2["output"][0],
                  "item_reference: resolved to the stored output item", li)
    st, data = post(d, ref, "conv-b")
    e = du.json_of(data)
    chk.check(st == 404 and du.is_openai_error(e) and
              e["error"]["param"] == "input[0].id",
              "item_reference of another session: 404", (st, data))
    # Another scope sees nothing of it.
    for path, what in (("/v1/responses/" + r1["id"], "retrieve"),
                       ("/v1/responses/%s/input_items" % r1["id"],
                        "input_items")):
        st, e = get(d, path, "conv-b")
        chk.check(st == 404 and du.is_openai_error(e) and
                  r1["output"][0]["id"] not in json.dumps(e),
                  "another session: %s 404, no content" % what, (st, e))
    st, data = post(d, {"input": "steal", "previous_response_id": r1["id"]},
                    "conv-b")
    chk.check(st == 404, "another session cannot continue it: 404", st)
    st, e = get(d, "/v1/responses/" + r1["id"], "conv-b", "DELETE")
    chk.check(st == 404, "another session cannot delete it: 404", st)
    st, e = get(d, "/v1/responses/" + r1["id"])
    chk.check(st == 404, "no session is another scope too: 404", st)
    st, g = get(d, "/v1/responses/" + r1["id"], s)
    chk.check(st == 200 and g["id"] == r1["id"],
              "its own session still retrieves it", st)
    # Delete.
    st, dl = get(d, "/v1/responses/" + r1["id"], s, "DELETE")
    chk.check(st == 200 and dl == {"id": r1["id"], "object": "response",
                                   "deleted": True}, "delete: 200", (st, dl))
    for path, m in (("/v1/responses/" + r1["id"], "GET"),
                    ("/v1/responses/%s/input_items" % r1["id"], "GET"),
                    ("/v1/responses/" + r1["id"], "DELETE")):
        st, e = get(d, path, s, m)
        chk.check(st == 404 and du.is_openai_error(e),
                  "deleted: %s %s 404" % (m, path.split("/")[-1]), (st, e))
    st, data = post(d, {"input": "x", "previous_response_id": r1["id"]}, s)
    chk.check(st == 404, "deleted: continuing it 404", st)
    # The later turn keeps its own copy of the conversation.
    st, g = get(d, "/v1/responses/" + r2["id"], s)
    chk.check(st == 200, "deleting turn 1 leaves turn 2", st)


def events_of(data):
    """(types, payloads, problems) of a Responses event stream."""
    types, payloads, problems = [], [], []
    for block in data.decode("utf-8", "replace").split("\n\n"):
        if not block.strip():
            continue
        ev, dat = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                dat = du.json_of(line[6:])
            else:
                problems.append(line)
        if ev is None or not isinstance(dat, dict) or dat.get("type") != ev:
            problems.append(block[:200])
            continue
        types.append(ev)
        payloads.append(dat)
    return types, payloads, problems


def check_stream(d):
    st, data = post(d, {"input": "Stream a line.", "stream": True,
                        "max_output_tokens": 8, "temperature": 0})
    types, ps, problems = events_of(data)
    chk.check(st == 200 and not problems, "stream: 200, well-formed events",
              (st, problems[:3]))
    want = ["response.created", "response.in_progress",
            "response.output_item.added", "response.content_part.added"]
    chk.check(types[:4] == want and
              types[-4:] == ["response.output_text.done",
                             "response.content_part.done",
                             "response.output_item.done",
                             "response.incomplete"] and
              all(t == "response.output_text.delta" for t in types[4:-4]) and
              len(types) > 8, "stream: the event sequence", types)
    chk.check([p["sequence_number"] for p in ps] == list(range(len(ps))),
              "stream: sequence_number 0, 1, 2 ...", None)
    if not ps:
        return
    final = ps[-1]["response"]
    deltas = "".join(p["delta"] for p in ps
                     if p["type"] == "response.output_text.delta")
    chk.check(text_of(final) == deltas and
              ps[-4]["text"] == deltas and
              final["usage"]["output_tokens"] == 8,
              "stream: the deltas join into the final text", final)
    st, g = get(d, "/v1/responses/" + final["id"])
    chk.check(st == 200 and g == final, "stream: the streamed response is "
              "stored", (st, g))


def check_reasoning(d):
    """A thinking template's thought (the tiny model's is Qwen3's): held to
    a think section by a regex constraint, reported as a reasoning item
    before the message, whole and streamed."""
    body = {"input": "Think first.", "max_output_tokens": 40,
            "temperature": 0, "structured_outputs": {
                "regex": "<think>\n[a-z]{3}\n</think>\n\nhi"}}
    j = create(d, body, "reasoning: 200")
    if j is None:
        return
    out = j["output"]
    chk.check(len(out) == 2 and out[0]["type"] == "reasoning" and
              out[0]["id"].startswith("rs_") and
              re.fullmatch(r"[a-z]{3}", out[0]["content"][0]["text"]) and
              out[0]["content"][0]["type"] == "reasoning_text" and
              text_of(j) == "hi",
              "reasoning: a reasoning item, then the answer", out)
    st, data = post(d, dict(body, stream=True))
    types, ps, problems = events_of(data)
    final = ps[-1]["response"] if ps else {}
    rdeltas = "".join(p["delta"] for p in ps
                      if p["type"] == "response.reasoning_text.delta")
    chk.check(st == 200 and not problems and
              types[2:4] == ["response.output_item.added",
                             "response.content_part.added"] and
              "response.reasoning_text.done" in types and
              rdeltas.strip("\n") == out[0]["content"][0]["text"] and
              [o["type"] for o in final.get("output", [])] ==
              ["reasoning", "message"] and
              final["output"][0]["content"] == out[0]["content"] and
              text_of(final) == "hi",
              "reasoning: streamed as reasoning_text events, the same items",
              (types, final))
    j2 = create(d, {"input": "Again.", "previous_response_id": j["id"],
                    "max_output_tokens": 2}, "reasoning: a continuation")
    if j2 is not None:
        chk.check(j2["usage"]["input_tokens_details"]["cached_tokens"] ==
                  j["usage"]["input_tokens"] + j["usage"]["output_tokens"] -
                  1, "reasoning: the continuation keeps the thought's ids",
                  j2["usage"])


def check_disconnect(d):
    """A streaming client that leaves cancels the generation: nothing runs
    on, far fewer tokens than asked are generated, nothing is stored."""
    def gen_tokens():
        m = du.fetch_metrics(d.base_url, {"Authorization": "Bearer " + KEY})
        return du.metric(m or {}, "tangram_generation_tokens_total")
    before = gen_tokens()
    body = json.dumps({"input": "Go on forever.", "stream": True,
                       "max_output_tokens": 20000, "ignore_eos": True,
                       "temperature": 0}).encode()
    head = ("POST /v1/responses HTTP/1.1\r\nHost: x\r\n"
            "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (KEY, len(body))).encode()
    s = socket.create_connection(("127.0.0.1", d.http_port), timeout=30)
    s.sendall(head + body)
    got = b""
    while got.count(b"response.output_text.delta") < 2:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    m = re.search(rb'"id":"(resp_[0-9a-f]{32})"', got)
    # Ended within 120 s (a bound for a loaded machine only: 20000 tokens
    # would take minutes here).
    def idle():
        ms = du.fetch_metrics(d.base_url, {"Authorization": "Bearer " + KEY})
        return du.metric(ms or {}, "tangram_num_requests_running") == 0
    chk.check(du.wait_for(idle, 120), "disconnect: nothing runs on", None)
    after = gen_tokens()
    chk.check(before is not None and after is not None and
              after - before < 20000,
              "disconnect: the generation was cut (%s tokens)" %
              (None if after is None or before is None else after - before))
    if chk.check(m is not None, "disconnect: the stream named its response",
                 got[:300]):
        st, e = get(d, "/v1/responses/" + m.group(1).decode())
        chk.check(st == 404, "disconnect: the cut response is not stored",
                  (st, e))


TOOLS = [{"type": "function", "name": "get_weather",
          "description": "Get the weather in a city.",
          "parameters": {"type": "object",
                         "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]


def check_tools(d):
    body = {"input": "Weather in Paris?", "tools": TOOLS,
            "tool_choice": {"type": "function", "name": "get_weather"},
            "max_output_tokens": 60, "temperature": 0}
    j = create(d, body, "tools: a forced call")
    if j is None:
        return
    calls = [o for o in j["output"] if o["type"] == "function_call"]
    ok = chk.check(len(calls) >= 1 and calls[0]["name"] == "get_weather" and
                   isinstance(du.json_of(calls[0]["arguments"]), dict) and
                   calls[0]["call_id"].startswith("call_") and
                   calls[0]["id"].startswith("fc_"),
                   "tools: a function_call item", j["output"])
    if not ok:
        return
    j2 = create(d, {"input": [{"type": "function_call_output",
                               "call_id": calls[0]["call_id"],
                               "output": "21 C, sunny"}],
                    "previous_response_id": j["id"], "tools": TOOLS,
                    "max_output_tokens": 6, "temperature": 0},
                "tools: the call's output continues the conversation")
    if j2 is not None:
        chk.check(j2["usage"]["input_tokens_details"]["cached_tokens"] ==
                  j["usage"]["input_tokens"] + j["usage"]["output_tokens"] -
                  1, "tools: the turn with the output reuses the call's KV",
                  j2["usage"])
    st, data = post(d, dict(body, stream=True))
    types, ps, problems = events_of(data)
    args = [p for p in ps if p["type"] ==
            "response.function_call_arguments.done"]
    chk.check(st == 200 and not problems and
              "response.function_call_arguments.delta" in types and
              len(args) >= 1 and args[0]["arguments"] ==
              calls[0]["arguments"] and types[-1] in
              ("response.completed", "response.incomplete"),
              "tools: streamed, the call's arguments delta/done equal the "
              "whole one", (types, args))


def check_node(d):
    """The official OpenAI Node client (clients/openai_responses.mjs)."""
    root, why = du.node_clients(["openai_responses.mjs"])
    if not chk.check(root is not None, "the OpenAI Node client is available",
                     why):
        return
    r = subprocess.run(["node", os.path.join(root, "openai_responses.mjs"),
                        d.base_url + "/v1", MODEL], capture_output=True,
                       text=True, timeout=300, cwd=root,
                       env=dict(os.environ, OPENAI_API_KEY=KEY))
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not chk.check(r.returncode == 0 and isinstance(j, dict),
                     "node: every Responses call returned",
                     r.stdout[-1500:] + r.stderr[-1500:]):
        return
    c, t2 = j["create"], j["turn2"]
    chk.check(c["id"].startswith("resp_") and c["status"] == "incomplete" and
              c["client_output_text"] == c["output_text"] != "",
              "node: responses.create, output_text", c)
    chk.check(t2["previous_response_id"] == c["id"] and
              t2["usage"]["input_tokens_details"]["cached_tokens"] ==
              c["usage"]["input_tokens"] + c["usage"]["output_tokens"] - 1,
              "node: previous_response_id reuses the first turn's KV",
              t2["usage"])
    s = j["stream"]
    chk.check(s["types"][0] == "response.created" and
              s["types"][-1] == "response.incomplete" and
              s["final"]["output_text"] == s["deltas"] != "",
              "node: responses.stream and finalResponse", s)
    chk.check(j["retrieve"]["output"] == t2["output"] and
              j["retrieve"]["usage"] == t2["usage"] and
              j["retrieve"]["id"] == t2["id"], "node: responses.retrieve",
              (j["retrieve"], t2))
    items = j["input_items"]
    chk.check(len(items) == 3 and [i["role"] for i in items] ==
              ["user", "assistant", "user"][::-1] and
              items[1]["id"] == c["output"][0]["id"],
              "node: inputItems.list pages through the conversation (limit "
              "1, newest first)", items)
    chk.check(j["after_delete"]["status"] == 404,
              "node: responses.delete, then retrieve 404", j["after_delete"])
    call = j.get("tool_call") or {}
    chk.check(call.get("type") == "function_call" and
              call.get("name") == "get_weather" and
              isinstance(du.json_of(call.get("arguments", "")), dict),
              "node: a function_call item", call)
    tr = j.get("tool_result") or {}
    chk.check(tr.get("status") in ("completed", "incomplete") and
              tr.get("previous_response_id") is not None,
              "node: the function_call_output turn", tr)
    p = j["parse"]
    chk.check(p["status"] == "completed" and
              (p["output_parsed"] or {}).get("answer") in ("yes", "no"),
              "node: responses.parse with zodTextFormat", p)


def run_node(d, script, what):
    root, why = du.node_clients([script])
    if not chk.check(root is not None, "%s: the Node clients are available"
                     % what, why):
        return None
    r = subprocess.run(["node", os.path.join(root, script),
                        d.base_url + "/v1", MODEL], capture_output=True,
                       text=True, timeout=300, cwd=root,
                       env=dict(os.environ, OPENAI_API_KEY=KEY))
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not chk.check(r.returncode == 0 and isinstance(j, dict),
                     "%s: every call returned" % what,
                     r.stdout[-1500:] + r.stderr[-1500:]):
        return None
    return j


def check_ai_sdk(d):
    """The AI SDK's OpenAI provider (clients/ai_sdk_responses.mjs)."""
    j = run_node(d, "ai_sdk_responses.mjs", "AI SDK")
    if j is None:
        return
    g = j["generate"]
    chk.check(g["text"] != "" and g["finishReason"] == "length" and
              g["usage"]["outputTokens"] == 6 and
              g["responseId"].startswith("resp_"),
              "AI SDK: generateText", g)
    s = j["stream"]
    chk.check(s["deltas"] == s["text"] != "" and s["finishReason"] == "length",
              "AI SDK: streamText", s)
    t = j["tool"]
    chk.check(t["finishReason"] == "tool-calls" and
              t["toolCalls"][0]["name"] == "get_weather" and
              len(t["toolResults"]) == len(t["toolCalls"]),
              "AI SDK: a tool called and executed", t)
    tr = j["tool_result"]
    chk.check(tr["text"] != "" and tr["usage"]["inputTokens"] > 0,
              "AI SDK: the tool's result sent back (the call as an "
              "item_reference to the stored output)", tr)
    chk.check(j["object"].get("answer") in ("yes", "no"),
              "AI SDK: generateObject with a zod schema", j["object"])


def check_agents(d):
    """The OpenAI Agents SDK (clients/agents_responses.mjs)."""
    j = run_node(d, "agents_responses.mjs", "Agents SDK")
    if j is None:
        return
    r = j["run"]
    chk.check(len(r["calls"]) >= 1 and "tool_call_item" in r["items"] and
              "tool_call_output_item" in r["items"] and
              r["items"][-1] == "message_output_item" and
              isinstance(r["finalOutput"], str) and
              r["lastResponseId"].startswith("resp_"),
              "Agents SDK: an agent calls its function tool and answers", r)
    r2 = j["run2"]
    chk.check(isinstance(r2["finalOutput"], str) and
              r2["lastResponseId"] != r["lastResponseId"],
              "Agents SDK: a second run continues by previousResponseId", r2)


def check_langchain(d):
    """LangChain's ChatOpenAI with useResponsesApi
    (clients/langchain_responses.mjs)."""
    j = run_node(d, "langchain_responses.mjs", "LangChain")
    if j is None:
        return
    chk.check(j["invoke"]["text"] != "" and
              j["invoke"]["usage"]["output_tokens"] == 8,
              "LangChain: invoke", j["invoke"])
    chk.check(j["stream"]["text"] != "", "LangChain: stream", j["stream"])
    tc = j.get("tool_calls") or []
    chk.check(len(tc) >= 1 and tc[0]["name"] == "get_weather" and
              isinstance(tc[0]["args"], dict),
              "LangChain: a bound tool called", tc)
    chk.check((j.get("tool_result") or {}).get("text", "") != "",
              "LangChain: the tool's result sent back", j.get("tool_result"))


def check_metrics(d):
    samples = du.fetch_metrics(
        d.base_url, {"Authorization": "Bearer " + KEY}) or {}
    stored = du.metric(samples, "tangram_responses_stored_total")
    hits = du.metric(samples, "tangram_responses_lookups_total",
                     result="hit")
    misses = du.metric(samples, "tangram_responses_lookups_total",
                       result="miss")
    chk.check(stored is not None and stored >= 8 and hits and hits >= 8 and
              misses and misses >= 8,
              "metrics: stored, hits and misses counted",
              (stored, hits, misses))


def check_rerender(model, work):
    d = du.Daemon(model, work, ["--responses-rerender"], api_key=KEY)
    with d:
        if not chk.check(d.start(), "a daemon with --responses-rerender "
                         "starts", d.log_since_start()[-2000:]):
            return
        r1 = create(d, {"input": "Tell me a story.", "max_output_tokens": 6,
                        "temperature": 0}, "rerender: turn 1")
        r2 = r1 and create(d, {"input": "Go on.", "previous_response_id":
                               r1["id"], "max_output_tokens": 6,
                               "temperature": 0}, "rerender: turn 2")
        if r2:
            chk.check(r2["usage"]["input_tokens"] >
                      r1["usage"]["input_tokens"],
                      "rerender: turn 2's prompt holds the history",
                      r2["usage"])
        d.stop_checked(chk)


def check_durability(model, work):
    db = os.path.join(work, "responses.db")
    d = du.Daemon(model, work, ["--responses-db", db], api_key=KEY)
    with d:
        if not chk.check(d.start(), "a daemon with --responses-db starts",
                         d.log_since_start()[-2000:]):
            return
        r1 = create(d, {"input": "Remember me.", "max_output_tokens": 5,
                        "temperature": 0}, "durability: turn 1", "dur")
        routers = d.child_pids("router")
        if r1 is None or not chk.check(len(routers) == 1,
                                       "durability: one router", routers):
            return
        os.kill(routers[0], signal.SIGKILL)
        # The supervisor starts a new router (and workers) after a
        # backoff; 120 s only ends a hang on a loaded machine.
        back = du.wait_for(lambda: d.child_pids("router") not in
                           ([], routers) and d.health() == 200, 120)
        if not chk.check(back, "durability: a new router serves after the "
                         "SIGKILL", d.log_since_start()[-2000:]):
            return
        st, g = get(d, "/v1/responses/" + r1["id"], "dur")
        chk.check(st == 200 and g == r1, "durability: turn 1 retrievable "
                  "from the database", (st, g))
        r2 = create(d, {"input": "Still there?", "previous_response_id":
                        r1["id"], "max_output_tokens": 5, "temperature": 0},
                    "durability: turn 2 continues after the crash", "dur")
        if r2:
            chk.check(r2["usage"]["input_tokens"] >
                      r1["usage"]["input_tokens"] +
                      r1["usage"]["output_tokens"],
                      "durability: turn 2's prompt holds turn 1", r2["usage"])
        chk.check("stored responses read back" in d.log_since_start(),
                  "durability: the new router logged the read-back", None)
        d.stop_checked(chk)


def main():
    global MODEL
    missing = du.missing_inputs(tools=["node", "npm"])
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdresp")
    try:
        model = du.make_model(os.path.join(work, "model"))
        d = du.Daemon(model, work, [], api_key=KEY)
        with d:
            if chk.check(d.start(), "tangramd starts",
                         d.log_since_start()[-2000:]):
                st, mj = get(d, "/v1/models")
                MODEL = mj["data"][0]["id"]
                check_basic(d)
                check_continuation(d)
                check_stream(d)
                check_reasoning(d)
                check_disconnect(d)
                check_tools(d)
                check_node(d)
                check_ai_sdk(d)
                check_agents(d)
                check_langchain(d)
                check_metrics(d)
                if chk.failures:
                    d.print_log_tail(chk)
                d.stop_checked(chk)
        check_rerender(model, work)
        check_durability(model, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
