"""test_grammar_walk — the structured-output proof at the engine level.

Because the token mask forces validity, any logits must give valid
output. grammar-walk (tests/grammar/grammar_walk.c) samples random token
sequences under the mask of every schema of tests/grammar/schemas.json and
of its tool-call cases, with the real Qwen3 and Llama-3 tokenizers and
random logits, until the grammar is finished; this test validates every
finished output with an independent validator, python3-jsonschema
(Debian), as the OpenAI-style client would: the JSON must parse (strictly:
no NaN, no control characters in strings) and validate against the
schema; tool calls must be the template's format and their arguments
valid against the function's parameters.

It also checks the corpus itself against jsonschema: its "valid"
documents validate, its "invalid" ones do not (or are not JSON), its
"refused" ones (valid, but outside what the engine generates: another
property order, whitespace over the bound) validate — so the C tests that
run the same lists through the engine (test_grammar_schema.c) test against
the right answers.

Walks that run out of tokens (the finish reason "length") are not
documents; at most a fifth of them may stop that way, or the test fails
(the walks are biased to close strings and containers: a walk that does
not finish is a sign that the grammar cannot end).
"""
import json
import os
import subprocess
import sys

SOURCE = os.environ.get("TANGRAM_SOURCE", "")
WALK = os.environ.get("TANGRAM_GRAMMAR_WALK", "")


def strict_json(text):
    def no_constants(name):
        raise ValueError("not JSON: %s" % name)
    return json.loads(text, parse_constant=no_constants)


def validator_for(jsonschema, schema):
    cls = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def check_corpus(jsonschema, corpus, fails):
    n = 0
    for case in corpus["schemas"]:
        v = validator_for(jsonschema, case["schema"])
        for doc in case["valid"]:
            n += 1
            errs = list(v.iter_errors(strict_json(doc)))
            if errs:
                fails.append("corpus %s: valid %r fails: %s" %
                             (case["name"], doc, errs[0].message))
        for doc in case["invalid"]:
            n += 1
            try:
                inst = strict_json(doc)
            except ValueError:
                continue
            if v.is_valid(inst):
                fails.append("corpus %s: invalid %r validates" %
                             (case["name"], doc))
        for doc in case["refused"]:
            n += 1
            try:
                ok = v.is_valid(strict_json(doc))
            except ValueError:
                ok = False
            if not ok:
                fails.append("corpus %s: refused %r is not valid" %
                             (case["name"], doc))
    return n


def split_calls(fmt, text):
    """The (name, arguments) of each call of a tool-call output, parsed as
    router/api/rt_toolcall.c would, or raises ValueError."""
    dec = json.JSONDecoder(parse_constant=lambda c: (_ for _ in ()).throw(
        ValueError(c)))
    if fmt == "hermes":
        begin, end, sep, key = "<tool_call>\n", "\n</tool_call>", "\n", "arguments"
    else:
        begin, end, sep, key = "", "", "; ", "parameters"
    calls, at = [], 0
    while True:
        if not text.startswith(begin, at):
            raise ValueError("no call at %d" % at)
        at += len(begin)
        obj, at = dec.raw_decode(text, at)
        if not text.startswith(end, at):
            raise ValueError("no end of call at %d" % at)
        at += len(end)
        if not isinstance(obj, dict) or set(obj) != {"name", key}:
            raise ValueError("call object %r" % (obj,))
        calls.append((obj["name"], obj[key]))
        if at == len(text):
            return calls
        if not text.startswith(sep, at):
            raise ValueError("no separator at %d" % at)
        at += len(sep)


def run_walks(tokenizer, walks, seed):
    out = subprocess.run(
        [WALK, "--tokenizer", tokenizer, "--walks", str(walks), "--seed",
         str(seed), "--max-tokens", "4000",
         os.path.join(SOURCE, "tests/grammar/schemas.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=500,
        check=False)
    if out.returncode != 0:
        raise RuntimeError("grammar-walk --tokenizer %s failed (%d): %s" %
                           (tokenizer, out.returncode,
                            out.stderr.decode(errors="replace")))
    return [json.loads(l) for l in out.stdout.decode().splitlines() if l]


def main():
    missing = []
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
        missing.append("Python module jsonschema (python3-jsonschema: sh "
                       "deploy/install-deps.sh)")
    if not WALK or not os.access(WALK, os.X_OK):
        missing.append("grammar-walk (TANGRAM_GRAMMAR_WALK=%r; build the "
                       "tests)" % WALK)
    corpus_path = os.path.join(SOURCE, "tests/grammar/schemas.json")
    if not os.path.exists(corpus_path):
        missing.append(corpus_path)
    if missing:
        print("FAIL missing inputs: " + "; ".join(missing))
        return 1
    with open(corpus_path, encoding="utf-8") as f:
        corpus = json.load(f)
    fails = []
    n_docs = check_corpus(jsonschema, corpus, fails)
    print("ok   corpus: %d schemas, %d documents checked against jsonschema"
          % (len(corpus["schemas"]), n_docs))
    schemas = {c["name"]: c["schema"] for c in corpus["schemas"]}
    tools = {c["name"]: c for c in corpus["tools"]}
    validators = {n: validator_for(jsonschema, s) for n, s in schemas.items()}
    total = finished = 0
    for tokenizer, walks, seed in (("qwen3", 8, 1), ("llama3", 4, 2)):
        lines = run_walks(tokenizer, walks, seed)
        want = walks * (len(schemas) + len(tools))
        if len(lines) != want:
            fails.append("%s: %d outputs, want %d" % (tokenizer, len(lines),
                                                      want))
        for ln in lines:
            total += 1
            where = "%s %s %s walk %d" % (tokenizer, ln["kind"], ln["name"],
                                          ln["walk"])
            if not ln["finished"]:
                if ln["min_bytes_left"] < 1:
                    fails.append("%s: stopped where it could end" % where)
                continue
            finished += 1
            text = ln["text"]
            if ln["kind"] == "schema":
                try:
                    inst = strict_json(text)
                except ValueError as e:
                    fails.append("%s: not JSON (%s): %r" % (where, e,
                                                           text[:300]))
                    continue
                errs = list(validators[ln["name"]].iter_errors(inst))
                if errs:
                    fails.append("%s: invalid (%s): %r" %
                                 (where, errs[0].message, text[:300]))
                continue
            case = tools[ln["name"]]
            try:
                calls = split_calls(case["format"], text)
            except ValueError as e:
                fails.append("%s: not tool calls (%s): %r" % (where, e,
                                                             text[:300]))
                continue
            if len(calls) < case["min_calls"] or (
                    case["max_calls"] and len(calls) > case["max_calls"]):
                fails.append("%s: %d calls" % (where, len(calls)))
            fns = {t["name"]: t.get("parameters", {"type": "object"})
                   for t in case["tools"]}
            for name, args in calls:
                if name not in fns:
                    fails.append("%s: unknown function %r" % (where, name))
                    continue
                errs = list(validator_for(jsonschema, fns[name])
                            .iter_errors(args))
                if errs or not isinstance(args, dict):
                    fails.append("%s: arguments of %s invalid: %r" %
                                 (where, name, args))
        print("ok   %s: walks done" % tokenizer)
    print("%s  %d outputs: %d finished and checked, %d ran out of "
          "tokens, %d failures" % ("ok " if not fails else "FAIL", total,
                                   finished, total - finished, len(fails)))
    if total == 0 or (total - finished) * 5 > total:
        fails.append("too many walks ran out of tokens: %d of %d" %
                     (total - finished, total))
    for f in fails[:40]:
        print("FAIL " + f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
