#!/usr/bin/python3
"""Structured outputs through the real tangramd (DESIGN.md §4.11).

The tiny generated model has random weights, so whatever it would write is
noise; the token mask alone makes the output valid. Checked over HTTP
(CPU backend, the Qwen3 tokenizer):

- response_format json_schema for every schema of the engine's corpus
  (tests/grammar/schemas.json, 40 schemas: nested objects, arrays, enums,
  anyOf/oneOf, $ref): each output validates against its schema with an
  independent validator (Debian python3-jsonschema) and ends with
  finish_reason "stop". The requests run in parallel beside unconstrained
  ones (a mixed batch): those give exactly the text they give alone.
  A logit bias toward closing tokens (quotes, brackets, EOS) keeps the
  random model's documents short: the mask still decides what is allowed.
- json_object outputs parse as JSON objects; streaming gives the same text
  as the whole response (greedy);
- logprobs of a constrained request name only tokens the constraint
  allows at that point;
- 400 naming an unsupported keyword, a too-deep and a too-large schema;
- max_tokens too small for any document: finish_reason "length";
- strict tools under tool_choice "auto": text is free, each call the
  model starts (<tool_call> forced by a logit bias) validates, streaming
  gives the same calls, n = 2 too;
- preemption: two long constrained requests sharing a pool too small for
  both are preempted and recomputed (the worker's matcher replays the
  tokens generated before), and both outputs still validate.

Fails, naming them, when the daemon or python3-jsonschema are missing.
"""
import json
import os
import shutil
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402
from test_grammar_walk import strict_json, validator_for  # noqa: E402

MODEL = "tiny"
chk = du.Checker()
CORPUS = os.path.join(du.SOURCE or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", ".."),
    "tests", "grammar", "schemas.json")
# Biases toward ending: a quote closes a string (or opens an empty one)
# before a bracket, which is also a string's character; EOS ends the
# output as soon as the document may end.
CLOSERS = {'"': 100, '}': 50, ']': 50, "<|im_end|>": 100,
           "<|endoftext|>": 100}
EOS_TEXT = ["<|im_end|>", "<|endoftext|>"]


def post(d, path, body, timeout=300):
    st, _, data = du.http("POST", d.base_url + path, body, None, timeout)
    return st, du.json_of(data), data


def bias_of(d, weights):
    """{id: bias} for each text of weights that is one token."""
    out = {}
    for t, w in weights.items():
        st, doc, _ = post(d, "/tokenize", {"prompt": t,
                                           "add_special_tokens": False})
        if st == 200 and doc.get("count") == 1:
            out[str(doc["tokens"][0])] = w
    return out


def chat(schema_or_format, bias=None, **extra):
    fmt = schema_or_format
    if not isinstance(fmt, dict) or fmt.get("type") not in (
            "json_object", "json_schema", "text"):
        fmt = {"type": "json_schema",
               "json_schema": {"name": "out", "schema": fmt, "strict": True}}
    body = {"model": MODEL, "temperature": 0, "max_tokens": 400,
            "messages": [{"role": "user", "content": "Answer in JSON."}],
            "response_format": fmt}
    if bias:
        body["logit_bias"] = bias
    body.update(extra)
    return body


def content_of(doc):
    try:
        c = doc["choices"][0]
        return c["message"]["content"], c["finish_reason"]
    except (KeyError, IndexError, TypeError):
        return None, None


def run_parallel(d, bodies):
    out = [None] * len(bodies)

    def one(i):
        out[i] = post(d, "/v1/chat/completions", bodies[i])
    th = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return out


def t_corpus(d, jsonschema, bias):
    corpus = json.load(open(CORPUS))["schemas"]
    chk.check(len(corpus) >= 30, "the corpus has >= 30 schemas (%d)" %
              len(corpus))
    free = {"model": MODEL, "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": "Tell me a story."}]}
    st, alone, _ = post(d, "/v1/chat/completions", free)
    alone_text, _ = content_of(alone)
    chk.check(st == 200 and alone_text is not None,
              "an unconstrained chat answers 200 (%s)" % st)
    n_ok = 0
    for at in range(0, len(corpus), 8):
        part = corpus[at:at + 8]
        bodies = [chat(c["schema"], bias) for c in part] + [free, free]
        res = run_parallel(d, bodies)
        for c, (st, doc, raw) in zip(part, res[:len(part)]):
            text, fin = content_of(doc)
            if st != 200 or text is None:
                chk.check(False, "schema %s answers 200" % c["name"],
                          raw[:400])
                continue
            good = fin == "stop"
            why = "finish_reason %s" % fin
            if good:
                try:
                    inst = strict_json(text)
                    errs = list(validator_for(jsonschema, c["schema"])
                                .iter_errors(inst))
                    good = not errs
                    why = errs[0].message if errs else ""
                except ValueError as e:
                    good, why = False, "not JSON: %s" % e
            n_ok += good
            chk.check(good, "schema %s: the output validates" % c["name"],
                      "%s: %r" % (why, text[:300]))
        for st, doc, raw in res[len(part):]:
            text, _ = content_of(doc)
            chk.check(st == 200 and text == alone_text,
                      "an unconstrained chat in a mixed batch gives its own "
                      "text", "%r vs %r" % (text, alone_text))
    print("corpus: %d of %d outputs valid" % (n_ok, len(corpus)))


def t_json_object(d, bias):
    body = chat({"type": "json_object"}, bias)
    st, doc, raw = post(d, "/v1/chat/completions", body)
    text, fin = content_of(doc)
    try:
        obj = strict_json(text) if text is not None else None
    except ValueError:
        obj = None
    chk.check(st == 200 and fin == "stop" and isinstance(obj, dict),
              "json_object: the output is a JSON object", raw[:400])
    # Streaming gives the same text (greedy).
    sbody = dict(body, stream=True)
    st, _, raw = du.http("POST", d.base_url + "/v1/chat/completions", sbody,
                         None, 300)
    events, _ = du.sse_events(raw)
    parts, sfin = [], None
    for ev in events:
        if ev == "[DONE]":
            continue
        try:
            ch = json.loads(ev)["choices"]
        except (ValueError, KeyError):
            continue
        for c in ch:
            parts.append(c.get("delta", {}).get("content") or "")
            sfin = c.get("finish_reason") or sfin
    chk.check(st == 200 and "".join(parts) == text and sfin == fin,
              "json_object: streaming gives the same text and finish",
              "%r vs %r" % ("".join(parts), text))


def t_logprobs(d):
    docs = ['"alpha"', '"beta"', '"gamma delta"']
    schema = {"enum": ["alpha", "beta", "gamma delta"]}
    body = chat(schema, None, logprobs=True, top_logprobs=5, max_tokens=40)
    st, doc, raw = post(d, "/v1/chat/completions", body)
    text, fin = content_of(doc)
    try:
        lp = doc["choices"][0]["logprobs"]["content"]
    except (KeyError, IndexError, TypeError):
        lp = None
    chk.check(st == 200 and fin == "stop" and lp,
              "enum with logprobs answers", raw[:400])
    if not lp:
        return

    def allowed(prefix, tok):
        if tok in EOS_TEXT or tok == "":
            s = prefix.strip(" \t\n")
            return s in docs
        cand = (prefix + tok).lstrip(" \t\n")
        for dd in docs:
            if dd.startswith(cand):
                return True
            if cand.startswith(dd) and cand[len(dd):].strip(" \t\n") == "":
                return True
        return False
    prefix, bad, n_alt = "", [], 0
    for pos in lp:
        for alt in pos.get("top_logprobs", []):
            n_alt += 1
            if not allowed(prefix, alt["token"]) or \
                    alt["logprob"] < -1e30:
                bad.append((prefix, alt["token"], alt["logprob"]))
        prefix += pos["token"]
    chk.check(n_alt > 0 and not bad,
              "logprobs of a constrained request name only allowed tokens "
              "(%d alternatives)" % n_alt, repr(bad[:5]))
    chk.check(strict_json(text) in ["alpha", "beta", "gamma delta"],
              "enum: the output is one of the values", repr(text))


def t_refused(d):
    cases = [
        ({"type": "array", "uniqueItems": True}, "uniqueItems",
         "a construct no grammar can enforce"),
        ({"type": "object", "$dynamicRef": "#meta"}, "$dynamicRef",
         "unsupported keyword"),
    ]
    deep = {"type": "integer"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    cases.append((deep, "nest", "too deep"))
    big = {"type": "object", "properties": {
        "p%05d_%s" % (i, "x" * 40): {"type": "integer"} for i in range(6000)}}
    cases.append((big, "", "too large"))
    for schema, word, what in cases:
        st, doc, raw = post(d, "/v1/chat/completions", chat(schema))
        err = (doc or {}).get("error", {}) if isinstance(doc, dict) else {}
        msg = err.get("message", "")
        chk.check(st in (400, 413) and word.lower() in msg.lower() and
                  (st == 413 or err.get("param", "").startswith(
                      "response_format")),
                  "%s schema: %d naming %r with param" % (what, st, word),
                  raw[:400])
    st, doc, raw = post(d, "/v1/chat/completions",
                        chat({"type": "json_schema", "json_schema": {
                            "name": "x"}}))
    chk.check(st == 400 and "schema" in raw.decode(errors="replace"),
              "json_schema without a schema: 400", raw[:300])


def t_length(d, bias):
    schema = {"type": "object", "properties": {
        "s": {"type": "string", "minLength": 200}},
        "required": ["s"], "additionalProperties": False}
    st, doc, raw = post(d, "/v1/chat/completions",
                        chat(schema, bias, max_tokens=5))
    text, fin = content_of(doc)
    chk.check(st == 200 and fin == "length",
              "max_tokens too small for any document: finish_reason length",
              raw[:400])


def t_preempt(work, model, jsonschema, bias):
    d = du.Daemon(model, work, ["--max-model-len", "2048",
                                "--page-size", "16", "--kv-memory", "1MiB"])
    try:
        if not d.start():
            chk.check(False, "tangramd with a small pool starts",
                      d.log_text()[-2000:])
            return
        st, _, models = du.http("GET", d.base_url + "/v1/models", None,
                                None, 30)
        ctx = json.loads(models)["data"][0]["max_model_len"]
        n_chars = min(1024, max(64, ctx * 2))
        schema = {"type": "object", "properties": {
            "s": {"type": "string", "minLength": n_chars}},
            "required": ["s"], "additionalProperties": False}
        bodies = [chat(schema, bias, max_tokens=ctx - 32, seed=i,
                       temperature=1.0) for i in range(3)]
        res = run_parallel(d, bodies)
        m = du.fetch_metrics(d.base_url)
        pre = du.metric(m, "tangram_num_preemptions_total") or 0
        print("context %d, preemptions %s" % (ctx, pre))
        chk.check(pre > 0, "the small pool preempts constrained requests "
                  "(%s preemptions)" % pre)
        for i, (st, doc, raw) in enumerate(res):
            text, fin = content_of(doc)
            good = False
            try:
                good = st == 200 and fin == "stop" and validator_for(
                    jsonschema, schema).is_valid(strict_json(text))
            except (ValueError, TypeError):
                pass
            chk.check(good, "preempted request %d: the output validates" % i,
                      "%s %s %r" % (st, fin, (text or raw)[:300]))
    finally:
        rc, _ = d.stop()
        chk.check(rc == 0, "the small-pool tangramd exits 0 (rc %s)" % rc)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "maxLength": 10},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "strict": True, "parameters": {
        "type": "object", "properties": {
            "q": {"type": "string", "maxLength": 8},
            "n": {"type": "integer"}},
        "required": ["q"], "additionalProperties": False}}}
PARAMS = {t["function"]["name"]: t["function"]["parameters"]
          for t in (WEATHER, SEARCH)}


def check_calls(jsonschema, calls, what, only=None, count=None):
    """Each call names a tool and its arguments validate against its
    parameters; `only`: that function; `count`: that many calls."""
    good = bool(calls) and (count is None or len(calls) == count)
    why = "%d calls" % len(calls or [])
    for c in calls or []:
        name, args = c["function"]["name"], c["function"]["arguments"]
        if name not in PARAMS or (only and name != only):
            good, why = False, "unexpected function %r" % name
            break
        try:
            errs = list(validator_for(jsonschema, PARAMS[name]).iter_errors(
                strict_json(args)))
        except ValueError as e:
            errs = [e]
        if errs:
            good, why = False, "%s(%s): %s" % (name, args, errs[0])
            break
    chk.check(good, what, "%s: %r" % (why, calls))


def stream_calls(d, body):
    """Streams body; returns the status, the calls ([{name, arguments}]
    in index order, joined from the deltas) and the finish reason."""
    st, _, sraw = du.http("POST", d.base_url + "/v1/chat/completions",
                          dict(body, stream=True), None, 300)
    events, _ = du.sse_events(sraw)
    calls, sfin = {}, None
    for ev in events:
        if ev == "[DONE]":
            continue
        for c in json.loads(ev).get("choices", []):
            sfin = c.get("finish_reason") or sfin
            for tc in c.get("delta", {}).get("tool_calls") or []:
                cur = calls.setdefault(tc["index"], {"name": "",
                                                     "arguments": ""})
                f = tc.get("function", {})
                cur["name"] += f.get("name") or ""
                cur["arguments"] += f.get("arguments") or ""
    return st, [calls[k] for k in sorted(calls)], sfin


def t_tools(d, jsonschema, bias):
    base = {"model": MODEL, "temperature": 0, "max_tokens": 300,
            "logit_bias": bias, "tools": [WEATHER, SEARCH],
            "messages": [{"role": "user", "content": "Call a tool."}]}
    cases = [
        ({"tool_choice": "required"}, None, None, "required"),
        ({"tool_choice": "required", "parallel_tool_calls": False}, None, 1,
         "required, parallel_tool_calls false"),
        ({"tool_choice": {"type": "function",
                          "function": {"name": "get_weather"}}},
         "get_weather", 1, "a named function"),
    ]
    for extra, only, count, what in cases:
        body = dict(base, **extra)
        st, doc, raw = post(d, "/v1/chat/completions", body)
        try:
            ch = doc["choices"][0]
            msg, fin = ch["message"], ch["finish_reason"]
        except (KeyError, IndexError, TypeError):
            chk.check(False, "tools (%s) answer 200" % what, raw[:400])
            continue
        chk.check(st == 200 and fin == "tool_calls" and
                  msg.get("content") is None,
                  "tools (%s): finish_reason tool_calls, no content" % what,
                  raw[:400])
        check_calls(jsonschema, msg.get("tool_calls"),
                    "tools (%s): the output parses as valid calls" % what,
                    only, count)
        if extra.get("tool_choice") != "required" or count is not None:
            continue
        # Streaming gives the same calls (greedy).
        _, got, sfin = stream_calls(d, body)
        want = [{"name": c["function"]["name"],
                 "arguments": c["function"]["arguments"]}
                for c in msg.get("tool_calls") or []]
        chk.check(got == want and sfin == "tool_calls",
                  "tools (required): streaming gives the same calls",
                  "%r vs %r" % (got, want))


def strict_auto_calls(jsonschema, calls, what, some=True):
    """Under "auto": each call names a tool; the strict tool's arguments
    validate against its parameters, the other tool's are a JSON object;
    `some`: at least one call."""
    good, why = bool(calls) or not some, "%d calls" % len(calls or [])
    for c in calls or []:
        name, args = c["function"]["name"], c["function"]["arguments"]
        try:
            obj = strict_json(args)
        except ValueError as e:
            good, why = False, "%s(%s): %s" % (name, args, e)
            break
        if name == "search":
            errs = list(validator_for(jsonschema, PARAMS[name]).iter_errors(
                obj))
            if errs:
                good, why = False, "%s(%s): %s" % (name, args, errs[0])
                break
        elif name != "get_weather" or not isinstance(obj, dict):
            good, why = False, "unexpected call %s(%s)" % (name, args)
            break
    chk.check(good, what, "%s: %r" % (why, calls))


def t_strict_auto(d, jsonschema):
    """strict: true under tool_choice "auto": free text until the model
    writes <tool_call> (forced here by a logit bias on that token: it wins
    every free draw), then the call is held to the tools; after it the text
    is free again, so the bias starts call after call until max_tokens. A
    quote bias keeps the random model's strings short; EOS is not biased.
    Every call the response reports must validate; streaming gives the
    same calls; n = 2 (fresh machines per choice) validates too."""
    weights = {"<tool_call>": 100, '"': 60, "}": 30, "]": 30}
    bias = bias_of(d, weights)
    if not chk.check(len(bias) == len(weights),
                     "strict auto: the biased tokens are single tokens (%d)"
                     % len(bias)):
        return
    body = {"model": MODEL, "temperature": 0, "max_tokens": 160,
            "logit_bias": bias, "tools": [WEATHER, SEARCH],
            "tool_choice": "auto",
            "messages": [{"role": "user", "content": "Call a tool."}]}
    st, doc, raw = post(d, "/v1/chat/completions", body)
    try:
        msg = doc["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        chk.check(False, "strict auto: 200 with a message", raw[:400])
        return
    chk.check(st == 200, "strict tools under tool_choice auto: 200 (was 400)",
              raw[:300])
    calls = msg.get("tool_calls") or []
    strict_auto_calls(jsonschema, calls,
                      "strict auto: every call validates (%d calls)"
                      % len(calls))
    st, got, _ = stream_calls(d, body)
    want = [{"name": c["function"]["name"],
             "arguments": c["function"]["arguments"]} for c in calls]
    chk.check(st == 200 and got == want,
              "strict auto: streaming gives the same calls",
              "%r vs %r" % (got, want))
    st, doc, raw = post(d, "/v1/chat/completions",
                        dict(body, n=2, temperature=1.0, seed=11))
    chs = (doc or {}).get("choices") or []
    chk.check(st == 200 and len(chs) == 2, "strict auto, n = 2: two choices",
              raw[:300])
    # Sampled at temperature 1 a choice's first call may outlast
    # max_tokens (a long random object for the non-strict tool): a choice
    # may have no complete call, but the two have some, all valid.
    every = []
    for i, ch in enumerate(chs):
        mine = ch["message"].get("tool_calls") or []
        every += mine
        strict_auto_calls(jsonschema, mine,
                          "strict auto, n = 2: choice %d's calls validate"
                          % i, some=False)
    chk.check(len(every) > 0, "strict auto, n = 2: the choices made calls",
              raw[:600])


def t_node(d, jsonschema, bias):
    root, why = du.node_clients(["openai_structured.mjs"])
    if root is None:
        chk.check(False, "the OpenAI Node client is available", why)
        return
    r = subprocess.run(["node", os.path.join(root, "openai_structured.mjs"),
                        d.base_url + "/v1", MODEL, json.dumps(bias)],
                       capture_output=True, text=True, timeout=300, cwd=root)
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not chk.check(r.returncode == 0 and isinstance(j, dict),
                     "node: every structured request returned",
                     r.stdout[-800:] + r.stderr[-800:]):
        return
    person = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                 "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False}
    p = j["parse"]
    chk.check(p["finish_reason"] == "stop" and isinstance(p["parsed"], dict)
              and validator_for(jsonschema, person).is_valid(p["parsed"]),
              "node: chat.completions.parse with a json_schema parses a "
              "valid object", p)
    rq = j["required"]
    chk.check(rq["finish_reason"] == "tool_calls" and rq["calls"] and
              all(isinstance(c["parsed"], dict) for c in rq["calls"]),
              "node: parse with strict tools and tool_choice required "
              "parses every call's arguments", rq)
    check_calls(jsonschema, [{"function": c} for c in rq["calls"]],
                "node: the required calls are valid")
    nm = j["named"]
    chk.check(nm["finish_reason"] == "tool_calls",
              "node: a named function ends with tool_calls", nm)
    check_calls(jsonschema, [{"function": c} for c in nm["calls"]],
                "node: the named function is called once", "search", 1)


def t_n(d, jsonschema, bias):
    schema = {"type": "object", "properties": {
        "k": {"enum": ["x", "y", "z"]}, "v": {"type": "integer"},
        "s": {"type": "string", "maxLength": 6}},
        "required": ["k", "v", "s"], "additionalProperties": False}
    v = validator_for(jsonschema, schema)
    body = chat(schema, bias, n=4, temperature=1.0, seed=7, max_tokens=200)
    st, doc, raw = post(d, "/v1/chat/completions", body)
    choices = (doc or {}).get("choices", []) if isinstance(doc, dict) else []
    good = st == 200 and len(choices) == 4
    for c in choices:
        try:
            good = good and c["finish_reason"] == "stop" and v.is_valid(
                strict_json(c["message"]["content"]))
        except ValueError:
            good = False
    chk.check(good, "n = 4: every choice validates on its own", raw[:600])
    # /v1/completions takes response_format too.
    cbody = {"model": MODEL, "prompt": "JSON:", "n": 2, "temperature": 1.0,
             "seed": 3, "max_tokens": 200, "logit_bias": bias,
             "response_format": {"type": "json_schema", "json_schema": {
                 "name": "o", "schema": schema}}}
    st, doc, raw = post(d, "/v1/completions", cbody)
    choices = (doc or {}).get("choices", []) if isinstance(doc, dict) else []
    good = st == 200 and len(choices) == 2
    for c in choices:
        try:
            good = good and c["finish_reason"] == "stop" and v.is_valid(
                strict_json(c["text"]))
        except ValueError:
            good = False
    chk.check(good, "completions, n = 2: every choice validates", raw[:600])


def t_grpc(d, work, jsonschema):
    try:
        import grpc
        from test_daemon_grpc import Client, load_protos
    except ImportError as e:
        chk.check(False, "grpcio is installed", str(e))
        return
    os.makedirs(os.path.join(work, "pb"), exist_ok=True)
    mods, why = load_protos(os.path.join(work, "pb"))
    if mods is None:
        chk.check(False, "the gRPC protos compile", why)
        return
    pb, hpb = mods
    c = Client(grpc, pb, hpb, d.grpc_target)
    md = ()
    # Bounded documents: no logit bias over gRPC, and the mask alone ends
    # them (enums, booleans, bounded whitespace).
    schema = {"type": "object", "properties": {
        "unit": {"enum": ["celsius", "fahrenheit"]}, "ok": {"type": "boolean"},
        "tag": {"const": "t"}},
        "required": ["unit", "ok", "tag"], "additionalProperties": False}
    rf = json.dumps({"type": "json_schema", "json_schema": {
        "name": "g", "schema": schema}})
    for form in ("prompt", "messages"):
        kw = {"prompt": "JSON:"} if form == "prompt" else {
            "messages": [pb.ChatMessage(role="user", content="JSON")]}
        msgs, code, det = c.gen(md=md, response_format=rf,
                                sampling={"max_tokens": 300,
                                          "temperature": 0.0}, **kw)
        text = "".join(m.text for m in msgs)
        fin = msgs[-1].finish_reason if msgs else None
        try:
            good = code == grpc.StatusCode.OK and \
                fin == pb.FINISH_REASON_STOP and \
                validator_for(jsonschema, schema).is_valid(strict_json(text))
        except ValueError:
            good = False
        chk.check(good, "gRPC response_format (%s): the output validates" %
                  form, "%s %s %s %r" % (code, det, fin, text[:300]))
    msgs, code, det = c.gen(md=md, response_format=json.dumps({
        "type": "json_schema", "json_schema": {"name": "g", "schema": {
            "type": "array", "uniqueItems": True}}}), prompt="x")
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT and "uniqueItems" in det,
              "gRPC: an unsupported keyword is INVALID_ARGUMENT naming it",
              "%s %s" % (code, det))
    tool = pb.Tool(name="set_unit", parameters_json=json.dumps({
        "type": "object", "properties": {
            "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["unit"], "additionalProperties": False}))
    # One call each (no bias here to stop a list of calls).
    for choice in ("required", "set_unit"):
        msgs, code, det = c.gen(
            md=md, messages=[pb.ChatMessage(role="user", content="call")],
            tools=[tool], tool_choice=choice, parallel_tool_calls=False,
            sampling={"max_tokens": 300, "temperature": 0.0})
        calls = [tc for m in msgs for tc in m.tool_calls]
        fin = msgs[-1].finish_reason if msgs else None
        good = code == grpc.StatusCode.OK and \
            fin == pb.FINISH_REASON_TOOL_CALLS and calls and \
            all(tc.name == "set_unit" for tc in calls)
        for tc in calls:
            try:
                good = good and json.loads(tc.arguments)["unit"] in (
                    "celsius", "fahrenheit")
            except (ValueError, KeyError):
                good = False
        chk.check(good, "gRPC tool_choice %s: valid tool calls" % choice,
                  "%s %s %s %r" % (code, det, fin, calls))


def main():
    missing = du.missing_inputs(tools=["node", "npm", "protoc"])
    try:
        import jsonschema
    except ImportError:
        missing.append("python3-jsonschema (Debian package)")
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdstruct")
    d, bias = None, {}
    try:
        model = du.make_model(os.path.join(work, MODEL))
        d = du.Daemon(model, work, ["--max-model-len", "2048",
                                    "--page-size", "16"])
        ready = d.start()
        chk.check(ready, "tangramd starts", d.log_text()[-3000:])
        if ready:
            bias = bias_of(d, CLOSERS)
            chk.check(len(bias) == len(CLOSERS),
                      "closing tokens found (%d)" % len(bias))
            t_refused(d)
            t_length(d, bias)
            t_logprobs(d)
            t_json_object(d, bias)
            t_corpus(d, jsonschema, bias)
            t_tools(d, jsonschema, bias)
            t_strict_auto(d, jsonschema)
            t_n(d, jsonschema, bias)
            t_grpc(d, work, jsonschema)
            t_node(d, jsonschema, bias)
        if d is not None:
            rc, _ = d.stop()
            chk.check(rc == 0, "tangramd exits 0 on SIGTERM (rc %s)" % rc)
            san = d.sanitizer_reports()
            chk.check(not san, "no sanitizer report in the daemon's log",
                      "\n".join(san[:10]))
            d = None
        t_preempt(work, model, jsonschema, bias)
    finally:
        if d is not None:
            d.stop()
            d.print_log_tail(chk)
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
