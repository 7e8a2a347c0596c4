#!/usr/bin/python3
"""tangram-template against the real Jinja chat templates.

Every chat template in data/ (Qwen2.5, Qwen3, Llama-3.2 and 3.3, Mistral
Nemo and Small 3.1, Phi-3.5, Phi-4, Phi-4-mini, Gemma-2 and 3, DeepSeek-R1
distill and V3.1, Hermes-3 tool use, Functionary 3.2) is installed as a
model directory (chat_template.jinja next to a tokenizer_config.json with
the model's special tokens, or the real tokenizer_config.json) and renders
a corpus of conversations: 1-5 turns, with and without system, empty
content, unicode and unicode whitespace, multi-line, assistant last, content
parts, tool definitions, assistant tool calls (arguments as objects and as
strings, several calls), tool results, reasoning_content, Qwen3 thinking on
and off, continue_final_message. Each render is compared with python3-jinja2
set up as transformers does (tests/reference/render_jinja.py): the bytes
must be identical, or both must fail (a template's own raise_exception, a
type error). Also checks that an unsupported construct fails naming it and
its line, that the resource limits hold, the model-directory rules,
--date-string, and usage errors. Prints the number of renders compared.
Fails, naming it, when python3-jinja2 is not installed.
"""
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime

SOURCE = os.environ.get("TANGRAM_SOURCE",
                        os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.environ.get("TANGRAM_DATA", os.path.join(SOURCE, "data"))
BIN = os.environ.get("TANGRAM_BIN", os.path.join(SOURCE, "build", "bin"))
TOOL = os.path.join(BIN, "tangram-template")

try:
    import jinja2  # noqa: F401
except ImportError:
    print("FAIL: python3-jinja2 is not installed (sh deploy/install-deps.sh)",
          file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.join(SOURCE, "tests", "reference"))
import render_jinja  # noqa: E402

TOK = os.path.join(DATA, "tokenizers")
TEMPLATES = os.path.join(DATA, "chat_templates")
DATE = "2025-02-03"
NOW = datetime(2025, 2, 3)
failures = []

# The special tokens of each shipped .jinja's model (its tokenizer_config);
# an AddedToken object for Gemma-3 exercises that form.
SPECIALS = {
    "meta-llama-Llama-3.3-70B-Instruct":
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "mistralai-Mistral-Nemo-Instruct-2407":
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistralai-Mistral-Small-3.1-24B-Instruct-2503":
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "microsoft-Phi-3.5-mini-instruct":
        {"bos_token": "<s>", "eos_token": "<|endoftext|>",
         "unk_token": "<unk>", "pad_token": "<|endoftext|>"},
    "microsoft-phi-4":
        {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
         "pad_token": "<|dummy_87|>"},
    "microsoft-Phi-4-mini-instruct":
        {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "google-gemma-2-2b-it":
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
         "unk_token": "<unk>"},
    "google-gemma-3-it":
        {"bos_token": {"content": "<bos>", "lstrip": False,
                       "normalized": False, "rstrip": False,
                       "single_word": False, "special": True},
         "eos_token": "<eos>", "pad_token": "<pad>"},
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B":
        {"bos_token": "<｜begin▁of▁sentence｜>",
         "eos_token": "<｜end▁of▁sentence｜>"},
    "deepseek-ai-DeepSeek-V3.1":
        {"bos_token": "<｜begin▁of▁sentence｜>",
         "eos_token": "<｜end▁of▁sentence｜>"},
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use":
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "meetkai-functionary-medium-v3.2":
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def run_tool(args, request, stdin=None):
    data = stdin if stdin is not None else json.dumps(request).encode()
    p = subprocess.run([TOOL] + args, input=data, capture_output=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def install_sources(tmp):
    """(label, model dir, family) for every template in data/."""
    out = [("qwen2.5", os.path.join(TOK, "qwen2.5"), "qwen"),
           ("qwen3", os.path.join(TOK, "qwen3"), "qwen3"),
           ("llama3.2", os.path.join(TOK, "llama3"), "llama")]
    names = sorted(n[:-6] for n in os.listdir(TEMPLATES)
                   if n.endswith(".jinja"))
    check(set(names) == set(SPECIALS),
          f"data/chat_templates and SPECIALS differ: {names}")
    for name in names:
        d = os.path.join(tmp, name)
        os.mkdir(d)
        shutil.copy(os.path.join(TEMPLATES, name + ".jinja"),
                    os.path.join(d, "chat_template.jinja"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(dict(SPECIALS.get(name, {}), model_max_length=8192), f)
        fam = ("deepseek-v3" if "V3.1" in name else
               "llama" if "Llama-3.3" in name else name)
        out.append((name, d, fam))
    return out


# ---- the conversation corpus ------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                 "description": "Temperature unit"},
        "days": {"type": "integer", "description": "Days ahead",
                 "minimum": 0, "maximum": 7, "default": 0}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search",
    "description": "Search the web — returns títulos ✓",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to look for"},
        "limit": {"type": ["integer", "null"],
                  "description": "Maximum results"},
        "filters": {"type": "object", "description": "Filters",
                    "properties": {"lang": {"type": "string",
                                            "description": "Language"}},
                    "additionalProperties": {"type": "string"}},
        "tags": {"type": "array", "items": {"type": "string"},
                 "description": "Tags", "examples": [["a", "b"]]},
        "score": {"type": "number", "description": "Minimum score 0.5",
                  "default": 0.5}},
        "required": ["query"]}}}
NOW_TOOL = {"type": "function", "function": {
    "name": "now", "description": "The current time.",
    "parameters": {"type": "object", "properties": {}}}}
TOOLSETS = [[WEATHER], [WEATHER, SEARCH], [SEARCH, NOW_TOOL], []]


def call(name, args, cid, as_string=False):
    return {"id": cid, "type": "function",
            "function": {"name": name,
                         "arguments": json.dumps(args) if as_string
                         else args}}


CONTENTS = [
    "", "Hello", "What is 2+2?", "héllo wörld — 你好 🙂 Ωμέγα",
    "line one\nline two\n\nline four", "  padded with spaces  ",
    "\n\nleading newlines", "trailing newlines\n\n", "\t tab and space \t",
    "\u3000ideographic space\u00a0", "\u2028sep\u2029", "\u0085nel\u0085",
    "{{ not a template }} {% raw %}", "<|im_end|> literal tokens <|eot_id|>",
    "<tool_response>\nresult\n</tool_response>", "a" * 300, "x\r\ny",
    "quotes ' \" \\ back\\slash",
]
ASSISTANT = [
    "", "Sure.", "<think>\nsome reasoning\n</think>\n\nThe answer is 4.",
    "<think>r1</think>answer", "pre<think>\n\nr2\n\n</think>\n\nans\n",
    "no think but </think> closing", "</think>\n", "multi\nline\nreply",
    "a</think>b</think>\nc", "\n\nstarts with newlines", "ünïcødé reply 🙂",
]
REASONING = [None, None, "", "plain reasoning", "\n\nnl reasoning\n\n",
             "思考中"]


def random_conversation(rng):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(CONTENTS)})
    turns = rng.randint(1, 5)
    for t in range(turns):
        msgs.append({"role": "user", "content": rng.choice(CONTENTS)})
        last = t == turns - 1
        if not last or rng.random() < 0.4:
            m = {"role": "assistant", "content": rng.choice(ASSISTANT)}
            r = rng.choice(REASONING)
            if r is not None or rng.random() < 0.2:
                m["reasoning_content"] = r
            msgs.append(m)
        if rng.random() < 0.08:
            msgs.append({"role": "system", "content": rng.choice(CONTENTS)})
    return msgs, None


def tool_conversations(rng):
    """(messages, tools) with tool definitions, calls and results."""
    u = {"role": "user", "content": "What's the weather in Paris?"}
    sysm = {"role": "system", "content": "You are a helpful assistant."}
    c1 = call("get_weather", {"city": "Paris", "unit": "celsius"},
              "abc123XYZ")
    c2 = call("search", {"query": "Paris events", "limit": 3,
                         "filters": {"lang": "fr"}}, "def456UVW")
    r1 = {"role": "tool", "tool_call_id": "abc123XYZ",
          "name": "get_weather", "content": "{\"temperature\": 21.5}"}
    r2 = {"role": "tool", "tool_call_id": "def456UVW", "name": "search",
          "content": "[\"Fête\", \"Expo\"]"}
    a1 = {"role": "assistant", "content": None, "tool_calls": [c1]}
    a2 = {"role": "assistant", "content": "", "tool_calls": [c1, c2]}
    fin = {"role": "assistant", "content": "It is 21.5 °C in Paris."}
    out = [
        ([u], [WEATHER]),
        ([sysm, u], [WEATHER, SEARCH]),
        ([sysm, u], []),
        ([u, a1, r1], [WEATHER]),
        ([u, a1, r1, fin], [WEATHER]),
        ([sysm, u, a1, r1, fin, {"role": "user", "content": "And Rome?"}],
         [WEATHER, SEARCH]),
        ([u, a2, r1, r2], [WEATHER, SEARCH]),
        ([sysm, u, a2, r1, r2, fin], [WEATHER, SEARCH]),
        ([u, {"role": "assistant", "content": "Let me check.",
              "tool_calls": [c1]}, r1], [WEATHER]),
        ([u, {"role": "assistant", "content": None,
              "tool_calls": [call("get_weather", {"city": "Paris"},
                                  "abc123XYZ", as_string=True)]}, r1],
         [WEATHER]),
        ([u, {"role": "assistant", "content": "",
              "reasoning_content": "I should call the tool.",
              "tool_calls": [c1]}, r1], [WEATHER]),
        ([u, {"role": "assistant", "content": None,
              "tool_calls": [call("now", {}, "ghi789RST")]},
          {"role": "tool", "tool_call_id": "ghi789RST",
           "content": "12:00"}], [NOW_TOOL]),
        ([u, a1, r1], None),
        ([{"role": "user", "content": [{"type": "text",
                                        "text": "parts one"},
                                       {"type": "text",
                                        "text": "parts two"}]}], None),
        ([sysm, {"role": "user", "content": [{"type": "text",
                                              "text": "describe"}]}],
         [SEARCH]),
    ]
    for _ in range(12):
        msgs, _ = random_conversation(rng)
        out.append((msgs, copy.deepcopy(rng.choice(TOOLSETS))))
    return out


def fixed_conversations():
    return [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "hi"}],
        [{"role": "system", "content": "only a system message"}],
        [{"role": "assistant", "content": "assistant first"}],
        [{"role": "user", "content": "q"},
         {"role": "assistant", "content": "<think>\nx\n</think>\n\na"}],
        [{"role": "user", "content": "q"},
         {"role": "assistant", "content": "a", "reasoning_content": "r"},
         {"role": "user", "content": "q2"},
         {"role": "assistant", "content": "a2", "reasoning_content": "r2"}],
        [{"role": "user", "content": "q"},
         {"role": "developer", "content": "unknown role"},
         {"role": "assistant", "content": "a"}],
        [{"role": "system", "content": "s1"},
         {"role": "system", "content": "s2"},
         {"role": "user", "content": "u"}],
        [],
    ]


def option_sets(family, msgs):
    sets = [([], {}), (["--no-generation-prompt"],
                       {"add_generation_prompt": False})]
    if family == "qwen3":
        sets += [(["--enable-thinking", "false"], {"enable_thinking": False}),
                 (["--enable-thinking", "true"], {"enable_thinking": True}),
                 (["--no-generation-prompt", "--enable-thinking", "false"],
                  {"add_generation_prompt": False,
                   "enable_thinking": False})]
    if family == "deepseek-v3":
        sets += [([], {"thinking": True}), ([], {"thinking": False})]
    if msgs and msgs[-1].get("role") == "assistant":
        sets.append((["--continue-final-message"],
                     {"add_generation_prompt": False,
                      "continue_final_message": True}))
    return sets


def reference(templates, specials, msgs, tools, opts):
    kw = dict(specials)
    kw.update(opts)
    agp = kw.pop("add_generation_prompt", True)
    cont = kw.pop("continue_final_message", False)
    return render_jinja.render(render_jinja.pick(templates, tools), msgs,
                               add_generation_prompt=agp, tools=tools,
                               now=NOW, continue_final_message=cont, **kw)


def compare_all(sources, corpus):
    n = both_fail = 0
    ok_per_source = {}
    for label, d, family in sources:
        templates, specials = render_jinja.load_dir(d)
        ok_per_source[label] = 0
        for msgs, tools in corpus:
            for targs, opts in option_sets(family, msgs):
                extra = {k: v for k, v in opts.items()
                         if k not in ("add_generation_prompt",
                                      "continue_final_message",
                                      "enable_thinking")}
                req = {"messages": msgs}
                if tools is not None:
                    req["tools"] = tools
                if extra:
                    req["chat_template_kwargs"] = extra
                try:
                    want = reference(templates, specials, msgs, tools,
                                     opts).encode("utf-8")
                    werr = None
                except Exception as e:  # the template's own failure
                    want, werr = None, f"{type(e).__name__}: {e}"
                rc, got, err = run_tool(
                    ["--tokenizer", d, "--date-string", DATE] + targs, req)
                n += 1
                if werr is not None:
                    both_fail += 1
                    check(rc == 1 and got == b"" and err.strip(),
                          f"{label} {targs}: jinja failed ({werr}) but "
                          f"tangram-template gave rc={rc} {got[:200]!r}")
                    continue
                ok_per_source[label] += 1
                check(rc == 0 and got == want,
                      f"{label} {targs} {json.dumps(req)[:300]}: rc={rc} "
                      f"{err.strip()}\n  want={want[:600]!r}\n"
                      f"  got ={got[:600]!r}")
    for label, k in ok_per_source.items():
        check(k >= 20, f"{label}: only {k} renders succeeded in jinja; the "
                       "corpus does not exercise this template")
    return n, both_fail


def test_unsupported_and_limits(tmp):
    u = {"messages": [{"role": "user", "content": "x"}]}
    cases = [
        ("{% for m in messages %}\n{{ m.content }}\n{{ m.content|wordwrap }}"
         "{% endfor %}", ["line 3", "wordwrap"]),
        ("a\n{% include 'other.jinja' %}", ["line 2", "include"]),
        ("{{ messages[0].content|nosuchfilter }}",
         ["line 1", "nosuchfilter"]),
        ("{{ 'x' ~ '%s' % 1 }}", ["line 1", "formatting"]),
        ("{% for i in range(100000) %}{% for j in range(100000) %}"
         "{% endfor %}{% endfor %}", ["max_steps"]),
        ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
         ["max_output"]),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
         ["max_depth"]),
        ("{{ 'x' * 100000000 }}", ["output limit"]),
        ("{{ " + "(" * 300 + "1" + ")" * 300 + " }}", ["nest"]),
    ]
    for i, (text, needles) in enumerate(cases):
        path = os.path.join(tmp, f"bad{i}.jinja")
        with open(path, "w") as f:
            f.write(text)
        rc, out, err = run_tool(["--template-file", path], u)
        check(rc == 1 and out == b"" and
              all(nd in err for nd in needles),
              f"unsupported/limit case {i} ({text[:40]!r}): rc={rc} "
              f"out={out[:80]!r} err={err.strip()}")


def test_dirs_and_dates(tmp):
    msgs = {"messages": [{"role": "user", "content": "date?"}]}
    # Llama-3.2 formats strftime_now("%d %b %Y"); --date-string fixes it.
    rc, out, err = run_tool(["--tokenizer", os.path.join(TOK, "llama3"),
                             "--date-string", DATE], msgs)
    check(rc == 0 and b"Today Date: 03 Feb 2025\n" in out,
          f"--date-string: {out[:300]!r} {err}")
    # date_string stays undefined, as in transformers.
    path = os.path.join(tmp, "date.jinja")
    with open(path, "w") as f:
        f.write("{{ date_string is defined }}|{{ strftime_now('%Y') }}|"
                "{{ bos_token is defined }}")
    rc, out, err = run_tool(["--template-file", path, "--date-string",
                             "1999-12-31"], msgs)
    check(rc == 0 and out == b"False|1999|False", f"date_string: {out!r}")
    # chat_template.jinja wins over tokenizer_config.json; special tokens
    # still come from the config.
    d = os.path.join(tmp, "both")
    os.mkdir(d)
    with open(os.path.join(d, "chat_template.jinja"), "w") as f:
        f.write("[jinja]{{ bos_token }}\n")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "[config]", "bos_token": {"content":
                                                             "<B>"}}, f)
    rc, out, err = run_tool(["--model", d], msgs)
    check(rc == 0 and out == b"[jinja]<B>", f"precedence: {out!r} {err}")
    # A list of named templates: "default", or "tool_use" with tools.
    with open(os.path.join(tmp, "list.json"), "w") as f:
        json.dump({"chat_template": [
            {"name": "default", "template": "D{{ tools is none }}"},
            {"name": "tool_use", "template": "T{{ tools|length }}"}]}, f)
    rc, out, _ = run_tool(["--template-file", os.path.join(tmp, "list.json")],
                          msgs)
    check(rc == 0 and out == b"DTrue", f"list default: {out!r}")
    rc, out, _ = run_tool(["--template-file", os.path.join(tmp, "list.json")],
                          dict(msgs, tools=[WEATHER]))
    check(rc == 0 and out == b"T1", f"list tool_use: {out!r}")
    # Output is written exactly: no newline added, none removed.
    with open(path, "w") as f:
        f.write("x\n\n")
    rc, out, _ = run_tool(["--template-file", path], msgs)
    check(rc == 0 and out == b"x\n", f"trailing newline: {out!r}")


def test_usage_and_input():
    q = os.path.join(TOK, "qwen3")
    for args in (["--enable-thinking", "maybe"], ["--bogus"],
                 ["--date-string", "03 Feb 2025"], []):
        p = subprocess.run([TOOL] + (["--tokenizer", q] if args != [] else [])
                           + args, input=b"{}", capture_output=True,
                           timeout=30)
        check(p.returncode == 2, f"usage {args}: rc={p.returncode}")
    for req in (b"{not json", b"[]", b'{"messages": "nope"}',
                b'{"messages": [], "tools": 3}'):
        p = subprocess.run([TOOL, "--tokenizer", q], input=req,
                           capture_output=True, timeout=30)
        check(p.returncode == 1 and p.stdout == b"" and p.stderr,
              f"bad input {req!r}: rc={p.returncode}")
    p = subprocess.run([TOOL, "--tokenizer", "/nonexistent"], input=b"{}",
                       capture_output=True, timeout=30)
    check(p.returncode == 1 and b"nonexistent" in p.stderr,
          f"missing dir: {p.stderr!r}")


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"FAIL: {TOOL} not built", file=sys.stderr)
        return 1
    rng = random.Random(20240726)
    corpus = [(m, None) for m in fixed_conversations()]
    corpus += [random_conversation(rng) for _ in range(30)]
    corpus += tool_conversations(rng)
    with tempfile.TemporaryDirectory() as tmp:
        sources = install_sources(tmp)
        n, both_fail = compare_all(sources, corpus)
        test_unsupported_and_limits(tmp)
        test_dirs_and_dates(tmp)
    test_usage_and_input()
    print(f"compared {n} renders ({n - both_fail} byte-identical, "
          f"{both_fail} failing in both) of {len(sources)} templates over "
          f"{len(corpus)} conversations; {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
