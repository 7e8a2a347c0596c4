#!/usr/bin/python3
"""Reference chat-template renderer: runs the model's real Jinja template.

This is the oracle that tests/integration/test_chat_template.py (and the
daemon tests) compare tangram-template and the router against. It sets up
Jinja the way Hugging Face transformers does for apply_chat_template
(transformers.utils.chat_template_utils, documented behaviour): an
ImmutableSandboxedEnvironment with trim_blocks=True and lstrip_blocks=True,
the loopcontrols extension and transformers' {% generation %} tag (its
AssistantTracker: the body renders as it is), a `tojson` filter that is
json.dumps(ensure_ascii=False, indent, separators, sort_keys), and the
globals `raise_exception` (raises TemplateError) and `strftime_now`
(datetime.now().strftime). Variables: messages, tools (None when the
request has none), documents=None, add_generation_prompt, the tokenizer's
special_tokens_map (each special token of tokenizer_config.json that is set
and non-empty, AddedToken objects as their "content") and extra keyword
arguments. A chat_template list picks "tool_use" when tools are given and
the list has it, else "default", as get_chat_template does. A template
directory uses DIR/chat_template.jinja before tokenizer_config.json's
template, with that config's special tokens. continue_final_message cuts the
output as apply_chat_template does.

Library use:   render(template_text, messages, add_generation_prompt=True,
                      tools=None, now=None, **kwargs) -> str
               load_dir(dir) / load_tokenizer_config(path)
                   -> (templates dict {"default": text, ...}, specials)
Command line:  render_jinja.py (--tokenizer DIR | --template-file F |
                   --tokenizer-config F) [--no-generation-prompt]
                   [--continue-final-message] [--enable-thinking true|false]
                   [--date-string YYYY-MM-DD] [--bos-token S] [--eos-token S]
               reads {"messages": [...], "tools": [...],
               "chat_template_kwargs": {...}} on stdin and prints the prompt
               with no newline added, exactly as tangram-template does. A
               template error prints "error: ..." on stderr and exits 1.
               Needs Debian's python3-jinja2.
"""
import argparse
import functools
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token",
                  "pad_token", "cls_token", "mask_token")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None,
            sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %}: renders its
    body (transformers also records the span; the text is unchanged)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"],
                                       drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [],
                               body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def specials_of(cfg):
    """transformers' special_tokens_map of a tokenizer_config dict."""
    out = {}
    for key in SPECIAL_TOKENS:
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str) and v:
            out[key] = v
    extra = cfg.get("additional_special_tokens")
    if isinstance(extra, list):
        toks = [t.get("content") if isinstance(t, dict) else t for t in extra]
        toks = [t for t in toks if isinstance(t, str)]
        if toks:
            out["additional_special_tokens"] = toks
    return out


def load_tokenizer_config(path):
    """Returns ({name: template text}, special-token variables) of a
    tokenizer_config.json; a string chat_template is {"default": text}."""
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    tmpl = cfg.get("chat_template")
    if isinstance(tmpl, str):
        templates = {"default": tmpl}
    elif isinstance(tmpl, list):
        templates = {t["name"]: t["template"] for t in tmpl
                     if isinstance(t, dict) and "name" in t}
    else:
        raise ValueError(f"{path}: no chat_template string or list")
    if "default" not in templates:
        raise ValueError(f"{path}: chat_template list without 'default'")
    return templates, specials_of(cfg)


def find_config(d):
    path = os.path.join(d, "tokenizer_config.json")
    if os.path.isfile(path):
        return path
    names = [n for n in os.listdir(d) if n.startswith("tokenizer_config.")
             and n.endswith(".json")]
    return os.path.join(d, names[0]) if len(names) == 1 else None


def load_dir(d):
    """A model directory as transformers reads it."""
    cfg = find_config(d)
    templates, specials = ({}, {})
    if cfg is not None:
        try:
            templates, specials = load_tokenizer_config(cfg)
        except ValueError:
            with open(cfg, encoding="utf-8") as f:
                specials = specials_of(json.load(f))
    jinja_path = os.path.join(d, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            templates = {"default": f.read()}
    if "default" not in templates:
        raise ValueError(f"{d}: no chat template")
    return templates, specials


def pick(templates, tools):
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    return templates["default"]


@functools.lru_cache(maxsize=64)
def compile_template(template_text):
    """Compiles once per text (transformers caches the same way)."""
    return make_env().from_string(template_text)


def continue_final(rendered, messages):
    """apply_chat_template's continue_final_message cut."""
    final = messages[-1]["content"]
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                break
        else:
            raise ValueError("continue_final_message: no text in the final "
                             "message")
    if final.strip() not in rendered:
        raise ValueError("continue_final_message is set but the final "
                         "message does not appear in the chat")
    loc = rendered.rindex(final.strip())
    if rendered[loc:loc + len(final.lstrip())] == final:
        return rendered[:loc + len(final.lstrip())]
    return rendered[:loc + len(final.strip())]


def render(template_text, messages, add_generation_prompt=True, tools=None,
           now=None, continue_final_message=False, **kwargs):
    """Renders `messages` (list of dicts) with the template; extra keyword
    arguments become template variables (enable_thinking, bos_token, ...).
    `now` (a datetime) fixes what strftime_now() formats. Raises jinja2
    exceptions like transformers does."""
    tmpl = compile_template(template_text)
    variables = dict(kwargs)
    if now is not None:
        variables["strftime_now"] = now.strftime
    out = tmpl.render(messages=messages, tools=tools, documents=None,
                      add_generation_prompt=add_generation_prompt,
                      **variables)
    if continue_final_message:
        out = continue_final(out, messages)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", "--model", dest="tokenizer")
    src.add_argument("--template-file")
    src.add_argument("--tokenizer-config")
    ap.add_argument("--no-generation-prompt", action="store_true")
    ap.add_argument("--continue-final-message", action="store_true")
    ap.add_argument("--enable-thinking", choices=("true", "false"))
    ap.add_argument("--date-string")
    ap.add_argument("--bos-token")
    ap.add_argument("--eos-token")
    args = ap.parse_args()

    specials = {}
    if args.tokenizer:
        templates, specials = load_dir(args.tokenizer)
    elif args.tokenizer_config:
        templates, specials = load_tokenizer_config(args.tokenizer_config)
    else:
        with open(args.template_file, encoding="utf-8") as f:
            templates = {"default": f.read()}
    kwargs = dict(specials)
    if args.bos_token is not None:
        kwargs["bos_token"] = args.bos_token
    if args.eos_token is not None:
        kwargs["eos_token"] = args.eos_token
    doc = json.load(sys.stdin)
    kwargs.update(doc.get("chat_template_kwargs") or {})
    if args.enable_thinking is not None:
        kwargs["enable_thinking"] = args.enable_thinking == "true"
    now = None
    if args.date_string is not None:
        now = datetime.strptime(args.date_string, "%Y-%m-%d")
    tools = doc.get("tools")
    agp = not args.no_generation_prompt and not args.continue_final_message
    try:
        out = render(pick(templates, tools), doc["messages"],
                     add_generation_prompt=agp, tools=tools, now=now,
                     continue_final_message=args.continue_final_message,
                     **kwargs)
    except (jinja2.exceptions.TemplateError, TypeError, ValueError) as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    sys.stdout.buffer.write(out.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
