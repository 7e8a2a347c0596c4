#!/usr/bin/python3
"""Tool use through the real tangramd (tiny generated model with the Qwen3
tokenizer and its real chat template, which writes <tool_call> blocks).

Checked over HTTP: the prompt the router renders for chats with tools,
assistant tool calls (content null, arguments as JSON strings), tool
results, content parts, chat_template_kwargs, continue_final_message and
tool_choice "none" is exactly python3-jinja2's rendering of the model's
template (tests/reference/render_jinja.py) after the router's documented
normalization (docs/API.md): /tokenize of the chat equals /tokenize of the
reference text, and a chat completion's usage.prompt_tokens agrees; the
responses of chats with tools have the OpenAI shape, non-streaming and
streaming (deltas are content or tool_calls, the stream ends with [DONE]);
bad tools, tool calls and tool_choice "required" without tools get 400
naming the field (required calls are tested by test_daemon_structured.py).
Then the official OpenAI Node client (npm `openai`) sends chats with tools,
streaming and not (greedy, so both must agree), a conversation with its own
typed tool call and tool result. The
model's weights are random, so what it writes is noise: the parsing of
tool calls out of model output is tested by tests/unit/test_toolcall.c.
Fails, naming them, when node/npm, python3-jinja2 or the daemon are
missing.
"""
import copy
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

KEY = "sk-tangram-tools"
AUTH = {"Authorization": "Bearer " + KEY}
MODEL = "tiny"
chk = du.Checker()

try:
    sys.path.insert(0, os.path.join(du.SOURCE or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", ".."), "tests",
        "reference"))
    import render_jinja  # noqa: E402
except ImportError:
    render_jinja = None

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather of a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web — títulos ✓",
    "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}, "n": {"type": "integer"}}}}}


def post(d, path, body):
    st, _, data = du.http("POST", d.base_url + path, body, AUTH, 60)
    return st, du.json_of(data), data


def normalize(messages):
    """The router's view of OpenAI messages (docs/API.md): developer is
    system, text parts joined with newlines, null content is "", tool-call
    arguments parsed from their JSON string, keys only when given."""
    out = []
    for m in copy.deepcopy(messages):
        n = {"role": "system" if m["role"] == "developer" else m["role"]}
        c = m.get("content")
        if isinstance(c, list):
            c = "\n".join(p["text"] for p in c)
        n["content"] = "" if c is None else c
        for k in ("name", "reasoning_content"):
            if m.get(k) is not None:
                n[k] = m[k]
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                args = tc["function"]["arguments"]
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except ValueError:
                        pass
                calls.append({"id": tc["id"], "type": "function",
                              "function": {"name": tc["function"]["name"],
                                           "arguments": args}})
            n["tool_calls"] = calls
        if m.get("tool_call_id") is not None:
            n["tool_call_id"] = m["tool_call_id"]
        out.append(n)
    return out


CASES = [
    ("tools", {"messages": [{"role": "system", "content": "Be useful."},
                            {"role": "user", "content": "Weather in Paris?"}],
               "tools": [WEATHER, SEARCH]}),
    ("tool call and result", {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {
                    "name": "get_weather",
                    "arguments": "{\"city\": \"Paris\", \"unit\": "
                                 "\"celsius\"}"}},
                {"id": "call_2", "type": "function", "function": {
                    "name": "search", "arguments": "{\"q\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
            {"role": "tool", "tool_call_id": "call_2",
             "content": "[\"a\", \"b\"]"},
            {"role": "assistant", "content": "It is 21 C.",
             "reasoning_content": "The tool said so."},
            {"role": "user", "content": [{"type": "text", "text": "And"},
                                         {"type": "text", "text": "Rome?"}]}],
        "tools": [WEATHER, SEARCH]}),
    ("no tools, thinking off", {
        "messages": [{"role": "developer", "content": "Terse."},
                     {"role": "user", "content": "hi", "name": "ann"}],
        "chat_template_kwargs": {"enable_thinking": False}}),
    ("continue final message", {
        "messages": [{"role": "user", "content": "Count"},
                     {"role": "assistant", "content": "1, 2,"}],
        "add_generation_prompt": False, "continue_final_message": True}),
]


def t_prompts(d, model_dir):
    if render_jinja is None:
        chk.check(False, "python3-jinja2 is installed (the reference)")
        return
    templates, specials = render_jinja.load_dir(model_dir)
    for label, req in CASES:
        body = dict(req, model=MODEL)
        st, tok, raw = post(d, "/tokenize", body)
        if not chk.check(st == 200, f"/tokenize {label}: 200", raw[:300]):
            continue
        tools = req.get("tools")
        kw = dict(specials)
        kw.update(req.get("chat_template_kwargs") or {})
        want = render_jinja.render(
            render_jinja.pick(templates, tools), normalize(req["messages"]),
            add_generation_prompt=req.get("add_generation_prompt", True),
            tools=tools,
            continue_final_message=req.get("continue_final_message", False),
            **kw)
        st, ref, raw = post(d, "/tokenize", {"model": MODEL, "prompt": want,
                                            "add_special_tokens": False})
        chk.check(st == 200 and ref["tokens"] == tok["tokens"],
                  f"{label}: the router's prompt is python3-jinja2's "
                  f"({tok.get('count')} tokens)",
                  (want[:400], tok.get("count"), ref.get("count")))
        if label == "tools":
            # the same prompt on the generation path
            st, j, raw = post(d, "/v1/chat/completions", dict(
                body, max_tokens=4, temperature=0))
            chk.check(st == 200 and j["usage"]["prompt_tokens"] ==
                      tok["count"],
                      "a chat with tools generates from the same prompt",
                      raw[:300])
            # tool_choice "none": the prompt without the tools
            st, j, raw = post(d, "/v1/chat/completions", dict(
                body, max_tokens=4, temperature=0, tool_choice="none"))
            st2, plain, _ = post(d, "/tokenize", {
                "model": MODEL, "messages": req["messages"]})
            chk.check(st == 200 and st2 == 200 and
                      j["usage"]["prompt_tokens"] == plain["count"] <
                      tok["count"],
                      "tool_choice none renders the prompt without tools",
                      raw[:300])


def check_message(m, where):
    ok = m.get("role") == "assistant"
    calls = m.get("tool_calls")
    if calls is not None:
        ok = ok and isinstance(calls, list) and all(
            c.get("type") == "function" and c["id"].startswith("call_") and
            isinstance(c["function"]["arguments"], str) and
            isinstance(json.loads(c["function"]["arguments"]), dict)
            for c in calls)
        ok = ok and (m.get("content") is None or
                     isinstance(m.get("content"), str))
    else:
        ok = ok and isinstance(m.get("content"), str)
    chk.check(ok, f"{where}: the message has the OpenAI shape", m)


def t_responses(d):
    body = {"model": MODEL, "messages": CASES[0][1]["messages"],
            "tools": [WEATHER, SEARCH], "max_tokens": 16, "temperature": 0}
    st, j, raw = post(d, "/v1/chat/completions", body)
    if chk.check(st == 200 and isinstance(j, dict),
                 "chat with tools: 200", raw[:300]):
        ch = j["choices"][0]
        check_message(ch["message"], "chat with tools")
        chk.check(ch["finish_reason"] in ("stop", "length", "tool_calls"),
                  "chat with tools: a finish reason", ch)
    st, _, data = du.http("POST", d.base_url + "/v1/chat/completions",
                          dict(body, stream=True), AUTH, 60)
    payloads, problems = du.sse_events(data)
    chunks = [du.json_of(p) for p in payloads if p != "[DONE]"]
    allowed = {"role", "content", "tool_calls"}
    text = "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if c and c.get("choices"))
    fins = [c["choices"][0]["finish_reason"] for c in chunks
            if c and c.get("choices") and c["choices"][0]["finish_reason"]]
    chk.check(st == 200 and not problems and payloads and
              payloads[-1] == "[DONE]" and all(
                  c and set(c["choices"][0]["delta"]) <= allowed
                  for c in chunks if c.get("choices")) and len(fins) == 1,
              "streamed chat with tools: content / tool_calls deltas, one "
              "finish reason, [DONE]", data[-600:])
    if st == 200 and isinstance(j, dict):
        chk.check(text == (j["choices"][0]["message"]["content"] or "") and
                  fins and fins[0] == j["choices"][0]["finish_reason"],
                  "the stream says what the whole response says",
                  (text, j["choices"][0]))


def t_bad(d):
    msg = [{"role": "user", "content": "x"}]
    cases = [
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
         "tools[0].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function",
                                             "function": {"name": "x"}}},
         "tool_choice.function.name"),
        ({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "f"}}]}]},
         "messages[0].tool_calls[0].function.arguments"),
        ({"messages": [{"role": "tool", "content": "r"}]},
         "messages[0].tool_call_id"),
        ({"chat_template_kwargs": {"tools": []}},
         "chat_template_kwargs.tools"),
    ]
    for extra, param in cases:
        body = dict({"model": MODEL, "messages": msg, "max_tokens": 2}, **extra)
        st, j, raw = post(d, "/v1/chat/completions", body)
        chk.check(st == 400 and j and j["error"]["param"] == param,
                  f"bad request -> 400 naming {param}", raw[:300])


def t_node(d):
    root, why = du.node_clients(["openai_tools.mjs"])
    if root is None:
        chk.check(False, "the OpenAI Node client is available", why)
        return
    r = subprocess.run(["node", os.path.join(root, "openai_tools.mjs"),
                        d.base_url + "/v1", MODEL], capture_output=True,
                       text=True, timeout=120, cwd=root,
                       env=dict(os.environ, OPENAI_API_KEY=KEY))
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not chk.check(r.returncode == 0 and isinstance(j, dict),
                     "node: every tool request returned",
                     r.stdout[-800:] + r.stderr[-800:]):
        return
    check_message(j["chat"]["message"], "node: chat with tools")
    s = j["stream"]
    msg = j["chat"]["message"]
    chk.check(s["first_role"] == "assistant" and
              s["content"] == (msg["content"] or "") and
              len(s["tool_calls"]) == len(msg["tool_calls"] or []) and
              s["finish_reason"] == j["chat"]["finish_reason"] and
              s["usage"]["completion_tokens"] ==
              j["chat"]["usage"]["completion_tokens"],
              "node: the streamed chat with tools equals the whole one",
              (j["chat"], s))
    check_message(j["history"]["message"], "node: tool call and result")
    chk.check(j["history"]["usage"]["prompt_tokens"] >
              j["chat"]["usage"]["prompt_tokens"],
              "node: the tool call and its result are in the prompt",
              j["history"])


def main():
    missing = du.missing_inputs(tools=["node", "npm"])
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdtools")
    d = None
    try:
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, work, ["--max-model-len", "2048",
                                    "--page-size", "16"], api_key=KEY)
        ready = d.start()
        chk.check(ready, "tangramd starts", d.log_text()[-3000:])
        if ready:
            chk.check("tool calls: hermes" in d.log_text(),
                      "the router recognizes the template's tool-call format",
                      d.log_text()[-2000:])
            t_prompts(d, model)
            t_responses(d)
            t_bad(d)
            t_node(d)
    finally:
        if d is not None:
            rc, left = d.stop()
            chk.check(rc == 0, "tangramd exits 0 on SIGTERM (rc %s)" % rc)
            san = d.sanitizer_reports()
            chk.check(not san, "no sanitizer report in the daemon's log",
                      "\n".join(san[:10]))
            if chk.failures:
                print("---- tangramd log (tail) ----")
                print(d.log_text()[-4000:])
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
