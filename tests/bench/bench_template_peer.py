#!/usr/bin/python3
"""The peer of bench-template: python3-jinja2 set up as transformers sets it
up for apply_chat_template (tests/reference/render_jinja.py), timed in one
process on the same conversations.

Usage: bench_template_peer.py JOB_JSON
JOB_JSON is {"repeats": R, "cases": [{"source": PATH, "is_dir": bool,
"messages": [...], "tools": [...] | null, "out": PATH, "iters": N}, ...]}.
For each case the template is compiled once (transformers caches compiled
templates the same way), rendered once to warm up, then timed as the best
of R runs of N renders. Writes each case's prompt to its "out" path (so
the caller can check that both engines printed the same bytes) and prints
one JSON object per case on stdout: {"seconds": best seconds for N renders, "bytes": output length in
UTF-8 bytes}.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "reference"))
import render_jinja as rj  # noqa: E402


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    for case in job["cases"]:
        if case["is_dir"]:
            templates, specials = rj.load_dir(case["source"])
        else:
            with open(case["source"], encoding="utf-8") as f:
                templates, specials = {"default": f.read()}, {}
        text = rj.pick(templates, case["tools"])
        kw = dict(specials)
        out = rj.render(text, case["messages"], tools=case["tools"], **kw)
        best = None
        for _ in range(job["repeats"]):
            t0 = time.perf_counter()
            for _ in range(case["iters"]):
                rj.render(text, case["messages"], tools=case["tools"], **kw)
            dt = time.perf_counter() - t0
            best = dt if best is None or dt < best else best
        data = out.encode("utf-8")
        with open(case["out"], "wb") as f:
            f.write(data)
        print(json.dumps({"seconds": best, "bytes": len(data)}), flush=True)


if __name__ == "__main__":
    main()
