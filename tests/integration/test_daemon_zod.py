#!/usr/bin/python3
"""The schemas people send, served (docs/API.md "Structured outputs"),
through the real tangramd (CPU backend, the tiny model, the Qwen3
tokenizer) and real clients:

- zod (npm, its v4 API) writes the JSON Schema of 18 common cases — z.int()
  (bounds of +-(2^53 - 1)), ranges, positive(), multipleOf, email(),
  uuid(), iso.datetime(), iso.date(), regex(), record() (a plain and an
  enum key), tuple(), intersection(), union(), optional/nullable, array
  bounds, enum — and the OpenAI Node client asks for two answers under
  each (tests/integration/clients/zod_structured.mjs). No case may be
  refused; every answer that finished validates with zod itself and with
  python3-jsonschema against the schema sent (formats checked too); most
  answers finish (a bias toward closing tokens keeps the random model's
  documents short).
- the same zod cases through the Vercel AI SDK (ai@6 with @ai-sdk/openai's
  chat model: generateObject, streamObject, generateText with
  toolChoice "required") and LangChain.js (withStructuredOutput by
  jsonSchema and by functionCalling), tests/integration/clients/
  sdk_structured.mjs: every finished answer accepted by the library and
  valid (zod, python3-jsonschema).
- the OpenAI helper's zodResponseFormat (zod v3 API, the helper's own
  conversion) with client.chat.completions.parse.
- vLLM's and SGLang's other constraints: structured_outputs.regex (the
  whole output matches), .choice (one of the strings), .grammar (GBNF),
  guided_json (with the pretty whitespace policy asked), and gRPC's
  structured_outputs field.

Fails, naming it, when node/npm, the daemon or python3-jsonschema is
missing.
"""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import daemon_util as du  # noqa: E402

MODEL = "tiny"
CLOSERS = {'"': 100, '}': 50, ']': 50, "<|im_end|>": 100}
chk = du.Checker()


def post(d, path, body):
    st, _, data = du.http("POST", d.base_url + path, body, None, 600)
    return st, du.json_of(data), data


def bias_of(d, weights):
    out = {}
    for t, w in weights.items():
        st, doc, _ = post(d, "/tokenize", {"prompt": t,
                                           "add_special_tokens": False})
        if st == 200 and doc.get("count") == 1:
            out[str(doc["tokens"][0])] = w
    return out


def run_node(d, script, bias, who):
    """Runs clients/`script` (with zod_cases.mjs) against the daemon and
    returns the JSON object it printed last, or None after a failed
    check naming `who`."""
    root, why = du.node_clients([script, "zod_cases.mjs"])
    if root is None:
        chk.check(False, "%s and zod are available" % who, why)
        return None
    root = os.path.abspath(root)
    r = subprocess.run(["node", os.path.join(root, script),
                        d.base_url + "/v1", MODEL, json.dumps(bias)],
                       capture_output=True, text=True, timeout=1500, cwd=root)
    lines = r.stdout.strip().splitlines()
    j = du.json_of(lines[-1]) if lines else None
    if not chk.check(r.returncode == 0 and isinstance(j, dict),
                     "node (%s): every request returned" % who,
                     r.stdout[-800:] + r.stderr[-800:]):
        return None
    return j


def t_zod(d, jsonschema, bias):
    j = run_node(d, "zod_structured.mjs", bias, "the OpenAI Node client")
    if j is None:
        return
    fc = jsonschema.FormatChecker()
    total = finished = 0
    for name, c in sorted(j["cases"].items()):
        if not chk.check("error" not in c, "zod %s: served (not refused)"
                         % name, c.get("error")):
            continue
        v = jsonschema.Draft202012Validator(c["schema"], format_checker=fc)
        for a in c["answers"]:
            total += 1
            if a["finish"] != "stop":
                continue
            finished += 1
            doc = None
            try:
                doc = json.loads(a["text"])
            except ValueError:
                pass
            errs = list(v.iter_errors(doc)) if doc is not None else ["not JSON"]
            chk.check(a.get("zod_ok") and not errs,
                      "zod %s: %s validates (zod and jsonschema)" %
                      (name, a["text"][:80]),
                      "%s %s" % (a.get("zod_error"),
                                 getattr(errs[0], "message", errs[0])
                                 if errs else ""))
    chk.check(total > 0 and finished * 3 >= total * 2,
              "most answers finished (%d of %d)" % (finished, total))
    h = j.get("helper", {})
    chk.check("error" not in h and h.get("ok"),
              "zodResponseFormat + chat.completions.parse: parsed and "
              "valid (%s)" % h.get("finish"), h)


SDK_KINDS = {
    "ai_object": "AI SDK generateObject",
    "ai_stream": "AI SDK streamObject",
    "ai_tool": "AI SDK generateText toolChoice required",
    "lc_json": "LangChain withStructuredOutput jsonSchema",
    "lc_tool": "LangChain withStructuredOutput functionCalling",
}


def t_sdk(d, jsonschema, bias):
    """The same zod cases through the Vercel AI SDK and LangChain.js, as
    their users write them (clients/sdk_structured.mjs): every answer that
    finished was accepted by the library, validates with zod, and
    validates with python3-jsonschema against the JSON Schema zod wrote;
    a library that threw did so only on an unfinished answer."""
    j = run_node(d, "sdk_structured.mjs", bias, "the AI SDK and LangChain.js")
    if j is None:
        return
    fc = jsonschema.FormatChecker()
    seen = {k: [0, 0] for k in SDK_KINDS}  # answers, finished
    for name, c in sorted(j["cases"].items()):
        v = jsonschema.Draft202012Validator(c["schema"], format_checker=fc)
        for kind, label in SDK_KINDS.items():
            a = c.get(kind)
            if a is None:
                continue
            seen[kind][0] += 1
            if a.get("finish") == "length":
                continue  # unfinished: the library may refuse it
            seen[kind][1] += 1
            if "inputs" in a:
                docs = a["inputs"] or [None]
            else:
                try:
                    docs = [json.loads(a.get("text") or "")]
                except ValueError:
                    docs = [None]
            errs = [e for doc in docs for e in (
                v.iter_errors(doc) if doc is not None else ["not JSON"])]
            chk.check(a.get("ok") and not errs and not a.get("error"),
                      "%s, zod %s: accepted and valid (%s)" %
                      (label, name, a.get("finish")),
                      "%s %s %s" % (a.get("error"), str(docs)[:200],
                                    getattr(errs[0], "message", errs[0])
                                    if errs else ""))
            if kind == "ai_stream":
                chk.check(a.get("partials", 0) >= 1,
                          "%s, zod %s: partial objects streamed (%s)" %
                          (label, name, a.get("partials")))
    for kind, (n, fin) in seen.items():
        chk.check(n > 0 and fin * 3 >= n * 2, "%s: most answers finished "
                  "(%d of %d)" % (SDK_KINDS[kind], fin, n))


def chat(extra, bias, **kw):
    body = {"model": MODEL, "temperature": 1.0, "seed": 3, "max_tokens": 80,
            "logit_bias": bias,
            "messages": [{"role": "user", "content": "Answer."}]}
    body.update(extra)
    body.update(kw)
    st, doc, raw = post(d_global[0], "/v1/chat/completions", body)
    if st != 200:
        return st, None, None, raw
    c = doc["choices"][0]
    return st, c["message"]["content"], c["finish_reason"], raw


d_global = [None]


def t_other_kinds(d, jsonschema, bias):
    d_global[0] = d
    pat = r"[a-c]{3}-[0-9]{2}"
    st, text, fin, raw = chat({"structured_outputs": {"regex": pat}}, {})
    chk.check(st == 200 and fin == "stop" and re.fullmatch(pat, text or ""),
              "structured_outputs.regex: the whole output matches (%r)"
              % text, raw[:300])
    st, text, fin, raw = chat({"guided_choice": ["red", "green", "blue"]}, {})
    chk.check(st == 200 and text in ("red", "green", "blue"),
              "guided_choice: one of the strings (%r)" % text, raw[:300])
    gbnf = 'root ::= ("yes" | "no") " " [0-9] [0-9]?'
    st, text, fin, raw = chat({"structured_outputs": {"grammar": gbnf}}, {})
    chk.check(st == 200 and re.fullmatch(r"(yes|no) [0-9][0-9]?", text or ""),
              "structured_outputs.grammar (GBNF): in the language (%r)" % text,
              raw[:300])
    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 3, "maximum": 9},
        "t": {"type": "array", "prefixItems": [{"type": "boolean"}],
              "items": False}}, "required": ["n", "t"]}
    st, text, fin, raw = chat({"guided_json": schema,
                               "structured_outputs": {"whitespace":
                                                      "pretty"}}, bias,
                              max_tokens=200)
    ok = st == 200 and fin == "stop"
    if ok:
        try:
            ok = jsonschema.Draft202012Validator(schema).is_valid(
                json.loads(text))
        except ValueError:
            ok = False
    chk.check(ok, "guided_json with pretty whitespace validates (%r)" % text,
              raw[:300])
    st, doc, raw = post(d, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_object"},
        "guided_regex": "a+"})
    chk.check(st == 400 and "one output constraint" in
              (doc or {}).get("error", {}).get("message", ""),
              "two constraints in one request: 400", raw[:300])
    # compact by default: no space but after ':' and ','
    st, text, fin, raw = chat({"response_format": {"type": "json_object"}},
                              bias, max_tokens=200)
    chk.check(st == 200 and (fin != "stop" or not re.search(
        r'^\s|\s$|[\[{]\s|\s[\]},:]|\n', text or "")),
              "json_object: compact whitespace by default (%r)" % text,
              raw[:300])


def t_grpc(d, work):
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
    pat = r"[0-9]{4}"
    msgs, code, det = c.gen(md=(), prompt="x", structured_outputs=json.dumps(
        {"regex": pat}), sampling={"max_tokens": 16, "temperature": 1.0})
    text = "".join(m.text for m in msgs) if msgs else ""
    chk.check(code == grpc.StatusCode.OK and re.fullmatch(pat, text),
              "gRPC structured_outputs.regex: the whole output matches (%r)"
              % text, "%s %s" % (code, det))
    msgs, code, det = c.gen(md=(), prompt="x", structured_outputs=json.dumps(
        {"regex": "(a"}), sampling={"max_tokens": 16})
    chk.check(code == grpc.StatusCode.INVALID_ARGUMENT,
              "gRPC: a bad pattern is INVALID_ARGUMENT", "%s %s" % (code, det))


def main():
    missing = du.missing_inputs(tools=["node", "npm", "protoc"])
    try:
        import jsonschema
    except ImportError:
        missing.append("python3-jsonschema (Debian package)")
    if missing:
        return du.fail_missing(missing)
    work = du.scratch_dir("tgdzod")
    d = None
    try:
        model = du.make_model(os.path.join(work, MODEL))
        # The zod .email() schema (pattern and format intersected) took
        # 2.5 s to compile at load average 7 and over the default 10 s at
        # 15 on a 2-core machine: the compile limit is not what this test
        # is about, so it is wide.
        d = du.Daemon(model, work, ["--grammar-compile-timeout", "120",
                                    "--max-model-len", "2048",
                                    "--page-size", "16"])
        ready = d.start()
        chk.check(ready, "tangramd starts", d.log_text()[-3000:])
        if ready:
            bias = bias_of(d, CLOSERS)
            chk.check(len(bias) == len(CLOSERS),
                      "closing tokens found (%d)" % len(bias))
            t_other_kinds(d, jsonschema, bias)
            t_grpc(d, work)
            t_zod(d, jsonschema, bias)
            t_sdk(d, jsonschema, bias)
        if d is not None:
            d.check_alive(chk)
    finally:
        if d is not None:
            d.stop_checked(chk)
            if chk.failures:
                d.print_log_tail(chk)
        shutil.rmtree(work, ignore_errors=True)
    return chk.summary()


if __name__ == "__main__":
    sys.exit(main())
