#!/usr/bin/python3
"""test_schema_suite — the official JSON-Schema-Test-Suite (draft 2020-12
and 2019-09, data/json-schema-test-suite, carried verbatim with its
source) through the structured-output engine.

Every group's schema is compiled as a json_schema spec; each of its test
instances is written in compact JSON (checked under the default, compact
whitespace policy) and indented by two spaces (under the pretty policy),
and grammar-accept (tests/grammar/grammar_accept.c) says whether the
grammar takes it. The suite says which instances are valid. So:

- no instance the suite marks invalid may be accepted, in either form: a
  false accept is an output the engine would let through although the
  schema rejects it. Any one fails the test.
- a valid instance the engine rejects is a generation restriction (the
  grammar generates a subset: properties in the order of `properties`,
  no members beyond those it lists unless additionalProperties is a
  schema, integers without fraction, bounded digits and whitespace, ...):
  counted per reason group and printed, not failed.
- at least MIN_2020 of the 383 draft 2020-12 groups must compile (the
  rest are refused with a 400 naming the keyword: printed by keyword).

Fails, naming it, when the driver or the data is missing.
"""
import glob
import json
import os
import subprocess
import sys
from collections import Counter

SOURCE = os.environ.get("TANGRAM_SOURCE", "")
DATA = os.environ.get("TANGRAM_DATA", os.path.join(SOURCE, "data"))
DRIVER = os.environ.get("TANGRAM_GRAMMAR_ACCEPT", "")
MIN_2020 = 200


def groups(draft):
    root = os.path.join(DATA, "json-schema-test-suite", "tests", draft)
    for path in sorted(glob.glob(os.path.join(root, "*.json"))):
        with open(path, encoding="utf-8") as f:
            for g in json.load(f):
                yield os.path.basename(path)[:-5], g


def texts(instance):
    compact = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    pretty = json.dumps(instance, indent=2, ensure_ascii=False)
    return compact, pretty


def run(draft):
    lines, meta = [], []
    for name, g in groups(draft):
        tests = g["tests"]
        pairs = [texts(t["data"]) for t in tests]
        lines.append(json.dumps({"spec": {"type": "json_schema",
                                          "schema": g["schema"]},
                                 "texts": [p[0] for p in pairs]}))
        lines.append(json.dumps({"spec": {"type": "json_schema",
                                          "schema": g["schema"],
                                          "whitespace": "pretty"},
                                 "texts": [p[1] for p in pairs]}))
        meta.append((name, g["description"], tests, pairs))
    p = subprocess.run([DRIVER], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=1500)
    if p.returncode != 0:
        raise RuntimeError("grammar-accept failed (%d): %s" %
                           (p.returncode, p.stderr[-2000:]))
    out = [json.loads(x) for x in p.stdout.splitlines()]
    if len(out) != len(lines):
        raise RuntimeError("grammar-accept answered %d of %d lines" %
                           (len(out), len(lines)))
    compiled, refused = 0, Counter()
    false_accept, false_reject = [], Counter()
    n_valid = n_invalid = 0
    for k, (name, desc, tests, pairs) in enumerate(meta):
        c, pr = out[2 * k], out[2 * k + 1]
        if c["rc"] != "OK":
            key = c["error"].split(" at ")[0][:90]
            refused[key] += 1
            continue
        compiled += 1
        for i, t in enumerate(tests):
            for form, verdict in (("compact", c), ("indented", pr)):
                if verdict["rc"] != "OK":
                    continue
                got = verdict["accepted"][i]
                if not t["valid"]:
                    n_invalid += 1
                    if got:
                        false_accept.append("%s / %s / %s (%s): %s" % (
                            name, desc, t["description"], form,
                            pairs[i][0 if form == "compact" else 1][:200]))
                else:
                    n_valid += 1
                    if not got:
                        false_reject["%s (%s)" % (name, form)] += 1
    return compiled, len(meta), refused, false_accept, false_reject, \
        n_valid, n_invalid


def main():
    missing = []
    if not DRIVER or not os.access(DRIVER, os.X_OK):
        missing.append("grammar-accept (TANGRAM_GRAMMAR_ACCEPT=%r; build "
                       "the tests)" % DRIVER)
    if not os.path.isdir(os.path.join(DATA, "json-schema-test-suite")):
        missing.append("data/json-schema-test-suite (TANGRAM_DATA=%r)" % DATA)
    if missing:
        print("FAIL: missing: " + "; ".join(missing))
        return 1
    fails = 0
    for draft in ("draft2020-12", "draft2019-09"):
        compiled, total, refused, fa, fr, nv, ni = run(draft)
        print("%s: %d of %d groups compile; %d invalid instance forms "
              "checked, %d accepted; %d valid instance forms, %d rejected "
              "(generation restrictions)" % (draft, compiled, total, ni,
                                              len(fa), nv, sum(fr.values())))
        for key, n in refused.most_common(15):
            print("  refused %3d  %s" % (n, key))
        for key, n in fr.most_common(12):
            print("  rejects %3d  %s" % (n, key))
        for x in fa[:20]:
            print("FAIL false accept: %s" % x)
        fails += len(fa)
        if draft == "draft2020-12" and compiled < MIN_2020:
            print("FAIL: %d groups compile, fewer than %d" %
                  (compiled, MIN_2020))
            fails += 1
    print("ok" if fails == 0 else "%d failures" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
