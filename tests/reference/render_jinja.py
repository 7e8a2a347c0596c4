#!/usr/bin/python3
"""Reference chat-template renderer: runs the model's real Jinja template.

This is the oracle that tests/integration/test_chat_template.py compares
tangram-template against. It sets up Jinja the way Hugging Face transformers
does for apply_chat_template (documented behaviour of
transformers.utils.chat_template_utils): an ImmutableSandboxedEnvironment with
trim_blocks=True and lstrip_blocks=True, the loopcontrols extension, a
`tojson` filter that is json.dumps(ensure_ascii=False, ...), and the globals
`raise_exception` (raises TemplateError) and `strftime_now`
(datetime.now().strftime). The special tokens of the tokenizer (bos_token,
eos_token, ...) are passed as variables, and so are `tools=None` and
`documents=None`, as transformers does.

Library use:   render(template_text, messages, **kwargs) -> str
Command line:  render_jinja.py (--template-file F | --tokenizer-config F)
                   [--no-generation-prompt] [--enable-thinking true|false]
                   [--date-string S] [--bos-token S]
               reads {"messages": [...]} on stdin and prints the prompt with
               no newline added. A template error prints "error: ..." on
               stderr and exits 1. Needs Debian's python3-jinja2.
"""
import argparse
import functools
import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None,
            sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def load_tokenizer_config(path):
    """Returns (template text, special-token variables) of a
    tokenizer_config.json; a list-valued chat_template gives its "default"."""
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, list):
        tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"),
                    None)
    if not isinstance(tmpl, str):
        raise ValueError(f"{path}: no chat_template string")
    specials = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        specials[key] = v
    return tmpl, specials


@functools.lru_cache(maxsize=16)
def compile_template(template_text):
    """Compiles once per text (transformers caches the same way)."""
    return make_env().from_string(template_text)


def render(template_text, messages, add_generation_prompt=True, **kwargs):
    """Renders `messages` (list of dicts) with the template; extra keyword
    arguments become template variables (enable_thinking, date_string,
    bos_token, ...). Raises jinja2 exceptions like transformers does."""
    tmpl = compile_template(template_text)
    variables = {"tools": None, "documents": None}
    variables.update(kwargs)
    return tmpl.render(messages=messages,
                       add_generation_prompt=add_generation_prompt,
                       **variables)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--template-file")
    src.add_argument("--tokenizer-config")
    ap.add_argument("--no-generation-prompt", action="store_true")
    ap.add_argument("--enable-thinking", choices=("true", "false"))
    ap.add_argument("--date-string")
    ap.add_argument("--bos-token")
    args = ap.parse_args()

    kwargs = {}
    if args.template_file:
        with open(args.template_file, encoding="utf-8") as f:
            text = f.read()
    else:
        text, specials = load_tokenizer_config(args.tokenizer_config)
        kwargs.update(specials)
    if args.bos_token is not None:
        kwargs["bos_token"] = args.bos_token
    if args.enable_thinking is not None:
        kwargs["enable_thinking"] = args.enable_thinking == "true"
    if args.date_string is not None:
        kwargs["date_string"] = args.date_string
    doc = json.load(sys.stdin)
    try:
        out = render(text, doc["messages"],
                     add_generation_prompt=not args.no_generation_prompt,
                     **kwargs)
    except (jinja2.exceptions.TemplateError, TypeError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(out.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
