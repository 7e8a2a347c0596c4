#!/usr/bin/python3
"""tangram-template against the real Jinja chat templates.

Renders many conversations (1-5 turns, with and without system, empty
content, unicode and unicode whitespace, multi-line, assistant last, Qwen3
thinking on/off, reasoning_content, <think> blocks in content, tool-response
look-alikes) with each shipped template through jinja2 set up as transformers
does (tests/reference/render_jinja.py) and with tangram-template, and
requires byte-identical output. Also checks detection, the default Llama
dates, errors where Jinja raises, unsupported tool requests and unknown
templates. Fails, naming it, when python3-jinja2 is not installed.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

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
LLAMA33 = os.path.join(DATA, "chat_templates",
                       "meta-llama-Llama-3.3-70B-Instruct.jinja")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def run_tool(args, request):
    p = subprocess.run([TOOL] + args, input=json.dumps(request).encode(),
                       capture_output=True, timeout=30)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def load_sources():
    """(label, tool args, template text, jinja variables, family)."""
    out = []
    for fam, d in (("chatml-qwen2.5", "qwen2.5"), ("qwen3", "qwen3")):
        text, specials = render_jinja.load_tokenizer_config(
            os.path.join(TOK, d, "tokenizer_config.json"))
        out.append((d, ["--tokenizer", os.path.join(TOK, d)], text, specials,
                    fam))
    text, specials = render_jinja.load_tokenizer_config(
        os.path.join(TOK, "llama3",
                     "tokenizer_config.llama-3.2-3b-instruct.json"))
    out.append(("llama3.2", ["--tokenizer", os.path.join(TOK, "llama3")],
                text, specials, "llama3.2"))
    with open(LLAMA33, encoding="utf-8") as f:
        text = f.read()
    # transformers passes the tokenizer's bos_token; the .jinja has none.
    out.append(("llama3.3", ["--template-file", LLAMA33], text,
                {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                "llama3"))
    return out


CONTENTS = [
    "", "Hello", "What is 2+2?", "héllo wörld — 你好 🙂 Ωμέγα",
    "line one\nline two\n\nline four", "  padded with spaces  ",
    "\n\nleading newlines", "trailing newlines\n\n", "\t tab and space \t",
    "\u3000ideographic space\u00a0", "\u2028sep\u2029", "\u0085nel\u0085",
    "{{ not a template }} {% raw %}", "<|im_end|> literal tokens <|eot_id|>",
    "<tool_response>\nresult\n</tool_response>", "a" * 300, "x\r\ny",
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
    return msgs


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
         {"role": "user",
          "content": "<tool_response>\nout\n</tool_response>"},
         {"role": "assistant", "content": "after tool",
          "reasoning_content": "why"}],
        [{"role": "user", "content": "q"},
         {"role": "developer", "content": "unknown role"},
         {"role": "assistant", "content": "a"}],
        [{"role": "system", "content": "s1"},
         {"role": "system", "content": "s2"},
         {"role": "user", "content": "u"}],
    ]


def option_sets(family):
    sets = [([], {}), (["--no-generation-prompt"],
                       {"add_generation_prompt": False})]
    if family == "qwen3":
        sets += [(["--enable-thinking", "false"], {"enable_thinking": False}),
                 (["--enable-thinking", "true"], {"enable_thinking": True}),
                 (["--no-generation-prompt", "--enable-thinking", "false"],
                  {"add_generation_prompt": False, "enable_thinking": False})]
    if family.startswith("llama3"):
        sets = [(a + ["--date-string", "03 Feb 2025"],
                 dict(k, date_string="03 Feb 2025")) for a, k in sets]
    return sets


def jinja(text, specials, msgs, kwargs):
    kw = dict(specials)
    kw.update(kwargs)
    agp = kw.pop("add_generation_prompt", True)
    return render_jinja.render(text, msgs, add_generation_prompt=agp, **kw)


def compare_all(sources, conversations):
    n = 0
    for label, args, text, specials, family in sources:
        for msgs in conversations:
            for targs, kwargs in option_sets(family):
                want = jinja(text, specials, msgs, kwargs).encode("utf-8")
                rc, got, err = run_tool(args + targs, {"messages": msgs})
                n += 1
                check(rc == 0 and got == want,
                      f"{label} {targs} {json.dumps(msgs)[:200]}: rc={rc} "
                      f"{err.strip()}\n  want={want!r}\n  got ={got!r}")
    return n


def test_detection(sources):
    for label, args, text, _, family in sources:
        p = subprocess.run([TOOL] + args + ["--detect"], capture_output=True,
                           timeout=30)
        words = p.stdout.decode().split()
        check(p.returncode == 0 and words[:2] == [family, "exact"],
              f"detect {label}: {p.stdout!r} {p.stderr!r}")


def test_fingerprint_and_dirs(sources, tmp):
    # A locally edited template (extra Jinja comment, CRLF endings) is still
    # recognized, by fingerprint or normalized hash, and renders as Jinja.
    msgs = [{"role": "system", "content": " s "},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "<think>t</think>a"},
            {"role": "user", "content": "v"}]
    for label, _, text, specials, family in sources:
        edited = "{#- local copy #}\n" + text
        path = os.path.join(tmp, label + ".jinja")
        with open(path, "w", encoding="utf-8") as f:
            f.write(edited)
        p = subprocess.run([TOOL, "--template-file", path, "--detect"],
                           capture_output=True, timeout=30)
        check(p.stdout.decode().split()[:2] == [family, "fingerprint"],
              f"fingerprint {label}: {p.stdout!r} {p.stderr!r}")
        want = jinja(edited, specials, msgs, {"date_string": "1 Jan 2000"})
        rc, got, err = run_tool(["--template-file", path, "--date-string",
                                 "1 Jan 2000"], {"messages": msgs})
        check(rc == 0 and got == want.encode(), f"edited {label}: {err}")
        crlf = os.path.join(tmp, label + ".crlf.jinja")
        with open(crlf, "w", encoding="utf-8", newline="\r\n") as f:
            f.write(text + "\n")
        p = subprocess.run([TOOL, "--template-file", crlf, "--detect"],
                           capture_output=True, timeout=30)
        check(p.stdout.decode().split()[:2] == [family, "exact"],
              f"crlf {label}: {p.stdout!r} {p.stderr!r}")
    # --model DIR with chat_template.jinja, and with tokenizer_config.json.
    model = os.path.join(tmp, "model")
    os.mkdir(model)
    shutil.copy(LLAMA33, os.path.join(model, "chat_template.jinja"))
    p = subprocess.run([TOOL, "--model", model, "--detect"],
                       capture_output=True, timeout=30)
    check(p.stdout.decode().split()[:1] == ["llama3"], f"model dir: {p}")
    os.remove(os.path.join(model, "chat_template.jinja"))
    shutil.copy(os.path.join(TOK, "qwen3", "tokenizer_config.json"), model)
    p = subprocess.run([TOOL, "--model", model, "--detect"],
                       capture_output=True, timeout=30)
    check(p.stdout.decode().split()[:1] == ["qwen3"], f"model cfg: {p}")


def test_default_dates(sources):
    msgs = [{"role": "user", "content": "date?"}]
    for label, args, text, specials, family in sources:
        if not family.startswith("llama3"):
            continue
        # Llama-3.2 asks strftime_now for today; retry once across midnight.
        for _ in range(2):
            want = jinja(text, specials, msgs, {}).encode()
            rc, got, err = run_tool(args, {"messages": msgs})
            if got == want:
                break
        check(rc == 0 and got == want,
              f"default date {label}: want={want!r} got={got!r} {err}")
        if family == "llama3":
            check(b"Today Date: 26 Jul 2024\n" in got, "3.3 default date")


def test_errors(sources, tmp):
    for label, args, text, specials, family in sources:
        # Jinja raises on an empty list (messages[0]); so must we.
        try:
            jinja(text, specials, [], {})
            check(False, f"{label}: jinja accepted empty messages")
        except jinja2.exceptions.UndefinedError:
            pass
        rc, out, err = run_tool(args, {"messages": []})
        check(rc == 1 and out == b"" and "EINVAL" in err,
              f"{label} empty: rc={rc} {err}")
        # Tool use is refused, never rendered differently.
        u = {"role": "user", "content": "hi"}
        for req in ({"messages": [u], "tools": [{"type": "function"}]},
                    {"messages": [u, {"role": "assistant", "content": "",
                                      "tool_calls": [{"function": {}}]}]},
                    {"messages": [u, {"role": "tool", "content": "42"}]}):
            rc, out, err = run_tool(args, req)
            check(rc == 1 and out == b"" and "EUNSUPPORTED" in err,
                  f"{label} tools: rc={rc} {err}")
        for req in ({"messages": [{"role": "user"}]},
                    {"messages": [{"content": "x"}]},
                    {"messages": [{"role": "user", "content": None}]},
                    {"messages": "nope"}, {"other": 1}):
            rc, out, err = run_tool(args, req)
            check(rc == 1 and out == b"", f"{label} bad {req}: rc={rc}")
    p = subprocess.run([TOOL, "--template-file", LLAMA33], input=b"{not json",
                       capture_output=True, timeout=30)
    check(p.returncode == 1 and b"invalid JSON" in p.stderr, "bad json")
    # Unknown template: named error, unless a family name is given.
    unknown = os.path.join(tmp, "unknown.jinja")
    with open(unknown, "w") as f:
        f.write("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n"
                "{% endfor %}")
    rc, out, err = run_tool(["--template-file", unknown],
                            {"messages": [{"role": "user", "content": "x"}]})
    check(rc == 1 and "unknown chat template" in err and
          "{% for m in messages %}" in err and "EUNSUPPORTED" in err,
          f"unknown template: rc={rc} {err}")
    rc, out, err = run_tool(["--template-file", unknown, "--template",
                             "qwen3"],
                            {"messages": [{"role": "user", "content": "x"}]})
    check(rc == 0 and out == b"<|im_start|>user\nx<|im_end|>\n"
          b"<|im_start|>assistant\n", f"named override: {out!r} {err}")
    rc, out, err = run_tool(["--template-file", unknown, "--template", "x"],
                            {"messages": []})
    check(rc == 1 and "valid:" in err, f"bad name: {err}")
    for bad in (["--enable-thinking", "maybe"], [], ["--bogus"]):
        p = subprocess.run([TOOL, "--template", "qwen3"] + bad
                           if bad != [] else [TOOL], input=b"{}",
                           capture_output=True, timeout=30)
        check(p.returncode == 2, f"usage {bad}: {p.returncode}")


def main():
    if not os.access(TOOL, os.X_OK):
        print(f"FAIL: {TOOL} not built", file=sys.stderr)
        return 1
    sources = load_sources()
    rng = random.Random(20240726)
    convs = fixed_conversations() + [random_conversation(rng)
                                     for _ in range(40)]
    n = compare_all(sources, convs)
    test_detection(sources)
    with tempfile.TemporaryDirectory() as tmp:
        test_fingerprint_and_dirs(sources, tmp)
        test_errors(sources, tmp)
    test_default_dates(sources)
    print(f"compared {n} renders over {len(convs)} conversations; "
          f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
